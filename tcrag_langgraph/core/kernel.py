"""The run kernel: what every method does in a run, in one place.

Every method (TC-RAG's stack machine, the baselines, the retrieve-while-writing methods and the
papers' CRP-RAG, KAG-Thinker and TCM-DiffRAG) is one subclass of :class:`RunKernel` that *declares*
itself: its graph state (``state_schema``), its own options (``options_type``), whether it reads
token log-probs (``reads_scores``) and its nodes (``nodes``: node name -> the holder's method; the
first is the entry). The inherited :meth:`RunKernel.build` does the rest, the same way for every
method: check the arguments (:func:`~.arguments.build_arguments`), make the node holder
(:meth:`RunKernel.prepare`, which a method overrides when it has more to set up), wrap each node
(:meth:`RunKernel.node`), compile. A method whose nodes come in stages keeps each stage's functions
in a module of their own and names them as attributes of its one holder class. The kernel owns the
run glue they share, so each rule has one home:

* :meth:`RunKernel.settings` - the per-run settings: the build-time :class:`TCRAGConfig` and the
  method's own options (:class:`MethodOptions`), overridden by ``config["configurable"]`` and the
  run ``context``; the caller is never taken from either (:func:`~.identity.caller_for_run`);
* :meth:`RunKernel.ask` - one model call: generation budget and stop sequences, counted calls and
  tokens, a failure ends the run with ``model_error``;
* :meth:`RunKernel.score` / :meth:`RunKernel.token_logprobs` / :meth:`RunKernel.token_stats` - the
  state monitor's scorer (values, token log-probs, per-token entropies), one check that its values
  are finite (a failure ends the run with ``scorer_error``);
* :meth:`RunKernel.call_tool` - a tool call through the one tool layer, acting for the caller of
  the trusted configuration or the authenticated server user;
* :meth:`RunKernel.record` - a trace event, emitted live (:func:`~.events.emit`);
* :meth:`RunKernel.halt` - the end of a run: the same result fields and the same final message
  metadata (:class:`~.result.RunResult`) for every method;
* :meth:`RunKernel.node` - a node wrapper that turns a :class:`RunFailure` into that halt, and where a
  run answers to its :class:`~tcrag_langgraph.models.run_control.RunControl` (cancelled: it raises
  ``RunCancelled`` before the node; paused: it waits there), as :meth:`RunKernel.ask` does before
  every model call;
* :meth:`RunKernel.build` - the graph of a declared method (see above).
"""

from __future__ import annotations

import contextvars
import inspect
import math
import typing
from typing import Any, Callable, ClassVar, Literal, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime, get_runtime
from langgraph.types import Command, interrupt

from ..models.constrained import ReplyForm, constraint_for
from ..models.local import cut_at_stop, takes_generation_settings
from ..models.run_control import current_run, run_checkpoint
from ..monitor.combination import COMBINED_VALUE, Combination
from ..monitor.generation import TOP_LOGPROBS, generation_values, reply_tokens, returns_logprobs
from ..monitor.risk import confidence_at
from ..monitor.scoring import TokenStat
from ..monitor.state_values import measure, scorer_score
from ..tools.layer import invoke_tool, is_tool_error
from ..tools.layer.egress import RECORDS_KEY, run_egress_context
from ..tools.layer.outcome import content_text
from ..tools.tokens import count_tokens
from . import answer_format
from .arguments import BuildArguments, MethodOptions, build_arguments, default_scorer
from .config import CALLER_KEY, TCRAGConfig, resolve_config
from .events import emit
from .identity import caller_for_run
from .result import RunResult
from .run_input import child_config, extract_question, last_human_is
from .state import MethodState, ToolCallRecord, TraceEvent
from .usage import message_tokens

#: the most stop sequences a provider's API accepts (OpenAI's limit); the rest are applied here
MAX_PROVIDER_STOPS = 4

__all__ = ["MAX_PROVIDER_STOPS", "REVIEW_NODE", "RunFailure", "RunKernel", "fresh_run"]

#: the node every method's graph has for ``review_unvalidated`` (:meth:`RunKernel.review_unvalidated`)
REVIEW_NODE = "Review_Unvalidated"


class RunFailure(Exception):
    """Ends a run cleanly with ``reason`` (``model_error``, ``scorer_error``, ``format_error``, ...)."""

    def __init__(self, reason: str, message: str, update: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.update = update or {}


def fresh_run(**extra: Any) -> dict[str, Any]:
    """The keys every method resets when a run starts (a thread's earlier turn must not leak in)."""
    return {"trace": [], "steps": 0, "llm_calls": 0, "tool_calls": 0, "format_retries": 0,
            "token_usage": {"prompt": 0, "completion": 0}, "answer": None, "structured_answer": None,
            "answer_validated": False, "halt_reason": None, "error": None, "state_value": None, "knowledge": [],
            "answer_generation_values": {}, "records_read": [], **extra}


#: the records the running node's run has read (state ``records_read``) and those read in this node
#: (``new``): the egress rule's information flow, set by :meth:`RunKernel.node` around every node
_RUN_READS: contextvars.ContextVar[Optional[dict[str, Any]]] = contextvars.ContextVar("tcrag_run_reads", default=None)


class RunKernel:
    """Holds a method's model, tools, scorer, configuration and options; a method's node holder
    subclasses it, declares itself in the class attributes below and its methods are the graph nodes.

    Example (a one-node method; :doc:`docs/methods.md <methods>` walks through a fuller one):

        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> class Echo(RunKernel):
        ...     method = "Echo"
        ...     nodes = {"Answer": "answer"}
        ...     def answer(self, state, config, runtime):
        ...         cfg, _ = self.settings(config, runtime)
        ...         work = {**self.counters(fresh_run()), "question": state["question"]}
        ...         text = self.ask(work, [HumanMessage(content=state["question"])], cfg, config)
        ...         return self.halt({**state, **work}, config, reason="answered", answer=text, validated=False,
        ...                          extra=work)
        >>> graph = Echo.build(model=FakeListChatModel(responses=["42"]))
        >>> out = graph.invoke({"question": "What is six times seven?"})
        >>> out["answer"], out["halt_reason"], out["llm_calls"]
        ('42', 'answered', 1)
    """

    #: the method's name in error messages
    method: ClassVar[str] = "this method"
    #: the graph's name unless the builder is given one
    default_name: ClassVar[str] = "method"
    #: the method's graph state (a :class:`~.state.MethodState` type)
    state_schema: ClassVar[type] = MethodState
    #: the run context's type for LangGraph (None: a mapping of TCRAGConfig or option fields)
    context_schema: ClassVar[Optional[type]] = None
    #: node name -> the name of the holder's method that runs it; the first node is the entry
    nodes: ClassVar[Mapping[str, str]] = {}
    #: the method reads token log-probs from a scorer: with none given, the generator's own weights
    #: (:func:`~.arguments.default_scorer`; a model without trusted log-probs is refused)
    reads_scores: ClassVar[bool] = False
    #: what to do instead, said when a scorer is needed and the model has none
    scorer_advice: ClassVar[str] = ""
    #: the method calls the tools it is given (False: the tools are accepted and not called)
    calls_tools: ClassVar[bool] = True
    #: the method's own options type (None: the method has none)
    options_type: Optional[type[MethodOptions]] = None
    #: metric -> why the monitor cannot judge this generator (a shipped calibration found no sigma that
    #: separates its right from wrong answers): a run it would validate halts ``monitor_cannot_judge``
    unjudged: Mapping[str, str] = {}
    #: the stored calibration's step function from state value to the probability an answer is right
    #: (thresholds, probabilities): every answer's ``confidence``; None without one
    confidence_map: Optional[tuple[Sequence[float], Sequence[float]]] = None
    #: the stored fit that turns the generation values into ``gen_combined`` (None: not asked for)
    combination: Optional[Combination] = None

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, config: TCRAGConfig,
                 options: Optional[MethodOptions] = None, *, trust_client_identity: bool = False) -> None:
        self.model = model
        self.tools: dict[str, BaseTool] = {t.name: t for t in tools}
        self.scorer = scorer
        self.base_config = config
        self.base_options = options
        self.trust_client_identity = trust_client_identity

    # ----- building the graph -----
    @classmethod
    def build(
        cls,
        *,
        model: BaseChatModel | str | None = None,
        tools: Optional[Sequence[BaseTool]] = None,
        scorer: Any = None,
        config: Optional[TCRAGConfig | Mapping[str, Any]] = None,
        options: Any = None,
        checkpointer: Any = None,
        store: Any = None,
        name: Optional[str] = None,
        trust_client_identity: bool = False,
        model_kwargs: Optional[Mapping[str, Any]] = None,
        **extra: Any,
    ):
        """Build and compile this method's graph: ``invoke({"question": ...})`` or
        ``invoke({"messages": [...]})``.

        ``model``: a LangChain chat model, a local path / ``.gguf``, a ``"provider:model"`` name or None
        (the packaged default); ``model_kwargs``: what a ``"provider:model"`` name's chat model is made
        with (e.g. ``base_url``). ``tools``: LangChain tools with unique names. ``scorer``: the state
        monitor's scorer (None: the generator's own weights where the method reads log-probs).
        ``config``: the shared :class:`TCRAGConfig`; ``options``: the method's own options type (or a
        mapping of its fields); both overridable per run through ``context=``. ``checkpointer`` and
        ``store``: LangGraph's (give the checkpointer ``serde=tcrag_langgraph.checkpoint_serde()``).
        ``trust_client_identity``: let a run's context set ``caller`` (off: the client writes it).
        ``extra``: a method's own build-time inputs (:meth:`prepare`).
        """
        args = build_arguments(model=model, tools=tools, scorer=scorer, config=config, options=options,
                               name=cls.default_name if name is None else name,
                               trust_client_identity=trust_client_identity, options_type=cls.options_type,
                               method=cls.method, model_kwargs=model_kwargs)
        unknown = sorted(set(extra) - set(cls.build_inputs()))
        if unknown:
            raise TypeError(f"{cls.method} got unexpected keyword arguments: {', '.join(unknown)}")
        holder = cls.prepare(args, **extra)
        graph = StateGraph(cls.state_schema, context_schema=cls.context_schema)
        for node_name, attribute in cls.nodes.items():
            graph.add_node(node_name, holder.node(getattr(holder, attribute)))
        graph.add_node(REVIEW_NODE, holder.node(holder.review_unvalidated))  # every method: review_unvalidated
        graph.add_edge(START, next(iter(cls.nodes)))
        compiled = graph.compile(checkpointer=checkpointer, store=store, name=args.name)
        compiled.tcrag_kernel = holder  # the faces ask it about a request's options before a run starts
        return holder.finish(compiled)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give each method's ``build`` its true signature: the common keywords, then the keyword-only
        inputs of its own :meth:`prepare` (what ``help()``, IDEs and the builder tests read)."""
        super().__init_subclass__(**kwargs)
        common = RunKernel.__dict__["build"].__func__
        own = list(cls.build_inputs().values())

        def build(klass: type, **options: Any) -> Any:
            return common(klass, **options)

        shared = [p for p in inspect.signature(common).parameters.values() if p.kind is p.KEYWORD_ONLY]
        first = inspect.Parameter("cls", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        build.__signature__ = inspect.Signature([first, *shared, *own])  # type: ignore[attr-defined]
        build.__doc__, build.__qualname__ = common.__doc__, f"{cls.__qualname__}.build"
        cls.build = classmethod(build)  # type: ignore[method-assign]

    @classmethod
    def build_inputs(cls) -> dict[str, inspect.Parameter]:
        """This method's own build-time inputs: the keyword-only parameters of its :meth:`prepare`."""
        return {name: p for name, p in inspect.signature(cls.prepare).parameters.items() if p.kind is p.KEYWORD_ONLY}

    @classmethod
    def prepare(cls, args: BuildArguments) -> "RunKernel":
        """The node holder for checked build arguments. A method with more to set up overrides this;
        its keyword-only parameters are its build-time inputs (keywords of its ``build``)."""
        return cls(args.model, args.tools if cls.calls_tools else [], cls.scorer_for(args), args.config, args.options,
                   trust_client_identity=args.trust_client_identity)

    @classmethod
    def scorer_for(cls, args: BuildArguments, *, needed: Optional[bool] = None) -> Any:
        """The scorer a run reads: the given one, or where this method reads log-probs the generator's own weights."""
        return default_scorer(args.model, args.scorer, needed=cls.reads_scores if needed is None else needed,
                              why=cls.scorer_advice)

    def option_problem(self, options: Mapping[str, Any]) -> Optional[str]:
        """Why a run's per-request ``options`` (``configurable``) cannot run on this graph, found before
        the run starts (a server answers it as a client error); None when they can. The kernel's own
        checks are the config's validation; a method adds what only it knows."""
        return None

    def finish(self, graph: Any) -> Any:
        """The compiled graph as the method hands it out (a method may bind settings, e.g. a recursion limit)."""
        return graph

    # ----- per-run settings -----
    def settings(self, config: Optional[RunnableConfig], runtime: Optional[Runtime] = None) -> tuple[TCRAGConfig, Any]:
        """This run's :class:`TCRAGConfig` and own options. ``configurable`` may set fields of either
        (other keys belong to the server and are ignored); ``context`` may be a TCRAGConfig, the
        method's options or a mapping of either's fields (an unknown field is a ValueError)."""
        configurable = (config or {}).get("configurable") or {}
        shared_conf, own_conf = self._split(configurable, strict=False)
        shared_ctx, own_ctx = self._split(getattr(runtime, "context", None), strict=True)
        cfg = resolve_config(self.base_config, configurable=shared_conf, context=shared_ctx,
                             trust_client_identity=self.trust_client_identity)
        options = self.base_options
        if options is not None and (own_conf or own_ctx):
            options = options.merged({**own_conf, **own_ctx})
        return cfg, options

    def _split(self, layer: Any, *, strict: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        own_fields = set(self.options_type.model_fields) if self.options_type is not None else set()
        if layer is None:
            return {}, {}
        if isinstance(layer, TCRAGConfig):
            return {k: getattr(layer, k) for k in layer.model_fields_set}, {}
        if self.options_type is not None and isinstance(layer, self.options_type):
            return {}, {k: getattr(layer, k) for k in layer.model_fields_set}
        if not isinstance(layer, Mapping):
            kinds = "TCRAGConfig" + (f", {self.options_type.__name__}" if self.options_type else "")
            raise ValueError(f"context must be a {kinds} or a mapping of their fields, not {type(layer).__name__}")
        shared = {k: v for k, v in layer.items() if k in TCRAGConfig.model_fields}
        own = {k: v for k, v in layer.items() if k in own_fields}
        unknown = sorted(str(k) for k in layer if k not in TCRAGConfig.model_fields and k not in own_fields)
        if strict and unknown:
            raise ValueError(f"unknown options {unknown}")
        return shared, own

    # ----- the model -----
    @staticmethod
    def counters(state: Mapping[str, Any]) -> dict[str, Any]:
        """A node's working copy of the run's counters (advanced by :meth:`ask` and :meth:`call_tool`)."""
        usage = state.get("token_usage") or {}
        return {"llm_calls": state.get("llm_calls", 0), "tool_calls": state.get("tool_calls", 0),
                "steps": state.get("steps", 0),
                "token_usage": {"prompt": 0, "completion": 0, **usage}}  # with the split of its tokens, if any

    def ask(self, work: dict[str, Any], messages: list[BaseMessage], cfg: TCRAGConfig, config: RunnableConfig, *,
            max_new_tokens: Optional[int] = None, temperature: Optional[float] = None,
            stop: Optional[list[str]] = None, logprobs: bool = False,
            prompt_parts: Optional[Mapping[str, int]] = None, form: Optional[ReplyForm] = None) -> str:
        """One model call; counts it and its tokens into ``work``; a failure raises ``RunFailure("model_error")``.

        ``form``: the form the reply must take (the method's declared :class:`~tcrag_langgraph.models.constrained.ReplyForm`).
        With ``constrain_replies`` the model gets what :func:`~tcrag_langgraph.models.constrained.constraint_for`
        says it takes (a grammar, or a JSON schema whose reply is rendered back into the form's text); the
        caller's parser reads (and validates) the reply either way.

        ``prompt_parts`` (a method's split of its prompt, e.g. ``prefix`` (system prompt and
        demonstrations), ``stack``, ``reprompt``): counted into ``token_usage`` as ``prompt_<part>``;
        the ``prefix`` of every call after the run's first also as ``prompt_cacheable`` (what a provider's
        prompt cache could serve), so a run says where its tokens go.

        ``work["reply_cut"]``: whether the token budget ended the reply (``finish_reason == "length"``).

        ``logprobs``: ask for the generated tokens' log-probs too (OpenAI's ``logprobs`` /
        ``top_logprobs``); ``work["generated_tokens"]`` then holds them (None when the reply has none):
        the generation values of :mod:`~tcrag_langgraph.monitor.generation` read them, with no second pass.

        The budget and temperature reach models that take them per call (the local model); a provider
        model keeps its own. ``stop`` is sent where the model accepts it (the parser still drops an
        invented observation where it does not). A provider model gets at most
        :data:`MAX_PROVIDER_STOPS` of them (the first, most important ones); every one is applied to
        the reply here, so the text is what a server honouring all of them would return."""
        kwargs: dict[str, Any] = {}
        sent = stop
        if takes_generation_settings(self.model):
            kwargs.update(max_new_tokens=cfg.max_new_tokens if max_new_tokens is None else max_new_tokens,
                          temperature=cfg.temperature if temperature is None else temperature)
        elif stop:
            sent = list(stop)[:MAX_PROVIDER_STOPS]
        logprobs = logprobs and returns_logprobs(self.model)  # a model that returns none is not asked
        if logprobs:
            kwargs.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        constraint = constraint_for(self.model, form) if cfg.constrain_replies else None
        if constraint is not None:
            kwargs.update(constraint.kwargs)
        usage = dict(work.get("token_usage") or {"prompt": 0, "completion": 0})
        run_checkpoint()  # a cancelled run stops before its next model call, a paused one waits here
        try:
            try:
                reply = self.model.invoke(messages, config=child_config(config), **kwargs,
                                          **({"stop": sent} if sent else {}))
            except TypeError:
                if not stop:
                    raise
                reply = self.model.invoke(messages, config=child_config(config), **kwargs)
        except Exception as exc:  # a model/server failure ends the run cleanly, with the reason
            raise RunFailure("model_error", f"{type(exc).__name__}: {exc}") from exc
        text = content_text(reply.content)
        if constraint is not None:
            text = constraint.reply_text(text)
        # the token budget, not the model, ended the reply (OpenAI's finish_reason, which the local models
        # report too): a parser may then keep the reply's complete part (KAG-Thinker's plan)
        work["reply_cut"] = (getattr(reply, "response_metadata", None) or {}).get("finish_reason") == "length"
        work["generated_tokens"] = reply_tokens(reply) if logprobs else None
        if stop:
            text = cut_at_stop(text, stop)
        usage["prompt"] = usage.get("prompt", 0) + sum(message_tokens(m) for m in messages)  # core.usage's rule
        usage["completion"] = usage.get("completion", 0) + count_tokens(text)
        for part, tokens in (prompt_parts or {}).items():
            usage[f"prompt_{part}"] = usage.get(f"prompt_{part}", 0) + int(tokens)
        if prompt_parts and work.get("llm_calls", 0) > 0:  # the run's first call puts the prefix in a cache
            usage["prompt_cacheable"] = usage.get("prompt_cacheable", 0) + int(prompt_parts.get("prefix", 0))
        work.update(llm_calls=work.get("llm_calls", 0) + 1, token_usage=usage)
        return text

    def generation_values_of(self, work: Mapping[str, Any], content: str, cfg: TCRAGConfig, *,
                             answer: bool = True) -> dict[str, float]:
        """The generation values (:mod:`~tcrag_langgraph.monitor.generation`) of ``content``, a text the
        last :meth:`ask` (with ``logprobs``) wrote, from that reply's token log-probs; with ``answer``
        and an answer format of choices also ``gen_answer_prob`` of the choice it makes, and
        ``gen_combined`` where a fitted :attr:`combination` has all it reads. Raises
        :class:`~tcrag_langgraph.monitor.generation.NoGenerationLogprobs` when the reply carries none."""
        choices = cfg.answer_format if isinstance(cfg.answer_format, tuple) else None
        chosen = answer_format.fit(choices, content) if choices and answer else None
        values = generation_values(work.get("generated_tokens") or [], content, chosen=chosen, choices=choices)
        combined = self.combination.value(values) if self.combination is not None and answer else None
        if combined is not None:
            values[COMBINED_VALUE] = combined
        return values

    # ----- the state monitor -----
    def score(self, context: str, text: str, *, metric: str, **options: Any) -> float:
        """The scorer's value of ``text`` given ``context``; a missing scorer, a scorer error or a value
        that is not finite raises ``RunFailure("scorer_error")``."""
        if self.scorer is None:
            raise RunFailure("scorer_error", "MonitorUnavailableError: this run turned the state monitor on, but "
                             "the graph was built without one (its config had enable_state_monitor=False and no "
                             "scorer=): build it with a scorer to monitor runs")
        return _monitor_value(lambda: scorer_score(self.scorer, context, text, metric=metric, **options))

    def state_value(self, metric: str, question: str, text: str, *, evidence: Sequence[str] = (),
                    choices: Optional[Sequence[str]] = None, usage: Optional[dict[str, int]] = None) -> float:
        """Any state value of :mod:`~tcrag_langgraph.monitor.state_values` (its one rule,
        :func:`~tcrag_langgraph.monitor.state_values.measure`), from this run's scorer; a failure or a
        value that is not finite raises ``RunFailure("scorer_error")``."""
        return _monitor_value(lambda: measure(
            metric, question, text, score=lambda q, t, **options: self.score(q, t, **options),
            token_logprobs=self.token_logprobs, evidence=evidence, choices=choices, usage=usage))

    def token_logprobs(self, context: str, text: str) -> list[float]:
        """Log-probabilities of the tokens of ``text`` given ``context`` (finite), from the scorer."""
        if self.scorer is None or not callable(getattr(self.scorer, "token_logprobs", None)):
            raise RunFailure("scorer_error", "this run needs token log-probabilities, but the graph's scorer has no "
                             "token_logprobs(context, text)")
        values = [float(v) for v in self.scorer.token_logprobs(context, text)]
        if not all(math.isfinite(v) or v == -math.inf for v in values):
            raise ValueError("the scorer returned a log-probability that is not a number")
        return values

    def token_stats(self, context: str, text: str) -> list[TokenStat]:
        """Per token of ``text`` given ``context``: its text, log-probability and the entropy of the
        next-token distribution at its position (the scorer's ``token_stats``, one teacher-forced pass
        over the generator's own weights); a missing method or a value that is not finite raises
        ``RunFailure("scorer_error")``."""
        if self.scorer is None or not callable(getattr(self.scorer, "token_stats", None)):
            raise RunFailure("scorer_error", "this run needs per-token entropies, but the graph's scorer has no "
                             "token_stats(context, text) (a served completions endpoint returns no full "
                             "next-token distribution; use the generator's own weights)")
        try:
            stats = [TokenStat(str(s[0]), float(s[1]), float(s[2])) for s in self.scorer.token_stats(context, text)]
        except Exception as exc:
            raise RunFailure("scorer_error", f"{type(exc).__name__}: {exc}") from exc
        if not all(math.isfinite(s.entropy) and (math.isfinite(s.logprob) or s.logprob == -math.inf) for s in stats):
            raise RunFailure("scorer_error", "ValueError: the scorer returned an entropy or log-probability that is "
                             "not a number")
        return stats

    # ----- tools -----
    def call_tool(self, work: dict[str, Any], tool: BaseTool, tool_input: Any, cfg: TCRAGConfig,
                  config: RunnableConfig) -> ToolCallRecord:
        """One real call through the tool layer (one deadline, one trim, typed errors), acting for the
        authenticated server user, else the trusted configuration's caller, never the client's words."""
        child = child_config(config)
        caller = caller_for_run(config, base=cfg.caller)
        reads = _RUN_READS.get() or {"records": [], "new": [], "question": ""}
        # the egress rule's context: everything this run has read, popped or summarised frames included
        # (layer.egress); it replaces whatever a client or an earlier layer put under the key
        egress = run_egress_context([*reads["records"], *reads["new"]], reads["question"])
        child["configurable"] = {**child.get("configurable", {}), CALLER_KEY: caller, RECORDS_KEY: egress}
        outcome = invoke_tool(tool, tool_input, config=child, timeout_s=cfg.tool_timeout_s,
                              max_output_tokens=cfg.max_observation_tokens)
        work["tool_calls"] = work.get("tool_calls", 0) + 1
        if is_tool_error(outcome):
            return ToolCallRecord(tool=tool.name, tool_input=tool_input, observation=str(outcome), is_error=True,
                                  error_kind=outcome.kind)
        if getattr(getattr(tool, "options", None), "holds_records", False):
            reads["new"].append(outcome)  # from now on this run holds record text
        return ToolCallRecord(tool=tool.name, tool_input=tool_input, observation=outcome)

    # ----- trace and halt -----
    @staticmethod
    def record(trace: Optional[Sequence[TraceEvent]], config: Optional[RunnableConfig],
               event: TraceEvent) -> list[TraceEvent]:
        """Emit ``event`` live; return ``trace`` extended by it."""
        emit(event, config)
        return [*(trace or []), event]

    def position(self, state: Mapping[str, Any]) -> tuple[int, Optional[float]]:
        """Where a run stands, for its events: (depth of its memory, its state value). Methods whose
        memory is not a stack override it."""
        return len(state.get("stack") or []), state.get("state_value")

    def halt(self, state: Mapping[str, Any], config: Optional[RunnableConfig], *, reason: Any,
             answer: Optional[str], validated: bool, error: Optional[str] = None,
             extra: Optional[Mapping[str, Any]] = None, reviewed: bool = False, calibrated: bool = True) -> Command:
        """End the run: the Halt event, the result fields, and the final message carrying the
        :class:`RunResult` text and metadata (the same for every method). With ``review_unvalidated``
        an answer the monitor did not validate goes to :meth:`review_unvalidated` first (``reviewed``:
        this is the reviewer's decision). ``calibrated=False``: the stored calibration does not speak for
        this answer, so it gets no confidence."""
        reason = getattr(reason, "value", reason)
        update: dict[str, Any] = dict(extra or {})
        final = {**state, **update}
        note = self.unjudged.get(final.get("metric") or self.base_config.metric) if validated and not reviewed else None
        if note is not None:  # never "validated" by a monitor that cannot tell right from wrong
            validated, reason, error = False, "monitor_cannot_judge", note
        depth, value = self.position(final)
        event = TraceEvent(step=final.get("steps", 0), action="Halt", op="halt", content=answer or "",
                           stack_depth=depth, state_value=value,
                           detail=reason if error is None else f"{reason}: {error}")
        update.update(trace=self.record(final.get("trace"), config, event), answer=answer,
                      answer_validated=validated, halt_reason=reason, error=error,
                      confidence=self.confidence_of(final.get("state_value")) if answer is not None and calibrated
                      else None)
        if not reviewed and answer is not None and not validated and reason != "invalid_input" \
                and self._run_config(config).review_unvalidated:
            return Command(goto=REVIEW_NODE, update=update)  # a person sees it before the run ends
        result = RunResult.from_state({**final, **update})
        update["messages"] = [AIMessage(content=result.text, response_metadata=result.metadata())]
        return Command(goto=END, update=update)

    def confidence_of(self, value: Optional[float]) -> Optional[float]:
        """The calibrated probability that an answer with state ``value`` is right (:attr:`confidence_map`,
        from the stored calibration); None without one or without a value."""
        if self.confidence_map is None or value is None or not math.isfinite(value):
            return None
        return round(confidence_at(value, *self.confidence_map), 4)

    def _run_config(self, config: Optional[RunnableConfig]) -> TCRAGConfig:
        """This run's settings where a node has no runtime at hand (the halt): LangGraph's own."""
        try:
            runtime = get_runtime()
        except Exception:  # outside a running graph (a direct call): the graph's settings
            runtime = None
        try:
            return self.settings(config, runtime)[0]
        except ValueError:  # bad per-run settings halt the run as invalid_input before any answer
            return self.base_config

    def review_unvalidated(self, state: Mapping[str, Any], config: RunnableConfig) -> Command[Literal["__end__"]]:
        """``review_unvalidated``: the run pauses (LangGraph ``interrupt``) with the answer the state
        monitor did not validate. Resume with ``"approve"`` (the answer stands, validated by a person:
        ``halt_reason="reviewed"``), ``{"answer": "..."}`` (the reviewer's answer instead, the same), or
        ``"reject"`` / anything else (the run ends as it would have, not validated)."""
        before, answer = state.get("halt_reason"), state.get("answer")
        decision = interrupt({
            "question": state.get("question"), "answer": answer, "halt_reason": before, "error": state.get("error"),
            "instructions": "Resume with Command(resume='approve'), Command(resume={'answer': 'your answer'}) or "
                            "Command(resume='reject')",
        })
        corrected = decision.get("answer") if isinstance(decision, Mapping) else None
        approved = (isinstance(corrected, str) and corrected.strip() != "") or (
            isinstance(decision, str) and decision.strip().lower() in {"approve", "approved", "accept", "yes", "ok"}) \
            or (isinstance(decision, Mapping) and decision.get("approve") is True)
        if not approved:
            return self.halt(state, config, reason=before, answer=answer, validated=False, reviewed=True,
                             error=f"{state.get('error') or before}; the reviewer did not approve it")
        extra: dict[str, Any] = {}
        if isinstance(corrected, str) and corrected.strip():
            answer = corrected.strip()
            extra["structured_answer"] = answer_format.fit(self._run_config(config).answer_format, answer)
            how = "answered by the reviewer"
        else:
            how = "approved by the reviewer"
        return self.halt({**state, **extra}, config, reason="reviewed", answer=answer, validated=True, reviewed=True,
                         error=f"not validated by the state monitor ({before}); {how}", extra=extra)

    def begin(self, state: Mapping[str, Any], config: RunnableConfig, cfg: TCRAGConfig, *, goto: str,
              fresh: Mapping[str, Any]) -> Command:
        """A run's first node: read and check the question (an unusable one halts with
        ``invalid_input``), reset the run's keys to ``fresh``, record the User_Query."""
        question, problem = extract_question(state, cfg)
        if problem is not None:  # the question of an earlier turn on this thread must not look like this run's
            return self.halt({**state, **fresh}, config, reason="invalid_input", answer=None, validated=False,
                             error=problem, extra={**fresh, "question": None})
        update: dict[str, Any] = {**fresh, "question": question}
        depth, value = self.position(update)
        update["trace"] = self.record([], config, TraceEvent(step=0, action="User_Query", op="push", content=question,
                                                             stack_depth=max(depth, 1), state_value=value))
        if not last_human_is(state, question):
            update["messages"] = [HumanMessage(content=question)]
        return Command(goto=goto, update=update)

    def node(self, fn: Callable[..., Command]) -> Callable[..., Command]:
        """``fn`` as a graph node: a :class:`RunFailure` it raises halts the run cleanly with its
        reason. A node taking a ``work`` argument gets a fresh dict for its partial update (counted
        calls and tokens), kept in the halt."""
        params = inspect.signature(fn).parameters
        wants_runtime, wants_work = "runtime" in params, "work" in params

        def run(state: Any, config: RunnableConfig, runtime: Runtime) -> Command:
            control = current_run()
            if control is None:
                return attempt(state, config, runtime)
            # a cancelled run (models.run_control: its client went away) stops before its next step, a
            # paused one (its client stopped reading) waits here; the control counts the threads still in
            # a node, so a server frees the run's place only once they have left
            with control.working():
                control.checkpoint()
                return attempt(state, config, runtime)

        def attempt(state: Any, config: RunnableConfig, runtime: Runtime) -> Command:
            work: dict[str, Any] = {}
            args: list[Any] = [state, config] + ([runtime] if wants_runtime else []) + ([work] if wants_work else [])
            reads = {"records": list(state.get("records_read") or []), "new": [], "question": state.get("question") or ""}
            token = _RUN_READS.set(reads)
            try:
                try:
                    command = fn(*args)
                except RunFailure as failure:
                    partial = {**work, **failure.update, **_read_update(reads)}
                    return self.halt({**state, **partial}, config, reason=failure.reason, answer=None, validated=False,
                                     error=str(failure), extra=partial)
                if reads["new"] and isinstance(command, Command) and isinstance(command.update, dict):
                    command = Command(graph=command.graph, update={**command.update, **_read_update(reads)},
                                      resume=command.resume, goto=command.goto)
                return command
            finally:
                _RUN_READS.reset(token)

        run.__name__ = getattr(fn, "__name__", "node")
        run.__qualname__ = getattr(fn, "__qualname__", run.__name__)
        # LangGraph reads the return annotation (Command[Literal[...]]) for the node's edges: hand it the
        # node's own, resolved in the node's module
        hints = typing.get_type_hints(fn)
        run.__annotations__ = {"state": hints.get("state", Any), "config": RunnableConfig, "runtime": Runtime,
                               "return": hints.get("return", Command)}
        return run


def _read_update(reads: Mapping[str, Any]) -> dict[str, Any]:
    """The state update that keeps what a node read from record-holding tools (nothing when it read none)."""
    return {"records_read": [*reads["records"], *reads["new"]]} if reads["new"] else {}


def _monitor_value(compute: Callable[[], float]) -> float:
    """One home for the monitor's failure rule: an error while computing a state value, or a value
    that is not finite (NaN or infinity never passes or fails a threshold meaningfully), raises
    ``RunFailure("scorer_error")``."""
    try:
        value = float(compute())
    except RunFailure:
        raise
    except Exception as exc:
        raise RunFailure("scorer_error", f"{type(exc).__name__}: {exc}") from exc
    if not math.isfinite(value):
        raise RunFailure("scorer_error", f"ValueError: the scorer returned {value}")
    return value
