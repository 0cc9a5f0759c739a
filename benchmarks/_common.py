"""Shared helpers for the benchmark scripts: machine description, timing, text fixtures.

Benchmarks compare variants side by side in one process and report ratios, because absolute
times on a shared machine move with the load of other users (printed with every run).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Callable, Sequence

__all__ = ["machine", "timed", "median_time", "parser", "set_threads", "corpus_texts"]


def machine() -> str:
    """One line: CPU model, cores, RAM, load average, Python and torch threads."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = "?"
    try:
        with open("/proc/meminfo") as fh:
            kb = int(fh.readline().split()[1])
            ram = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    threads = ""
    try:
        import torch

        threads = f", torch threads {torch.get_num_threads()}"
    except ImportError:
        pass
    return (f"{model}, {os.cpu_count()} cores, {ram} RAM, load avg {load}, "
            f"Python {platform.python_version()}{threads}")


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median_time(fn: Callable[[], object], *, repeat: int) -> float:
    return statistics.median(timed(fn)[0] for _ in range(repeat))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0 = torch default). On a shared, loaded 2-core machine 1 is "
                        "several times faster than 2: spinning OpenMP threads wait for a busy core.")
    return p


def set_threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


def corpus_texts(limit: int | None = None) -> Sequence[str]:
    """Texts of the packaged PubMedQA-L chunks (real medical prose, offline)."""
    import gzip
    import json

    from tcrag_langgraph.tools.documents import PACKAGED_CORPUS, packaged_data_dir

    out = []
    with gzip.open(packaged_data_dir() / f"{PACKAGED_CORPUS}.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if "text" in row:
                out.append(row["text"])
            if limit is not None and len(out) >= limit:
                break
    return out
