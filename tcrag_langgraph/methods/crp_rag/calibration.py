"""CRP-RAG's sufficiency threshold read back for ``sufficiency_threshold="auto"`` (measured like sigma by
:func:`tcrag_langgraph.eval.calibration.calibrate_sufficiency`, stored in the calibration store)."""

from __future__ import annotations

from typing import Any

from .options import CRPRAGOptions

__all__ = ["NEVER_ABSTAIN", "SUFFICIENCY_SUFFIX", "sufficiency_model_id", "resolve_threshold"]

#: appended to a generator's model id to store its sufficiency calibration beside its sigma
SUFFICIENCY_SUFFIX = "+crp-rag"
#: a sufficiency threshold no path score reaches: a calibration run answers every question it can
NEVER_ABSTAIN = 1e12


def sufficiency_model_id(model: Any) -> str:
    """The id a generator's sufficiency calibration is stored under (``<chat_model_id>+crp-rag``)."""
    from ...models.local import chat_model_id

    return f"{chat_model_id(model)}{SUFFICIENCY_SUFFIX}"


def resolve_threshold(options: CRPRAGOptions, model: Any) -> float:
    if options.sufficiency_threshold == "auto":
        from ...monitor.calibration import CalibrationNotFoundError, default_calibration_path, load_calibration

        model_id = sufficiency_model_id(model)
        try:
            return float(load_calibration(model_id=model_id, metric="cppl").sigma)
        except CalibrationNotFoundError:  # its hint is about sigma; say how to calibrate this threshold
            raise ValueError(
                f"no stored sufficiency calibration for {model_id!r} at {default_calibration_path(model_id, 'cppl')}: "
                "make one with `tcrag calibrate --method crp-rag` (or calibrate_sufficiency(...) and "
                "save_calibration(...)), or give sufficiency_threshold as a number") from None
    return float(options.sufficiency_threshold)
