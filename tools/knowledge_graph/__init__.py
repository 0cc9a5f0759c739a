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

Rooms: :mod:`.vocabulary` (namespaces, SPARQL templates), :mod:`.backends` (rdflib / remote
SPARQL, term serialisation), :mod:`.loading` (RDF files, the packaged graph), :mod:`.linking`,
:mod:`.graph` (:class:`KnowledgeGraph`), :mod:`.formatting` (evidence text), :mod:`.tool`.

Example:
    >>> kg = KnowledgeGraph.packaged()                       # doctest: +SKIP
    >>> [e.label for e in kg.link("marfans syndrome and arachnodactyly")]  # doctest: +SKIP
    ['Marfan syndrome', 'Arachnodactyly']
    >>> tool = default_knowledge_graph_tool()                # doctest: +SKIP
    >>> print(tool.invoke("Does Marfan syndrome cause arachnodactyly?"))  # doctest: +SKIP
"""

from __future__ import annotations

from .backends import KGQueryError, _RemoteBackend, sparql_term
from .evidence import EntityDescription, KGEvidence, KGTriple, LinkedEntity
from .graph import KnowledgeGraph
from .loading import load_packaged_graph
from .tool import TOOL_NAME, KGQuery, default_knowledge_graph_tool, knowledge_graph_tool
from .vocabulary import (
    DECIPHER_BASE,
    DEFAULT_PREFIXES,
    HPO_BASE,
    ICD10CM_BASE,
    KG,
    OMIM_BASE,
    ORPHA_BASE,
    PACKAGED_GRAPH,
)

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
