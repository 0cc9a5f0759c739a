"""The :class:`KnowledgeGraph`: one API over a local rdflib graph or a SPARQL endpoint.

Linking lives in :mod:`.linking`, rendering in :mod:`.formatting`, the query backends in
:mod:`.backends`; this module holds the graph walks (descriptions, neighbours, chains, hierarchy
paths) and :meth:`KnowledgeGraph.retrieve`, which puts them together.
"""

from __future__ import annotations

import functools
import re
import threading
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rdflib import Graph, Literal, URIRef

from .backends import KGQueryError, _LocalBackend, _RemoteBackend, _safe_iri
from .evidence import EntityDescription, KGEvidence, KGTriple, LinkedEntity
from .formatting import render_evidence
from .linking import _LabelIndex, link_entities
from .loading import _parse_file, load_packaged_graph
from .vocabulary import (
    _Q_DIRECT,
    _Q_EXACT,
    _Q_EXISTS,
    _Q_FIRST_HOPS,
    _Q_IN,
    _Q_IN_COUNTS,
    _Q_LABEL_OF,
    _Q_LITERALS,
    _Q_OUT,
    _Q_OUT_COUNTS,
    _Q_PARENTS,
    _Q_TWO_HOP,
    _Q_TYPES,
    DEFAULT_PREFIXES,
    DEFINITION_PREDICATES,
    SYNONYM_PREDICATES,
)

class KnowledgeGraph:
    """Entity linking, descriptions, neighbours and reasoning chains over an RDF graph.

    Build it over an rdflib :class:`~rdflib.Graph` (``KnowledgeGraph(graph)``), a file
    (:meth:`from_file`), the packaged medical graph (:meth:`packaged`) or a SPARQL 1.1 endpoint
    (:meth:`from_endpoint`); every method behaves the same on all of them. Methods raise
    :class:`KGQueryError` when the graph cannot be queried.

    Example:
        >>> from rdflib import Graph, Literal, URIRef, RDFS
        >>> g = Graph()
        >>> _ = g.add((URIRef("http://ex.org/flu"), RDFS.label, Literal("Influenza")))
        >>> kg = KnowledgeGraph(g)
        >>> [(e.label, e.match) for e in kg.link("symptoms of influensa?")]
        [('Influenza', 'fuzzy')]
    """

    def __init__(
        self,
        graph: Graph,
        *,
        prefixes: Mapping[str, str] = DEFAULT_PREFIXES,
        _backend: Any = None,
    ) -> None:
        if _backend is None:
            if not isinstance(graph, Graph):
                raise TypeError(f"KnowledgeGraph needs an rdflib Graph, got {type(graph).__name__}")
            _backend = _LocalBackend(graph)
        self._backend = _backend
        self.prefixes = dict(prefixes)
        self._index: Optional[_LabelIndex] = None
        self._index_lock = threading.Lock()
        self._label_cache: dict[str, Optional[str]] = {}
        self._parents_cache: dict[str, list[tuple[str, str]]] = {}

    # -- constructors

    @classmethod
    def from_file(cls, path: str | Path, *, format: Optional[str] = None, prefixes: Mapping[str, str] = DEFAULT_PREFIXES) -> "KnowledgeGraph":
        """Parse an RDF file (``.nt``, ``.nt.gz``, ``.ttl``, ...) into an in-memory graph."""
        return cls(_parse_file(Path(path), format=format), prefixes=prefixes)

    @classmethod
    def packaged(cls) -> "KnowledgeGraph":
        """The packaged HPO + ICD-10-CM graph: one shared instance per process (graph, label index
        and caches are built once, on the first call; thread-safe)."""
        return _packaged_knowledge_graph()

    @classmethod
    def from_endpoint(
        cls,
        url: str,
        *,
        timeout_s: float = 10.0,
        headers: Optional[Mapping[str, str]] = None,
        method: str = "POST",
        prefixes: Mapping[str, str] = DEFAULT_PREFIXES,
    ) -> "KnowledgeGraph":
        """A remote SPARQL 1.1 query endpoint (e.g. ``http://127.0.0.1:7878/query``).

        ``method`` is the SPARQL protocol operation: ``"POST"`` (form-encoded, default) or ``"GET"``.
        """
        backend = _RemoteBackend(url, timeout_s=timeout_s, headers=headers, method=method)
        return cls(None, prefixes=prefixes, _backend=backend)  # type: ignore[arg-type]

    @property
    def source(self) -> str:
        return self._backend.describe_source()

    @property
    def sends_off_machine(self) -> bool:
        """Whether queries go to a remote SPARQL endpoint (the tool layer's egress rule applies)."""
        return isinstance(self._backend, _RemoteBackend)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Credentials of the backend (a remote endpoint's user, password and header values), for scrubbing."""
        return tuple(getattr(self._backend, "secrets", ()))

    # -- low level

    def _select(self, query: str, **bindings: Any) -> list[dict[str, Any]]:
        try:
            return self._backend.select(query, bindings)
        except KGQueryError:
            raise
        except ValueError as exc:
            raise KGQueryError("bad_input", str(exc)) from None
        except Exception as exc:  # rdflib evaluation errors and the like
            raise KGQueryError("internal", f"query failed: {type(exc).__name__}: {exc}") from None

    @property
    def index(self) -> _LabelIndex:
        if self._index is None:
            with self._index_lock:
                if self._index is None:
                    try:
                        rows = self._backend.label_rows()
                        meta = self._backend.meta_nodes()
                    except KGQueryError:
                        raise
                    except Exception as exc:
                        raise KGQueryError("internal", f"could not read labels: {type(exc).__name__}: {exc}") from None
                    self._index = _LabelIndex(rows, exclude=meta)
        return self._index

    def curie(self, iri: str) -> str:
        """Compact form of an IRI (``HP:0001250``) when a prefix matches, else ``<iri>``."""
        for prefix, base in self.prefixes.items():
            if iri.startswith(base) and len(iri) > len(base):
                return f"{prefix}:{iri[len(base):]}"
        return f"<{iri}>"

    def expand(self, curie: str) -> Optional[str]:
        prefix, _, local = curie.partition(":")
        for known, base in self.prefixes.items():
            if known.lower() == prefix.lower() and local:
                return base + local
        return None

    def label(self, iri: str) -> Optional[str]:
        """The node's label, or ``None``."""
        if iri in self._label_cache:
            return self._label_cache[iri]
        if self._index is not None and iri in self._index.labels:
            value: Optional[str] = self._index.labels[iri]
        else:
            rows = self._select(_Q_LABEL_OF, s=_safe_iri(iri))
            value = str(rows[0]["l"]) if rows and "l" in rows[0] else None
        if len(self._label_cache) < 100_000:
            self._label_cache[iri] = value
        return value

    def display(self, iri: str) -> str:
        """``Label [CURIE]`` for a node."""
        label = self.label(iri)
        return f"{label} [{self.curie(iri)}]" if label else self.curie(iri)

    def exists(self, iri: str) -> bool:
        """Whether the node occurs in any triple (as subject or object)."""
        return bool(self._select(_Q_EXISTS, s=_safe_iri(iri)))

    # -- entity linking

    def lookup(self, name: str) -> list[str]:
        """Nodes whose label or synonym is exactly ``name`` (as written, lower-cased or capitalised).

        ``name`` is bound as a literal; it is never part of the query text.
        """
        variants = list(dict.fromkeys([name, name.strip(), name.strip().lower(), name.strip().capitalize()]))
        found: list[str] = []
        for variant in variants:
            if not variant:
                continue
            for row in self._select(_Q_EXACT, q=Literal(variant)):
                if isinstance(row.get("s"), URIRef) and str(row["s"]) not in found:
                    found.append(str(row["s"]))
        return found
    def link(self, text: str, *, limit: int = 5, min_score: float = 0.8, fuzzy: bool = True) -> list[LinkedEntity]:
        """Rank graph nodes mentioned in ``text``; see :func:`.linking.link_entities`."""
        return link_entities(self, text, limit=limit, min_score=min_score, fuzzy=fuzzy)

    # -- facts about one entity

    def describe(self, iri: str, *, max_synonyms: int = 6) -> EntityDescription:
        """Label, types, definition and synonyms of a node."""
        node = _safe_iri(iri)
        definition_preds = {str(p) for p in DEFINITION_PREDICATES}
        synonym_preds = {str(p) for p in SYNONYM_PREDICATES}
        definitions: dict[str, str] = {}
        synonyms: list[str] = []
        for row in self._select(_Q_LITERALS, s=node):
            p, o = str(row.get("p", "")), row.get("o")
            if o is None:
                continue
            if p in definition_preds:
                definitions.setdefault(p, str(o))
            elif p in synonym_preds and len(synonyms) < max_synonyms and str(o) not in synonyms:
                synonyms.append(str(o))
        definition = next((definitions[str(p)] for p in DEFINITION_PREDICATES if str(p) in definitions), None)
        types = []
        for row in self._select(_Q_TYPES, s=node):
            t = row.get("t")
            if t is not None:
                types.append(str(row["tl"]) if "tl" in row else self.curie(str(t)))
        return EntityDescription(iri=iri, label=self.label(iri) or self.curie(iri), types=types, definition=definition, synonyms=synonyms)

    def neighbours(self, iri: str, *, per_relation: int = 5) -> list[tuple[str, str, list[KGTriple], int]]:
        """1-hop neighbours grouped by relation: ``(direction, predicate, triples shown, total)``.

        ``direction`` is ``"out"`` (the entity is the subject) or ``"in"``; ``rdf:type`` and literal
        values are left to :meth:`describe`. At most ``per_relation`` triples per group, by IRI order.
        """
        node = _safe_iri(iri)
        groups = []
        for direction, count_q, list_q in (("out", _Q_OUT_COUNTS, _Q_OUT), ("in", _Q_IN_COUNTS, _Q_IN)):
            for row in self._select(count_q, s=node):
                p = row.get("p")
                if not isinstance(p, URIRef):
                    continue
                total = int(row["n"]) if "n" in row else 0
                shown = []
                for r in self._select(list_q, s=node, p=p)[:per_relation]:
                    other = r.get("o" if direction == "out" else "x")
                    if not isinstance(other, URIRef):
                        continue
                    s, o = (iri, str(other)) if direction == "out" else (str(other), iri)
                    shown.append(self._triple(s, str(p), o))
                groups.append((direction, str(p), shown, total))
        return groups

    # -- reasoning chains between two entities

    def chains(self, a: str, b: str, *, limit: int = 6, hierarchy: bool = True) -> list[list[KGTriple]]:
        """Paths linking ``a`` and ``b``: direct edges, 2-hop paths, hierarchy paths.

        A hierarchy path is ``a -p-> x -is_a/parent-> ... -> b`` (either way round), e.g.
        ``disease -has_phenotype-> phenotype -is_a-> ... -> phenotype``.
        """
        na, nb = _safe_iri(a), _safe_iri(b)
        out: list[list[KGTriple]] = []
        seen: set[tuple[tuple[str, str, str], ...]] = set()

        def push(chain: list[KGTriple]) -> None:
            key = tuple(t.as_tuple() for t in chain)
            if key not in seen and len(out) < limit:
                seen.add(key)
                out.append(chain)

        for row in self._select(_Q_DIRECT, a=na, b=nb):
            p = str(row["p"])
            push([self._triple(a, p, b) if str(row.get("d")) == "ab" else self._triple(b, p, a)])
        for row in self._select(_Q_TWO_HOP, a=na, b=nb):
            d, p1, x, p2 = str(row.get("d")), str(row["p1"]), str(row["x"]), str(row["p2"])
            if d == "a>x>b":
                push([self._triple(a, p1, x), self._triple(x, p2, b)])
            elif d == "b>x>a":
                push([self._triple(b, p1, x), self._triple(x, p2, a)])
            elif d == "a>x<b":
                push([self._triple(a, p1, x), self._triple(b, p2, x)])
            elif d == "a<x>b":
                push([self._triple(x, p1, a), self._triple(x, p2, b)])
        if hierarchy:
            for start, end in ((a, b), (b, a)):
                for chain in self._hierarchy_chains(start, end):
                    push(chain)
        return out

    def parents(self, iri: str) -> list[tuple[str, str]]:
        """``(hierarchy predicate, parent)`` pairs of a node (``is_a`` / ``parent`` edges), cached."""
        cached = self._parents_cache.get(iri)
        if cached is None:
            rows = self._select(_Q_PARENTS, x=_safe_iri(iri))
            cached = [(str(r["h"]), str(r["y"])) for r in rows if "h" in r and "y" in r]
            if len(self._parents_cache) < 200_000:
                self._parents_cache[iri] = cached
        return cached

    def hierarchy_path(self, start: str, goal: str, *, max_depth: int = 15, max_nodes: int = 400) -> Optional[list[tuple[str, str, str]]]:
        """Shortest upward path ``start -is_a/parent-> ... -> goal`` as triples (breadth-first), or None."""
        previous: dict[str, tuple[str, str]] = {}
        frontier = [start]
        seen = {start}
        for _ in range(max_depth):
            following = []
            for node in frontier:
                for predicate, parent in self.parents(node):
                    if parent in seen:
                        continue
                    seen.add(parent)
                    previous[parent] = (node, predicate)
                    if parent == goal:
                        path = []
                        current = goal
                        while current != start:
                            child, pred = previous[current]
                            path.append((child, pred, current))
                            current = child
                        return path[::-1]
                    following.append(parent)
            if not following or len(seen) > max_nodes:
                return None
            frontier = following
        return None

    def _hierarchy_chains(self, a: str, b: str, *, limit: int = 3) -> list[list[KGTriple]]:
        """``a -p-> x -is_a-> ... -> b``: one edge out of ``a``, then up the hierarchy to ``b``."""
        found = []
        for row in self._select(_Q_FIRST_HOPS, a=_safe_iri(a)):
            x, p = str(row["x"]), str(row["p"])
            if x in (a, b):
                continue
            path = self.hierarchy_path(x, b)
            if path:
                found.append([(a, p, x)] + path)
        found.sort(key=lambda chain: (len(chain), [t[2] for t in chain]))
        return [[self._triple(*t) for t in chain] for chain in found[:limit]]

    def _triple(self, s: str, p: str, o: str) -> KGTriple:
        return KGTriple(s, p, o, self.label(s), self.label(p), self.label(o))

    def relation_name(self, p: str) -> str:
        label = self.label(p)
        if label:
            return label
        local = re.split(r"[#/:]", p.rstrip("/#"))[-1]
        return local or p

    # -- everything together

    def retrieve(
        self,
        query: str,
        *,
        entities: Optional[Sequence[str]] = None,
        max_entities: int = 3,
        per_relation: int = 5,
        max_chains: int = 6,
    ) -> KGEvidence:
        """Link ``query`` (and/or the explicit ``entities``), then gather and render the evidence.

        Example:
            >>> ev = KnowledgeGraph.packaged().retrieve("Marfan syndrome arachnodactyly")  # doctest: +SKIP
            >>> ev.chains[0][0].p_label                                                     # doctest: +SKIP
            'has_phenotype'
        """
        linked: list[LinkedEntity] = []
        for name in entities or ():
            exact = self.lookup(name)
            if exact:
                for iri in exact[:2]:
                    linked.append(LinkedEntity(iri, self.label(iri) or iri, name, name, "exact", 1.0))
            else:
                linked.extend(self.link(name, limit=1))
        if query and query.strip():
            linked.extend(self.link(query, limit=max_entities * 2))
        chosen: list[LinkedEntity] = []
        for entity in linked:
            if entity.iri not in {c.iri for c in chosen} and len(chosen) < max_entities:
                chosen.append(entity)

        descriptions = [self.describe(e.iri) for e in chosen]
        neighbours = {e.iri: self.neighbours(e.iri, per_relation=per_relation) for e in chosen}
        chains: list[list[KGTriple]] = []
        for i in range(len(chosen)):
            for j in range(i + 1, len(chosen)):
                room = max_chains - len(chains)
                if room > 0:
                    chains.extend(self.chains(chosen[i].iri, chosen[j].iri, limit=room))

        triples: list[KGTriple] = []
        seen: set[tuple[str, str, str]] = set()

        def keep(t: KGTriple) -> None:
            if t.as_tuple() not in seen:
                seen.add(t.as_tuple())
                triples.append(t)

        for chain in chains:
            for t in chain:
                keep(t)
        for e in chosen:
            for _, _, shown, _ in neighbours[e.iri]:
                for t in shown:
                    keep(t)
        text = render_evidence(self, chosen, descriptions, neighbours, chains, triples)
        return KGEvidence(chosen, descriptions, neighbours, chains, triples, text)


@functools.cache
def _packaged_knowledge_graph() -> KnowledgeGraph:
    """The process-wide packaged graph with its label index and caches (see :meth:`KnowledgeGraph.packaged`)."""
    return KnowledgeGraph(load_packaged_graph())
