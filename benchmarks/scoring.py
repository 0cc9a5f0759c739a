"""State scoring: cached User_Query prefix vs full recomputation (LocalLMScorer).

For each User_Query length (32/256/1024 tokens) x frame length (32/128/512 tokens), scores
several different frames for the same query, as the agent does step after step, three ways,
interleaved:

* ``orig``: the code before issue 6 (one pass over query + frame, LM head over every position);
* ``full``: ``LocalLMScorer(lm, prefix_cache=0)`` (one pass over query + frame, LM head only
  over the positions that predict frame tokens);
* ``cached``: ``LocalLMScorer(lm)`` (User_Query prefix cached after the question's first call:
  one pass over the frame only).

Prints median seconds per call, the speed-ups and the largest relative difference of the values.
The speed-up of caching is bounded by about (query + frame) / frame tokens.

    python benchmarks/scoring.py [--threads 1] [--repeat 3]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import corpus_texts, machine, parser, set_threads  # noqa: E402

QUERY_TOKENS = (32, 256, 1024)
FRAME_TOKENS = (32, 128, 512)


def exact_tokens(tok, ids: list[int], n: int) -> str:
    """Text of about ``n`` tokens that re-tokenises to exactly ``n`` tokens (trimmed until it does)."""
    cut = n
    while True:
        text = tok.decode(ids[:cut])
        got = len(tok(text, add_special_tokens=False)["input_ids"])
        if got <= n:
            return text
        cut -= 1


def original_cppl(scorer, query: str, text: str) -> float:
    """cppl exactly as computed before the prefix cache (the baseline of this benchmark)."""
    import math

    import torch

    lm = scorer.local_model
    tok = lm.tokenizer
    ctx = tok(query + "\n", add_special_tokens=False)["input_ids"]
    text_ids = tok(text, add_special_tokens=False)["input_ids"]
    ids = scorer._start_ids() + ctx + text_ids
    first = len(ids) - len(text_ids)
    with lm.lock, torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[first - 1: len(ids) - 1], dim=-1)
    lps = logp.gather(1, torch.tensor(ids[first:])[:, None])[:, 0]
    return math.exp(-float(lps.mean()))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--repeat", type=int, default=3, help="frames scored per cell and variant")
    args = p.parse_args()
    set_threads(args.threads)
    from tcrag_langgraph.models.weights import load_local_model
    from tcrag_langgraph.monitor.scoring import LocalLMScorer

    lm = load_local_model()
    tok = lm.tokenizer
    stream = tok("\n".join(corpus_texts(400)), add_special_tokens=False)["input_ids"]
    print(f"machine: {machine()}")
    print(f"model: {lm.name}; metric cppl; median of {args.repeat} different frames per cell\n")
    print(f"{'query tok':>9} {'frame tok':>9} {'orig s':>8} {'full s':>8} {'cached s':>8} "
          f"{'orig/cached':>11} {'full/cached':>11} {'max rel diff':>12}")
    rows = []
    offset = 0
    for qn in QUERY_TOKENS:
        query = exact_tokens(tok, stream[offset:], qn)
        offset += qn
        for fn in FRAME_TOKENS:
            frames = []
            for _ in range(args.repeat + 1):
                frames.append(exact_tokens(tok, stream[offset:], fn))
                offset += fn
            cached = LocalLMScorer(lm, max_tokens=4096)
            full = LocalLMScorer(lm, max_tokens=4096, prefix_cache=0)
            cached.score(query, frames[0], metric="cppl")  # the query's prefix, computed once per question
            full.score(query, frames[0], metric="cppl")  # same warm-up for fairness (allocator, caches)
            original_cppl(full, query, frames[0])
            t_orig, t_full, t_cached, diffs = [], [], [], []
            for frame in frames[1:]:
                a0 = time.perf_counter(); v_orig = original_cppl(full, query, frame); a1 = time.perf_counter()
                v_full = full.score(query, frame, metric="cppl"); a2 = time.perf_counter()
                v_cached = cached.score(query, frame, metric="cppl"); a3 = time.perf_counter()
                t_orig.append(a1 - a0)
                t_full.append(a2 - a1)
                t_cached.append(a3 - a2)
                diffs.append(max(abs(v_cached - v_orig) / v_orig, abs(v_full - v_orig) / v_orig))
            mo, mf, mc = (statistics.median(t) for t in (t_orig, t_full, t_cached))
            rows.append((qn, fn, mo, mf, mc))
            print(f"{qn:>9} {fn:>9} {mo:>8.3f} {mf:>8.3f} {mc:>8.3f} {mo / mc:>10.1f}x {mf / mc:>10.1f}x "
                  f"{max(diffs):>12.2e}", flush=True)
    print(f"\nload avg after: {machine().split('load avg ')[1].split(',')[0]}")


if __name__ == "__main__":
    main()
