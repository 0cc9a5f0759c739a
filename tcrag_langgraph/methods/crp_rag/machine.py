"""The core of CRP-RAG's node holder on the run kernel: the embedder, the trace events of its
reasoning graph, and the end of a run (the model call, scorer, tool calls, settings and halt are the
kernel's, :mod:`tcrag_langgraph.machine.kernel`)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.types import Command

from ...machine.config import TCRAGConfig
from ...machine.kernel import RunFailure, RunKernel
from ...machine.state import TraceEvent
from .options import CRPRAGOptions

__all__ = ["RunFailure", "CRPRAGMachine"]


class CRPRAGMachine(RunKernel):
    """Holds the model, tools, scorer and embedder; the stages' node classes (construction, knowledge,
    answering) build on it."""

    options_type = CRPRAGOptions

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, embeddings: Any,
                 config: TCRAGConfig, options: CRPRAGOptions, *, trust_client_identity: bool = False) -> None:
        super().__init__(model, tools, scorer, config, options, trust_client_identity=trust_client_identity)
        self.embeddings = embeddings

    def position(self, state: Mapping[str, Any]) -> tuple[int, Optional[float]]:
        """A CRP-RAG run stands at the size of its reasoning graph and its best path's score."""
        return len(state.get("nodes") or []), state.get("path_score")

    def trace_event(self, config: RunnableConfig, events: list[TraceEvent], *, step: int, action: str, op: str,
                    content: str = "", nodes: int = 0, value: Optional[float] = None,
                    detail: Optional[dict[str, Any]] = None) -> None:
        """Record one event of the reasoning graph (emitted live) into ``events``."""
        event = TraceEvent(step=step, action=action, op=op, content=content[:2000], stack_depth=nodes,
                           state_value=value,
                           detail=None if detail is None else json.dumps(detail, ensure_ascii=False, default=str))
        events.extend(self.record(None, config, event))

    def end(self, state: Mapping[str, Any], config: RunnableConfig, counters: dict[str, Any],
            events: list[TraceEvent], *, reason: str, answer: Optional[str] = None, validated: bool = False,
            error: Optional[str] = None, extra: Optional[dict[str, Any]] = None) -> Command:
        """Halt (the kernel's) with this node's counters and events."""
        update = {**(extra or {}), **counters, "trace": [*state.get("trace", []), *events]}
        return self.halt(state, config, reason=reason, answer=answer, validated=validated, error=error, extra=update)
