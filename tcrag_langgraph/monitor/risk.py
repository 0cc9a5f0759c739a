"""Validation with a stated risk: the threshold under which a validated answer is wrong at most a
``risk`` share of the time, with a finite-sample guarantee, and the calibrated probability that an
answer is right (its ``confidence``), both from a calibration run of the model on the user's data.

**The threshold** is Geifman and El-Yaniv's selection with guaranteed risk (SGR, "Selective
Classification for Deep Neural Networks", NeurIPS 2017): the calibration answers sorted by state
value (lower = more confident), a binary search over how many of them to accept, and at each of
its ``k = ceil(log2 n)`` steps a one-sided binomial upper bound (Clopper-Pearson) on the error rate
of the accepted answers at level ``delta / k``. The largest accepted set whose bound is at most
``risk`` gives sigma. **Guarantee:** if the calibration answers and the answers the monitor later
judges are exchangeable (drawn alike: same model, same kind of questions, same way of answering),
then with probability at least ``1 - delta`` over the calibration sample, the error rate among the
answers validated at that sigma is at most ``risk``. **What breaks it:** another model, another task
or question mix, another prompt, retrieval or method between calibration and use (TC-RAG rejecting
a Conclusion and writing another one selects among answers, which the calibration's own answers
did not go through unless it was made with the same method), and a sample too small or too wrong
to certify any threshold (then nothing is validated, and the run says so).

**Confidence** is the isotonic regression of correctness on the state value over the same sample
(fitted by ``tcrag calibrate``; a step function stored with the calibration), read at the answer's
value: an estimate, with no guarantee of its own.

Example:
    >>> round(binomial_upper_bound(0, 50, 0.05), 3)  # no error in 50: at most 5.8 % at 95 %
    0.058
    >>> found = risk_threshold([0.1, 0.2, 0.3, 0.9], [True, True, True, False], risk=0.5, delta=0.5)
    >>> found.accepted, found.errors, 0.3 < found.sigma <= 0.9
    (3, 0, True)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["RiskThreshold", "binomial_upper_bound", "risk_threshold", "confidence_at"]


@dataclass(frozen=True)
class RiskThreshold:
    """A certified sigma: answers with a state value below it are validated; of the ``n`` calibration
    answers it accepts ``accepted`` (coverage ``accepted / n``) with ``errors`` wrong, and ``bound`` is
    the upper confidence bound on their error rate (at most the risk asked for)."""

    sigma: float
    risk: float
    delta: float
    n: int
    accepted: int
    errors: int
    bound: float

    @property
    def coverage(self) -> float:
        return self.accepted / self.n


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n up to tens of thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(0, k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def binomial_upper_bound(errors: int, n: int, delta: float) -> float:
    """The one-sided ``1 - delta`` upper confidence bound on an error rate after ``errors`` in ``n``
    (Clopper-Pearson: the largest ``p`` with ``P(Binomial(n, p) <= errors) >= delta``)."""
    if n <= 0:
        return 1.0
    if not 0 <= errors <= n:
        raise ValueError(f"errors must be between 0 and n={n}, not {errors}")
    if errors == n:
        return 1.0
    low, high = errors / n, 1.0
    for _ in range(100):  # bisection to well below any threshold's resolution
        mid = (low + high) / 2
        if _binomial_cdf(errors, n, mid) >= delta:
            low = mid
        else:
            high = mid
    return low


def risk_threshold(values: Sequence[Optional[float]], correct: Sequence[bool], *, risk: float,
                   delta: float = 0.1) -> Optional[RiskThreshold]:
    """SGR's sigma for ``risk`` at confidence ``1 - delta`` from calibration pairs (a state value, lower
    = more confident, and whether that answer was right); ``None`` when no threshold can be certified
    (too few answers, or too many of the confident ones wrong). Pairs without a value are left out."""
    if not 0.0 < risk < 1.0:
        raise ValueError(f"risk must be between 0 and 1, not {risk!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be between 0 and 1, not {delta!r}")
    if len(values) != len(correct):
        raise ValueError("values and correct must be as long as each other")
    pairs = sorted((float(v), bool(c)) for v, c in zip(values, correct) if v is not None and math.isfinite(v))
    n = len(pairs)
    if n == 0:
        return None
    ordered = [v for v, _ in pairs]
    wrong_before = [0]
    for _, ok in pairs:
        wrong_before.append(wrong_before[-1] + (not ok))
    steps = max(1, math.ceil(math.log2(n)))
    level = delta / steps

    def accepted_by(j: int) -> int:
        # answers are accepted below a threshold, so ties with the j-th value are accepted together
        return bisect.bisect_right(ordered, ordered[j - 1])

    best: Optional[tuple[int, float]] = None
    low, high = 1, n
    for _ in range(steps):
        if low > high:
            break
        j = (low + high + 1) // 2
        m = accepted_by(j)
        bound = binomial_upper_bound(wrong_before[m], m, level)
        if bound <= risk:
            best = (m, bound) if best is None or m > best[0] else best
            low = j + 1
        else:
            high = j - 1
    if best is None:
        return None
    m, bound = best
    last = ordered[m - 1]
    following = ordered[m] if m < n else None
    sigma = (last + following) / 2 if following is not None else last + max(abs(last), 1.0) * 1e-9
    return RiskThreshold(sigma=sigma, risk=risk, delta=delta, n=n, accepted=m, errors=wrong_before[m], bound=bound)


def confidence_at(value: float, thresholds: Sequence[float], probabilities: Sequence[float]) -> float:
    """The calibrated probability that an answer with state ``value`` is right: the isotonic fit
    ``tcrag calibrate`` stored (points ``(thresholds[i], probabilities[i])``, increasing thresholds),
    read as isotonic regression predicts: linear between points, the end value beyond them.

    Example:
        >>> round(confidence_at(0.35, [0.1, 0.3, 0.6], [0.9, 0.7, 0.2]), 4)
        0.6167
        >>> confidence_at(5.0, [0.1, 0.3, 0.6], [0.9, 0.7, 0.2])
        0.2
    """
    if not thresholds or len(thresholds) != len(probabilities):
        raise ValueError("a confidence map needs as many probabilities as thresholds, at least one")
    xs, ys = list(thresholds), [float(p) for p in probabilities]
    if value <= xs[0]:
        return ys[0]
    if value >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, value)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 if x1 == x0 else y0 + (value - x0) / (x1 - x0) * (y1 - y0)
