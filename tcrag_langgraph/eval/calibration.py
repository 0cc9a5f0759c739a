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

Stored calibrations (sigma per model): ``tcrag calibrate`` saves a :class:`Calibration` as JSON,
by default at ``$TCRAG_CACHE_DIR/calibration/<model-id>.<metric>.json`` (``~/.cache/tcrag_langgraph``
without the variable; see :func:`default_calibration_path`). :func:`load_calibration` reads one
back and :func:`resolve_sigma` turns ``TCRAGConfig(sigma="auto")`` into the stored number at
graph build time.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..config import TCRAGConfig

__all__ = [
    "SigmaProposal",
    "CalibrationResult",
    "state_value_auroc",
    "propose_sigma",
    "calibrate",
    "Calibration",
    "CalibrationNotFoundError",
    "default_calibration_path",
    "save_calibration",
    "load_calibration",
    "resolve_sigma",
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


# --- stored calibrations: sigma per model -----------------------------------------------------

METRICS = ("cppl", "uct")


class CalibrationNotFoundError(FileNotFoundError):
    """No stored calibration for this model and metric (the message says how to make one)."""


@dataclass(frozen=True)
class Calibration:
    """A sigma measured for one model and metric, and where it came from.

    ``created`` is an ISO-8601 UTC time; ``details`` holds anything else worth keeping (the
    rule, split, method, TPR/FPR at sigma).
    """

    metric: str
    sigma: float
    auroc: float
    model_id: str
    dataset: str
    n: int
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; use 'cppl' or 'uct'")
        if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) or not (
            math.isfinite(self.sigma) and self.sigma > 0
        ):
            raise ValueError(f"sigma must be a finite number > 0, not {self.sigma!r}")
        if not isinstance(self.auroc, (int, float)) or not 0.0 <= float(self.auroc) <= 1.0:
            raise ValueError(f"auroc must be in [0, 1], not {self.auroc!r}")
        if not isinstance(self.model_id, str) or not self.model_id.strip():
            raise ValueError("model_id must be a non-empty string")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be a positive integer, not {self.n!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Calibration":
        if not isinstance(data, dict):
            raise ValueError("a calibration file holds a JSON object")
        missing = [k for k in ("metric", "sigma", "auroc", "model_id", "dataset", "n", "created") if k not in data]
        if missing:
            raise ValueError(f"calibration is missing {missing}")
        known = {k: data[k] for k in ("metric", "sigma", "auroc", "model_id", "dataset", "n", "created", "details")
                 if k in data}
        return cls(**known)


def _file_safe(model_id: str) -> str:
    # "openai:gpt-4o" and "Qwen/Qwen2.5" become file names; the file itself records the real id.
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id.strip()).strip("._")
    if not safe:
        raise ValueError(f"model id {model_id!r} has no usable characters for a file name")
    return safe


def default_calibration_path(model_id: str, metric: str) -> Path:
    """``<cache>/calibration/<model-id>.<metric>.json`` where ``<cache>`` is ``$TCRAG_CACHE_DIR`` or
    ``~/.cache/tcrag_langgraph``; characters other than letters, digits, ``.``, ``_`` and ``-`` in
    the model id become ``_``.

    Example:
        >>> default_calibration_path("openai:gpt-4o", "cppl").name
        'openai_gpt-4o.cppl.json'
    """
    from ..models import cache_dir

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use 'cppl' or 'uct'")
    return cache_dir() / "calibration" / f"{_file_safe(model_id)}.{metric}.json"


def save_calibration(calibration: Calibration, path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``calibration`` as JSON (atomically) to ``path`` or the default location; returns the path."""
    target = Path(path).expanduser() if path is not None else default_calibration_path(
        calibration.model_id, calibration.metric)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(calibration.to_dict(), out, indent=2)
            out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_calibration(path: str | os.PathLike[str] | None = None, *, model_id: str, metric: str) -> Calibration:
    """The stored calibration of ``model_id`` for ``metric``.

    ``path=None`` reads :func:`default_calibration_path`. A missing file is a
    :class:`CalibrationNotFoundError` naming the ``tcrag calibrate`` command that makes one; a file
    for another model or metric, or a malformed one, is a ValueError.
    """
    target = Path(path).expanduser() if path is not None else default_calibration_path(model_id, metric)
    if not target.is_file():
        raise CalibrationNotFoundError(
            f"no {metric} calibration for model {model_id!r} at {target}. Make one with "
            f"`tcrag calibrate --dataset pubmedqa --split trainval --metric {metric} --model <the same model> "
            "--out <folder>`, or give sigma as a number."
        )
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
        found = Calibration.from_dict(data)
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"{target} is not a valid calibration file: {exc}") from None
    if found.metric != metric:
        raise ValueError(f"{target} calibrates {found.metric}, not {metric}")
    if found.model_id != model_id:
        raise ValueError(f"{target} was measured for model {found.model_id!r}, not {model_id!r}")
    return found


def resolve_sigma(config: "TCRAGConfig", model_id: str, *, path: str | os.PathLike[str] | None = None) -> float:
    """The number sigma stands for in ``config`` with generator ``model_id``.

    A number is itself; ``None`` is the paper's default for ``config.metric``; ``"auto"`` is the
    stored calibration of ``model_id`` for ``config.metric`` (:func:`load_calibration`; a missing
    one is a :class:`CalibrationNotFoundError`). Call it when the graph is built and again when a
    run changes the metric or sigma.

    Example:
        >>> from tcrag_langgraph.config import TCRAGConfig
        >>> resolve_sigma(TCRAGConfig(metric="uct"), "any-model")
        20.0
    """
    if config.sigma == "auto":
        return float(load_calibration(path, model_id=model_id, metric=config.metric).sigma)
    return config.effective_sigma
