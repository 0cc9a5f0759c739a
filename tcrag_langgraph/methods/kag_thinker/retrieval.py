"""The Retrieval nodes: knowledge-boundary determination (generate first, then assess: both the
stated confidence and the likelihood test must pass) and depth solving (retrieve with the tools,
focus, then answer or issue the next Retrieval form, for at most ``max_depth_turns`` turns)."""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core.config import TCRAGConfig
from ...core.kernel import RunFailure
from .forms import LogicalForm
from .options import KAGThinkerOptions
from .prompts import BOUNDARY_PROMPT, CONFIDENCE_PROMPT, FOCUS_PROMPT
from .replies import FocusResult, parse_boundary_answer, parse_confidence, parse_focus
from .reply_forms import focus_form
from .state import KAGThinkerState

# Each function is a method of the node holder (graph.KAGThinker names them as its attributes): "self" is it.

def retrieval(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
              work: dict[str, Any]) -> Command[Literal["Depth_Solve", "Retrieval", "Math", "Deduce", "Output", "__end__"]]:
    """Knowledge-boundary determination: generate first, then assess (both tests must pass)."""
    cfg, options = self.settings(config, runtime)
    form = LogicalForm.model_validate(state["forms"][state["cursor"]])
    answers = self.answers(state)
    question = self.substitute(form.step, form, answers)
    work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"))
    depth = {"index": form.index, "query": question, "turn": 0, "draft": None, "focus": ""}
    if not options.knowledge_boundary:
        work.update(depth=depth)
        return Command(goto="Depth_Solve", update=work)
    if self.scorer is None or not hasattr(self.scorer, "token_logprobs"):
        raise RunFailure("scorer_error", "knowledge_boundary is on for this run, but the graph has no scorer with "
                     "token_logprobs (build it with one, or run with knowledge_boundary=False)")
    prompt = BOUNDARY_PROMPT.format(question=question)
    generated = parse_boundary_answer(self.ask(work, [HumanMessage(content=prompt)], cfg, config))
    check: dict[str, Any] = {"step": form.index, "question": question, "generated": generated,
                             "tau": options.min_token_prob}
    confident = likely = False
    if generated is not None:
        verdict = parse_confidence(self.ask(
            work, [HumanMessage(content=CONFIDENCE_PROMPT.format(question=question, answer=generated))], cfg, config))
        confident = verdict is True
        try:
            logprobs = self.token_logprobs(prompt, generated)
            min_prob = math.exp(min(logprobs)) if logprobs else 0.0
            likely = min_prob >= options.min_token_prob
            check["min_token_prob"] = round(min_prob, 6)
        except Exception as exc:  # no likelihood, no pass: the step retrieves (an error is never evidence)
            check["likelihood_error"] = f"{type(exc).__name__}: {exc}"
        check.update(stated_confidence=verdict)
    check.update(confident=confident, likely=likely, skip_retrieval=confident and likely)
    work["trace"] = self.event({**state, **work}, config, action="Knowledge_Boundary", content=generated or "",
                               detail=check)
    if confident and likely:
        return self.solved(state, work, config, form, answer=generated, source="internal")
    work.update(depth={**depth, "draft": generated})
    return Command(goto="Depth_Solve", update=work)

def depth_solve(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
                work: dict[str, Any]) -> Command[Literal["Depth_Solve", "Retrieval", "Math", "Deduce", "Output", "__end__"]]:
    """One depth turn: retrieve with the current query, focus, then answer or issue the next form."""
    cfg, options = self.settings(config, runtime)
    form = LogicalForm.model_validate(state["forms"][state["cursor"]])
    depth = dict(state["depth"])
    turn = depth["turn"] + 1
    work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"),
                tool_calls=state.get("tool_calls", 0), steps=state.get("steps", 0) + 1)
    references, called = self.retrieve(work, depth["query"], cfg, options, config)
    work["trace"] = self.event({**state, **work}, config, action="Retrieve", content=depth["query"],
                               detail={"step": form.index, "turn": turn, "calls": called})
    work["knowledge"] = [*(state.get("knowledge") or []), *({"tool": tool, "text": text} for tool, text in references)]
    if not references:  # nothing usable came back: a further turn would ask the same tools again
        return self.unresolved(state, work, config, form, depth, turn, why="no usable references")
    answers = self.answers(state)
    known = {name: item for f in state["forms"][: state["cursor"]] for name, item in
             LogicalForm.model_validate(f).defines.items()}
    # The form's own named entities may be searched again; its own answer is what is sought.
    known.update({name: item for name, item in form.defines.items() if item.step != form.index})
    earlier = "".join(f"#{k}: {answers.get(k, '')}\n" for k in form.references)
    prompt = FOCUS_PROMPT.format(
        known=f"Known answers:\n{earlier}" if earlier else "",
        references="\n".join(f"{i}. [{tool}] {text}" for i, (tool, text) in enumerate(references)),
        question=depth["query"])
    focus: FocusResult = self.ask_parsed(
        work, [HumanMessage(content=prompt)], lambda t: parse_focus(t, index=form.index, known=known), cfg, config,
        what="Focus", instructions="Write <focus>...</focus> then <answer>...</answer>, or Step: ... and "
        "Action: Retrieval(...).", form=focus_form(form.index))
    detail = {"step": form.index, "turn": turn, "focus": focus.focus, "repairs": focus.repairs}
    if focus.answer is not None:
        work["trace"] = self.event({**state, **work}, config, action="Focus", content=focus.answer,
                                   detail={**detail, "outcome": "answer"})
        return self.solved(state, work, config, form, answer=focus.answer, source="retrieved",
                           detail={"turns": turn})
    next_query = self.substitute(focus.next_form.step, focus.next_form, answers)
    work["trace"] = self.event({**state, **work}, config, action="Logical_Form", content=next_query,
                               detail={**detail, "outcome": "next_form", "action": focus.next_form.action})
    depth.update(turn=turn, focus=focus.focus or depth.get("focus", ""), query=next_query)
    if turn >= options.max_depth_turns:
        return self.unresolved(state, work, config, form, depth, turn,
                               why=f"no answer within {options.max_depth_turns} depth turns")
    work["depth"] = depth
    return Command(goto="Depth_Solve", update=work)

def unresolved(self, state: Mapping[str, Any], work: dict[str, Any], config: RunnableConfig, form: LogicalForm,
               depth: Mapping[str, Any], turn: int, *, why: str) -> Command:
    """The turn bound (or the tools) ran out: keep the best text there is, marked unresolved."""
    answer = depth.get("focus") or depth.get("draft") or "unknown"
    return self.solved(state, work, config, form, answer=answer, source="unresolved", resolved=False,
                       detail={"turns": turn, "why": why})

def retrieve(self, work: dict[str, Any], query: str, cfg: TCRAGConfig, options: KAGThinkerOptions,
             config: RunnableConfig) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """Call each retrieval tool once through the tool layer (the kernel's: the caller's identity, one
    deadline, one trim); errors are recorded, never evidence."""
    names = options.retrieval_tools if options.retrieval_tools is not None else tuple(self.tools)
    references, called = [], []
    for name in names:
        record = self.call_tool(work, self.tools[name], query, cfg, config)
        if record.is_error:
            called.append({"tool": name, "error": record.error_kind})
        else:
            called.append({"tool": name, "chars": len(record.observation)})
            references.append((name, record.observation))
    return references, called
