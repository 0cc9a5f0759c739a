"""TC-RAG agent tools (installed as ``tcrag_langgraph.tools``)."""

from .base import ToolError

__all__ = ["ToolError"]
