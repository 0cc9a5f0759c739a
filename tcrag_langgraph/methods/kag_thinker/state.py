"""KAG-Thinker's graph state: :class:`~tcrag_langgraph.core.state.MethodState` plus the plan and the solving position."""

from __future__ import annotations

from typing import Any, Optional

from ...core.state import MethodState


class KAGThinkerState(MethodState, total=False):
    """Graph state: :class:`~tcrag_langgraph.core.state.MethodState` plus the plan and where solving is.
    Input ``{"question": ...}`` or ``{"messages": [...]}``. Every value is plain data (logical forms
    as ``LogicalForm.model_dump()`` dicts) so any checkpointer stores it."""

    forms: list[dict[str, Any]]  # the plan: LogicalForm dicts
    cursor: int  # index (0-based) into forms of the form being solved
    solutions: list[dict[str, Any]]  # one per solved form: index, function, answer, source, resolved
    depth: Optional[dict[str, Any]]  # the Retrieval form being depth-solved: query, turn, draft, focus
