"""What every KAG-Thinker node shares: :class:`_Fault` (ends a run with a reason) and
:class:`_SolverCore` (settings, model calls with format re-prompts, trace events, halting, answers
and their substitution into a form, recording a solved form)."""

from __future__ import annotations

import json
import re
# Literal is not used here but must be in this namespace: ``guarded`` hands LangGraph a wrapper with
# the node's own annotations, which it resolves here (each Command[Literal[...]] names a node's edges).
from typing import Any, Callable, Literal, Mapping, Optional, Sequence  # noqa: F401

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...machine.config import TCRAGConfig, resolve_config
from ...machine.events import emit
from ...tools.layer.outcome import content_text
from ...machine.result import RunResult
from ...machine.run_input import child_config
from ...machine.state import TraceEvent
from ...tools.tokens import count_tokens
from .arithmetic import ArithmeticRefused, _first_number
from .forms import ContentItem, LogicalForm, LogicalFormParseError
from .options import KAGThinkerOptions, _split_overrides
from .state import KAGThinkerState


class _Fault(Exception):
    """Ends the run with ``halt_reason`` (a model failure, format retries spent, ...)."""

    def __init__(self, reason: str, message: str, update: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.update = update or {}


class _SolverCore:
    """Holds model, tools, scorer and options, and the bookkeeping every node shares (settings,
    model calls with format re-prompts, trace events, halting, answers and substitution); the nodes
    are the methods of its subclasses (:class:`~.retrieval._RetrievalNodes`, :class:`~.nodes._Solver`)."""

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, config: TCRAGConfig,
                 options: KAGThinkerOptions, *, trust_client_identity: bool) -> None:
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.scorer = scorer
        self.base_config = config
        self.base_options = options
        self.trust_client_identity = trust_client_identity

    # ----- configuration and bookkeeping -----
    def settings(self, config: RunnableConfig, runtime: Runtime) -> tuple[TCRAGConfig, KAGThinkerOptions]:
        context = getattr(runtime, "context", None)
        configurable = (config or {}).get("configurable") or {}
        base_values, our_values = _split_overrides(context)
        cfg = resolve_config(self.base_config, configurable=configurable, context=base_values,
                             trust_client_identity=self.trust_client_identity)
        options = self.base_options.merged({**_split_overrides(configurable)[1], **our_values})
        unknown = [n for n in (options.retrieval_tools or ()) if n not in self.tools]
        if unknown:
            raise ValueError(f"retrieval_tools names tools this graph does not have: {unknown}")
        return cfg, options

    @staticmethod
    def event(state: Mapping[str, Any], config: RunnableConfig, *, action: str, op: str = "push", content: str = "",
              detail: Optional[dict[str, Any]] = None) -> list[TraceEvent]:
        """Emit one event live; return the extended trace."""
        event = TraceEvent(step=state.get("steps", 0), action=action, op=op, content=content[:2000],
                           stack_depth=len(state.get("solutions") or []),
                           detail=json.dumps(detail, ensure_ascii=False, default=str) if detail is not None else None)
        emit(event, config)
        return [*(state.get("trace") or []), event]

    def ask(self, state: dict[str, Any], messages: list[BaseMessage], cfg: TCRAGConfig,
            config: RunnableConfig) -> str:
        """One model call; counts it and its tokens into ``state`` (a working copy)."""
        from ...models.local import LocalChatModel

        kwargs: dict[str, Any] = {}
        if isinstance(self.model, LocalChatModel):  # only the packaged model takes these per call
            kwargs.update(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        try:
            reply = self.model.invoke(messages, config=child_config(config), **kwargs)
        except Exception as exc:  # a model/server failure ends the run with the reason
            raise _Fault("model_error", f"{type(exc).__name__}: {exc}") from exc
        text = content_text(reply.content)
        usage = dict(state.get("token_usage") or {"prompt": 0, "completion": 0})
        usage["prompt"] += sum(count_tokens(content_text(m.content)) for m in messages)
        usage["completion"] += count_tokens(text)
        state.update(llm_calls=state.get("llm_calls", 0) + 1, token_usage=usage)
        return text

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
        raise _Fault("format_error", f"no usable {what} after {cfg.max_format_retries + 1} tries: {last_error}")

    def halt(self, state: Mapping[str, Any], config: RunnableConfig, *, reason: str, answer: Optional[str],
             validated: bool, error: Optional[str] = None, extra: Optional[dict[str, Any]] = None) -> Command:
        update = dict(extra or {})
        final = {**state, **update}
        trace = self.event(final, config, action="Halt", op="halt", content=answer or "",
                           detail={"halt_reason": reason, **({"error": error} if error else {})})
        update.update(trace=trace, answer=answer, answer_validated=validated, halt_reason=reason, error=error,
                      depth=None)
        result = RunResult.from_state({**final, **update})
        update["messages"] = [AIMessage(content=result.text, response_metadata=result.metadata())]
        return Command(goto=END, update=update)

    def guarded(self, node: Callable[..., Command]) -> Callable[..., Command]:
        """Run a node; a :class:`_Fault` (model error, format retries spent) halts the run cleanly."""

        def run(state: KAGThinkerState, config: RunnableConfig, runtime: Runtime) -> Command:
            work: dict[str, Any] = {}
            try:
                return node(state, config, runtime, work)
            except _Fault as fault:
                return self.halt({**state, **work}, config, reason=fault.reason, answer=None, validated=False,
                                 error=str(fault), extra=work)

        run.__name__ = getattr(node, "__name__", "node")
        run.__annotations__ = {k: v for k, v in node.__annotations__.items() if k != "work"}
        return run

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
