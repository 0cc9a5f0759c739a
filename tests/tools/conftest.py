"""Fixtures shared by the tools tests: a real HTTP server on loopback, a refused port, caller configs."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

import pytest

from tcrag_langgraph.tools.identity import CALLER_KEY, CallerContext


@dataclass
class Reply:
    """What the loopback server answers: status, body (bytes, str or JSON-able), delay before answering."""

    status: int = 200
    body: Any = b""
    content_type: str = "application/json"
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers, e.g. Location

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


@dataclass
class SeenRequest:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


@dataclass
class LoopbackServer:
    """A real ``http.server`` on 127.0.0.1 in a thread. Set ``respond`` to choose each reply."""

    url: str
    requests: list[SeenRequest] = field(default_factory=list)
    Reply = Reply  # test modules cannot import conftest (tests/ has no __init__.py); use http_server.Reply
    respond: Callable[[SeenRequest, int], Reply] = lambda req, n: Reply(404, {"error": "no handler"})


@pytest.fixture
def http_server():
    """Yield a :class:`LoopbackServer`; ``respond(request, n)`` gets the 1-based request count."""
    with _loopback_server() as server:
        yield server


@pytest.fixture
def second_http_server():
    """Another :class:`LoopbackServer` on its own port: a different origin (cross-origin redirects)."""
    with _loopback_server() as server:
        yield server


@contextlib.contextmanager
def _loopback_server():
    state: dict[str, LoopbackServer] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            server = state["server"]
            parts = urlsplit(self.path)
            seen = SeenRequest(parts.path, parse_qs(parts.query), {k.lower(): v for k, v in self.headers.items()})
            with lock:
                server.requests.append(seen)
                n = len(server.requests)
            reply = server.respond(seen, n)
            if reply.delay_s:
                time.sleep(reply.delay_s)
            body = reply.payload()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                pass

        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state["server"] = LoopbackServer(url=f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state["server"]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def refused_url() -> str:
    """An http URL on loopback where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def make_caller_config(user_id: str = "dr-a", allowed: Optional[tuple[str, ...]] = None, roles=("clinician",)) -> dict:
    """A RunnableConfig carrying a caller, as the TC-RAG graph passes it to tools."""
    caller = CallerContext(user_id=user_id, roles=tuple(roles), allowed_patient_ids=allowed)
    return {"configurable": {CALLER_KEY: caller}}


@pytest.fixture
def caller_config() -> Callable[..., dict]:
    """Factory fixture: ``caller_config("dr-a", allowed=("P0001",))``."""
    return make_caller_config


@pytest.fixture(scope="session")
def oxigraph_server():
    """A real Oxigraph SPARQL server on 127.0.0.1 (in-memory store) for the session.

    Tests load their own data with ``replace_default_graph``. Skipped when the CLI is missing.
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_tcrag_oxigraph_server", Path(__file__).with_name("oxigraph_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if module.find_oxigraph() is None:
        pytest.skip("oxigraph CLI not installed (pip install oxigraph)")
    with module.OxigraphServer() as server:
        yield server


@pytest.fixture(scope="session")
def elasticsearch_url():
    """URL of a real Elasticsearch-API server (noida-db) on a free 127.0.0.1 port for the session.

    Skipped when noida-db is not installed. Tests should use their own index names.
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_tcrag_es_server", Path(__file__).with_name("es_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if module.find_noida() is None:
        pytest.skip("noida-db not installed (pip install noida-db==0.2.3)")
    with module.NoidaElasticsearch() as url:
        yield url
