"""What a table can claim: confidence intervals, paired tests, the majority answer, answer counts.

* :func:`accuracy_ci` - a percentile bootstrap 95% interval of an accuracy over questions
  (``scipy.stats.bootstrap``, seeded: the same rows give the same interval);
* :func:`mcnemar` - McNemar's exact test of two methods on the same questions (a two-sided binomial
  test on the questions only one of them got right, ``scipy.stats.binomtest``);
* :func:`majority_rows` - the rows of a method that always gives the most common gold answer of the
  evaluated questions: what a constant answer scores (a reference row, not a method to tune);
* :func:`answer_counts` - how often each answer was given (yes / no / maybe, option letters,
  unparseable), to see a method that answers the same thing to everything.

Example:
    >>> mcnemar([True] * 10 + [False] * 5, [False] * 10 + [False] * 5)
    PairedTest(n=15, only_first=10, only_second=0, p_value=0.001953125)
    >>> lo, hi = accuracy_ci([True] * 50 + [False] * 50)
    >>> lo < 0.5 < hi and hi - lo < 0.25
    True
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

__all__ = ["PairedTest", "MAJORITY", "accuracy_ci", "mcnemar", "majority_rows", "answer_counts", "gold_answer"]

#: the method name of the majority-answer rows
MAJORITY = "majority"


@dataclass(frozen=True)
class PairedTest:
    """McNemar's exact test on the questions two methods share."""

    n: int  # questions both answered (the pairs)
    only_first: int  # right by the first method only
    only_second: int  # right by the second method only
    p_value: float


def accuracy_ci(correct: Sequence[bool], *, confidence: float = 0.95, n_resamples: int = 2000,
                seed: int = 0) -> Optional[tuple[float, float]]:
    """Percentile bootstrap interval of the share of ``correct`` (None for no questions)."""
    values = np.asarray([float(bool(c)) for c in correct])
    if values.size == 0:
        return None
    if values.min() == values.max():  # every resample has the same mean
        return float(values[0]), float(values[0])
    from scipy.stats import bootstrap

    result = bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                       method="percentile", random_state=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def mcnemar(first: Sequence[bool], second: Sequence[bool]) -> PairedTest:
    """McNemar's exact test: could the questions only one method got right have split this way by chance?"""
    if len(first) != len(second):
        raise ValueError("the two methods must be paired on the same questions")
    only_first = sum(1 for a, b in zip(first, second) if a and not b)
    only_second = sum(1 for a, b in zip(first, second) if b and not a)
    discordant = only_first + only_second
    if discordant == 0:
        p_value = 1.0
    else:
        from scipy.stats import binomtest

        p_value = float(binomtest(only_first, discordant, 0.5, alternative="two-sided").pvalue)
    return PairedTest(n=len(first), only_first=only_first, only_second=only_second, p_value=p_value)


def gold_answer(row: Mapping[str, Any]) -> Optional[str]:
    """A closed question's gold answer in the form ``parsed`` takes (``yes``; letters ``AC``)."""
    gold = row.get("gold")
    if not gold:
        return None
    if row.get("task") == "mcq":
        return "".join(sorted(str(g) for g in gold))
    return str(gold[0])


def majority_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows of :data:`MAJORITY`: every closed question in ``rows`` (once each) answered with the most
    common gold answer among them (ties: the first in sorted order). Costs are zero."""
    questions: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if row.get("task") in ("mcq", "yesno") and row.get("method") != MAJORITY:
            questions.setdefault(str(row["id"]), row)
    golds = Counter(g for g in (gold_answer(r) for r in questions.values()) if g is not None)
    if not golds:
        return []
    top = max(golds.values())
    answer = sorted(g for g, c in golds.items() if c == top)[0]
    return [{"method": MAJORITY, "id": qid, "task": row["task"], "gold": row["gold"], "answer": answer,
             "structured_answer": None, "parsed": answer, "correct": gold_answer(row) == answer, "validated": False,
             "halt_reason": "answered", "state_value": None, "error": None}
            for qid, row in questions.items()]


def answer_counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How often each parsed answer was given (most frequent first; ``unparseable`` for none)."""
    counts = Counter("unparseable" if r.get("parsed") is None else str(r["parsed"]) for r in rows)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
