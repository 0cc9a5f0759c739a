"""The agent as a tool for another agent: :func:`agent_as_tool`.

``graph.as_tool()`` would expose the whole graph state as the tool's arguments, and
``as_chat_runnable(graph).as_tool()`` a list of messages; a calling agent's model should see one
argument, the question. :func:`agent_as_tool` gives a LangChain tool with the schema
``{"question": str}`` that runs the graph (any method of the registry, TC-RAG by default) and
returns ``{"answer", "validated", "halt_reason"}``: the answer, and whether the state monitor
validated it (an unvalidated answer is said to be one, never passed off as checked). It works
with ``langchain.agents.create_agent`` and LangGraph's prebuilt ``ToolNode`` / ``create_react_agent``,
sync and async.

The run keeps the tool call's callbacks (tracing, streaming) and the authenticated server user
(so EMR access acts for the same person), but not the calling agent's thread or checkpoint: the
tool's run is its own.

Example:
    >>> from tcrag_langgraph.testing import scripted_graph
    >>> graph = scripted_graph({"replies": ["Conclusion: vitamin C"], "default_score": 1.0})
    >>> tool = agent_as_tool(graph)
    >>> tool.name, sorted(tool.args)
    ('medical_question', ['question'])
    >>> tool.invoke({"question": "What prevents scurvy?"})
    {'answer': 'vitamin C', 'validated': True, 'halt_reason': 'validated'}
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field

from ..core.identity import AUTH_USER_KEY
from ..core.result import RunResult

__all__ = ["agent_as_tool", "QuestionInput", "DEFAULT_TOOL_DESCRIPTION"]

DEFAULT_TOOL_DESCRIPTION = (
    "Answer a medical question with a retrieval agent that searches medical documents, a knowledge graph, "
    "an encyclopedia and medical records, and checks its own answer. Returns the answer and whether it was "
    "validated; treat an answer that was not validated as unverified."
)


class QuestionInput(BaseModel):
    """What the calling agent's model writes: one question."""

    question: str = Field(description="The question to answer, in full, as one self-contained question.")


def _run_config(config: Optional[RunnableConfig]) -> dict[str, Any]:
    """The tool call's callbacks and authenticated user, nothing of the caller's thread or checkpoint."""
    if not config:
        return {}
    run: dict[str, Any] = {}
    for key in ("callbacks", "tags", "metadata"):
        if config.get(key) is not None:
            run[key] = config[key]
    user = (config.get("configurable") or {}).get(AUTH_USER_KEY)
    if user is not None:
        run["configurable"] = {AUTH_USER_KEY: user}
    return run


def _output(state: Mapping[str, Any]) -> dict[str, Any]:
    result = RunResult.from_state(state)
    return {"answer": result.answer, "validated": bool(result.answer_validated), "halt_reason": result.halt_reason}


def agent_as_tool(graph: Any, *, name: str = "medical_question", description: str = DEFAULT_TOOL_DESCRIPTION,
                  context: Optional[Mapping[str, Any]] = None) -> StructuredTool:
    """A LangChain tool over a compiled method graph (``build_graph`` / ``build_method``).

    Args:
        graph: the compiled graph; it is invoked with ``{"question": ...}``.
        name: the tool's name, as the calling model sees it (letters, digits, ``_`` and ``-``).
        description: what the calling model is told the tool does.
        context: per-run options for every call (e.g. ``{"max_steps": 4}``), as ``invoke(context=...)``.

    Returns:
        A tool with the argument schema ``{"question": str}`` returning
        ``{"answer": str | None, "validated": bool, "halt_reason": str}``.
    """
    if not hasattr(graph, "invoke") or not hasattr(graph, "ainvoke"):
        raise TypeError(f"graph must be a compiled graph (build_graph / build_method), got {type(graph).__name__}")
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"tool name must be letters, digits, '_' or '-', got {name!r}")
    extra = {"context": dict(context)} if context else {}

    def ask(question: str, config: RunnableConfig) -> dict[str, Any]:
        return _output(graph.invoke({"question": question}, config=_run_config(config), **extra))

    async def aask(question: str, config: RunnableConfig) -> dict[str, Any]:
        return _output(await graph.ainvoke({"question": question}, config=_run_config(config), **extra))

    return StructuredTool.from_function(func=ask, coroutine=aask, name=name, description=description,
                                        args_schema=QuestionInput)
