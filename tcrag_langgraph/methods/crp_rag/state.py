"""CRP-RAG's graph state: :class:`~tcrag_langgraph.core.state.MethodState` plus the reasoning graph,
its paths and the sufficiency threshold."""

from __future__ import annotations

from typing import Any, Optional

from ...core.state import MethodState

__all__ = ["CRPState"]


class CRPState(MethodState, total=False):
    """Graph state: :class:`~tcrag_langgraph.core.state.MethodState` (question, answer, costs, trace) plus
    the reasoning graph. Input is ``{"question": ...}`` or ``{"messages": [...]}``."""

    nodes: list[dict[str, Any]]  # the reasoning graph: one dict per node, edges as ``parents``
    depth: int
    threshold: float
    paths: list[list[int]]
    path_answers: list[str]
    path_score: Optional[float]  # the best path's worst (highest) node perplexity: what calibration uses
    state_history: list[dict[str, Any]]
