"""tcrag-langgraph: TC-RAG (Turing-Complete RAG) and the papers' other methods as LangGraph agents.

Example:
    >>> from tcrag_langgraph import TCRAGConfig, build_agent
    >>> agent = build_agent("tcrag", config=TCRAGConfig(max_steps=6))  # doctest: +SKIP
    >>> agent.invoke({"question": "What is the first-line drug for type 2 diabetes?"})["answer"]  # doctest: +SKIP

The public names, each what a user needs and nothing more; everything else stays importable from
its own module (``tcrag_langgraph.core.state.Frame``, ``tcrag_langgraph.methods.tcrag.actions.parse_action``,
...). They are exported lazily: ``import tcrag_langgraph.tools`` (plain LangChain tools any agent can
use) must not pull in the graph, torch or the model.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: public name -> the module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    "build_agent": ".methods.registry",
    "build_graph": ".methods.tcrag.graph",
    "METHODS": ".methods.registry",
    "TCRAGConfig": ".core.config",
    "RunResult": ".core.result",
    "CallerContext": ".tools.identity",
    "agent_as_tool": ".faces.agent_tool",
    "as_chat_runnable": ".faces.integration",
    "checkpoint_serde": ".faces.integration",
}

__all__ = [*_EXPORTS, "tools"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "tools":  # the tools package: plain LangChain tools, usable without the rest
        return import_module(".tools", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tcrag_langgraph' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
