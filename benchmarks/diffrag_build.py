"""TCM-DiffRAG's graph build on a fixed sample: seconds, model calls, tokens and the triples themselves,
side by side for the package as it is (constrained replies, the default, and unconstrained) and, with
``--baseline``, another checkout's package (e.g. the one table 4 of docs/evaluation.md ran).

Each arm builds the macro-micro graph of the first ``--passages`` packaged PubMedQA-L passages in a
fresh process (no warm cache between arms; the local llama.cpp model, greedy) and reports what it
extracted, so the arms' triples can be compared passage by passage::

    python benchmarks/diffrag_build.py --passages 24 --model /path/qwen2.5-coder-1.5b-instruct.gguf \
        --baseline /tmp/b41/pkg
    python benchmarks/diffrag_build.py --decode-batches --model ...   # what batching passages could gain
    python benchmarks/diffrag_build.py --passages 48 --arms current,batched --sequences 16 --model ...

The ``batched`` arm builds with ``DiffRAGOptions(extract_sequences=--sequences)``: the passages' first
replies decoded together by llama.cpp (continuous batching, :mod:`tcrag_langgraph.models.llama_cpp_batch`).

``--decode-batches`` measures llama.cpp's cost of one decoding step for 1, 2, 4 ... 32 sequences in one
batch (a unified cache, each sequence after the same 64-token prompt): the most that decoding several
passages' triples together could gain on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, parser  # noqa: E402


def _worker(arm: str, passages: int, model_path: str, threads: int, max_new_tokens: int, sequences: int) -> dict:
    """Build the graph in this process and return what it took and what it extracted (per passage)."""
    try:
        from tcrag_langgraph.core.config import TCRAGConfig
    except ImportError:  # older checkouts kept the configuration in machine/
        from tcrag_langgraph.machine.config import TCRAGConfig
    from tcrag_langgraph.methods.diffrag.building import build_macro_micro_graph, packaged_documents
    from tcrag_langgraph.methods.diffrag.options import DiffRAGOptions
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    extra = {"constrain_replies": False} if arm == "unconstrained" else {}
    config = TCRAGConfig(max_new_tokens=max_new_tokens, temperature=0.0, **extra)
    model = LlamaCppChatModel(model_path=model_path, n_threads=threads)
    documents = packaged_documents(max_passages=passages)
    per_passage: list[dict] = []

    def on_passage(chunk_id, triples, calls) -> None:
        per_passage.append({"chunk": chunk_id, "triples": [list(t.as_list()) for t in triples],
                            "calls": calls.llm_calls, "prompt": calls.prompt_tokens,
                            "completion": calls.completion_tokens})

    model.invoke("Hi")  # load the weights outside the timed part, as a built graph's process has them
    start = time.perf_counter()
    options = DiffRAGOptions(max_passages=passages)
    if arm == "batched":
        options = DiffRAGOptions(max_passages=passages, extract_sequences=sequences)
    build_macro_micro_graph(documents, model=model, options=options, config=config, on_passage=on_passage)
    return {"arm": arm, "seconds": time.perf_counter() - start, "passages": per_passage}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--passages", type=int, default=24)
    p.add_argument("--model", required=True, help="the GGUF file of the extracting model")
    p.add_argument("--max-new-tokens", type=int, default=150)
    p.add_argument("--baseline", help="a package folder (PYTHONPATH) to build with beside the current one")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # an arm, run in a fresh process
    p.add_argument("--out", help="write every arm's results (JSON) here")
    p.add_argument("--decode-batches", action="store_true", help="time one decoding step for 1..32 sequences")
    p.add_argument("--arms", default="current,unconstrained",
                   help="comma-separated: current (constrained, one passage at a time), unconstrained, batched")
    p.add_argument("--sequences", type=int, default=16, help="passages decoded together in the batched arm")
    args = p.parse_args()
    args.threads = args.threads or 2  # llama.cpp threads (the shared --threads option; 0: two)
    if args.decode_batches:
        print(machine())
        decode_batches(args.model, args.threads)
        return
    if args.worker:
        print(json.dumps(_worker(args.worker, args.passages, args.model, args.threads, args.max_new_tokens,
                                 args.sequences)))
        return
    print(machine())
    labels = {"current": "current", "unconstrained": "current, unconstrained",
              "batched": f"current, {args.sequences} passages decoded together"}
    wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not wanted or any(a not in labels for a in wanted):
        sys.exit(f"--arms takes {', '.join(labels)}, got {args.arms!r}")
    arms = [(labels[a], a, None) for a in wanted]
    if args.baseline:
        arms.append((f"baseline ({args.baseline})", "unconstrained", args.baseline))
    results = []
    for label, arm, path in arms:
        env = dict(os.environ)
        if path:
            env["PYTHONPATH"] = path
        cmd = [sys.executable, __file__, "--worker", arm, "--passages", str(args.passages), "--model", args.model,
               "--threads", str(args.threads), "--max-new-tokens", str(args.max_new_tokens),
               "--sequences", str(args.sequences)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(f"{label} failed:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["label"] = label
        results.append(result)
        print(f"{label:45s} {result['seconds']:7.1f} s  " + _counts(result["passages"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    for i, reference in enumerate(results):  # each arm against every later one
        for result in results[i + 1:]:
            same = sum(a["triples"] == b["triples"] for a, b in zip(result["passages"], reference["passages"]))
            print(f"{reference['label']} / {result['label']}: {reference['seconds'] / result['seconds']:.2f}x; "
                  f"identical triples on {same} of {len(reference['passages'])} passages")


def decode_batches(model_path: str, threads: int, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> None:
    """Median time of one decoding step (one new token for each of n sequences) against n."""
    import statistics

    import llama_cpp

    llm = llama_cpp.Llama(model_path=model_path, n_ctx=512, n_threads=threads, verbose=False)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 8192, 512, 512, max(sizes)
    params.kv_unified, params.n_threads, params.n_threads_batch = True, threads, threads
    ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
    memory = llama_cpp.llama_get_memory(ctx)
    prompt = llm.tokenize(b"You extract medical facts as triples, one per line: subject | relation | object. " * 4)[:64]

    def decode(items: list[tuple[int, int, int]]) -> float:
        batch = llama_cpp.llama_batch_init(len(items), 0, max(sizes))
        batch.n_tokens = len(items)
        for i, (token, pos, seq) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, 1
            batch.seq_id[i][0] = seq
        start = time.perf_counter()
        code = llama_cpp.llama_decode(ctx, batch)
        took = time.perf_counter() - start
        llama_cpp.llama_batch_free(batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")
        return took

    took = decode([(t, i, 0) for i, t in enumerate(prompt)])
    print(f"prefill of {len(prompt)} tokens: {took * 1e3 / len(prompt):.1f} ms a token")
    for seq in range(1, max(sizes)):
        llama_cpp.llama_memory_seq_cp(memory, 0, seq, -1, -1)
    one = None
    for n in sizes:
        step = statistics.median(decode([(prompt[5], len(prompt) + r, s) for s in range(n)]) for r in range(4))
        for s in range(n):
            llama_cpp.llama_memory_seq_rm(memory, s, len(prompt), -1)
        one = one or step
        print(f"{n:3d} sequences: {step * 1e3:7.1f} ms a step, {step * 1e3 / n:5.1f} ms a token "
              f"({one * n / step:.2f}x the tokens of one sequence per second)")
    llama_cpp.llama_free(ctx)


def _counts(passages: list[dict]) -> str:
    calls = sum(p["calls"] for p in passages)
    return (f"{len(passages)} passages, {calls} calls, prompt {sum(p['prompt'] for p in passages):,}, "
            f"completion {sum(p['completion'] for p in passages):,} tokens, "
            f"{sum(len(p['triples']) for p in passages)} triples")


if __name__ == "__main__":
    main()
