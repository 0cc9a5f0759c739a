"""The compared methods (paper Table 1), all built from the same chat model, tools and scorer.

=================  ==============================================================================
name               what it is
=================  ==============================================================================
``base``           one LLM call, no retrieval
``cot``            one LLM call asked to reason step by step, then give the answer
``sr-rag``         single-round RAG: every tool is called once with the question, then one call
``react``          the TC-RAG stack machine with Backtrack, Summary and the state monitor off
                   (Thought / Plan / Tool_Use / Conclusion, the model decides when to stop)
``tcrag-cppl``     TC-RAG, state monitor on conditional perplexity
``tcrag-uct``      TC-RAG, state monitor on uncertainty
``wo-backtrack``   TC-RAG without the Backtrack action
``wo-summary``     TC-RAG without the Summary action
``wo-monitor``     TC-RAG without the state monitor (the model's Conclusion ends the run)
=================  ==============================================================================

ReAct and the ablations are not copies: they are :func:`tcrag_langgraph.build_graph` with
switches of :class:`~tcrag_langgraph.TCRAGConfig`. Base, CoT and SR-RAG are small LangGraph graphs
that reuse the same model, tools and generation settings. Every method is invoked with
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
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from ..machine import answer_format
from ..machine.config import TCRAGConfig, resolve_config
from ..machine.graph import build_graph
from ..tools.layer.outcome import content_text
from ..machine.state import MethodState
from ..tools.layer import invoke_tool, is_tool_error

__all__ = ["MethodSpec", "METHODS", "METHOD_NAMES", "build_method", "build_methods", "check_method_options",
           "tcrag_config_for"]


@dataclass(frozen=True)
class MethodSpec:
    """A method's name, its table label and group, and (for stack-machine methods) its switches."""

    name: str
    label: str
    group: str
    kind: str  # "direct" (Base/CoT/SR-RAG graphs), "tcrag" (build_graph) or "graph" (a method module)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    uses_tools: bool = True
    #: reads log-probs from the state scorer (the state monitor, CRP-RAG's sufficiency test,
    #: KAG-Thinker's likelihood test), so ``tcrag eval --scorer`` applies to it
    uses_scorer: bool = False
    #: builds its own index from documents (``documents=`` of its builder) instead of calling tools
    indexes_documents: bool = False
    #: for kind "graph": "module:function" under tcrag_langgraph.methods, called as
    #: ``function(model=..., tools=..., scorer=..., config=TCRAGConfig)`` -> compiled graph
    builder: Optional[str] = None


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        MethodSpec("base", "Base", "Without RAG", "direct", uses_tools=False),
        MethodSpec("cot", "CoT", "Without RAG", "direct", uses_tools=False),
        MethodSpec("sr-rag", "SR-RAG", "Naive RAG", "direct"),
        MethodSpec(
            "react",
            "ReAct",
            "Adaptive RAG",
            "tcrag",
            {"enable_backtrack": False, "enable_summary": False, "enable_state_monitor": False},
        ),
        MethodSpec("tcrag-cppl", "TC-RAG-cppl", "Ours", "tcrag", {"metric": "cppl"}, uses_scorer=True),
        MethodSpec("tcrag-uct", "TC-RAG-uct", "Ours", "tcrag", {"metric": "uct"}, uses_scorer=True),
        MethodSpec("wo-backtrack", "w/o Backtrack", "Ablations", "tcrag", {"enable_backtrack": False}, uses_scorer=True),
        MethodSpec("wo-summary", "w/o Summary", "Ablations", "tcrag", {"enable_summary": False}, uses_scorer=True),
        MethodSpec("wo-monitor", "w/o State Monitor", "Ablations", "tcrag", {"enable_state_monitor": False}),
        MethodSpec("crp-rag", "CRP-RAG", "Papers", "graph", builder="crp_rag:build_crp_rag_graph", uses_scorer=True),
        MethodSpec("diffrag", "TCM-DiffRAG", "Papers", "graph", builder="diffrag:build_diffrag_graph",
                   indexes_documents=True),
        MethodSpec("kag-thinker", "KAG-Thinker", "Papers", "graph", builder="kag_thinker:build_kag_thinker_graph",
                   uses_scorer=True),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


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
    """
    spec = _spec(name)
    if spec.kind != "tcrag":
        raise ValueError(f"{name} is not a stack-machine method")
    base = config or TCRAGConfig()
    values = dict(spec.overrides)
    metric = values.get("metric", base.metric)
    sigmas = dict(sigmas or {})
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


# --------------------------------------------------------------------------------------------
# Direct methods: Base, CoT, SR-RAG
# --------------------------------------------------------------------------------------------

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
    knowledge: list[dict[str, Any]]
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


def _invoke_model(model: BaseChatModel, messages: list[BaseMessage], cfg: TCRAGConfig, config: RunnableConfig) -> str:
    from ..models.local import LocalChatModel

    kwargs: dict[str, Any] = {}
    if isinstance(model, LocalChatModel):  # same generation settings as the stack machine
        kwargs.update(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    return content_text(model.invoke(messages, config=config, **kwargs).content)


def _direct_graph(name: str, model: BaseChatModel, tools: Sequence[BaseTool], base_cfg: TCRAGConfig):
    """Base / CoT / SR-RAG. Per-run options come as in :func:`~tcrag_langgraph.build_graph`
    (``context=`` or ``configurable``); ``answer_format`` is enforced like the stack machine's
    Conclusion: a reply that does not fit is re-prompted with what is allowed, up to
    ``max_format_retries`` times."""

    def run_config(config: RunnableConfig, runtime: Runtime) -> TCRAGConfig:
        return resolve_config(base_cfg, configurable=(config or {}).get("configurable"),
                              context=getattr(runtime, "context", None))

    def retrieve(state: DirectState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        cfg = run_config(config, runtime)
        knowledge = []
        for tool in tools:  # one call per tool with the question, through the one tool pipeline
            outcome = invoke_tool(tool, state["question"], config=config, timeout_s=cfg.tool_timeout_s,
                                  max_output_tokens=cfg.max_observation_tokens)
            if is_tool_error(outcome):  # a failing tool contributes no evidence
                knowledge.append({"tool": tool.name, "error": str(outcome)})
            else:
                knowledge.append({"tool": tool.name, "text": outcome})
        return {"knowledge": knowledge, "tool_calls": len(tools)}

    def answer(state: DirectState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        cfg = run_config(config, runtime)
        fmt = cfg.answer_format
        question = state["question"]
        if name == "sr-rag":
            usable = [k for k in state.get("knowledge", []) if "text" in k]
            body = "\n\n".join(f"[{k['tool']}]\n{k['text']}" for k in usable) or "(nothing was retrieved)"
            prompt = f"Retrieved knowledge:\n{body}\n\nQuestion:\n{question}"
        else:
            prompt = question
        rule = answer_format.instructions(fmt)
        system = _SYSTEM[name] + (f" Your final answer is your Conclusion. {rule}" if rule else "")
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        base = {"steps": 1, "trace": [], "answer_validated": False, "state_value": None,
                "tool_calls": state.get("tool_calls", 0)}
        calls = 0
        retries = 0
        while True:
            calls += 1
            try:
                text = _invoke_model(model, messages, cfg, config)
            except Exception as exc:
                return {**base, "llm_calls": calls, "format_retries": retries, "answer": None, "raw_output": "",
                        "structured_answer": None, "halt_reason": "model_error",
                        "error": f"{type(exc).__name__}: {exc}"}
            final = (answer_format.final_answer(text) if name == "cot" else text.strip()) or None
            structured, problem = answer_format.check(fmt, final or "")
            if problem is not None and name == "cot" and _answer_line(text):  # the labelled line alone
                line_structured, line_problem = answer_format.check(fmt, _answer_line(text))
                if line_problem is None:
                    structured, problem = line_structured, None
            if fmt is None or problem is None or retries >= cfg.max_format_retries:
                break
            retries += 1  # the model is told what is allowed and asked again
            messages += [AIMessage(content=text or "(empty)"),
                         HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
        return {**base, "llm_calls": calls, "format_retries": retries, "answer": final, "raw_output": text,
                "structured_answer": structured if fmt is not None and problem is None else None,
                "halt_reason": "answered" if problem is None else "format_error",
                "error": None if problem is None else f"no answer in the asked format after {retries} re-prompts: {problem}"}

    builder = StateGraph(DirectState, context_schema=TCRAGConfig)
    builder.add_node("Answer", answer)
    if name == "sr-rag":
        builder.add_node("Retrieve", retrieve)
        builder.add_edge(START, "Retrieve")
        builder.add_edge("Retrieve", "Answer")
    else:
        builder.add_edge(START, "Answer")
    builder.add_edge("Answer", END)
    graph = builder.compile(name=name)
    return graph


# --------------------------------------------------------------------------------------------
# Public builders
# --------------------------------------------------------------------------------------------


def build_method(
    name: str,
    *,
    model: BaseChatModel,
    tools: Sequence[BaseTool] = (),
    scorer: Any = None,
    config: Optional[TCRAGConfig] = None,
    sigmas: Optional[Mapping[str, float]] = None,
    documents: Optional[Sequence[Any]] = None,
    options: Optional[Mapping[str, Any]] = None,
):
    """A compiled graph for method ``name`` (see the module table).

    ``config`` is the shared base configuration (max_steps, max_new_tokens, temperature, ...);
    ``scorer`` the state monitor for the TC-RAG variants (``None`` = the local LM scorer);
    ``documents`` what a method that indexes documents itself (DiffRAG) reads instead of calling
    tools (``None``: its default); the other methods ignore it. ``options`` are the own options of a
    papers' method (``CRPRAGOptions``, ``KAGThinkerOptions``, ``DiffRAGOptions`` fields, e.g. a
    smaller CRP-RAG graph for a CPU budget); the other methods have none and refuse them.
    """
    spec = _spec(name)
    if not isinstance(model, BaseChatModel):
        raise TypeError(f"model must be a LangChain chat model, got {type(model).__name__}")
    if options:
        _check_takes_options(name)
    base = config or TCRAGConfig()
    if spec.kind == "direct":
        return _direct_graph(name, model, list(tools) if spec.uses_tools else [], base)
    if spec.kind == "graph":
        module_name, _, function = (spec.builder or "").partition(":")
        build = getattr(importlib.import_module(f"tcrag_langgraph.methods.{module_name}"), function)
        own = dict(options or {})
        extra: dict[str, Any] = {"options": own} if own else {}
        if spec.indexes_documents and documents is not None:
            # documents chosen by the caller are read whole (the builder's default cap is for its
            # own default corpus)
            extra = {"documents": documents, "options": {"max_passages": 5000, **own}}
        return build(model=model, tools=list(tools), scorer=scorer, config=base, **extra)
    cfg = tcrag_config_for(name, config=base, sigmas=sigmas)
    return build_graph(model=model, tools=list(tools), scorer=scorer, config=cfg, name=name)


def _check_takes_options(name: str) -> None:
    if _spec(name).kind != "graph":
        with_options = ", ".join(n for n, s in METHODS.items() if s.kind == "graph")
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
    model: BaseChatModel,
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
