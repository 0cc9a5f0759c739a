"""One way to build an agent from options: :class:`~.spec.AgentSpec` (what every face and
``tcrag eval`` build from) and :mod:`.flags` (the command-line flags made from its fields and
:class:`~tcrag_langgraph.core.config.TCRAGConfig`'s)."""
