"""The ``DOC_RAG`` LangChain tool over any :class:`~.store.DocumentStore`, built with the shared layer."""

from __future__ import annotations

import threading
from typing import Any, Iterable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..layer import LayeredTool, ToolFailure, ToolOptions, make_tool
from ..tokens import count_tokens, trim_to_tokens
from .embedded import load_packaged_store
from .store import SEARCH_MODES, DocumentStore, SearchHit, SearchMode, StoreError, normalize_ids

__all__ = ["DOC_TOOL_NAME", "DOC_TOOL_DESCRIPTION", "DocSearchArgs", "format_hits", "document_tool", "default_document_tool"]

DOC_TOOL_NAME = "DOC_RAG"
#: Layer options of ``DOC_RAG`` unless the caller passes its own.
DEFAULT_OPTIONS = ToolOptions(timeout_s=30.0, retries=2, cache_size=128)
DOC_TOOL_DESCRIPTION = (
    "Search a document collection (by default 1000 PubMed abstracts) for passages relevant to a "
    "query. Input: the search query as plain text, or JSON "
    '{"query": "...", "k": 3, "mode": "hybrid"} (mode: bm25, dense or hybrid). '
    "Returns ranked passages with their source id, title and section."
)


class DocSearchArgs(BaseModel):
    """Arguments of the ``DOC_RAG`` tool (``k`` and ``mode`` default to the tool's options)."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=2000, description="What to search for.")
    k: Optional[int] = Field(default=None, ge=1, le=20, description="How many passages to return.")
    mode: Optional[Literal["bm25", "dense", "hybrid"]] = Field(default=None, description="Ranking method.")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is blank")
        return value.strip()

    @field_validator("mode", mode="before")
    @classmethod
    def _lower_mode(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


def format_hits(hits: Sequence[SearchHit], *, max_tokens: int = 512, min_tail_tokens: int = 24) -> str:
    """Render ranked passages as an observation of at most ``max_tokens`` tokens.

    Whole passages are kept in rank order; the first one that does not fit is trimmed (if at
    least ``min_tail_tokens`` remain) and the rest are dropped.

    Example:
        >>> from tcrag_langgraph.tools.chunking import Chunk
        >>> hit = SearchHit(Chunk("p1#0", "p1", "Statins lower LDL.", title="Lipids", section="RESULTS"), 1.0, 1)
        >>> print(format_hits([hit]))
        [1] source: p1 | title: Lipids | section: RESULTS
        Statins lower LDL.
    """
    blocks: list[str] = []
    used = 0
    for hit in hits:
        chunk = hit.chunk
        header = f"[{hit.rank}] source: {chunk.source_id}"
        if chunk.title:
            header += f" | title: {chunk.title}"
        if chunk.section:
            header += f" | section: {chunk.section}"
        block = f"{header}\n{chunk.text}"
        cost = count_tokens(block) + (2 if blocks else 0)
        if used + cost <= max_tokens:
            blocks.append(block)
            used += cost
            continue
        room = max_tokens - used - (2 if blocks else 0)
        if room >= min_tail_tokens or not blocks:
            blocks.append(trim_to_tokens(block, max(room - 4, 1)))
        break
    return "\n\n".join(blocks)


def document_tool(
    store: DocumentStore,
    *,
    name: str = DOC_TOOL_NAME,
    description: str = DOC_TOOL_DESCRIPTION,
    k: int = 3,
    mode: SearchMode = "hybrid",
    max_tokens: int = 512,
    exclude_ids: Iterable[Any] | None = None,
    options: Optional[ToolOptions] = None,
    **overrides: Any,
) -> LayeredTool:
    """The ``DOC_RAG`` LangChain tool over any :class:`DocumentStore`, built with the shared layer
    (:func:`~tcrag_langgraph.tools.layer.make_tool`): input repair and validation, time limit,
    retries of transient store failures, token trimming and caching. It never raises: a string
    observation on success, a :class:`~tcrag_langgraph.tools.base.ToolError` on failure.

    ``exclude_ids``: source ids never returned (e.g. the PubMedQA questions being evaluated).
    ``options``: the layer's :class:`~tcrag_langgraph.tools.layer.ToolOptions` (default
    :data:`DEFAULT_OPTIONS`: 30 s, 2 retries, 128 cached results); ``overrides``: single
    ``ToolOptions`` fields replacing those (``retries=0``), as :func:`~.layer.make_tool` takes
    them. ``max_output_tokens`` is ``max_tokens``; the store's credentials join ``secrets``.

    Example:
        >>> from tcrag_langgraph.tools.chunking import Document
        >>> from tcrag_langgraph.tools.documents import EmbeddedStore
        >>> store = EmbeddedStore()
        >>> _ = store.add_documents([Document("d1", text="Loop diuretics treat fluid overload.")])
        >>> tool = document_tool(store, mode="bm25")
        >>> print(tool.invoke("diuretics"))
        [1] source: d1
        Loop diuretics treat fluid overload.
        >>> tool.invoke({"query": ""}).kind
        'bad_input'
    """
    if not isinstance(store, DocumentStore):
        raise TypeError(f"store must be a DocumentStore, got {type(store).__name__}")
    if not isinstance(k, int) or not 1 <= k <= 20:
        raise ValueError("k must be an int between 1 and 20")
    if mode not in SEARCH_MODES:
        raise ValueError(f"mode must be one of {SEARCH_MODES}, got {mode!r}")
    if max_tokens < 32:
        raise ValueError("max_tokens must be at least 32")
    excluded = normalize_ids(exclude_ids)
    options = DEFAULT_OPTIONS if options is None else options
    default_k, default_mode = k, mode

    def search(args: DocSearchArgs) -> str:
        try:
            hits = store.search(args.query, k=args.k or default_k, mode=args.mode or default_mode, exclude_ids=excluded)
        except StoreError as exc:
            raise ToolFailure(exc.kind, str(exc), retryable=exc.retryable) from exc
        if not hits:
            return f"No passages found for: {args.query}"
        return format_hits(hits, max_tokens=max_tokens)

    return make_tool(
        name,
        description,
        search,
        args_schema=DocSearchArgs,
        options=options,
        **{"max_output_tokens": max_tokens, "primary_field": "query", **overrides},
        # a search server (Elasticsearch) receives the query: the tool is outbound (layer.egress)
        sends_off_machine=overrides.get("sends_off_machine", options.sends_off_machine)
        or bool(getattr(store, "sends_off_machine", False)),
        secrets=(*overrides.get("secrets", options.secrets), *getattr(store, "secrets", ())),
    )


def default_document_tool(
    *,
    exclude_ids: Iterable[Any] | None = None,
    embeddings: Any = None,
    preload: bool = False,
    **tool_args: Any,
) -> LayeredTool:
    """``DOC_RAG`` over the packaged PubMedQA-L corpus (an :class:`EmbeddedStore`).

    ``exclude_ids`` removes those PubMed ids from the store itself (use it to evaluate on
    PubMedQA without retrieving the gold abstract); ``preload=True`` loads the embedding model
    and builds the BM25 index in a background thread now (the first hybrid query otherwise pays
    for it: about 5-10 s on 2 CPU cores); other keywords (``k``, ``mode``, ``options``, ...) go to
    :func:`document_tool`.

    Example:
        >>> tool = default_document_tool(exclude_ids=["21645374"], mode="bm25")
        >>> "source: 21645374" in tool.invoke("mitochondria lace plant programmed cell death")
        False
    """
    store = load_packaged_store(exclude_ids=exclude_ids, embeddings=embeddings)
    tool = document_tool(store, **tool_args)
    if preload:
        threading.Thread(target=store.warm_up, name="doc-rag-preload", daemon=True).start()
    return tool
