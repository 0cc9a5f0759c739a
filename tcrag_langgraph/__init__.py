"""tcrag-langgraph: TC-RAG (Turing-Complete RAG) as a LangGraph agent.

Example:
    >>> from tcrag_langgraph import build_graph, TCRAGConfig
    >>> graph = build_graph(config=TCRAGConfig(max_steps=6))  # doctest: +SKIP
    >>> graph.invoke({"question": "What is the first-line drug for type 2 diabetes?"})["answer"]  # doctest: +SKIP

The names below are exported lazily: ``import tcrag_langgraph.tools`` (plain LangChain tools any
agent can use) must not pull in the graph, torch or the model.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: public name -> the module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    "build_graph": ".methods.tcrag.graph",
    "EVENT_NAME": ".core.events",
    "HALT_REASONS": ".methods.tcrag.graph",
    "TCRAGConfig": ".core.config",
    "CallerContext": ".tools.identity",
    "TCRAGState": ".methods.tcrag.state",
    "Frame": ".core.state",
    "Action": ".core.state",
    "ToolCallRecord": ".core.state",
    "TraceEvent": ".core.state",
    "StateScorer": ".monitor.scoring",
    "LocalLMScorer": ".monitor.scoring",
    "scorer_for_model": ".monitor.own_model",
    "MonitorUnavailableError": ".monitor.scoring",
    "CompletionsLogprobScorer": ".monitor.served",
    "LocalChatModel": ".models.local",
    "load_local_model": ".models.local",
    "resolve_chat_model": ".models.resolve",
    "resolve_sigma": ".monitor.calibration",
    "RunResult": ".core.result",
    "HaltReason": ".methods.tcrag.transitions",
    "parse_action": ".methods.tcrag.actions",
    "ParsedAction": ".methods.tcrag.state",
    "ActionParseError": ".methods.tcrag.actions",
    "as_chat_runnable": ".faces.integration",
    "checkpoint_serde": ".faces.integration",
    "tcrag_events": ".faces.integration",
    "agent_as_tool": ".faces.agent_tool",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tcrag_langgraph' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # static type checkers and IDEs see the real names
    from .core.config import TCRAGConfig
    from .core.events import EVENT_NAME
    from .core.result import RunResult
    from .core.state import Action, Frame, ToolCallRecord, TraceEvent
    from .faces.agent_tool import agent_as_tool
    from .faces.integration import as_chat_runnable, checkpoint_serde, tcrag_events
    from .methods.tcrag.actions import ActionParseError, parse_action
    from .methods.tcrag.graph import HALT_REASONS, build_graph
    from .methods.tcrag.state import ParsedAction, TCRAGState
    from .methods.tcrag.transitions import HaltReason
    from .models.local import LocalChatModel, load_local_model
    from .models.resolve import resolve_chat_model
    from .monitor.calibration import resolve_sigma
    from .monitor.own_model import scorer_for_model
    from .monitor.scoring import LocalLMScorer, MonitorUnavailableError, StateScorer
    from .monitor.served import CompletionsLogprobScorer
    from .tools.identity import CallerContext
