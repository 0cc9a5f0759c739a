"""LangServe: `tcrag serve` over real HTTP (uvicorn on loopback), with the scripted model hook."""

from __future__ import annotations

import json

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver

from tcrag_langgraph.serve import create_app
from tcrag_langgraph.studio import scripted_graph

from .helpers_servers import free_port, python_cmd, script_file, server_process, uvicorn_thread

# First Conclusion scores 15 (rejected under the default sigma 10), the second 5 (accepted).
SCRIPT = {
    "replies": ["Conclusion: first answer to {question}", "Conclusion: second answer to {question}"],
    "scores": {"first answer to {question}": 15.0, "second answer to {question}": 5.0},
    "default_score": 50.0,
}


def chat(question: str) -> dict:
    return {"messages": [{"type": "human", "content": question}]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`tcrag serve --scripted ...` as a real subprocess on 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    script = script_file(tmp / "script.json", SCRIPT)
    log = tmp / "server.log"
    cmd = python_cmd("-m", "tcrag_langgraph.cli", "serve", "--port", str(port), "--scripted", str(script),
                     "--no-tools", "--log-level", "info")
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=log, timeout=90):
        yield f"http://127.0.0.1:{port}", log


def invoke(base: str, question: str, configurable: dict | None = None) -> httpx.Response:
    body: dict = {"input": chat(question)}
    if configurable is not None:
        body["config"] = {"configurable": configurable}
    return httpx.post(f"{base}/tcrag/invoke", json=body, timeout=30)


def test_serve_binds_loopback_and_answers_chat(served):
    base, log = served
    assert "Uvicorn running on http://127.0.0.1:" in log.read_text()
    assert "SCRIPTED model" in log.read_text()
    health = httpx.get(f"{base}/healthz", timeout=5).json()
    assert health["ok"] and "Conclusion" in health["nodes"] and "Human_Review" in health["nodes"]
    r = invoke(base, "Is aspirin an NSAID?")
    assert r.status_code == 200, r.text
    out = r.json()["output"]
    assert out["type"] == "ai" and out["content"] == "second answer to Is aspirin an NSAID?"
    meta = out["response_metadata"]
    assert meta["halt_reason"] == "validated" and meta["answer_validated"] is True
    assert meta["sigma"] == 10.0 and meta["metric"] == "cppl" and meta["state_value"] == 5.0
    assert meta["stack"] == ["User_Query", "Thought", "Conclusion"]  # first Conclusion rejected -> Thought


def test_per_request_sigma_metric_and_max_steps_are_applied(served):
    base, _ = served
    meta = invoke(base, "q sigma?", {"sigma": 20}).json()["output"]["response_metadata"]
    assert meta["sigma"] == 20.0 and meta["stack"] == ["User_Query", "Conclusion"]  # 15 < 20: first accepted
    meta = invoke(base, "q metric?", {"metric": "uct"}).json()["output"]["response_metadata"]
    assert meta["metric"] == "uct" and meta["sigma"] == 20.0 and meta["steps"] == 1  # uct default sigma 20
    meta = invoke(base, "q steps?", {"max_steps": 1}).json()["output"]["response_metadata"]
    assert meta["halt_reason"] == "max_steps" and meta["answer_validated"] is False
    meta = invoke(base, "q defaults?").json()["output"]["response_metadata"]
    assert meta["sigma"] == 10.0 and meta["steps"] == 2  # options do not stick to the server


def test_bad_or_forbidden_options_are_rejected(served):
    base, _ = served
    r = invoke(base, "q?", {"sigma": -1})
    assert r.status_code == 422 and "sigma" in r.text
    r = invoke(base, "q?", {"caller": {"user_id": "admin", "allowed_patient_ids": ["1"]}})
    assert r.status_code == 422 and "caller" in r.text
    r = invoke(base, "q?", {"require_review": True})
    assert r.status_code == 422


def test_thread_id_keeps_a_conversation_and_others_do_not_see_it(served):
    base, _ = served
    assert invoke(base, "turn one?", {"thread_id": "conv-1"}).status_code == 200
    out = invoke(base, "turn two?", {"thread_id": "conv-1"}).json()["output"]
    assert out["content"] == "second answer to turn two?"
    thread = httpx.get(f"{base}/tcrag/threads/conv-1", timeout=10).json()
    assert [m["content"] for m in thread["messages"]] == [
        "turn one?", "second answer to turn one?", "turn two?", "second answer to turn two?"]
    assert thread["question"] == "turn two?" and thread["stack"][0]["content"] == "turn two?"
    assert [e["step"] for e in thread["trace"]] == [0, 1, 2, 2]
    assert httpx.get(f"{base}/tcrag/threads/never-used", timeout=10).status_code == 404
    # without a thread id each request is its own fresh thread
    out = invoke(base, "alone?").json()["output"]
    assert out["response_metadata"]["stack"][0] == "User_Query" and out["content"].endswith("alone?")


def test_batch_stream_and_playground(served):
    base, _ = served
    r = httpx.post(f"{base}/tcrag/batch", json={"inputs": [chat("alpha?"), chat("beta?")],
                                                 "config": {"configurable": {"sigma": 20}}}, timeout=30)
    assert r.status_code == 200, r.text
    assert [o["content"] for o in r.json()["output"]] == ["first answer to alpha?", "first answer to beta?"]
    with httpx.stream("POST", f"{base}/tcrag/stream", json={"input": chat("gamma?")}, timeout=30) as resp:
        assert resp.status_code == 200
        data = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
    messages = [d for d in data if isinstance(d, dict) and d.get("type") in ("ai", "AIMessageChunk")]
    assert messages and messages[-1]["content"] == "second answer to gamma?"
    page = httpx.get(f"{base}/tcrag/playground/", timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()
    schema = httpx.get(f"{base}/tcrag/input_schema", timeout=10).json()
    assert "messages" in json.dumps(schema)


def stream_events(base: str, question: str, configurable: dict | None = None) -> list[dict]:
    body: dict = {"input": chat(question)}
    if configurable:
        body["config"] = {"configurable": configurable}
    events = []
    with httpx.stream("POST", f"{base}/tcrag/stream_events", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data:") and line[5:].strip():
                events.append(json.loads(line[5:]))
    return events


def test_stream_events_carry_every_stack_event_over_http():
    """In-process uvicorn (same real HTTP) so the script can use Backtrack and a tool."""
    graph = scripted_graph({
        "mode": "sequence",
        "replies": ["Thought: think about {question}", "Tool_Use: DOC_RAG\nTool_Input: metformin",
                    "Backtrack: not useful", "Summary: condensed", "Conclusion: too early",
                    "Conclusion: metformin"],
        "scores": {"think about {question}": 30.0, "too early": 25.0, "metformin": 3.0},
        "tools": {"DOC_RAG": "passage about {input}"},
    }, checkpointer=InMemorySaver())
    with uvicorn_thread(create_app(graph=graph)) as base:
        events = stream_events(base, "first-line drug?", {"sigma": 10})
    custom = [e["data"] for e in events if e.get("event") == "on_custom_event" and e.get("name") == "tcrag"]
    assert [(c["action"], c["op"]) for c in custom] == [
        ("User_Query", "push"), ("Thought", "push"), ("Tool_Use", "push"), ("Backtrack", "pop"),
        ("Summary", "pop+push"), ("Conclusion", "reject"), ("Conclusion", "push"), ("Halt", "halt")]
    assert [c["state_value"] for c in custom][1:] == [30.0, 30.0, 30.0, 30.0, 25.0, 3.0, 3.0]
    tool = custom[2]
    assert tool["content"] == "passage about metformin" and json.loads(tool["detail"])["tool"] == "DOC_RAG"
    assert custom[-1]["detail"] == "validated" and [c["step"] for c in custom] == [0, 1, 2, 3, 4, 5, 6, 6]
    assert [c["stack_depth"] for c in custom] == [1, 2, 3, 2, 2, 3, 4, 4]
    names = {e.get("name") for e in events if e.get("event") == "on_chain_end"}
    assert {"Start", "Generate", "Tool_Use", "Conclusion"} <= names  # node runs are visible too


def test_threads_persist_in_sqlite_across_server_restarts(tmp_path):
    db = str(tmp_path / "threads.sqlite")
    with uvicorn_thread(create_app(graph=scripted_graph(SCRIPT), checkpoint_db=db)) as base:
        assert invoke(base, "remember me?", {"thread_id": "durable"}).status_code == 200
    # a new app (new saver, new graph) on the same file sees the conversation and continues it
    with uvicorn_thread(create_app(graph=scripted_graph(SCRIPT), checkpoint_db=db)) as base:
        before = httpx.get(f"{base}/tcrag/threads/durable", timeout=10).json()
        assert [m["content"] for m in before["messages"]] == ["remember me?", "second answer to remember me?"]
        assert invoke(base, "and now?", {"thread_id": "durable"}).status_code == 200
        after = httpx.get(f"{base}/tcrag/threads/durable", timeout=10).json()
    assert len(after["messages"]) == 4 and after["answer"] == "second answer to and now?"


def test_request_options_do_not_reset_the_servers_base_config():
    """LangServe alone would validate `configurable` against TCRAGConfig and send every default
    (max_steps=12 ...) along; the app passes on only what the client set."""
    graph = scripted_graph({**SCRIPT, "config": {"max_steps": 1}})
    with uvicorn_thread(create_app(graph=graph)) as base:
        meta = invoke(base, "budget?", {"metric": "cppl"}).json()["output"]["response_metadata"]
    assert meta["halt_reason"] == "max_steps" and meta["steps"] == 1  # the base budget of 1 still holds
