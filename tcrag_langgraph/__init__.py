"""tcrag-langgraph: TC-RAG (Turing-Complete RAG) as a LangGraph agent.

Example:
    >>> from tcrag_langgraph import build_graph, TCRAGConfig
    >>> graph = build_graph(config=TCRAGConfig(max_steps=6))  # doctest: +SKIP
    >>> graph.invoke({"question": "What is the first-line drug for type 2 diabetes?"})["answer"]  # doctest: +SKIP
"""

from .actions import ActionParseError, ParsedAction, parse_action
from .config import CallerContext, TCRAGConfig
from .graph import EVENT_NAME, HALT_REASONS, build_graph
from .integration import as_chat_runnable, checkpoint_serde, tcrag_events
from .models import LocalChatModel, load_local_model
from .scoring import LocalLMScorer, StateScorer
from .state import Action, Frame, TCRAGState, ToolCallRecord, TraceEvent

__all__ = [
    "build_graph",
    "TCRAGConfig",
    "CallerContext",
    "TCRAGState",
    "Frame",
    "Action",
    "ToolCallRecord",
    "TraceEvent",
    "StateScorer",
    "LocalLMScorer",
    "LocalChatModel",
    "load_local_model",
    "parse_action",
    "ParsedAction",
    "ActionParseError",
    "as_chat_runnable",
    "checkpoint_serde",
    "tcrag_events",
    "EVENT_NAME",
    "HALT_REASONS",
]
__version__ = "0.1.0"
