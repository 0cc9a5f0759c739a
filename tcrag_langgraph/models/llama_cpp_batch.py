"""Greedy replies to several prompts decoded together (:func:`greedy_batch`): each decoding step is one
llama.cpp batch holding the next token of every unfinished reply, in a second context on the same
loaded weights (one sequence per prompt, one unified cache; the prompts' common prefix prefilled once
and shared by every sequence).

Why: a decoding step reads every weight once however many sequences it carries. On a GPU decoding is
bound by those reads, so n replies cost little more than one; on two CPU cores the arithmetic is the
bound and the gain is smaller (one step for 16 sequences: 2.7x the tokens a second of one sequence,
benchmarks/RESULTS.md section 24). TCM-DiffRAG's graph build (one independent extraction per passage)
is the caller.

Each reply is greedy under its own grammar sampler (:class:`~.llama_cpp_grammar.GreedyGrammar`), or
plain argmax without a grammar; it ends at an end-of-generation token or at ``max_new_tokens``. The
replies are not always token for token those of one-at-a-time decoding: batched kernels round
otherwise than the one-token kernels, and at a near tie the other token wins (RESULTS.md sections 9
and 28 count how often).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from .llama_cpp_grammar import GreedyGrammar
from .llama_cpp_model import LlamaCppModel
from .llama_cpp_native import decode_tokens, import_llama_cpp, return_freed_heap
from .run_control import RunCancelled, RunControl

__all__ = ["BatchReply", "MAX_SEQUENCES", "greedy_batch"]

#: Most sequences one call decodes together (llama.cpp's own bound is 256; past ~32 two CPU cores gain
#: nothing more, and the cache grows with every sequence).
MAX_SEQUENCES = 64

#: Tokens in one llama_decode call (the context's n_batch): the running replies' next tokens and, in
#: the room left, the prompt tokens of replies about to start.
_BATCH_TOKENS = 512


@dataclass(frozen=True)
class BatchReply:
    """One prompt's reply: its text (special tokens left out, stripped), its token counts and why it
    ended (``"stop"``: an end-of-generation token; ``"length"``: ``max_new_tokens``)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


def greedy_batch(lm: LlamaCppModel, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 grammar: Optional[str] = None, sequences: int = 16,
                 run: Optional[RunControl] = None) -> list[BatchReply]:
    """Greedy replies to ``prompts`` (token ids, each a whole chat prompt), decoded ``sequences`` at a time.

    Continuous batching: a reply that ends frees its sequence, and the next prompt starts there in the
    next step (its prompt tokens in the same llama.cpp batch as the running replies' next tokens), so
    the batch stays full while prompts are left. ``grammar`` (GBNF text): every reply keeps to it. A
    cancelled ``run`` (:class:`~.run_control.RunControl`) raises :class:`~.run_control.RunCancelled` at the
    next step, as one-at-a-time decoding does at the next token. The caller holds ``lm.lock``; the
    generation context and its cached prompt are not touched.
    """
    if not prompts:
        raise ValueError("greedy_batch needs at least one prompt")
    if not 1 <= sequences <= MAX_SEQUENCES:
        raise ValueError(f"sequences must be between 1 and {MAX_SEQUENCES}, got {sequences!r}")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    prompts = [list(p) for p in prompts]
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    for p in prompts:
        if len(p) + max_new_tokens > lm.n_ctx:
            raise ValueError(f"prompt of {len(p)} tokens + {max_new_tokens} new tokens exceeds the context of "
                             f"{lm.n_ctx} tokens")
    llama_cpp = import_llama_cpp()
    slots = min(sequences, len(prompts))
    shared = _common_length(prompts)
    longest = max(len(p) for p in prompts) - shared + max_new_tokens
    params = llama_cpp.llama_context_default_params()
    # one sequence holds the shared prefix; each slot, at most its longest prompt's own tokens and a reply
    # (a unified cache: a slot's cells go back to the pool when its reply ends)
    cells = shared + slots * longest + _BATCH_TOKENS
    cells += cells // 4  # room for the cache's own placement of a batch's tokens
    params.n_ctx = -(-cells // 256) * 256
    params.n_batch = params.n_ubatch = _BATCH_TOKENS
    params.n_seq_max, params.kv_unified = slots + 1, True
    params.n_threads = params.n_threads_batch = lm.n_threads
    ctx = llama_cpp.llama_init_from_model(lm.llm._model.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not make a context of {params.n_ctx} tokens for {slots} sequences")
    batch = llama_cpp.llama_batch_init(_BATCH_TOKENS, 0, 1)
    try:
        return _Decoder(lm, ctx, batch, prompts, shared, slots, max_new_tokens, grammar, run).run()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        if grammar:
            return_freed_heap()  # the grammar samplers' freed blocks (why: llama_cpp_native)


def _common_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt begins with, leaving each at least one of its own (its first reply token's
    logits come from its last prompt token)."""
    first = prompts[0]
    shared = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = 0
        while k < shared and p[k] == first[k]:
            k += 1
        shared = k
    return shared


@dataclass
class _Running:
    """A prompt decoding in a slot: the next position to fill, the token chosen and not yet decoded
    (None while the prompt is still being prefilled), and its grammar sampler."""

    index: int
    pos: int
    pending: Optional[int] = None
    chooser: Optional[GreedyGrammar] = None


class _Decoder:
    """The scheduling of :func:`greedy_batch`: which prompt runs in which slot, and what each step holds."""

    def __init__(self, lm: LlamaCppModel, ctx, batch, prompts: list[list[int]], shared: int, slots: int,
                 max_new: int, grammar: Optional[str], run: Optional[RunControl]) -> None:
        self.lm, self.ctx, self.batch, self.prompts = lm, ctx, batch, prompts
        self.shared, self.slots, self.max_new, self.grammar, self.run_control = shared, slots, max_new, grammar, run
        self.prefix_seq = slots  # the sequence id that keeps the shared prefix
        self.memory = import_llama_cpp().llama_get_memory(ctx)
        self.out: list[list[int]] = [[] for _ in prompts]
        self.finish: list[str] = ["stop"] * len(prompts)
        self.running: dict[int, _Running] = {}  # slot -> what decodes there
        self.free = list(range(slots))[::-1]
        self.waiting = list(range(len(prompts)))[::-1]  # popped from the end: the first prompt first

    def _choose(self, chooser: Optional[GreedyGrammar], row_index: int) -> int:
        import numpy as np

        llama_cpp = import_llama_cpp()
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, row_index), shape=(self.lm.n_vocab,))
        return int(np.argmax(row)) if chooser is None else chooser.choose(row)

    def run(self) -> list[BatchReply]:
        first = self.prompts[0]
        for start in range(0, self.shared, _BATCH_TOKENS):  # the common prefix once, in its own sequence
            part = first[start:min(self.shared, start + _BATCH_TOKENS)]
            decode_tokens(self.ctx, self.batch, [(t, start + i, self.prefix_seq, False) for i, t in enumerate(part)])
        try:
            while self.waiting or self.running:
                if self.run_control is not None and self.run_control.cancelled:
                    raise RunCancelled(self.run_control.reason or "the run was cancelled")
                items = self._next_tokens()
                self._start_waiting()
                items += self._prompt_tokens(_BATCH_TOKENS - len(items))
                if not items:
                    continue
                decode_tokens(self.ctx, self.batch, items)
                for row, (_, _, slot, logits) in enumerate(items):
                    if logits:
                        state = self.running[slot]
                        state.pending = self._choose(state.chooser, row)
        finally:
            for state in self.running.values():
                if state.chooser is not None:
                    state.chooser.close()
        return [BatchReply(self.lm.detokenize(ids).strip(), len(p), len(ids), why)
                for p, ids, why in zip(self.prompts, self.out, self.finish)]

    def _next_tokens(self) -> list[tuple[int, int, int, bool]]:
        """Each running reply's chosen token, to decode next; a reply that ends gives its slot back."""
        items = []
        for slot, state in list(self.running.items()):
            token = state.pending
            if token is None:
                continue
            if self.lm.is_eog(token):
                self._end(slot)
                continue
            self.out[state.index].append(token)
            if len(self.out[state.index]) >= self.max_new:
                self.finish[state.index] = "length"
                self._end(slot)
                continue
            items.append((token, state.pos, slot, True))
            state.pos += 1
        return items

    def _start_waiting(self) -> None:
        """Each free slot starts the next waiting prompt from the shared prefix (no copy in a unified cache)."""
        llama_cpp = import_llama_cpp()
        while self.waiting and self.free:
            slot = self.free.pop()
            llama_cpp.llama_memory_seq_cp(self.memory, self.prefix_seq, slot, -1, -1)
            chooser = GreedyGrammar(self.lm, self.grammar) if self.grammar else None
            self.running[slot] = _Running(self.waiting.pop(), self.shared, None, chooser)

    def _prompt_tokens(self, room: int) -> list[tuple[int, int, int, bool]]:
        """Prompt tokens of the replies still prefilling, at most ``room``; logits at each prompt's last."""
        items = []
        for slot, state in self.running.items():
            prompt = self.prompts[state.index]
            while state.pending is None and state.pos < len(prompt) and len(items) < room:
                items.append((prompt[state.pos], state.pos, slot, state.pos == len(prompt) - 1))
                state.pos += 1
        return items

    def _end(self, slot: int) -> None:
        """The reply in ``slot`` ended: its cells go back to the cache, the slot to the free ones."""
        chooser = self.running.pop(slot).chooser
        if chooser is not None:
            chooser.close()
        import_llama_cpp().llama_memory_seq_rm(self.memory, slot, -1, -1)
        self.free.append(slot)
