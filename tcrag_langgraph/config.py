"""Run configuration: paper defaults, ablation switches, and runtime overrides.

Precedence (lowest to highest): the ``config`` given to :func:`build_graph`, then
``config["configurable"]`` keys (LangServe only passes these), then the run's ``context``.
Only fields a caller set explicitly override the layer below.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["TCRAGConfig", "CallerContext", "DEFAULT_SIGMA", "resolve_config", "caller_from_config", "CALLER_KEY"]

#: Key under ``config["configurable"]`` where the graph hands the caller identity to tools.
CALLER_KEY = "tcrag_caller"

#: Paper section 8.7.6: sigma = 10 for cppl and 20 for uct.
DEFAULT_SIGMA: dict[str, float] = {"cppl": 10.0, "uct": 20.0}


class CallerContext(BaseModel):
    """Who is asking. Tools that hold patient data (EMR) only show what this caller may see.

    ``allowed_patient_ids=None`` means no patient records at all, never "everything".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: str = Field(min_length=1)
    roles: tuple[str, ...] = ()
    allowed_patient_ids: Optional[tuple[str, ...]] = None

    def may_see(self, patient_id: str) -> bool:
        return self.allowed_patient_ids is not None and str(patient_id) in self.allowed_patient_ids


def caller_from_config(config: Mapping[str, Any] | None) -> Optional[CallerContext]:
    """The caller a tool was invoked for, from its RunnableConfig (None if anonymous)."""
    if not config:
        return None
    value = (config.get("configurable") or {}).get(CALLER_KEY)
    if value is None or isinstance(value, CallerContext):
        return value
    return CallerContext.model_validate(value)


class TCRAGConfig(BaseModel):
    """Options of a TC-RAG run. Every field has the paper's default.

    Example:
        >>> cfg = TCRAGConfig(metric="uct")
        >>> cfg.effective_sigma
        20.0
        >>> TCRAGConfig(sigma=5, enable_backtrack=False).allowed_actions()
        ['Thought', 'Plan', 'Tool_Use', 'Summary', 'Conclusion']
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    metric: Literal["cppl", "uct"] = "cppl"
    sigma: Optional[float] = Field(default=None, gt=0, description="Halting threshold; None = paper default for the metric.")
    initial_state_value: float = Field(default=1e9, gt=0, description="The 'large value' the state starts at.")
    max_steps: int = Field(default=12, ge=1, le=1000, description="Actions applied before the run halts unvalidated.")
    max_new_tokens: int = Field(default=500, ge=1, le=8192)
    temperature: float = Field(default=0.6, ge=0.0, le=5.0)
    unlabeled_text: Literal["thought", "reprompt"] = Field(
        default="thought", description="Prose with no action label: keep it as a Thought, or re-prompt."
    )
    max_format_retries: int = Field(default=2, ge=0, le=20, description="Re-prompts after unparseable output, per step.")
    max_question_chars: int = Field(default=20_000, ge=1)
    max_observation_tokens: int = Field(default=512, ge=16, description="Tool output is trimmed to this many tokens.")
    tool_timeout_s: float = Field(default=60.0, gt=0, le=3600, description="Hard limit on one tool call.")
    enable_backtrack: bool = True
    enable_summary: bool = True
    enable_state_monitor: bool = True
    require_review: bool = Field(default=False, description="Pause for human approval before a Conclusion is accepted.")
    language: Literal["en", "zh"] = "en"
    few_shot: bool = Field(default=True, description="Show worked examples of the action format before the stack.")
    caller: Optional[CallerContext] = Field(default=None, description="Identity handed to tools (EMR access control).")

    @field_validator("sigma", mode="before")
    @classmethod
    def _sigma_number(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("sigma must be a number")
        return value

    @model_validator(mode="after")
    def _finite(self) -> "TCRAGConfig":
        import math

        for name in ("sigma", "initial_state_value", "temperature"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be finite")
        return self

    @property
    def effective_sigma(self) -> float:
        return float(self.sigma if self.sigma is not None else DEFAULT_SIGMA[self.metric])

    def allowed_actions(self, *, has_tools: bool = True) -> list[str]:
        """The action names offered to the model under this configuration."""
        names = ["Thought", "Plan"]
        if has_tools:
            names.append("Tool_Use")
        if self.enable_summary:
            names.append("Summary")
        if self.enable_backtrack:
            names.append("Backtrack")
        names.append("Conclusion")
        return names

    def merged(self, overrides: "TCRAGConfig | Mapping[str, Any] | None") -> "TCRAGConfig":
        """Return a copy with the explicitly set fields of ``overrides`` applied."""
        if overrides is None:
            return self
        if isinstance(overrides, TCRAGConfig):
            values = {name: getattr(overrides, name) for name in overrides.model_fields_set}
        else:
            values = {k: v for k, v in dict(overrides).items() if k in type(self).model_fields}
        if not values:
            return self
        return type(self).model_validate({**self.model_dump(), **values})


def resolve_config(
    base: TCRAGConfig,
    *,
    configurable: Mapping[str, Any] | None = None,
    context: TCRAGConfig | Mapping[str, Any] | None = None,
) -> TCRAGConfig:
    """Apply ``configurable`` then ``context`` overrides on top of ``base``."""
    if configurable:
        # Servers such as LangServe fill every configurable field with its class default; a value
        # equal to the default there is treated as unset so it does not undo the build-time config.
        defaults = {name: field.default for name, field in TCRAGConfig.model_fields.items()}
        configurable = {k: v for k, v in configurable.items() if k in defaults and v != defaults[k]}
    cfg = base.merged(configurable)
    return cfg.merged(context)
