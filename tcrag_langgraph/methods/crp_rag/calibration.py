"""Calibration of CRP-RAG's sufficiency threshold (like sigma): storing one
(:func:`calibrate_sufficiency`) and reading it back for ``sufficiency_threshold="auto"``."""

from __future__ import annotations

from typing import Any, Literal, Optional, Sequence

from .options import CRPRAGOptions

__all__ = ["NEVER_ABSTAIN", "SUFFICIENCY_SUFFIX", "sufficiency_model_id", "calibrate_sufficiency", "resolve_threshold"]

#: appended to a generator's model id to store its sufficiency calibration beside its sigma
SUFFICIENCY_SUFFIX = "+crp-rag"
#: a sufficiency threshold no path score reaches: a calibration run answers every question it can
NEVER_ABSTAIN = 1e12


def sufficiency_model_id(model: Any) -> str:
    """The id a generator's sufficiency calibration is stored under (``<chat_model_id>+crp-rag``)."""
    from ...models import chat_model_id

    return f"{chat_model_id(model)}{SUFFICIENCY_SUFFIX}"


def calibrate_sufficiency(
    path_scores: Sequence[Optional[float]], correct: Sequence[bool], *, model: Any, dataset: str,
    rule: Literal["youden", "accuracy"] = "youden",
):
    """A :class:`~tcrag_langgraph.eval.calibration.Calibration` of ``sufficiency_threshold``.

    ``path_scores`` are the runs' ``path_score`` (also the eval rows' ``state_value``) from a dev
    split run with ``sufficiency_threshold=NEVER_ABSTAIN``; ``correct`` whether each answer was
    right. A question is answered exactly when its path score is below the threshold, so this is
    the same decision sigma makes, chosen by the same rule. Save it with
    :func:`~tcrag_langgraph.eval.calibration.save_calibration`; ``sufficiency_threshold="auto"``
    then reads it for the same generator.
    """
    from ...eval.calibration import Calibration, calibrate

    result = calibrate(path_scores, correct, rule=rule)
    return Calibration(metric="cppl", sigma=result.sigma, auroc=result.auroc, model_id=sufficiency_model_id(model),
                       dataset=dataset, n=result.n, details={"rule": rule, "method": "crp-rag",
                                                             "quantity": "path_score"})


def resolve_threshold(options: CRPRAGOptions, model: Any) -> float:
    if options.sufficiency_threshold == "auto":
        from ...eval.calibration import CalibrationNotFoundError, default_calibration_path, load_calibration

        model_id = sufficiency_model_id(model)
        try:
            return float(load_calibration(model_id=model_id, metric="cppl").sigma)
        except CalibrationNotFoundError:  # its hint is about sigma; say how to calibrate this threshold
            raise ValueError(
                f"no stored sufficiency calibration for {model_id!r} at {default_calibration_path(model_id, 'cppl')}: "
                "make one with `tcrag calibrate --method crp-rag` (or calibrate_sufficiency(...) and "
                "save_calibration(...)), or give sufficiency_threshold as a number") from None
    return float(options.sufficiency_threshold)
