"""One layer for every TC-RAG tool: input repair, validation, one deadline, retries, trimming, caching, secrets.

:func:`make_tool` wraps a plain backend function into a LangChain :class:`~langchain_core.tools.BaseTool`
that never raises. On success it returns the observation text (trimmed to a token budget); on any
failure it returns a :class:`~tcrag_langgraph.tools.base.ToolError` the graph shows as an error.
:func:`invoke_tool` is the one function an agent calls to run any tool (layered or not) with one
deadline and one token budget; :func:`is_tool_error` is the one test for a failed call.

The backend function receives the *validated* pydantic model of its arguments, and, if it declares
a ``config`` parameter, the call's ``RunnableConfig`` (for the caller identity). It may return a
``str`` (the observation) or a :class:`ToolError`, raise :class:`ToolFailure` to pick the error kind,
or raise one of the ``transient`` exception types to be retried with exponential backoff.

Rooms: :mod:`.repair` (input repair), :mod:`.options` (ToolOptions, ToolFailure), :mod:`.pool`
(the deadline and the shared thread pool), :mod:`.outcome` (ToolOutcome, trimming, error typing),
:mod:`.tool` (LayeredTool, make_tool), :mod:`.pipeline` (invoke_tool), :mod:`.egress` (record text
never leaves through an outbound tool unless the operator allows it). Secrets are scrubbed by
:mod:`tcrag_langgraph.tools.secrets`.

Example:
    >>> from pydantic import BaseModel
    >>> class Q(BaseModel):
    ...     query: str
    >>> echo = make_tool("ECHO", "Repeat the query.", lambda a: f"you said {a.query}", args_schema=Q)
    >>> echo.invoke("hello")
    'you said hello'
    >>> echo.invoke({"text": "hi"})          # wrong key, mapped to the only field
    'you said hi'
    >>> echo.invoke('```{"query": "x"}```')  # JSON inside a code fence
    'you said x'
    >>> echo.invoke({"query": 3, "k": 1}).kind
    'bad_input'
"""

from __future__ import annotations

from ..base import ToolError
from .egress import RECORDS_KEY
from .options import ToolFailure, ToolOptions
from .outcome import ToolOutcome, is_tool_error
from .pipeline import ainvoke_tool, invoke_tool
from .pool import TOOL_POOL_WORKERS
from .repair import InputRepairError, repair_input
from .tool import LayeredTool, make_tool

__all__ = [
    "ToolError",
    "ToolFailure",
    "ToolOptions",
    "ToolOutcome",
    "LayeredTool",
    "make_tool",
    "invoke_tool",
    "ainvoke_tool",
    "is_tool_error",
    "repair_input",
    "InputRepairError",
    "TOOL_POOL_WORKERS",
    "RECORDS_KEY",
]
