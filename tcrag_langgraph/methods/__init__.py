"""The other systems of the source papers, built on TC-RAG's parts (chat model, state monitor's
log-prob scorer, the tools and their layer, MiniLM embeddings, live events), one module each.

Each module exposes a ``build_<method>_graph(*, model, tools, scorer, config, ...)`` that returns a
compiled LangGraph graph (a drop-in node: ``invoke({"question": ...})``, live ``tcrag`` events,
checkpointable), and is registered in :data:`tcrag_langgraph.methods.registry.METHODS` for
``tcrag eval --method``.
"""
