"""LangServe app: the TC-RAG agent as a chat endpoint (the ``tcrag serve`` command is in :mod:`.serve_command`).

Routes (under ``/tcrag``): ``/invoke``, ``/batch``, ``/stream``, ``/stream_events`` (with the live
``tcrag`` custom events: every push, pop, state value, tool call and halt), ``/playground/`` (chat
playground) from plain :func:`langserve.add_routes`; plus ``GET /tcrag/threads/{thread_id}`` (the
stack, trace and answer stored for a conversation thread), ``POST /tcrag/threads/{thread_id}/review``
(a person's decision on a run paused for review, with ``tcrag serve --review-unvalidated``) and
``GET /healthz``.

Input ``{"messages": [...]}`` (the last human message is the question), output one AI message whose
``response_metadata`` has ``halt_reason``, ``answer_validated``, ``state_value``, ``sigma``,
``metric``, ``steps`` and ``stack``.

Per-request options go in the request's ``config.configurable``: the :class:`TCRAGConfig` fields
listed by :func:`tcrag_langgraph.core.config.request_option_fields` (sigma, metric, max_steps, ...) and
``thread_id``. LangServe itself would drop ``thread_id`` and fill unset options with defaults, so
:func:`per_request_config` re-reads them from the raw request and validates them (an invalid or
unknown option is a 422). In ``/batch`` each input's own config applies. The caller identity and
human review are never taken from a request.

Security (see docs/security.md):

* **Authentication**: with a users file (``users=`` / ``tcrag serve --users-file``, format in
  :mod:`tcrag_langgraph.faces.auth`) every route but ``/healthz`` needs ``Authorization: Bearer <token>``
  or ``X-API-Key: <token>`` (401 otherwise). The authenticated user is the run's identity: it is
  put in the run config under ``langgraph_auth_user`` (a client can never send that key) and the
  graph maps it to the EMR caller. ``tcrag serve`` refuses to bind beyond loopback without one.
* **Host allow-list** (``allowed_hosts``, default the loopback names): other ``Host`` headers get
  400, which stops DNS rebinding.
* **Bodies**: POST bodies must be ``application/json`` (else 415: no "simple" cross-site form
  posts) and at most ``max_body_bytes`` (else 413); invalid JSON is 400, JSON nested deeper than
  ``max_json_depth`` or holding text that is not valid Unicode (a lone surrogate) is 422; all
  before any run starts.
* **Request shapes and costs** (:mod:`tcrag_langgraph.faces.serve_guard`): a run's ``input`` (each of
  ``/batch``'s ``inputs``) must be chat messages with a known ``type`` and text content (else 422);
  options a request sets are bounded by the operator's :class:`~tcrag_langgraph.faces.serve_guard.ServeCaps`
  (``tcrag serve --cap-...``; over a cap: 422); every run gets a ``recursion_limit`` above the longest
  run a valid config allows, so it ends by the graph's own halt.
* **Load** (:mod:`tcrag_langgraph.faces.serve_gate`, under the operator's
  :class:`~tcrag_langgraph.faces.serve_guard.RunLimits`): a bounded first-come first-served queue
  before the runs (beyond it, or after its longest wait: 503 with ``Retry-After``); a run whose
  client disconnects is cancelled; one whose client stops reading pauses, then is cancelled.
* **Threads** belong to the principal that created them: the stored thread id is the client's id
  namespaced by the principal, so no client reads or posts into another principal's thread.
* **Bounded memory**: without a durable checkpointer, threads live in a
  :class:`BoundedMemorySaver` keeping the ``max_threads`` most recently written threads; with
  ``checkpoint_db`` they live in SQLite. Either way with the safe serializer
  (:func:`~tcrag_langgraph.faces.integration.checkpoint_serde`).

Each request without a ``thread_id`` runs on a fresh thread. With one, the thread's messages are
kept: send only the new message per turn.

Example (the scripted model is a testing/demo hook, not a language model)::

    from tcrag_langgraph.faces.serve import create_app
    from tcrag_langgraph.testing import scripted_graph
    app = create_app(graph=scripted_graph({"replies": ["Conclusion: yes"], "default_score": 1}))
    # uvicorn.run(app, host="127.0.0.1", port=8000)

Command line: ``tcrag serve --host 127.0.0.1 --port 8000`` (real packaged model),
``tcrag serve --users-file users.json`` (authentication), or ``tcrag serve --scripted script.json``
(scripted demo model, see :mod:`tcrag_langgraph.testing`); the command lives in :mod:`.serve_command`
so that other ``tcrag`` commands start without this web stack.

Why one module of this size: the LangServe routes, the guards around them (token auth, Host allow-list,
body limits, thread scoping, the bounded store) are one face; each guard is only meaningful around
these routes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import threading
import uuid
from contextlib import asynccontextmanager
from typing import Any, Optional, Sequence

from cachetools import LRUCache
from fastapi import FastAPI, HTTPException, Request
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import ValidationError
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ..core.config import TCRAGConfig, request_option_fields
from .auth import AUTH_USER_KEY, UserDirectory, UserRecord, token_from_headers
from .integration import as_chat_runnable, checkpoint_serde, to_ai_message
from .serve_gate import RunGate, RunQueue, send_refusal
from .serve_guard import RunLimits, ServeCaps, caps_problem, input_problem, recursion_limit_for

__all__ = ["create_app", "per_request_config", "REQUEST_OPTIONS", "BoundedMemorySaver",
           "RequestGuard", "scoped_thread_id", "check_exposure", "is_loopback", "LOOPBACK_HOSTS"]

#: TCRAGConfig fields a client may set per request (generated from the fields: never ``caller``
#: or ``require_review``).
REQUEST_OPTIONS = request_option_fields()
#: Host header values served by default.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_MAX_THREAD_ID = 200
_STATE_USER = "tcrag_user"
_STATE_BODY = "tcrag_body"
_STATE_BATCH_INDEX = "tcrag_batch_index"
_RUN_PREFIX = "/tcrag/"
#: Above the longest run any valid TCRAGConfig allows (LangServe would stop runs at 25 super-steps).
_RECURSION_LIMIT = recursion_limit_for(TCRAGConfig.model_fields["max_steps"].metadata[-1].le,
                                       TCRAGConfig.model_fields["max_format_retries"].metadata[-1].le)


class BoundedMemorySaver(InMemorySaver):
    """An in-memory checkpointer that keeps at most ``max_threads`` threads: writing a checkpoint
    marks its thread as recent, and the least recently written threads beyond the bound are
    deleted (their conversations are forgotten; use a durable checkpointer to keep them).

    Example:
        >>> saver = BoundedMemorySaver(max_threads=2)
        >>> saver.max_threads
        2
    """

    def __init__(self, *, max_threads: int = 1000, serde: Any = None) -> None:
        if not isinstance(max_threads, int) or isinstance(max_threads, bool) or max_threads < 1:
            raise ValueError(f"max_threads must be a positive integer, got {max_threads!r}")
        super().__init__(serde=serde if serde is not None else checkpoint_serde())
        self.max_threads = max_threads
        self._recent = _RecentThreads(max_threads, forget=super().delete_thread)
        self._recent_lock = threading.RLock()

    def put(self, config, checkpoint, metadata, new_versions):
        saved = super().put(config, checkpoint, metadata, new_versions)
        thread_id = str(config["configurable"]["thread_id"])
        with self._recent_lock:
            self._recent[thread_id] = None  # most recent now; the least recent beyond max_threads is forgotten
        return saved

    def delete_thread(self, thread_id: str) -> None:
        with self._recent_lock:
            self._recent.pop(str(thread_id), None)
            super().delete_thread(thread_id)

    @property
    def thread_count(self) -> int:
        """Threads held now."""
        return len(self.storage)


class _RecentThreads(LRUCache):
    """Thread ids by recency (:class:`cachetools.LRUCache`); evicting one forgets its conversation."""

    def __init__(self, maxsize: int, *, forget: Any) -> None:
        super().__init__(maxsize=maxsize)
        self._forget = forget

    def popitem(self):
        thread_id, value = super().popitem()
        self._forget(thread_id)
        return thread_id, value


def scoped_thread_id(user: Optional[UserRecord], thread_id: str) -> str:
    """The stored thread id: the client's id namespaced by the authenticated principal (a hash of
    its identity, so ids never collide across principals), or ``anonymous/`` without authentication."""
    owner = "anonymous" if user is None else "u-" + hashlib.sha256(user.identity.encode("utf-8")).hexdigest()[:24]
    return f"{owner}/{thread_id}"


def _json_problem(value: Any, *, max_depth: int) -> Optional[str]:
    """Why a parsed JSON body is refused (too deep, text that is not valid Unicode), else None."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return f"JSON nested deeper than {max_depth} levels"
            children = list(item.items()) if isinstance(item, dict) else [(None, v) for v in item]
            for key, child in children:
                if key is not None:
                    pending.append((key, depth))
                pending.append((child, depth + 1))
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "text is not valid Unicode (a lone surrogate)"
    return None


class RequestGuard:
    """ASGI middleware run before LangServe: authentication (when ``users`` is given), then for
    bodies: JSON content type (415), size (413), valid JSON (400), depth and Unicode (422). The
    authenticated user and the parsed body are left in ``request.state`` for
    :func:`per_request_config`."""

    def __init__(self, app: Any, *, users: Optional[UserDirectory], max_body_bytes: int, max_json_depth: int,
                 open_paths: Sequence[str] = ("/healthz",), caps: Optional[ServeCaps] = None) -> None:
        self.app = app
        self.users = users
        self.caps = caps or ServeCaps()
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        state = scope.setdefault("state", {})
        user: Optional[UserRecord] = None
        if self.users is not None and scope["path"] not in self.open_paths:
            user = self.users.authenticate(token_from_headers(headers))
            if user is None:
                await send_refusal(send, 401,
                                   "missing or invalid token (Authorization: Bearer <token> or X-API-Key)",
                                   [(b"www-authenticate", b"Bearer")])
                return
        state[_STATE_USER] = user
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            await send_refusal(send, 415, "request bodies must be application/json")
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await send_refusal(send, 413, f"request body over {self.max_body_bytes} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await send_refusal(send, 413, f"request body over {self.max_body_bytes} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            parsed = json.loads(body)
        except RecursionError:
            await send_refusal(send, 422, f"JSON nested deeper than {self.max_json_depth} levels")
            return
        except ValueError:  # includes UnicodeDecodeError
            await send_refusal(send, 400, "request body is not valid JSON")
            return
        problem = _json_problem(parsed, max_depth=self.max_json_depth) or (
            input_problem(scope["path"].rstrip("/").rsplit("/", 1)[-1], parsed, self.caps)
            if scope["path"].startswith(_RUN_PREFIX) else None)
        if problem:
            await send_refusal(send, 422, problem)
            return
        state[_STATE_BODY] = parsed
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _client_configurable(request: Request) -> dict[str, Any]:
    """The ``configurable`` this request's client sent (for ``/batch`` with one config per input:
    the next input's, in order; LangServe calls the modifier once per input, in order)."""
    body = getattr(request.state, _STATE_BODY, None)
    raw = body.get("config") if isinstance(body, dict) else None
    if isinstance(raw, list):
        index = getattr(request.state, _STATE_BATCH_INDEX, 0)
        setattr(request.state, _STATE_BATCH_INDEX, index + 1)
        raw = raw[index] if index < len(raw) else None
    if isinstance(raw, dict) and isinstance(raw.get("configurable"), dict):
        return raw["configurable"]
    return {}


async def per_request_config(config: dict[str, Any], request: Request) -> dict[str, Any]:
    """LangServe ``per_req_config_modifier``: the run's ``configurable`` is exactly the validated
    options the client sent (see :data:`REQUEST_OPTIONS`), a ``thread_id`` scoped to the
    authenticated principal (a new one if none was sent) and the authenticated user under
    ``langgraph_auth_user``. Nothing else the client sent survives."""
    sent = _client_configurable(request) if request.method == "POST" else {}
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
    over = caps_problem(options, getattr(request.app.state, "tcrag_caps", None) or ServeCaps())
    if over:
        raise HTTPException(422, over)
    kernel = getattr(request.app.state, "tcrag_kernel", None)
    problem = kernel.option_problem(options) if kernel is not None else None
    if problem:  # e.g. sigma "auto" for a model without a stored calibration
        raise HTTPException(422, problem)
    thread_id = sent.get("thread_id")
    if thread_id is not None and (not isinstance(thread_id, str) or not thread_id.strip()
                                  or len(thread_id) > _MAX_THREAD_ID):
        raise HTTPException(422, f"thread_id must be a non-empty string of at most {_MAX_THREAD_ID} characters")
    user: Optional[UserRecord] = getattr(request.state, _STATE_USER, None)
    configurable: dict[str, Any] = {**options,
                                    "thread_id": scoped_thread_id(user, thread_id or f"tcrag-{uuid.uuid4()}")}
    if user is not None:
        configurable[AUTH_USER_KEY] = user.as_server_user()
    return {**{k: v for k, v in config.items() if k not in ("configurable", "recursion_limit")},
            "configurable": configurable, "recursion_limit": _RECURSION_LIMIT}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, *, authenticated: bool) -> Optional[str]:
    """Refuse (ValueError) to serve beyond loopback without authentication; a warning to print for
    an all-interfaces bind, else None."""
    if is_loopback(host):
        return None
    if not authenticated:
        raise ValueError(f"refusing to bind {host!r} (beyond loopback) without authentication: give "
                         "--users-file (or set TCRAG_AUTH_USERS) with the users allowed to call this server")
    if host in ("0.0.0.0", "::", ""):
        return (f"WARNING: binding {host or 'all interfaces'} serves every network this machine is on; "
                "prefer one interface, and pass the names clients use with --allowed-host")
    return None


def create_app(
    *,
    graph: Any = None,
    config: Optional[TCRAGConfig] = None,
    tools: bool = True,
    checkpoint_db: Optional[str] = None,
    playground: bool = True,
    title: str = "TC-RAG",
    users: Optional[UserDirectory] = None,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    max_body_bytes: int = 64 * 1024,
    max_json_depth: int = 32,
    max_threads: int = 1000,
    caps: Optional[ServeCaps] = None,
    limits: Optional[RunLimits] = None,
) -> FastAPI:
    """The FastAPI app serving the agent through LangServe.

    Args:
        graph: a compiled TC-RAG graph to serve as is (tests and demos pass a scripted one). ``None``
            builds the real agent (packaged local model, loaded on the first request) with
            ``config`` and the default tools. A checkpointer the graph already has is kept (a
            durable one the user names); else see ``checkpoint_db`` / ``max_threads``.
        config: base options when ``graph`` is None (``config.caller`` is who unauthenticated runs act for);
            default: the bounded budgets of ``tcrag ask`` (:data:`~tcrag_langgraph.agent.spec.FACE_DEFAULTS`).
        tools: give the default tools to the agent built here.
        checkpoint_db: SQLite file for thread memory (``AsyncSqliteSaver``); default in memory,
            bounded by ``max_threads``.
        playground: serve ``/tcrag/playground/`` (it cannot send a token: useful without ``users``).
        users: the trusted users (:class:`~tcrag_langgraph.faces.auth.UserDirectory`); ``None`` serves
            without authentication (loopback only, which :func:`check_exposure` enforces for the CLI).
        allowed_hosts: ``Host`` header values served (others: 400).
        max_body_bytes, max_json_depth: limits on request bodies (413 / 422).
        max_threads: threads kept by the in-memory checkpointer.
        caps: the operator's caps on options a request may set (:class:`~tcrag_langgraph.faces.serve_guard.ServeCaps`;
            default ``ServeCaps()``); a request over one is a 422.
        limits: the operator's bounds on load (:class:`~tcrag_langgraph.faces.serve_guard.RunLimits`; default
            ``RunLimits()``): runs at once, the queue before them and its longest wait (beyond: 503 with
            ``Retry-After``), how long a run waits for a client that stopped reading
            (:mod:`~tcrag_langgraph.faces.serve_gate`).
    """
    from langserve import add_routes

    for name, value in (("max_body_bytes", max_body_bytes), ("max_json_depth", max_json_depth)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    hosts = [h for h in allowed_hosts if isinstance(h, str) and h.strip()]
    if not hosts:
        raise ValueError("allowed_hosts must name at least one host")
    if users is not None and not isinstance(users, UserDirectory):
        raise TypeError(f"users must be a UserDirectory, got {type(users).__name__}")
    if graph is None:
        from ..agent.spec import AgentSpec

        spec = AgentSpec(tools="default" if tools else "none", **({"config": config} if config is not None else {}))
        graph = spec.build()
    if getattr(graph, "checkpointer", None) is None and checkpoint_db is None:
        graph.checkpointer = BoundedMemorySaver(max_threads=max_threads)

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
    if caps is not None and not isinstance(caps, ServeCaps):
        raise TypeError(f"caps must be a ServeCaps, got {type(caps).__name__}")
    app.state.tcrag_caps = caps or ServeCaps()
    if limits is not None and not isinstance(limits, RunLimits):
        raise TypeError(f"limits must be a RunLimits, got {type(limits).__name__}")
    queue = app.state.tcrag_queue = RunQueue(limits or RunLimits())
    # the served method's node holder, which checks a request's options before its run starts
    app.state.tcrag_kernel = getattr(graph, "tcrag_kernel", None) or getattr(getattr(graph, "bound", None),
                                                                             "tcrag_kernel", None)
    add_routes(
        app,
        as_chat_runnable(graph),
        path="/tcrag",
        # recursion_limit: only so that /batch keeps the one per_request_config sets (a client's is replaced)
        config_keys=("configurable", "recursion_limit"),
        per_req_config_modifier=per_request_config,
        playground_type="chat",
        enabled_endpoints=None if playground else ("invoke", "batch", "stream", "stream_log", "stream_events",
                                                   "input_schema", "output_schema", "config_schema"),
    )

    @app.get("/tcrag/threads/{thread_id}")
    async def thread_state(thread_id: str, request: Request) -> dict[str, Any]:
        """The stack, trace and answer stored for one of the caller's threads (404 if unknown)."""
        from ..core.result import RunResult

        scoped = scoped_thread_id(getattr(request.state, _STATE_USER, None), thread_id)
        snapshot = await graph.aget_state({"configurable": {"thread_id": scoped}})
        if not snapshot.values:
            raise HTTPException(404, f"no such thread: {thread_id}")
        result = RunResult.from_state(snapshot.values).to_json_dict()
        result["messages"] = [{"type": m.type, "content": m.content} for m in snapshot.values.get("messages", [])]
        result["next"] = list(snapshot.next)
        return result

    @app.post("/tcrag/threads/{thread_id}/review")
    async def review(thread_id: str, request: Request) -> dict[str, Any]:
        """A person's decision on a run paused for review (``tcrag serve --review-unvalidated``): body
        ``{"decision": "approve"}``, ``{"decision": "reject"}`` or ``{"decision": {"answer": "..."}}``;
        the run ends and its final message comes back as ``/invoke``'s would. Only the thread's owner
        can resume it (404 for any other thread, and for one that is not waiting)."""
        from langgraph.types import Command

        body = await request.json()
        decision = body.get("decision") if isinstance(body, dict) else None
        if not (decision in ("approve", "reject") or (isinstance(decision, dict) and set(decision) == {"answer"}
                                                      and isinstance(decision["answer"], str)
                                                      and decision["answer"].strip())):
            raise HTTPException(422, "decision must be \"approve\", \"reject\" or {\"answer\": \"your answer\"}")
        user: Optional[UserRecord] = getattr(request.state, _STATE_USER, None)
        configurable: dict[str, Any] = {"thread_id": scoped_thread_id(user, thread_id)}
        if user is not None:  # the run's identity is the authenticated owner's, as when it started
            configurable[AUTH_USER_KEY] = user.as_server_user()
        config = {"configurable": configurable, "recursion_limit": _RECURSION_LIMIT}
        snapshot = await graph.aget_state(config)
        if not any(task.interrupts for task in snapshot.tasks):
            raise HTTPException(404, f"no run waiting for review in thread {thread_id}")
        out = await graph.ainvoke(Command(resume=decision), config=config)
        message = to_ai_message(out)
        return {"content": message.content, "response_metadata": message.response_metadata}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "graph": graph.get_name(), "nodes": [n for n in graph.nodes if not n.startswith("__")],
                "runs": queue.snapshot()}

    # Starlette runs the last added middleware first: Host check, then the guard, then the run gate
    # (so a request refused for its token, shape or size never takes a place in the queue), then the routes.
    # A cancelled run's place is held until its threads leave: a tool call ends by its deadline.
    app.add_middleware(RunGate, queue=queue, prefix=_RUN_PREFIX,
                       release_after_s=app.state.tcrag_caps.tool_timeout_s + 60)
    app.add_middleware(RequestGuard, users=users, max_body_bytes=max_body_bytes, max_json_depth=max_json_depth,
                       caps=app.state.tcrag_caps)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    return app
