"""The result of one TC-RAG run, in one shape for every face.

:class:`RunResult` is built from a final graph state; the graph's final ``AIMessage`` metadata,
``tcrag ask --json``, ``tcrag serve`` and the evaluation harness all read it, so a run is described
the same way everywhere.

Example:
    >>> from tcrag_langgraph.testing import scripted_graph
    >>> state = scripted_graph({"replies": ["Conclusion: yes"], "default_score": 1}).invoke({"question": "Is it?"})
    >>> r = RunResult.from_state(state)
    >>> r.answer, r.answer_validated, r.halt_reason
    ('yes', True, 'validated')
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import BaseModel, Field

from .state import Action, Frame, TraceEvent, observations

__all__ = ["RunResult", "Source"]


class Source(BaseModel):
    """A successful tool call whose observation is on the final stack (what the answer could use)."""

    tool: str
    tool_input: Any = None
    step: int = 0


def _texts(items: Any) -> list[str]:
    """The ``"text"`` of each read piece (``knowledge``, or the adaptive methods' retrieval rounds in
    ``evidence``, which share its item shape); errors and other shapes are skipped."""
    return [k["text"] for k in items or [] if isinstance(k, Mapping) and isinstance(k.get("text"), str)]


class RunResult(BaseModel):
    """Answer, validation, why the run stopped, the state value, costs, and the stack and trace."""

    question: Optional[str] = None
    answer: Optional[str] = None
    structured_answer: Any = Field(default=None, description="The answer in the asked answer_format, if any.")
    answer_validated: bool = False
    confidence: Optional[float] = Field(default=None, description=(
        "The calibrated probability that the answer is right (the stored calibration's fit of correctness "
        "on the state value); None without a calibration of this model, task and state value."))
    answer_generation_values: dict[str, float] = Field(default_factory=dict, description=(
        "The answer's gen_answer_prob, gen_cppl and gen_entropy, read off the log-probs of the reply that wrote it "
        "(empty unless the run asked the model for them: a gen_* metric or record_generation_values)."))
    halt_reason: Optional[str] = None
    error: Optional[str] = None
    metric: Optional[str] = None
    sigma: Optional[float] = None
    state_value: Optional[float] = None
    steps: int = 0
    llm_calls: int = 0
    tool_calls: int = 0
    repeated_tool_calls: int = Field(default=0, description="Identical tool calls refused (not run again).")
    token_usage: dict[str, int] = Field(default_factory=dict)
    sources: list[Source] = Field(default_factory=list)
    stack: list[Frame] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list, description=(
        "What the tools returned and the answer stood on: the tool observations on the final stack, or "
        "the knowledge a retrieve-then-answer method read (errors are never evidence)."))
    trace: list[TraceEvent] = Field(default_factory=list)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RunResult":
        """Read a (final) graph state; a missing key takes its empty value."""
        stack = list(state.get("stack") or [])
        sources = [
            Source(tool=f.tool_call.tool, tool_input=f.tool_call.tool_input, step=f.step)
            for f in stack
            if f.action is Action.TOOL_USE and f.tool_call is not None and not f.tool_call.is_error
        ]
        halt = state.get("halt_reason")
        return cls(
            question=state.get("question"),
            answer=state.get("answer"),
            structured_answer=state.get("structured_answer"),
            answer_validated=bool(state.get("answer_validated")),
            confidence=state.get("confidence"),
            answer_generation_values=dict(state.get("answer_generation_values") or {}),
            halt_reason=getattr(halt, "value", halt),
            error=state.get("error"),
            metric=state.get("metric"),
            sigma=state.get("sigma"),
            state_value=state.get("state_value"),
            steps=state.get("steps") or 0,
            llm_calls=state.get("llm_calls") or 0,
            tool_calls=state.get("tool_calls") or 0,
            repeated_tool_calls=state.get("repeated_tool_calls") or 0,
            token_usage=dict(state.get("token_usage") or {}),
            sources=sources,
            stack=stack,
            evidence=observations(stack) if stack else _texts(state.get("knowledge")) or _texts(state.get("evidence")),
            trace=list(state.get("trace") or []),
        )

    @property
    def text(self) -> str:
        """What a chat user reads: the answer, or why there is none."""
        return self.answer if self.answer else f"No answer: {self.error or self.halt_reason}"

    def metadata(self) -> dict[str, Any]:
        """The compact facts a chat message carries (``AIMessage.response_metadata``)."""
        return {
            "answer_validated": self.answer_validated,
            "confidence": self.confidence,
            "halt_reason": self.halt_reason,
            "state_value": self.state_value,
            "sigma": self.sigma,
            "metric": self.metric,
            "steps": self.steps,
            "structured_answer": self.structured_answer,
            "sources": [s.model_dump(mode="json") for s in self.sources],
            "stack": [f.action.value for f in self.stack],
        }

    def to_json_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (``tcrag ask --json``)."""
        return self.model_dump(mode="json")
