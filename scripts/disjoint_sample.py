"""Write a calibration sample disjoint from an earlier one, as JSONL that ``tcrag calibrate
--dataset FILE`` reads with the same prompts and allowed answers as the named dataset (used for the
second sample of benchmarks/RESULTS.md section 15).

    python scripts/disjoint_sample.py --out sample2.jsonl   # pubmedqa trainval: 40 not in seed 0's 40
"""

from __future__ import annotations

import argparse
import json
import random

from tcrag_langgraph.eval.datasets import load_dataset, sample_records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="pubmedqa")
    p.add_argument("--split", default="trainval")
    p.add_argument("--first-limit", type=int, default=40, help="the earlier sample: tcrag calibrate --limit")
    p.add_argument("--first-seed", type=int, default=0, help="the earlier sample: tcrag calibrate --seed")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    records = load_dataset(args.dataset, split=args.split, with_context=True)
    used = {r.id for r in sample_records(records, limit=args.first_limit, seed=args.first_seed)}
    picked = random.Random(args.seed).sample([r for r in records if r.id not in used], args.limit)
    with open(args.out, "w", encoding="utf-8") as out:
        for r in picked:
            out.write(json.dumps({"id": r.id, "question": r.question, "answer": r.answers[0], "context": r.context})
                      + "\n")
    print(f"{len(picked)} questions, none of the {len(used)} of the first sample: {args.out}")


if __name__ == "__main__":
    main()
