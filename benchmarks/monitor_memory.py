"""Peak memory and time of ``tcrag ask`` with a GGUF model under each state monitor, side by side
(issue 37, item 4: one copy of the weights). Each mode runs in its own process under
``/usr/bin/time``; the same question, budgets and greedy decoding for every mode.

    python benchmarks/monitor_memory.py --model /path/qwen2.5-coder-1.5b-instruct.gguf [--runs 1]

Modes: ``f16`` (``--scorer f16``: cppl over the float16 re-encoding, a second copy of the weights),
``native`` (the default for a GGUF since this measurement: cppl over the quantized weights llama.cpp
generates with), ``consistency`` (``--metric consistency``: 5 resampled answers, no log-probs) and ``off``
(``--no-state-monitor``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

MODES = {
    "f16": ["--scorer", "f16"],
    "native": [],
    "consistency": ["--metric", "consistency"],
    "off": ["--no-state-monitor"],
}
Q = "Which vitamin deficiency causes scurvy?"


def run(model: str, extra: list[str], threads: int) -> tuple[float, float, str]:
    tcrag = str(Path(sys.executable).with_name("tcrag"))
    cmd = ["/usr/bin/time", "-f", "PEAK_KB=%M WALL_S=%e", tcrag, "ask", Q, "--model", model, "--no-tools",
           "--max-steps", "2", "--max-new-tokens", "48", "--temperature", "0", "--threads", str(threads), "--json",
           *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    found = re.search(r"PEAK_KB=(\d+) WALL_S=([\d.]+)", done.stderr)
    if not found:
        raise SystemExit(f"no measurement: {done.stderr[-2000:]}")
    answer = re.search(r'"answer": (.*),', done.stdout)
    return int(found.group(1)) / 1024 / 1024, float(found.group(2)), answer.group(1)[:60] if answer else "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = p.parse_args()
    print(f"{'mode':<12} {'peak RSS GB (median)':>20} {'wall s (median)':>16}  answer")
    for mode in args.modes:
        results = [run(args.model, MODES[mode], args.threads) for _ in range(args.runs)]
        print(f"{mode:<12} {statistics.median(r[0] for r in results):>20.2f} "
              f"{statistics.median(r[1] for r in results):>16.1f}  {results[-1][2]}", flush=True)


if __name__ == "__main__":
    main()
