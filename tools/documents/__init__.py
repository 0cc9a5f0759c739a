"""Document search for TC-RAG: one store interface, two backends, and the ``DOC_RAG`` tool.

* :class:`DocumentStore` — the interface: ``add`` chunks, ``search`` them by ``"bm25"``,
  ``"dense"`` or ``"hybrid"`` (client-side reciprocal rank fusion of the two), ``count``.
* :class:`EmbeddedStore` — in-process default: BM25 with ``bm25s`` over the medical-aware
  terms of :mod:`.text_analysis` plus dense MiniLM vectors, saved to / loaded from a folder.
* :class:`~tcrag_langgraph.tools.elasticsearch_store.ElasticsearchStore` — the same API over
  any Elasticsearch-compatible server (see that module).
* :func:`default_document_tool` / :func:`document_tool` — the LangChain tool the agent calls.

Rooms: :mod:`.store` (interface, hits, errors, fusion), :mod:`.embeddings` (MiniLM),
:mod:`.embedded` (the embedded backend and the packaged corpus), :mod:`.tool` (``DOC_RAG``).

Evaluation without leakage: the packaged corpus holds the 1000 PubMedQA-L abstracts, the same
ones PubMedQA questions are asked about. To evaluate on a question without handing the model its
gold abstract, drop those PubMed ids from the store, e.g.
``default_document_tool(exclude_ids=test_pmids)`` or
``load_packaged_store(exclude_ids=test_pmids)``; per call, ``store.search(q, exclude_ids=...)``
filters ids at query time on both backends.

Example:
    >>> from tcrag_langgraph.tools.documents import EmbeddedStore
    >>> from tcrag_langgraph.tools.chunking import Document
    >>> store = EmbeddedStore()
    >>> store.add_documents([Document("d1", text="Metformin is first-line therapy for type 2 diabetes."),
    ...                      Document("d2", text="Salbutamol relieves acute asthma attacks.")])
    2
    >>> [h.chunk.source_id for h in store.search("asthma inhaler", k=1, mode="bm25")]
    ['d2']
"""

from __future__ import annotations

from .embedded import PACKAGED_CORPUS, STORE_FORMAT, EmbeddedStore, load_packaged_store, packaged_data_dir
from .embeddings import MiniLMEmbeddings, default_embeddings, embed_texts, embedding_model_name
from .store import (
    MAX_K,
    SEARCH_MODES,
    DocumentStore,
    SearchHit,
    SearchMode,
    StoreError,
    normalize_ids,
    reciprocal_rank_fusion,
)
from .tool import DOC_TOOL_DESCRIPTION, DOC_TOOL_NAME, DocSearchArgs, default_document_tool, document_tool, format_hits

__all__ = [
    "SearchMode",
    "SEARCH_MODES",
    "SearchHit",
    "StoreError",
    "DocumentStore",
    "EmbeddedStore",
    "MiniLMEmbeddings",
    "default_embeddings",
    "embed_texts",
    "embedding_model_name",
    "reciprocal_rank_fusion",
    "normalize_ids",
    "PACKAGED_CORPUS",
    "packaged_data_dir",
    "load_packaged_store",
    "DOC_TOOL_NAME",
    "DocSearchArgs",
    "format_hits",
    "document_tool",
    "default_document_tool",
]
