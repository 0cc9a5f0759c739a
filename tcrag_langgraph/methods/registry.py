"""The compared methods (paper Table 1), all built from the same chat model, tools and scorer.

=================  ==============================================================================
name               what it is
=================  ==============================================================================
``base``           one LLM call, no retrieval
``cot``            one LLM call asked to reason step by step, then give the answer
``sr-rag``         single-round RAG: every tool is called once with the question, then one call
``fl-rag``         retrieve every n tokens of the answer (the question, then the previous n tokens)
``fs-rag``         retrieve every sentence of the answer (the question, then the previous sentence)
``react``          the TC-RAG stack machine with Backtrack, Summary and the state monitor off
                   (Thought / Plan / Tool_Use / Conclusion, the model decides when to stop)
``flare``          FLARE: retrieve with the tentative next sentence when one of its tokens has a
                   probability below a threshold (the generator's own weights)
``dragin``         DRAGIN without attention: retrieve when a content token's entropy is high
``self-rag``       Self-RAG with prompted reflections (Retrieve?, IsRel, IsSup, IsUse asked of the
                   same model; no trained critic)
``tcrag-cppl``     TC-RAG, state monitor on conditional perplexity
``tcrag-uct``      TC-RAG, state monitor on uncertainty
``wo-backtrack``   TC-RAG without the Backtrack action
``wo-summary``     TC-RAG without the Summary action
``wo-monitor``     TC-RAG without the state monitor (the model's Conclusion ends the run)
``tcrag-cppl-ev``  TC-RAG, state monitor on cppl given the question and the tool observations
``tcrag-uct-ev``   TC-RAG, state monitor on uct given the question and the tool observations
``tcrag-answer``   TC-RAG, state monitor on 1 - the probability of the chosen answer (answer_prob)
``tcrag-auto``     TC-RAG with sigma="auto": the state value and sigma the model's calibration on the
                   task chose (best AUROC; tcrag calibrate --metric all)
``tcrag``          TC-RAG with the configuration exactly as given (what the faces serve; not a table row)
=================  ==============================================================================

``tcrag-consistency``: TC-RAG, state monitor on 1 - the share of the model's resampled answers that agree
with the Conclusion (``consistency``: no log-probs needed, any chat model).
``tcrag-gen``: TC-RAG, state monitor on 1 - the probability of the chosen answer read off the reply's own
token log-probs (``gen_answer_prob``: no second pass, no second copy of the weights).
``langchain-agent``: the peer, LangChain's own ``create_agent`` with native tool calls on the same model
and tools (the agent a LangChain user would otherwise write; its tool calls go through the kernel's
tool layer and its model calls are counted like every method's: :mod:`.langchain_agent`).

The registry of every method the library has, one row each: the faces (``tcrag ask/serve``, Studio)
and the evaluation harness build methods through it, and the rest is generated from it: each
method's builder (``build_<name>_graph``, e.g. :func:`build_crp_rag_graph`, is ``CRPRAG.build``),
Studio's graph factories and ``langgraph.json`` (``tcrag studio-config`` writes it; a test fails when
the file and the registry differ). A method is one module declaring its node holder
(:class:`~tcrag_langgraph.core.kernel.RunKernel`) plus one row here: docs/methods.md shows how. ReAct and the ablations are not copies: they are
:func:`tcrag_langgraph.build_graph` with switches of :class:`~tcrag_langgraph.TCRAGConfig`. Base,
CoT and SR-RAG (:mod:`.baselines`), the retrieval-while-writing baselines (FL-RAG, FS-RAG, FLARE,
DRAGIN: :mod:`.adaptive` and one module each), Self-RAG (:mod:`.self_rag`) and the papers' methods
(CRP-RAG, KAG-Thinker, TCM-DiffRAG) are node holders of their own; every one is built by the run
kernel's one ``build`` (:mod:`tcrag_langgraph.core.kernel`), so every builder has the same signature. Every method is invoked with
``{"question": ...}`` and returns at least ``answer``, ``structured_answer``, ``answer_validated``,
``halt_reason``, ``llm_calls``, ``tool_calls``, ``steps`` and ``trace``. Per-run options (above all
``answer_format``) come as the run context, ``invoke(..., context={"answer_format": [...]})``, for
the direct methods as for the stack machine; the direct methods re-prompt a reply out of format.

The ablations and ReAct use the base configuration's metric (``cppl`` unless ``config`` says
otherwise); ``sigmas`` sets sigma per metric (the paper's 10 / 20 are for Qwen-32B; calibrate
them for another model with ``tcrag calibrate``).

Example:
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> m = build_method("base", model=FakeListChatModel(responses=["Answer: B"]))
    >>> out = m.invoke({"question": "Which? A. x B. y"})
    >>> out["answer"], out["llm_calls"], out["tool_calls"]
    ('Answer: B', 1, 0)
    >>> METHODS["react"].kernel, METHODS["crp-rag"].kernel
    ('tcrag_langgraph.methods.tcrag.graph:TCRAG', 'tcrag_langgraph.methods.crp_rag.graph:CRPRAG')
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from ..core.config import TCRAGConfig

__all__ = ["MethodSpec", "METHODS", "METHOD_NAMES", "DEFAULT_METHOD", "STUDIO_METHODS", "build_agent", "build_method",
           "build_methods", "check_method_options", "method_builder", "method_kernel", "studio_methods",
           "tcrag_config_for", "langgraph_config"]

_TCRAG = "tcrag_langgraph.methods.tcrag.graph:TCRAG"


@dataclass(frozen=True)
class MethodSpec:
    """One method: its name, table label and group, its node holder and (for stack-machine methods) its switches."""

    name: str
    label: str
    group: str
    #: "module:Class" of its node holder (a :class:`~tcrag_langgraph.core.kernel.RunKernel` that declares
    #: the method); its ``build`` is the method's builder
    kernel: str
    #: TCRAGConfig switches this method sets on the shared configuration (ReAct and the ablations)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    #: reads log-probs from the state scorer (the state monitor, CRP-RAG's sufficiency test,
    #: KAG-Thinker's likelihood test), so ``tcrag eval --scorer`` applies to it
    uses_scorer: bool = False
    #: builds its own index from documents (``documents=`` of its builder) instead of calling tools
    indexes_documents: bool = False
    #: what LangGraph Studio shows for it; "" = not one of the graphs ``langgraph.json`` serves
    studio: str = ""
    #: a row of the evaluation tables (``tcrag eval --method all``)
    in_tables: bool = True

    @property
    def builder(self) -> str:
        """"module:Class.build": the method's builder."""
        return f"{self.kernel}.build"

    @property
    def is_stack_machine(self) -> bool:
        return self.kernel == _TCRAG

    @cached_property
    def holder(self) -> type:
        """The node-holder class (imported on first use)."""
        module_name, _, class_name = self.kernel.partition(":")
        return getattr(importlib.import_module(module_name), class_name)

    @property
    def takes_options(self) -> bool:
        """Has options of its own beyond TCRAGConfig (its node holder declares an ``options_type``)."""
        return self.holder.options_type is not None

    @property
    def uses_tools(self) -> bool:
        return self.holder.calls_tools


_M = "tcrag_langgraph.methods."
METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("base", "Base", "Without RAG", _M + "baselines:Base",
                   studio="Baseline: one model call, no retrieval."),
        MethodSpec("cot", "CoT", "Without RAG", _M + "baselines:CoT",
                   studio="Baseline: one model call reasoning step by step."),
        MethodSpec("sr-rag", "SR-RAG", "Naive RAG", _M + "baselines:SRRAG",
                   studio="Baseline: every tool once with the question, then one model call."),
        MethodSpec("react", "ReAct", "Adaptive RAG", _TCRAG,
                   {"enable_backtrack": False, "enable_summary": False, "enable_state_monitor": False},
                   studio="Baseline: the TC-RAG stack machine without Backtrack, Summary and the state monitor (ReAct)."),
        MethodSpec("tcrag-cppl", "TC-RAG-cppl", "Ours", _TCRAG, {"metric": "cppl"}, uses_scorer=True),
        MethodSpec("tcrag-uct", "TC-RAG-uct", "Ours", _TCRAG, {"metric": "uct"}, uses_scorer=True),
        MethodSpec("wo-backtrack", "w/o Backtrack", "Ablations", _TCRAG, {"enable_backtrack": False}, uses_scorer=True),
        MethodSpec("wo-summary", "w/o Summary", "Ablations", _TCRAG, {"enable_summary": False}, uses_scorer=True),
        MethodSpec("wo-monitor", "w/o State Monitor", "Ablations", _TCRAG, {"enable_state_monitor": False}),
        # beyond the paper (monitor/state_values.py): the same machine, other state values
        MethodSpec("tcrag-cppl-ev", "TC-RAG-cppl+evidence", "Ours", _TCRAG, {"metric": "cppl_evidence"},
                   uses_scorer=True),
        MethodSpec("tcrag-uct-ev", "TC-RAG-uct+evidence", "Ours", _TCRAG, {"metric": "uct_evidence"},
                   uses_scorer=True),
        MethodSpec("tcrag-answer", "TC-RAG-answer-prob", "Ours", _TCRAG, {"metric": "answer_prob"}, uses_scorer=True),
        MethodSpec("tcrag-auto", "TC-RAG-auto", "Ours", _TCRAG, {"sigma": "auto"}, uses_scorer=True),
        MethodSpec("tcrag-consistency", "TC-RAG-consistency", "Ours", _TCRAG, {"metric": "consistency"},
                   uses_scorer=True),
        # judged by the reply's own log-probs (no second copy of the weights, any server that returns them)
        MethodSpec("tcrag-gen", "TC-RAG-gen-answer-prob", "Ours", _TCRAG, {"metric": "gen_answer_prob"}),
        MethodSpec("crp-rag", "CRP-RAG", "Papers", _M + "crp_rag.graph:CRPRAG", uses_scorer=True,
                   studio="CRP-RAG (reasoning graph, knowledge-sufficiency check, abstention) on the same model, "
                          "tools and authentication as tcrag; bounded budgets of tcrag ask by default, runtime "
                          "options in the run's context."),
        MethodSpec("diffrag", "TCM-DiffRAG", "Papers", _M + "diffrag.graph:DiffRAG", indexes_documents=True,
                   studio="TCM-DiffRAG (heading-aware chunks and source-linked triples) on the same model and "
                          "authentication as tcrag."),
        MethodSpec("kag-thinker", "KAG-Thinker", "Papers", _M + "kag_thinker.graph:KAGThinker", uses_scorer=True,
                   studio="KAG-Thinker (logical-form plans with Retrieval/Math/Deduce steps and a knowledge-boundary "
                          "check) on the same model, tools and authentication as tcrag."),
        # the paper's other Table 1 baselines, after its own rows and the other papers' methods
        MethodSpec("fl-rag", "FL-RAG", "Naive RAG", _M + "fl_rag:FLRAG",
                   studio="Baseline (paper Table 1): FL-RAG, retrieve before every n generated tokens, on the same "
                          "model, tools and authentication as tcrag."),
        MethodSpec("fs-rag", "FS-RAG", "Naive RAG", _M + "fs_rag:FSRAG",
                   studio="Baseline (paper Table 1): FS-RAG, retrieve before every sentence."),
        MethodSpec("self-rag", "Self-RAG", "Adaptive RAG", _M + "self_rag:SelfRAG",
                   studio="Baseline (paper Table 1): Self-RAG with prompted reflection (Retrieve?, IsRel, IsSup, "
                          "IsUse asked of the same model; no trained critic)."),
        MethodSpec("flare", "FLARE", "Adaptive RAG", _M + "flare:FLARE", uses_scorer=True,
                   studio="Baseline (paper Table 1): FLARE, retrieve with the upcoming sentence when one of its "
                          "tokens is improbable (the generator's own log-probs)."),
        MethodSpec("dragin", "DRAGIN", "Adaptive RAG", _M + "dragin:DRAGIN", uses_scorer=True,
                   studio="Baseline (paper Table 1): DRAGIN, retrieve when a content token's entropy is high "
                          "(entropy only: llama.cpp exposes no attention)."),
        # the peer: LangChain's own tool-calling agent on the same model, tools and questions (not in Studio:
        # its scripted demo model has no tool calling, and it is a yardstick rather than a face)
        MethodSpec("langchain-agent", "LangChain agent", "Peers", _M + "langchain_agent:LangChainAgent"),
        # what the faces serve unless told otherwise: TC-RAG with the configuration exactly as given (its
        # metric, switches and sigma); not a row of the evaluation tables, which name the metric
        MethodSpec("tcrag", "TC-RAG", "Ours", _TCRAG, uses_scorer=True, in_tables=False,
                   studio="TC-RAG (Turing-Complete RAG): an agent whose memory is a stack (User_Query, Thought, "
                          "Plan, Tool_Use, Summary, Backtrack, Conclusion frames) and which halts only when the "
                          "state value from a local LM (conditional perplexity or uncertainty) falls below sigma. "
                          "State shows stack, trace, state_value, state_history, sigma and metric. Runtime options "
                          "(sigma, metric, max_steps, ...) go in the run's context (default budgets: those of tcrag "
                          "ask, 4 steps and 64 new tokens); who the run acts for (EMR access) comes only from the "
                          "authenticated user (bearer token or X-API-Key checked against the users file in "
                          "TCRAG_AUTH_USERS), never from context or configurable. Set "
                          "TCRAG_STUDIO_SCRIPTED=script.json to replay a scripted model instead of the packaged "
                          "SmolLM2 (testing/demo only)."),
    )
}
#: the methods of the evaluation tables (``tcrag eval --method all``)
METHOD_NAMES: tuple[str, ...] = tuple(n for n, s in METHODS.items() if s.in_tables)
DEFAULT_METHOD = "tcrag"


def studio_methods() -> dict[str, str]:
    """The graphs LangGraph Studio serves (``langgraph.json``): graph id -> the method it serves, TC-RAG
    first, then every row with a ``studio`` description in the registry's order."""
    return {n: n for n in (DEFAULT_METHOD, *(n for n, s in METHODS.items() if s.studio and n != DEFAULT_METHOD))}


#: :func:`studio_methods` as the package ships it (Studio's factories are made from it at import)
STUDIO_METHODS: dict[str, str] = studio_methods()


def method_kernel(name: str) -> type:
    """The node-holder class of method ``name`` (imported on first use)."""
    return _spec(name).holder


def method_builder(name: str) -> Callable[..., Any]:
    """The builder of method ``name``: its node holder's ``build`` (imported on first use)."""
    return method_kernel(name).build


def langgraph_config(auth: str = "./tcrag_langgraph/faces/auth.py:auth") -> dict[str, Any]:
    """``langgraph.json`` as the registry defines it: one graph per :data:`STUDIO_METHODS` entry (the
    factories of :mod:`tcrag_langgraph.faces.studio`) behind the servers' authentication."""
    return {
        "$schema": "https://langgra.ph/schema.json",
        "python_version": "3.11",
        "dependencies": ["."],
        "graphs": {name: {"path": f"./tcrag_langgraph/faces/studio.py:{studio_factory_name(name)}",
                          "description": METHODS[name].studio} for name in studio_methods()},
        "auth": {"path": auth, "disable_studio_auth": True},
    }


def studio_factory_name(name: str) -> str:
    """The Studio factory's name for method ``name`` (``crp-rag`` -> ``crp_rag_graph``; TC-RAG's is ``studio_graph``)."""
    return "studio_graph" if name == DEFAULT_METHOD else f"{name.replace('-', '_')}_graph"


def tcrag_config_for(
    name: str, *, config: Optional[TCRAGConfig] = None, sigmas: Optional[Mapping[str, float]] = None
) -> TCRAGConfig:
    """The :class:`TCRAGConfig` a stack-machine method runs with.

    Example:
        >>> c = tcrag_config_for("react")
        >>> (c.enable_backtrack, c.enable_summary, c.enable_state_monitor)
        (False, False, False)
        >>> tcrag_config_for("tcrag-uct", sigmas={"uct": 3.5}).effective_sigma
        3.5
        >>> tcrag_config_for("tcrag-auto", sigmas={"cppl": 3.5}).sigma  # a cppl sigma is not auto's
        'auto'
    """
    spec = _spec(name)
    if not spec.is_stack_machine:
        raise ValueError(f"{name} is not a stack-machine method")
    base = config or TCRAGConfig()
    values = dict(spec.overrides)
    metric = values.get("metric", base.metric)
    sigmas = dict(sigmas or {})
    if "sigma" in values:  # the method's own sigma (tcrag-auto's "auto": the calibration picks metric and sigma)
        return base.merged(values)
    if metric in sigmas:
        values["sigma"] = float(sigmas[metric])
    elif metric != base.metric:
        values["sigma"] = None  # base sigma belongs to the other metric: use the paper default
    return base.merged(values)


def _spec(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHOD_NAMES)}") from None


def build_method(
    name: str,
    *,
    model: BaseChatModel | str | None = None,
    tools: Sequence[BaseTool] = (),
    scorer: Any = None,
    config: Optional[TCRAGConfig] = None,
    sigmas: Optional[Mapping[str, float]] = None,
    documents: Optional[Sequence[Any]] = None,
    options: Optional[Mapping[str, Any]] = None,
    **build_options: Any,
):
    """A compiled graph for method ``name`` (see the module table).

    ``config`` is the shared base configuration (max_steps, max_new_tokens, temperature, ...);
    ``scorer`` the state monitor for the TC-RAG variants (``None`` = the generator's own weights);
    ``documents`` what a method that indexes documents itself (DiffRAG) reads instead of calling
    tools (``None``: its default); the other methods ignore it. ``options`` are a method's own options
    (``CRPRAGOptions``, ``KAGThinkerOptions``, ``DiffRAGOptions``, ``FLRAGOptions``, ``FSRAGOptions``,
    ``FLAREOptions``, ``DRAGINOptions``, ``SelfRAGOptions`` fields, e.g. a smaller CRP-RAG graph for a
    CPU budget or FLARE's threshold); the other methods have none and refuse them.
    ``build_options`` go to the builder as they are (``checkpointer``, ``store``,
    ``trust_client_identity``).
    """
    spec = _spec(name)
    if options:
        _check_takes_options(name)
    base = config or TCRAGConfig()
    kwargs: dict[str, Any] = {"name": name, **build_options}
    if spec.is_stack_machine and name != DEFAULT_METHOD:
        base = tcrag_config_for(name, config=base, sigmas=sigmas)
    own = dict(options or {})
    if spec.indexes_documents and documents is not None:
        # documents chosen by the caller are read whole (the builder's default cap is for its own corpus)
        kwargs["documents"] = documents
        own = {"max_passages": 5000, **own}
    return method_builder(name)(model=model, tools=list(tools) if spec.uses_tools else [], scorer=scorer, config=base,
                                options=own or None, **kwargs)


def build_agent(method: str = DEFAULT_METHOD, **options: Any):
    """An agent: the compiled LangGraph graph of ``method`` (TC-RAG unless named; any name of
    :data:`METHODS`), invoked with ``{"question": ...}`` or ``{"messages": [...]}``. The keywords are
    :func:`build_method`'s: ``model`` (a LangChain chat model, a ``.gguf`` file or model folder, a
    ``"provider:model"`` name with ``model_kwargs={"base_url": ...}``, or None for the packaged
    demonstration model), ``tools``, ``scorer``, ``config`` (:class:`TCRAGConfig`), ``options`` (the
    method's own), ``checkpointer``, ``store``, ``name``, ``trust_client_identity``, ``sigmas``,
    ``documents``.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> agent = build_agent("sr-rag", model=FakeListChatModel(responses=["Metformin."]))
        >>> agent.invoke({"question": "First-line drug for type 2 diabetes?"})["answer"]
        'Metformin.'
    """
    return build_method(method, **options)


def _check_takes_options(name: str) -> None:
    if not _spec(name).takes_options:
        with_options = ", ".join(n for n, s in METHODS.items() if s.takes_options)
        raise ValueError(f"{name} takes no method options (only {with_options} do); its settings are "
                         "TCRAGConfig fields")


def check_method_options(names: Sequence[str],
                         method_options: Optional[Mapping[str, Mapping[str, Any]]]) -> dict[str, Mapping[str, Any]]:
    """``method_options`` as a dict, after checking that each names a method being run that has own
    options (a ValueError says which does not); the values are validated by the method's builder."""
    method_options = dict(method_options or {})
    unused = [n for n in method_options if n not in names]
    if unused:
        raise ValueError(f"options given for methods that are not run: {unused} (run: {', '.join(names)})")
    for name, options in method_options.items():
        if options:
            _check_takes_options(name)
    return method_options


def build_methods(
    names: Sequence[str],
    *,
    model: BaseChatModel | str | None = None,
    tools: Sequence[BaseTool] = (),
    scorer: Any = None,
    config: Optional[TCRAGConfig] = None,
    sigmas: Optional[Mapping[str, float]] = None,
    documents: Optional[Sequence[Any]] = None,
    method_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> dict[str, Any]:
    """``{name: graph}`` for several methods sharing one model, tool list, scorer and documents;
    ``method_options`` maps a method name to its own options (see :func:`build_method`)."""
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {', '.join(METHOD_NAMES)}")
    method_options = check_method_options(names, method_options)
    return {
        n: build_method(n, model=model, tools=tools, scorer=scorer, config=config, sigmas=sigmas, documents=documents,
                        options=method_options.get(n))
        for n in dict.fromkeys(names)
    }


_GENERATED_BUILDER = re.compile(r"build_(\w+)_graph")


def __getattr__(name: str) -> Any:
    """``build_<method>_graph``: the builder of every method with a node holder of its own (the TC-RAG
    variants are configurations of :func:`tcrag_langgraph.build_graph`), e.g. ``build_crp_rag_graph``."""
    found = _GENERATED_BUILDER.fullmatch(name)
    method = found and found.group(1).replace("_", "-")
    if method and method in METHODS and not METHODS[method].is_stack_machine:
        return method_builder(method)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
