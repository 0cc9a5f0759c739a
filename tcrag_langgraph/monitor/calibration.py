"""The calibration store: sigma (and its AUROC) measured per model and metric, saved as JSON and read
back when a graph is built with ``sigma="auto"``.

``tcrag calibrate`` (the analysis lives in :mod:`tcrag_langgraph.eval.calibration`) saves a
:class:`Calibration` per model, task and metric, by default at
``$TCRAG_CACHE_DIR/calibration/<model-id>.<task>.<metric>.json`` (``<model-id>.<metric>.json``
without a task; ``~/.cache/tcrag_langgraph`` without the variable; see
:func:`default_calibration_path`). :func:`load_calibration` reads one back, :func:`resolve_sigma`
turns ``sigma="auto"`` into the stored number, and :func:`resolve_monitor` also picks the state
value when the configuration leaves the metric to the calibration: the one whose AUROC on the task
was best. This is runtime code: the stack machine and the methods read
it, so it lives with the state monitor, not with the evaluation.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from glob import escape as glob_escape
from pathlib import Path
from typing import Any, Optional

from .state_values import STATE_VALUES

__all__ = ["METRICS", "Calibration", "CalibrationNotFoundError", "default_calibration_path", "save_calibration",
           "load_calibration", "resolve_sigma", "resolve_monitor", "stored_calibrations", "shipped_calibration", "monitor_cannot_judge", "SHIPPED_FILE", "risk_sigma", "confidence_map", "stored_combination"]

#: the state values a calibration can be stored for
METRICS = STATE_VALUES


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
    #: what kind of questions it was measured on (``pubmedqa``, ``medmcqa``, a JSONL file's name);
    #: None for a calibration that applies to any task
    task: Optional[str] = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; use one of {', '.join(METRICS)}")
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
        if self.task is not None:
            _file_safe(self.task)  # a task names a file: it needs usable characters

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Calibration":
        if not isinstance(data, dict):
            raise ValueError("a calibration file holds a JSON object")
        missing = [k for k in ("metric", "sigma", "auroc", "model_id", "dataset", "n", "created") if k not in data]
        if missing:
            raise ValueError(f"calibration is missing {missing}")
        known = {k: data[k] for k in ("metric", "sigma", "auroc", "model_id", "dataset", "n", "created", "details",
                                      "task") if k in data}
        return cls(**known)


def _file_safe(model_id: str) -> str:
    # "openai:gpt-4o" and "Qwen/Qwen2.5" become file names; the file itself records the real id.
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id.strip()).strip("._")
    if not safe:
        raise ValueError(f"model id {model_id!r} has no usable characters for a file name")
    return safe


def default_calibration_path(model_id: str, metric: str, task: Optional[str] = None) -> Path:
    """``<cache>/calibration/<model-id>.<task>.<metric>.json`` (``<model-id>.<metric>.json`` without a
    task) where ``<cache>`` is ``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``; characters other
    than letters, digits, ``.``, ``_`` and ``-`` in the model id and task become ``_``.

    Example:
        >>> default_calibration_path("openai:gpt-4o", "cppl").name
        'openai_gpt-4o.cppl.json'
        >>> default_calibration_path("qwen-1.5b", "answer_prob", "pubmedqa").name
        'qwen-1.5b.pubmedqa.answer_prob.json'
    """
    from ..models.weights import cache_dir

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    middle = f".{_file_safe(task)}" if task else ""
    return cache_dir() / "calibration" / f"{_file_safe(model_id)}{middle}.{metric}.json"


def save_calibration(calibration: Calibration, path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``calibration`` as JSON (atomically) to ``path`` or the default location; returns the path."""
    target = Path(path).expanduser() if path is not None else default_calibration_path(
        calibration.model_id, calibration.metric, calibration.task)
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


def load_calibration(path: str | os.PathLike[str] | None = None, *, model_id: str, metric: str,
                     task: Optional[str] = None) -> Calibration:
    """The stored calibration of ``model_id`` for ``metric`` (on ``task``).

    ``path=None`` reads :func:`default_calibration_path`: the task's own file, else the one stored
    without a task (never another task's); with no task given, the one stored without a task, else
    the only task's (several tasks: a ValueError asking which). A missing file is a :class:`CalibrationNotFoundError`
    naming the ``tcrag calibrate`` command that makes one; a file for another model, metric or task,
    or a malformed one, is a ValueError.
    """
    if path is not None:
        target = Path(path).expanduser()
    else:
        target = default_calibration_path(model_id, metric, task)
        if task and not target.is_file():
            target = default_calibration_path(model_id, metric)
        if not task and not target.is_file():
            tasks = _task_files(model_id, metric)
            if len(tasks) > 1:
                raise ValueError(f"model {model_id!r} has {metric} calibrations for the tasks {sorted(tasks)}: say "
                                 "which one (calibration_task, --calibration-task)")
            if tasks:
                target = next(iter(tasks.values()))
    if not target.is_file():
        on = f" on task {task!r}" if task else ""
        raise CalibrationNotFoundError(
            f"no {metric} calibration for model {model_id!r}{on} at {target}. Make one with "
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
    if task and found.task not in (None, task):
        raise ValueError(f"{target} was measured on task {found.task!r}, not {task!r}")
    return found


def _task_files(model_id: str, metric: str) -> dict[str, Path]:
    """The files of ``model_id``'s ``metric`` calibrations stored per task, by task."""
    folder = default_calibration_path(model_id, metric).parent
    found: dict[str, Path] = {}
    for candidate in sorted(folder.glob(f"{glob_escape(_file_safe(model_id))}.*.{metric}.json")):
        try:
            one = Calibration.from_dict(json.loads(candidate.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, TypeError, ValueError):
            continue
        if one.model_id == model_id and one.metric == metric and one.task:
            found[one.task] = candidate
    return found


def stored_calibrations(model_id: str, task: Optional[str] = None) -> list[Calibration]:
    """Every metric's stored calibration of ``model_id`` (on ``task``, as :func:`load_calibration`
    finds them), in :data:`METRICS` order."""
    found = []
    for metric in METRICS:
        try:
            found.append(load_calibration(model_id=model_id, metric=metric, task=task))
        except CalibrationNotFoundError:
            continue
    return found


#: calibrations measured with ``tcrag calibrate`` for the models this package ships or its catalogue pulls
#: (installed with it)
SHIPPED_FILE = Path(__file__).with_name("shipped_calibrations.json")


def shipped_calibration(model_id: str, metric: str) -> "Calibration | None":
    """The calibration this package ships for ``model_id`` and ``metric`` (:data:`SHIPPED_FILE`),
    else None. Its ``details["supported"]`` says whether any sigma separated right from wrong answers.

    Example:
        >>> shipped_calibration("no-such-model", "cppl") is None
        True
    """
    if not SHIPPED_FILE.is_file():
        return None
    for item in json.loads(SHIPPED_FILE.read_text(encoding="utf-8")):
        if item.get("model_id") == model_id and item.get("metric") == metric:
            return Calibration.from_dict(item)
    return None


def monitor_cannot_judge(model_id: str, metric: str) -> "str | None":
    """Why the state monitor cannot judge ``model_id``'s answers with ``metric`` (its own weights as
    the monitor), or None when nothing says so. The user's own stored calibration of that model and
    metric (``tcrag calibrate``, :func:`default_calibration_path`) wins over the shipped one.

    Example:
        >>> monitor_cannot_judge("no-such-model", "cppl") is None
        True
    """
    if default_calibration_path(model_id, metric).is_file() or _task_files(model_id, metric):
        return None
    found = shipped_calibration(model_id, metric)
    if found is None or found.details.get("supported", True):
        return None
    return (f"the monitor cannot judge this model: on {found.dataset} (n={found.n}) its {metric} does not separate "
            f"right from wrong answers (AUROC {found.auroc:.2f}); no sigma makes 'validated' mean anything for it")


def resolve_sigma(config: Any, model_id: str, *, path: str | os.PathLike[str] | None = None) -> float:
    """The number sigma stands for in ``config`` with generator ``model_id``.

    A number is itself; ``None`` is the paper's default for ``config.metric``; ``"auto"`` is the
    stored calibration of ``model_id`` for ``config.metric`` (:func:`load_calibration`), else the
    one this package ships for it when that one found a separating sigma
    (:func:`shipped_calibration`); otherwise a :class:`CalibrationNotFoundError` saying why. Call it
    when the graph is built and again when a run changes the metric or sigma.

    Example:
        >>> from tcrag_langgraph.core.config import TCRAGConfig
        >>> resolve_sigma(TCRAGConfig(metric="uct"), "any-model")
        20.0
    """
    if config.sigma == "auto":
        try:
            return float(load_calibration(path, model_id=model_id, metric=config.metric,
                                          task=getattr(config, "calibration_task", None)).sigma)
        except CalibrationNotFoundError as missing:
            shipped = shipped_calibration(model_id, config.metric) if path is None else None
            if shipped is None:
                raise
            if shipped.details.get("supported", True):  # the package's own measurement of this model
                return float(shipped.sigma)
            raise CalibrationNotFoundError(
                f"{missing} The calibration shipped for {model_id!r} ({shipped.dataset}, n={shipped.n}) found no "
                f"sigma that separates its right from wrong answers (AUROC {shipped.auroc:.2f})."
            ) from None
    return config.effective_sigma


def resolve_monitor(config: Any, model_id: str) -> tuple[str, float]:
    """The state value and sigma a run with ``config`` and generator ``model_id`` uses.

    With ``sigma="auto"`` and a metric the configuration does not set itself, the metric is the one
    whose stored calibration (on ``config.calibration_task``) has the best AUROC among those that
    separated right from wrong answers (``details["supported"]``; ``answer_prob`` only when the
    configuration declares its answers as a list), and sigma is its threshold; ties
    keep :data:`METRICS` order (the paper's values first). Otherwise the metric is the configured one
    and sigma is :func:`resolve_sigma`'s.

    Example:
        >>> from tcrag_langgraph.core.config import TCRAGConfig
        >>> resolve_monitor(TCRAGConfig(metric="uct", sigma=3), "any-model")
        ('uct', 3.0)
    """
    if config.sigma == "auto" and "metric" not in config.model_fields_set:
        # answer_prob weighs the allowed answers: only for a configuration that declares them
        usable = [c for c in stored_calibrations(model_id, getattr(config, "calibration_task", None))
                  if c.details.get("supported", True)
                  and (c.metric != "answer_prob" or isinstance(getattr(config, "answer_format", None), tuple))]
        if usable:
            best = max(usable, key=lambda c: c.auroc)  # max keeps the first of equals: METRICS order
            return best.metric, float(best.sigma)
    return config.metric, resolve_sigma(config, model_id)


def risk_sigma(config: Any, model_id: str) -> tuple[float, Optional[str]]:
    """sigma for ``config.risk`` (:func:`~tcrag_langgraph.monitor.risk.risk_threshold` over the answers
    stored with the calibration of ``model_id``, ``config.metric`` and ``config.calibration_task``), and
    ``None``; or, when that sample certifies no threshold, the calibration's own sigma and why nothing
    may be validated. A missing calibration, or one stored without its answers, is a
    :class:`CalibrationNotFoundError` saying how to make one."""
    from .risk import risk_threshold

    try:
        calibration = load_calibration(model_id=model_id, metric=config.metric,
                                       task=getattr(config, "calibration_task", None))
    except CalibrationNotFoundError as missing:  # the same advice, in risk's words
        raise CalibrationNotFoundError(f"risk={config.risk:g} reads the answers of a stored calibration: "
                                       + str(missing).replace("or give sigma as a number",
                                                              "or validate with sigma instead of risk")) from None
    pairs = calibration.details.get("pairs") or {}
    if not pairs.get("values"):
        raise CalibrationNotFoundError(
            f"the {config.metric} calibration of {model_id!r} keeps no answers to certify a risk with (made before "
            "risk existed, or shipped): run tcrag calibrate again for this model and task")
    found = risk_threshold(pairs["values"], pairs["correct"], risk=config.risk, delta=config.risk_delta)
    if found is None:
        wrong = sum(not c for c in pairs["correct"])
        return float(calibration.sigma), (
            f"the calibration of {model_id!r} on {calibration.dataset} ({len(pairs['correct'])} answers, {wrong} "
            f"wrong) cannot certify an error rate of at most {config.risk:g} among validated answers at confidence "
            f"{1 - config.risk_delta:g}: no answer is validated (calibrate on more questions, or ask for a larger "
            "risk)")
    return found.sigma, None


def stored_combination(config: Any, model_id: str) -> Any:
    """The ``gen_combined`` fit stored with ``model_id``'s calibration on ``config.calibration_task``
    (a :class:`~.combination.Combination`); a missing one is a :class:`CalibrationNotFoundError` saying how to make it."""
    from .combination import Combination

    try:
        calibration = load_calibration(model_id=model_id, metric="gen_combined",
                                       task=getattr(config, "calibration_task", None))
    except CalibrationNotFoundError as missing:
        raise CalibrationNotFoundError(f"gen_combined reads a fit of the generation values made for the model and "
                                       f"task: {missing}") from None
    fit = calibration.details.get("combination")
    if not fit:
        raise CalibrationNotFoundError(f"the gen_combined calibration of {model_id!r} keeps no fit: run tcrag "
                                       "calibrate --metric gen_combined again")
    return Combination.from_dict(fit)


def confidence_map(config: Any, model_id: str) -> Optional[tuple[list[float], list[float]]]:
    """The stored step function from ``config.metric``'s value to the probability that an answer is
    right, for ``model_id`` on ``config.calibration_task``; None when no calibration with one is stored."""
    try:
        calibration = load_calibration(model_id=model_id, metric=config.metric,
                                       task=getattr(config, "calibration_task", None))
    except (CalibrationNotFoundError, ValueError):
        return None
    fit = calibration.details.get("confidence") or {}
    if not fit.get("thresholds"):
        return None
    return list(fit["thresholds"]), list(fit["probabilities"])
