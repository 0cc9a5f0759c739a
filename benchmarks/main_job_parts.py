"""Two parts of the main job, each against what it replaced, side by side in one run (RESULTS.md section 13).

* ``--part embed``: the packaged MiniLM as the DOC_RAG query path runs it, numpy
  (``MiniLMEmbeddings(engine="numpy")``) against sentence-transformers (``engine="torch"``): a fresh
  process each for load time and peak memory (imports included), then one query and a bulk batch of
  real passages in one process, interleaved rounds, one BLAS/torch thread.
* ``--part weights``: the packaged SmolLM2 generating from its Q4_1 file against its float16
  re-encoding (``LlamaCppChatModel(weights=...)``): prefill of a real prompt and greedy decode,
  one thread, a fresh llama.cpp model per round, interleaved.

Example::

    .venv/bin/python benchmarks/main_job_parts.py --part embed --rounds 3
    .venv/bin/python benchmarks/main_job_parts.py --part weights --rounds 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

_LOAD = r"""
import resource, sys, time
t = time.perf_counter()
from tcrag_langgraph.tools.documents import MiniLMEmbeddings
MiniLMEmbeddings(engine=sys.argv[1]).embed_query("first-line drug for type 2 diabetes")
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def _passages(n: int) -> list[str]:
    from importlib.resources import files

    with gzip.open(str(files("tcrag_langgraph.tools") / "data" / "docs_pubmedqa.jsonl.gz"), "rt") as f:
        return [json.loads(next(f))["text"] for _ in range(n)]


def embed(rounds: int, bulk: int) -> None:
    from threadpoolctl import threadpool_limits

    engines = ("numpy", "torch")
    loads = {e: [] for e in engines}
    for _ in range(rounds):
        for engine in engines:
            out = subprocess.run([sys.executable, "-c", _LOAD, engine], capture_output=True, text=True, check=True)
            seconds, rss = map(float, out.stdout.split())
            loads[engine].append((seconds, rss))
    for engine in engines:
        s = statistics.median(x[0] for x in loads[engine])
        r = statistics.median(x[1] for x in loads[engine])
        print(f"load + first query, fresh process  {engine:5s}  {s:6.2f} s   peak RSS {r:6.0f} MB")
    print(f"ratio torch / numpy: time {statistics.median(x[0] for x in loads['torch']) / statistics.median(x[0] for x in loads['numpy']):.2f}x, "
          f"peak RSS {statistics.median(x[1] for x in loads['torch']) / statistics.median(x[1] for x in loads['numpy']):.2f}x")

    import torch

    from tcrag_langgraph.tools.documents import MiniLMEmbeddings

    torch.set_num_threads(1)
    threadpool_limits(limits=1)
    models = {e: MiniLMEmbeddings(engine=e) for e in engines}
    texts = _passages(bulk)
    for m in models.values():
        m.encode(texts[:2])  # loaded and warm
    query, batch = {e: [] for e in engines}, {e: [] for e in engines}
    for _ in range(rounds):
        for engine, m in models.items():
            t = time.perf_counter()
            m.encode(["first-line drug for type 2 diabetes"])
            query[engine].append(time.perf_counter() - t)
            t = time.perf_counter()
            m.encode(texts)
            batch[engine].append(time.perf_counter() - t)
    for engine in engines:
        print(f"one query {engine:5s} {statistics.median(query[engine]) * 1000:7.1f} ms   "
              f"{bulk} passages {statistics.median(batch[engine]):6.2f} s (one thread)")
    print(f"ratio numpy / torch: query {statistics.median(query['numpy']) / statistics.median(query['torch']):.2f}x, "
          f"bulk {statistics.median(batch['numpy']) / statistics.median(batch['torch']):.2f}x")


def weights(rounds: int, prompt_tokens: int, new_tokens: int) -> None:
    from tcrag_langgraph.models.gguf_files import f16_copy
    from tcrag_langgraph.models.llama_cpp_native import logits_row
    from tcrag_langgraph.models.weights import default_model_source

    import llama_cpp

    folder, name = default_model_source()
    files = {"Q4_1 file": folder / name, "float16 copy": f16_copy(folder / name)}
    text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()
    speeds = {k: {"prefill": [], "decode": []} for k in files}
    for _ in range(rounds):
        for label, path in files.items():
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=4096, n_threads=1, n_threads_batch=1, verbose=False)
            ids = llm.tokenize(text.encode())[:prompt_tokens]
            t = time.perf_counter()
            llm.eval(ids)
            speeds[label]["prefill"].append(len(ids) / (time.perf_counter() - t))
            t = time.perf_counter()
            token = int(logits_row(llm._ctx, -1, llm.n_vocab()).argmax())
            for _ in range(new_tokens):  # greedy, one token per pass
                llm.eval([token])
                token = int(logits_row(llm._ctx, -1, llm.n_vocab()).argmax())
            speeds[label]["decode"].append(new_tokens / (time.perf_counter() - t))
            del llm
    for label in files:
        print(f"{label:13s} {Path(files[label]).stat().st_size / 1e6:6.0f} MB  prefill "
              f"{statistics.median(speeds[label]['prefill']):6.1f} tok/s  decode {statistics.median(speeds[label]['decode']):6.1f} tok/s")
    a, b = speeds["float16 copy"], speeds["Q4_1 file"]
    print(f"ratio float16 / Q4_1: prefill {statistics.median(a['prefill']) / statistics.median(b['prefill']):.2f}x, "
          f"decode {statistics.median(a['decode']) / statistics.median(b['decode']):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("embed", "weights"), required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bulk", type=int, default=100, help="passages in the bulk batch (embed)")
    ap.add_argument("--prompt-tokens", type=int, default=800)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    print(machine())
    if args.part == "embed":
        embed(args.rounds, args.bulk)
    else:
        weights(args.rounds, args.prompt_tokens, args.new_tokens)


if __name__ == "__main__":
    main()
