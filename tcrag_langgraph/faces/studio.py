"""The TC-RAG graph for LangGraph Studio / ``langgraph dev`` (see ``langgraph.json``).

``langgraph.json`` points at :func:`studio_graph`, a graph factory (the Agent Server calls it per
request) returning one graph built on the first call; ``studio.graph`` is the same graph for Python
users. Nothing is built at import, so importing this module never builds the real agent. It is compiled **without** a checkpointer (the LangGraph API
server refuses one and brings its own). By default it is the real agent: the packaged SmolLM2-135M-Instruct as generator and state monitor (loaded
lazily on the first run) with the default tools, EMR_SEARCH included.

Who the agent acts for comes only from the server's authenticated user (``langgraph.json``
"auth" names :data:`tcrag_langgraph.faces.auth.auth`); see :func:`tcrag_langgraph.machine.identity.caller_for_run`
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
from typing import Any, Optional

from tcrag_langgraph.testing import SCRIPT_ENV, scripted_graph

__all__ = ["make_graph", "studio_graph", "graph", "SCRIPT_ENV"]

_built: dict[str, Any] = {}
_build_lock = threading.Lock()


def make_graph(*, script: Optional[str] = None, tools: bool = True):
    """The graph Studio serves: scripted if ``script`` (or ``$TCRAG_STUDIO_SCRIPTED``) is set, else the
    real agent (packaged local model, default tools). Never has a checkpointer."""
    script = script or os.environ.get(SCRIPT_ENV) or None
    if script:
        return scripted_graph(script)
    from tcrag_langgraph.methods.registry import DEFAULT_METHOD, build_method
    from tcrag_langgraph.tools import default_tools

    return build_method(DEFAULT_METHOD, tools=default_tools() if tools else [])


def _the_graph():
    """:func:`make_graph`'s graph, built on the first call (thread-safe), the same object afterwards."""
    with _build_lock:
        if "graph" not in _built:
            _built["graph"] = make_graph()
        return _built["graph"]


async def studio_graph():
    """The graph factory ``langgraph.json`` exports (``./tcrag_langgraph/faces/studio.py:studio_graph``).

    Asynchronous because the Agent Server calls it on its event loop: the first call builds the
    graph in a worker thread (opening the EMR database is blocking I/O), later calls return it."""
    if "graph" in _built:
        return _built["graph"]
    return await asyncio.to_thread(_the_graph)


def __getattr__(name: str) -> Any:
    """``studio.graph``: the served graph, built on first access."""
    if name != "graph":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _the_graph()
