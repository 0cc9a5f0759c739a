"""``answer_prob`` of a finished run's answers, as the monitor computes it and summed over case forms.

The monitor weighs each allowed answer by the probability of ``Conclusion: <answer>`` as the answer
format declares it (``yes``). Qwen2.5-Coder puts most of its mass after ``Conclusion:`` on the
capitalised forms (`` Yes`` / `` No``), and lower-case `` no`` is penalised more than `` No``, so this
script measures whether summing each answer over its forms (``yes`` + ``Yes``; ``B`` + ``b``) ranks
right and wrong answers better (AUROC of both on the same rows; the monitor's rule was left as it is
because it did not, docs/evaluation.md):

    python scripts/answer_forms.py --model /work/models/qwen2.5-coder-1.5b-instruct.gguf \\
        --run runs/cmp15b --method wo-monitor --dataset pubmedqa --split trainval

``--run`` is a ``tcrag eval`` / ``tcrag calibrate`` folder; the evidence each answer stood on comes
from its rows, the question text from the dataset (``--context`` if the run had the passage).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tcrag_langgraph.core import answer_format
from tcrag_langgraph.eval.calibration import auroc_interval, state_value_auroc
from tcrag_langgraph.eval.datasets import answer_format_for, format_question, load_dataset
from tcrag_langgraph.models.resolve import resolve_chat_model
from tcrag_langgraph.monitor.own_model import scorer_for_model
from tcrag_langgraph.monitor.state_values import choice_value, evidence_context


def forms(choice: str) -> list[str]:
    """The ways a Conclusion can write ``choice``: as declared, capitalised, lower-case."""
    return list(dict.fromkeys([choice, choice[:1].upper() + choice[1:], choice.lower()]))


def logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the GGUF (or model folder) the run was made with")
    ap.add_argument("--run", required=True, type=Path, help="folder with results.jsonl")
    ap.add_argument("--method", default="wo-monitor")
    ap.add_argument("--dataset", default="pubmedqa")
    ap.add_argument("--split", default="trainval")
    ap.add_argument("--context", action="store_true", help="the run had the passage in the question")
    ap.add_argument("--limit", type=int, default=None, help="the first N answers only (a quick look)")
    args = ap.parse_args()

    records = {r.id: r for r in load_dataset(args.dataset, split=args.split)}
    rows = [json.loads(line) for line in (args.run / "results.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["method"] == args.method and r.get("answer") and r["id"] in records][:args.limit]
    scorer = scorer_for_model(resolve_chat_model(args.model))
    declared, summed, right = [], [], []
    for row in rows:
        record = records[row["id"]]
        fmt = answer_format_for(record)
        chosen = answer_format.fit(fmt, row["answer"]) if isinstance(fmt, tuple) else None
        if chosen is None:
            continue  # no list of allowed answers, or an answer outside it: the monitor has no value either
        context = evidence_context(format_question(record, include_context=args.context), row.get("evidence") or [])
        logprob = {(c, f): sum(scorer.token_logprobs(context, f"Conclusion: {f}")) for c in fmt for f in forms(c)}
        declared.append(choice_value({c: logprob[(c, c)] for c in fmt}, chosen))
        summed.append(choice_value({c: logsumexp([logprob[(c, f)] for f in forms(c)]) for c in fmt}, chosen))
        right.append(bool(row.get("correct")))
        print(json.dumps({"id": row["id"], "correct": right[-1], "answer": chosen,
                          "declared": round(declared[-1], 4), "summed": round(summed[-1], 4)}), flush=True)
    n_right = sum(right)
    print(f"{len(right)} answers, {n_right} right")
    for name, values in (("declared form (the monitor's rule)", declared), ("summed over case forms", summed)):
        auc = state_value_auroc(values, right)
        low, high = auroc_interval(auc, n_right, len(right) - n_right)
        print(f"AUROC {name}: {auc:.3f} ({low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()
