"""The graph builder: :func:`build_kag_thinker_graph` checks its arguments, resolves the model and
the scorer, and wires the nodes of :class:`~.nodes._Solver` into a compiled LangGraph graph."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.graph import START, StateGraph

from ...machine.config import TCRAGConfig
from ...monitor.scoring import MonitorUnavailableError, scorer_for_model
from .nodes import _Solver
from .options import _MAX_FORMS_CAP, _MAX_TURNS_CAP, KAGThinkerOptions
from .state import KAGThinkerState

NODE_NAMES = ("Start", "Decompose", "Retrieval", "Depth_Solve", "Math", "Deduce", "Output")


def build_kag_thinker_graph(
    *,
    model: BaseChatModel | str | None = None,
    tools: Optional[Sequence[BaseTool]] = None,
    scorer: Any = None,
    config: Optional[TCRAGConfig | dict[str, Any]] = None,
    options: Optional[KAGThinkerOptions | dict[str, Any]] = None,
    checkpointer: Any = None,
    name: str = "kag-thinker",
    trust_client_identity: bool = False,
):
    """Build and compile the KAG-Thinker graph.

    Args:
        model: a LangChain chat model, a local path / ``.gguf`` or ``"provider:model"`` name
            (:func:`~tcrag_langgraph.models.local.resolve_chat_model`); ``None``: the packaged SmolLM2.
        tools: the tools a depth turn retrieves with (unique names); may be empty.
        scorer: anything with ``token_logprobs(context, text) -> list[float]`` for the likelihood
            test. ``None``: the generator's own weights (:func:`~tcrag_langgraph.monitor.scoring.scorer_for_model`,
            which raises :class:`~tcrag_langgraph.monitor.scoring.MonitorUnavailableError` for a model without
            trusted log-probs: then pass a scorer or ``options={"knowledge_boundary": False}``).
        config: :class:`~tcrag_langgraph.TCRAGConfig` (generation and tool limits, format retries).
        options: :class:`KAGThinkerOptions` (decomposition, depth and boundary settings).
        checkpointer: any LangGraph checkpointer; give it ``serde=tcrag_langgraph.faces.integration.checkpoint_serde()``.
        trust_client_identity: let a run's context set ``caller`` (see :func:`tcrag_langgraph.build_graph`).

    Returns:
        A compiled graph: ``invoke({"question": ...})``; per-run overrides of either options model
        through ``context=``. Its recursion limit covers the largest plan the option bounds allow.
    """
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    opts = options if isinstance(options, KAGThinkerOptions) else KAGThinkerOptions.model_validate(options or {})
    tools = list(tools or [])
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise ValueError(f"tools must be LangChain BaseTool instances, got {type(tool).__name__}")
    if len({t.name for t in tools}) != len(tools):
        raise ValueError("tool names must be unique")
    unknown = [n for n in (opts.retrieval_tools or ()) if n not in {t.name for t in tools}]
    if unknown:
        raise ValueError(f"retrieval_tools names tools not given: {unknown}")
    if not (model is None or isinstance(model, (BaseChatModel, str))):
        raise ValueError(f"model must be a LangChain chat model, a path or a 'provider:model' name, "
                         f"got {type(model).__name__}")
    if not isinstance(model, BaseChatModel):
        from ...models.local import resolve_chat_model

        model = resolve_chat_model(model, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    if opts.knowledge_boundary:
        if scorer is None:
            try:
                scorer = scorer_for_model(model)
            except MonitorUnavailableError as err:
                raise MonitorUnavailableError(
                    f"{err} For KAG-Thinker the scorer is the likelihood test of the knowledge boundary: pass "
                    "scorer=, or build with options={'knowledge_boundary': False} (every Retrieval step "
                    "then retrieves).") from None
        if not callable(getattr(scorer, "token_logprobs", None)):
            raise ValueError(f"the likelihood test needs a scorer with token_logprobs(context, text); "
                             f"{type(scorer).__name__} has none (or build with knowledge_boundary=False)")
    solver = _Solver(model, tools, scorer, cfg, opts, trust_client_identity=trust_client_identity)
    builder = StateGraph(KAGThinkerState)
    builder.add_node("Start", solver.start)
    builder.add_node("Decompose", solver.guarded(solver.decompose))
    builder.add_node("Retrieval", solver.guarded(solver.retrieval))
    builder.add_node("Depth_Solve", solver.guarded(solver.depth_solve))
    builder.add_node("Math", solver.guarded(solver.math))
    builder.add_node("Deduce", solver.guarded(solver.deduce))
    builder.add_node("Output", solver.output)
    builder.add_edge(START, "Start")
    graph = builder.compile(checkpointer=checkpointer, name=name)
    # Worst case: Start, Decompose, and per form its node plus every depth turn (a caller's own
    # recursion_limit still wins).
    return graph.with_config(recursion_limit=2 + _MAX_FORMS_CAP * (1 + _MAX_TURNS_CAP) + 1)
