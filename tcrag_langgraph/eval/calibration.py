"""Choosing sigma from data: does the state value separate right from wrong answers?

TC-RAG halts and accepts an answer when the state value (``cppl`` or ``uct``) falls *below*
sigma, so a low value should mean a correct answer. Given the final state values of a dev split
and whether each answer was correct, this module reports

* the AUROC of ``-value`` as a predictor of correctness (scikit-learn ``roc_auc_score``): 1.0 means
  every correct answer had a lower value than every wrong one, 0.5 means no signal;
* a proposed sigma. Candidates are the midpoints between consecutive distinct values (plus one
  below the minimum and one above the maximum), and "accept" means ``value < sigma``:

  - ``rule="youden"`` (default) maximises Youden's J = TPR - FPR, where TPR is the share of
    correct answers accepted and FPR the share of wrong answers accepted;
  - ``rule="accuracy"`` maximises the accuracy of the accept/reject decision,
    ``(correct accepted + wrong rejected) / n``.

  Ties go to the smallest sigma (the stricter monitor: more retrieval rather than an early stop).

Example:
    >>> r = calibrate([3.0, 4.0, 9.0, 12.0], [True, True, False, False])
    >>> r.auroc, r.sigma
    (1.0, 6.5)

What ``tcrag calibrate`` measures here is stored by :mod:`tcrag_langgraph.monitor.calibration`
(the runtime store a graph reads for ``sigma="auto"``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional, Sequence

import numpy as np

from ..monitor.calibration import Calibration

__all__ = [
    "confidence_fit",
    "SigmaProposal",
    "CalibrationResult",
    "state_value_auroc",
    "auroc_interval",
    "auroc_bootstrap_interval",
    "propose_sigma",
    "calibrate",
    "calibrate_sufficiency",
]

Rule = Literal["youden", "accuracy"]


@dataclass(frozen=True)
class SigmaProposal:
    """A threshold and how it splits the dev answers (accept = value < sigma)."""

    sigma: float
    rule: str
    objective: float
    tpr: float
    fpr: float
    decision_accuracy: float
    accept_rate: float


@dataclass(frozen=True)
class CalibrationResult:
    """AUROC, the proposed sigma and the value distributions it came from."""

    auroc: float
    proposal: SigmaProposal
    n: int
    n_correct: int
    n_wrong: int
    n_missing: int
    median_correct: float
    median_wrong: float

    @property
    def sigma(self) -> float:
        return self.proposal.sigma

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def auroc_interval(auroc: float, n_correct: int, n_wrong: int, *, z: float = 1.96) -> tuple[float, float]:
    """A 95% confidence interval of an AUROC measured on ``n_correct`` and ``n_wrong`` answers
    (Hanley and McNeil, 1982), clipped to [0, 1]. With few answers of one kind the interval is wide:
    an AUROC whose interval holds 0.5 shows no separation the data can support.

    Example:
        >>> lo, hi = auroc_interval(0.538, 5, 32)
        >>> round(lo, 2), round(hi, 2)
        (0.26, 0.82)
        >>> auroc_interval(1.0, 4, 2)
        (1.0, 1.0)
    """
    if n_correct < 1 or n_wrong < 1:
        raise ValueError("an AUROC needs at least one correct and one wrong answer")
    a = float(auroc)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    variance = (a * (1 - a) + (n_correct - 1) * (q1 - a * a) + (n_wrong - 1) * (q2 - a * a)) / (n_correct * n_wrong)
    half = z * math.sqrt(max(variance, 0.0))
    return max(0.0, a - half), min(1.0, a + half)


def auroc_bootstrap_interval(values: Sequence[Optional[float]], correct: Sequence[bool], *, confidence: float = 0.95,
                             n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of :func:`state_value_auroc` (answers resampled with their labels,
    seeded: the same answers give the same interval); assumes nothing of the values' distribution,
    unlike :func:`auroc_interval`. Resamples holding one kind of answer only are dropped.

    Example:
        >>> values, right = [0.1, 0.2, 0.45, 0.4, 0.6, 0.7] * 5, [True, True, True, False, False, False] * 5
        >>> round(state_value_auroc(values, right), 3)
        0.889
        >>> low, high = auroc_bootstrap_interval(values, right)
        >>> 0.7 < low < 0.889 < high < 1.0
        True
    """
    from sklearn.metrics import roc_auc_score

    vals, labels, _ = _clean(values, correct)
    _need_both(labels)
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n_resamples):
        pick = rng.integers(0, len(vals), len(vals))
        if labels[pick].all() or not labels[pick].any():
            continue
        found.append(roc_auc_score(labels[pick], -vals[pick]))
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(found, tail)), float(np.percentile(found, 100 - tail))


def _clean(values: Sequence[Optional[float]], correct: Sequence[bool]) -> tuple[np.ndarray, np.ndarray, int]:
    if len(values) != len(correct):
        raise ValueError(f"{len(values)} values for {len(correct)} labels")
    keep = [(float(v), bool(c)) for v, c in zip(values, correct) if v is not None and not math.isnan(float(v))]
    vals = np.array([v for v, _ in keep], dtype=float)
    labels = np.array([c for _, c in keep], dtype=bool)
    return vals, labels, len(values) - len(keep)


def _need_both(labels: np.ndarray) -> None:
    if labels.all() or not labels.any():
        raise ValueError("calibration needs both correct and wrong answers with a state value")


def state_value_auroc(values: Sequence[Optional[float]], correct: Sequence[bool]) -> float:
    """AUROC of ``-value`` for predicting a correct answer (missing values are skipped).

    Example:
        >>> state_value_auroc([1.0, 2.0, 3.0], [True, False, True])
        0.5
    """
    from sklearn.metrics import roc_auc_score

    vals, labels, _ = _clean(values, correct)
    _need_both(labels)
    return float(roc_auc_score(labels, -vals))


def propose_sigma(values: Sequence[Optional[float]], correct: Sequence[bool], *, rule: Rule = "youden") -> SigmaProposal:
    """The sigma maximising the chosen rule (see the module docstring).

    Example:
        >>> p = propose_sigma([1.0, 2.0, 5.0, 6.0], [True, True, False, True])
        >>> p.sigma, round(p.objective, 3)
        (3.5, 0.667)
    """
    if rule not in ("youden", "accuracy"):
        raise ValueError(f"unknown rule {rule!r} (youden, accuracy)")
    vals, labels, _ = _clean(values, correct)
    if vals.size == 0:
        raise ValueError("no state values to calibrate on")
    if rule == "youden":
        _need_both(labels)
    distinct = np.unique(vals)
    candidates = [float(distinct[0])]  # accept nothing (strict <)
    candidates += [float(x) for x in (distinct[:-1] + distinct[1:]) / 2.0]
    candidates.append(math.nextafter(float(distinct[-1]), math.inf))  # accept everything
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    best: Optional[SigmaProposal] = None
    for sigma in candidates:
        accept = vals < sigma
        tp = int((accept & labels).sum())
        fp = int((accept & ~labels).sum())
        tpr = tp / n_pos if n_pos else 0.0
        fpr = fp / n_neg if n_neg else 0.0
        acc = (tp + (n_neg - fp)) / vals.size
        objective = tpr - fpr if rule == "youden" else acc
        if best is None or objective > best.objective + 1e-12:
            best = SigmaProposal(
                sigma=sigma,
                rule=rule,
                objective=objective,
                tpr=tpr,
                fpr=fpr,
                decision_accuracy=acc,
                accept_rate=float(accept.mean()),
            )
    assert best is not None
    return best


def calibrate(values: Sequence[Optional[float]], correct: Sequence[bool], *, rule: Rule = "youden") -> CalibrationResult:
    """AUROC plus a proposed sigma; ``None``/NaN values (runs that never scored) are counted as
    missing and left out.

    Example:
        >>> calibrate([1.0, None, 8.0], [True, True, False]).n_missing
        1
    """
    vals, labels, missing = _clean(values, correct)
    _need_both(labels)
    return CalibrationResult(
        auroc=state_value_auroc(vals.tolist(), labels.tolist()),
        proposal=propose_sigma(vals.tolist(), labels.tolist(), rule=rule),
        n=int(vals.size),
        n_correct=int(labels.sum()),
        n_wrong=int((~labels).sum()),
        n_missing=missing,
        median_correct=float(np.median(vals[labels])),
        median_wrong=float(np.median(vals[~labels])),
    )


def calibrate_sufficiency(
    path_scores: Sequence[Optional[float]], correct: Sequence[bool], *, model: Any, dataset: str,
    rule: Rule = "youden",
):
    """A :class:`~tcrag_langgraph.monitor.calibration.Calibration` of ``sufficiency_threshold``.

    ``path_scores`` are the runs' ``path_score`` (also the eval rows' ``state_value``) from a dev
    split run with ``sufficiency_threshold=NEVER_ABSTAIN``; ``correct`` whether each answer was
    right. A question is answered exactly when its path score is below the threshold, so this is
    the same decision sigma makes, chosen by the same rule. Save it with
    :func:`~tcrag_langgraph.monitor.calibration.save_calibration`; ``sufficiency_threshold="auto"``
    then reads it for the same generator.
    """
    from ..methods.crp_rag.calibration import sufficiency_model_id

    result = calibrate(path_scores, correct, rule=rule)
    return Calibration(metric="cppl", sigma=result.sigma, auroc=result.auroc, model_id=sufficiency_model_id(model),
                       dataset=dataset, n=result.n, details={"rule": rule, "method": "crp-rag",
                                                             "quantity": "path_score"})


def confidence_fit(values: Sequence[Optional[float]], correct: Sequence[bool]) -> dict[str, list[float]]:
    """The probability that an answer is right as a function of its state value: scikit-learn's
    isotonic regression (decreasing: a lower value is never less likely right), as the points
    :func:`tcrag_langgraph.monitor.risk.confidence_at` reads (``thresholds``, ``probabilities``)."""
    from sklearn.isotonic import IsotonicRegression

    x, y, _ = _clean(values, correct)
    _need_both(y)
    fit = IsotonicRegression(increasing=False, out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(x, y.astype(float))
    return {"thresholds": [float(v) for v in fit.X_thresholds_],
            "probabilities": [round(float(p), 6) for p in fit.y_thresholds_]}
