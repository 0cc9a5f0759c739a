"""What the layer is told per tool (:class:`ToolOptions`) and how a backend names its failure (:class:`ToolFailure`)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ToolFailure", "ToolOptions", "MAX_OUTPUT_TOKENS", "MAX_TIMEOUT_S"]

#: The largest token budget of one observation or error the layer accepts (``ToolOptions``,
#: ``invoke_tool``); an agent's own option for it (``TCRAGConfig.max_observation_tokens``) uses the same.
MAX_OUTPUT_TOKENS = 100_000
#: The longest one tool call may be given, in seconds (same rule).
MAX_TIMEOUT_S = 3600.0


class ToolFailure(Exception):
    """Raised by a backend to choose the :class:`~tcrag_langgraph.tools.base.ToolError` kind it turns into.

    ``retryable=True`` also makes the layer retry it (like a ``transient`` exception type).

    Example:
        >>> raise ToolFailure("unavailable", "search server answered 503", retryable=True)  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ...
        tcrag_langgraph.tools.layer.options.ToolFailure: search server answered 503
    """

    def __init__(self, kind: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable


class ToolOptions(BaseModel):
    """Validated options of :func:`~tcrag_langgraph.tools.layer.make_tool` (all keyword-only there).

    Tool factories build one ``ToolOptions`` and pass it as ``make_tool(..., options=...)``;
    :func:`~tcrag_langgraph.tools.layer.invoke_tool` may override ``timeout_s`` and
    ``max_output_tokens`` for one call.

    Example:
        >>> ToolOptions(timeout_s=5, retries=1).retries
        1
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    timeout_s: float = Field(default=30.0, gt=0, le=MAX_TIMEOUT_S, description="Wall-clock limit of one tool call, retries included.")
    retries: int = Field(default=2, ge=0, le=10, description="Extra attempts after a transient failure.")
    backoff: float = Field(default=0.5, ge=0, le=60, description="First backoff wait in seconds; doubles per retry.")
    max_backoff: float = Field(default=8.0, ge=0, le=300)
    max_output_tokens: int = Field(
        default=512, ge=1, le=MAX_OUTPUT_TOKENS, description="Token budget of an observation and of an error message."
    )
    cache_size: int = Field(default=0, ge=0, le=100_000, description="LRU entries of successful results; 0 = no cache.")
    transient: tuple[type[BaseException], ...] = Field(default=(ConnectionError,), description="Exception types worth a retry.")
    primary_field: Optional[str] = Field(default=None, description="Field that receives plain text input.")
    secrets: tuple[str, ...] = Field(
        default=(), repr=False, description="Strings scrubbed (in every encoding) from observations, errors and logs."
    )
    holds_records: bool = Field(
        default=False, description="The tool returns patient-record text (EMR_SEARCH): see the egress rule (layer.egress).")
    sends_off_machine: bool = Field(
        default=False, description="The tool sends its input off this machine (a remote search provider or endpoint).")
    allow_record_egress: bool = Field(
        default=False, description="Operator's permission for this outbound tool to send record text; off by default.")
    record_egress_check: Literal["flow", "match"] = Field(
        default="flow", description="How an outbound tool keeps record text in: 'flow' refuses every call once the "
        "run has read a record (paraphrase and encodings cannot slip through); 'match' refuses only inputs that "
        "carry record text (normalised: NFKC, zero-width characters and separators folded) and encoded strings it "
        "cannot read: weaker, for operators who need general searches after a record was read.")

    @field_validator("transient", mode="before")
    @classmethod
    def _exception_types(cls, value: Any) -> Any:
        if isinstance(value, type):
            value = (value,)
        value = tuple(value)
        for item in value:
            if not (isinstance(item, type) and issubclass(item, BaseException)):
                raise ValueError(f"transient must hold exception types, got {item!r}")
        return value

    @field_validator("secrets", mode="before")
    @classmethod
    def _drop_empty_secrets(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = (value,)
        return tuple(s for s in (value or ()) if s)
