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
=================  ==============================================================================

The registry of every method the library has: the faces (``tcrag ask/serve``, Studio) and the
evaluation harness build methods through it. ReAct and the ablations are not copies: they are
:func:`tcrag_langgraph.build_graph` with switches of :class:`~tcrag_langgraph.TCRAGConfig`. Base,
CoT and SR-RAG (:mod:`.baselines`), the retrieval-while-writing baselines (FL-RAG, FS-RAG, FLARE,
DRAGIN: :mod:`.adaptive` and one module each), Self-RAG (:mod:`.self_rag`) and the papers' methods
(CRP-RAG, KAG-Thinker, TCM-DiffRAG) are graphs of their own; every builder has the same signature and stands on the run kernel
(:mod:`tcrag_langgraph.machine.kernel`). Every method is invoked with
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
    >>> sorted({s.builder for s in METHODS.values()})[0]
    'tcrag_langgraph.machine.graph:build_graph'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from ..machine.config import TCRAGConfig

__all__ = ["MethodSpec", "METHODS", "METHOD_NAMES", "DEFAULT_METHOD", "build_method", "build_methods", "check_method_options",
           "method_builder", "tcrag_config_for"]

_TCRAG = "tcrag_langgraph.machine.graph:build_graph"


@dataclass(frozen=True)
class MethodSpec:
    """A method's name, its table label and group, its builder and (for stack-machine methods) its switches."""

    name: str
    label: str
    group: str
    #: "module:function" of its builder; every builder takes the same keywords (model, tools, scorer,
    #: config, options, checkpointer, store, name, trust_client_identity)
    builder: str
    #: TCRAGConfig switches this method sets on the shared configuration (ReAct and the ablations)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    uses_tools: bool = True
    #: reads log-probs from the state scorer (the state monitor, CRP-RAG's sufficiency test,
    #: KAG-Thinker's likelihood test), so ``tcrag eval --scorer`` applies to it
    uses_scorer: bool = False
    #: has options of its own beyond TCRAGConfig (its builder's ``options=``)
    takes_options: bool = False
    #: builds its own index from documents (``documents=`` of its builder) instead of calling tools
    indexes_documents: bool = False

    @property
    def is_stack_machine(self) -> bool:
        return self.builder == _TCRAG


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("base", "Base", "Without RAG", "tcrag_langgraph.methods.baselines:build_base_graph",
                   uses_tools=False),
        MethodSpec("cot", "CoT", "Without RAG", "tcrag_langgraph.methods.baselines:build_cot_graph", uses_tools=False),
        MethodSpec("sr-rag", "SR-RAG", "Naive RAG", "tcrag_langgraph.methods.baselines:build_sr_rag_graph"),
        MethodSpec("react", "ReAct", "Adaptive RAG", _TCRAG,
                   {"enable_backtrack": False, "enable_summary": False, "enable_state_monitor": False}),
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
        MethodSpec("crp-rag", "CRP-RAG", "Papers", "tcrag_langgraph.methods.crp_rag:build_crp_rag_graph",
                   uses_scorer=True, takes_options=True),
        MethodSpec("diffrag", "TCM-DiffRAG", "Papers", "tcrag_langgraph.methods.diffrag:build_diffrag_graph",
                   takes_options=True, indexes_documents=True),
        MethodSpec("kag-thinker", "KAG-Thinker", "Papers", "tcrag_langgraph.methods.kag_thinker:build_kag_thinker_graph",
                   uses_scorer=True, takes_options=True),
        # the paper's other Table 1 baselines (issue 24 item 3), after its own rows and the other papers' methods
        MethodSpec("fl-rag", "FL-RAG", "Naive RAG", "tcrag_langgraph.methods.fl_rag:build_fl_rag_graph",
                   takes_options=True),
        MethodSpec("fs-rag", "FS-RAG", "Naive RAG", "tcrag_langgraph.methods.fs_rag:build_fs_rag_graph",
                   takes_options=True),
        MethodSpec("self-rag", "Self-RAG", "Adaptive RAG", "tcrag_langgraph.methods.self_rag:build_self_rag_graph",
                   takes_options=True),
        MethodSpec("flare", "FLARE", "Adaptive RAG", "tcrag_langgraph.methods.flare:build_flare_graph",
                   uses_scorer=True, takes_options=True),
        MethodSpec("dragin", "DRAGIN", "Adaptive RAG", "tcrag_langgraph.methods.dragin:build_dragin_graph",
                   uses_scorer=True, takes_options=True),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)
#: what the faces serve unless told otherwise: TC-RAG with the configuration exactly as given (its
#: metric, switches and sigma); not a row of the evaluation tables, which name the metric
DEFAULT_METHOD = "tcrag"


def method_builder(name: str) -> Callable[..., Any]:
    """The builder function of method ``name`` (imported on first use)."""
    module_name, _, function = _spec(name).builder.partition(":")
    return getattr(importlib.import_module(module_name), function)


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
    """A compiled graph for method ``name`` (see the module table; ``"tcrag"``: :data:`DEFAULT_METHOD`).

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
    if name == DEFAULT_METHOD:
        if options:
            _check_takes_options("tcrag-cppl")
        return method_builder("tcrag-cppl")(model=model, tools=list(tools), scorer=scorer, config=config,
                                            **{"name": name, **build_options})
    spec = _spec(name)
    if options:
        _check_takes_options(name)
    base = config or TCRAGConfig()
    kwargs: dict[str, Any] = {"name": name, **build_options}
    if spec.is_stack_machine:
        base = tcrag_config_for(name, config=base, sigmas=sigmas)
    own = dict(options or {})
    if spec.indexes_documents and documents is not None:
        # documents chosen by the caller are read whole (the builder's default cap is for its own corpus)
        kwargs["documents"] = documents
        own = {"max_passages": 5000, **own}
    return method_builder(name)(model=model, tools=list(tools) if spec.uses_tools else [], scorer=scorer, config=base,
                                options=own or None, **kwargs)


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
