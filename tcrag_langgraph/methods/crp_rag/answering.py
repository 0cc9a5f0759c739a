"""CRP-RAG's AG module after sufficiency: the ``Select`` node (sufficient source-to-sink paths, or
abstention) and the ``Answer`` node (reasoning along each path, eqs. 11-12, integration, eq. 13, and,
not in the paper, an answer that leaves the question open settled from the question's own retrieval)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core import answer_format
from ...core.config import TCRAGConfig
from ...core.kernel import RunFailure
from ...core.state import TraceEvent
from .dag import best_path_score, node_by_id, select_paths
from .knowledge import results_listing, search
from .prompts import LAST_STEP_NOTE, PROMPT_INTEGRATE, PROMPT_PATH_STEP, PROMPT_SETTLE
from .reply_forms import answer_form, answer_line_form
from .state import CRPState

__all__ = ["select", "answer"]

# Each function is a method of the node holder (graph.CRPRAG names them as its attributes): "self" is it.

# ----- AG: path selection -----
def select(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
    Literal["Answer", "__end__"]
]:
    cfg, options = self.settings(config, runtime)
    counters = self.counters(state)
    events: list[TraceEvent] = []
    nodes = state["nodes"]
    paths = select_paths(nodes, max_paths=options.max_paths)
    best = best_path_score(nodes)
    history = [*state.get("state_history", []), {"step": counters["steps"], "action": "Select", "value": best,
                                                "raw": best}]
    extra = {"paths": paths, "path_score": best, "state_value": best, "state_history": history}
    if not paths:
        insufficient = [n["id"] for n in nodes if not n.get("sufficient")]
        return self.end(state, config, counters, events, reason="abstained",
                         error=f"no source-to-sink path of knowledge-sufficient nodes (threshold "
                               f"{state['threshold']:g}; insufficient nodes {insufficient})", extra=extra)
    for path in paths:
        counters["steps"] += 1
        self.trace_event(config, events, step=counters["steps"], action="Reasoning_Path", op="push",
                    content=" -> ".join(node_by_id(nodes, i)["text"] for i in path), nodes=len(nodes),
                    value=max(node_by_id(nodes, i)["score"] for i in path), detail={"path": path})
    return Command(goto="Answer", update={**extra, **counters,
                                          "trace": [*state.get("trace", []), *events]})

# ----- AG: answers along the paths, integrated -----
def answer(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["__end__"]]:
    counters = self.counters(state)
    events: list[TraceEvent] = []
    nodes = state["nodes"]
    question = state["question"]
    cfg, options = self.settings(config, runtime)
    fmt = cfg.answer_format
    rule = answer_format.instructions(fmt)
    # the last step's and the integration's reasoning, bounded to fit the reply's budget, then the "Answer:" line
    form = answer_form(fmt, max_new_tokens=cfg.max_new_tokens)
    rule_note = f" The line after 'Answer:' is your Conclusion. {rule}" if rule else ""
    answers: list[str] = []
    retries = 0
    validated = True  # an answer from knowledge-sufficient paths
    # what the path answers read: each node's knowledge once, in path order
    on_paths = dict.fromkeys(node_id for path in state["paths"] for node_id in path)
    read = [{"text": node["knowledge"]} for node in (node_by_id(nodes, i) for i in on_paths) if node["knowledge"]]
    try:
        final_messages: list[BaseMessage] = []
        for path in state["paths"]:
            conditions: list[str] = []
            result = ""
            for position, node_id in enumerate(path):
                node = node_by_id(nodes, node_id)
                last = position == len(path) - 1
                prompt = PROMPT_PATH_STEP.format(question=question, conditions="\n".join(conditions) or "(none yet)",
                                                 step=node["text"], knowledge=node["knowledge"],
                                                 last=LAST_STEP_NOTE + rule_note if last else "")
                final_messages = [HumanMessage(content=prompt)]
                result = self.ask(counters, final_messages, cfg, config, form=form if last else None).strip()
                conditions.append(f"{node['text']} {result}".strip())  # eq. 12: condition_n + result_n
            answers.append(result)
            counters["steps"] += 1
            self.trace_event(config, events, step=counters["steps"], action="Path_Answer", op="push",
                        content=result, nodes=len(nodes), detail={"path": path})
        if len(answers) == 1:
            text = answers[0]
        else:
            listing = "\n".join(f"{i}. {a}" for i, a in enumerate(answers, 1))
            final_messages = [HumanMessage(content=PROMPT_INTEGRATE.format(question=question, answers=listing)
                                           + rule_note)]
            text = self.ask(counters, final_messages, cfg, config, form=form).strip()
        final, structured, problem, retries = _fitted(self, counters, final_messages, text, cfg, config)
        left_open = _open_choice(fmt, options.open_answer)
        if problem is None and left_open is not None and structured == left_open:
            settled = _settle_open(self, counters, events, question, len(nodes), cfg, config, form=form,
                                   rule_note=rule_note, left_open=left_open)
            if settled is not None and settled[1] != left_open:
                # the answer now comes from the question's own retrieval, which no sufficiency check judged
                (final, structured), validated = settled, False
    except RunFailure as failure:
        return self.end(state, config, counters, events, reason=failure.reason, error=str(failure),
                         extra={"path_answers": answers, "knowledge": read})
    extra = {"path_answers": answers, "format_retries": retries, "knowledge": read,
             "structured_answer": structured if fmt is not None and problem is None else None}
    if not final:
        return self.end(state, config, counters, events, reason="format_error", error="the final answer is empty",
                         extra=extra)
    if problem is not None:
        return self.end(state, config, counters, events, reason="format_error", answer=final,
                         error=f"no answer in the asked format after {retries} re-prompts: {problem}", extra=extra)
    return self.end(state, config, counters, events, reason="answered", answer=final, validated=validated,
                     extra=extra)


def _fitted(self, counters: dict[str, Any], messages: list[BaseMessage], text: str, cfg: TCRAGConfig,
            config: RunnableConfig) -> tuple[str, Any, Optional[str], int]:
    """The answer after the reply's last ``Answer:`` line, checked against the asked format and re-prompted
    (bounded: at most ``max_format_retries`` times) for the answer line alone while it does not fit:
    ``(answer, structured answer, what is wrong or None, re-prompts)``."""
    fmt = cfg.answer_format
    rule = answer_format.instructions(fmt)
    final = answer_format.final_answer(text, keep_label=False)
    structured, problem = answer_format.check(fmt, final)
    retries = 0
    while fmt is not None and problem is not None and retries < cfg.max_format_retries:
        retries += 1
        # the reply before reasoned already: the re-prompt asks for the answer line alone
        messages = [*messages, AIMessage(content=text or "(empty)"),
                    HumanMessage(content=f"Your answer could not be used: {problem}. {rule} "
                                         "Reply with the line 'Answer: <your answer>' alone.")]
        text = self.ask(counters, messages, cfg, config, form=answer_line_form(fmt)).strip()
        final = answer_format.final_answer(text, keep_label=False)
        structured, problem = answer_format.check(fmt, final)
    return final, structured, problem, retries


def _open_choice(fmt: Any, open_answer: Optional[str]) -> Optional[str]:
    """The allowed answer that leaves the question open (as the format spells it), when the format also
    allows another; else None: nothing to settle."""
    if open_answer is None or not isinstance(fmt, tuple) or len(fmt) < 2:
        return None
    return next((choice for choice in fmt if choice.casefold() == open_answer.strip().casefold()), None)


def _settle_open(self, counters: dict[str, Any], events: list[TraceEvent], question: str, graph_size: int,
                 cfg: TCRAGConfig, config: RunnableConfig, *, form: Any, rule_note: str,
                 left_open: str) -> Optional[tuple[str, Any]]:
    """The question answered once more from its own retrieval (every tool with the question, prompt A.4's
    request), after the paths left it open: ``(answer, structured answer)``, or None when nothing was
    retrieved or the reply does not fit the format (then the paths' answer stands)."""
    results, _ = search(self, counters, question, cfg, config)
    settled: Optional[tuple[str, Any]] = None
    text: Optional[str] = None
    if results:
        messages: list[BaseMessage] = [HumanMessage(content=PROMPT_SETTLE.format(
            question=question, knowledge=results_listing(results)) + rule_note)]
        text = self.ask(counters, messages, cfg, config, form=form).strip()
        final, structured, problem, _ = _fitted(self, counters, messages, text, cfg, config)
        if problem is None:
            settled = (final, structured)
    counters["steps"] += 1
    self.trace_event(config, events, step=counters["steps"], action="Open_Answer", op="push",
                     content="" if settled is None else settled[0], nodes=graph_size,
                     detail={"left_open": left_open, "tools": [name for name, _ in results],
                             "settled": None if settled is None else settled[1],
                             # its reasoning comes first: what a result row keeps says why it stayed open
                             "reply": text})
    return settled
