"""The in-process default backend (:class:`EmbeddedStore`: bm25s + a numpy matrix) and the packaged corpus."""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np

from ..chunking import Chunk
from ..text_analysis import analyze, top_k
from .embeddings import default_embeddings, embed_texts, embedding_model_name
from .store import DocumentStore, SearchHit, StoreError, normalize_ids

__all__ = ["EmbeddedStore", "STORE_FORMAT", "PACKAGED_CORPUS", "packaged_data_dir", "load_packaged_store"]

#: File-name prefix of the packaged PubMedQA-L corpus in ``tools/data/``.
PACKAGED_CORPUS = "docs_pubmedqa"
STORE_FORMAT = 1


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
    def _add(self, chunks: list[Chunk], vectors: np.ndarray | None, progress: Callable[[int], None] | None) -> int:
        if vectors is None:
            parts = []
            for start in range(0, len(chunks), self._batch_size):
                batch = chunks[start : start + self._batch_size]
                parts.append(embed_texts(self.embeddings, [c.search_text for c in batch]))
                if progress:
                    progress(len(batch))
            vectors = np.vstack(parts)
        elif progress:
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
