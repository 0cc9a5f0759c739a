"""Every method of the package, one module or package each, built on the shared core
(:mod:`tcrag_langgraph.core`): TC-RAG's stack machine (:mod:`.tcrag`), the paper's baselines and the
source papers' other systems (CRP-RAG, KAG-Thinker, TCM-DiffRAG).

Each method is one node holder, a :class:`~tcrag_langgraph.core.kernel.RunKernel` subclass that
declares its state, options and nodes; its ``build(*, model, tools, scorer, config, ...)`` returns a
compiled LangGraph graph (a drop-in node: ``invoke({"question": ...})``, live ``tcrag`` events,
checkpointable). :data:`tcrag_langgraph.methods.registry.METHODS` lists them, one row each, for the
faces, ``tcrag eval --method`` and Studio (docs/methods.md: adding a method).
"""
