"""KAG-Thinker's node holder: :class:`KAGThinker` on the run kernel (settings with its options, model
calls with format re-prompts, trace events whose depth is the count of solved forms, answers and their
substitution into a form, recording a solved form) names the nodes of :mod:`.nodes` and
:mod:`.retrieval`; the kernel builds it (:meth:`~tcrag_langgraph.core.kernel.RunKernel.build`). A
:class:`~tcrag_langgraph.core.kernel.RunFailure` ends a run with its reason."""

from __future__ import annotations

import json
import re

from typing import Any, Callable, Mapping, Optional

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core.arguments import BuildArguments
from ...core.config import TCRAGConfig
from ...core.kernel import RunFailure, RunKernel
from ...core.state import TraceEvent
from ...models.constrained import ReplyForm
from . import nodes as node_steps
from . import retrieval as retrieval_steps
from .arithmetic import ArithmeticRefused, _first_number
from .forms import ContentItem, LogicalForm, LogicalFormParseError
from .options import _MAX_FORMS_CAP, _MAX_TURNS_CAP, KAGThinkerOptions
from .state import KAGThinkerState

__all__ = ["NODE_NAMES", "KAGThinker"]



class KAGThinker(RunKernel):
    """KAG-Thinker's node holder.

    ``KAGThinker.build(model=..., tools=..., scorer=..., config=..., options=...)``:


    Args:
        model: a LangChain chat model, a local path / ``.gguf`` or ``"provider:model"`` name
            (:func:`~tcrag_langgraph.models.resolve.resolve_chat_model`); ``None``: the packaged SmolLM2.
        tools: the tools a depth turn retrieves with (unique names); may be empty.
        scorer: anything with ``token_logprobs(context, text) -> list[float]`` for the likelihood
            test. ``None``: the generator's own weights (:func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`,
            which raises :class:`~tcrag_langgraph.monitor.scoring.MonitorUnavailableError` for a model without
            trusted log-probs: then pass a scorer or ``options={"knowledge_boundary": False}``).
        config: :class:`~tcrag_langgraph.TCRAGConfig` (generation and tool limits, format retries).
        options: :class:`KAGThinkerOptions` (decomposition, depth and boundary settings).
        checkpointer, store: LangGraph's; give the checkpointer ``serde=tcrag_langgraph.checkpoint_serde()``.
        name: the compiled graph's name.
        trust_client_identity: let a run's context set ``caller`` (see :func:`tcrag_langgraph.build_graph`).

    Returns:
        A compiled graph: ``invoke({"question": ...})``; per-run overrides of either options model
        through ``context=``. Its recursion limit covers the largest plan the option bounds allow.
    """

    method = "KAG-Thinker"
    default_name = "kag-thinker"
    state_schema = KAGThinkerState
    options_type = KAGThinkerOptions
    scorer_advice = ("For KAG-Thinker the scorer is the likelihood test of the knowledge boundary: pass scorer=, or "
                     "build with options={'knowledge_boundary': False} (every Retrieval step then retrieves).")
    nodes = {"Start": "start", "Decompose": "decompose", "Retrieval": "retrieval", "Depth_Solve": "depth_solve",
             "Math": "math", "Deduce": "deduce", "Output": "output"}

    start = node_steps.start
    decompose = node_steps.decompose
    math = node_steps.math
    deduce = node_steps.deduce
    output = node_steps.output
    formatted = node_steps.formatted
    retrieval = retrieval_steps.retrieval
    depth_solve = retrieval_steps.depth_solve
    unresolved = retrieval_steps.unresolved
    retrieve = retrieval_steps.retrieve

    @classmethod
    def prepare(cls, args: BuildArguments) -> "KAGThinker":
        opts = args.options
        unknown = [n for n in (opts.retrieval_tools or ()) if n not in {t.name for t in args.tools}]
        if unknown:
            raise ValueError(f"retrieval_tools names tools not given: {unknown}")
        scorer = cls.scorer_for(args, needed=opts.knowledge_boundary)
        if opts.knowledge_boundary and not callable(getattr(scorer, "token_logprobs", None)):
            raise ValueError(f"the likelihood test needs a scorer with token_logprobs(context, text); "
                             f"{type(scorer).__name__} has none (or build with knowledge_boundary=False)")
        return cls(args.model, args.tools, scorer, args.config, opts, trust_client_identity=args.trust_client_identity)

    def finish(self, graph: Any) -> Any:
        # Worst case: Start, Decompose, and per form its node plus every depth turn (a caller's own
        # recursion_limit still wins).
        return graph.with_config(recursion_limit=2 + _MAX_FORMS_CAP * (1 + _MAX_TURNS_CAP) + 1)


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
                   cfg: TCRAGConfig, config: RunnableConfig, *, what: str, instructions: str,
                   form: Optional[ReplyForm] = None) -> Any:
        """Ask, parse; on a parse error re-prompt with the error, at most ``max_format_retries`` times.
        ``form``: the reply's declared form (:mod:`.reply_forms`), constrained where the model takes it."""
        return self.ask_parsed_reply(state, messages, parse, cfg, config, what=what, instructions=instructions,
                                     form=form)[0]

    def ask_parsed_reply(self, state: dict[str, Any], messages: list[BaseMessage], parse: Callable[[str], Any],
                         cfg: TCRAGConfig, config: RunnableConfig, *, what: str, instructions: str,
                         form: Optional[ReplyForm] = None) -> tuple[Any, str]:
        """:meth:`ask_parsed`, and the reply it parsed (its first 2,000 characters), for a step whose
        reasoning goes into the trace (Deduce, Output): why it answered what it did is read there."""
        history = list(messages)
        for attempt in range(cfg.max_format_retries + 1):
            text = self.ask(state, history, cfg, config, form=form)
            try:
                return parse(text), text[:2000]
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


#: the graph's nodes, entry first
NODE_NAMES: tuple[str, ...] = tuple(KAGThinker.nodes)
