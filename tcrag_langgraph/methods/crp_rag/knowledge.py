"""CRP-RAG's KRA module and knowledge sufficiency: the ``Retrieve`` node (every tool on every node,
aggregation, eq. 8) and the ``Evaluate`` node (the perplexity of the node's reasoning, eqs. 9-10)."""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core.config import TCRAGConfig
from ...core.kernel import RunFailure
from ...core.state import TraceEvent
from .prompts import PROMPT_AGGREGATE, PROMPT_REASON
from .state import CRPState

__all__ = ["retrieve", "evaluate", "search", "results_listing"]

# Each function is a method of the node holder (graph.CRPRAG names them as its attributes): "self" is it.

# ----- KRA -----
def search(self, counters: dict[str, Any], text: str, cfg: TCRAGConfig,
           config: RunnableConfig) -> tuple[list[tuple[str, str]], list[str]]:
    """Every tool called once with ``text`` through the tool layer: ``([(tool, result)], ["tool: error kind"])``;
    a tool error or an empty result is never evidence."""
    results: list[tuple[str, str]] = []
    failures: list[str] = []
    for tool in self.tools.values():
        record = self.call_tool(counters, tool, text, cfg, config)
        if record.is_error:
            failures.append(f"{tool.name}: {record.error_kind}")
        elif record.observation.strip():
            results.append((tool.name, record.observation.strip()))
    return results, failures


def results_listing(results: list[tuple[str, str]]) -> str:
    """Search results as the prompts show them: ``[1] (TOOL) text`` a line each."""
    return "\n".join(f"[{i}] ({name}) {text}" for i, (name, text) in enumerate(results, 1))


def retrieve(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
    Literal["Evaluate", "__end__"]
]:
    cfg, options = self.settings(config, runtime)
    counters = self.counters(state)
    events: list[TraceEvent] = []
    nodes = [dict(n) for n in state["nodes"]]
    try:
        for node in nodes:
            results, failures = search(self, counters, node["text"], cfg, config)
            node["evidence"] = [name for name, _ in results]
            listing = results_listing(results)
            if not results:
                node["knowledge"] = ""
            elif options.aggregate_knowledge:
                node["knowledge"] = self.ask(
                    counters, [HumanMessage(content=PROMPT_AGGREGATE.format(step=node["text"], results=listing))],
                    cfg, config).strip()
            else:
                node["knowledge"] = listing
            counters["steps"] += 1
            self.trace_event(config, events, step=counters["steps"], action="Node_Knowledge", op="push",
                        content=node["knowledge"], nodes=len(nodes),
                        detail={"id": node["id"], "tools": node["evidence"], "tool_errors": failures})
    except RunFailure as failure:
        return self.end(state, config, counters, events, reason=failure.reason, error=str(failure),
                         extra={"nodes": nodes})
    return Command(goto="Evaluate", update={"nodes": nodes, **counters,
                                            "trace": [*state.get("trace", []), *events]})

# ----- AG: knowledge sufficiency -----
def evaluate(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
    Literal["Select", "__end__"]
]:
    counters = self.counters(state)
    events: list[TraceEvent] = []
    nodes = [dict(n) for n in state["nodes"]]
    threshold = state["threshold"]
    cfg, _ = self.settings(config, runtime)
    try:
        for node in nodes:
            counters["steps"] += 1
            if not node["knowledge"]:  # nothing retrieved: no knowledge can be sufficient
                node.update(reasoning=None, score=None, sufficient=False)
                self.trace_event(config, events, step=counters["steps"], action="Sufficiency", op="reject",
                            content=node["text"], nodes=len(nodes),
                            detail={"id": node["id"], "sufficient": False, "why": "no evidence retrieved"})
                continue
            prompt = PROMPT_REASON.format(step=node["text"], knowledge=node["knowledge"])
            reasoning = self.ask(counters, [HumanMessage(content=prompt)], cfg, config).strip()
            if not reasoning:
                score, why = None, "empty reasoning"
            else:
                score, why = self.score(prompt, reasoning, metric="cppl"), None
            sufficient = score is not None and score < threshold
            node.update(reasoning=reasoning, score=score, sufficient=sufficient)
            self.trace_event(config, events, step=counters["steps"], action="Sufficiency",
                        op="noop" if sufficient else "reject", content=reasoning, nodes=len(nodes), value=score,
                        detail={"id": node["id"], "sufficient": sufficient, "threshold": threshold, "why": why})
    except RunFailure as failure:
        return self.end(state, config, counters, events, reason=failure.reason, error=str(failure),
                         extra={"nodes": nodes})
    return Command(goto="Select", update={"nodes": nodes, **counters,
                                          "trace": [*state.get("trace", []), *events]})
