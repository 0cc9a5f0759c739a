"""Speculative decoding for llama.cpp (the paper's section 5.3): a small draft model with the same
tokenizer proposes tokens, the model verifies them in one batch, and the output is the model's own
greedy output token for token (near ties are decided by the one-token kernels, see
:func:`speculative_greedy`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Protocol

from .llama_cpp_native import decode_at, logits_row
from .llama_cpp_states import reusable_prefix

__all__ = ["SpeculativeStats", "NEAR_TIE_LOGITS", "speculative_greedy", "argmax_margin"]


class ExactCacheModel(Protocol):
    """What speculative decoding needs of a loaded model (a :class:`~.llama_cpp_model.LlamaCppModel`):
    llama-cpp-python's ``Llama``, its sizes, and how much of its cache plain decoding computed."""

    llm: Any
    exact_tokens: int

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    def is_eog(self, token_id: int) -> bool: ...


@dataclass
class SpeculativeStats:
    """Draft tokens proposed and accepted over a chat model's calls (speculative decoding)."""

    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    #: near ties the batched verification could not decide: the tokens since the last exact point were
    #: evaluated again one at a time
    resyncs: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"proposed": self.proposed, "accepted": self.accepted, "target_passes": self.target_passes,
                "resyncs": self.resyncs, "acceptance_rate": self.acceptance_rate}


#: Batched and one-token logits of llama.cpp differ by up to ~0.4 (measured, see speculative_greedy);
#: a verified argmax with a smaller margin over the runner-up is decided by the one-token kernels.
NEAR_TIE_LOGITS = 1.0


def speculative_greedy(target: ExactCacheModel, draft: ExactCacheModel, prompt: list[int], *, n_draft: int,
                       stats: Optional[SpeculativeStats] = None, near_tie: float = NEAR_TIE_LOGITS) -> Iterator[int]:
    """Yield the target model's greedy continuation of ``prompt``, using ``draft`` to propose tokens.

    Each round the draft proposes up to ``n_draft`` tokens greedily; the target evaluates the last
    accepted token plus the proposals in one batch with logits at every position, accepts proposals
    while they equal its own argmax, and adds its own token at the first disagreement (or after the
    last proposal).

    Identical to plain greedy decoding, not only close to it: llama.cpp's batched kernels (a
    verification pass) and its one-token kernels (plain decoding) round differently, by up to ~0.4
    logits measured on Qwen2.5-Coder-1.5B Q4_K over 60 tokens, so a batched argmax is trusted only
    where its margin over the runner-up is at least ``near_tie``. At a nearer tie the tokens since the
    last exact point are evaluated again one at a time, exactly as plain decoding evaluates them, and
    the token is chosen from those logits: the cache is then the plain decoder's, bit for bit.
    ``target.exact_tokens`` marks how much of the cache is exact, so prefix reuse in later calls (and
    a plain call after this one) never builds on batched results. Call with both locks held.
    """
    import numpy as np

    tl, dl = target.llm, draft.llm
    n_vocab = target.n_vocab
    stats = stats if stats is not None else SpeculativeStats()
    batch = tl._batch  # llama-cpp-python's own batch of n_batch tokens
    # Prefill the prompt with prefix reuse (llama-cpp-python's rule, within the exact part of the cache),
    # logits for its last token only: the plain decoder's prefill.
    reuse = min(reusable_prefix(tl, prompt), target.exact_tokens)
    tl._ctx.kv_cache_seq_rm(-1, reuse, -1)
    tl.n_tokens = reuse
    rest = prompt[reuse:]
    row = None
    for i in range(0, len(rest), tl.n_batch):
        part = rest[i:i + tl.n_batch]
        last_pos = len(prompt) - 1
        rows = decode_at(tl._ctx, batch, part, tl.n_tokens, lambda p: p == last_pos)
        tl.input_ids[tl.n_tokens:tl.n_tokens + len(part)] = part
        tl.n_tokens += len(part)
        if rows:
            row = logits_row(tl._ctx, rows[-1], n_vocab)
    stats.target_passes += 1
    target.exact_tokens = tl.n_tokens
    next_tok = int(np.argmax(row))
    seq = list(prompt)  # evaluated by the target: seq[:tl.n_tokens]
    while True:
        yield next_tok
        seq.append(next_tok)
        # The draft proposes after seq (its own prefix cache, greedy).
        proposal: list[int] = []
        room = target.n_ctx - len(seq) - 1
        k = max(0, min(n_draft, room))
        if k:
            gen = dl.generate(seq, temp=0.0, repeat_penalty=1.0, reset=True)
            try:
                for tok in gen:
                    proposal.append(int(tok))
                    if len(proposal) >= k or draft.is_eog(tok):
                        break
            finally:
                gen.close()
        stats.proposed += len(proposal)
        # Verify: the target evaluates next_tok + proposals, logits at every one of these positions.
        ids = [next_tok] + proposal
        start = tl.n_tokens
        rows = decode_at(tl._ctx, batch, ids, start, lambda p: True)
        tl.input_ids[start:start + len(ids)] = ids
        tl.n_tokens = start + len(ids)
        stats.target_passes += 1
        accepted = 0
        choice = None
        tie = False
        for j, r in enumerate(rows):
            logits = logits_row(tl._ctx, r, n_vocab)
            best, margin = argmax_margin(logits)
            if margin < near_tie:  # the batched kernels may rank these two otherwise than the plain ones
                tie = True
                break
            if j < len(proposal) and best == proposal[j]:
                accepted += 1
                continue
            choice = best
            break
        stats.accepted += accepted
        for tok in proposal[:accepted]:
            yield tok
            seq.append(tok)
        # Drop the rejected proposals from the target's cache.
        keep = start + 1 + accepted
        if keep < tl.n_tokens:
            tl._ctx.kv_cache_seq_rm(-1, keep, -1)
            tl.n_tokens = keep
        if tie:
            choice = _resync(target, seq, stats)
        tl._requires_eval = True  # the logits llama-cpp-python holds are not those of its last token
        next_tok = choice


def argmax_margin(logits) -> tuple[int, float]:
    """The top token (argmax's tie rule, the lowest id, as plain greedy decoding picks) and its logit
    margin over the runner-up."""
    import numpy as np

    runner_up, top = np.partition(logits, -2)[-2:]
    return int(np.argmax(logits)), float(top - runner_up)


def _resync(target: ExactCacheModel, seq: list[int], stats: SpeculativeStats) -> int:
    """Evaluate ``seq`` from the cache's exact point on one token at a time, as plain decoding does,
    and return the greedy token after it (from one-token logits over an exact cache)."""
    import numpy as np

    tl = target.llm
    start = target.exact_tokens
    tl._ctx.kv_cache_seq_rm(-1, start, -1)
    tl.n_tokens = start
    row = None
    for pos in range(start, len(seq)):
        rows = decode_at(tl._ctx, tl._batch, [seq[pos]], pos, lambda p: True)
        tl.input_ids[pos] = seq[pos]
        tl.n_tokens = pos + 1
        row = logits_row(tl._ctx, rows[0], target.n_vocab)
        stats.target_passes += 1
    stats.resyncs += 1
    target.exact_tokens = tl.n_tokens
    return int(np.argmax(row))
