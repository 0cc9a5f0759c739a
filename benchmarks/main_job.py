"""The README's main job, end to end: ``tcrag ask QUESTION --json`` as ``make ask`` runs it.

Two parts:

* **runs** (default): the real command in a fresh process, ``--runs`` times per question, for each of
  the five medical questions below. Per run: wall time, the child's CPU time (user + sys; on a
  loaded shared machine this moves far less than wall time), steps, halt reason, the answer, the
  sources it used. Then the median wall time. ``--variant NAME=ARGS`` adds variants measured in
  the same run, interleaved question by question (e.g. the old defaults as "before").
* **breakdown** (``--breakdown``): one run per question inside this process, with timers around
  model load, tool construction, generation, state scoring and each tool call (a tool's first
  call includes loading its data), so you see where the time goes.

Warm means: the packaged model was converted once before (the first ``tcrag ask`` on a machine
does that, ~30 s) and the tools' data files exist; every run still starts a fresh interpreter,
as ``make ask`` does.

Example::

    nice -n -5 .venv/bin/python benchmarks/main_job.py --runs 1 \\
        --variant "before=--max-new-tokens 500 --max-steps 12"
    nice -n -5 .venv/bin/python benchmarks/main_job.py --breakdown

``--baseline DIR`` runs an earlier commit in the same run (same interpreter, ``PYTHONPATH=DIR``), e.g.::

    git worktree add /tmp/base COMMIT && mkdir /tmp/base/pkg && cp -r /tmp/base/tcrag_langgraph /tmp/base/pkg/ \\
      && ln -s /tmp/base/tools /tmp/base/pkg/tcrag_langgraph/tools && ln -s /tmp/base/prompts /tmp/base/pkg/tcrag_langgraph/prompts
    .venv/bin/python benchmarks/main_job.py --args "--threads 1" --baseline /tmp/base/pkg
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

QUESTIONS = (
    "What is the first-line drug for type 2 diabetes?",  # the Makefile's default question
    "Which vitamin deficiency causes scurvy?",
    "Which bacterium causes tuberculosis?",
    "What is the mechanism of action of aspirin?",
    "What are the symptoms of iron deficiency anemia?",
)

TCRAG = str(Path(sys.executable).with_name("tcrag"))


def run_once(question: str, extra: list[str], timeout_s: float, command: list[str] | None = None,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``tcrag ask --json`` in a fresh process: wall and CPU seconds, its own peak RSS (from
    ``wait4``, this child's alone) and the parsed result."""
    cmd = [*(command or [TCRAG]), "ask", question, "--json", *extra]
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        start = time.perf_counter()
        # `python -m` puts the working directory first on sys.path: run a baseline from its own tree
        cwd = env.get("PYTHONPATH") if env else None
        proc = subprocess.Popen(cmd, stdout=out_file, stderr=err_file, text=True, env=env, cwd=cwd)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    row: dict[str, Any] = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                           "max_rss_mb": usage.ru_maxrss / 1024, "rc": proc.returncode}
    if proc.returncode == -9:
        row["error"] = f"timed out after {timeout_s:.0f} s"
        return row
    try:
        data = json.loads(out[out.index("{"):])
    except ValueError:
        row["error"] = (err or out).strip()[-300:]
        return row
    row.update(steps=data["steps"], llm_calls=data["llm_calls"], halt=data["halt_reason"], answer=data["answer"],
               validated=data["answer_validated"], completion_tokens=data["token_usage"].get("completion"),
               sources=[f"{s['tool']}({json.dumps(s['tool_input'], ensure_ascii=False)})" for s in data["sources"]],
               final_action=(data["stack"][-1]["action"] if data["stack"] else None))
    return row


def runs(args: argparse.Namespace) -> None:
    variants: list[tuple[str, list[str], list[str] | None, dict[str, str] | None]] = [
        ("current", shlex.split(args.args), None, None)]
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        variants.append((name, shlex.split(extra), None, None))
    if args.baseline:  # an earlier commit's package tree, same interpreter and arguments
        env = {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())}
        variants.append(("baseline", shlex.split(args.args), [sys.executable, "-m", "tcrag_langgraph.faces.cli"], env))
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for question in QUESTIONS[: args.questions]:
        for _ in range(args.runs):
            for name, extra, command, env in variants:  # interleaved: the variants see the same load
                load = os.getloadavg()[0]
                row = run_once(question, extra, args.timeout, command, env)
                row.update(question=question, load=load)
                results[name].append(row)
                answer = " ".join(str(row.get("answer")).split())[:110]
                print(f"[{name}] {row['wall_s']:6.1f} s wall  cpu {row.get('cpu_s') or 0:6.1f} s  "
                      f"rss {row['max_rss_mb']:6.0f} MB  load {load:4.1f}  "
                      f"steps {row.get('steps')}  halt {row.get('halt')}  final {row.get('final_action')}\n"
                      f"    Q: {question}\n    A: {answer}\n    sources: {row.get('sources')}"
                      + (f"\n    error: {row['error']}" if row.get("error") else ""), flush=True)
    print()
    medians = {}
    for name, extra, command, _ in variants:
        rows = results[name]
        walls = [r["wall_s"] for r in rows]
        cpus = [r["cpu_s"] for r in rows if r.get("cpu_s") is not None]
        concl = sum(r.get("final_action") == "Conclusion" for r in rows)
        medians[name] = statistics.median(walls)
        label = f"{' '.join(extra) or 'defaults'}" + (f", PYTHONPATH={args.baseline}" if command else "")
        print(f"{name:>10} ({label}): median wall {medians[name]:.1f} s, "
              f"median cpu {statistics.median(cpus) if cpus else float('nan'):.1f} s, max wall {max(walls):.1f} s, "
              f"max RSS {max(r['max_rss_mb'] for r in rows):.0f} MB; "
              f"ended on a Conclusion {concl}/{len(rows)}; validated {sum(bool(r.get('validated')) for r in rows)}")
    for name in medians:
        if name != "current":
            print(f"median wall {name} / current: {medians[name] / medians['current']:.2f}x")


# ----- breakdown -----
def _timer(bucket: dict[str, float], counts: dict[str, int], name: Callable[..., str] | str,
           fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **kw: Any) -> Any:
        key = name(*a, **kw) if callable(name) else name
        start = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            bucket[key] += time.perf_counter() - start
            counts[key] += 1
    return wrapper


def breakdown(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    from typer.testing import CliRunner

    from tcrag_langgraph.core import kernel
    from tcrag_langgraph.faces import cli
    from tcrag_langgraph.models import llama_cpp as llama_models
    from tcrag_langgraph.models import local as models
    from tcrag_langgraph.monitor import llama_cpp as llama_scoring
    from tcrag_langgraph.monitor import scoring

    import_s = time.perf_counter() - t0
    print(f"import tcrag_langgraph.faces.cli (all sub-commands): {import_s:.1f} s")
    seen_tools: set[str] = set()

    def tool_key(tool: Any, *a: Any, **kw: Any) -> str:
        first = tool.name not in seen_tools
        seen_tools.add(tool.name)
        return f"tool {tool.name}" + (" (first call: loads its data)" if first else "")

    # Both backends: llama.cpp runs the packaged GGUF (the default), transformers a model folder.
    timed = [(models, "load_local_model", "model load"), (llama_models, "load_llama_model", "model load"),
             (cli, "_default_tools", "tool construction"),
             (models.LocalChatModel, "_generate", "generation"), (llama_models.LlamaCppChatModel, "_generate", "generation"),
             (llama_models.LlamaCppChatModel, "_stream", "generation"),
             (scoring.LocalLMScorer, "score", "state scoring"), (llama_scoring.LlamaCppScorer, "score", "state scoring"),
             (kernel, "invoke_tool", tool_key)]
    for question in QUESTIONS[: args.questions]:
        bucket: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        originals = [owner.__dict__[attr] for owner, attr, _ in timed]
        for (owner, attr, label), fn in zip(timed, originals):
            setattr(owner, attr, _timer(bucket, counts, label, fn))
        try:
            start = time.perf_counter()
            result = CliRunner().invoke(cli.app, ["ask", question, "--json", *shlex.split(args.args)])
            total = time.perf_counter() - start
        finally:
            for (owner, attr, _), fn in zip(timed, originals):
                setattr(owner, attr, fn)
        data = json.loads(result.stdout[result.stdout.index("{"):])
        print(f"\nQ: {question}  (load {os.getloadavg()[0]:.1f})\n   total {total:.1f} s, steps {data['steps']}, "
              f"halt {data['halt_reason']}, completion tokens {data['token_usage'].get('completion')}")
        for key, seconds in sorted(bucket.items(), key=lambda kv: -kv[1]):
            print(f"   {key:<50} {seconds:7.2f} s  ({counts[key]} calls)")
        print(f"   {'other (graph, prompts, parsing)':<50} {total - sum(bucket.values()):7.2f} s")
        for event in data["trace"]:
            content = " ".join(str(event["content"]).split())[:100]
            print(f"     {event['op']:<12} {event['action']:<12} {content}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1, help="runs per question and variant")
    p.add_argument("--questions", type=int, default=len(QUESTIONS), help="how many of the five questions")
    p.add_argument("--args", default="", help="extra `tcrag ask` arguments of the 'current' variant")
    p.add_argument("--variant", action="append", default=[], help="NAME=ARGS: another variant, e.g. before=...")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds before one run is killed")
    p.add_argument("--baseline", metavar="DIR", help="also run an earlier commit's package tree (a folder holding "
                   "tcrag_langgraph/, with tools/ and prompts/ linked inside it), interleaved, as 'baseline'")
    p.add_argument("--breakdown", action="store_true", help="time the parts of a run in this process")
    args = p.parse_args()
    print(machine())
    print(f"command: {TCRAG} ask QUESTION --json {args.args}".rstrip())
    (breakdown if args.breakdown else runs)(args)


if __name__ == "__main__":
    main()
