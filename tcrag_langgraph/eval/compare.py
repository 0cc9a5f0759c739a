"""Before and after: each method's rows in two runs of the same questions that differ in a setting
(an option on and off, another sigma, another model), paired by question.

``tcrag summarize`` joins runs of *other* methods under *the same* settings into one table; this
is the other comparison, the one a change to a method needs ("accuracy not significantly lower than
before, paired"): the same method under two settings, on the questions both runs finished.

Example:
    >>> before = [{"method": "m", "id": str(i), "correct": i < 6, "llm_calls": 3, "total_tokens": 300}
    ...           for i in range(10)]
    >>> after = [{**r, "correct": r["id"] != "0", "llm_calls": 2} for r in before]
    >>> change = compare_rows(before, after)[0]
    >>> (change.method, change.n, change.right_before, change.right_after, change.test.only_second)
    ('m', 10, 6, 9, 4)
    >>> change.calls
    (3.0, 2.0)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .runner import QUESTION_SETTINGS, RESULTS_FILE, read_results, read_run_settings
from .significance import PairedTest, mcnemar

__all__ = ["MethodChange", "compare_rows", "compare_runs", "compare_markdown", "settings_changed"]

#: the settings that say which questions a run asked: two runs are compared only if these agree
#: (the draw's seed and size may differ: rows are paired on the questions both hold)
SAME_QUESTIONS = ("dataset", "split", "context", "long_answers", "fields", "task", "answer_index_base")


@dataclass(frozen=True)
class MethodChange:
    """One method before and after, on the ``n`` questions both runs finished; the pairs of numbers
    are (before, after) means per question."""

    method: str
    n: int
    right_before: int
    right_after: int
    test: PairedTest  # McNemar on the pairs: only_first = right before only, only_second = right after only
    calls: tuple[float, float]
    tokens: tuple[float, float]
    refused_repeats: tuple[float, float]


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    return sum(float(r.get(key) or 0) for r in rows) / len(rows)


def compare_rows(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[MethodChange]:
    """Each method found in both row lists, paired on the question ids both hold (in ``before``'s
    method order)."""
    first = {(r["method"], r["id"]): r for r in before}
    second = {(r["method"], r["id"]): r for r in after}
    changes = []
    for method in dict.fromkeys(r["method"] for r in before):
        ids = [i for (m, i) in first if m == method and (m, i) in second]
        if not ids:
            continue
        old = [first[(method, i)] for i in ids]
        new = [second[(method, i)] for i in ids]
        right_old = [bool(r.get("correct")) for r in old]
        right_new = [bool(r.get("correct")) for r in new]
        changes.append(MethodChange(
            method=method, n=len(ids), right_before=sum(right_old), right_after=sum(right_new),
            test=mcnemar(right_old, right_new),
            calls=(_mean(old, "llm_calls"), _mean(new, "llm_calls")),
            tokens=(_mean(old, "total_tokens"), _mean(new, "total_tokens")),
            refused_repeats=(_mean(old, "repeated_refused_calls"), _mean(new, "repeated_refused_calls"))))
    return changes


def _flat(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def settings_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, before, after) for every setting that differs, nested ones dotted (``config.sigma``);
    the question ids and the draw's size are left out (the rows are paired on the shared questions)."""
    old, new = _flat(before), _flat(after)
    return [(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k not in QUESTION_SETTINGS and old.get(k) != new.get(k)]


def compare_runs(before: str | os.PathLike[str], after: str | os.PathLike[str]
                 ) -> tuple[list[tuple[str, Any, Any]], list[MethodChange]]:
    """The settings that differ and each shared method's change, from two ``tcrag eval`` run folders.
    Runs that asked other questions (another dataset, split or question form), or share no method and
    question, are a ``ValueError``."""
    old_settings, old_rows = read_run_settings(before), read_results(Path(before) / RESULTS_FILE)
    new_settings, new_rows = read_run_settings(after), read_results(Path(after) / RESULTS_FILE)
    other = [k for k in SAME_QUESTIONS if old_settings.get(k) != new_settings.get(k)]
    if other:
        raise ValueError(f"{after} asked other questions than {before} ({', '.join(other)} differ)")
    changes = compare_rows(old_rows, new_rows)
    if not changes:
        raise ValueError(f"{before} and {after} share no method with a finished question")
    return settings_changed(old_settings, new_settings), changes


def compare_markdown(changed: Sequence[tuple[str, Any, Any]], changes: Sequence[MethodChange],
                     labels: Mapping[str, str] | None = None) -> str:
    """The settings that differ, then one row per method: right before and after, the questions only
    one of them got right (+ after only / - before only) with McNemar's exact p, and the costs."""
    labels = labels or {}
    lines = ["Settings that differ (before -> after):"]
    lines += [f"- {key}: {json.dumps(old)} -> {json.dumps(new)}" for key, old, new in changed] or ["- none"]
    lines += ["", "| Method | N | right before | right after | +/- | McNemar p | calls / q | total tokens / q "
              "| refused repeats / q |", "|---|---:|---:|---:|---|---:|---|---|---|"]
    for c in changes:
        lines.append(
            f"| {labels.get(c.method, c.method)} | {c.n} | {c.right_before} | {c.right_after} "
            f"| +{c.test.only_second}/-{c.test.only_first} | {c.test.p_value:.3g} "
            f"| {c.calls[0]:.2f} -> {c.calls[1]:.2f} | {c.tokens[0]:,.0f} -> {c.tokens[1]:,.0f} "
            f"| {c.refused_repeats[0]:.2f} -> {c.refused_repeats[1]:.2f} |")
    return "\n".join(lines)
