"""How well a state value ranks a method's answers, and what the answers it validated are worth
(``tcrag eval``, ``tcrag summarize``): risk-coverage curves, their area (AURC), and the error rate
among validated answers with its interval.

A **risk-coverage curve** orders one method's answers by a state value (lower = more confident),
accepts the most confident ``k`` of its ``N`` questions for every ``k`` and plots the share of the
accepted answers that are wrong (the *risk*) against ``k / N`` (the *coverage*). Questions without
that value (no answer, or one outside the allowed answers) come last: they are never accepted
before an answer with a value. **AURC** is the mean risk over the ``N`` coverages: lower is better;
a value that ranks at random scores about the method's error rate ``1 - acc``, a perfect one about
``1 - acc + acc * ln(acc)`` (0.094 at 60 % accuracy, against 0.4 at random). The baselines get curves from the same values read off their own replies (run them with
``--record-generation-values``), so TC-RAG's monitor is compared with the confidence every other
method's answers carry anyway.

**Validated answers**: per method, how many it validated (coverage), how many of those were wrong
(the error rate, with its Clopper-Pearson 95 % interval), beside its overall accuracy: the numbers
a stated ``risk`` promises (docs/monitor.md).

Example:
    >>> rows = [{"method": "m", "correct": c, "generation_values": {"gen_answer_prob": v}, "validated": v < 0.3}
    ...         for v, c in [(0.1, True), (0.2, True), (0.5, False), (0.9, True)]]
    >>> curves = risk_coverage(rows)
    >>> [round(r, 3) for _, r in curves["m"]["gen_answer_prob"]]
    [0.0, 0.0, 0.333, 0.25]
    >>> round(aurc(curves["m"]["gen_answer_prob"]), 4)
    0.1458
    >>> validated_errors(rows)["m"]["errors"], validated_errors(rows)["m"]["validated"]
    (0, 2)
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

__all__ = ["risk_coverage", "aurc", "validated_errors", "risk_coverage_markdown", "plot_risk_coverage"]

Curve = list[tuple[float, float]]


def risk_coverage(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Curve]]:
    """Per method, per generation value its answers carry: the curve ``[(coverage, risk), ...]``, one
    point per question. A row counts as wrong unless ``correct`` is true."""
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    out: dict[str, dict[str, Curve]] = {}
    for method, own in by_method.items():
        names = sorted({k for r in own for k, v in (r.get("generation_values") or {}).items()
                        if isinstance(v, (int, float)) and math.isfinite(v)})
        curves: dict[str, Curve] = {}
        for name in names:
            def key(row: Mapping[str, Any], name: str = name) -> float:
                value = (row.get("generation_values") or {}).get(name)
                return value if isinstance(value, (int, float)) and math.isfinite(value) else math.inf
            ordered = sorted(own, key=key)  # stable: equal values keep the run's order
            wrong, curve = 0, []
            for k, row in enumerate(ordered, start=1):
                wrong += not row.get("correct")
                curve.append((k / len(ordered), wrong / k))
            curves[name] = curve
        out[method] = curves
    return out


def aurc(curve: Curve) -> float:
    """The area under a risk-coverage curve: the mean risk over its coverages."""
    if not curve:
        raise ValueError("an empty curve has no area")
    return sum(risk for _, risk in curve) / len(curve)


def _clopper_pearson(errors: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    tail = (1 - level) / 2
    low = 0.0 if errors == 0 else float(beta.ppf(tail, errors, n - errors + 1))
    high = 1.0 if errors == n else float(beta.ppf(1 - tail, errors + 1, n - errors))
    return low, high


def validated_errors(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method: questions, accuracy, validated answers, coverage, errors among them, their error
    rate and its 95 % interval (None without a validated answer)."""
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for method, own in by_method.items():
        accepted = [r for r in own if r.get("validated")]
        errors = sum(not r.get("correct") for r in accepted)
        out[method] = {
            "questions": len(own), "accuracy": sum(bool(r.get("correct")) for r in own) / len(own),
            "validated": len(accepted), "coverage": len(accepted) / len(own), "errors": errors,
            "error_rate": errors / len(accepted) if accepted else None,
            "error_interval": _clopper_pearson(errors, len(accepted)) if accepted else None,
        }
    return out


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def risk_coverage_markdown(rows: Sequence[Mapping[str, Any]], labels: Optional[Mapping[str, str]] = None) -> str:
    """Two Markdown tables: AURC per method and state value, and the validated answers per method
    (empty string when the rows carry neither)."""
    labels = labels or {}
    curves = risk_coverage(rows)
    names = sorted({name for per in curves.values() for name in per})
    parts = []
    if names:
        lines = ["| method | " + " | ".join(f"AURC {n}" for n in names) + " |",
                 "|---|" + "---:|" * len(names)]
        for method, per in curves.items():
            lines.append(f"| {labels.get(method, method)} | "
                         + " | ".join(f"{aurc(per[n]):.3f}" if n in per else "-" for n in names) + " |")
        parts.append("\n".join(lines))
    found = validated_errors(rows)
    if any(v["validated"] for v in found.values()):
        lines = ["| method | questions | accuracy % | validated | coverage % | errors | error rate % (95 % CI) | "
                 "accuracy on validated % |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for method, v in found.items():
            interval = v["error_interval"]
            rate = "-" if interval is None else f"{_pct(v['error_rate'])} ({_pct(interval[0])}-{_pct(interval[1])})"
            on_validated = None if v["error_rate"] is None else 1 - v["error_rate"]
            lines.append(f"| {labels.get(method, method)} | {v['questions']} | {_pct(v['accuracy'])} | {v['validated']} "
                         f"| {_pct(v['coverage'])} | {v['errors']} | {rate} | {_pct(on_validated)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def plot_risk_coverage(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *,
                       labels: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The curves in one figure (one line per method and state value, each method's validated answers
    as a point); None when the rows carry no generation values."""
    curves = risk_coverage(rows)
    if not any(curves.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"gen_answer_prob": "-", "gen_combined": "-.", "gen_cppl": "--", "gen_entropy": ":"}
    for i, (method, per) in enumerate(curves.items()):
        color = f"C{i}"
        for name, curve in per.items():
            ax.plot([c for c, _ in curve], [r for _, r in curve], styles.get(name, "-"), color=color,
                    label=f"{labels.get(method, method)}: {name} (AURC {aurc(curve):.3f})", linewidth=1.2)
    for i, (method, v) in enumerate(validated_errors(rows).items()):
        if v["validated"]:
            ax.plot([v["coverage"]], [v["error_rate"]], "o", color=f"C{i}", markersize=7,
                    label=f"{labels.get(method, method)}: validated answers")
    ax.set_xlabel("coverage (share of questions answered, most confident first)")
    ax.set_ylabel("risk (share of those answers that are wrong)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    target = Path(path)
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target
