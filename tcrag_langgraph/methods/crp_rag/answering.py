"""CRP-RAG's AG module after sufficiency: the ``Select`` node (sufficient source-to-sink paths, or
abstention) and the ``Answer`` node (reasoning along each path, eqs. 11-12, integration, eq. 13)."""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core import answer_format
from ...core.kernel import RunFailure
from ...core.state import TraceEvent
from .dag import best_path_score, node_by_id, select_paths
from .prompts import LAST_STEP_NOTE, PROMPT_INTEGRATE, PROMPT_PATH_STEP
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
    cfg, _ = self.settings(config, runtime)
    fmt = cfg.answer_format
    rule = answer_format.instructions(fmt)
    # the last step's and the integration's reasoning, bounded to fit the reply's budget, then the "Answer:" line
    form = answer_form(fmt, max_new_tokens=cfg.max_new_tokens)
    rule_note = f" The line after 'Answer:' is your Conclusion. {rule}" if rule else ""
    answers: list[str] = []
    final_messages: list[BaseMessage] = []
    retries = 0
    # what the path answers read: each node's knowledge once, in path order
    on_paths = dict.fromkeys(node_id for path in state["paths"] for node_id in path)
    read = [{"text": node["knowledge"]} for node in (node_by_id(nodes, i) for i in on_paths) if node["knowledge"]]
    try:
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
        final = answer_format.final_answer(text, keep_label=False)
        structured, problem = answer_format.check(fmt, final)
        # Bounded: at most max_format_retries re-prompts when the answer does not fit the asked format.
        while fmt is not None and problem is not None and retries < cfg.max_format_retries:
            retries += 1
            # the reply before reasoned already: the re-prompt asks for the answer line alone
            final_messages = [*final_messages, AIMessage(content=text or "(empty)"),
                              HumanMessage(content=f"Your answer could not be used: {problem}. {rule} "
                                                   "Reply with the line 'Answer: <your answer>' alone.")]
            text = self.ask(counters, final_messages, cfg, config, form=answer_line_form(fmt)).strip()
            final = answer_format.final_answer(text, keep_label=False)
            structured, problem = answer_format.check(fmt, final)
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
    return self.end(state, config, counters, events, reason="answered", answer=final, validated=True,
                     extra=extra)
