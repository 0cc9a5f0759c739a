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
:func:`tcrag_langgraph.models.weights.cache_dir`.

Layout (one concern per module): :mod:`.options` (:class:`DiffRAGOptions`), :mod:`.parsing` (triples
and the answer line read from model output), :mod:`.prompts`, :mod:`.extraction` (asking the model
for triples), :mod:`.knowledge` (the rdflib dataset, its vocabulary and queries), :mod:`.building`
(macro-micro graph, case overlay, cached default knowledge), :mod:`.retrieval` (recall along a
reasoning path), :mod:`.state` (graph state, halt reasons) and :mod:`.graph` (:class:`DiffRAG`, its node holder).

Example:
    >>> from tcrag_langgraph.methods.diffrag import parse_triples
    >>> parse_triples("1. aspirin | reduces | stroke risk\\nnoise", max_triples=4).triples
    (Triple(subject='aspirin', relation='reduces', object='stroke risk'),)
"""

from __future__ import annotations

from .building import (
    FORMAT_VERSION,
    add_cases,
    build_macro_micro_graph,
    default_knowledge,
    knowledge_cache_dir,
    packaged_documents,
)
from .extraction import extract_triples
from .graph import DiffRAG
from .knowledge import BOOK_GRAPH, CASE_GRAPH, DR, SPARQL_QUERIES, DiffRAGKnowledge, SolvedCase
from .options import DiffRAGOptions
from .parsing import Triple, TripleParse, parse_triples
from .retrieval import RecalledTriple, evidence_text, recall
from .state import HALT_REASONS, DiffRAGState

# recall, evidence_text, DiffRAGState and FORMAT_VERSION stay importable from here, as they were
# from the single module (outside __all__, as before).
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
    "DiffRAG",
]
