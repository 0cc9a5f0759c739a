"""The graph builder: :func:`build_kag_thinker_graph` checks its arguments, resolves the model and
the scorer, and wires the nodes of :class:`~.nodes._Solver` into a compiled LangGraph graph."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.graph import START, StateGraph

from ...machine.config import TCRAGConfig
from ...machine.kernel import build_arguments, default_scorer
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
    store: Any = None,
    name: str = "kag-thinker",
    trust_client_identity: bool = False,
    model_kwargs: Optional[Mapping[str, Any]] = None,
):
    """Build and compile the KAG-Thinker graph.

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
    args = build_arguments(model=model, tools=tools, scorer=scorer, config=config, options=options, name=name,
                           trust_client_identity=trust_client_identity, options_type=KAGThinkerOptions,
                           method="KAG-Thinker", model_kwargs=model_kwargs)
    opts = args.options
    unknown = [n for n in (opts.retrieval_tools or ()) if n not in {t.name for t in args.tools}]
    if unknown:
        raise ValueError(f"retrieval_tools names tools not given: {unknown}")
    scorer = default_scorer(args.model, args.scorer, needed=opts.knowledge_boundary, why=(
        "For KAG-Thinker the scorer is the likelihood test of the knowledge boundary: pass scorer=, or build "
        "with options={'knowledge_boundary': False} (every Retrieval step then retrieves)."))
    if opts.knowledge_boundary and not callable(getattr(scorer, "token_logprobs", None)):
        raise ValueError(f"the likelihood test needs a scorer with token_logprobs(context, text); "
                         f"{type(scorer).__name__} has none (or build with knowledge_boundary=False)")
    solver = _Solver(args.model, args.tools, scorer, args.config, opts, trust_client_identity=trust_client_identity)
    builder = StateGraph(KAGThinkerState)
    for node_name, node in (("Start", solver.start), ("Decompose", solver.decompose), ("Retrieval", solver.retrieval),
                            ("Depth_Solve", solver.depth_solve), ("Math", solver.math), ("Deduce", solver.deduce),
                            ("Output", solver.output)):
        builder.add_node(node_name, solver.node(node))
    builder.add_edge(START, "Start")
    graph = builder.compile(checkpointer=checkpointer, store=store, name=args.name)
    # Worst case: Start, Decompose, and per form its node plus every depth turn (a caller's own
    # recursion_limit still wins).
    return graph.with_config(recursion_limit=2 + _MAX_FORMS_CAP * (1 + _MAX_TURNS_CAP) + 1)
