"""CRP-RAG's GC module, reasoning-graph construction: the ``Start`` node (input and threshold) and
the ``Expand`` node (next-step sampling, eq. 4, and merging of near-duplicate steps, eqs. 5-6)."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core.config import TCRAGConfig
from ...core.kernel import RunFailure, fresh_run
from ...core.run_input import extract_question
from ...core.state import TraceEvent
from .calibration import resolve_threshold
from .dag import check_dag, known_conditions
from .options import CRPRAGOptions
from .parsing import ParsedStep, StepParseError, merged_step, parse_step
from .reply_forms import MERGE_FORM, STEP_FORM
from .prompts import PROMPT_GENERATE, PROMPT_MERGE, STEP_FORMAT_HELP
from .state import CRPState

__all__ = ["start", "expand", "sample_step", "merge", "embed"]

# Each function is a method of the node holder (graph.CRPRAG names them as its attributes): "self" is it.

# ----- Start -----
def start(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Expand", "__end__"]]:
    base = fresh_run(nodes=[], depth=0, paths=[], path_answers=[], path_score=None, state_history=[])
    _, problem = extract_question(state, self.base_config)
    try:
        cfg, options = self.settings(config, runtime)
        threshold = resolve_threshold(options, self.model)
    except Exception as exc:  # a bad per-run context or a missing calibration: say so, lose nothing
        problem = problem or f"bad CRP-RAG options: {exc}"
        cfg, threshold = self.base_config, None
    if problem is not None:
        return self.halt({**state, **base}, config, reason="invalid_input", answer=None, validated=False,
                         error=problem, extra={**base, "question": None})
    # the question checked again against the run's own length limit
    return self.begin(state, config, cfg, goto="Expand", fresh={**base, "threshold": threshold})

# ----- GC: one construction iteration -----
def expand(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
    Literal["Expand", "Retrieve", "__end__"]
]:
    cfg, options = self.settings(config, runtime)
    counters = self.counters(state)
    events: list[TraceEvent] = []
    question = state["question"]
    nodes = [dict(n) for n in state.get("nodes", [])]
    depth = state.get("depth", 0) + 1
    by_id = {n["id"]: n for n in nodes}
    # Sinks to grow: the question itself at first, then every non-final sink not yet expanded.
    sinks: list[Optional[dict[str, Any]]] = [None] if not nodes else [
        n for n in nodes if not n["final"] and not n["expanded"]]
    samples: list[tuple[Optional[int], ParsedStep]] = []
    room = options.max_nodes - len(nodes)
    try:
        for sink in sinks:
            conditions = known_conditions(sink, by_id)
            for _ in range(options.fan_out):
                if len(samples) >= room:
                    break
                parsed = self.sample_step(question, conditions, options, cfg, config, counters, events, len(nodes))
                if parsed is not None:
                    samples.append((None if sink is None else sink["id"], parsed))
            if sink is not None:
                sink["expanded"] = True
        new_nodes = self.merge(question, samples, options, cfg, config, counters, events,
                               start_id=len(nodes), depth=depth)
    except RunFailure as failure:
        return self.end(state, config, counters, events, reason=failure.reason, error=str(failure),
                         extra={"nodes": nodes, "depth": depth})
    for node in new_nodes:
        nodes.append(node)
        counters["steps"] += 1
        self.trace_event(config, events, step=counters["steps"], action="Reasoning_Node", op="push",
                    content=node["text"], nodes=len(nodes),
                    detail={"id": node["id"], "parents": node["parents"], "depth": depth, "final": node["final"]})
    check_dag(nodes)
    update = {"nodes": nodes, "depth": depth, **counters, "trace": [*state.get("trace", []), *events]}
    if not nodes:
        return self.end(state, config, counters, events, reason="format_error",
                         error="no usable reasoning step was generated", extra={"nodes": nodes, "depth": depth})
    open_sinks = [n for n in nodes if not n["final"] and not n["expanded"]]
    if open_sinks and depth < options.max_depth and len(nodes) < options.max_nodes:
        return Command(goto="Expand", update=update)
    return Command(goto="Retrieve", update=update)

def sample_step(self, question: str, conditions: str, options: CRPRAGOptions, cfg: TCRAGConfig,
                config: RunnableConfig,
                counters: dict[str, Any], events: list[TraceEvent], n_nodes: int) -> Optional[ParsedStep]:
    """One sampled next step (eq. 4), re-prompted on an unusable reply; ``None`` if none came."""
    messages: list[BaseMessage] = [HumanMessage(content=PROMPT_GENERATE.format(question=question,
                                                                               conditions=conditions))]
    for attempt in range(options.max_step_retries + 1):
        text = self.ask(counters, messages, cfg, config, max_new_tokens=options.max_step_tokens,
                        temperature=options.sampling_temperature, form=STEP_FORM).strip()
        try:
            return parse_step(text)
        except StepParseError as err:
            self.trace_event(config, events, step=counters["steps"], action="Format_Error", op="format_error",
                        content=text[:500], nodes=n_nodes, detail={"error": str(err), "attempt": attempt + 1})
            messages = [*messages, AIMessage(content=text or "(empty)"),
                        HumanMessage(content=f"Your reply could not be used: {err}.\n{STEP_FORMAT_HELP}")]
    return None

def merge(self, question: str, samples: list[tuple[Optional[int], ParsedStep]], options: CRPRAGOptions,
          cfg: TCRAGConfig, config: RunnableConfig, counters: dict[str, Any], events: list[TraceEvent], *, start_id: int,
          depth: int) -> list[dict[str, Any]]:
    """Merge this iteration's near-duplicate steps (eqs. 5-6) into new node dicts.

    Each sample is compared, in order, with the groups formed so far; above the threshold it
    joins the most similar group (ties: the earliest), whose text the model rewrites from both.
    Identical texts merge without a model call. At most one merge per sample: bounded.
    """
    if not samples:
        return []
    groups: list[dict[str, Any]] = []
    vectors: list[Any] = []
    # One sample has nothing to merge with: the embedder is not even loaded.
    sample_vectors = self.embed([p.text for _, p in samples]) if len(samples) > 1 else [None]
    for (parent, parsed), vector in zip(samples, sample_vectors):
        best, best_sim = None, -1.0
        for index, group_vector in enumerate(vectors):
            similarity = float(group_vector @ vector)
            if similarity > best_sim:
                best, best_sim = index, similarity
        if best is None or best_sim <= options.merge_threshold:
            groups.append({"text": parsed.text, "final": parsed.final, "parents": [] if parent is None else [parent],
                           "members": [parsed.text]})
            vectors.append(vector)
            continue
        group = groups[best]
        before = group["text"]
        repair = None
        if _normal(parsed.text) != _normal(before):
            merged = self.ask(counters, [HumanMessage(content=PROMPT_MERGE.format(
                question=question, paragraphs=f"1. {before}\n2. {parsed.text}"))], cfg, config,
                max_new_tokens=options.max_step_tokens, temperature=cfg.temperature, form=MERGE_FORM).strip()
            merged_text = merged_step(merged)
            if merged_text is None:  # no labelled step (e.g. only a preamble): keep the first step
                repair = "no 'Next step:' line in the merge reply: kept the first step"
            else:
                group["text"] = merged_text
                vectors[best] = self.embed([group["text"]])[0]
        group["final"] = group["final"] or parsed.final
        if parent is not None and parent not in group["parents"]:
            group["parents"].append(parent)
        group["members"].append(parsed.text)
        self.trace_event(config, events, step=counters["steps"], action="Merge_Nodes", op="pop+push",
                    content=group["text"], nodes=start_id + len(groups), value=best_sim,
                    detail={"merged": [before, parsed.text], "similarity": round(best_sim, 4),
                            "parents": group["parents"], "repair": repair})
    return [{"id": start_id + i, "text": g["text"], "depth": depth, "parents": sorted(g["parents"]),
             "final": bool(g["final"]), "expanded": False, "merged_from": g["members"] if len(g["members"]) > 1
             else [], "knowledge": None, "evidence": [], "reasoning": None, "score": None, "sufficient": None}
            for i, g in enumerate(groups)]

def embed(self, texts: list[str]):
    from ...tools.documents import embed_texts

    return embed_texts(self.embeddings, texts)


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())
