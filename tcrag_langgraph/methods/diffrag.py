"""TCM-DiffRAG (Li et al., section 2), the parts that carry over to any medical corpus.

* **Macro-micro graph** (section 2.2.1): the heading tree of the user's documents (book > chapter >
  section > passage, every title a node) plus entity-relation triples the model extracts from each
  passage, every triple linked to the passage it came from (the paper's mapping M1).
* **Case overlay** (section 2.2.2.5): triples extracted from solved cases (question, reasoning,
  answer) go into a personal named graph, every triple linked to its cases (M2). The overlay is
  layered over the general graph and never modifies it: a personal triple with the same fact as a
  general one shadows it (its cases come first, the passages stay), new ones extend it.
* **Retrieval by reasoning paths** (section 2.2.3.2-3): the model writes the question as a chain of
  triples; each is matched by MiniLM cosine similarity to the triples of the graph (and, when on,
  to the packaged HPO/Orphanet/ICD-10-CM graph around the entities it names); the recalled triples
  come back with their source passages and cases, and the model answers from that evidence.

Storage: one rdflib :class:`~rdflib.Dataset` with two named graphs (:data:`BOOK_GRAPH`,
:data:`CASE_GRAPH`), kept apart from the packaged graph. Every query is a constant of
:data:`SPARQL_QUERIES` whose values are bound with ``initBindings``.

No TCM data is available offline: the default knowledge is built from the first packaged
PubMedQA-L abstracts (read through :func:`tcrag_langgraph.tools.indexing.read_documents`), lazily
on the first run, bounded by :attr:`DiffRAGOptions.max_passages` and cached on disk under
:func:`tcrag_langgraph.models.cache_dir`.

Example:
    >>> from tcrag_langgraph.methods.diffrag import parse_triples
    >>> parse_triples("1. aspirin | reduces | stroke risk\\nnoise", max_triples=4).triples
    (Triple(subject='aspirin', relation='reduces', object='stroke risk'),)
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Mapping, Optional, Sequence

import numpy as np
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from pydantic import BaseModel, ConfigDict, Field, field_validator
from rdflib import RDF, RDFS, Dataset, Literal as RDFLiteral, Namespace, URIRef
from typing_extensions import TypedDict

from .. import answer_format
from ..config import TCRAGConfig, resolve_config
from ..events import emit
from ..prompting import message_text
from ..run_input import child_config, extract_question, last_human_is
from ..state import TraceEvent
from ..tools.chunking import Document, Section, chunk_document
from ..tools.tokens import count_tokens, trim_to_tokens

__all__ = [
    "HALT_REASONS",
    "BOOK_GRAPH",
    "CASE_GRAPH",
    "DR",
    "SPARQL_QUERIES",
    "DiffRAGOptions",
    "Triple",
    "TripleParse",
    "SolvedCase",
    "RecalledTriple",
    "DiffRAGKnowledge",
    "parse_triples",
    "extract_triples",
    "packaged_documents",
    "build_macro_micro_graph",
    "add_cases",
    "default_knowledge",
    "knowledge_cache_dir",
    "build_diffrag_graph",
]

#: Vocabulary of the macro-micro graph and the overlay.
DR = Namespace("urn:tcrag:diffrag:")
#: Named graph of the heading tree, the passages and their triples (the paper's G_book).
BOOK_GRAPH = URIRef("urn:tcrag:diffrag:graph:book")
#: Named graph of the solved cases and their triples (the paper's G_personal).
CASE_GRAPH = URIRef("urn:tcrag:diffrag:graph:cases")
#: Why a run ended: an answer from the evidence, bad input, the chat model raised (or wrote
#: nothing), the answer did not fit ``TCRAGConfig.answer_format`` after the re-prompts, or the
#: graph / embedder / packaged graph could not be read.
HALT_REASONS = ("answered", "invalid_input", "model_error", "format_error", "retrieval_error")
#: Bumped when a prompt or the stored layout changes, so cached graphs are rebuilt.
FORMAT_VERSION = 1

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


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


class DiffRAGOptions(BaseModel):
    """Bounds and switches of TCM-DiffRAG (keyword-only; per-run override through ``context=``).

    Example:
        >>> DiffRAGOptions(top_k=2).max_passages
        8
        >>> DiffRAGOptions(top_k=0)
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for DiffRAGOptions
        ...
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_passages: int = Field(default=8, ge=1, le=5000, description="Passages read into the macro-micro graph.")
    chunk_tokens: int = Field(default=128, ge=16, le=2048, description="Passage size in tokens.")
    chunk_overlap: int = Field(default=32, ge=0, le=1024, description="Tokens shared by consecutive passages.")
    max_triples_per_passage: int = Field(default=8, ge=1, le=50, description="Triples kept per passage or case.")
    max_path_triples: int = Field(default=5, ge=1, le=20, description="Triples in the question's reasoning path.")
    max_format_retries: int = Field(default=1, ge=0, le=5, description="Re-prompts after output with no triple.")
    top_k: int = Field(default=3, ge=1, le=20, description="Graph triples recalled per reasoning-path triple.")
    min_similarity: float = Field(default=0.35, ge=-1.0, le=1.0, description="Cosine similarity a recall needs.")
    max_evidence: int = Field(default=8, ge=1, le=50, description="Recalled triples shown to the answering model.")
    max_evidence_tokens: int = Field(default=1200, ge=64, le=16000, description="Token budget of the evidence text.")
    use_general_kg: bool = Field(default=True, description="Also match triples of the packaged HPO graph around linked entities.")
    kg_entities_per_triple: int = Field(default=2, ge=0, le=10, description="Packaged-graph entities linked per path triple.")
    kg_triples_per_relation: int = Field(default=5, ge=1, le=50, description="Packaged-graph neighbours per relation.")
    max_new_tokens: Optional[int] = Field(default=None, ge=1, le=8192, description="None: the TCRAGConfig value.")

    def merged(self, overrides: "DiffRAGOptions | Mapping[str, Any] | None") -> "DiffRAGOptions":
        """A copy with the explicitly set fields of ``overrides`` applied (validated)."""
        if overrides is None:
            return self
        if isinstance(overrides, DiffRAGOptions):
            values = {k: getattr(overrides, k) for k in overrides.model_fields_set}
        elif isinstance(overrides, Mapping):
            values = {k: v for k, v in overrides.items() if k in DiffRAGOptions.model_fields}
        else:
            raise ValueError(f"options overrides must be DiffRAGOptions or a mapping, not {type(overrides).__name__}")
        return self if not values else DiffRAGOptions.model_validate({**self.model_dump(), **values})


# --------------------------------------------------------------------------------------------
# Triples: typed, strictly parsed, repaired
# --------------------------------------------------------------------------------------------

_MAX_PART_CHARS = 200
_SPACE = re.compile(r"\s+")
_LIST_MARK = re.compile(r"^\s*(?:[-*\u2022]+|\d{1,3}[.)]|triple\s*\d*\s*[:.)])\s*", re.IGNORECASE)
_UNKNOWN = "?"


class Triple(BaseModel):
    """One (subject, relation, object) fact; parts are single-line text, ``?`` marks an unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: str = Field(min_length=1, max_length=_MAX_PART_CHARS)
    relation: str = Field(min_length=1, max_length=_MAX_PART_CHARS)
    object: str = Field(min_length=1, max_length=_MAX_PART_CHARS)

    @field_validator("subject", "relation", "object", mode="before")
    @classmethod
    def _clean(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"a triple part must be text, not {type(value).__name__}")
        text = _SPACE.sub(" ", value).strip().strip("\"'`*").strip()
        if text != _UNKNOWN and not any(ch.isalnum() for ch in text):
            raise ValueError(f"a triple part needs readable text, got {value!r}")
        return text

    @property
    def key(self) -> str:
        """Case-insensitive identity of the fact (the overlay shadows general triples by it)."""
        return "|".join(p.casefold() for p in (self.subject, self.relation, self.object))

    @property
    def text(self) -> str:
        """What is embedded for semantic matching (unknown parts left out)."""
        return " ".join(p for p in (self.subject, self.relation, self.object) if p != _UNKNOWN)

    def as_list(self) -> list[str]:
        return [self.subject, self.relation, self.object]


@dataclass(frozen=True)
class TripleParse:
    """What :func:`parse_triples` found: the triples and, per rejected line, why."""

    triples: tuple[Triple, ...]
    problems: tuple[str, ...] = ()


def _parts_of(line: str) -> Optional[list[str]]:
    """The three parts of one line in the ``s | r | o`` form, or a repaired ``(s, r, o)`` form."""
    if "|" in line:
        return [p for p in line.strip().strip("|").split("|")]
    inner = line.strip().rstrip(".;")
    if inner[:1] in "([" and inner[-1:] in ")]":
        pieces = inner[1:-1].split(",")
        return pieces if len(pieces) == 3 else None
    return None


def _from_json(text: str) -> Optional[list[Any]]:
    stripped = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    if not stripped.startswith("["):
        return None
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, list) else None


def parse_triples(text: str, *, max_triples: int, allow_unknown: bool = False) -> TripleParse:
    """Triples written one per line as ``subject | relation | object``.

    Repairs: list markers (``1.``, ``-``) are dropped, a ``(s, r, o)`` line with exactly two commas
    and a JSON list of ``[s, r, o]`` / ``{"subject", "relation", "object"}`` items are read too.
    Anything else is rejected with a reason (never evaluated). Duplicates (case-insensitive) are
    kept once; at most ``max_triples`` are returned. ``?`` is an allowed part only with
    ``allow_unknown`` (a reasoning path's unknown).

    Example:
        >>> p = parse_triples("- a | b | c\\n(x, y, z)\\nbad line\\nA | B | C", max_triples=5)
        >>> [t.as_list() for t in p.triples], p.problems
        ([['a', 'b', 'c'], ['x', 'y', 'z']], ("line 3 'bad line': not 'subject | relation | object'",))
    """
    if not isinstance(text, str):
        raise ValueError(f"model output must be text, not {type(text).__name__}")
    if not isinstance(max_triples, int) or max_triples < 1:
        raise ValueError(f"max_triples must be a positive int, got {max_triples!r}")
    candidates: list[tuple[str, Any]] = []
    items = _from_json(text)
    if items is not None:
        for i, item in enumerate(items, start=1):
            if isinstance(item, Mapping):
                item = [item.get("subject"), item.get("relation"), item.get("object")]
            candidates.append((f"item {i}", item))
    else:
        for n, raw in enumerate(text.splitlines(), start=1):
            line = _LIST_MARK.sub("", raw, count=1).strip()
            if not line or line.rstrip(":").casefold() in {"triples", "reasoning path", "answer"}:
                continue
            # the line's start goes into the problem so the re-prompt and the trace show what was wrong
            candidates.append((f"line {n} {line[:40]!r}", _parts_of(line)))
    triples: list[Triple] = []
    problems: list[str] = []
    seen: set[str] = set()
    for where, parts in candidates:
        if not isinstance(parts, list) or len(parts) != 3:
            problems.append(f"{where}: not 'subject | relation | object'")
            continue
        try:
            triple = Triple(subject=parts[0], relation=parts[1], object=parts[2])
        except ValueError as exc:
            problems.append(f"{where}: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}")
            continue
        if _UNKNOWN in (triple.subject, triple.object) and not allow_unknown or triple.relation == _UNKNOWN:
            problems.append(f"{where}: '?' is not a fact")
            continue
        if triple.key in seen:
            continue
        if len(triples) == max_triples:
            problems.append(f"{where}: more than {max_triples} triples, the rest were dropped")
            break
        seen.add(triple.key)
        triples.append(triple)
    return TripleParse(tuple(triples), tuple(problems))


_EXTRACT_SYSTEM = (
    "You extract medical facts as triples. Write one triple per line in the form\n"
    "subject | relation | object\n"
    "using short phrases taken from the text. Write at most {n} lines and nothing else.\n"
    "Example for the text 'Aspirin lowers the risk of stroke in adults.':\n"
    "aspirin | lowers risk of | stroke"
)
_PATH_SYSTEM = (
    "You plan how to answer a medical question. Write the reasoning needed as a chain of triples, one "
    "per line in the form\nsubject | relation | object\nwith ? for what is unknown. Write at most {n} "
    "lines and nothing else.\n"
    "Example for 'Does smoking raise the risk of lung cancer?':\n"
    "smoking | raises risk of | lung cancer\n"
    "lung cancer | has risk factor | ?"
)
_ANSWER_SYSTEM = (
    "You are a medical expert. Answer the question using the evidence below: triples recalled from "
    "a knowledge graph along the question's reasoning path, with the passages and solved cases they "
    "came from. If the evidence does not settle it, say so and answer from what you know. End with "
    "one line starting with 'Answer:'."
)
_REPROMPT = (
    "Your reply had no usable triple ({problems}). Write only lines of the form "
    "subject | relation | object."
)


def _generation_kwargs(model: BaseChatModel, max_new_tokens: int, temperature: float) -> dict[str, Any]:
    from ..models import LocalChatModel

    if isinstance(model, LocalChatModel):  # the packaged model takes per-call settings
        return {"max_new_tokens": max_new_tokens, "temperature": temperature}
    return {}


@dataclass
class _Calls:
    """LLM calls and tokens of one extraction (added to a run's counters)."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    problems: list[str] = field(default_factory=list)


def extract_triples(
    model: BaseChatModel,
    system: str,
    text: str,
    *,
    max_triples: int,
    max_retries: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    allow_unknown: bool = False,
    config: Optional[RunnableConfig] = None,
    calls: Optional[_Calls] = None,
) -> tuple[Triple, ...]:
    """Ask ``model`` for triples about ``text``; re-prompt up to ``max_retries`` times while none parse.

    Returns the triples (possibly none: the caller decides what an empty result means). Model
    exceptions propagate.
    """
    calls = calls if calls is not None else _Calls()
    messages: list[BaseMessage] = [
        SystemMessage(content=system.format(n=max_triples)),
        HumanMessage(content=text),
    ]
    kwargs = _generation_kwargs(model, max_new_tokens, temperature)
    for attempt in range(max_retries + 1):
        reply = model.invoke(messages, config=child_config(config) if config is not None else None, **kwargs)
        out = message_text(reply.content)
        calls.llm_calls += 1
        calls.prompt_tokens += sum(count_tokens(message_text(m.content)) for m in messages)
        calls.completion_tokens += count_tokens(out)
        parsed = parse_triples(out, max_triples=max_triples, allow_unknown=allow_unknown)
        calls.problems.extend(f"attempt {attempt + 1}: {p}" for p in parsed.problems)
        if parsed.triples:
            return parsed.triples
        why = "; ".join(parsed.problems[:3]) or "empty reply"
        messages = [*messages, AIMessage(content=out), HumanMessage(content=_REPROMPT.format(problems=why))]
    return ()


# --------------------------------------------------------------------------------------------
# The knowledge: heading tree + triples (book graph) and the case overlay, in one rdflib Dataset
# --------------------------------------------------------------------------------------------


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


class RecalledTriple(BaseModel):
    """A graph triple recalled for one reasoning-path triple, with its evidence."""

    model_config = ConfigDict(extra="forbid")

    triple: list[str]
    layer: Literal["personal", "general", "kg"]
    similarity: float
    path_index: int
    passages: list[dict[str, str]] = Field(default_factory=list)
    cases: list[dict[str, str]] = Field(default_factory=list)
    kg: Optional[dict[str, str]] = None


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
        from ..tools.documents import embed_texts

        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            for text, row in zip(missing, embed_texts(embeddings, missing)):
                self._vectors[text] = row
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        return np.stack([self._vectors[t] for t in texts])


# --------------------------------------------------------------------------------------------
# Building the macro-micro graph and the overlay
# --------------------------------------------------------------------------------------------


def packaged_documents(*, max_passages: int, ids: Optional[Iterable[str]] = None,
                       exclude_ids: Iterable[str] = ()) -> list[Document]:
    """The first packaged PubMedQA-L abstracts, read with the project's loader, holding at least
    ``max_passages`` sections (each stored record is one section of an abstract).

    ``ids`` keeps only those abstracts (PubMed ids, in file order); ``exclude_ids`` drops those (the
    evaluated questions' own abstracts in a ``--exclude-eval-docs`` run).
    """
    from ..tools.documents import PACKAGED_CORPUS, packaged_data_dir
    from ..tools.indexing import read_documents

    if not isinstance(max_passages, int) or max_passages < 1:
        raise ValueError(f"max_passages must be a positive int, got {max_passages!r}")
    wanted = None if ids is None else {str(i) for i in ids}
    dropped = {str(i) for i in exclude_ids}
    path = packaged_data_dir() / f"{PACKAGED_CORPUS}.jsonl.gz"
    grouped: dict[str, tuple[str, list[Section]]] = {}
    records = 0
    for record in read_documents([path], on_error="stop"):
        if record.source_id in dropped or (wanted is not None and record.source_id not in wanted):
            continue
        if record.source_id not in grouped:
            if records >= max_passages:
                break
            grouped[record.source_id] = (record.title, [])
        grouped[record.source_id][1].append(Section(str(record.metadata.get("section") or ""), record.text))
        records += 1
    return [Document(sid, title=title, sections=tuple(sections), metadata={"dataset": "PubMedQA-L"})
            for sid, (title, sections) in grouped.items()]


def _max_new_tokens(options: DiffRAGOptions, config: TCRAGConfig) -> int:
    return options.max_new_tokens or config.max_new_tokens


def build_macro_micro_graph(
    documents: Iterable[Document],
    *,
    model: BaseChatModel,
    book: str = "documents",
    options: Optional[DiffRAGOptions] = None,
    config: Optional[TCRAGConfig] = None,
    knowledge: Optional[DiffRAGKnowledge] = None,
    on_passage: Any = None,
) -> DiffRAGKnowledge:
    """Heading tree plus per-passage triples of ``documents`` (at most ``options.max_passages``).

    Each document is a chapter, each of its sections a section, each chunk a passage; the model
    extracts up to ``max_triples_per_passage`` triples per passage, each linked to its passage.
    ``on_passage(chunk_id, triples, calls)`` is called after each passage (progress / events).
    """
    options = options or DiffRAGOptions()
    config = config or TCRAGConfig()
    if not isinstance(model, BaseChatModel):
        raise ValueError(f"model must be a LangChain chat model, not {type(model).__name__}")
    if options.chunk_overlap >= options.chunk_tokens:
        raise ValueError("chunk_overlap must be smaller than chunk_tokens")
    knowledge = knowledge if knowledge is not None else DiffRAGKnowledge()
    done = 0
    for document in documents:
        if not isinstance(document, Document):
            raise ValueError(f"documents must be tools.chunking.Document objects, not {type(document).__name__}")
        for chunk in chunk_document(document, chunk_tokens=options.chunk_tokens, overlap=options.chunk_overlap):
            if done >= options.max_passages:
                return knowledge
            passage = knowledge.add_passage(book=book, chapter=document.title or document.source_id,
                                            section=chunk.section, chunk_id=chunk.chunk_id, text=chunk.text)
            calls = _Calls()
            triples = extract_triples(
                model, _EXTRACT_SYSTEM, f"Text:\n{chunk.search_text}\n\nTriples:",
                max_triples=options.max_triples_per_passage, max_retries=options.max_format_retries,
                max_new_tokens=_max_new_tokens(options, config), calls=calls,
            )
            for triple in triples:
                knowledge.add_triple(triple, passage=passage)
            done += 1
            if on_passage is not None:
                on_passage(chunk.chunk_id, triples, calls)
    return knowledge


def add_cases(
    knowledge: DiffRAGKnowledge,
    cases: Iterable[SolvedCase | Mapping[str, Any]],
    *,
    model: BaseChatModel,
    options: Optional[DiffRAGOptions] = None,
    config: Optional[TCRAGConfig] = None,
) -> dict[str, list[Triple]]:
    """Extract triples from solved cases into the overlay, each linked to its case; ``{case_id: triples}``."""
    options = options or DiffRAGOptions()
    config = config or TCRAGConfig()
    if not isinstance(knowledge, DiffRAGKnowledge):
        raise ValueError("knowledge must be a DiffRAGKnowledge")
    parsed = [c if isinstance(c, SolvedCase) else SolvedCase.model_validate(c) for c in cases]
    found: dict[str, list[Triple]] = {}
    for case in parsed:
        node = knowledge.add_case(case)
        text = f"Question: {case.question}\nReasoning: {case.reasoning}\nAnswer: {case.answer}\n\nTriples:"
        triples = extract_triples(
            model, _EXTRACT_SYSTEM, text, max_triples=options.max_triples_per_passage,
            max_retries=options.max_format_retries, max_new_tokens=_max_new_tokens(options, config),
        )
        for triple in triples:
            knowledge.add_triple(triple, case=node)
        found[case.case_id] = list(triples)
    return found


def knowledge_cache_dir() -> Path:
    """Where built graphs are cached: ``<tcrag_langgraph.models.cache_dir()>/diffrag``."""
    from ..models import cache_dir

    return cache_dir() / "diffrag"


_DEFAULT_LOCK = threading.Lock()
_DEFAULT_MEMO: dict[str, DiffRAGKnowledge] = {}


def _content_key(model_id: str, documents: Sequence[Document], cases: Sequence[SolvedCase],
                 options: DiffRAGOptions, max_new_tokens: int) -> str:
    digest = hashlib.sha256()
    build = {k: getattr(options, k) for k in ("max_passages", "chunk_tokens", "chunk_overlap",
                                              "max_triples_per_passage", "max_format_retries")}
    digest.update(json.dumps({"v": FORMAT_VERSION, "model": model_id, "options": build,
                              "max_new_tokens": max_new_tokens, "prompt": _EXTRACT_SYSTEM}, sort_keys=True).encode())
    for d in documents:
        digest.update(json.dumps([d.source_id, d.title, d.text, [(s.name, s.text) for s in d.sections]]).encode())
    for c in cases:
        digest.update(c.model_dump_json().encode())
    return digest.hexdigest()[:32]


def default_knowledge(
    *,
    model: BaseChatModel,
    documents: Optional[Sequence[Document]] = None,
    cases: Sequence[SolvedCase] = (),
    book: Optional[str] = None,
    options: Optional[DiffRAGOptions] = None,
    config: Optional[TCRAGConfig] = None,
    model_id: Optional[str] = None,
    on_passage: Any = None,
) -> tuple[DiffRAGKnowledge, Optional[Path], bool]:
    """The knowledge for ``documents`` (default: the first packaged PubMedQA abstracts) and ``cases``,
    built once per content and model and cached at ``cache_dir()/diffrag/<key>.nq.gz``.

    ``model_id`` names the extracting model in the cache key (default:
    :func:`tcrag_langgraph.models.chat_model_id`); a model that cannot be named gets its graph built
    for this process only (path ``None``): triples of one model are never served for another.
    Returns ``(knowledge, cache path or None, built_now)``.
    """
    from ..models import chat_model_id

    options = options or DiffRAGOptions()
    config = config or TCRAGConfig()
    docs = list(documents) if documents is not None else packaged_documents(max_passages=options.max_passages)
    book = book or ("PubMedQA-L abstracts" if documents is None else "documents")
    if model_id is None:
        try:
            model_id = chat_model_id(model)
        except ValueError:
            model_id = None
    key = _content_key(model_id or f"unnamed:{id(model)}", docs, list(cases), options,
                       _max_new_tokens(options, config))
    path = knowledge_cache_dir() / f"{key}.nq.gz" if model_id else None
    with _DEFAULT_LOCK:
        if key in _DEFAULT_MEMO:
            return _DEFAULT_MEMO[key], path, False
        if path is not None and path.exists():
            knowledge = DiffRAGKnowledge.load(path)
            built = False
        else:
            knowledge = build_macro_micro_graph(docs, model=model, book=book, options=options, config=config,
                                                on_passage=on_passage)
            if cases:
                add_cases(knowledge, cases, model=model, options=options, config=config)
            if path is not None:
                knowledge.save(path)
            built = True
        _DEFAULT_MEMO[key] = knowledge
        return knowledge, path, built


# --------------------------------------------------------------------------------------------
# Recall along a reasoning path
# --------------------------------------------------------------------------------------------


@dataclass
class _Candidate:
    triple: Triple
    layer: str
    general_nodes: list[URIRef] = field(default_factory=list)
    case_nodes: list[URIRef] = field(default_factory=list)
    kg: Optional[dict[str, str]] = None


def _candidates(knowledge: DiffRAGKnowledge, path: Sequence[Triple], general_kg: Any,
                options: DiffRAGOptions) -> list[_Candidate]:
    """General and personal triples merged by fact (personal shadows general), plus packaged-graph
    neighbours of the entities the path names."""
    by_key: dict[str, _Candidate] = {}
    for triple, node in knowledge.triples("general"):
        by_key.setdefault(triple.key, _Candidate(triple, "general")).general_nodes.append(node)
    for triple, node in knowledge.triples("personal"):
        found = by_key.get(triple.key)
        if found is None:
            found = by_key[triple.key] = _Candidate(triple, "personal")
        found.layer = "personal"  # the overlay shadows the general fact; its passages stay as evidence
        found.case_nodes.append(node)
    if general_kg is not None and options.use_general_kg and options.kg_entities_per_triple:
        names = list(dict.fromkeys(p for t in path for p in (t.subject, t.object) if p != _UNKNOWN))
        for name in names:
            for entity in general_kg.link(name, limit=options.kg_entities_per_triple):
                for _direction, _p, shown, _total in general_kg.neighbours(entity.iri, per_relation=options.kg_triples_per_relation):
                    for kt in shown:
                        try:
                            triple = Triple(subject=kt.s_label or general_kg.display(kt.s),
                                            relation=kt.p_label or general_kg.relation_name(kt.p),
                                            object=kt.o_label or general_kg.display(kt.o))
                        except ValueError:
                            continue
                        if triple.key not in by_key:
                            by_key[triple.key] = _Candidate(triple, "kg", kg={"s": kt.s, "p": kt.p, "o": kt.o})
    return [by_key[k] for k in sorted(by_key)]


def recall(
    knowledge: DiffRAGKnowledge,
    path: Sequence[Triple],
    *,
    embeddings: Any,
    options: DiffRAGOptions,
    general_kg: Any = None,
) -> list[RecalledTriple]:
    """Top-k graph triples per path triple by cosine similarity of MiniLM embeddings (ties by fact),
    at most ``max_evidence`` distinct facts overall, each with its passages and cases."""
    candidates = _candidates(knowledge, path, general_kg, options)
    if not path or not candidates:
        return []
    matrix = knowledge.vectors([c.triple.text for c in candidates], embeddings)
    queries = knowledge.vectors([t.text for t in path], embeddings)
    sims = queries @ matrix.T
    chosen: dict[str, RecalledTriple] = {}
    rounds = [
        sorted(((float(sims[i, j]), c.triple.key, j) for j, c in enumerate(candidates)), key=lambda x: (-x[0], x[1]))
        for i in range(len(path))
    ]
    for rank in range(options.top_k):  # round-robin over path triples so every hop gets evidence
        for i, ranked in enumerate(rounds):
            if rank >= len(ranked) or len(chosen) >= options.max_evidence:
                continue
            sim, key, j = ranked[rank]
            if sim < options.min_similarity or key in chosen:
                continue
            c = candidates[j]
            chosen[key] = RecalledTriple(
                triple=c.triple.as_list(), layer=c.layer, similarity=round(sim, 4), path_index=i,
                passages=[p for n in c.general_nodes for p in knowledge.passages_of(n)],
                cases=[x for n in c.case_nodes for x in knowledge.cases_of(n)],
                kg=c.kg,
            )
    return list(chosen.values())


def evidence_text(recalled: Sequence[RecalledTriple], *, max_tokens: int) -> str:
    """The evidence the answering model reads: each triple, then its cases and passages."""
    blocks = []
    for n, r in enumerate(recalled, start=1):
        lines = [f"[{n}] {' | '.join(r.triple)}  ({r.layer}, similarity {r.similarity:.2f})"]
        for c in r.cases:
            lines.append(f"  case {c['id']}: Q: {c['question']} Reasoning: {c['reasoning']} A: {c['answer']}")
        for p in r.passages:
            lines.append(f"  passage {p['id']} ({p['chapter']} > {p['section']}): {p['text']}")
        if r.kg:
            lines.append(f"  packaged graph: <{r.kg['s']}> <{r.kg['p']}> <{r.kg['o']}>")
        blocks.append("\n".join(lines))
    return trim_to_tokens("\n".join(blocks), max_tokens) if blocks else "(nothing was recalled)"


# --------------------------------------------------------------------------------------------
# The LangGraph graph
# --------------------------------------------------------------------------------------------


class DiffRAGState(TypedDict, total=False):
    question: str
    messages: Annotated[list[AnyMessage], add_messages]
    reasoning_path: list[list[str]]
    path_source: str  # "model" or "question" (fallback when no triple could be parsed)
    evidence: list[dict[str, Any]]
    answer: Optional[str]
    structured_answer: Any
    raw_output: str
    answer_validated: bool
    halt_reason: Optional[str]
    error: Optional[str]
    llm_calls: int
    tool_calls: int
    retrievals: int
    steps: int
    trace: list[TraceEvent]
    token_usage: dict[str, int]
    state_value: Optional[float]


_ANSWER_LINE = re.compile(r"(?:^|\n)\s*(?:\*\*)?(?:final\s+answer|answer)(?:\*\*)?\s*[:：]\s*", re.IGNORECASE)


def _final_answer(text: str) -> str:
    matches = list(_ANSWER_LINE.finditer(text))
    tail = text[matches[-1].end():].strip() if matches else ""
    return tail or text.strip()


def _usage(state: Mapping[str, Any], prompt: int, completion: int) -> dict[str, int]:
    old = state.get("token_usage") or {}
    return {"prompt": old.get("prompt", 0) + prompt, "completion": old.get("completion", 0) + completion}


def build_diffrag_graph(
    *,
    model: Any = None,
    tools: Sequence[BaseTool] = (),
    scorer: Any = None,
    config: Optional[TCRAGConfig] = None,
    options: Optional[DiffRAGOptions | Mapping[str, Any]] = None,
    knowledge: Optional[DiffRAGKnowledge] = None,
    documents: Optional[Sequence[Document]] = None,
    cases: Sequence[SolvedCase | Mapping[str, Any]] = (),
    general_kg: Any = "packaged",
    embeddings: Any = None,
    model_id: Optional[str] = None,
    checkpointer: Any = None,
    name: str = "diffrag",
):
    """Compile the TCM-DiffRAG graph: Start -> Reasoning_Path -> Recall -> Answer.

    Args:
        model: chat model (object, path, ``.gguf`` or ``"provider:model"``; None: packaged SmolLM2).
        tools: accepted for parity with the other methods; TCM-DiffRAG retrieves from its own graph
            and calls no tool.
        scorer: unused (the method has no state monitor); accepted for the eval harness.
        config: generation settings (``max_new_tokens``, ``max_question_chars``).
        options: :class:`DiffRAGOptions` (or a mapping of its fields).
        knowledge: a prebuilt :class:`DiffRAGKnowledge`; None builds one lazily on the first run from
            ``documents`` (default: the first packaged PubMedQA abstracts) and ``cases``, cached on disk.
        general_kg: the packaged HPO graph (``"packaged"``, loaded on first use), a
            :class:`~tcrag_langgraph.tools.knowledge_graph.KnowledgeGraph`, or None (off).
        embeddings: the embedder for triple matching (default: packaged MiniLM).
        model_id: the model's name in the on-disk cache key (default: ``chat_model_id(model)``; a model
            without a name is not cached on disk).
        checkpointer: any LangGraph checkpointer.
    """
    from ..models import resolve_chat_model

    base_options = options if isinstance(options, DiffRAGOptions) else DiffRAGOptions().merged(options)
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    chat = resolve_chat_model(model)
    if not isinstance(chat, BaseChatModel):
        raise ValueError(f"model must be a LangChain chat model, not {type(chat).__name__}")
    tools = list(tools or ())
    if any(not isinstance(t, BaseTool) for t in tools):
        raise ValueError("tools must be LangChain BaseTool objects")
    if knowledge is not None and not isinstance(knowledge, DiffRAGKnowledge):
        raise ValueError(f"knowledge must be a DiffRAGKnowledge, not {type(knowledge).__name__}")
    if documents is not None and any(not isinstance(d, Document) for d in documents):
        raise ValueError("documents must be tools.chunking.Document objects")
    case_list = [c if isinstance(c, SolvedCase) else SolvedCase.model_validate(c) for c in cases]
    if knowledge is not None and (documents is not None or case_list):
        raise ValueError("give a prebuilt knowledge= or documents=/cases= to build one, not both")
    if not (general_kg is None or general_kg == "packaged" or hasattr(general_kg, "link")):
        raise ValueError("general_kg must be 'packaged', a KnowledgeGraph or None")
    holder: dict[str, Any] = {"knowledge": knowledge}
    lock = threading.Lock()

    def run_settings(config: RunnableConfig, runtime: Runtime) -> tuple[DiffRAGOptions, TCRAGConfig]:
        """This run's options: ``context=`` may be DiffRAGOptions, TCRAGConfig or a mapping of either's fields."""
        context = getattr(runtime, "context", None)
        if context is not None and not isinstance(context, (DiffRAGOptions, TCRAGConfig, Mapping)):
            raise ValueError(f"context must be DiffRAGOptions, TCRAGConfig or a mapping, not {type(context).__name__}")
        opts = base_options.merged(None if isinstance(context, TCRAGConfig) else context)
        run_cfg = resolve_config(cfg, configurable=(config or {}).get("configurable"),
                                 context=None if isinstance(context, DiffRAGOptions) else context)
        return opts, run_cfg

    def get_embeddings() -> Any:
        if embeddings is not None:
            return embeddings
        from ..tools.documents import default_embeddings

        return default_embeddings()

    def get_general_kg(opts: DiffRAGOptions) -> Any:
        if not opts.use_general_kg or general_kg is None:
            return None
        if general_kg == "packaged":
            from ..tools.knowledge_graph import KnowledgeGraph

            return KnowledgeGraph.packaged()
        return general_kg

    def get_knowledge(config: RunnableConfig, step: int) -> DiffRAGKnowledge:
        with lock:
            if holder["knowledge"] is None:
                def progress(chunk_id: str, triples: Sequence[Triple], calls: _Calls) -> None:
                    emit(TraceEvent(step=step, action="Extract_Triples", op="noop", content=chunk_id,
                                    detail=json.dumps({"triples": [t.as_list() for t in triples],
                                                       "llm_calls": calls.llm_calls})), config)

                found, path, built = default_knowledge(model=chat, documents=documents, cases=case_list,
                                                       options=base_options, config=cfg, model_id=model_id,
                                                       on_passage=progress)
                emit(TraceEvent(step=step, action="Knowledge_Graph", op="noop", content=str(path or "(not cached)"),
                                detail=json.dumps({"built_now": built})), config)
                holder["knowledge"] = found
            return holder["knowledge"]

    def halt(state: DiffRAGState, step: int, reason: str, *, answer: Optional[str], error: Optional[str],
             config: RunnableConfig) -> dict[str, Any]:
        event = TraceEvent(step=step, action="Halt", op="halt", content=answer or error or "",
                           detail=json.dumps({"halt_reason": reason}))
        emit(event, config)
        return {"answer": answer, "halt_reason": reason, "error": error, "answer_validated": False,
                "trace": [*state.get("trace", []), event],
                "messages": [AIMessage(content=answer if answer else f"No answer: {error or reason}")]}

    def start(state: DiffRAGState, config: RunnableConfig) -> dict[str, Any]:
        question, problem = extract_question(state, cfg)
        base = {"llm_calls": 0, "tool_calls": 0, "retrievals": 0, "steps": 0, "state_value": None,
                "token_usage": {"prompt": 0, "completion": 0}, "evidence": [], "reasoning_path": [],
                "structured_answer": None}
        if problem:
            raw = state.get("question")
            out = halt({}, 0, "invalid_input", answer=None, error=problem, config=config)
            return {**base, "question": raw if isinstance(raw, str) else "", **out}
        event = TraceEvent(step=0, action="User_Query", op="push", content=question, stack_depth=1)
        emit(event, config)
        update = {**base, "question": question, "halt_reason": None, "error": None, "answer": None,
                  "answer_validated": False, "path_source": "", "trace": [event]}
        if not last_human_is(state, question):  # the conversation shows what was asked
            update["messages"] = [HumanMessage(content=question)]
        return update

    def reasoning_path(state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        opts, run_cfg = run_settings(config, runtime)
        calls = _Calls()
        try:
            path = extract_triples(
                chat, _PATH_SYSTEM, f"Question: {state['question']}\n\nReasoning path:",
                max_triples=opts.max_path_triples, max_retries=opts.max_format_retries,
                max_new_tokens=_max_new_tokens(opts, run_cfg), temperature=run_cfg.temperature,
                allow_unknown=True, config=config, calls=calls,
            )
        except Exception as exc:
            out = halt(state, 1, "model_error", answer=None, error=f"{type(exc).__name__}: {exc}", config=config)
            return {**out, "llm_calls": state.get("llm_calls", 0) + calls.llm_calls + 1, "steps": 1}
        counters = {"llm_calls": state.get("llm_calls", 0) + calls.llm_calls, "steps": 1,
                    "token_usage": _usage(state, calls.prompt_tokens, calls.completion_tokens)}
        events = []
        if not path:  # the model wrote no triple: match the question itself (recorded, not hidden)
            events.append(TraceEvent(step=1, action="Reasoning_Path", op="format_error", content=state["question"],
                                     detail=json.dumps({"problems": calls.problems[:10], "fallback": "question"})))
            rows, source = [], "question"
        else:
            rows, source = [t.as_list() for t in path], "model"
        events.append(TraceEvent(step=1, action="Reasoning_Path", op="push",
                                 content="\n".join(" | ".join(r) for r in rows) or state["question"], stack_depth=2,
                                 detail=json.dumps({"triples": rows, "source": source,
                                                    "problems": calls.problems[:10]})))
        for e in events:
            emit(e, config)
        return {**counters, "reasoning_path": rows, "path_source": source, "trace": [*state.get("trace", []), *events]}

    def recall_node(state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        opts, _ = run_settings(config, runtime)
        step = state.get("steps", 0) + 1
        try:
            knowledge_now = get_knowledge(config, step)
            if state.get("path_source") == "question":
                path = [Triple(subject=state["question"][:_MAX_PART_CHARS], relation=_UNKNOWN, object=_UNKNOWN)]
            else:
                path = [Triple(subject=s, relation=r, object=o) for s, r, o in state.get("reasoning_path", [])]
            found = recall(knowledge_now, path, embeddings=get_embeddings(), options=opts,
                           general_kg=get_general_kg(opts))
        except Exception as exc:
            out = halt(state, step, "retrieval_error", answer=None, error=f"{type(exc).__name__}: {exc}", config=config)
            return {**out, "steps": step}
        evidence = [r.model_dump() for r in found]
        event = TraceEvent(step=step, action="Recall", op="push", stack_depth=3,
                           content="\n".join(" | ".join(r.triple) for r in found),
                           detail=json.dumps({"recalled": [{"triple": r.triple, "layer": r.layer,
                                                            "similarity": r.similarity,
                                                            "passages": [p["id"] for p in r.passages],
                                                            "cases": [c["id"] for c in r.cases]} for r in found]}))
        emit(event, config)
        return {"evidence": evidence, "retrievals": state.get("retrievals", 0) + len(state.get("reasoning_path") or [1]),
                "steps": step, "trace": [*state.get("trace", []), event]}

    def answer_node(state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        opts, run_cfg = run_settings(config, runtime)
        step = state.get("steps", 0) + 1
        recalled = [RecalledTriple.model_validate(e) for e in state.get("evidence", [])]
        path = "\n".join(" | ".join(r) for r in state.get("reasoning_path", [])) or "(none)"
        prompt = (f"Reasoning path:\n{path}\n\nEvidence:\n{evidence_text(recalled, max_tokens=opts.max_evidence_tokens)}"
                  f"\n\nQuestion:\n{state['question']}")
        fmt = run_cfg.answer_format
        rule = answer_format.instructions(fmt)
        system = _ANSWER_SYSTEM + (f" The line after 'Answer:' is your Conclusion. {rule}" if rule else "")
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        kwargs = _generation_kwargs(chat, _max_new_tokens(opts, run_cfg), run_cfg.temperature)
        calls, retries, prompt_tokens, completion_tokens = 0, 0, 0, 0
        while True:  # bounded: at most max_format_retries re-prompts when the answer does not fit the format
            calls += 1
            prompt_tokens += sum(count_tokens(message_text(m.content)) for m in messages)
            try:
                text = message_text(chat.invoke(messages, config=child_config(config), **kwargs).content)
            except Exception as exc:
                out = halt(state, step, "model_error", answer=None, error=f"{type(exc).__name__}: {exc}", config=config)
                return {**out, "steps": step, "llm_calls": state.get("llm_calls", 0) + calls,
                        "token_usage": _usage(state, prompt_tokens, completion_tokens)}
            completion_tokens += count_tokens(text)
            final = _final_answer(text)
            structured, problem = answer_format.check(fmt, final)
            if fmt is None or problem is None or retries >= run_cfg.max_format_retries:
                break
            retries += 1
            messages = [*messages, AIMessage(content=text or "(empty)"),
                        HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
        event = TraceEvent(step=step, action="Answer", op="push", content=final, stack_depth=4,
                           detail=json.dumps({"evidence": len(recalled), "format_retries": retries}))
        emit(event, config)
        if not final:
            reason, error = "model_error", "the model wrote no answer"
        elif problem is not None:
            reason, error = "format_error", f"no answer in the asked format after {retries} re-prompts: {problem}"
        else:
            reason, error = "answered", None
        out = halt({**state, "trace": [*state.get("trace", []), event]}, step, reason, answer=final or None,
                   error=error, config=config)
        return {**out, "raw_output": text, "steps": step, "llm_calls": state.get("llm_calls", 0) + calls,
                "structured_answer": structured if fmt is not None and problem is None else None,
                "token_usage": _usage(state, prompt_tokens, completion_tokens)}

    def after(state: DiffRAGState) -> str:
        return "end" if state.get("halt_reason") else "next"

    builder = StateGraph(DiffRAGState)  # context: DiffRAGOptions, TCRAGConfig or a mapping (run_settings)
    builder.add_node("Start", start)
    builder.add_node("Reasoning_Path", reasoning_path)
    builder.add_node("Recall", recall_node)
    builder.add_node("Answer", answer_node)
    builder.add_edge(START, "Start")
    builder.add_conditional_edges("Start", after, {"next": "Reasoning_Path", "end": END})
    builder.add_conditional_edges("Reasoning_Path", after, {"next": "Recall", "end": END})
    builder.add_conditional_edges("Recall", after, {"next": "Answer", "end": END})
    builder.add_edge("Answer", END)
    return builder.compile(checkpointer=checkpointer, name=name)
