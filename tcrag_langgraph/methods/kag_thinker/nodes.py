"""The other nodes of the graph: ``Start`` (the question in), ``Decompose`` (the breadth plan of
logical forms), ``Math``, ``Deduce`` and ``Output`` (the final answer, in the asked answer format)."""

from __future__ import annotations

import re
from typing import Any, Literal, Mapping

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core import answer_format
from ...core.config import TCRAGConfig
from ...core.kernel import RunFailure, fresh_run
from .arithmetic import ArithmeticRefused, _expression_side, _format_number, evaluate_arithmetic
from .forms import LogicalForm, LogicalFormParseError
from .parsing import parse_logical_forms
from .prompts import (
    DECOMPOSE_EXAMPLE_QUESTION,
    DECOMPOSE_EXAMPLE_REPLY,
    DECOMPOSE_INSTRUCTIONS,
    DEDUCE_PROMPT,
    MATH_PROMPT,
    NO_KNOWN_FACTS,
    OUTPUT_PROMPT,
)
from .replies import _parse_deduction
from .reply_forms import DEDUCE_FORM, MATH_FORM, answer_choice_form, plan_form
from .state import KAGThinkerState
from .text import _normalise, _tagged

# Each function is a method of the node holder (graph.KAGThinker names them as its attributes): "self" is it.

# ----- nodes -----
def start(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime) -> Command[
    Literal["Decompose", "__end__"]
]:
    cfg, _ = self.settings(config, runtime)
    return self.begin(state, config, cfg, goto="Decompose",
                      fresh=fresh_run(forms=[], cursor=0, solutions=[], depth=None))

def decompose(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
              work: dict[str, Any]) -> Command[Literal["Retrieval", "Math", "Deduce", "Output", "__end__"]]:
    cfg, options = self.settings(config, runtime)
    instructions = DECOMPOSE_INSTRUCTIONS.format(max_forms=options.max_logical_forms)
    messages: list[BaseMessage] = [
        SystemMessage(content=instructions),
        HumanMessage(content=f"Question: {DECOMPOSE_EXAMPLE_QUESTION}"), AIMessage(content=DECOMPOSE_EXAMPLE_REPLY),
        HumanMessage(content=f"Question: {state['question']}"),
    ]
    work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"),
                steps=state.get("steps", 0))
    plan_cfg = cfg if options.max_plan_tokens is None else cfg.model_copy(
        update={"max_new_tokens": options.max_plan_tokens})
    # a plan the token budget cut keeps its complete steps (the kernel says whether the budget ended it)
    parse = lambda t: parse_logical_forms(t, max_forms=options.max_logical_forms, cut=bool(work.get("reply_cut")))  # noqa: E731
    plan = self.ask_parsed(work, messages, parse,
                           plan_cfg, config, what="Logical_Form",
                           instructions="Write StepN: / ActionN: pairs as in the example, the last one an Output.",
                           form=plan_form(options.max_logical_forms))
    forms = [f.model_dump() for f in plan.forms]
    for form in plan.forms:
        detail = {"step": form.index, "function": form.function, "action": form.action,
                  "references": form.references}
        if form.index == 1 and plan.repairs:
            detail["repairs"] = plan.repairs
        work["trace"] = self.event(work, config, action="Logical_Form", content=form.step, detail=detail)
    work.update(forms=forms, cursor=0, steps=work["steps"] + 1)
    return Command(goto=self.route(forms, 0), update=work)

def math(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
         work: dict[str, Any]) -> Command[Literal["Retrieval", "Math", "Deduce", "Output", "__end__"]]:
    """Evaluate the target as arithmetic (references replaced by their numbers); if it is not
    arithmetic, the model writes the expression (re-prompted with the evaluator's refusal)."""
    cfg, _ = self.settings(config, runtime)
    form = LogicalForm.model_validate(state["forms"][state["cursor"]])
    answers = self.answers(state)
    work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"))
    try:
        expression = self.substitute(form.target or "", form, answers, numeric=True)
        value = evaluate_arithmetic(expression)
        written_by = "target"
    except ArithmeticRefused:
        def parse(text: str) -> tuple[str, float | int]:
            body = _normalise(text)
            raw = _tagged(body, "expression")
            if raw is None:
                lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
                raw = lines[-1] if lines else ""
            raw = _expression_side(raw)
            expr = self.substitute(raw, form, answers, numeric=True)
            return expr, evaluate_arithmetic(expr)

        prompt = MATH_PROMPT.format(content=self.known_facts(form, answers),
                                    target=self.substitute(form.target or form.step, form, answers))
        expression, value = self.ask_parsed(work, [HumanMessage(content=prompt)], parse, cfg, config, what="Math",
                                            instructions="Write only numbers, + - * / ** and parentheses "
                                            "inside <expression>...</expression>.", form=MATH_FORM)
        written_by = "model"
    return self.solved(state, work, config, form, answer=_format_number(value), source="math",
                       detail={"expression": expression, "written_by": written_by})

def deduce(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
           work: dict[str, Any]) -> Command[Literal["Retrieval", "Math", "Deduce", "Output", "__end__"]]:
    cfg, _ = self.settings(config, runtime)
    form = LogicalForm.model_validate(state["forms"][state["cursor"]])
    answers = self.answers(state)
    work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"))
    facts, choices = form, ""
    if form.op in ("choice", "multiChoice") and any(item.text is not None for item in form.content):
        options = [item.text for item in form.content if item.text is not None]
        choices = "Choices: " + " / ".join(options) + "\n"
        facts = form.model_copy(update={"content": [item for item in form.content if item.text is None]})
    known = self.known_facts(facts, answers) if facts.content or facts.references else NO_KNOWN_FACTS
    prompt = DEDUCE_PROMPT.format(op=form.op or "extract", content=known,
                                  choices=choices, target=self.substitute(form.target or form.step, form, answers),
                                  question=state["question"])
    answer, reply = self.ask_parsed_reply(work, [HumanMessage(content=prompt)], _parse_deduction, cfg, config,
                                          what="Deduce", instructions="End with <answer>your conclusion</answer>.",
                                          form=DEDUCE_FORM)
    return self.solved(state, work, config, form, answer=answer, source="deduce",
                       detail={"op": form.op, "reply": reply})

def output(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["__end__"]]:
    """The referenced answers are the final answer; with an ``answer_format`` the executor puts
    them in that form (the model is asked only when they do not already fit)."""
    cfg, _ = self.settings(config, runtime)
    form = LogicalForm.model_validate(state["forms"][state["cursor"]])
    answers = self.answers(state)
    parts = [answers.get(item.step, "") for item in form.content if item.step is not None]
    answer = "; ".join(p for p in parts if p) or None
    unresolved = [s["index"] for s in state.get("solutions") or [] if not s["resolved"]]
    work: dict[str, Any] = {"steps": state.get("steps", 0) + 1, "trace": state.get("trace"),
                            "llm_calls": state.get("llm_calls", 0), "token_usage": state.get("token_usage")}
    fmt = cfg.answer_format
    structured, reason, error, reply = None, "answered", None, None
    if answer is None:
        reason, error = "no_answer", "the Output step's references have no answer"
    elif fmt is not None:
        structured, problem = answer_format.check(fmt, answer)
        if problem is not None:
            try:
                answer, structured, reply = self.formatted(work, state, answers, answer, fmt, cfg, config)
            except RunFailure as fault:
                reason, error = fault.reason, str(fault)
    work["trace"] = self.event({**state, **work}, config, action="Output", content=answer or "",
                               detail={"step": form.index, "outputs": form.references, "unresolved": unresolved,
                                       **({"reply": reply} if reply is not None else {})})
    work["structured_answer"] = structured
    return self.halt(state, config, reason=reason, answer=answer, extra=work, error=error,
                     validated=reason == "answered" and not unresolved)

def formatted(self, work: dict[str, Any], state: Mapping[str, Any], answers: Mapping[int, str], answer: str,
              fmt: Any, cfg: TCRAGConfig, config: RunnableConfig) -> tuple[str, Any, str]:
    """``(answer, structured answer, the model's reply)`` in the asked format, re-prompted at most
    ``max_format_retries`` times. The model sees every sub-question beside what it found."""
    rule = answer_format.instructions(fmt, subject="The final answer")

    def parse(text: str) -> tuple[str, Any]:
        body = re.sub(r"<think>.*?</think>", " ", _normalise(text), flags=re.DOTALL | re.IGNORECASE)
        final = _tagged(body, "answer") or body.strip()
        structured, problem = answer_format.check(fmt, final)
        if problem is not None:
            raise LogicalFormParseError(problem)
        return final, structured

    steps = {f["index"]: f["step"] for f in state["forms"]}
    findings = "\n".join(f"- {steps.get(k, f'#{k}')} -> {found}" for k, found in answers.items()) or "(none)"
    prompt = OUTPUT_PROMPT.format(question=state["question"], facts=findings, answer=answer, rule=rule)
    reply_form = answer_choice_form(tuple(fmt)) if isinstance(fmt, tuple) else None  # a pydantic format: parse only
    (final, structured), reply = self.ask_parsed_reply(work, [HumanMessage(content=prompt)], parse, cfg, config,
                                                       what="Output", instructions=rule, form=reply_form)
    return final, structured, reply
