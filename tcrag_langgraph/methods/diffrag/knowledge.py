"""The knowledge of TCM-DiffRAG: the macro-micro graph (heading tree, passages, their triples) and the
case overlay (:class:`SolvedCase` and their triples) in one rdflib :class:`~rdflib.Dataset` with two
named graphs (:class:`DiffRAGKnowledge`), its vocabulary and its constant SPARQL queries."""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator
from rdflib import RDF, RDFS, Dataset, Literal as RDFLiteral, Namespace, URIRef

from .parsing import Triple


#: Vocabulary of the macro-micro graph and the overlay.
DR = Namespace("urn:tcrag:diffrag:")
#: Named graph of the heading tree, the passages and their triples (the paper's G_book).
BOOK_GRAPH = URIRef("urn:tcrag:diffrag:graph:book")
#: Named graph of the solved cases and their triples (the paper's G_personal).
CASE_GRAPH = URIRef("urn:tcrag:diffrag:graph:cases")


_PREFIX = "PREFIX dr: <urn:tcrag:diffrag:>\nPREFIX rdfs: <http://www.w3.org/2000/01/rdf-schema#>\n"
_Q_TRIPLES = _PREFIX + "SELECT ?t ?s ?r ?o WHERE { GRAPH ?g { ?t a dr:Triple ; dr:subject ?s ; dr:relation ?r ; dr:object ?o } }"
_Q_PASSAGES_OF = _PREFIX + (
    "SELECT ?p ?id ?text ?section ?chapter WHERE { GRAPH ?g { ?t dr:fromPassage ?p . "
    "?p dr:chunkId ?id ; dr:text ?text ; dr:partOf ?sec . ?sec rdfs:label ?section ; dr:partOf ?ch . "
    "?ch rdfs:label ?chapter } }"
)
_Q_CASES_OF = _PREFIX + (
    "SELECT ?c ?id ?question ?reasoning ?answer WHERE { GRAPH ?g { ?t dr:fromCase ?c . "
    "?c dr:caseId ?id ; dr:question ?question ; dr:reasoning ?reasoning ; dr:answer ?answer } }"
)
_Q_CHILDREN = _PREFIX + "SELECT ?child ?label WHERE { GRAPH ?g { ?child dr:partOf ?node ; rdfs:label ?label } }"
#: Every SPARQL text this module runs: constants, values bound with ``initBindings`` only.
SPARQL_QUERIES = frozenset({_Q_TRIPLES, _Q_PASSAGES_OF, _Q_CASES_OF, _Q_CHILDREN})


class SolvedCase(BaseModel):
    """A solved case for the personal overlay: question, reasoning and answer (the paper's C)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1, max_length=20_000)
    reasoning: str = Field(default="", max_length=50_000)
    answer: str = Field(min_length=1, max_length=20_000)

    @field_validator("case_id", "question", "answer")
    @classmethod
    def _readable(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()


def _node(kind: str, *ids: str) -> URIRef:
    """A stable IRI for a tree node / passage / case / triple (ids percent-encoded, never raw)."""
    return URIRef(f"urn:tcrag:diffrag:{kind}:" + "/".join(urllib.parse.quote(i, safe="") for i in ids))


def _triple_node(triple: Triple) -> URIRef:
    return _node("triple", hashlib.sha256(triple.key.encode("utf-8")).hexdigest()[:24])


class DiffRAGKnowledge:
    """The macro-micro graph and the case overlay: an rdflib :class:`Dataset` with two named graphs.

    The general graph (:data:`BOOK_GRAPH`) holds the heading tree (``dr:partOf`` links, titles as
    ``rdfs:label``), the passages (``dr:text``) and the extracted triples (``dr:fromPassage``). The
    overlay (:data:`CASE_GRAPH`) holds the cases and their triples (``dr:fromCase``); adding to it
    never touches the general graph. Thread-safe for concurrent reads after it is built.

    Example:
        >>> k = DiffRAGKnowledge()
        >>> p = k.add_passage(book="Notes", chapter="Asthma", section="Treatment", chunk_id="n#0", text="Steroids help.")
        >>> k.add_triple(Triple(subject="steroids", relation="treat", object="asthma"), passage=p)
        >>> [t.as_list() for t, _ in k.triples("general")]
        [['steroids', 'treat', 'asthma']]
    """

    def __init__(self, dataset: Optional[Dataset] = None) -> None:
        if dataset is not None and not isinstance(dataset, Dataset):
            raise ValueError(f"dataset must be an rdflib Dataset, not {type(dataset).__name__}")
        self.dataset = dataset if dataset is not None else Dataset()
        self._lock = threading.RLock()
        self._vectors: dict[str, np.ndarray] = {}

    @property
    def book(self):
        return self.dataset.graph(BOOK_GRAPH)

    @property
    def cases(self):
        return self.dataset.graph(CASE_GRAPH)

    # -- writing

    def add_passage(self, *, book: str, chapter: str, section: str, chunk_id: str, text: str) -> URIRef:
        """Add the heading path book > chapter > section and the passage under it; return the passage node."""
        for name, value in (("book", book), ("chapter", chapter), ("chunk_id", chunk_id), ("text", text)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be non-empty text")
        section = section.strip() if isinstance(section, str) and section.strip() else "(untitled)"
        g = self.book
        with self._lock:
            book_node = _node("book", book)
            chapter_node = _node("chapter", book, chapter)
            section_node = _node("section", book, chapter, section)
            passage = _node("passage", chunk_id)
            for node, kind, label, parent in (
                (book_node, DR.Book, book, None),
                (chapter_node, DR.Chapter, chapter, book_node),
                (section_node, DR.Section, section, chapter_node),
            ):
                g.add((node, RDF.type, kind))
                g.add((node, RDFS.label, RDFLiteral(label)))
                if parent is not None:
                    g.add((node, DR.partOf, parent))
            g.add((passage, RDF.type, DR.Passage))
            g.add((passage, RDFS.label, RDFLiteral(chunk_id)))
            g.add((passage, DR.chunkId, RDFLiteral(chunk_id)))
            g.add((passage, DR.text, RDFLiteral(text)))
            g.add((passage, DR.partOf, section_node))
        return passage

    def add_case(self, case: SolvedCase) -> URIRef:
        node = _node("case", case.case_id)
        g = self.cases
        with self._lock:
            g.add((node, RDF.type, DR.Case))
            g.add((node, DR.caseId, RDFLiteral(case.case_id)))
            g.add((node, DR.question, RDFLiteral(case.question)))
            g.add((node, DR.reasoning, RDFLiteral(case.reasoning)))
            g.add((node, DR.answer, RDFLiteral(case.answer)))
        return node

    def add_triple(self, triple: Triple, *, passage: Optional[URIRef] = None, case: Optional[URIRef] = None) -> None:
        """Store ``triple`` linked to exactly one source: a passage (general) or a case (overlay)."""
        if (passage is None) == (case is None):
            raise ValueError("a triple needs exactly one source: passage= or case=")
        g = self.book if passage is not None else self.cases
        node = _triple_node(triple)
        with self._lock:
            if (node, RDF.type, DR.Triple) not in g:  # the first wording of a fact is kept; later ones only link
                g.add((node, RDF.type, DR.Triple))
                g.add((node, DR.subject, RDFLiteral(triple.subject)))
                g.add((node, DR.relation, RDFLiteral(triple.relation)))
                g.add((node, DR.object, RDFLiteral(triple.object)))
            g.add((node, DR.fromPassage, passage) if passage is not None else (node, DR.fromCase, case))

    # -- reading (constant queries, values bound with initBindings)

    def _select(self, query: str, **bindings: Any) -> list[Any]:
        if query not in SPARQL_QUERIES:  # one home for the rule: only the module's constant texts run
            raise ValueError("unknown query")
        return list(self.dataset.query(query, initBindings=bindings))

    def triples(self, layer: Literal["general", "personal"]) -> list[tuple[Triple, URIRef]]:
        """The triples of one layer with their nodes, in a stable order."""
        graph = {"general": BOOK_GRAPH, "personal": CASE_GRAPH}.get(layer)
        if graph is None:
            raise ValueError(f"layer must be 'general' or 'personal', got {layer!r}")
        rows = self._select(_Q_TRIPLES, g=graph)
        found = {str(r.t): (Triple(subject=str(r.s), relation=str(r.r), object=str(r.o)), r.t) for r in rows}
        return [found[k] for k in sorted(found)]

    def passages_of(self, node: URIRef) -> list[dict[str, str]]:
        rows = self._select(_Q_PASSAGES_OF, g=BOOK_GRAPH, t=node)
        out = [{"id": str(r.id), "chapter": str(r.chapter), "section": str(r.section), "text": str(r.text)} for r in rows]
        return sorted(out, key=lambda p: p["id"])

    def cases_of(self, node: URIRef) -> list[dict[str, str]]:
        rows = self._select(_Q_CASES_OF, g=CASE_GRAPH, t=node)
        out = [{"id": str(r.id), "question": str(r.question), "reasoning": str(r.reasoning), "answer": str(r.answer)}
               for r in rows]
        return sorted(out, key=lambda c: c["id"])

    def children(self, node: URIRef) -> list[tuple[URIRef, str]]:
        """Nodes directly under ``node`` in the heading tree, ``(node, title)`` by title."""
        rows = self._select(_Q_CHILDREN, g=BOOK_GRAPH, node=node)
        return sorted(((r.child, str(r.label)) for r in rows), key=lambda x: (x[1], str(x[0])))

    def heading_tree(self) -> dict[str, Any]:
        """``{book: {chapter: {section: [passage ids]}}}`` read back from the graph."""
        tree: dict[str, Any] = {}
        for book in sorted(self.book.subjects(RDF.type, DR.Book), key=str):
            chapters = tree.setdefault(str(self.book.value(book, RDFS.label)), {})
            for chapter, chapter_title in self.children(book):
                sections = chapters.setdefault(chapter_title, {})
                for section, section_title in self.children(chapter):
                    sections[section_title] = [title for _, title in self.children(section)]
        return tree

    # -- persistence

    def save(self, path: str | Path) -> Path:
        """Write the dataset as gzipped N-Quads, atomically (a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = gzip.compress(self.dataset.serialize(format="nquads").encode("utf-8"))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path) -> "DiffRAGKnowledge":
        dataset = Dataset()
        dataset.parse(data=gzip.decompress(Path(path).read_bytes()).decode("utf-8"), format="nquads")
        return cls(dataset)

    # -- embeddings of triple texts, computed once per text

    def vectors(self, texts: Sequence[str], embeddings: Any) -> np.ndarray:
        from ...tools.documents import embed_texts

        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            for text, row in zip(missing, embed_texts(embeddings, missing)):
                self._vectors[text] = row
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        return np.stack([self._vectors[t] for t in texts])
