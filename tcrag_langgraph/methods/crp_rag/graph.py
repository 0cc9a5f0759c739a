"""CRP-RAG's node holder: :class:`CRPRAG` declares the graph (``Start``, ``Expand``, ``Retrieve``,
``Evaluate``, ``Select``, ``Answer``) and names each stage's functions (construction, knowledge,
answering) as its nodes; the run kernel builds it (:meth:`~tcrag_langgraph.core.kernel.RunKernel.build`)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.types import Command

from ...core.arguments import BuildArguments
from ...core.config import TCRAGConfig
from ...core.kernel import RunKernel
from ...core.state import TraceEvent
from . import answering, construction, knowledge
from .options import CRPRAGOptions
from .state import CRPState

__all__ = ["NODE_NAMES", "CRPRAG"]



class CRPRAG(RunKernel):
    """Holds the model, tools, scorer and embedder; the stages' functions are its nodes.

    ``CRPRAG.build(model=..., tools=..., scorer=..., config=..., options=..., embeddings=...)``:


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

    method = "CRP-RAG"
    default_name = "crp-rag"
    state_schema = CRPState  # context: CRPRAGOptions, TCRAGConfig or a mapping of their fields
    options_type = CRPRAGOptions
    reads_scores = True  # sufficiency is the method's core: it cannot be off
    nodes = {"Start": "start", "Expand": "expand", "Retrieve": "retrieve", "Evaluate": "evaluate",
             "Select": "select", "Answer": "answer"}

    start = construction.start
    expand = construction.expand
    sample_step = construction.sample_step
    merge = construction.merge
    embed = construction.embed
    retrieve = knowledge.retrieve
    evaluate = knowledge.evaluate
    select = answering.select
    answer = answering.answer

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, embeddings: Any,
                 config: TCRAGConfig, options: CRPRAGOptions, *, trust_client_identity: bool = False) -> None:
        super().__init__(model, tools, scorer, config, options, trust_client_identity=trust_client_identity)
        self.embeddings = embeddings

    @classmethod
    def prepare(cls, args: BuildArguments, *, embeddings: Any = None) -> "CRPRAG":
        if embeddings is None:
            from ...tools.documents import default_embeddings

            embeddings = default_embeddings()
        return cls(args.model, args.tools, cls.scorer_for(args), embeddings, args.config, args.options,
                   trust_client_identity=args.trust_client_identity)

    def position(self, state: Mapping[str, Any]) -> tuple[int, Optional[float]]:
        """A CRP-RAG run stands at the size of its reasoning graph and its best path's score."""
        return len(state.get("nodes") or []), state.get("path_score")

    def trace_event(self, config: RunnableConfig, events: list[TraceEvent], *, step: int, action: str, op: str,
                    content: str = "", nodes: int = 0, value: Optional[float] = None,
                    detail: Optional[dict[str, Any]] = None) -> None:
        """Record one event of the reasoning graph (emitted live) into ``events``."""
        event = TraceEvent(step=step, action=action, op=op, content=content[:2000], stack_depth=nodes,
                           state_value=value,
                           detail=None if detail is None else json.dumps(detail, ensure_ascii=False, default=str))
        events.extend(self.record(None, config, event))

    def end(self, state: Mapping[str, Any], config: RunnableConfig, counters: dict[str, Any],
            events: list[TraceEvent], *, reason: str, answer: Optional[str] = None, validated: bool = False,
            error: Optional[str] = None, extra: Optional[dict[str, Any]] = None) -> Command:
        """Halt (the kernel's) with this node's counters and events."""
        update = {**(extra or {}), **counters, "trace": [*state.get("trace", []), *events]}
        return self.halt(state, config, reason=reason, answer=answer, validated=validated, error=error, extra=update)


#: the graph's nodes, entry first
NODE_NAMES: tuple[str, ...] = tuple(CRPRAG.nodes)
