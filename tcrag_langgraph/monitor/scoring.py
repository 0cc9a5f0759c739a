"""State monitor: the scorer protocol and a local Hugging Face causal-LM scorer (cppl, uct).

Both metrics come from one teacher-forced forward pass over raw logits (never from the
temperature/top-p processed scores that ``generate`` reports).

* ``cppl`` (paper eq. 2): ``exp(-(1/N) * sum_i log P(w_i | w_<i, User_Query))`` over the N tokens of
  the top text, the User_Query as context.
* ``uct`` (paper eq. 3): ``-sum_i P(w_i | w_<i) * log P(w_i | w_<i)`` over the tokens of the top
  text, each term the entropy contribution of the token actually written. As in the paper the
  context is the top text alone; ``uct_given_query=True`` conditions on the User_Query too.

Scoring the top frame reuses the key/value states of the User_Query prefix (``prefix_cache``):
one call costs a forward pass over the frame's tokens, not over query + frame.

Logits the generator computed while writing the frame are *not* reused: they are conditioned on
the whole prompt (system prompt, demonstrations, stack), whereas eq. 2 conditions on the
User_Query alone, so they are a different quantity.

Which scorer for which generator: :func:`~tcrag_langgraph.monitor.own_model.scorer_for_model` (the
generator's own weights, or a :class:`MonitorUnavailableError` naming the options; never a different
model silently). A served
model is scored only when asked for explicitly, with
:class:`~tcrag_langgraph.monitor.served.CompletionsLogprobScorer` (also importable from here).

Lower is more confident. Example:
    >>> scorer = LocalLMScorer()  # doctest: +SKIP
    >>> scorer.score("What treats type 2 diabetes?", "Metformin.", metric="cppl")  # doctest: +SKIP
    23.1
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Literal, NamedTuple, Optional, Protocol, runtime_checkable

from ..models.kv_cache import PrefixStateCache, cache_keyword, crop_cache
from ..models.weights import LocalModel, load_local_model
from .state_values import LogprobScorer, token_logprobs_to_metric

__all__ = [
    "StateScorer",
    "TokenStat",
    "LocalLMScorer",
    "Metric",
    "token_logprobs_to_metric",
    "scored_sequence",
    "MonitorUnavailableError",
]

Metric = Literal["cppl", "uct"]


def scored_sequence(start_ids: list[int], ctx_ids: list[int], text_ids: list[int],
                    max_tokens: int) -> tuple[list[int], int]:
    """The token sequence every local scorer passes through its model, and the index of its first
    scored token: the start token(s), the context (tokenized with a trailing newline so the text
    starts a fresh line, as in the rendered stack) and the text. Over ``max_tokens`` the text keeps
    its beginning and the context its end (the part next to the text).

    >>> scored_sequence([0], [5, 6, 7], [8, 9], max_tokens=5)
    ([0, 6, 7, 8, 9], 3)
    """
    if not text_ids:
        raise ValueError("nothing to score: the text has no tokens")
    budget = max_tokens - len(start_ids)
    text_ids = text_ids[: max(1, budget - 1)]
    ctx_room = budget - len(text_ids)
    ctx_ids = ctx_ids[-ctx_room:] if ctx_room > 0 else []
    ids = start_ids + ctx_ids + text_ids
    first = max(1, len(start_ids) + len(ctx_ids))
    if first >= len(ids):
        raise ValueError("nothing to score: the text is a single token with no context")
    return ids, first


class TokenStat(NamedTuple):
    """One scored token: its text, its log-probability, and the entropy (nats) of the next-token
    distribution at its position (what DRAGIN's real-time information need reads)."""

    piece: str
    logprob: float
    entropy: float


@runtime_checkable
class StateScorer(Protocol):
    """Anything that maps (User_Query, top text) to a state value; lower = more confident."""

    def score(self, query: str, text: str, *, metric: Metric) -> float: ...


class LocalLMScorer(LogprobScorer):
    """cppl / uct from a local transformers causal LM (default: the packaged SmolLM2).

    Args:
        local_model: an already loaded :class:`~tcrag_langgraph.models.local.LocalModel` (shared with the
            generator to save memory); ``None`` loads the default lazily on first use.
        model_path: a transformers model folder or ``.gguf`` file instead of the packaged model.
        device, dtype: how to load ``model_path`` / the default (see ``load_local_model``).
        model_loader: called once, on first use, to get the model (how :func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`
            shares a chat model's weights without loading them at graph build time).
        uct_given_query: condition uct on the User_Query (the paper does not).
        max_tokens: context cap; longer inputs keep the end of the query and the start of the text.
        prefix_cache: how many context prefixes (exact token ids: start token + User_Query) to keep
            the key/value states of, least recently used dropped first; ``0`` recomputes every
            time. With a cached prefix a call costs one forward pass over the text's tokens only.
    """

    def __init__(
        self,
        local_model: Optional[LocalModel] = None,
        *,
        model_path: Optional[str] = None,
        device: str = "cpu",
        dtype: str = "float32",
        model_loader: Optional[Callable[[], LocalModel]] = None,
        uct_given_query: bool = False,
        max_tokens: int = 4096,
        prefix_cache: int = 8,
    ) -> None:
        from ..models.weights import validate_dtype

        if max_tokens < 8:
            raise ValueError("max_tokens must be at least 8")
        if sum(x is not None for x in (local_model, model_path, model_loader)) > 1:
            raise ValueError("give at most one of local_model, model_path and model_loader")
        validate_dtype(dtype)
        self._lm = local_model
        self._model_path = model_path
        self._device = device
        self._dtype = dtype
        self._loader = model_loader
        self._load_lock = threading.Lock()
        self.uct_given_query = uct_given_query
        self.max_tokens = max_tokens
        self.prefix_cache = PrefixStateCache(prefix_cache)

    @property
    def local_model(self) -> LocalModel:
        """The scoring model (loaded on first use)."""
        if self._lm is None:
            with self._load_lock:
                if self._lm is None:
                    if self._loader is not None:
                        self._lm = self._loader()
                    else:
                        self._lm = load_local_model(self._model_path, device=self._device, dtype=self._dtype)
        return self._lm

    def token_logprobs(self, context: str, text: str) -> list[float]:
        """log P of each token of ``text`` given ``context`` and the text before it (one pass)."""
        import torch

        logits, target, _ = self._scored_logits(context, text)
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(1, target[:, None])[:, 0].tolist()

    def token_stats(self, context: str, text: str) -> list[TokenStat]:
        """Per token of ``text``: its text, its log P (as :meth:`token_logprobs`) and the entropy (nats) of
        the whole next-token distribution it was drawn from, from the same teacher-forced pass."""
        import torch

        logits, target, scored_ids = self._scored_logits(context, text)
        chosen = torch.log_softmax(logits, dim=-1).gather(1, target[:, None])[:, 0].tolist()  # = token_logprobs
        # the entropy in float64 over the whole vocabulary: -sum p log p, with 0 log 0 = 0
        wide = torch.log_softmax(logits.double(), dim=-1)
        entropy = (-(wide.exp() * torch.nan_to_num(wide, neginf=0.0)).sum(-1)).tolist()
        tok = self.local_model.tokenizer
        return [TokenStat(tok.decode([i]), lp, h) for i, lp, h in zip(scored_ids, chosen, entropy)]

    def _scored_logits(self, context: str, text: str):
        """The logits predicting each scored token of ``text`` (one teacher-forced pass), the target ids
        as a tensor, and as a list."""
        import torch

        lm = self.local_model
        tok = lm.tokenizer
        text_ids = tok(text, add_special_tokens=False)["input_ids"]
        ctx_ids = tok(context + "\n", add_special_tokens=False)["input_ids"] if context else []
        ids, first = scored_sequence(self._start_ids(), ctx_ids, text_ids, self.max_tokens)
        with lm.lock, torch.no_grad():
            if self.prefix_cache.max_entries > 0:
                logits = self._logits_with_prefix_cache(ids, first)
            else:
                # Only the positions that predict scored tokens go through the LM head (49k vocab).
                keep = len(ids) - first + 1
                out = lm.model(torch.tensor([ids], device=lm.device), logits_to_keep=keep)
                logits = out.logits[0, :-1].float()
        return logits, torch.tensor(ids[first:], device=logits.device), ids[first:]

    def _logits_with_prefix_cache(self, ids: list[int], first: int):
        """Logits at positions ``first-1 .. len(ids)-2`` (those predicting the scored tokens), the
        prefix ``ids[:first]`` served from the LRU. Call with the model lock held."""
        import torch
        from transformers import DynamicCache

        model = self.local_model.model
        device = self.local_model.device
        key = tuple(ids[:first])
        entry = self.prefix_cache.take(key)
        if entry is None:
            cache = DynamicCache(config=model.config)
            out = model(torch.tensor([ids[:first]], device=device), **{cache_keyword(model): cache}, use_cache=True,
                        logits_to_keep=1)  # only the last position predicts a scored token
            entry = (cache, out.logits[0, -1:].float())
        cache, last = entry
        rest = ids[first: len(ids) - 1]  # the final token predicts nothing we score: skip it
        if rest:
            out = model(torch.tensor([rest], device=device), **{cache_keyword(model): cache}, use_cache=True)
            logits = torch.cat([last, out.logits[0].float()])
        else:
            logits = last
        # Only put back a cache we know the content of (an exception above drops it).
        crop_cache(cache, first)
        self.prefix_cache.put(key, entry)
        return logits

    def _start_ids(self) -> list[int]:
        # The first scored token needs something to be predicted from.
        tok = self.local_model.tokenizer
        for token_id in (tok.bos_token_id, tok.eos_token_id):
            if token_id is not None:
                return [int(token_id)]
        return []


class MonitorUnavailableError(ValueError):
    """No log-prob source for the generator's own model, and no scorer was given."""

