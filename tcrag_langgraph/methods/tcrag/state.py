"""The memory stack of TC-RAG's stack machine: its operations and the machine's graph state.

The stack operations (:func:`push`, :func:`pop`, :func:`replace_top`) keep the stack's invariant (the
User_Query stays at the bottom); the rules of Algorithm 1 that use them, with the state value, are
in :mod:`.transitions`. The frame types themselves are shared by every method's result
(:mod:`tcrag_langgraph.core.state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ...core.state import Action, Frame, MethodState

__all__ = ["ParsedAction", "TCRAGState", "StackError", "push", "pop", "replace_top", "render_stack"]


@dataclass(frozen=True)
class ParsedAction:
    """One action parsed from the model's reply (:func:`tcrag_langgraph.methods.tcrag.actions.parse_action`),
    kept typed until a graph node applies it."""

    action: Action
    content: str = ""
    tool: Optional[str] = None
    tool_input: Any = None
    repairs: tuple[str, ...] = field(default_factory=tuple)


class StackError(RuntimeError):
    """Raised when a stack operation would break an invariant (e.g. popping the User_Query)."""


def push(stack: list[Frame], frame: Frame) -> list[Frame]:
    """Return a new stack with ``frame`` on top."""
    if frame.action is Action.USER_QUERY and stack:
        raise StackError("User_Query may only be the bottom frame")
    return [*stack, frame]


def pop(stack: list[Frame]) -> tuple[list[Frame], Frame]:
    """Return ``(new_stack, popped_frame)``; the bottom User_Query can never be popped."""
    if len(stack) <= 1:
        raise StackError("the User_Query frame at the bottom of the stack cannot be popped")
    return stack[:-1], stack[-1]


def replace_top(stack: list[Frame], frame: Frame) -> tuple[list[Frame], Frame]:
    """Pop the top frame and push ``frame`` (the Summary operation)."""
    rest, popped = pop(stack)
    return push(rest, frame), popped


def render_stack(stack: list[Frame]) -> str:
    """The stack as the text the model reads, bottom first."""
    return "\n".join(frame.render() for frame in stack)


class TCRAGState(MethodState, total=False):
    """The stack machine's graph state: :class:`MethodState` plus the stack, sigma and the pending action."""

    stack: list[Frame]
    sigma: float
    metric: str
    state_history: list[dict[str, Any]]
    format_feedback: list[dict[str, str]]
    pending_action: Optional[ParsedAction]  # the typed parse of the model's reply, until applied
    #: the pending action's generation values (monitor.generation), when the run asked for log-probs
    generated_values: dict[str, float]
    final_conclusion: bool  # the step budget is spent: the pending Conclusion is the last one
    last_call: bool  # no usable action after the re-prompts: only a final Conclusion is asked for
    repeated_tool_calls: int  # identical tool calls refused (not executed again)
    repeat_call_warned: bool  # the model was told once that a call's result is on the stack
    search_ended: bool  # it wrote such a call again: only a final Conclusion is asked for
    #: the step of the rejection whose Conclusion the model wrote again and was told to leave: a second
    #: repeat halts the run (repeated_conclusion)
    repeat_warned: Optional[int]
