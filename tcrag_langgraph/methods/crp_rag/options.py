"""CRP-RAG's options: :class:`CRPRAGOptions`, its bounds and thresholds, overridable per run."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, field_validator

from ...core.arguments import MethodOptions

__all__ = ["CRPRAGOptions"]


class CRPRAGOptions(MethodOptions):
    """CRP-RAG's own bounds and thresholds (the shared generation settings stay in :class:`TCRAGConfig`).

    Every field can be overridden per run: ``graph.invoke(..., context=...)`` takes a CRPRAGOptions, a
    :class:`TCRAGConfig` or a mapping of either's fields (the two share no field name).

    Example:
        >>> CRPRAGOptions(fan_out=3).max_depth
        3
        >>> CRPRAGOptions(sufficiency_threshold="auto").sufficiency_threshold
        'auto'
    """

    fan_out: int = Field(default=2, ge=1, le=8, description="Sampled next steps per sink and iteration.")
    max_depth: int = Field(default=3, ge=1, le=8, description="Graph-construction iterations (longest path).")
    max_nodes: int = Field(default=12, ge=1, le=64, description="Nodes in the reasoning graph, at most.")
    merge_threshold: float = Field(default=0.85, gt=0.0, le=1.0,
                                   description="New steps whose MiniLM inner product is above this are merged.")
    sampling_temperature: float = Field(default=0.8, gt=0.0, le=2.0,
                                        description="Temperature of next-step sampling (LocalChatModel).")
    max_step_tokens: int = Field(default=96, ge=8, le=1024, description="New tokens of one step or merge.")
    sufficiency_threshold: Union[Annotated[float, Field(gt=0)], Literal["auto"]] = Field(
        default=10.0, description="A node is knowledge-sufficient when its reasoning's cppl is below this; "
        "'auto' = the stored calibration (calibrate_sufficiency) of the generator.")
    max_paths: int = Field(default=3, ge=1, le=16, description="Sufficient paths answered and integrated.")
    aggregate_knowledge: bool = Field(default=True, description="Aggregate retrieval results with the model "
                                      "(prompt A.3); False concatenates them (the paper's ablation).")
    max_step_retries: int = Field(default=1, ge=0, le=5, description="Re-prompts after an unusable step.")
    open_answer: Optional[str] = Field(
        default="maybe", min_length=1, description="The allowed answer that leaves a question open: when the "
        "paths' answer is this one (and the answer format allows others), the question is answered once more "
        "from its own retrieval (every tool with the question, prompt A.4); None keeps the paths' answer, "
        "as the paper does.")

    @field_validator("sufficiency_threshold", mode="before")
    @classmethod
    def _threshold(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("sufficiency_threshold must be a number or 'auto'")
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError("sufficiency_threshold must be finite")
        return value
