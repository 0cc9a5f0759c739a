"""What every KAG-Thinker node shares: :class:`_SolverCore` on the run kernel (settings, model calls
with format re-prompts, trace events, answers and their substitution into a form, recording a solved
form); a :class:`~tcrag_langgraph.machine.kernel.RunFailure` ends a run with its reason."""

from __future__ import annotations

import json
import re
# Literal is not used here but must be in this namespace: ``guarded`` hands LangGraph a wrapper with
# the node's own annotations, which it resolves here (each Command[Literal[...]] names a node's edges).
from typing import Any, Callable, Literal, Mapping, Optional, Sequence  # noqa: F401

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...machine.config import TCRAGConfig
from ...machine.kernel import RunFailure, RunKernel
from ...machine.state import TraceEvent
from .arithmetic import ArithmeticRefused, _first_number
from .forms import ContentItem, LogicalForm, LogicalFormParseError
from .options import KAGThinkerOptions


class _SolverCore(RunKernel):
    """KAG-Thinker's core on the run kernel: settings with its options, trace events whose depth is the
    count of solved forms, answers and their substitution into a form, recording a solved form; the
    nodes are the methods of its subclasses (:class:`~.retrieval._RetrievalNodes`, :class:`~.nodes._Solver`)."""

    options_type = KAGThinkerOptions

    # ----- configuration and bookkeeping -----
    def settings(self, config: RunnableConfig, runtime: Optional[Runtime] = None) -> tuple[TCRAGConfig, KAGThinkerOptions]:
        cfg, options = super().settings(config, runtime)
        unknown = [n for n in (options.retrieval_tools or ()) if n not in self.tools]
        if unknown:
            raise ValueError(f"retrieval_tools names tools this graph does not have: {unknown}")
        return cfg, options

    def position(self, state: Mapping[str, Any]) -> tuple[int, Optional[float]]:
        """A KAG-Thinker run stands at the count of its solved forms."""
        return len(state.get("solutions") or []), None

    def event(self, state: Mapping[str, Any], config: RunnableConfig, *, action: str, op: str = "push",
              content: str = "", detail: Optional[dict[str, Any]] = None) -> list[TraceEvent]:
        """Record one event (emitted live); return the extended trace."""
        event = TraceEvent(step=state.get("steps", 0), action=action, op=op, content=content[:2000],
                           stack_depth=self.position(state)[0],
                           detail=json.dumps(detail, ensure_ascii=False, default=str) if detail is not None else None)
        return self.record(state.get("trace"), config, event)

    def ask_parsed(self, state: dict[str, Any], messages: list[BaseMessage], parse: Callable[[str], Any],
                   cfg: TCRAGConfig, config: RunnableConfig, *, what: str, instructions: str) -> Any:
        """Ask, parse; on a parse error re-prompt with the error, at most ``max_format_retries`` times."""
        history = list(messages)
        for attempt in range(cfg.max_format_retries + 1):
            text = self.ask(state, history, cfg, config)
            try:
                return parse(text)
            except (LogicalFormParseError, ArithmeticRefused) as err:
                state["trace"] = self.event(state, config, action=what, op="format_error", content=text[:500],
                                            detail={"error": str(err), "attempt": attempt + 1})
                history += [AIMessage(content=text[:2000] or "(empty)"),
                            HumanMessage(content=f"Your reply could not be used: {err}.\n{instructions}")]
                last_error = err
        raise RunFailure("format_error", f"no usable {what} after {cfg.max_format_retries + 1} tries: {last_error}")

    def halt(self, state: Mapping[str, Any], config: Optional[RunnableConfig], **kwargs: Any) -> Command:
        """The kernel's halt; no depth turn is open after it."""
        kwargs["extra"] = {**(kwargs.get("extra") or {}), "depth": None}
        return super().halt(state, config, **kwargs)

    def route(self, forms: list[dict[str, Any]], cursor: int) -> str:
        return forms[cursor]["function"]

    @staticmethod
    def answers(state: Mapping[str, Any]) -> dict[int, str]:
        return {s["index"]: s["answer"] for s in state.get("solutions") or []}

    @staticmethod
    def resolve(item: ContentItem, answers: Mapping[int, str]) -> str:
        if item.step is not None:
            return answers.get(item.step, "")
        return item.text or ""

    def substitute(self, text: str, form: LogicalForm, answers: Mapping[int, str], *, numeric: bool = False) -> str:
        """``text`` with each ``#n`` and bound variable replaced by what it stands for (for Math:
        the first number of that answer; an answer without one raises :class:`ArithmeticRefused`)."""

        def value(name: str) -> str:
            item = form.bindings.get(name)
            if item is None:
                return name
            resolved = self.resolve(item, answers)
            if not numeric:
                return resolved
            number = _first_number(resolved)
            if number is None:
                raise ArithmeticRefused(f"{name} ({resolved[:80]!r}) holds no number")
            return f"({number})"

        names = sorted(form.bindings, key=len, reverse=True)
        if not names:
            return text
        pattern = "|".join(re.escape(n) if n.startswith("#") else rf"(?<![\w#]){re.escape(n)}(?!\w)" for n in names)
        return re.sub(pattern, lambda m: value(m.group(0)), text)

    def known_facts(self, form: LogicalForm, answers: Mapping[int, str]) -> str:
        lines = []
        for item in form.content:
            lines.append(f"- #{item.step}: {answers.get(item.step, '')}" if item.step is not None else f"- {item.text}")
        for k in form.references:
            if not any(i.step == k for i in form.content):
                lines.append(f"- #{k}: {answers.get(k, '')}")
        return "\n".join(lines) or "(none)"

    def solved(self, state: Mapping[str, Any], work: dict[str, Any], config: RunnableConfig, form: LogicalForm, *,
               answer: str, source: str, resolved: bool = True, detail: Optional[dict[str, Any]] = None) -> Command:
        """Record the form's answer and go to the next form."""
        solutions = [*(state.get("solutions") or []), {"index": form.index, "function": form.function,
                                                        "answer": answer, "source": source, "resolved": resolved}]
        work.update(solutions=solutions, steps=state.get("steps", 0) + 1, depth=None)
        merged = {**state, **work}
        work["trace"] = self.event(merged, config, action=form.function, op="push", content=answer,
                                   detail={"step": form.index, "source": source, "resolved": resolved, **(detail or {})})
        cursor = state["cursor"] + 1
        work["cursor"] = cursor
        return Command(goto=self.route(state["forms"], cursor), update=work)
