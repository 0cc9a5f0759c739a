"""Run configuration: paper defaults, ablation switches, and runtime overrides.

Precedence (lowest to highest): the ``config`` given to :func:`build_graph`, then
``config["configurable"]`` keys (LangServe only passes these), then the run's ``context``.
Only fields a caller set explicitly override the layer below.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

# sigma when none is given, per state value (paper section 8.7.6: 10 for cppl, 20 for uct)
from ..monitor.state_values import DEFAULT_SIGMA

# Identity is owned by the tools (EMR access control); the agent only carries it.
from ..tools.identity import CALLER_KEY, CallerContext, caller_from_config
from ..tools.layer.options import MAX_OUTPUT_TOKENS, MAX_TIMEOUT_S  # the tool layer's limits are ours

__all__ = ["TCRAGConfig", "CallerContext", "DEFAULT_SIGMA", "resolve_config", "request_option_fields",
           "caller_from_config", "CALLER_KEY"]



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

    metric: Literal["cppl", "uct", "cppl_evidence", "uct_evidence", "answer_prob", "consistency", "gen_answer_prob",
                    "gen_cppl", "gen_entropy", "gen_combined"] = Field(
        default="cppl", description="State value: cppl (conditional perplexity, eq. 2) or uct (uncertainty, eq. 3), "
        "the paper's; cppl_evidence / uct_evidence (the same, given the tool observations too), answer_prob "
        "(1 - the probability of the chosen answer among the allowed ones; needs an answer_format of choices) "
        "or consistency (1 - the share of the model's own resampled answers that agree; any chat model, no "
        "log-probs) go beyond it, as do gen_answer_prob, gen_cppl and gen_entropy (read off the log-probs of the "
        "reply that wrote the Conclusion: no second pass; llama.cpp and chat servers that return log-probs) "
        "and gen_combined (the three through a fit tcrag calibrate --metric gen_combined stores) "
        "(docs/monitor.md).")
    sigma: Optional[Union[Annotated[float, Field(gt=0)], Literal["auto"]]] = Field(
        default=None,
        description="Halting threshold; None = paper default for the metric; 'auto' = the model's stored "
        "calibration (tcrag calibrate), resolved when the graph is built; with a metric left unset, 'auto' also "
        "picks the state value whose calibration had the best AUROC.",
    )
    calibration_task: Optional[str] = Field(
        default=None, max_length=200,
        description="The task whose calibration sigma='auto' reads (e.g. pubmedqa, medmcqa; tcrag calibrate "
        "stores one per model, task and metric); None = the calibration stored without a task.")
    risk: Optional[float] = Field(
        default=None, gt=0, lt=1, json_schema_extra={"per_request": False},
        description="Validate with a stated risk instead of the paper's sigma: sigma is the threshold under which, "
        "by the model's stored calibration on calibration_task (tcrag calibrate), a validated answer is wrong at "
        "most this share of the time, with confidence 1 - risk_delta (docs/monitor.md). Set when the graph is built.")
    risk_delta: float = Field(
        default=0.1, gt=0, lt=1, json_schema_extra={"per_request": False},
        description="With risk: the chance that the calibration sample misleads (the guarantee holds with 1 - this).")
    initial_state_value: float = Field(default=1e9, gt=0, description="The 'large value' the state starts at.")
    max_steps: int = Field(default=12, ge=1, le=1000, description="Actions applied before the run halts unvalidated.")
    max_new_tokens: int = Field(default=500, ge=1, le=8192, description="Tokens the model may write per reply.")
    temperature: float = Field(default=0.6, ge=0.0, le=5.0, description="Sampling temperature (0 = greedy).")
    unlabeled_text: Literal["thought", "reprompt"] = Field(
        default="thought", description="Prose with no action label: keep it as a Thought, or re-prompt."
    )
    max_format_retries: int = Field(default=2, ge=0, le=20, description="Re-prompts after unparseable output, per step.")
    max_question_chars: int = Field(default=20_000, ge=1, description="Longer questions are refused.")
    max_observation_tokens: int = Field(default=512, ge=16, le=MAX_OUTPUT_TOKENS, description="Tool output is trimmed to this many tokens.")
    tool_timeout_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S, description="Hard limit on one tool call.")
    enable_backtrack: bool = Field(default=True, description="Offer Backtrack (ablation switch).")
    enable_summary: bool = Field(default=True, description="Offer Summary (ablation switch).")
    enable_state_monitor: bool = Field(
        default=True, description="Halt only when the state value falls below sigma; off: on the model's own Conclusion.")
    record_generation_values: bool = Field(
        default=False, json_schema_extra={"per_request": False},
        description="Ask the model for its tokens' log-probs at every step and keep the final answer's generation "
        "values (gen_answer_prob, gen_cppl, gen_entropy) in the result, whatever the metric (tcrag calibrate sets it "
        "to measure them).")
    require_review: bool = Field(default=False, description="Pause for human approval before a Conclusion is accepted.",
                                 json_schema_extra={"per_request": False})
    review_unvalidated: bool = Field(
        default=False, description="Pause for a person's review when a run would end with an answer the state "
        "monitor did not validate: resume with 'approve', {'answer': '...'} (a corrected answer) or 'reject'.",
        json_schema_extra={"per_request": False})
    constrain_replies: bool = Field(
        default=True, description="Constrain a reply whose form the method declares (a logical-form plan, an action "
        "line, a triple): a GBNF grammar for llama.cpp, a grammar or JSON schema for a server that honours one; off, "
        "or for any other model: parse and repair only (docs/models.md, constrained generation).")
    loop_when_unjudged: bool = Field(
        default=False, description="Run Algorithm 1's rejection loop even when the model's calibration says the "
        "state monitor cannot judge it (to replicate the paper with such a model); by default its first Conclusion "
        "ends the run, unvalidated (halt monitor_cannot_judge).")
    max_rejections: Optional[int] = Field(
        default=None, ge=0, le=1000, description="How many times the state monitor may reject a Conclusion with "
        "the loop going on; the next rejection ends the run unvalidated with that Conclusion as its answer (halt "
        "rejections_spent). 0: the first Conclusion ends every run, validated or not, at about ReAct's cost "
        "(benchmarks/RESULTS.md section 32). Not set (the default): Algorithm 1's loop, bounded by max_steps.")
    language: Literal["en", "zh"] = Field(default="en", description="Prompt language.")
    few_shot: bool = Field(default=True, description="Show worked examples of the action format before the stack.")
    example_from_observation: Optional[bool] = Field(
        default=None, description="With tools, the worked Conclusion example is written from its search's result "
        "on the stack: fewer calls and tokens on yes/no questions, worse free-form answers with the 1.5B "
        "(benchmarks/RESULTS.md section 30). Not set (the default): on where answer_format lists the allowed answers.")
    answer_format: Optional[Union[tuple[str, ...], SkipJsonSchema[type[BaseModel]]]] = Field(
        default=None,
        description="The form the final answer must take: a list of allowed answers (e.g. yes/no/maybe, "
                    "option letters) or a Pydantic model class; a Conclusion that does not fit is not accepted.")
    caller: Optional[CallerContext] = Field(
        default=None, json_schema_extra={"per_request": False},
        description="Identity handed to tools (EMR access control); only from trusted configuration.")

    @field_validator("answer_format", mode="before")
    @classmethod
    def _answer_format(cls, value: Any) -> Any:
        from .answer_format import validate_format

        return validate_format(value)

    @field_validator("sigma", mode="before")
    @classmethod
    def _sigma_number(cls, value: Any) -> Any:
        import math

        if isinstance(value, bool):
            raise ValueError("sigma must be a number or 'auto'")
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"sigma must be a number or 'auto', not {value!r}") from None
        if isinstance(number, (int, float)) and not math.isfinite(number):
            raise ValueError("sigma must be finite")
        return value

    @model_validator(mode="after")
    def _finite(self) -> "TCRAGConfig":
        import math

        for name in ("initial_state_value", "temperature"):  # sigma: checked by its own validator
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be finite")
        if self.risk is not None and self.sigma is not None:
            raise ValueError("risk sets sigma from the model's calibration: give risk or sigma, not both")
        # answer_prob with no answer_format is allowed here: a run can bring its format in the context
        # (tcrag eval does, per question); a run without one halts with scorer_error saying so.
        if (self.metric in ("answer_prob", "gen_answer_prob", "gen_combined") and self.enable_state_monitor
                and self.answer_format is not None and not isinstance(self.answer_format, tuple)):
            raise ValueError(f"metric {self.metric!r} weighs the allowed answers: give answer_format a list of "
                             "choices (e.g. yes,no,maybe or option letters), not a model class")
        return self

    @property
    def effective_sigma(self) -> float:
        """sigma as a number: the set value, else the paper's default for the metric.

        ``sigma="auto"`` has no number until the model is known: resolve it first with
        ``tcrag_langgraph.monitor.calibration.resolve_sigma(config, model_id)``; here it is a ValueError.
        """
        if self.sigma == "auto":
            raise ValueError(
                "sigma='auto' is resolved from the model's calibration at graph build time "
                "(tcrag_langgraph.monitor.calibration.resolve_sigma(config, model_id))"
            )
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

    def conclusion_example_from_observation(self) -> bool:
        """Whether the worked Conclusion example shows its search's result (``example_from_observation``;
        None: only where the answer is one of listed choices, the form it was measured on; with free-form
        answers it made two of the 1.5B's five main-job answers wrong, RESULTS.md section 30)."""
        if self.example_from_observation is not None:
            return self.example_from_observation
        return isinstance(self.answer_format, tuple)

    def merged(self, overrides: "TCRAGConfig | Mapping[str, Any] | None") -> "TCRAGConfig":
        """Return a copy with the explicitly set fields of ``overrides`` applied."""
        values = _explicit(overrides)
        if not values:
            return self
        merged = type(self).model_validate({**self.model_dump(), **values})
        # what was set explicitly stays known (sigma="auto" leaves an unset metric to the calibration)
        object.__setattr__(merged, "__pydantic_fields_set__", set(self.model_fields_set) | set(values))
        return merged


def request_option_fields() -> tuple[str, ...]:
    """The :class:`TCRAGConfig` fields a remote client may set per request (``tcrag serve``).

    Generated from the fields themselves (``json_schema_extra={"per_request": False}`` opts a field
    out), so a new option needs no second declaration. ``caller`` is an identity, never an option;
    ``require_review`` and ``review_unvalidated`` pause a run for a person: the server's operator decides
    (``tcrag serve --review-unvalidated``, with its review route), never a request.
    """
    return tuple(
        name for name, field in TCRAGConfig.model_fields.items()
        if (field.json_schema_extra or {}).get("per_request", True)
    )


def resolve_config(
    base: TCRAGConfig,
    *,
    configurable: Mapping[str, Any] | None = None,
    context: TCRAGConfig | Mapping[str, Any] | None = None,
    trust_client_identity: bool = False,
) -> TCRAGConfig:
    """Apply ``configurable`` then ``context`` overrides on top of ``base``.

    Only what was explicitly given overrides: for ``context`` the fields set on the
    :class:`TCRAGConfig` (``model_fields_set``), for ``configurable`` the keys present (servers must
    pass only what the client sent, as ``tcrag serve`` does), so a client asking for
    ``metric="cppl"`` on a server built with ``uct`` gets ``cppl``.

    ``caller`` is never taken from either layer: both are written by the client, and an identity
    must come from trusted configuration or an authenticated server user
    (:func:`tcrag_langgraph.core.identity.caller_for_run`). ``trust_client_identity=True`` is the explicit
    opt-in for in-process callers who build the context themselves.
    """
    cfg = base
    for layer in (configurable, context):
        values = _explicit(layer)
        if not trust_client_identity:
            values.pop("caller", None)
        cfg = cfg.merged(values)
    return cfg


def _explicit(overrides: "TCRAGConfig | Mapping[str, Any] | None") -> dict[str, Any]:
    """The options ``overrides`` sets explicitly (fields set on a config, keys of a mapping)."""
    if overrides is None:
        return {}
    if isinstance(overrides, TCRAGConfig):
        return {name: getattr(overrides, name) for name in overrides.model_fields_set}
    return {k: v for k, v in dict(overrides).items() if k in TCRAGConfig.model_fields}
