"""Summarise an evaluation's rows: one row per method with its accuracy and interval, paired tests
against SR-RAG and TC-RAG, costs, answer counts and halt reasons; written as Markdown, CSV and a plot
of score against cost.

Example:
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> from tcrag_langgraph.eval.datasets import QARecord
    >>> from tcrag_langgraph.eval.runner import run_evaluation
    >>> from tcrag_langgraph.methods.registry import build_methods
    >>> recs = [QARecord("q1", "Is aspirin an NSAID?", "yesno", ("yes",))]
    >>> rows = run_evaluation(recs, build_methods(["base"], model=FakeListChatModel(responses=["Yes."])), progress=False)
    >>> summarize(rows)[0]["accuracy"]
    1.0
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from .efficiency import mean_costs
from .significance import MAJORITY, PairedTest, accuracy_ci, answer_counts, majority_rows, mcnemar

__all__ = ["REFERENCES", "summarize", "table_rows", "summary_markdown", "write_summary", "plot_accuracy_vs_cost"]


_OPEN = ("em", "f1", "bleu1", "bleu4", "rouge_l_recall")


def _mean(values: Iterable[float]) -> Optional[float]:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def _answered(row: Mapping[str, Any]) -> bool:
    answer = row.get("answer")
    return isinstance(answer, str) and bool(answer.strip())


#: the methods every other is tested against (McNemar), when they are in the table
REFERENCES = (("sr_rag", "SR-RAG", ("sr-rag",)), ("tcrag", "TC-RAG", ("tcrag-cppl", "tcrag-uct")))


def table_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows every printed table is made of: the methods' and the majority answer's
    (:func:`~tcrag_langgraph.eval.significance.majority_rows`)."""
    return [*rows, *majority_rows(rows)]


def summarize(rows: Sequence[Mapping[str, Any]], *, labels: Optional[Mapping[str, str]] = None) -> list[dict[str, Any]]:
    """One summary row per method (in first-seen order).

    Each accuracy has a bootstrap 95% interval (``accuracy_ci``), each method a paired McNemar test
    against SR-RAG and against TC-RAG where they are in the rows (``vs_sr_rag``, ``vs_tcrag``: on
    the questions both answered), and its answer distribution (``answer_counts``).

    ``accuracy`` is over every choice / yes-no question (unparseable answers count as wrong and
    are reported in ``unparseable``; so do abstentions, counted in ``abstained``); ``coverage`` is
    the share of questions with an answer and ``accuracy_answered`` the accuracy over those
    (choice / yes-no). Open-answer metrics are means over open questions. Costs
    are means per question; ``backtrack_rate`` / ``summary_rate`` are the shares of questions
    with at least one Backtrack / Summary (Table 5's probabilities).
    """
    order = list(dict.fromkeys(r["method"] for r in rows))
    closed_by_method = {m: {str(r["id"]): bool(r.get("correct")) for r in rows
                            if r["method"] == m and r["task"] in ("mcq", "yesno")} for m in order}
    references = {key: (label, next((m for m in names if closed_by_method.get(m)), None))
                  for key, label, names in REFERENCES}
    out = []
    for method in order:
        mine = [r for r in rows if r["method"] == method]
        closed = [r for r in mine if r["task"] in ("mcq", "yesno")]
        opened = [r for r in mine if r["task"] == "open"]
        summary: dict[str, Any] = {
            "method": method,
            "label": (labels or {}).get(method) or (f"Majority answer ({mine[0]['answer']})" if method == MAJORITY
                                                    else method),
            "n": len(mine),
            "n_closed": len(closed),
            "correct": sum(bool(r.get("correct")) for r in closed),
            "accuracy": _mean(float(bool(r.get("correct"))) for r in closed),
            "unparseable": sum(r.get("parsed") is None for r in closed),
            # Abstentions (CRP-RAG) and failed runs have no answer: wrong in ``accuracy``, and
            # reported apart as coverage (answered / all) and accuracy over the answered ones.
            "abstained": sum(r.get("halt_reason") == "abstained" for r in mine),
            "coverage": _mean(float(_answered(r)) for r in mine),
            "accuracy_answered": _mean(float(bool(r.get("correct"))) for r in closed if _answered(r)),
            "validated_rate": _mean(float(bool(r.get("validated"))) for r in mine),
            # Issue 11: is the monitor's "validated" worth anything? Accuracy on each side of it.
            "validated": sum(bool(r.get("validated")) for r in mine),
            "accuracy_validated": _mean(float(bool(r.get("correct"))) for r in closed if r.get("validated")),
            "accuracy_unvalidated": _mean(float(bool(r.get("correct"))) for r in closed if not r.get("validated")),
            # Identical tool calls run again (from the trace) and refused by the graph (not run).
            "repeated_executed_calls": sum(int(r.get("repeated_executed_calls") or 0) for r in mine),
            "repeated_refused_calls": sum(int(r.get("repeated_refused_calls") or 0) for r in mine),
            "errors": sum(1 for r in mine if r.get("halt_reason") in ("exception", "model_error", "scorer_error")),
            "backtrack_rate": _mean(float((r.get("backtracks") or 0) > 0) for r in mine),
            "summary_rate": _mean(float((r.get("summaries") or 0) > 0) for r in mine),
        }
        summary["accuracy_ci"] = accuracy_ci([bool(r.get("correct")) for r in closed])
        summary["answer_counts"] = answer_counts(closed)
        for key, (_, reference) in references.items():
            if reference is not None and reference != method and closed_by_method[method]:
                shared = sorted(set(closed_by_method[method]) & set(closed_by_method[reference]))
                summary[f"vs_{key}"] = mcnemar([closed_by_method[method][q] for q in shared],
                                               [closed_by_method[reference][q] for q in shared])
        for key in _OPEN:
            summary[key] = _mean(float(r[key]) for r in opened if r.get(key) is not None)
        summary.update({f"avg_{k}": v for k, v in mean_costs(mine).items()})
        if any("poisoned" in r for r in mine):
            summary["poisoned_rate"] = _mean(float(bool(r.get("poisoned"))) for r in mine)
        halts: dict[str, int] = {}
        for r in mine:
            halts[str(r.get("halt_reason"))] = halts.get(str(r.get("halt_reason")), 0) + 1
        summary["halt_reasons"] = halts
        summary["code_versions"] = len({r["code_version"] for r in mine if r.get("code_version")})
        out.append(summary)
    return out


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def _num(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _ci(value: Optional[tuple[float, float]]) -> str:
    return "-" if value is None else f"{100 * value[0]:.1f}-{100 * value[1]:.1f}"


def _paired(test: Optional[PairedTest]) -> str:
    """``+a/-b p`` : questions only this method / only the reference got right, McNemar's exact p."""
    return "-" if test is None else f"+{test.only_first}/-{test.only_second} p={test.p_value:.3g}"


def _counts(counts: Optional[Mapping[str, int]], top: int = 5) -> str:
    if not counts:
        return "-"
    items = list(counts.items())
    shown = " ".join(f"{answer}:{n}" for answer, n in items[:top])
    return shown + (f" (+{len(items) - top} more)" if len(items) > top else "")


def _columns(summary: Sequence[Mapping[str, Any]]) -> list[tuple[str, Callable[[Mapping[str, Any]], str]]]:
    cols: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        ("Method", lambda s: str(s["label"])),
        ("N", lambda s: str(s["n"])),
    ]
    if any(s["n_closed"] for s in summary):
        cols += [
            ("EM (%)", lambda s: _pct(s["accuracy"])),
            ("EM 95% CI", lambda s: _ci(s.get("accuracy_ci"))),
        ]
        for key, label, _ in REFERENCES:
            if any(f"vs_{key}" in s for s in summary):
                cols.append((f"vs {label} (+/- McNemar p)", lambda s, key=key: _paired(s.get(f"vs_{key}"))))
        cols += [
            ("Answers", lambda s: _counts(s.get("answer_counts"))),
            ("Unparseable", lambda s: str(s["unparseable"])),
        ]
        if any((s.get("coverage") or 0.0) < 1.0 for s in summary):  # some method abstained or failed
            cols += [
                ("Coverage (%)", lambda s: _pct(s.get("coverage"))),
                ("EM answered (%)", lambda s: _pct(s.get("accuracy_answered"))),
            ]
    if any(s.get("rouge_l_recall") is not None for s in summary):
        cols += [
            ("EM-open (%)", lambda s: _pct(s["em"])),
            ("F1 (%)", lambda s: _pct(s["f1"])),
            ("BLEU-1 (%)", lambda s: _pct(s["bleu1"])),
            ("BLEU-4 (%)", lambda s: _pct(s["bleu4"])),
            ("ROUGE-L-R (%)", lambda s: _pct(s["rouge_l_recall"])),
        ]
    cols += [
        ("Validated", lambda s: f"{s.get('validated', 0)}/{s['n']}"),
    ]
    if any(s["n_closed"] for s in summary):
        cols += [
            ("EM validated (%)", lambda s: _pct(s.get("accuracy_validated"))),
            ("EM unvalidated (%)", lambda s: _pct(s.get("accuracy_unvalidated"))),
        ]
    cols += [
        ("Avg. Interactions", lambda s: _num(s["avg_llm_calls"])),
    ]
    if any(s.get("avg_cached_calls") for s in summary):  # tcrag eval --reply-cache: time includes replayed replies
        cols.append(("Avg. Replayed Calls", lambda s: _num(s.get("avg_cached_calls", 0.0))))
    cols += [
        ("Avg. Retrievals", lambda s: _num(s["avg_retrievals"])),
        ("Repeated Calls Run", lambda s: str(s.get("repeated_executed_calls", 0))),
        ("Repeated Calls Refused", lambda s: str(s.get("repeated_refused_calls", 0))),
        ("Avg. Time (s)", lambda s: _num(s["avg_wall_time_s"])),
        ("Avg. Completion Tokens", lambda s: _num(s["avg_completion_tokens"])),
        ("Avg. Total Tokens", lambda s: _num(s["avg_total_tokens"])),
        ("Backtrack Prob. (%)", lambda s: _pct(s["backtrack_rate"])),
        ("Summary Prob. (%)", lambda s: _pct(s["summary_rate"])),
    ]
    if any("poisoned_rate" in s for s in summary):
        cols.append(("Attacked (%)", lambda s: _pct(s.get("poisoned_rate"))))
    cols.append(("Errors", lambda s: str(s["errors"])))
    if any(s.get("code_versions", 0) > 1 for s in summary):  # rows of one method made by different code
        cols.append(("Code Versions", lambda s: str(s.get("code_versions", 0))))
    return cols


def summary_markdown(summary: Sequence[Mapping[str, Any]]) -> str:
    """The summary as a Markdown table (percentages for scores and rates)."""
    cols = _columns(summary)
    lines = ["| " + " | ".join(name for name, _ in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for s in summary:
        lines.append("| " + " | ".join(fmt(s) for _, fmt in cols) + " |")
    return "\n".join(lines) + "\n"


def _csv_value(value: Any) -> Any:
    if isinstance(value, PairedTest):
        return json.dumps(dataclasses.asdict(value))
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return value


def _summary_csv(summary: Sequence[Mapping[str, Any]]) -> str:
    # Every row's keys, in first-seen order: a reference method has no test against itself (SR-RAG
    # has no ``vs_sr_rag``), and a column taken from the first row alone would drop it for all rows.
    keys = [k for k in dict.fromkeys(k for s in summary for k in s) if k != "halt_reasons"]
    keys = keys + ["halt_reasons"] if summary else []
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for s in summary:
        writer.writerow({k: _csv_value(s.get(k)) for k in keys})
    return buf.getvalue()


def plot_accuracy_vs_cost(summary: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """PNG: score against mean total tokens and against mean wall time, one point per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = "accuracy" if any(s.get("accuracy") is not None for s in summary) else "rouge_l_recall"
    label = "EM accuracy (%)" if metric == "accuracy" else "ROUGE-L recall (%)"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, cost, xlabel in (
        (axes[0], "avg_total_tokens", "mean tokens per question (prompt + completion)"),
        (axes[1], "avg_wall_time_s", "mean wall time per question (s)"),
    ):
        for i, s in enumerate(summary):
            y = s.get(metric)
            if y is None:
                continue
            ax.scatter(s[cost], 100 * y)
            # Staggered label offsets keep methods with equal scores readable.
            ax.annotate(str(s["label"]), (s[cost], 100 * y), textcoords="offset points",
                        xytext=(5, 5 - 11 * (i % 3)), fontsize=8)
        ax.set_ylim(-5, 105)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    fig.suptitle("Score against cost")
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_summary(summary: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike[str], *, plot: bool = True) -> dict[str, Path]:
    """Write ``summary.md``, ``summary.csv`` and ``accuracy_vs_cost.png`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "summary.md", "csv": out / "summary.csv"}
    paths["markdown"].write_text(summary_markdown(summary), encoding="utf-8")
    paths["csv"].write_text(_summary_csv(summary), encoding="utf-8")
    if plot and summary:
        paths["plot"] = plot_accuracy_vs_cost(summary, out / "accuracy_vs_cost.png")
    return paths
