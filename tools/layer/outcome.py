"""What one tool call ends as: observation text or a :class:`ToolError`, both within budget and scrubbed."""

from __future__ import annotations

import json
from typing import Any, Iterable, Union

from langchain_core.messages import ToolMessage

from ..base import ToolError
from ..secrets import scrub_secrets
from ..tokens import count_tokens, trim_to_tokens

__all__ = ["ToolOutcome", "is_tool_error", "tool_error", "bounded_error", "bounded_observation", "content_text"]

#: The result of :func:`~tcrag_langgraph.tools.layer.invoke_tool`: observation text, or a typed error.
ToolOutcome = Union[str, ToolError]


def is_tool_error(value: Any) -> bool:
    """True for a failed tool call: a :class:`ToolError`, or a LangChain ``ToolMessage`` with ``status="error"``.

    The one test for "did this tool call fail" (eval, graph and callbacks use it); text is never
    guessed at, an observation that happens to look like an error frame is still evidence.

    Example:
        >>> is_tool_error(ToolError("DOC_RAG", "timeout", "no answer within 30 s")), is_tool_error("[DOC_RAG error: x]")
        (True, False)
    """
    if isinstance(value, ToolError):
        return True
    return isinstance(value, ToolMessage) and (value.status == "error" or isinstance(value.artifact, ToolError))


def bounded_error(error: ToolError, max_tokens: int, secrets: Iterable[str] = ()) -> ToolError:
    """``error`` scrubbed of ``secrets`` and trimmed so that ``str(error)`` fits ``max_tokens`` (plus the trim marker)."""
    header = count_tokens(str(ToolError(error.tool, error.kind, "")))
    message = trim_to_tokens(scrub_secrets(error.message, secrets), max(1, max_tokens - header))
    return ToolError(error.tool, error.kind, message, error.retryable)


def tool_error(tool: str, kind: str, message: str, *, max_tokens: int, secrets: Iterable[str] = (), retryable: bool = False) -> ToolError:
    """A new :class:`ToolError`, scrubbed and trimmed like every error the layer returns."""
    return bounded_error(ToolError(tool, kind, message, retryable), max_tokens, secrets)


def bounded_observation(text: str, max_tokens: int, secrets: Iterable[str] = ()) -> str:
    """Observation text scrubbed of ``secrets`` and trimmed to ``max_tokens``."""
    return trim_to_tokens(scrub_secrets(text, secrets), max_tokens)


def content_text(content: Any) -> str:
    """Plain text of what a tool returned or a message's ``content`` (a string, or LangChain content blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    if isinstance(content, (dict, tuple)):
        return json.dumps(content, ensure_ascii=False, default=str)
    return str(content)
