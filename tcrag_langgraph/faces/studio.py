"""The TC-RAG graph for LangGraph Studio / ``langgraph dev`` (see ``langgraph.json``).

``langgraph.json`` points at :func:`studio_graph` (TC-RAG), and at one factory per other method the
registry marks for Studio (:data:`~tcrag_langgraph.methods.registry.STUDIO_METHODS`; the factories
and the file are generated from it), each a graph factory (the Agent Server calls it per request) returning one graph
built on the first call, with the bounded budgets of ``tcrag ask`` (4 steps, 64 new tokens; a run's
context sets others). All sit behind the same authentication; ``studio.graph`` is the same graph for Python
users. Nothing is built at import, so importing this module never builds the real agent. It is compiled **without** a checkpointer (the LangGraph API
server refuses one and brings its own). By default it is the real agent: the packaged SmolLM2-135M-Instruct as generator and state monitor (loaded
lazily on the first run) with the default tools, EMR_SEARCH included.

Who the agent acts for comes only from the server's authenticated user (``langgraph.json``
"auth" names :data:`tcrag_langgraph.faces.auth.auth`); see :func:`tcrag_langgraph.core.identity.caller_for_run`
and docs/security.md.

Testing / demo hook: if the environment variable ``TCRAG_STUDIO_SCRIPTED`` names a JSON script
(format: :mod:`tcrag_langgraph.testing`), the graph uses the scripted model and scorer instead;
that is NOT a language model. With ``"real_tools": true`` in the script the real default tools are
added to the scripted ones, so a scripted "model" can drive the real EMR_SEARCH.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any, Optional

from tcrag_langgraph.methods.registry import DEFAULT_METHOD, STUDIO_METHODS, studio_factory_name
from tcrag_langgraph.testing import SCRIPT_ENV

__all__ = ["make_graph", "studio_graph", "graph", "SCRIPT_ENV", "STUDIO_METHODS",
           *(studio_factory_name(m) for m in STUDIO_METHODS if m != DEFAULT_METHOD)]

_built: dict[str, Any] = {}
_build_lock = threading.Lock()


def make_graph(*, script: Optional[str] = None, tools: bool = True, method: str = "tcrag"):
    """The graph Studio serves for registry method ``method``: scripted if ``script`` (or
    ``$TCRAG_STUDIO_SCRIPTED``) is set, else the real agent with the default tools and the bounded
    budgets of ``tcrag ask`` (:data:`~tcrag_langgraph.agent.spec.FACE_DEFAULTS`), built by
    :class:`~tcrag_langgraph.agent.spec.AgentSpec` as every face's agent is. Its model is the
    packaged one unless ``$TCRAG_MODEL`` names another as ``tcrag ask --model`` does (a ``.gguf``
    file, a model folder, ``provider:name``), with ``$TCRAG_BASE_URL`` and ``$TCRAG_API_KEY_ENV``
    (the NAME of the variable holding the key) for a served one; the monitor is the model's own
    weights unless ``$TCRAG_SCORER`` (``$TCRAG_SCORER_MODEL``, ``$TCRAG_SCORER_START_TEXT``) names
    another, as ``--scorer``; ``$TCRAG_ES_URL`` searches an Elasticsearch index (the variables:
    :data:`~tcrag_langgraph.agent.spec.ENV`). A bad value is a
    :class:`~tcrag_langgraph.agent.spec.UserError` (one line in the server log). Never has a checkpointer."""
    from tcrag_langgraph.agent.spec import AgentSpec

    script = script or os.environ.get(SCRIPT_ENV) or None
    config = AgentSpec.base_config(script)
    if script:
        spec = AgentSpec.create(method=method, script=script, tools="default" if tools else "none", config=config)
        # a scripted scorer has no token log-probs: KAG-Thinker's likelihood test is off in that demo
        return spec.build(options={"knowledge_boundary": False} if method == "kag-thinker" else None)
    return AgentSpec.from_env(method=method, tools=tools, config=config).build()


def _the_graph(method: str = "tcrag"):
    """:func:`make_graph`'s graph for ``method``, built on the first call (thread-safe), the same object afterwards."""
    with _build_lock:
        if method not in _built:
            _built[method] = make_graph(method=method)
        return _built[method]


def _factory(method: str):
    async def factory():
        if method in _built:
            return _built[method]
        return await asyncio.to_thread(_the_graph, method)

    factory.__name__ = factory.__qualname__ = f"{method.replace('-', '_')}_graph"
    factory.__doc__ = f"The graph factory langgraph.json exports for method {method!r} (built on the first call)."
    return factory


async def studio_graph():
    """The graph factory ``langgraph.json`` exports (``./tcrag_langgraph/faces/studio.py:studio_graph``).

    Asynchronous because the Agent Server calls it on its event loop: the first call builds the
    graph in a worker thread (opening the EMR database is blocking I/O), later calls return it."""
    if "tcrag" in _built:
        return _built["tcrag"]
    return await asyncio.to_thread(_the_graph, "tcrag")


# one factory per method Studio serves, named as langgraph.json names it (``crp-rag`` -> ``crp_rag_graph``)
for _method in STUDIO_METHODS:
    if _method != DEFAULT_METHOD:
        globals()[studio_factory_name(_method)] = _factory(_method)


def __getattr__(name: str) -> Any:
    """``studio.graph``: the served TC-RAG graph, built on first access."""
    if name != "graph":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _the_graph("tcrag")


def register(app: Any) -> None:
    """``tcrag studio-config``: write (or ``--check``) ``langgraph.json`` from the method registry."""
    import json

    import typer

    from tcrag_langgraph.methods.registry import langgraph_config

    @app.command("studio-config")
    def studio_config(
        path: Path = typer.Argument(Path("langgraph.json"), help="The file LangGraph Studio / `langgraph dev` reads."),
        check: bool = typer.Option(False, "--check", help="Change nothing; exit 1 when the file differs from the registry."),
    ) -> None:
        """Write langgraph.json from the method registry: one graph per method Studio serves."""
        config = langgraph_config()
        text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        if check:
            current = path.read_text(encoding="utf-8") if path.exists() else ""
            if current != text:
                typer.echo(f"{path} differs from the method registry; run `tcrag studio-config {path}`", err=True)
                raise typer.Exit(1)
            typer.echo(f"{path} matches the method registry")
            return
        path.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {path} ({len(config['graphs'])} graphs)")
