"""Key/value caches that follow the memory stack, for the local causal LM.

The generator's prompt is ``system prompt + demonstrations + "Begin!" + frames (bottom first) +
"Write your next action." + assistant header``. Every step changes only the end of that text: a
push appends a frame before the fixed suffix, a pop (Backtrack) or a pop+push (Summary) removes the
top frame. So the key/value states of the longest common *token* prefix between the previous prompt
and the new one are still exact, and only the rest needs a forward pass.

:class:`PromptKVPool` keeps a few ``DynamicCache`` objects ("slots"), each with the token ids it
holds. :meth:`PromptKVPool.acquire` finds the slot sharing the longest token prefix with a new
prompt, crops it to that prefix (or forks a copy, so another conversation's cache survives) and
hands it to the caller, who prefills only the remainder; :meth:`PromptKVPool.release` puts it back
with the ids it now holds. Reuse is keyed on exact token ids, never on text or on a conversation
id: two prompts share cache entries only for an identical token prefix, whose keys and values are
the same whoever computed them (causal attention), so concurrent runs can never read each other's
*content*.

:class:`PrefixStateCache` is the scorer's bounded LRU of ``(prefix ids) -> (cache, last logits)``:
cppl/uct of a new frame then cost one forward pass over the frame's tokens only.

Note: in transformers 5.x ``DynamicCache.crop`` takes a *negative* count of tokens to remove;
:func:`crop_cache` takes the length to keep. A cache is passed by the keyword
:func:`cache_keyword` names (newer 5.x releases renamed ``past_key_values`` to ``cache``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence

from cachetools import LRUCache

__all__ = [
    "CacheStats",
    "CacheLease",
    "PromptKVPool",
    "PrefixStateCache",
    "cache_keyword",
    "common_prefix_len",
    "crop_cache",
]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    import torch

    ta = torch.as_tensor(a[:n])
    tb = torch.as_tensor(b[:n])
    diff = (ta != tb).nonzero()
    return int(diff[0, 0]) if diff.numel() else n


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward and ``generate`` take a key/value cache by: ``cache`` where the
    installed transformers has it (5.24 warns that ``past_key_values`` goes in 5.40), else
    ``past_key_values`` (earlier 5.x releases)."""
    return _cache_keyword(type(model))


@functools.lru_cache(maxsize=None)
def _cache_keyword(model_type: type) -> str:
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def crop_cache(cache: Any, keep: int) -> None:
    """Cut ``cache`` back to its first ``keep`` positions, in place."""
    if keep < 0:
        raise ValueError("keep must be >= 0")
    length = cache.get_seq_length()
    if keep < length:
        cache.crop(keep - length)  # transformers 5: negative = number of tokens to remove


@dataclass
class CacheStats:
    """Counters of a cache: calls, tokens seen, tokens reused from the cache, tokens computed."""

    calls: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    forks: int = 0
    evictions: int = 0

    @property
    def prefill_tokens(self) -> int:
        """Tokens that needed a forward pass (prompt tokens not found in the cache)."""
        return self.prompt_tokens - self.reused_tokens

    def as_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "reused_tokens": self.reused_tokens,
                "prefill_tokens": self.prefill_tokens, "forks": self.forks, "evictions": self.evictions}


@dataclass
class _Slot:
    cache: Any
    ids: tuple[int, ...]
    prompt_len: int  # how many of ``ids`` were prompt (the rest were generated)


@dataclass
class CacheLease:
    """A cache checked out of a :class:`PromptKVPool` for one call.

    ``cache`` holds the key/value states of ``prompt_ids[:reused]``; the caller runs the model over
    the remaining tokens with that cache (:func:`cache_keyword`) and then calls :meth:`PromptKVPool.release`.
    """

    cache: Any
    reused: int
    prompt_len: int
    _released: bool = field(default=False, repr=False)


class PromptKVPool:
    """A few stack-aligned KV caches, reused by longest common token prefix (see module docstring).

    Args:
        new_cache: makes an empty cache (e.g. ``lambda: DynamicCache(config=model.config)``).
        max_slots: caches kept at once (about 46 KB per token each for SmolLM2-135M); one per
            concurrent conversation is ideal.
        fork_min_tokens: when reusing a slot would throw away at least this many of its *prompt*
            tokens (another conversation's stack, or a large popped frame), copy the common prefix
            into a new slot instead of cropping, so that slot stays usable. Smaller losses (the
            fixed turn suffix and the generated tokens, every step) crop in place: no copy.

    Thread safe: a slot is taken out of the pool while leased, so no two calls ever write to the
    same cache; the pool's own bookkeeping is under a lock.
    """

    def __init__(self, new_cache: Callable[[], Any], *, max_slots: int = 4, fork_min_tokens: int = 64) -> None:
        if max_slots < 1:
            raise ValueError("max_slots must be >= 1")
        if fork_min_tokens < 1:
            raise ValueError("fork_min_tokens must be >= 1")
        self._new_cache = new_cache
        self.max_slots = max_slots
        self.fork_min_tokens = fork_min_tokens
        self._slots: "OrderedDict[int, _Slot]" = OrderedDict()  # least recently used first
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._slots)

    def clear(self) -> None:
        """Drop every cached state (e.g. after changing the model's weights)."""
        with self._lock:
            self._slots.clear()

    def acquire(self, prompt_ids: Sequence[int]) -> CacheLease:
        """A cache holding the longest cached prefix of ``prompt_ids`` (at most all but one token,
        since the model must see at least one new token to produce the next-token logits)."""
        prompt_ids = tuple(int(i) for i in prompt_ids)
        if not prompt_ids:
            raise ValueError("empty prompt")
        with self._lock:
            best_key, best_len = None, 0
            for key, slot in self._slots.items():
                n = common_prefix_len(slot.ids, prompt_ids)
                if n > best_len:
                    best_key, best_len = key, n
            reuse = min(best_len, len(prompt_ids) - 1)
            cache = None
            if best_key is not None and reuse > 0:
                slot = self._slots[best_key]
                lost = slot.prompt_len - reuse
                try:
                    if self.max_slots > 1 and lost >= self.fork_min_tokens:
                        cache = copy.deepcopy(slot.cache)
                        crop_cache(cache, reuse)
                        self.stats.forks += 1
                    else:
                        del self._slots[best_key]
                        cache = slot.cache
                        crop_cache(cache, reuse)
                except (RuntimeError, ValueError):
                    # e.g. a sliding-window layer that no longer holds the positions to crop back to
                    self._slots.pop(best_key, None)
                    cache = None
            if cache is None:
                cache, reuse = self._new_cache(), 0
            self.stats.calls += 1
            self.stats.prompt_tokens += len(prompt_ids)
            self.stats.reused_tokens += reuse
            return CacheLease(cache=cache, reused=reuse, prompt_len=len(prompt_ids))

    def release(self, lease: CacheLease, held_ids: Optional[Sequence[int]]) -> None:
        """Return a leased cache. ``held_ids`` = the token ids whose states it now holds (prompt then
        generated, at least ``cache.get_seq_length()`` of them); ``None`` discards it (after an error
        the cache may be half-written)."""
        if lease._released:
            return
        lease._released = True
        if held_ids is None:
            return
        length = lease.cache.get_seq_length()
        if length <= 0 or len(held_ids) < length:
            return  # cannot tell what it holds: never keep a cache with unknown content
        ids = tuple(int(i) for i in held_ids[:length])
        with self._lock:
            self._slots[next(self._ids)] = _Slot(cache=lease.cache, ids=ids, prompt_len=min(lease.prompt_len, length))
            while len(self._slots) > self.max_slots:
                self._slots.popitem(last=False)
                self.stats.evictions += 1


class PrefixStateCache:
    """A bounded LRU of states computed for an exact key (the scorer's User_Query prefix ids).

    Values are whatever the caller stores (here: a cache and the last position's logits). Taking an
    entry removes it, so a caller may mutate it (append the scored text) and put it back after
    cropping; concurrent callers with the same key then simply recompute.
    """

    def __init__(self, max_entries: int = 8) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self._items: LRUCache[Hashable, Any] = LRUCache(maxsize=max(max_entries, 1))
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def take(self, key: Hashable) -> Any:
        """The value for ``key`` (removed from the cache), or ``None``."""
        with self._lock:
            value = self._items.pop(key, None)
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
            return value

    def put(self, key: Hashable, value: Any) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._items[key] = value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
