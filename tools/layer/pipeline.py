"""The one tool-call pipeline an agent uses: :func:`invoke_tool` (and :func:`ainvoke_tool`).

One call, one deadline, one trim, one error type, for any LangChain tool:

* a :class:`~tcrag_langgraph.tools.layer.LayeredTool` (from ``make_tool``) runs its own layer
  with the call's ``timeout_s``/``max_output_tokens`` in place of its options, so its retries
  happen inside the call's deadline and nothing else waits on it;
* any other ``BaseTool`` runs in a worker of the shared tool pool (see
  :mod:`~tcrag_langgraph.tools.layer.pool` for what happens to a call that overruns) and its
  result is typed here: a raise is kind ``"exception"``, an empty result ``"bad_response"``,
  the deadline ``"timeout"``.

Either way the outcome is observation text within ``max_output_tokens`` or a
:class:`~tcrag_langgraph.tools.base.ToolError` whose ``str()`` is within it too. LangChain
callbacks (``on_tool_start``/``on_tool_end``) fire as for ``tool.invoke``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable, Optional

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool

from ..base import ToolError
from .options import MAX_OUTPUT_TOKENS, MAX_TIMEOUT_S, ToolOptions
from .outcome import ToolOutcome, bounded_error, bounded_observation, content_text, tool_error
from .pool import CallLimits, DeadlineExceeded, arun_before_deadline, call_limits, run_before_deadline
from .tool import LayeredTool

__all__ = ["invoke_tool", "ainvoke_tool"]

_DEFAULTS = ToolOptions()


def _limits(timeout_s: Optional[float], max_output_tokens: Optional[int]) -> tuple[float, int]:
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {timeout_s!r}")
    if max_output_tokens is not None and not (isinstance(max_output_tokens, int) and 1 <= max_output_tokens <= MAX_OUTPUT_TOKENS):
        raise ValueError(f"max_output_tokens must be an int in [1, {MAX_OUTPUT_TOKENS}], got {max_output_tokens!r}")
    return (timeout_s or _DEFAULTS.timeout_s, max_output_tokens or _DEFAULTS.max_output_tokens)


def _typed(tool: BaseTool, result: Any, max_tokens: int, secrets: Iterable[str]) -> ToolOutcome:
    """Whatever the tool returned, as observation text or a ToolError, scrubbed and within budget."""
    if isinstance(result, ToolMessage):
        if isinstance(result.artifact, ToolError):
            result = result.artifact
        elif result.status == "error":
            return tool_error(tool.name, "exception", content_text(result.content), max_tokens=max_tokens, secrets=secrets)
        else:
            result = result.content
    if isinstance(result, ToolError):
        return bounded_error(result, max_tokens, secrets)
    text = content_text(getattr(result, "content", result)).replace("\x00", "").strip()
    if not text:
        return tool_error(tool.name, "bad_response", "the tool returned nothing", max_tokens=max_tokens, secrets=secrets)
    return bounded_observation(text, max_tokens, secrets)


def invoke_tool(
    tool: BaseTool,
    tool_input: Any,
    *,
    config: Optional[RunnableConfig] = None,
    timeout_s: Optional[float] = None,
    max_output_tokens: Optional[int] = None,
) -> ToolOutcome:
    """Run ``tool`` once on ``tool_input``: the observation text, or a :class:`ToolError`. Never raises for a tool fault.

    Args:
        tool: any LangChain ``BaseTool``; a ``LayeredTool`` uses its layer (repair, retries, cache,
            secrets) with this call's limits.
        tool_input: what the agent wrote (text, a dict, JSON text, or a LangChain ``ToolCall``).
        config: the ``RunnableConfig`` handed to the tool (callbacks, caller identity).
        timeout_s: the call's one deadline in seconds, retries included (default: the
            LayeredTool's own ``timeout_s``; 30 s for other tools).
        max_output_tokens: budget of the observation and of ``str(error)`` (default: the
            LayeredTool's own; 512 for other tools). Trimmed text ends with ``…[trimmed]``.

    Returns:
        ``ToolOutcome = str | ToolError``. Error kinds: ``"timeout"`` (deadline passed),
        ``"exception"`` (a plain tool raised), ``"bad_response"`` (empty result), and the layer's
        own (``"bad_input"``, ``"unavailable"``, ``"internal"``, ``"forbidden"`` ...). Test with
        :func:`~tcrag_langgraph.tools.layer.is_tool_error`.

    Raises:
        ValueError: ``timeout_s`` or ``max_output_tokens`` out of range (a caller bug, not a tool fault).

    Example:
        >>> from pydantic import BaseModel
        >>> from tcrag_langgraph.tools.layer import make_tool
        >>> class Q(BaseModel):
        ...     query: str
        >>> echo = make_tool("ECHO", "Repeat.", lambda a: (a.query + " ") * 50, args_schema=Q)
        >>> invoke_tool(echo, "ab", max_output_tokens=3)
        'ab ab ab …[trimmed]'
    """
    if isinstance(tool, LayeredTool):
        _limits(timeout_s, max_output_tokens)  # validate only: the tool's options fill what is unset
        with call_limits(CallLimits(timeout_s, max_output_tokens)):
            result = tool.invoke(tool_input, config)
        if isinstance(result, (str, ToolError)):
            return result  # the layer already scrubbed and trimmed it
        options = tool.options
        budget = max_output_tokens or options.max_output_tokens
        return _typed(tool, result, budget, options.secrets)
    timeout, budget = _limits(timeout_s, max_output_tokens)
    deadline = time.monotonic() + timeout
    try:
        result = run_before_deadline(lambda: tool.invoke(tool_input, config), deadline)
    except DeadlineExceeded:
        return tool_error(tool.name, "timeout", f"no answer within {timeout:g} s", max_tokens=budget, retryable=True)
    except Exception as exc:  # a raising tool is an error, never evidence
        return tool_error(tool.name, "exception", f"{type(exc).__name__}: {exc}", max_tokens=budget)
    return _typed(tool, result, budget, ())


async def ainvoke_tool(
    tool: BaseTool,
    tool_input: Any,
    *,
    config: Optional[RunnableConfig] = None,
    timeout_s: Optional[float] = None,
    max_output_tokens: Optional[int] = None,
) -> ToolOutcome:
    """Async twin of :func:`invoke_tool` (same arguments, same outcome).

    A native async tool is cancelled at the deadline; a sync one runs in the shared tool pool.
    """
    if isinstance(tool, LayeredTool):
        _limits(timeout_s, max_output_tokens)
        with call_limits(CallLimits(timeout_s, max_output_tokens)):
            result = await tool.ainvoke(tool_input, config)
        if isinstance(result, (str, ToolError)):
            return result
        options = tool.options
        return _typed(tool, result, max_output_tokens or options.max_output_tokens, options.secrets)
    timeout, budget = _limits(timeout_s, max_output_tokens)
    deadline = time.monotonic() + timeout
    try:
        if type(tool)._arun is BaseTool._arun:  # no native async: LangChain would use its own executor
            result = await arun_before_deadline(lambda: tool.invoke(tool_input, config), deadline)
        else:
            result = await asyncio.wait_for(tool.ainvoke(tool_input, config), max(0.0, deadline - time.monotonic()))
    except (DeadlineExceeded, asyncio.TimeoutError):
        return tool_error(tool.name, "timeout", f"no answer within {timeout:g} s", max_tokens=budget, retryable=True)
    except Exception as exc:
        return tool_error(tool.name, "exception", f"{type(exc).__name__}: {exc}", max_tokens=budget)
    return _typed(tool, result, budget, ())
