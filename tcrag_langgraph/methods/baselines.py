"""The paper's baselines without a loop (Table 1): Base, CoT and SR-RAG, on the run kernel.

=========  ===================================================================================
``base``   one LLM call, no retrieval
``cot``    one LLM call asked to reason step by step, then give the answer on an ``Answer:`` line
``sr-rag`` single-round RAG: every tool is called once with the question, then one LLM call
=========  ===================================================================================

Each is a small graph (``Start`` -> [``Retrieve``] -> ``Answer``) whose nodes stand on
:class:`~tcrag_langgraph.core.kernel.RunKernel` like every other method's: the same question
check, model call, tool call (with the caller's identity) and halt. ``answer_format`` is enforced
like the stack machine's Conclusion: a reply that does not fit is re-prompted with what is allowed,
up to ``max_format_retries`` times.

Example:
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> out = Base.build(model=FakeListChatModel(responses=["B"])).invoke({"question": "Which? A. x B. y"})
    >>> out["answer"], out["llm_calls"], out["tool_calls"], out["halt_reason"]
    ('B', 1, 0, 'answered')
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ..core import answer_format
from ..core.config import TCRAGConfig
from ..core.kernel import RunKernel, fresh_run
from ..core.state import MethodState
from ..monitor.generation import NoGenerationLogprobs

__all__ = ["DirectState", "Base", "CoT", "SRRAG", "BASELINES"]

Variant = Literal["base", "cot", "sr-rag"]
BASELINES: tuple[Variant, ...] = ("base", "cot", "sr-rag")

_SYSTEM = {
    "base": "You are a medical expert. Answer the question directly and briefly.",
    "cot": (
        "You are a medical expert. Think step by step about the question, then give the final "
        "answer on the last line, starting with 'Answer:'."
    ),
    "sr-rag": (
        "You are a medical expert. Use the retrieved knowledge below when it helps, ignore it when it "
        "does not, and answer the question directly and briefly."
    ),
}


class DirectState(MethodState, total=False):
    raw_output: str


def _answer_line(text: str) -> str:
    r"""Just the last "Answer:" line's content (or, when the label ends its line, the next line):
    "Answer: no\nExplanation: ... yes ... maybe" answers no.

    Example:
        >>> _answer_line("Steps...\nAnswer: no\nExplanation: not yes, not maybe")
        'no'
        >>> _answer_line("Answer:\n\n B) Insulin\nbecause ...")
        'B) Insulin'
    """
    matches = list(answer_format.ANSWER_LABEL.finditer(text))
    if not matches:
        return ""
    rest = text[matches[-1].end():]
    for line in rest.split("\n"):
        if line.strip():
            return line.strip()
    return ""


class _Direct(RunKernel):
    """A baseline's nodes: ``Start``, ``Retrieve`` (SR-RAG only) and ``Answer``."""

    variant: ClassVar[Variant]
    state_schema = DirectState
    context_schema = TCRAGConfig
    nodes = {"Start": "start", "Answer": "answer"}

    def start(self, state: DirectState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Answer", "__end__"]
    ]:
        cfg, _ = self.settings(config, runtime)
        return self.begin(state, config, cfg, goto="Answer", fresh=fresh_run(raw_output=""))

    def start_retrieving(self, state: DirectState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Retrieve", "__end__"]
    ]:
        cfg, _ = self.settings(config, runtime)
        return self.begin(state, config, cfg, goto="Retrieve", fresh=fresh_run(raw_output=""))

    def retrieve(self, state: DirectState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Answer"]]:
        cfg, _ = self.settings(config, runtime)
        work = self.counters(state)
        knowledge = []
        for tool in self.tools.values():  # one call per tool with the question, through the one tool layer
            record = self.call_tool(work, tool, state["question"], cfg, config)
            # a failing tool contributes no evidence
            knowledge.append({"tool": tool.name, "error" if record.is_error else "text": record.observation})
        return Command(goto="Answer", update={"knowledge": knowledge, "tool_calls": work["tool_calls"], "steps": 1})

    def answer(self, state: DirectState, config: RunnableConfig, runtime: Runtime, work: dict[str, Any]) -> Command[
        Literal["__end__"]
    ]:
        cfg, _ = self.settings(config, runtime)
        work.update(self.counters(state))
        fmt = cfg.answer_format
        question = state["question"]
        if self.variant == "sr-rag":
            usable = [k for k in state.get("knowledge", []) if "text" in k]
            body = "\n\n".join(f"[{k['tool']}]\n{k['text']}" for k in usable) or "(nothing was retrieved)"
            prompt = f"Retrieved knowledge:\n{body}\n\nQuestion:\n{question}"
        else:
            prompt = question
        rule = answer_format.instructions(fmt)
        system = _SYSTEM[self.variant] + (f" Your final answer is your Conclusion. {rule}" if rule else "")
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        work["steps"] = 1
        retries = 0
        while True:
            work["format_retries"] = retries
            text = self.ask(work, messages, cfg, config,  # a failure halts: model_error
                            logprobs=cfg.record_generation_values)
            final = (answer_format.final_answer(text, keep_label=False) if self.variant == "cot" else text.strip()) or None
            structured, problem = answer_format.check(fmt, final or "")
            if problem is not None and self.variant == "cot" and _answer_line(text):  # the labelled line alone
                line_structured, line_problem = answer_format.check(fmt, _answer_line(text))
                if line_problem is None:
                    structured, problem = line_structured, None
            if fmt is None or problem is None or retries >= cfg.max_format_retries:
                break
            retries += 1  # the model is told what is allowed and asked again
            messages += [AIMessage(content=text or "(empty)"),
                         HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
        work.update(raw_output=text, structured_answer=structured if fmt is not None and problem is None else None)
        if cfg.record_generation_values and final:  # the answer's own log-probs: its confidence in a risk curve
            try:
                work["answer_generation_values"] = self.generation_values_of(work, final, cfg)
            except NoGenerationLogprobs:  # a model that returns none records none
                pass
        return self.halt({**state, **work}, config, reason="answered" if problem is None else "format_error",
                         answer=final, validated=False,
                         error=None if problem is None else f"no answer in the asked format after {retries} re-prompts: {problem}",
                         extra=work)


class Base(_Direct):
    """Base: one LLM call, no retrieval (``tools`` are accepted and not called)."""

    method = default_name = variant = "base"
    calls_tools = False


class CoT(_Direct):
    """CoT: one LLM call that reasons step by step; the answer is read from its ``Answer:`` line."""

    method = default_name = variant = "cot"
    calls_tools = False


class SRRAG(_Direct):
    """SR-RAG: every tool once with the question, then one LLM call over what they returned."""

    method = default_name = variant = "sr-rag"
    nodes = {"Start": "start_retrieving", "Retrieve": "retrieve", "Answer": "answer"}
