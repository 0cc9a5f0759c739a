"""CRP-RAG's graph builder: :func:`build_crp_rag_graph` validates its arguments and wires the five
stages' nodes (``Start``, ``Expand``, ``Retrieve``, ``Evaluate``, ``Select``, ``Answer``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.graph import START, StateGraph

from ...machine.config import TCRAGConfig
from ...monitor.scoring import StateScorer, scorer_for_model
from .answering import AnswerNodes
from .construction import GraphConstruction
from .knowledge import KnowledgeNodes
from .options import CRPRAGOptions
from .state import CRPState

__all__ = ["NODE_NAMES", "build_crp_rag_graph"]

NODE_NAMES = ("Start", "Expand", "Retrieve", "Evaluate", "Select", "Answer")


class _CRPRAG(GraphConstruction, KnowledgeNodes, AnswerNodes):
    """Holds the model, tools, scorer and embedder; its methods are the graph nodes (one stage a base class)."""


def build_crp_rag_graph(
    *,
    model: BaseChatModel,
    tools: Sequence[BaseTool] = (),
    scorer: Optional[StateScorer | Callable[..., float]] = None,
    config: Optional[TCRAGConfig] = None,
    options: Optional[CRPRAGOptions | Mapping[str, Any]] = None,
    embeddings: Any = None,
    checkpointer: Any = None,
    name: str = "crp-rag",
):
    """Build and compile the CRP-RAG graph.

    Args:
        model: any LangChain chat model (generator of steps, merges, knowledge, reasoning, answers).
        tools: LangChain tools; each node's text is searched with every one (names must be unique).
        scorer: the perplexity scorer for knowledge sufficiency (``score(context, text, *, metric)``);
            ``None`` scores with the generator's own weights (:func:`~tcrag_langgraph.monitor.scoring.scorer_for_model`),
            which raises :class:`~tcrag_langgraph.monitor.scoring.MonitorUnavailableError` for models without
            trusted log-probs (then pass one: sufficiency is the method's core, it cannot be off).
        config: the shared :class:`TCRAGConfig` (``max_new_tokens``, ``temperature``, tool timeout and
            observation budget, question length limit, ``caller``).
        options: :class:`CRPRAGOptions` (or a dict of its fields); per run: ``context=``.
        embeddings: the embedder for node merging (default: the packaged MiniLM).
        checkpointer: a LangGraph checkpointer; the state holds only plain dicts, lists and
            TraceEvents, so ``serde=tcrag_langgraph.faces.integration.checkpoint_serde()`` restores it.

    Returns:
        A compiled graph: ``invoke({"question": ...})`` or ``invoke({"messages": [...]})``.
    """
    if not isinstance(model, BaseChatModel):
        raise TypeError(f"model must be a LangChain chat model, got {type(model).__name__}")
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    opts = options if isinstance(options, CRPRAGOptions) else CRPRAGOptions.model_validate(dict(options or {}))
    tools = list(tools)
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise TypeError(f"tools must be LangChain BaseTool instances, got {type(tool).__name__}")
    if len({tool.name for tool in tools}) != len(tools):
        raise ValueError("tool names must be unique")
    if scorer is None:
        scorer = scorer_for_model(model)
    elif not (hasattr(scorer, "score") or callable(scorer)):
        raise TypeError("scorer must have score(query, text, *, metric) or be callable")
    if embeddings is None:
        from ...tools.documents import default_embeddings

        embeddings = default_embeddings()
    machine = _CRPRAG(model, tools, scorer, embeddings, cfg, opts)
    builder = StateGraph(CRPState)  # context: CRPRAGOptions, TCRAGConfig or a mapping (see settings)
    builder.add_node("Start", machine.start)
    builder.add_node("Expand", machine.expand)
    builder.add_node("Retrieve", machine.retrieve)
    builder.add_node("Evaluate", machine.evaluate)
    builder.add_node("Select", machine.select)
    builder.add_node("Answer", machine.answer)
    builder.add_edge(START, "Start")
    return builder.compile(checkpointer=checkpointer, name=name)
