"""CRP-RAG's graph builder: :func:`build_crp_rag_graph` validates its arguments and wires the five
stages' nodes (``Start``, ``Expand``, ``Retrieve``, ``Evaluate``, ``Select``, ``Answer``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.graph import START, StateGraph

from ...machine.config import TCRAGConfig
from ...machine.kernel import build_arguments, default_scorer
from ...monitor.scoring import StateScorer
from .answering import AnswerNodes
from .options import CRPRAGOptions
from .state import CRPState

__all__ = ["NODE_NAMES", "build_crp_rag_graph"]

NODE_NAMES = ("Start", "Expand", "Retrieve", "Evaluate", "Select", "Answer")


class _CRPRAG(AnswerNodes):
    """Holds the model, tools, scorer and embedder; its methods are the graph nodes (each stage's class
    builds on the previous one: construction, knowledge, answering)."""


def build_crp_rag_graph(
    *,
    model: BaseChatModel | str | None = None,
    tools: Optional[Sequence[BaseTool]] = None,
    scorer: Optional[StateScorer | Callable[..., float]] = None,
    config: Optional[TCRAGConfig | Mapping[str, Any]] = None,
    options: Optional[CRPRAGOptions | Mapping[str, Any]] = None,
    checkpointer: Any = None,
    store: Any = None,
    name: str = "crp-rag",
    trust_client_identity: bool = False,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    embeddings: Any = None,
):
    """Build and compile the CRP-RAG graph.

    Args:
        model: a LangChain chat model, a local path / ``.gguf`` or ``"provider:model"`` name; None:
            the packaged default (generator of steps, merges, knowledge, reasoning, answers).
        tools: LangChain tools; each node's text is searched with every one (names must be unique).
        scorer: the perplexity scorer for knowledge sufficiency (``score(context, text, *, metric)``);
            ``None`` scores with the generator's own weights (:func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`),
            which raises :class:`~tcrag_langgraph.monitor.scoring.MonitorUnavailableError` for models without
            trusted log-probs (then pass one: sufficiency is the method's core, it cannot be off).
        config: the shared :class:`TCRAGConfig` (``max_new_tokens``, ``temperature``, tool timeout and
            observation budget, question length limit, ``caller``).
        options: :class:`CRPRAGOptions` (or a dict of its fields); per run: ``context=``.
        checkpointer, store: LangGraph's; the state holds only plain dicts, lists and TraceEvents, so
            ``serde=tcrag_langgraph.checkpoint_serde()`` restores it.
        name: the compiled graph's name.
        trust_client_identity: let a run's context set ``caller`` (see :func:`tcrag_langgraph.build_graph`).
        embeddings: the embedder for node merging (default: the packaged MiniLM).

    Returns:
        A compiled graph: ``invoke({"question": ...})`` or ``invoke({"messages": [...]})``.
    """
    args = build_arguments(model=model, tools=tools, scorer=scorer, config=config, options=options, name=name,
                           trust_client_identity=trust_client_identity, options_type=CRPRAGOptions, method="CRP-RAG",
                           model_kwargs=model_kwargs)
    scorer = default_scorer(args.model, args.scorer, needed=True)
    if embeddings is None:
        from ...tools.documents import default_embeddings

        embeddings = default_embeddings()
    machine = _CRPRAG(args.model, args.tools, scorer, embeddings, args.config, args.options,
                      trust_client_identity=trust_client_identity)
    builder = StateGraph(CRPState)  # context: CRPRAGOptions, TCRAGConfig or a mapping of their fields
    for node_name, node in (("Start", machine.start), ("Expand", machine.expand), ("Retrieve", machine.retrieve),
                            ("Evaluate", machine.evaluate), ("Select", machine.select), ("Answer", machine.answer)):
        builder.add_node(node_name, machine.node(node))
    builder.add_edge(START, "Start")
    return builder.compile(checkpointer=checkpointer, store=store, name=args.name)
