"""LangServe app: the TC-RAG agent as a chat endpoint, and the ``tcrag serve`` command.

Routes (under ``/tcrag``): ``/invoke``, ``/batch``, ``/stream``, ``/stream_events`` (with the live
``tcrag`` custom events: every push, pop, state value, tool call and halt), ``/playground/`` (chat
playground) from plain :func:`langserve.add_routes`; plus ``GET /tcrag/threads/{thread_id}`` (the
stack, trace and answer stored for a conversation thread) and ``GET /healthz``.

Input ``{"messages": [...]}`` (the last human message is the question), output one AI message whose
``response_metadata`` has ``halt_reason``, ``answer_validated``, ``state_value``, ``sigma``,
``metric``, ``steps`` and ``stack``.

Per-request options go in the request's ``config.configurable``: ``sigma``, ``metric``,
``max_steps``, ``max_new_tokens``, ``temperature``, ``enable_backtrack``, ``enable_summary``,
``enable_state_monitor``, ``few_shot``, ``language``, ``unlabeled_text``, ``max_format_retries``
and ``thread_id``. LangServe itself would drop ``thread_id`` and fill unset options with
defaults, so :func:`per_request_config` re-reads them from the raw request and validates them
(an invalid value is a 422). The caller identity and human review are never taken from a request.

Each request without a ``thread_id`` runs on a fresh thread. With one, the thread's messages are
kept (in memory, or in SQLite with ``checkpoint_db``): send only the new message per turn.

Example (the scripted model is a testing/demo hook, not a language model)::

    from tcrag_langgraph.serve import create_app
    from tcrag_langgraph.studio import scripted_graph
    from langgraph.checkpoint.memory import InMemorySaver
    app = create_app(graph=scripted_graph({"replies": ["Conclusion: yes"], "default_score": 1},
                                          checkpointer=InMemorySaver()))
    # uvicorn.run(app, host="127.0.0.1", port=8000)

Command line: ``tcrag serve --host 127.0.0.1 --port 8000`` (real packaged model), or
``tcrag serve --scripted script.json`` (scripted demo model, see :mod:`tcrag_langgraph.studio`).
"""

from __future__ import annotations

import json
import uuid
from contextlib import asynccontextmanager
from typing import Any, Optional

from fastapi import FastAPI, HTTPException, Request
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import ValidationError

from .config import TCRAGConfig
from .integration import as_chat_runnable, checkpoint_serde

__all__ = ["create_app", "per_request_config", "REQUEST_OPTIONS", "register"]

#: TCRAGConfig fields a client may set per request (never ``caller`` or ``require_review``).
REQUEST_OPTIONS = (
    "sigma", "metric", "max_steps", "max_new_tokens", "temperature", "enable_backtrack", "enable_summary",
    "enable_state_monitor", "few_shot", "language", "unlabeled_text", "max_format_retries",
)


async def per_request_config(config: dict[str, Any], request: Request) -> dict[str, Any]:
    """LangServe ``per_req_config_modifier``: the run's ``configurable`` is exactly the validated
    options the client sent (see :data:`REQUEST_OPTIONS`) plus a ``thread_id`` (a new one if none)."""
    sent: dict[str, Any] = {}
    if request.method == "POST":
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {}
        raw = body.get("config") if isinstance(body, dict) else None
        if isinstance(raw, list):  # /batch with one config per input: options must agree
            raw = raw[0] if raw else None
        if isinstance(raw, dict) and isinstance(raw.get("configurable"), dict):
            sent = raw["configurable"]
    unknown = sorted(k for k in sent if k not in REQUEST_OPTIONS and k != "thread_id")
    if unknown:
        raise HTTPException(422, f"unsupported configurable option(s): {', '.join(unknown)}; "
                                 f"allowed: thread_id, {', '.join(REQUEST_OPTIONS)}")
    options = {k: sent[k] for k in REQUEST_OPTIONS if k in sent}
    try:
        TCRAGConfig.model_validate(options)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HTTPException(422, f"invalid option {first['loc'][0] if first['loc'] else ''}: {first['msg']}")
    thread_id = sent.get("thread_id")
    if thread_id is not None and (not isinstance(thread_id, str) or not thread_id.strip()):
        raise HTTPException(422, "thread_id must be a non-empty string")
    configurable = {**options, "thread_id": thread_id or f"tcrag-{uuid.uuid4()}"}
    return {**{k: v for k, v in config.items() if k != "configurable"}, "configurable": configurable}


def create_app(
    *,
    graph: Any = None,
    config: Optional[TCRAGConfig] = None,
    tools: bool = True,
    checkpoint_db: Optional[str] = None,
    playground: bool = True,
    title: str = "TC-RAG",
) -> FastAPI:
    """The FastAPI app serving the agent through LangServe.

    Args:
        graph: a compiled TC-RAG graph to serve as is (tests and demos pass a scripted one, with its
            own checkpointer). ``None`` builds the real agent (packaged local model, loaded on the
            first request) with ``config`` and the default tools.
        config: base options when ``graph`` is None.
        tools: give the default tools to the agent built here.
        checkpoint_db: SQLite file for thread memory (``AsyncSqliteSaver``); default in memory. Only
            used when this function builds the graph, or when ``graph`` has no checkpointer.
        playground: serve ``/tcrag/playground/``.
    """
    from langserve import add_routes

    if graph is None:
        from .graph import build_graph
        from .tools import default_tools

        graph = build_graph(config=config, tools=default_tools() if tools else [], name="tcrag")
    if getattr(graph, "checkpointer", None) is None and checkpoint_db is None:
        graph.checkpointer = InMemorySaver(serde=checkpoint_serde())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if checkpoint_db is not None and graph.checkpointer is None:
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with aiosqlite.connect(checkpoint_db) as conn:
                saver = AsyncSqliteSaver(conn, serde=checkpoint_serde())
                graph.checkpointer = saver  # created on the server's event loop, as aiosqlite needs
                try:
                    yield
                finally:
                    graph.checkpointer = None
        else:
            yield

    app = FastAPI(title=title, version="0.1.0", lifespan=lifespan,
                  description="TC-RAG: a retrieval-augmented agent with stack memory and a state monitor.")
    add_routes(
        app,
        as_chat_runnable(graph),
        path="/tcrag",
        config_keys=("configurable",),
        per_req_config_modifier=per_request_config,
        playground_type="chat",
        enabled_endpoints=None if playground else ("invoke", "batch", "stream", "stream_log", "stream_events",
                                                   "input_schema", "output_schema", "config_schema"),
    )

    @app.get("/tcrag/threads/{thread_id}")
    async def thread_state(thread_id: str) -> dict[str, Any]:
        """The stack, trace and answer stored for a thread (404 if the thread is unknown)."""
        from .cli import result_dict

        snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        if not snapshot.values:
            raise HTTPException(404, f"no such thread: {thread_id}")
        result = result_dict(snapshot.values)
        result["messages"] = [{"type": m.type, "content": m.content} for m in snapshot.values.get("messages", [])]
        result["next"] = list(snapshot.next)
        return result

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "graph": graph.get_name(), "nodes": [n for n in graph.nodes if not n.startswith("__")]}

    return app


def register(app: Any) -> None:
    """Add ``tcrag serve`` to the ``tcrag`` typer app."""
    import typer

    @app.command()
    def serve(
        host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
        port: int = typer.Option(8000, min=0, max=65535, help="TCP port."),
        tools: bool = typer.Option(True, "--tools/--no-tools", help="Give the agent the default tools."),
        checkpoint_db: Optional[str] = typer.Option(None, help="SQLite file keeping conversation threads."),
        scripted: Optional[str] = typer.Option(
            None, help="TESTING/DEMO: replay a JSON script instead of a language model (see tcrag_langgraph.studio)."),
        log_level: str = typer.Option("info", help="uvicorn log level."),
    ) -> None:
        """Serve the agent over HTTP (LangServe): /tcrag/invoke, /stream, /stream_events, /playground/."""
        import uvicorn

        graph = None
        if scripted:
            from .studio import scripted_graph

            graph = scripted_graph(scripted)
        application = create_app(graph=graph, tools=tools, checkpoint_db=checkpoint_db)
        typer.echo(f"TC-RAG serving on http://{host}:{port}/tcrag (playground: /tcrag/playground/)"
                   + (" [SCRIPTED model: not a language model]" if scripted else ""), err=True)
        uvicorn.run(application, host=host, port=port, log_level=log_level)
