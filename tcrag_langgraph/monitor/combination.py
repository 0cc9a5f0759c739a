"""``gen_combined``: one state value from the generation values (:mod:`.generation`), fitted on a
calibration sample to the probability that the answer is right.

The three values a reply's own log-probs give (``gen_answer_prob``, ``gen_cppl``, ``gen_entropy``)
carry different signals: how much of the answer's probability went to the chosen answer, how sure
the model was of the words, how spread its alternatives were. No one of them is best for every
model and task, so ``tcrag calibrate --metric gen_combined`` fits a logistic regression of
"the answer was right" on them (``gen_cppl`` on a log scale, each feature standardised) and stores
its coefficients with the calibration; a run then reads ``gen_combined = 1 - P(right)`` (lower =
more confident, like every state value) off the same reply, with no second pass.

**Honest by construction.** The fit never judges the answers it was fitted on: calibrate splits its
sample in two disjoint halves, fits on the first and measures (AUROC, the risk threshold, the
confidence map) on the second, where the combination is a fixed function, so the finite-sample
guarantee of :mod:`.risk` holds for it as for any single value. It also fits on the second half and
reports the AUROC on the first: two disjoint samples, both reported.

Example:
    >>> probs = [0.0, 0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    >>> values = [{"gen_answer_prob": p, "gen_cppl": 1.5 + p, "gen_entropy": 0.4} for p in probs]
    >>> fitted = fit_combination(values, [p < 0.5 for p in probs])
    >>> fitted.value(values[0]) < fitted.value(values[-1])  # a surer answer gets a lower value
    True
    >>> Combination.from_dict(fitted.to_dict()) == fitted
    True
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

__all__ = ["COMBINED_VALUE", "FEATURES", "Combination", "fit_combination", "split_halves"]

#: the state value's name (a metric of TCRAGConfig)
COMBINED_VALUE = "gen_combined"
#: what it combines: the generation values, read off the reply that wrote the answer
FEATURES = ("gen_answer_prob", "gen_cppl", "gen_entropy")
#: perplexities spread over orders of magnitude: the fit sees their logarithm
_LOG_SCALED = frozenset({"gen_cppl"})


def _feature(name: str, value: float) -> float:
    return math.log(max(value, 1e-12)) if name in _LOG_SCALED else float(value)


@dataclass(frozen=True)
class Combination:
    """A fitted logistic regression from generation values to the probability that an answer is right."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    n: int

    def __post_init__(self) -> None:
        if not self.features or not (len(self.features) == len(self.mean) == len(self.scale) == len(self.coef)):
            raise ValueError("a combination needs one mean, scale and coefficient per feature")
        if any(not math.isfinite(x) for x in (*self.mean, *self.scale, *self.coef, self.intercept)):
            raise ValueError("a combination's numbers must be finite")
        if any(s <= 0 for s in self.scale):
            raise ValueError("a combination's scales must be positive")

    def probability_right(self, values: Mapping[str, float]) -> Optional[float]:
        """P(right) of an answer with these generation values; None when one of the features is missing
        (e.g. ``gen_answer_prob`` of an answer that is not one of the allowed ones)."""
        if any(values.get(f) is None or not math.isfinite(values[f]) for f in self.features):
            return None
        z = self.intercept + sum(c * (_feature(f, values[f]) - m) / s
                                 for f, m, s, c in zip(self.features, self.mean, self.scale, self.coef))
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def value(self, values: Mapping[str, float]) -> Optional[float]:
        """The state value ``gen_combined``: 1 - P(right) (lower = more confident)."""
        p = self.probability_right(values)
        return None if p is None else 1.0 - p

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Combination":
        try:
            return cls(features=tuple(data["features"]), mean=tuple(map(float, data["mean"])),
                       scale=tuple(map(float, data["scale"])), coef=tuple(map(float, data["coef"])),
                       intercept=float(data["intercept"]), n=int(data["n"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a stored combination: {exc}") from None


def fit_combination(values: Sequence[Mapping[str, float]], correct: Sequence[bool], *,
                    features: Sequence[str] = FEATURES) -> Combination:
    """Fit :class:`Combination` on calibration answers (their generation values, whether each was
    right); answers missing a feature are left out. Regularised (scikit-learn's default L2, C=1), so a
    small sample gives moderate coefficients rather than a perfect separation of its own points."""
    from sklearn.linear_model import LogisticRegression

    if len(values) != len(correct):
        raise ValueError("values and correct must be as long as each other")
    rows = [([_feature(f, v[f]) for f in features], bool(c)) for v, c in zip(values, correct)
            if all(v.get(f) is not None and math.isfinite(v[f]) for f in features)]
    labels = [c for _, c in rows]
    if len(rows) < 10 or len(set(labels)) < 2:
        raise ValueError(f"a combination needs at least 10 answers with every feature, right and wrong ones "
                         f"({len(rows)} usable, {sum(labels)} right)")
    columns = list(zip(*[x for x, _ in rows]))
    mean = [sum(col) / len(col) for col in columns]
    scale = [math.sqrt(sum((x - m) ** 2 for x in col) / len(col)) or 1.0 for col, m in zip(columns, mean)]
    standard = [[(x - m) / s for x, m, s in zip(xs, mean, scale)] for xs, _ in rows]
    model = LogisticRegression().fit(standard, labels)
    return Combination(features=tuple(features), mean=tuple(mean), scale=tuple(scale),
                       coef=tuple(float(c) for c in model.coef_[0]), intercept=float(model.intercept_[0]),
                       n=len(rows))


def split_halves(count: int, *, seed: int = 0) -> tuple[list[int], list[int]]:
    """Two disjoint halves of ``range(count)`` (shuffled with ``seed``, each in order): the fit's and
    the measurement's.

    Example:
        >>> first, second = split_halves(5, seed=0)
        >>> sorted(first + second), len(first), len(second)
        ([0, 1, 2, 3, 4], 2, 3)
    """
    order = list(range(count))
    random.Random(seed).shuffle(order)
    half = count // 2
    return sorted(order[:half]), sorted(order[half:])
