"""The state monitor over llama.cpp: :class:`LlamaCppScorer`, cppl (eq. 2) and uct (eq. 3) from a
teacher-forced pass over llama.cpp's own logits of the generator's GGUF (see
:mod:`tcrag_langgraph.models.llama_cpp` for the chat model and the loading)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..models.gguf_files import f16_copy
from ..models.llama_cpp import LlamaCppChatModel
from ..models.llama_cpp_model import LlamaCppModel, load_llama_model
from ..models.llama_cpp_native import decode_at, import_llama_cpp, log_softmax_at, logits_row, quiet_native
from .scoring import LocalLMScorer, TokenStat, scored_sequence
from .state_values import LogprobScorer

__all__ = ["LlamaCppScorer", "PRECISIONS"]

#: Scoring precisions of :class:`LlamaCppScorer`.
PRECISIONS = ("f16", "native")


@dataclass
class _ScoreState:
    weights: Any  # llama_cpp._internals.LlamaModel
    ctx: Any = None
    batch: Any = None
    n_ctx: int = 0
    tokens: list[int] = field(default_factory=list)
    source: str = ""


class LlamaCppScorer(LogprobScorer):
    """cppl / uct from llama.cpp's own logits over a GGUF: the scorer interface of
    :class:`~tcrag_langgraph.monitor.scoring.LocalLMScorer` (``score``, ``token_logprobs``, ``token_stats``).

    The token sequence is that of ``LocalLMScorer``: a start token (the GGUF's BOS, else its EOS),
    ``context + "\\n"`` and ``text``, each tokenized on its own; one teacher-forced pass with logits
    for exactly the positions that predict the text's tokens, log-softmax in float64; a float32 KV
    cache and no flash attention (both change values measurably). The scoring context keeps the last
    sequence: the next score with the same User_Query evaluates only the new text.

    ``precision``:

    * ``"f16"`` (default, exact): the pass runs over a float16 re-encoding of the same GGUF
      (:func:`f16_copy`, written once): the same weight values, activations in float16/float32.
      Agrees with the transformers float32 reference within 0.6 % (cppl) / 0.4 % (uct) on 50 pairs
      (Qwen2.5-Coder-0.5B; tests/test_llama_cpp.py checks the packaged SmolLM2). Costs the F16
      file's memory while scoring (0.27 GB for 135M, 1.3 GB for 0.5B, ~3.1 GB for 1.5B).
    * ``"native"``: the pass runs over the generator's quantized weights (no extra memory). llama.cpp
      then quantizes activations to 8 bits inside every matmul, and tokens with very large
      activations (Qwen's ``<|endoftext|>`` start token, an attention sink) come out wrong: cppl off
      by up to 100 % against the reference (docs/models.md). Not for a calibrated sigma.

    Args:
        model_loader: called once, on first use, for the :class:`LlamaCppModel` (tokenizer, and the
            weights in ``"native"`` precision).
        model_path: a GGUF file instead (``None`` and no loader: the packaged SmolLM2).
        chat_model: a :class:`LlamaCppChatModel` whose model to use (and whose transformers fallback).
        uct_given_query, max_tokens: as ``LocalLMScorer``; ``prefix_cache=0`` evaluates every time.
    """

    def __init__(self, model_loader: Optional[Callable[[], LlamaCppModel]] = None, *, model_path: Optional[str] = None,
                 chat_model: Optional["LlamaCppChatModel"] = None, n_threads: Optional[int] = None,
                 precision: str = "f16", uct_given_query: bool = False, max_tokens: int = 4096,
                 prefix_cache: int = 1) -> None:
        if max_tokens < 8:
            raise ValueError("max_tokens must be at least 8")
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
        if sum(x is not None for x in (model_loader, model_path, chat_model)) > 1:
            raise ValueError("give at most one of model_loader, model_path and chat_model")
        if chat_model is not None:
            model_loader = lambda: chat_model.llama_model  # noqa: E731
        self._chat_model = chat_model
        self._delegate: Any = None
        self._loader = model_loader
        self._model_path = model_path
        self._n_threads = n_threads
        self._lm: Optional[LlamaCppModel] = None
        self._load_lock = threading.Lock()
        self.precision = precision
        self.uct_given_query = uct_given_query
        self.max_tokens = max_tokens
        self.reuse_prefix = prefix_cache > 0
        self.evaluated_tokens = 0

    @property
    def local_model(self) -> LlamaCppModel:
        if self._lm is None:
            with self._load_lock:
                if self._lm is None:
                    self._lm = self._loader() if self._loader is not None else load_llama_model(
                        self._model_path, n_threads=self._n_threads)
        return self._lm

    def _transformers_delegate(self) -> Any:
        """After the chat model fell back to transformers: a LocalLMScorer over ITS weights (else None)."""
        chat = self._chat_model
        if chat is None or self._delegate is not None or chat.backend != "transformers":
            return self._delegate
        self._delegate = LocalLMScorer(model_loader=lambda: chat.fallback.local_model,
                                       uct_given_query=self.uct_given_query, max_tokens=self.max_tokens)
        return self._delegate

    def _start_ids(self) -> list[int]:
        lm = self.local_model
        for token_id in (lm.bos_id, lm.eos_id):
            if token_id is not None:
                return [token_id]
        return []

    def token_logprobs(self, context: str, text: str) -> list[float]:
        """log P of each token of ``text`` given ``context`` and the text before it (one pass)."""
        delegate = self._transformers_delegate()
        if delegate is not None:
            return delegate.token_logprobs(context, text)
        rows, targets = self._scored_rows(context, text)
        return [log_softmax_at(row, target) for row, target in zip(rows, targets)]

    def token_stats(self, context: str, text: str) -> list[TokenStat]:
        """Per token of ``text``: its text, its log P (as :meth:`token_logprobs`) and the entropy (nats) of
        the whole next-token distribution at its position, from the same teacher-forced pass (float64)."""
        delegate = self._transformers_delegate()
        if delegate is not None:
            return delegate.token_stats(context, text)
        rows, targets = self._scored_rows(context, text)
        lm = self.local_model
        return [TokenStat(lm.detokenize([target]), log_softmax_at(row, target), _entropy(row))
                for row, target in zip(rows, targets)]

    def _scored_rows(self, context: str, text: str) -> tuple[list[Any], list[int]]:
        """The logit rows predicting each token of ``text`` given ``context`` (one pass), and those tokens."""
        lm = self.local_model
        text_ids = lm.tokenize(text, special=True)
        ctx_ids = lm.tokenize(context + "\n", special=True) if context else []
        ids, first = scored_sequence(self._start_ids(), ctx_ids, text_ids, self.max_tokens)
        with lm.lock:
            rows = self._logits(lm, ids, first)
        return rows, ids[first:]

    def _state(self, lm: LlamaCppModel, need: int) -> _ScoreState:
        """The scoring weights and a context of at least ``need`` tokens (created on first use)."""
        llama_cpp = import_llama_cpp()
        import llama_cpp._internals as internals

        state = lm.scoring.get(self.precision)
        if state is None:
            if self.precision == "native":
                state = _ScoreState(weights=lm.llm._model, source=lm.path)
            else:
                ftype = lm.llm.metadata.get("general.file_type")
                copy = f16_copy(lm.path, int(ftype) if ftype and ftype.isdigit() else None)
                if copy == Path(lm.path).resolve():  # the generator already runs these weights: share them
                    weights = lm.llm._model
                else:
                    params = llama_cpp.llama_model_default_params()
                    params.n_gpu_layers = lm.llm.model_params.n_gpu_layers
                    with quiet_native():
                        weights = internals.LlamaModel(path_model=str(copy), params=params, verbose=False)
                state = _ScoreState(weights=weights, source=str(copy))
            lm.scoring[self.precision] = state
        if state.ctx is None or state.n_ctx < need:
            # Sized to the need, doubling from 1,024 tokens: the float32 KV cache is allocated whole
            # (46 KB a token for SmolLM2-135M: 189 MB at 4,096), and most scores (a User_Query and a
            # Conclusion) need a few hundred tokens. A bigger need re-creates the context once.
            n_ctx = 1024
            while n_ctx < need:
                n_ctx *= 2
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = n_ctx
            params.n_batch = min(512, n_ctx)
            params.n_ubatch = params.n_batch
            params.n_threads = lm.n_threads
            params.n_threads_batch = lm.n_threads
            params.type_k = llama_cpp.GGML_TYPE_F32
            params.type_v = llama_cpp.GGML_TYPE_F32
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            with quiet_native():
                state.ctx = internals.LlamaContext(model=state.weights, params=params, verbose=False)
            state.batch = internals.LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=1, verbose=False)
            state.tokens = []
            state.n_ctx = n_ctx
        return state

    def _logits(self, lm: LlamaCppModel, ids: list[int], first: int):
        """Logits at positions ``first-1 .. len(ids)-2`` from the scoring context. Call with the lock held."""
        need = len(ids) - 1  # the last token predicts nothing scored: it is never evaluated
        state = self._state(lm, need)
        # Reuse the cached prefix, but evaluate position first-1 again: its logits are needed.
        keep = 0
        if self.reuse_prefix:
            for a, b in zip(state.tokens, ids[:first - 1]):
                if a != b:
                    break
                keep += 1
        state.ctx.kv_cache_seq_rm(-1, keep, -1)
        state.tokens = state.tokens[:keep]
        todo = ids[keep:need]
        n_vocab = lm.n_vocab
        rows = []
        step = state.batch._n_tokens
        for i in range(0, len(todo), step):
            part = todo[i:i + step]
            got = decode_at(state.ctx, state.batch, part, keep + i, lambda p: p >= first - 1)
            rows.extend(logits_row(state.ctx, r, n_vocab) for r in got)
            state.tokens.extend(part)
        self.evaluated_tokens += len(todo)
        return rows


def _entropy(row) -> float:
    """The entropy (nats) of the softmax of one logit row, in float64 (0 log 0 = 0)."""
    import numpy as np

    x = row.astype(np.float64)
    logp = x - x.max()
    logp -= math.log(np.exp(logp).sum())
    p = np.exp(logp)
    return float(-(p * np.where(p > 0, logp, 0.0)).sum())
