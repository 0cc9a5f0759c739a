"""Compare two `tcrag eval` runs of the same questions row by row: answers, halts and state values.

Used to show that a change of structure changed no behaviour (run the same `tcrag eval` command
before and after it, then):

    python scripts/compare_eval_runs.py runs/before runs/after

Prints each differing (method, question) with the fields that differ, and the counts; exits 1 if any
row differs or a row is missing from either run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

FIELDS = ("answer", "structured_answer", "parsed", "halt_reason", "validated", "state_value", "error")


def load(folder: Path) -> dict[tuple[str, str], dict]:
    rows = {}
    for line in (folder / "results.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[(row["method"], str(row["id"]))] = row
    return rows


def same(a, b, rel: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b)))
    return a == b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rel", type=float, default=0.0, help="relative tolerance on state values (default: exact)")
    args = parser.parse_args()
    before, after = load(args.before), load(args.after)
    missing = sorted(set(before) ^ set(after))
    differing = 0
    for key in sorted(set(before) & set(after)):
        diffs = [f"{f}: {before[key].get(f)!r} -> {after[key].get(f)!r}" for f in FIELDS
                 if not same(before[key].get(f), after[key].get(f), args.rel)]
        if diffs:
            differing += 1
            print(f"{key[0]} {key[1]}: " + "; ".join(diffs))
    for key in missing:
        print(f"{key[0]} {key[1]}: only in {'before' if key in before else 'after'}")
    methods = sorted({m for m, _ in set(before) & set(after)})
    print(f"{len(set(before) & set(after))} rows compared ({len(methods)} methods: {', '.join(methods)}); "
          f"{differing} differ; {len(missing)} in one run only")
    return 1 if differing or missing else 0


if __name__ == "__main__":
    sys.exit(main())
