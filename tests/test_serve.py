"""LangServe: `tcrag serve` over real HTTP (uvicorn on loopback), with the scripted model hook."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver

from tcrag_langgraph.faces.serve import create_app
from tcrag_langgraph.methods.tcrag.graph import build_graph
from tcrag_langgraph.testing import scripted_components, scripted_graph

from .helpers_servers import free_port, python_cmd, script_file, server_process, uvicorn_thread  # noqa: F401

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
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--scripted", str(script),
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


# Two Thoughts before the Conclusion: a budget of one step ends the run on the second Thought (the
# one final action written at the budget), unvalidated; any larger budget reaches the Conclusion.
THINKER = {"replies": ["Thought: a {question}", "Thought: b {question}", "Conclusion: c {question}"],
           "scores": {"c {question}": 1.0}, "default_score": 40.0}


def test_per_request_max_steps_is_applied():
    with uvicorn_thread(create_app(graph=scripted_graph(THINKER))) as base:
        tight = invoke(base, "budget?", {"max_steps": 1}).json()["output"]
        free = invoke(base, "budget?").json()["output"]
    assert tight["response_metadata"]["halt_reason"] == "max_steps" and tight["content"] == "b budget?"
    assert tight["response_metadata"]["answer_validated"] is False
    assert free["response_metadata"]["halt_reason"] == "validated" and free["content"] == "c budget?"


def test_request_options_do_not_reset_the_servers_base_config():
    """LangServe alone would validate `configurable` against TCRAGConfig and send every default
    (max_steps=12 ...) along; the app passes on only what the client set."""
    graph = scripted_graph({**THINKER, "config": {"max_steps": 1}})
    with uvicorn_thread(create_app(graph=graph)) as base:
        meta = invoke(base, "budget?", {"metric": "cppl"}).json()["output"]["response_metadata"]
    assert meta["halt_reason"] == "max_steps" and meta["steps"] == 2  # the base budget of 1 (+ the final action) holds


# ----- security (issue 12): authentication, identity, hosts, bodies, thread scoping, bounded memory -----

DOCTOR, OTHER = "serve-doctor-token-91c2", "serve-other-token-4d7b"
LOOKUP_P00002 = 'Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "P00002"}'


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """An authenticated in-process server (real uvicorn on loopback) whose scripted model looks up
    patient P00002 with the real EMR_SEARCH tool."""
    from tcrag_langgraph.tools.emr import default_emr_tool

    from tcrag_langgraph.faces.auth import UserDirectory

    from .helpers_servers import users_file

    tmp = tmp_path_factory.mktemp("secured")
    users = UserDirectory.from_file(users_file(tmp / "users.json", {
        DOCTOR: {"identity": "dr-lee", "allowed_patient_ids": ["P00002"]},
        OTHER: {"identity": "dr-other", "allowed_patient_ids": ["P00005"]},
    }))
    parts = scripted_components({**SCRIPT, "replies": [LOOKUP_P00002, *SCRIPT["replies"]]})
    graph = build_graph(**{**parts, "tools": [default_emr_tool()]})
    with uvicorn_thread(create_app(graph=graph, users=users, max_body_bytes=32 * 1024, max_threads=50)) as base:
        yield base, parts["model"]


def post(base: str, path: str, body, *, token: str | None = DOCTOR, **kw) -> httpx.Response:
    headers = {**(bearer(token) if token else {}), **kw.pop("headers", {})}
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{base}{path}", content=body, headers=headers, timeout=30, **kw)
    return httpx.post(f"{base}{path}", json=body, headers=headers, timeout=30, **kw)


def emr_call(base: str, token: str, thread_id: str) -> dict:
    thread = httpx.get(f"{base}/tcrag/threads/{thread_id}", headers=bearer(token), timeout=10).json()
    (frame,) = [f for f in thread["stack"] if f["action"] == "Tool_Use"]
    return frame


def test_no_or_wrong_token_is_refused_and_health_stays_open(secured):
    base, model = secured
    before = model.call_count
    for headers in ({}, bearer("wrong"), bearer(DOCTOR + "x"), {"X-API-Key": DOCTOR[:-1]}, {"Authorization": DOCTOR}):
        r = httpx.post(f"{base}/tcrag/invoke", json={"input": chat("q?")}, headers=headers, timeout=10)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
        assert httpx.get(f"{base}/tcrag/threads/x", headers=headers, timeout=10).status_code == 401
    assert httpx.get(f"{base}/healthz", timeout=10).json()["ok"] and model.call_count == before  # no run started
    r = httpx.post(f"{base}/tcrag/invoke", json={"input": chat("key?")}, headers={"X-API-Key": DOCTOR}, timeout=30)
    assert r.status_code == 200, r.text


def test_client_cannot_send_an_identity_and_the_authenticated_user_is_the_caller(secured):
    base, _ = secured
    forged = [{"caller": {"user_id": "anyone", "allowed_patient_ids": ["P00002"]}},
              {"langgraph_auth_user": {"identity": "dr-lee", "permissions": ["patient:P00002"]}},
              {"tcrag_caller": {"user_id": "anyone", "allowed_patient_ids": ["P00002"]}}]
    for configurable in forged:
        r = post(base, "/tcrag/invoke", {"input": chat("Summarise P00002"), "config": {"configurable": configurable}},
                 token=OTHER)
        assert r.status_code == 422 and next(iter(configurable)) in r.text
        r = post(base, "/tcrag/batch", {"inputs": [chat("a?"), chat("b?")],
                                        "config": [{"configurable": {}}, {"configurable": configurable}]}, token=OTHER)
        assert r.status_code == 422 and next(iter(configurable)) in r.text  # hidden in a later /batch item
    assert post(base, "/tcrag/invoke", {"input": chat("Summarise P00002"),
                                        "config": {"configurable": {"thread_id": "emr"}}}, token=OTHER).status_code == 200
    denied = emr_call(base, OTHER, "emr")  # dr-other may see P00005 only
    assert denied["tool_call"]["is_error"] and denied["tool_call"]["error_kind"] == "forbidden"
    assert post(base, "/tcrag/invoke", {"input": chat("Summarise P00002"),
                                        "config": {"configurable": {"thread_id": "emr"}}}).status_code == 200
    allowed = emr_call(base, DOCTOR, "emr")  # same client thread id, but dr-lee's own thread
    assert not allowed["tool_call"]["is_error"], allowed
    assert "P00002" in allowed["tool_call"]["observation"]


def test_threads_are_scoped_to_the_principal(secured):
    base, _ = secured
    body = {"input": chat("mine?"), "config": {"configurable": {"thread_id": "shared-name"}}}
    assert post(base, "/tcrag/invoke", body).status_code == 200
    assert httpx.get(f"{base}/tcrag/threads/shared-name", headers=bearer(OTHER), timeout=10).status_code == 404
    assert post(base, "/tcrag/invoke", {**body, "input": chat("intruding?")}, token=OTHER).status_code == 200
    mine = httpx.get(f"{base}/tcrag/threads/shared-name", headers=bearer(DOCTOR), timeout=10).json()
    theirs = httpx.get(f"{base}/tcrag/threads/shared-name", headers=bearer(OTHER), timeout=10).json()
    assert [m["content"] for m in mine["messages"] if m["type"] == "human"] == ["mine?"]
    assert [m["content"] for m in theirs["messages"] if m["type"] == "human"] == ["intruding?"]


def test_foreign_host_header_is_refused(secured):
    base, _ = secured
    r = httpx.post(f"{base}/tcrag/invoke", json={"input": chat("q?")}, headers={**bearer(DOCTOR), "Host": "evil.example"},
                   timeout=10)
    assert r.status_code == 400
    assert httpx.get(f"{base}/healthz", headers={"Host": "rebind.attacker.test:80"}, timeout=10).status_code == 400
    assert httpx.get(f"{base}/healthz", headers={"Host": "localhost"}, timeout=10).status_code == 200


def test_malformed_bodies_get_clean_4xx_before_any_run(secured):
    base, model = secured
    calls_before = model.call_count
    good = json.dumps({"input": chat("q?")})
    cases = [
        (post(base, "/tcrag/invoke", good, headers={"content-type": "text/plain"}), 415),
        (post(base, "/tcrag/invoke", good, headers={"content-type": "application/x-www-form-urlencoded"}), 415),
        (post(base, "/tcrag/invoke", good.encode(), headers={}), 415),  # no content type
        (post(base, "/tcrag/invoke", json.dumps({"input": chat("x" * 40_000)}),
              headers={"content-type": "application/json"}), 413),
        (post(base, "/tcrag/invoke", "{not json", headers={"content-type": "application/json"}), 400),
        (post(base, "/tcrag/invoke", b'{"input": "\xff\xfe"}', headers={"content-type": "application/json"}), 400),
        (post(base, "/tcrag/invoke", "[" * 5000 + "]" * 5000, headers={"content-type": "application/json"}), 422),
        (post(base, "/tcrag/invoke", '{"input": ' + "[" * 40 + "]" * 40 + "}",
              headers={"content-type": "application/json"}), 422),
        (post(base, "/tcrag/invoke", '{"input": {"messages": [{"type": "human", "content": "bad \\ud800 text"}]}}',
              headers={"content-type": "application/json"}), 422),
    ]
    assert [r.status_code for r, _ in cases] == [status for _, status in cases], [r.text for r, _ in cases]
    assert model.call_count == calls_before  # nothing reached the agent
    ok = post(base, "/tcrag/invoke", good, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_batch_honours_each_items_config(secured):
    base, _ = secured
    r = post(base, "/tcrag/batch", {"inputs": [chat("alpha?"), chat("beta?")],
                                    "config": [{"configurable": {"sigma": 20, "thread_id": "b1"}},
                                               {"configurable": {"thread_id": "b2"}}]})
    assert r.status_code == 200, r.text
    metas = [o["response_metadata"] for o in r.json()["output"]]
    assert [m["sigma"] for m in metas] == [20.0, 10.0]
    assert [o["content"] for o in r.json()["output"]] == ["first answer to alpha?", "second answer to beta?"]
    for tid, question in (("b1", "alpha?"), ("b2", "beta?")):
        thread = httpx.get(f"{base}/tcrag/threads/{tid}", headers=bearer(DOCTOR), timeout=10).json()
        assert thread["question"] == question


def test_in_memory_threads_are_bounded():
    from tcrag_langgraph.faces.serve import BoundedMemorySaver

    graph = scripted_graph(SCRIPT)
    with uvicorn_thread(create_app(graph=graph, max_threads=3)) as base:
        for i in range(8):
            assert invoke(base, f"q{i}?", {"thread_id": f"t{i}"}).status_code == 200
        saver = graph.checkpointer
        assert isinstance(saver, BoundedMemorySaver) and saver.thread_count == 3
        assert httpx.get(f"{base}/tcrag/threads/t0", timeout=10).status_code == 404  # the oldest was dropped
        assert httpx.get(f"{base}/tcrag/threads/t7", timeout=10).status_code == 200
    with pytest.raises(ValueError, match="max_threads"):
        BoundedMemorySaver(max_threads=0)


def test_exposure_rules_and_cli_refuses_public_bind_without_auth(tmp_path):
    import subprocess

    from tcrag_langgraph.faces.serve import check_exposure

    assert check_exposure("127.0.0.1", authenticated=False) is None
    assert check_exposure("::1", authenticated=False) is None and check_exposure("localhost", authenticated=False) is None
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        with pytest.raises(ValueError, match="without authentication"):
            check_exposure(host, authenticated=False)
    assert "WARNING" in check_exposure("0.0.0.0", authenticated=True)
    assert check_exposure("10.0.0.2", authenticated=True) is None
    out = subprocess.run(python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--host", "0.0.0.0", "--no-tools",
                                    "--scripted", str(script_file(tmp_path / "s.json", SCRIPT))),
                         capture_output=True, text=True, timeout=120, env={**os.environ, "TCRAG_AUTH_USERS": "", "COLUMNS": "400"})
    assert out.returncode != 0 and "without authentication" in out.stderr


@pytest.mark.slow
def test_soak_memory_stays_flat_over_500_requests(tmp_path):
    """A real `tcrag serve` subprocess; each request a fresh thread with a ~19k-character question
    (the issue's figure: +300 MB over 200 such requests before the store was bounded)."""
    import psutil

    port = free_port()
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools", "--max-threads", "50",
                     "--scripted", str(script_file(tmp_path / "script.json", SCRIPT)), "--log-level", "warning")
    question = ("Which drug? " * 1600)[:19_000]
    rss = {}
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp_path / "soak.log", timeout=90) as proc:
        base = f"http://127.0.0.1:{port}"
        server = psutil.Process(proc.pid)
        with httpx.Client(timeout=30) as client:
            for i in range(1, 501):
                r = client.post(f"{base}/tcrag/invoke", json={"input": chat(f"{i} {question}")})
                assert r.status_code == 200, r.text
                if i in (100, 500):
                    rss[i] = server.memory_info().rss
    growth_mb = (rss[500] - rss[100]) / 2**20
    print(f"soak RSS after 100: {rss[100] / 2**20:.1f} MB, after 500: {rss[500] / 2**20:.1f} MB (+{growth_mb:.1f} MB)")
    assert growth_mb < 25, rss


def test_cli_serves_with_a_users_file(tmp_path):
    """`tcrag serve --users-file` as a real subprocess: tokens checked, the user count announced."""
    from .helpers_servers import users_file

    port = free_port()
    users = users_file(tmp_path / "users.json", {DOCTOR: {"identity": "dr-lee"}, OTHER: {"identity": "dr-other"}})
    log = tmp_path / "server.log"
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools", "--users-file", str(users),
                     "--scripted", str(script_file(tmp_path / "script.json", SCRIPT)))
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=log, timeout=90):
        base = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{base}/tcrag/invoke", json={"input": chat("q?")}, timeout=30).status_code == 401
        r = httpx.post(f"{base}/tcrag/invoke", json={"input": chat("q?")}, headers=bearer(OTHER), timeout=30)
        assert r.status_code == 200 and r.json()["output"]["content"] == "second answer to q?"
    assert "[authentication: 2 users]" in log.read_text()
    assert DOCTOR not in log.read_text() and OTHER not in log.read_text()  # tokens never logged


def test_odd_request_shapes_are_answered_never_a_500(secured):
    base, _ = secured
    bodies = [{"input": 5}, [], "str", None, {"input": chat("q"), "config": "s"},
              {"input": chat("q"), "config": {"configurable": {"thread_id": 5}}},
              {"input": chat("q"), "config": {"configurable": {"thread_id": "x" * 500}}},
              {"input": chat("q"), "config": {"configurable": {"sigma": "nan"}}},
              {"input": {"messages": []}}, {"input": {"messages": [{"type": "ai", "content": "x"}]}},
              {"input": chat("")}, {"input": chat("\x00")},
              {"input": {"messages": [{"type": "human", "content": [{"type": "image_url", "image_url": "x"}]}]}}]
    statuses = []
    for body in bodies:
        for path in ("/tcrag/invoke", "/tcrag/stream"):
            r = post(base, path, json.dumps(body), headers={"content-type": "application/json"})
            statuses.append(r.status_code)
            assert r.status_code == 200 or 400 <= r.status_code < 500, (path, body, r.text)
    r = post(base, "/tcrag/batch", {"inputs": [chat("a")], "config": [{}, {}]})
    assert r.status_code == 422 and "Number of configs" in r.text
    assert statuses.count(422) == 16  # the first eight shapes are refused; the rest end in a halt reason
