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
    "build_graph": ".graph",
    "EVENT_NAME": ".graph",
    "HALT_REASONS": ".graph",
    "TCRAGConfig": ".config",
    "CallerContext": ".tools.identity",
    "TCRAGState": ".state",
    "Frame": ".state",
    "Action": ".state",
    "ToolCallRecord": ".state",
    "TraceEvent": ".state",
    "StateScorer": ".scoring",
    "LocalLMScorer": ".scoring",
    "scorer_for_model": ".scoring",
    "MonitorUnavailableError": ".scoring",
    "CompletionsLogprobScorer": ".remote_scorer",
    "LocalChatModel": ".models",
    "load_local_model": ".models",
    "resolve_chat_model": ".models",
    "resolve_sigma": ".eval.calibration",
    "RunResult": ".result",
    "HaltReason": ".transitions",
    "parse_action": ".actions",
    "ParsedAction": ".actions",
    "ActionParseError": ".actions",
    "as_chat_runnable": ".integration",
    "checkpoint_serde": ".integration",
    "tcrag_events": ".integration",
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
    from .actions import ActionParseError, ParsedAction, parse_action
    from .config import TCRAGConfig
    from .graph import EVENT_NAME, HALT_REASONS, build_graph
    from .integration import as_chat_runnable, checkpoint_serde, tcrag_events
    from .eval.calibration import resolve_sigma
    from .models import LocalChatModel, load_local_model, resolve_chat_model
    from .remote_scorer import CompletionsLogprobScorer
    from .result import RunResult
    from .scoring import LocalLMScorer, MonitorUnavailableError, StateScorer, scorer_for_model
    from .transitions import HaltReason
    from .state import Action, Frame, TCRAGState, ToolCallRecord, TraceEvent
    from .tools.identity import CallerContext
