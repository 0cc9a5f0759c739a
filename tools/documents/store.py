"""The document-store interface: :class:`DocumentStore`, its hits, errors and the rank fusion.

Backends (:mod:`.embedded`, :mod:`tcrag_langgraph.tools.elasticsearch_store`) implement ``add``,
``count`` and the two rankers; :meth:`DocumentStore.search` validates input, applies
``exclude_ids`` and fuses the rankers for ``mode="hybrid"``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np

from ..chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunk, Document, chunk_documents
from .embeddings import embed_texts
from .errors import StoreError

__all__ = ["SearchMode", "SEARCH_MODES", "MAX_K", "StoreError", "SearchHit", "normalize_ids", "reciprocal_rank_fusion", "DocumentStore"]

SearchMode = Literal["bm25", "dense", "hybrid"]
SEARCH_MODES: tuple[str, ...] = ("bm25", "dense", "hybrid")
MAX_K = 100


@dataclass(frozen=True)
class SearchHit:
    """One ranked result. ``score`` is backend-specific (BM25, cosine, or RRF); ``rank`` starts at 1."""

    chunk: Chunk
    score: float
    rank: int


def normalize_ids(ids: Iterable[Any] | None) -> frozenset[str]:
    """Source ids as a set of strings (PubMed ids may come as ints).

    Example:
        >>> sorted(normalize_ids([21645374, "123"]))
        ['123', '21645374']
    """
    if ids is None:
        return frozenset()
    if isinstance(ids, (str, int)):
        ids = [ids]
    return frozenset(str(i).strip() for i in ids if str(i).strip())


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[str]], *, k: int = 60, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Fuse ranked id lists: ``score(d) = sum_i w_i / (k + rank_i(d))`` (Cormack et al., 2009).

    Ties keep the order in which ids were first seen (earlier lists first).

    Example:
        >>> reciprocal_rank_fusion([["a", "b", "c"], ["b", "c"]], k=60)[0][0]
        'b'
    """
    if k <= 0:
        raise ValueError(f"RRF k must be positive, got {k}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError("weights must have one entry per ranking")
    scores: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights):
        seen: set[str] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    order = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


def _check_query(query: str, k: int, mode: str) -> str:
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be an int between 1 and {MAX_K}, got {k!r}")
    if mode not in SEARCH_MODES:
        raise ValueError(f"mode must be one of {SEARCH_MODES}, got {mode!r}")
    return query.strip()


class DocumentStore(ABC):
    """A searchable collection of :class:`Chunk` objects.

    Backends implement :meth:`_add`, :meth:`count` and the two rankers :meth:`_bm25` and
    :meth:`_dense`; :meth:`search` validates input, applies ``exclude_ids`` and fuses the
    rankers with :func:`reciprocal_rank_fusion` for ``mode="hybrid"``.
    """

    #: RRF constant and how many candidates each ranker contributes per requested hit.
    rrf_k: int = 60
    hybrid_candidates: int = 5

    def add(
        self,
        chunks: Iterable[Chunk],
        *,
        vectors: np.ndarray | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Index chunks (a chunk with an existing ``chunk_id`` replaces it); returns how many.

        ``vectors`` (one row per chunk) skips embedding; ``progress`` is called with each batch's size.
        The input is checked here, once for every backend; the backend's :meth:`_add` indexes it."""
        chunks = list(chunks)
        for chunk in chunks:
            if not isinstance(chunk, Chunk):
                raise TypeError(f"{type(self).__name__}.add expects Chunk objects, got {type(chunk).__name__}")
        if not chunks:
            return 0
        if vectors is not None:
            vectors = np.asarray(vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(chunks):
                raise ValueError(f"vectors must have shape ({len(chunks)}, dim), got {vectors.shape}")
        return self._add(chunks, vectors, progress)

    @abstractmethod
    def _add(self, chunks: list[Chunk], vectors: np.ndarray | None, progress: Callable[[int], None] | None) -> int:
        """Index checked, non-empty ``chunks`` (``vectors``: float32, one row each, or None: embed them)."""

    @abstractmethod
    def count(self) -> int:
        """Number of chunks in the store."""

    @abstractmethod
    def _bm25(self, query: str, k: int, exclude: frozenset[str]) -> list[SearchHit]: ...

    @abstractmethod
    def _dense(self, query: str, k: int, exclude: frozenset[str]) -> list[SearchHit]: ...

    def __len__(self) -> int:
        return self.count()

    def close(self) -> None:
        """Release resources (connections); the embedded store holds none."""

    def warm_up(self) -> None:
        """Load what the first search would load (embedding model, lexical index) now."""
        embeddings = getattr(self, "embeddings", None)
        if embeddings is not None:
            embed_texts(embeddings, ["warm up"])

    def add_documents(
        self,
        documents: Iterable[Document],
        *,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        overlap: int = DEFAULT_OVERLAP,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Chunk documents (see :mod:`.chunking`) and add the chunks."""
        return self.add(chunk_documents(documents, chunk_tokens=chunk_tokens, overlap=overlap), progress=progress)

    def search(
        self,
        query: str,
        *,
        k: int = 5,
        mode: SearchMode = "hybrid",
        exclude_ids: Iterable[Any] | None = None,
    ) -> list[SearchHit]:
        """The ``k`` best chunks for ``query``; chunks whose ``source_id`` is in ``exclude_ids`` never appear."""
        query = _check_query(query, k, mode)
        exclude = normalize_ids(exclude_ids)
        if mode == "bm25":
            return self._bm25(query, k, exclude)
        if mode == "dense":
            return self._dense(query, k, exclude)
        depth = min(MAX_K, max(k * self.hybrid_candidates, 20))
        lexical = self._bm25(query, depth, exclude)
        semantic = self._dense(query, depth, exclude)
        by_id = {h.chunk.chunk_id: h.chunk for h in (*lexical, *semantic)}
        fused = reciprocal_rank_fusion(
            [[h.chunk.chunk_id for h in lexical], [h.chunk.chunk_id for h in semantic]], k=self.rrf_k
        )
        return [SearchHit(by_id[cid], score, rank) for rank, (cid, score) in enumerate(fused[:k], start=1)]
