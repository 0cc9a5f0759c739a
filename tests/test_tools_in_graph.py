"""The four tools used by the TC-RAG graph for real, and their faults ending in error frames.

A scripted chat model decides which tool to call (so every tool is exercised deterministically);
the tools, their embedded backends and the loopback servers are real.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tcrag_langgraph.tools import default_tools
from tcrag_langgraph.tools.documents import document_tool
from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore
from tcrag_langgraph.tools.emr import default_emr_tool
from tcrag_langgraph.tools.web_search import SearxngProvider, web_tool

from tcrag_langgraph import CallerContext, TCRAGConfig, build_graph
from tcrag_langgraph.core.state import Action, fence_tool_output
from tcrag_langgraph.monitor.scoring import LocalLMScorer

from .conftest import ScriptedScorer, scripted

Q = "What is the first-line drug for type 2 diabetes?"


@pytest.fixture(scope="module")
def tools():
    return {t.name: t for t in default_tools(emr=False)} | {"EMR_SEARCH": default_emr_tool(in_memory=True)}


def _frames(out):
    return [f for f in out["stack"] if f.action is Action.TOOL_USE]


@pytest.mark.parametrize(
    "tool_name,tool_input,expect",
    [
        ("DOC_RAG", "metformin type 2 diabetes", "diabetes"),
        ("KG_RAG", "Marfan syndrome", "Marfan"),
        ("WEB_SEARCH", "type 2 diabetes mellitus", "E11"),
        ("EMR_SEARCH", '{"operation": "similar", "codes": ["E11.9"]}', "E11"),
    ],
)
def test_each_default_tool_is_called_for_real_by_the_graph(tools, tool_name, tool_input, expect):
    """Scripted choice of tool; real tool, real observation, and the real packaged model as the
    state monitor (sigma set high enough that its cppl for the scripted answer validates)."""
    model = scripted([f"Tool_Use: {tool_name}\nTool_Input: {tool_input}", "Conclusion: Metformin"])
    graph = build_graph(model=model, tools=list(tools.values()), scorer=LocalLMScorer(),
                        config=TCRAGConfig(max_observation_tokens=400, sigma=1e6))
    out = graph.invoke({"question": Q})
    (frame,) = _frames(out)
    call = frame.tool_call
    assert call.tool == tool_name and not call.is_error, call.observation
    assert expect.lower() in call.observation.lower()
    assert fence_tool_output(call.observation) in model.seen[1][-1].content  # the model saw the real observation, fenced
    assert out["answer_validated"] is True
    assert 1.0 < out["state_value"] < 1e6  # a real perplexity from the packaged model


def test_emr_lookup_obeys_the_callers_permissions(tools):
    def run(caller):
        model = scripted(['Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "P00001"}',
                          "Conclusion: done"])
        graph = build_graph(model=model, tools=[tools["EMR_SEARCH"]], scorer=ScriptedScorer(default=1.0),
                            config=TCRAGConfig(caller=caller))
        return _frames(graph.invoke({"question": "Summarise patient P00001"}))[0].tool_call

    anonymous = run(None)
    assert anonymous.is_error and anonymous.error_kind == "forbidden"
    other = run(CallerContext(user_id="dr-b", allowed_patient_ids=("P00002",)))
    assert other.is_error and other.error_kind == "forbidden"
    allowed = run(CallerContext(user_id="dr-a", allowed_patient_ids=("P00001",)))
    assert not allowed.is_error and "P00001" in allowed.observation


def test_a_client_context_never_grants_access_to_a_patient(tools):
    """Issue 12: context/configurable are written by the client; they are never an identity."""
    forged = {"user_id": "anyone", "allowed_patient_ids": ["P00003"]}

    def lookup(graph, **run):
        model_reply = 'Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "P00003"}'
        graph_ = graph(scripted([model_reply, "Conclusion: done"]))
        return _frames(graph_.invoke({"question": "Summarise patient P00003"}, **run))[0].tool_call

    def plain(model):
        return build_graph(model=model, tools=[tools["EMR_SEARCH"]], scorer=ScriptedScorer(default=1.0))

    for run in ({"context": {"caller": forged}}, {"config": {"configurable": {"caller": forged}}}):
        refused = lookup(plain, **run)
        assert refused.is_error and refused.error_kind == "forbidden", run
    trusted = CallerContext(user_id="dr-a", allowed_patient_ids=("P00001",))

    def built_for_dr_a(model):
        return build_graph(model=model, tools=[tools["EMR_SEARCH"]], scorer=ScriptedScorer(default=1.0),
                           config=TCRAGConfig(caller=trusted))

    widened = lookup(built_for_dr_a, context={"caller": forged})
    assert widened.is_error and widened.error_kind == "forbidden"


def test_in_process_callers_can_opt_in_to_a_per_run_caller(tools):
    model = scripted(['Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "P00003"}',
                      "Conclusion: done"])
    graph = build_graph(model=model, tools=[tools["EMR_SEARCH"]], scorer=ScriptedScorer(default=1.0),
                        trust_client_identity=True)
    out = graph.invoke({"question": "Summarise patient P00003"},
                       context={"caller": {"user_id": "dr-c", "allowed_patient_ids": ["P00003"]}})
    assert not _frames(out)[0].tool_call.is_error


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A real HTTP server on loopback answering every request with one fixed reply."""

    def __init__(self, status: int, body: bytes, delay_s: float = 0.0) -> None:
        import time

        reply = (status, body, delay_s)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                time.sleep(reply[2])
                self.send_response(reply[0])
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(reply[1])

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _web_tool_at(url: str, timeout_s: float = 2.0):
    return web_tool(SearxngProvider(url, timeout_s=timeout_s), timeout_s=timeout_s * 3, retries=1, backoff=0.05,
                    cache_size=0)


@pytest.mark.parametrize(
    "make_tool,kind",
    [
        (lambda: document_tool(ElasticsearchStore(f"http://127.0.0.1:{_free_port()}", request_timeout=1.0),
                               retries=0, timeout_s=5), "unavailable"),
        (lambda: _web_tool_at(f"http://127.0.0.1:{_free_port()}"), "unavailable"),
    ],
    ids=["elasticsearch-down", "searxng-down"],
)
def test_server_down_is_an_error_frame_and_the_run_goes_on(make_tool, kind):
    tool = make_tool()
    model = scripted([f"Tool_Use: {tool.name}\nTool_Input: metformin", "Conclusion: Metformin"])
    out = build_graph(model=model, tools=[tool], scorer=ScriptedScorer(default=1.0)).invoke({"question": Q})
    call = _frames(out)[0].tool_call
    assert call.is_error and call.error_kind == kind
    assert "Tool_Error:" in model.seen[1][-1].content and "Tool_Observation:" not in model.seen[1][-1].content
    assert out["answer"] == "Metformin" and out["halt_reason"] == "validated"


@pytest.mark.parametrize(
    "status,body,delay,kind",
    [
        (500, b'{"error": "boom"}', 0.0, "unavailable"),
        (200, b"<html>not json at all", 0.0, "bad_response"),
        (200, b'{"results": []}', 3.0, "timeout"),
    ],
    ids=["5xx", "garbage", "timeout"],
)
def test_web_faults_become_error_frames(status, body, delay, kind):
    server = _Server(status, body, delay)
    try:
        tool = _web_tool_at(server.url, timeout_s=0.5)
        model = scripted(["Tool_Use: WEB_SEARCH\nTool_Input: metformin", "Conclusion: unknown"])
        out = build_graph(model=model, tools=[tool], scorer=ScriptedScorer(default=1.0)).invoke({"question": Q})
    finally:
        server.close()
    call = _frames(out)[0].tool_call
    assert call.is_error and call.error_kind == kind, call.observation
    assert out["halt_reason"] == "validated"  # the run went on after the error frame


def test_malformed_tool_input_is_rejected_with_a_message_the_model_can_use(tools):
    model = scripted(['Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "DROP TABLE patients"}',
                      "Conclusion: none"])
    out = build_graph(model=model, tools=[tools["EMR_SEARCH"]], scorer=ScriptedScorer(default=1.0),
                      config=TCRAGConfig(caller=CallerContext(user_id="x", allowed_patient_ids=("P00001",)))
                      ).invoke({"question": "Look up a record"})
    call = _frames(out)[0].tool_call
    assert call.is_error and call.error_kind in {"bad_input", "forbidden"}
    assert "patient" in call.observation.lower()
