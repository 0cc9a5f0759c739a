"""KG_RAG: knowledge-graph retrieval over an in-memory rdflib graph or a remote SPARQL 1.1 endpoint.

:class:`KnowledgeGraph` links free text to graph nodes (labels and synonyms, tolerant to case,
punctuation, plurals, word order and small typos, via rapidfuzz), describes the linked entities
(definition, types, synonyms), lists their 1-hop neighbours and finds reasoning chains between
them (2-hop paths, and hierarchy paths such as ``disease -has_phenotype-> phenotype -is_a-> ...``).
:meth:`KnowledgeGraph.retrieve` renders all of it as readable evidence plus the triples it came
from. :func:`knowledge_graph_tool` wraps a graph into the ``KG_RAG`` LangChain tool through the
shared tool layer (input repair, time limit, retries, token trimming, ``ToolError`` results).

Security: text written by the model never becomes SPARQL syntax. Linking runs in Python over a
label index; queries are constant templates whose variables are bound to rdflib terms -- through
``initBindings`` for rdflib graphs, and for remote endpoints through a ``VALUES`` block whose terms
are serialised by :func:`sparql_term` (IRIs validated against the SPARQL ``IRIREF`` grammar,
literals fully escaped, blank nodes refused).

Example:
    >>> kg = KnowledgeGraph.packaged()                       # doctest: +SKIP
    >>> [e.label for e in kg.link("marfans syndrome and arachnodactyly")]  # doctest: +SKIP
    ['Marfan syndrome', 'Arachnodactyly']
    >>> tool = default_knowledge_graph_tool()                # doctest: +SKIP
    >>> print(tool.invoke("Does Marfan syndrome cause arachnodactyly?"))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rapidfuzz import fuzz, process
from rapidfuzz.distance import Levenshtein
from rdflib import BNode, Graph, Literal, Namespace, URIRef
from rdflib.namespace import RDF, RDFS, SKOS

from .base import ToolError
from .layer import LayeredTool, ToolFailure, make_tool
from .text_analysis import word_spans

__all__ = [
    "KG",
    "PACKAGED_GRAPH",
    "DEFAULT_PREFIXES",
    "KnowledgeGraph",
    "LinkedEntity",
    "KGTriple",
    "EntityDescription",
    "KGEvidence",
    "KGQueryError",
    "KGQuery",
    "sparql_term",
    "load_packaged_graph",
    "knowledge_graph_tool",
    "default_knowledge_graph_tool",
    "TOOL_NAME",
]

TOOL_NAME = "KG_RAG"

#: Vocabulary of the packaged graph (classes and relations that have no standard IRI).
KG = Namespace("urn:tcrag:kg:")
HPO_BASE = "http://purl.obolibrary.org/obo/HP_"
ORPHA_BASE = "http://www.orpha.net/ORDO/Orphanet_"
OMIM_BASE = "https://omim.org/entry/"
DECIPHER_BASE = "https://www.deciphergenomics.org/syndrome/"
ICD10CM_BASE = "http://purl.bioontology.org/ontology/ICD10CM/"

#: The packaged medical graph (built by ``tcrag build-kg``; see :mod:`.kg_build`).
PACKAGED_GRAPH = Path(__file__).parent / "data" / "kg_medical.nt.gz"

#: CURIE prefix -> IRI base, for reading ids in text (``HP:0001250``) and for compact output.
DEFAULT_PREFIXES: dict[str, str] = {
    "HP": HPO_BASE,
    "ORPHA": ORPHA_BASE,
    "OMIM": OMIM_BASE,
    "DECIPHER": DECIPHER_BASE,
    "ICD10CM": ICD10CM_BASE,
    "kg": str(KG),
    "rdfs": str(RDFS),
    "skos": str(SKOS),
    "rdf": str(RDF),
}

_OBO = "http://purl.obolibrary.org/obo/"
_OBOINOWL = "http://www.geneontology.org/formats/oboInOwl#"
LABEL_PREDICATES = (RDFS.label, SKOS.prefLabel)
SYNONYM_PREDICATES = (
    SKOS.altLabel,
    URIRef(_OBOINOWL + "hasExactSynonym"),
    URIRef(_OBOINOWL + "hasRelatedSynonym"),
    URIRef(_OBOINOWL + "hasBroadSynonym"),
    URIRef(_OBOINOWL + "hasNarrowSynonym"),
)
DEFINITION_PREDICATES = (SKOS.definition, URIRef(_OBO + "IAO_0000115"), RDFS.comment)
HIERARCHY_PREDICATES = (RDFS.subClassOf, SKOS.broader)
_META_CLASSES = (RDF.Property, RDFS.Class)


def _values(predicates: Iterable[URIRef]) -> str:
    # Constant IRIs defined above, never model text.
    return " ".join(p.n3() for p in predicates)


# --------------------------------------------------------------------------- query templates
# Every template is a constant. Variables named in a call's bindings are bound to rdflib terms;
# the line "#@VALUES" is a SPARQL comment where the remote backend inlines its VALUES block.

_Q_LABELS = f"""SELECT ?s ?p ?l WHERE {{
  VALUES ?p {{ {_values(LABEL_PREDICATES + SYNONYM_PREDICATES)} }}
  ?s ?p ?l . FILTER(isLiteral(?l) && !isBlank(?s))
}}"""

_Q_META = f"""SELECT DISTINCT ?s WHERE {{
  VALUES ?c {{ {_values(_META_CLASSES)} }}
  ?s {RDF.type.n3()} ?c .
}}"""

_Q_EXACT = f"""SELECT DISTINCT ?s WHERE {{
  #@VALUES
  VALUES ?p {{ {_values(LABEL_PREDICATES + SYNONYM_PREDICATES)} }}
  ?s ?p ?q .
}} ORDER BY ?s LIMIT 20"""

_Q_EXISTS = """SELECT ?p WHERE {
  #@VALUES
  { ?s ?p ?o } UNION { ?o2 ?p ?s }
} LIMIT 1"""

_Q_LITERALS = """SELECT ?p ?o WHERE {
  #@VALUES
  ?s ?p ?o . FILTER(isLiteral(?o))
} ORDER BY ?p ?o LIMIT 200"""

_Q_TYPES = f"""SELECT ?t ?tl WHERE {{
  #@VALUES
  ?s {RDF.type.n3()} ?t .
  OPTIONAL {{ ?t {RDFS.label.n3()} ?tl }}
}} ORDER BY ?t LIMIT 20"""

_Q_OUT_COUNTS = f"""SELECT ?p (COUNT(DISTINCT ?o) AS ?n) WHERE {{
  #@VALUES
  ?s ?p ?o . FILTER(isIRI(?o) && ?p != {RDF.type.n3()})
}} GROUP BY ?p ORDER BY ?p"""

_Q_IN_COUNTS = f"""SELECT ?p (COUNT(DISTINCT ?x) AS ?n) WHERE {{
  #@VALUES
  ?x ?p ?s . FILTER(isIRI(?x) && ?p != {RDF.type.n3()})
}} GROUP BY ?p ORDER BY ?p"""

_Q_OUT = f"""SELECT DISTINCT ?o WHERE {{
  #@VALUES
  ?s ?p ?o . FILTER(isIRI(?o))
}} ORDER BY ?o LIMIT 50"""

_Q_IN = f"""SELECT DISTINCT ?x WHERE {{
  #@VALUES
  ?x ?p ?s . FILTER(isIRI(?x))
}} ORDER BY ?x LIMIT 50"""

_Q_DIRECT = f"""SELECT ?d ?p WHERE {{
  #@VALUES
  {{ ?a ?p ?b . BIND("ab" AS ?d) }} UNION {{ ?b ?p ?a . BIND("ba" AS ?d) }}
  FILTER(?p != {RDF.type.n3()})
}} ORDER BY ?d ?p LIMIT 10"""

# Two-hop paths between ?a and ?b through an intermediate node ?x, in every direction.
_Q_TWO_HOP = f"""SELECT ?d ?p1 ?x ?p2 WHERE {{
  #@VALUES
  {{ ?a ?p1 ?x . ?x ?p2 ?b . BIND("a>x>b" AS ?d) }}
  UNION {{ ?b ?p1 ?x . ?x ?p2 ?a . BIND("b>x>a" AS ?d) }}
  UNION {{ ?a ?p1 ?x . ?b ?p2 ?x . BIND("a>x<b" AS ?d) }}
  UNION {{ ?x ?p1 ?a . ?x ?p2 ?b . BIND("a<x>b" AS ?d) }}
  FILTER(isIRI(?x) && ?x != ?a && ?x != ?b && ?p1 != {RDF.type.n3()} && ?p2 != {RDF.type.n3()})
}} ORDER BY ?d ?x ?p1 ?p2 LIMIT 40"""

# Hierarchy paths are walked in Python one edge at a time: rdflib evaluates property paths
# (p+ / p*) without using the bound endpoints, which takes seconds to minutes on a large graph.
_Q_FIRST_HOPS = f"""SELECT ?p ?x WHERE {{
  #@VALUES
  ?a ?p ?x . FILTER(isIRI(?x) && ?p != {RDF.type.n3()})
}} ORDER BY ?p ?x LIMIT 100"""

_Q_PARENTS = f"""SELECT ?h ?y WHERE {{
  #@VALUES
  VALUES ?h {{ {_values(HIERARCHY_PREDICATES)} }}
  ?x ?h ?y . FILTER(isIRI(?y))
}} ORDER BY ?y ?h LIMIT 50"""

_Q_LABEL_OF = f"""SELECT ?l WHERE {{
  #@VALUES
  VALUES ?p {{ {_values(LABEL_PREDICATES)} }}
  ?s ?p ?l . FILTER(isLiteral(?l))
}} ORDER BY ?p ?l LIMIT 1"""


# --------------------------------------------------------------------------- safe terms

# SPARQL 1.1 IRIREF: no controls, space, <>"{}|^`\ .  We also require an absolute IRI with a scheme.
_IRI_OK = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\x00-\x20<>\"{}|^`\\\x7f]*")
_LANG_OK = re.compile(r"[A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8})*")
_ECHAR = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _escape_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ECHAR:
            out.append(_ECHAR[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{ord(ch):04X}")  # UCHAR escapes are legal inside SPARQL strings
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def sparql_term(term: Any) -> str:
    """Serialise an rdflib IRI or literal as a SPARQL term that can only ever be one term.

    Raises ``ValueError`` for anything else (blank nodes, IRIs outside the ``IRIREF`` grammar).

    Example:
        >>> sparql_term(Literal('x" } UNION { ?s ?p ?o } #'))
        '"x\\\\" } UNION { ?s ?p ?o } #"'
        >>> sparql_term(URIRef("http://x.org/a> } DROP ALL #"))
        Traceback (most recent call last):
        ...
        ValueError: not a safe IRI: 'http://x.org/a> } DROP ALL #'
    """
    if isinstance(term, URIRef):
        if not _IRI_OK.fullmatch(str(term)):
            raise ValueError(f"not a safe IRI: {str(term)!r}")
        return f"<{term}>"
    if isinstance(term, Literal):
        body = _escape_literal(str(term))
        if term.language:
            if not _LANG_OK.fullmatch(term.language):
                raise ValueError(f"not a safe language tag: {term.language!r}")
            return f"{body}@{term.language}"
        if term.datatype is not None:
            return f"{body}^^{sparql_term(URIRef(term.datatype))}"
        return body
    raise ValueError(f"cannot bind {type(term).__name__} {term!r} in a SPARQL query")


class KGQueryError(Exception):
    """A graph query failed. ``kind`` is a :class:`ToolError` kind; ``retryable`` marks transient failures."""

    def __init__(self, kind: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


# --------------------------------------------------------------------------- backends


class _LocalBackend:
    """rdflib graph; values are passed with ``initBindings`` (never spliced into the text)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._lock = threading.Lock()  # rdflib's Memory store is not safe under concurrent writes/queries

    def select(self, query: str, bindings: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self._lock:
            result = self.graph.query(query, initBindings=dict(bindings))
            names = [str(v) for v in result.vars]
            return [{n: row[i] for i, n in enumerate(names) if row[i] is not None} for row in result]

    def label_rows(self) -> Iterable[tuple[Any, Any, Any]]:
        with self._lock:
            rows = []
            for p in LABEL_PREDICATES + SYNONYM_PREDICATES:
                rows.extend((s, p, o) for s, o in self.graph.subject_objects(p) if isinstance(o, Literal))
            return rows

    def meta_nodes(self) -> set[Any]:
        with self._lock:
            return {s for c in _META_CLASSES for s in self.graph.subjects(RDF.type, c)}

    def describe_source(self) -> str:
        return f"in-memory rdflib graph ({len(self.graph)} triples)"


class _RemoteBackend:
    """SPARQL 1.1 protocol over HTTP (POST, JSON results) with a real timeout.

    Bindings are inlined as one ``VALUES`` row at the template's ``#@VALUES`` marker, every term
    serialised by :func:`sparql_term`.
    """

    def __init__(self, endpoint: str, *, timeout_s: float, headers: Optional[Mapping[str, str]] = None, method: str = "POST") -> None:
        parsed = urllib.parse.urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"SPARQL endpoint must be an http(s) URL, got {endpoint!r}")
        if method not in ("GET", "POST"):
            raise ValueError(f"method must be GET or POST, got {method!r}")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        self.method = method
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})

    @staticmethod
    def render(query: str, bindings: Mapping[str, Any]) -> str:
        if not bindings:
            return query
        names = list(bindings)
        for name in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"bad variable name {name!r}")
        block = "VALUES ({}) {{ ({}) }}".format(
            " ".join("?" + n for n in names), " ".join(sparql_term(bindings[n]) for n in names)
        )
        if query.count("#@VALUES") != 1:
            raise ValueError("query template needs exactly one #@VALUES marker to take bindings")
        return query.replace("#@VALUES", block)

    def _post(self, query: str) -> dict[str, Any]:
        form = urllib.parse.urlencode({"query": query})
        headers = {"Accept": "application/sparql-results+json", **self.headers}
        if self.method == "GET":
            joiner = "&" if urllib.parse.urlparse(self.endpoint).query else "?"
            request = urllib.request.Request(self.endpoint + joiner + form, headers=headers, method="GET")
        else:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            request = urllib.request.Request(self.endpoint, data=form.encode("utf-8"), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode("utf-8", "replace").strip()
            retry = exc.code >= 500 or exc.code == 429
            raise KGQueryError(
                "unavailable" if retry else "bad_response",
                f"SPARQL endpoint answered HTTP {exc.code}: {detail}",
                retryable=retry,
            ) from None
        except (socket.timeout, TimeoutError):
            raise KGQueryError("timeout", f"SPARQL endpoint gave no answer within {self.timeout_s:g} s", retryable=True) from None
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KGQueryError("unavailable", f"SPARQL endpoint {self.endpoint} unreachable: {reason}", retryable=True) from None
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KGQueryError("bad_response", f"SPARQL endpoint returned invalid JSON: {exc}") from None

    @staticmethod
    def _term(value: Mapping[str, Any]) -> Any:
        kind = value.get("type")
        text = value.get("value")
        if not isinstance(text, str):
            raise KGQueryError("bad_response", "SPARQL result term without a string value")
        if kind == "uri":
            return URIRef(text)
        if kind in ("literal", "typed-literal"):
            datatype = value.get("datatype")
            return Literal(text, lang=value.get("xml:lang"), datatype=URIRef(datatype) if datatype else None)
        if kind == "bnode":
            return BNode(text)
        raise KGQueryError("bad_response", f"unknown SPARQL result term type {kind!r}")

    def select(self, query: str, bindings: Mapping[str, Any]) -> list[dict[str, Any]]:
        data = self._post(self.render(query, bindings))
        try:
            rows = data["results"]["bindings"]
            if not isinstance(rows, list):
                raise TypeError
            return [{k: self._term(v) for k, v in row.items()} for row in rows]
        except (KeyError, TypeError, AttributeError):
            raise KGQueryError("bad_response", "SPARQL endpoint returned JSON that is not a SELECT result") from None

    def label_rows(self) -> Iterable[tuple[Any, Any, Any]]:
        return [(r["s"], r["p"], r["l"]) for r in self.select(_Q_LABELS, {}) if {"s", "p", "l"} <= r.keys()]

    def meta_nodes(self) -> set[Any]:
        return {r["s"] for r in self.select(_Q_META, {}) if "s" in r}

    def describe_source(self) -> str:
        return f"SPARQL endpoint {self.endpoint}"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class LinkedEntity:
    """A graph node found in the text. ``via`` is the label/synonym/id that matched."""

    iri: str
    label: str
    mention: str
    via: str
    match: str  # "label", "synonym", "id", "word-order", "fuzzy"
    score: float


@dataclass(frozen=True)
class KGTriple:
    """One triple with display labels (``None`` when the node has no label)."""

    s: str
    p: str
    o: str
    s_label: Optional[str] = None
    p_label: Optional[str] = None
    o_label: Optional[str] = None

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.s, self.p, self.o)


@dataclass
class EntityDescription:
    iri: str
    label: str
    types: list[str] = field(default_factory=list)
    definition: Optional[str] = None
    synonyms: list[str] = field(default_factory=list)


@dataclass
class KGEvidence:
    """What :meth:`KnowledgeGraph.retrieve` found: entities, descriptions, chains, triples, text."""

    entities: list[LinkedEntity]
    descriptions: list[EntityDescription]
    neighbours: dict[str, list[tuple[str, str, list[KGTriple], int]]]
    chains: list[list[KGTriple]]
    triples: list[KGTriple]
    text: str


# --------------------------------------------------------------------------- text normalisation

_STOPWORDS = frozenset(
    """a an and are as at be by can cause causes caused could did do does for from had has have how
    i if in into is it its may might of on or other patient patients should such than that the
    their them then there these they this those to was were what when where which who why
    will with without would you your not no yes all any some""".split()
)
_KEEP_S = ("ss", "us", "is", "os", "xis", "ys")
_ID_IN_TEXT = re.compile(r"\b([A-Za-z][A-Za-z0-9]{0,15}):\s?([A-Za-z0-9][A-Za-z0-9._-]{0,30})")
_IRI_IN_TEXT = re.compile(r"<?(https?://[^\s<>\"{}|^`\\]+)>?")
_TRAILING_PAREN = re.compile(r"\s*\([^()]*\)\s*$")
_ICD_CODE = re.compile(r"\b([A-TV-Z][0-9][0-9AB](?:\.[0-9A-Z]{1,4})?)\b")


def _singular(token: str) -> str:
    if len(token) <= 3 or not token.isalpha():
        return token
    if token.endswith("ies") and len(token) > 4:
        return token[:-3] + "y"
    if token.endswith(("ches", "shes", "xes", "sses")):
        return token[:-2]
    if token.endswith("s") and not token.endswith(_KEEP_S):
        return token[:-1]
    return token


def _tokens_with_spans(text: str) -> list[tuple[str, int, int]]:
    """Words of ``text`` as the shared analyzer folds and splits them (:func:`.text_analysis.word_spans`),
    singularised; digits and single letters are kept, so "type 1" and "type 2" stay different."""
    return [(_singular(word), start, end) for word, start, end in word_spans(text)]


def _norm_tokens(text: str) -> list[str]:
    return [t for t, _, _ in _tokens_with_spans(text)]


def _content(tokens: Sequence[str]) -> list[str]:
    return [t for t in tokens if t not in _STOPWORDS]


# --------------------------------------------------------------------------- label index


class _LabelIndex:
    """Normalised label/synonym keys -> nodes, a token vocabulary for typo repair."""

    def __init__(self, rows: Iterable[tuple[Any, Any, Any]], *, exclude: set[Any]) -> None:
        self.exact: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # key -> (iri, text, kind)
        self.bag: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
        self.labels: dict[str, str] = {}
        vocab: Counter[str] = Counter()
        label_preds = set(LABEL_PREDICATES)
        for s, p, literal in rows:
            if not isinstance(s, URIRef) or s in exclude:
                continue
            text = str(literal).strip()
            if not text or len(text) > 300:
                continue
            iri = str(s)
            kind = "label" if p in label_preds else "synonym"
            if kind == "label" and (iri not in self.labels or p == RDFS.label):
                self.labels[iri] = text
            entry = (iri, text, kind)
            # "Diabetes mellitus (E08-E13)" is also found as "Diabetes mellitus"
            bare = _TRAILING_PAREN.sub("", text)
            for variant in {text, bare} if bare else {text}:
                tokens = _norm_tokens(variant)
                if not tokens:
                    continue
                if entry not in self.exact[" ".join(tokens)]:
                    self.exact[" ".join(tokens)].append(entry)
                content = _content(tokens)
                if len(content) >= 2 and entry not in self.bag[" ".join(sorted(content))]:
                    self.bag[" ".join(sorted(content))].append(entry)
                vocab.update(set(tokens))
        for table in (self.exact, self.bag):
            for key, entries in table.items():
                entries.sort(key=lambda e: (e[2] != "label", e[0]))
        self.nodes = set(self.labels) | {e[0] for entries in self.exact.values() for e in entries}
        # most frequent first: on equal edit distance rapidfuzz keeps the first choice
        self.vocab = [t for t, _ in sorted(vocab.items(), key=lambda kv: (-kv[1], kv[0]))]
        self.vocab_set = set(self.vocab)
        self.vocab_count = dict(vocab)
        self.exact_keys = list(self.exact)
        self.max_tokens = min(12, max((k.count(" ") + 1 for k in self.exact_keys), default=1))

    def correct(self, token: str) -> tuple[str, int]:
        """Closest vocabulary token within a small edit distance (1 up to 7 letters, else 2)."""
        if token in self.vocab_set or len(token) < 5 or not token.isalpha():
            return token, 0
        limit = 1 if len(token) <= 7 else 2
        best = process.extractOne(token, self.vocab, scorer=Levenshtein.distance, score_cutoff=limit)
        if best is None:
            return token, 0
        return best[0], int(best[1])

    def common_neighbour(self, token: str) -> tuple[str, int]:
        """For a rare vocabulary token (a typo inside some label, e.g. "syndrom"), a far more
        frequent token one edit away ("syndrome"); else the token itself."""
        count = self.vocab_count.get(token, 0)
        if not count or count >= 3 or len(token) < 5 or not token.isalpha():
            return token, 0
        options = process.extract(token, self.vocab, scorer=Levenshtein.distance, score_cutoff=1, limit=8)
        best = [(self.vocab_count[t], t, int(d)) for t, d, _ in options if t != token and self.vocab_count[t] >= 10 * count]
        if not best:
            return token, 0
        _, alt, distance = max(best, key=lambda item: (item[0], item[1]))
        return alt, distance


# --------------------------------------------------------------------------- the graph


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
        global _PACKAGED_KG
        if _PACKAGED_KG is None:
            with _PACKAGED_KG_LOCK:
                if _PACKAGED_KG is None:
                    _PACKAGED_KG = KnowledgeGraph(load_packaged_graph())
        return _PACKAGED_KG

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
        """Rank graph nodes mentioned in ``text``.

        Matches ids (``HP:0001250``, ICD-10-CM codes like ``E11.9``, full IRIs), then labels and
        synonyms on normalised tokens (case, punctuation, accents, plurals), with word-order
        variants and small typos repaired against the label vocabulary; a short text that matched
        nothing is compared whole with every label (``fuzzy``). Longer, exact, preferred-label
        matches rank first; overlapping mentions keep the best one.

        Example:
            >>> from rdflib import Graph, Literal, URIRef, RDFS
            >>> g = Graph(); _ = g.add((URIRef("http://ex.org/m"), RDFS.label, Literal("Marfan syndrome")))
            >>> KnowledgeGraph(g).link("syndrome, Marfan")[0].match
            'word-order'
        """
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        index = self.index
        found: dict[str, LinkedEntity] = {}
        spans_taken: list[tuple[int, int]] = []

        def add(entity: LinkedEntity) -> None:
            old = found.get(entity.iri)
            if old is None or entity.score > old.score:
                found[entity.iri] = entity

        # 1. explicit identifiers
        for match in _IRI_IN_TEXT.finditer(text):
            iri = match.group(1).rstrip(".,;)")
            if _IRI_OK.fullmatch(iri) and (iri in index.nodes or self.exists(iri)):
                add(LinkedEntity(iri, self.label(iri) or iri, match.group(0), iri, "id", 1.0))
                spans_taken.append(match.span())
        for match in _ID_IN_TEXT.finditer(text):
            if match.group(1).lower() in ("http", "https") or _overlaps(match.span(), spans_taken):
                continue
            iri = self.expand(f"{match.group(1)}:{match.group(2)}".rstrip("."))
            if iri is None:
                continue
            if match.group(1).upper() == "HP" and match.group(2).isdigit():
                iri = HPO_BASE + f"{int(match.group(2)):07d}" if self.prefixes.get("HP") == HPO_BASE else iri
            if _IRI_OK.fullmatch(iri) and (iri in index.nodes or self.exists(iri)):
                add(LinkedEntity(iri, self.label(iri) or iri, match.group(0), self.curie(iri), "id", 1.0))
                spans_taken.append(match.span())
        icd_base = self.prefixes.get("ICD10CM")
        if icd_base:
            for match in _ICD_CODE.finditer(text):
                if _overlaps(match.span(), spans_taken):
                    continue
                code = match.group(1)
                # a code missing from a curated graph falls back to its nearest listed ancestor
                # (E11.65 -> E11.6 -> E11), scored a little lower
                for cut in range(len(code), 2, -1):
                    iri = icd_base + code[:cut].rstrip(".")
                    if iri in index.nodes:
                        exact = cut == len(code)
                        add(LinkedEntity(iri, self.label(iri) or iri, code, self.curie(iri), "id" if exact else "id-ancestor", 1.0 if exact else 0.95))
                        spans_taken.append(match.span())
                        break

        # 2. labels and synonyms on token n-grams
        raw_tokens = [(t, s, e) for t, s, e in _tokens_with_spans(text) if not _overlaps((s, e), spans_taken)]
        fixed = [index.correct(t) for t, _, _ in raw_tokens]
        readings = [fixed]
        also = [index.common_neighbour(t) if e == 0 else (t, e) for t, e in fixed]
        if also != fixed:
            readings.append(also)  # a second reading with rare tokens replaced by common ones
        candidates: list[tuple[float, int, int, int, list[tuple[str, str, str]], str]] = []
        n_tok = len(raw_tokens)
        windows = [(f, n, i) for f in readings for n in range(min(index.max_tokens, n_tok), 0, -1) for i in range(n_tok - n + 1)]
        for reading, n, i in windows:
            window = [reading[j][0] for j in range(i, i + n)]
            if window[0] in _STOPWORDS or window[-1] in _STOPWORDS:
                continue
            if n == 1 and (len(window[0]) < 3 or window[0].isdigit()):
                continue
            edits = sum(reading[j][1] for j in range(i, i + n))
            penalty = 0.06 * edits
            entries = index.exact.get(" ".join(window))
            how = "exact"
            if entries is None and n >= 2:
                content = _content(window)
                if len(content) >= 2:
                    entries = index.bag.get(" ".join(sorted(content)))
                    how = "word-order"
            if not entries:
                continue
            base = 1.0 if how == "exact" else 0.9
            score = round(base - penalty, 4)
            if score >= min_score:
                candidates.append((score, n, i, edits, entries, how))
        candidates.sort(key=lambda c: (-c[1], -c[0], c[2]))  # longest mention first
        used: set[int] = set()
        for score, n, i, edits, entries, how in candidates:
            positions = set(range(i, i + n))
            if positions & used:
                continue
            used |= positions
            mention = text[raw_tokens[i][1] : raw_tokens[i + n - 1][2]]
            for iri, via, kind in entries:
                match_kind = how if how != "exact" else kind
                if edits:
                    match_kind = "fuzzy"
                entity_score = score - (0.02 if kind == "synonym" else 0.0)
                add(LinkedEntity(iri, index.labels.get(iri, via), mention, via, match_kind, round(entity_score, 4)))

        # 3. whole-text fuzzy match for short inputs (an entity name with a typo, missing words...)
        if fuzzy and not found:
            query = " ".join(_norm_tokens(text))
            if 0 < len(query) <= 80 and len(_content(query.split())) >= 1:
                for key, ratio, _ in process.extract(
                    query, index.exact_keys, scorer=fuzz.token_sort_ratio, limit=limit, score_cutoff=88
                ):
                    for iri, via, kind in index.exact[key]:
                        score = round(ratio / 100.0 - 0.1, 4)
                        if score >= min_score - 0.05:
                            add(LinkedEntity(iri, index.labels.get(iri, via), text.strip(), via, "fuzzy", score))

        ranked = sorted(found.values(), key=lambda e: (-e.score, -len(e.mention), e.match != "label", e.iri))
        return ranked[: max(0, limit)]

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
        text = self._render(chosen, descriptions, neighbours, chains, triples)
        return KGEvidence(chosen, descriptions, neighbours, chains, triples, text)

    def _render(self, chosen, descriptions, neighbours, chains, triples) -> str:
        if not chosen:
            return ""
        lines = ["Linked entities: " + "; ".join(
            f"{self.display(e.iri)} (\"{e.mention}\" -> {e.match} match, score {e.score:.2f})" for e in chosen
        )]
        if chains:
            lines.append("Reasoning chains:")
            for chain in chains:
                lines.append("- " + self._render_chain(chain))
        for e, d in zip(chosen, descriptions):
            lines.append(f"== {self.display(e.iri)}" + (f" ({', '.join(d.types)})" if d.types else ""))
            if d.definition:
                lines.append(f"Definition: {d.definition}")
            if d.synonyms:
                lines.append("Synonyms: " + "; ".join(d.synonyms))
            for direction, p, shown, total in neighbours[e.iri]:
                name = self.relation_name(p)
                items = "; ".join(self.display(t.o if direction == "out" else t.s) for t in shown)
                more = f" ({len(shown)} of {total} shown)" if total > len(shown) else ""
                if direction == "out":
                    lines.append(f"{name}: {items}{more}")
                else:
                    lines.append(f"{name} (incoming, from): {items}{more}")
        lines.append("Triples (subject, relation, object):")
        for t in triples:
            lines.append(f"({self.curie(t.s)}, {self.curie(t.p)}, {self.curie(t.o)})")
        return "\n".join(lines)

    def _render_chain(self, chain: list[KGTriple]) -> str:
        parts = []
        for k, t in enumerate(chain):
            subject = self.display(t.s)
            if k == 0 or chain[k - 1].o != t.s:
                parts.append(("; " if k else "") + subject)
            parts.append(f" -{self.relation_name(t.p)}-> {self.display(t.o)}")
        return "".join(parts)


_PACKAGED_KG: Optional[KnowledgeGraph] = None
_PACKAGED_KG_LOCK = threading.Lock()


def _overlaps(span: tuple[int, int], taken: Sequence[tuple[int, int]]) -> bool:
    return any(span[0] < e and s < span[1] for s, e in taken)


def _safe_iri(iri: Any) -> URIRef:
    text = str(iri)
    if not _IRI_OK.fullmatch(text):
        raise KGQueryError("bad_input", f"not a valid IRI: {text[:200]!r}")
    return URIRef(text)


# --------------------------------------------------------------------------- packaged graph

_PACKAGED_LOCK = threading.Lock()
_PACKAGED: dict[str, Graph] = {}


def _parse_file(path: Path, *, format: Optional[str] = None) -> Graph:
    """Parse an RDF file; gzip allowed. N-Triples go through pyoxigraph's parser when installed
    (about 1.5x faster to an identical rdflib graph), else through rdflib's."""
    import gzip

    if not path.is_file():
        raise FileNotFoundError(f"graph file not found: {path}")
    name = path.name.lower()
    gz = name.endswith(".gz")
    fmt = format or _guess_format(name[:-3] if gz else name)
    data = gzip.open(path, "rb").read() if gz else path.read_bytes()
    graph = Graph()
    if fmt in ("nt", "ntriples", "nt11"):
        try:
            _add_ntriples_fast(graph, data)
            return graph
        except ImportError:
            pass
    graph.parse(data=data, format=fmt)
    return graph


_XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"


def _add_ntriples_fast(graph: Graph, data: bytes) -> None:
    import pyoxigraph as ox

    iris: dict[str, URIRef] = {}

    def conv(node: Any) -> Any:
        if isinstance(node, ox.NamedNode):
            value = node.value
            term = iris.get(value)
            if term is None:
                term = iris[value] = URIRef(value)
            return term
        if isinstance(node, ox.BlankNode):
            return BNode(node.value)
        if node.language:
            return Literal(node.value, lang=node.language)
        datatype = node.datatype.value
        return Literal(node.value) if datatype == _XSD_STRING else Literal(node.value, datatype=URIRef(datatype))

    try:
        quads = [(conv(q.subject), conv(q.predicate), conv(q.object), graph) for q in ox.parse(data, format=ox.RdfFormat.N_TRIPLES)]
    except SyntaxError as exc:
        raise ValueError(f"invalid N-Triples: {exc}") from None
    graph.addN(quads)


def _guess_format(name: str) -> str:
    for suffix, fmt in ((".nt", "nt"), (".ttl", "turtle"), (".rdf", "xml"), (".owl", "xml"), (".xml", "xml"), (".jsonld", "json-ld"), (".n3", "n3")):
        if name.endswith(suffix):
            return fmt
    raise ValueError(f"cannot tell the RDF format of {name!r}; pass format=")


def load_packaged_graph(path: str | Path = PACKAGED_GRAPH) -> Graph:
    """Parse the packaged graph once per process (thread-safe) and return the shared rdflib Graph."""
    key = str(Path(path).resolve())
    with _PACKAGED_LOCK:
        if key not in _PACKAGED:
            _PACKAGED[key] = _parse_file(Path(path))
        return _PACKAGED[key]


# --------------------------------------------------------------------------- the LangChain tool


class KGQuery(BaseModel):
    """Arguments of ``KG_RAG``. Plain text input becomes ``query``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(default="", max_length=4000, description="Question or entity names, free text.")
    entities: list[str] = Field(default_factory=list, max_length=10, description="Entity names or ids to look up.")

    @field_validator("entities", mode="before")
    @classmethod
    def _one_entity(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in re.split(r"[;\n]", value) if v.strip()]
        return value

    @field_validator("entities")
    @classmethod
    def _short_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if len(name) > 300:
                raise ValueError("entity names must be at most 300 characters")
        return value


TOOL_DESCRIPTION = (
    "Medical knowledge graph (Human Phenotype Ontology phenotypes and rare-disease annotations, "
    "ICD-10-CM codes). Input: a question or entity names as text, or JSON "
    '{"query": "...", "entities": ["..."]}. Returns definitions, related entities and reasoning '
    "chains between the entities found, with the triples they come from."
)


def knowledge_graph_tool(
    kg: KnowledgeGraph | Graph | str | Callable[[], KnowledgeGraph],
    *,
    name: str = TOOL_NAME,
    max_entities: int = 3,
    per_relation: int = 5,
    max_chains: int = 6,
    timeout_s: float = 30.0,
    retries: int = 2,
    backoff: float = 0.5,
    max_output_tokens: int = 700,
    cache_size: int = 128,
) -> LayeredTool:
    """The ``KG_RAG`` tool over ``kg``: a :class:`KnowledgeGraph`, an rdflib Graph, a SPARQL endpoint
    URL, or a zero-argument function returning a KnowledgeGraph (called at each tool call, so the
    graph can be loaded lazily).

    ``tool.invoke(text_or_dict)`` returns the evidence text, or a :class:`ToolError` (no entity
    found -> ``kind="not_found"``; endpoint down -> ``"unavailable"``; too slow -> ``"timeout"``).

    Example:
        >>> from rdflib import Graph, Literal, URIRef, RDFS
        >>> g = Graph(); _ = g.add((URIRef("http://ex.org/flu"), RDFS.label, Literal("Influenza")))
        >>> t = knowledge_graph_tool(g)
        >>> t.invoke("influenza").splitlines()[0]
        'Linked entities: Influenza [<http://ex.org/flu>] ("influenza" -> label match, score 1.00)'
        >>> t.invoke("zzzz").kind
        'not_found'
    """
    if isinstance(kg, Graph):
        kg = KnowledgeGraph(kg)
    elif isinstance(kg, str):
        kg = KnowledgeGraph.from_endpoint(kg, timeout_s=min(timeout_s, 10.0))
    if isinstance(kg, KnowledgeGraph):
        fixed_graph = kg
        get_graph: Callable[[], KnowledgeGraph] = lambda: fixed_graph
    elif callable(kg) and not isinstance(kg, type):
        get_graph = kg
    else:
        raise TypeError(f"kg must be a KnowledgeGraph, an rdflib Graph, an endpoint URL or a factory, got {type(kg).__name__}")
    for label, value in (("max_entities", max_entities), ("per_relation", per_relation), ("max_chains", max_chains)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 50:
            raise ValueError(f"{label} must be an integer from 1 to 50, got {value!r}")
    def run(args: KGQuery) -> str | ToolError:
        if not args.query.strip() and not args.entities:
            return ToolError(name, "bad_input", "give a question or entity names to look up")
        try:
            graph = get_graph()
            if not isinstance(graph, KnowledgeGraph):
                raise KGQueryError("internal", f"graph factory returned {type(graph).__name__}, not a KnowledgeGraph")
            evidence = graph.retrieve(
                args.query, entities=args.entities, max_entities=max_entities, per_relation=per_relation, max_chains=max_chains
            )
        except KGQueryError as exc:
            raise ToolFailure(exc.kind, str(exc), retryable=exc.retryable) from None
        if not evidence.entities:
            asked = args.query or "; ".join(args.entities)
            return ToolError(name, "not_found", f"no entity of the knowledge graph matches {asked[:200]!r}; try other names or ids")
        return evidence.text

    return make_tool(
        name,
        TOOL_DESCRIPTION,
        run,
        args_schema=KGQuery,
        timeout_s=timeout_s,
        retries=retries,
        backoff=backoff,
        max_output_tokens=max_output_tokens,
        cache_size=cache_size,
        primary_field="query",
    )


def default_knowledge_graph_tool(*, preload: bool = False, **options: Any) -> LayeredTool:
    """``KG_RAG`` over the packaged medical graph, shared with :meth:`KnowledgeGraph.packaged`.

    The graph is parsed and indexed on the first call (about 3-7 s on 2 busy cores), or in a
    background thread started now when ``preload=True``. Other keyword options are those of
    :func:`knowledge_graph_tool`.

    Example:
        >>> tool = default_knowledge_graph_tool(max_entities=2)   # doctest: +SKIP
        >>> "Seizure" in tool.invoke("HP:0001250")                  # doctest: +SKIP
        True
    """
    tool = knowledge_graph_tool(KnowledgeGraph.packaged, **options)
    if preload:
        threading.Thread(target=_preload_packaged, name="kg-preload", daemon=True).start()
    return tool


def _preload_packaged() -> None:
    try:
        KnowledgeGraph.packaged().index
    except Exception:  # the first tool call reports the problem as a ToolError
        pass
