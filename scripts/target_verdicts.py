"""The targets of issues 23 (item 4) and 24 (item 5), read off `tcrag eval` run folders: each one
MET or NOT MET, with the numbers and the paired test behind it.

    .venv/bin/python scripts/target_verdicts.py /work/runs/test15 --tcrag tcrag-answer

The rows are merged as `tcrag summarize` merges them (only the questions every method finished).
"TC-RAG" is the method given by ``--tcrag`` (the state value chosen on trainval). A comparison says
whether McNemar's exact test on the shared questions calls the difference real (p < 0.05). A method
missing from the runs makes its targets "not measured". Exits 0 whatever the verdicts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tcrag_langgraph.eval.runner import merge_runs  # noqa: E402
from tcrag_langgraph.eval.summary import summarize, table_rows
from tcrag_langgraph.eval.significance import MAJORITY, mcnemar  # noqa: E402


def _correct_by_question(rows, method: str) -> dict[str, bool]:
    return {str(r["id"]): bool(r.get("correct")) for r in rows if r["method"] == method and r.get("correct") is not None}


def _paired(rows, a: str, b: str) -> str:
    first, second = _correct_by_question(rows, a), _correct_by_question(rows, b)
    shared = sorted(set(first) & set(second))
    test = mcnemar([first[q] for q in shared], [second[q] for q in shared])
    real = "a real difference" if test.p_value < 0.05 else "not a real difference"
    return f"+{test.only_first}/-{test.only_second} on {test.n} shared, McNemar p={test.p_value:.3g}: {real}"


def _verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def verdicts(summary: list[Mapping[str, Any]], rows, *, tcrag: str, ablation: str, sr_rag: str,
             react: str) -> list[str]:
    """One line per target."""
    by = {s["method"]: s for s in summary}
    majority = next((s for s in summary if str(s["method"]).startswith(MAJORITY)), None)
    lines: list[str] = []
    t: Optional[Mapping[str, Any]] = by.get(tcrag)
    if t is None:
        return [f"{tcrag}: not in these runs; nothing to judge"]
    pct = lambda s: 100 * (s.get("accuracy") or 0.0)  # noqa: E731
    lines.append(f"TC-RAG = {tcrag}, {t['n']} questions, EM {pct(t):.1f} % (95 % CI "
                 f"{100 * t['accuracy_ci'][0]:.1f}-{100 * t['accuracy_ci'][1]:.1f})")
    for name, other, issues in ((sr_rag, by.get(sr_rag), "23, 24"), (ablation, by.get(ablation), "23")):
        if other is None:
            lines.append(f"[issue {issues}] TC-RAG >= {name}: not measured ({name} not in the runs)")
            continue
        lines.append(f"[issue {issues}] TC-RAG >= {name}: {_verdict(pct(t) >= pct(other))} "
                     f"({pct(t):.1f} vs {pct(other):.1f}; {_paired(rows, tcrag, name)})")
    if majority is not None:
        lines.append(f"[issue 24] TC-RAG above the majority row ({majority.get('label') or majority['method']}): "
                     f"{_verdict(pct(t) > pct(majority))} ({pct(t):.1f} vs {pct(majority):.1f})")
    av, au = t.get("accuracy_validated"), t.get("accuracy_unvalidated")
    if av is None or au is None:
        lines.append("[issues 23, 24] validated against unvalidated: not measured (no validated or no unvalidated answer)")
    else:
        gap = 100 * (av - au)
        lines.append(f"[issue 24] validated answers right more often than unvalidated: {_verdict(gap > 0)} "
                     f"({100 * av:.1f} vs {100 * au:.1f} %, {t['validated']} of {t['n']} validated)")
        lines.append(f"[issue 23] ... by at least 10 points: {_verdict(gap >= 10)} ({gap:+.1f} points)")
    for name, limit, issue in ((react, 0.7, "24"), (ablation, 0.7, "23")):
        other = by.get(name)
        if other is None or not other.get("avg_total_tokens"):
            lines.append(f"[issue {issue}] TC-RAG tokens <= {limit}x {name}'s: not measured")
            continue
        ratio = t["avg_total_tokens"] / other["avg_total_tokens"]
        lines.append(f"[issue {issue}] TC-RAG tokens <= {limit}x {name}'s: {_verdict(ratio <= limit)} "
                     f"({t['avg_total_tokens']:.0f} vs {other['avg_total_tokens']:.0f} per question, {ratio:.2f}x)")
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="tcrag eval run folders (same questions and settings)")
    parser.add_argument("--tcrag", default="tcrag-answer", help="the TC-RAG method whose targets are judged")
    parser.add_argument("--ablation", default="wo-monitor")
    parser.add_argument("--sr-rag", default="sr-rag")
    parser.add_argument("--react", default="react")
    args = parser.parse_args(argv)
    rows = merge_runs(args.runs)
    summary = summarize(table_rows(rows))
    for line in verdicts(summary, rows, tcrag=args.tcrag, ablation=args.ablation, sr_rag=args.sr_rag,
                         react=args.react):
        print(line)


if __name__ == "__main__":
    main()
