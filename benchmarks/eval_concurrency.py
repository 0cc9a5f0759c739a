"""``tcrag eval --concurrency N`` against a served model: questions per minute for N = 1, 2, 4, 8.

One loopback OpenAI-compatible server (``tests/completions_logprob_server.py``: chat completions
generated, and prompt log-probs computed, by the packaged SmolLM2-135M weights with transformers on
the CPU, one torch thread per request, ``--server-parallel`` requests computed at once) serves every
setting, side by side in this run. Each setting runs the same PubMedQA-L trainval questions
through ``run_evaluation`` with the graphs ``tcrag eval`` builds (its model, tool and scorer
resolvers, methods from the registry; TC-RAG-cppl with the server as its monitor, BM25 docs tool,
no context), greedy. Per setting: wall time, questions per minute, speed-up over N = 1, the CPU
seconds of the server process and of this client process, the server's peak requests in flight,
the load average after it, and whether its rows equal N = 1's (all fields but the wall time).

    nice .venv/bin/python benchmarks/eval_concurrency.py --questions 8 --concurrency 1 2 4 8
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, parser, set_threads  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _graphs(url: str, args):
    import os

    from tcrag_langgraph.agent.spec import AgentSpec
    from tcrag_langgraph.core.config import TCRAGConfig

    os.environ.setdefault("TCRAG_BENCH_LOOPBACK_KEY", "sk-loopback-unchecked")  # the loopback server checks none
    cfg = TCRAGConfig(max_steps=args.max_steps, max_new_tokens=args.max_new_tokens, temperature=0.0,
                      max_format_retries=1, max_observation_tokens=128)
    spec = AgentSpec(model="openai:smollm2", base_url=f"{url}/v1", api_key_env="TCRAG_BENCH_LOOPBACK_KEY",
                     scorer=f"{url}/v1", tools="docs", config=cfg)
    parts = spec.assemble(args.methods, share_monitor=True)  # as tcrag eval builds its runs
    return {name: spec.build(parts, method=name) for name in args.methods}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=8, help="PubMedQA-L trainval questions (seeded sample)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--methods", nargs="+", default=["tcrag-cppl"])
    p.add_argument("--max-steps", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--server-parallel", type=int, default=2, help="requests the server computes at once")
    args = p.parse_args()
    set_threads(args.threads)

    from tcrag_langgraph.eval.datasets import load_dataset, sample_records
    from tcrag_langgraph.eval.runner import run_evaluation

    print(machine())
    records = sample_records(load_dataset("pubmedqa", split="trainval", with_context=False),
                             limit=args.questions, seed=0)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="eval-concurrency-"))
    log = open(tmp / "server.log", "wb")
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "completions_logprob_server.py"), "--port",
                               str(port), "--parallel", str(args.server_parallel)], stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        # warm-up: the first request of a process is slower (allocations, first kernels)
        httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]}).raise_for_status()
        print(f"{len(records)} PubMedQA-L trainval questions x {args.methods}, max_steps {args.max_steps}, "
              f"max_new_tokens {args.max_new_tokens}, greedy; server: SmolLM2-135M transformers fp32 on CPU, "
              f"{args.server_parallel} request(s) computed at once, 1 torch thread each")
        results = []
        reference = None
        for n in args.concurrency:
            graphs = _graphs(url, args)
            httpx.post(f"{url}/stats").raise_for_status()
            server_cpu, own_cpu, start = _cpu_of(server.pid), _own_cpu(), time.perf_counter()
            rows = run_evaluation(records, graphs, include_context=False, progress=False, concurrency=n)
            wall = time.perf_counter() - start
            stats = httpx.get(f"{url}/stats").json()
            comparable = [json.dumps({k: v for k, v in r.items() if k != "wall_time_s"}, sort_keys=True, default=str)
                          for r in rows]
            reference = reference or comparable
            results.append({
                "n": n, "wall_s": wall, "qpm": 60 * len(records) / wall,
                "server_cpu_s": _cpu_of(server.pid) - server_cpu, "client_cpu_s": _own_cpu() - own_cpu,
                "requests": stats["requests"], "peak": stats["peak_in_flight"],
                "load": os.getloadavg()[0], "same": comparable == reference,
                "exceptions": sum(r["halt_reason"] == "exception" for r in rows),
            })
            r = results[-1]
            print(f"N={n}: {r['wall_s']:.1f} s, {r['qpm']:.2f} questions/min, server CPU {r['server_cpu_s']:.1f} s, "
                  f"client CPU {r['client_cpu_s']:.1f} s, {r['requests']} requests, peak in flight {r['peak']}, "
                  f"load {r['load']:.2f}, same rows as first: {r['same']}", flush=True)
        base = results[0]
        print()
        print("| N | wall s | questions/min | vs N=1 | server CPU s | client CPU s | requests | peak in flight "
              "| load avg after | rows = N=1 |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in results:
            print(f"| {r['n']} | {r['wall_s']:.1f} | {r['qpm']:.2f} | {r['qpm'] / base['qpm']:.2f}x | "
                  f"{r['server_cpu_s']:.1f} | {r['client_cpu_s']:.1f} | {r['requests']} | {r['peak']} | "
                  f"{r['load']:.2f} | {'yes' if r['same'] else 'NO'} |")
        print()
        print(machine())
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


if __name__ == "__main__":
    main()
