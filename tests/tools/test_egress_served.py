"""The egress rule through the real server, for every method of the registry (issue 40, item 3).

Each method is built as ``tcrag serve --method M --scripted S`` builds it (an AgentSpec whose script
replaces the model; the real EMR_SEARCH and the real WEB_SEARCH over a SearxNG server on 127.0.0.1
that logs every query) and served by the server's own app (``create_app``: real uvicorn on loopback,
the users file's identity). An authenticated doctor allowed to see P00002 asks for that record; the
scripted model then asks for a Summary of it and sends it to WEB_SEARCH (the finding's case), and
the methods that retrieve on their own send the question and their own generations to every tool.
Nothing may reach the search server once the record is read. EMR_SEARCH comes first in the tool list
so that every web call is one made after the record. The control (a doctor without access) shows
the same server does log what goes out; one method also runs through the ``tcrag serve`` process.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tcrag_langgraph.agent.spec import AgentSpec
from tcrag_langgraph.faces.auth import UserDirectory
from tcrag_langgraph.faces.serve import create_app
from tcrag_langgraph.methods.registry import METHODS
from tests.helpers_servers import free_port, python_cmd, script_file, server_process, users_file, uvicorn_thread

DOCTOR, OTHER = "egress-doctor-token-1f9a", "egress-other-token-7c2e"
QUESTION = "Summarise the record of patient P00002."
SEARX_OK = {"query": "x", "results": [{"title": "Result", "url": "https://example.org/r", "content": "text"}]}
EXCERPT = "Patient P00002 admitted 2023-02-20: NT-proBNP 8636 pg/mL, I50.9 heart failure"
LOOKUP = 'Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "P00002"}'
# the finding: look the record up, condense it (a Summary pops the EMR frame), send the condensed text
ACTIONS = [LOOKUP, f"Summary: {EXCERPT}", f"Tool_Use: WEB_SEARCH\nTool_Input: {EXCERPT}", "Conclusion: yes"] * 6
NATIVE_CALLS = [{"reply": "", "tool_calls": [{"name": "EMR_SEARCH",
                                              "args": {"operation": "lookup", "patient_id": "P00002"}}]},
                {"reply": "", "tool_calls": [{"name": "WEB_SEARCH", "args": {"query": EXCERPT}}]}, {"reply": "Done."}]
# KAG-Thinker: a plan whose second retrieval asks about the first one's answer (read from the record)
KAG_PLAN = ("Step1: What does the record of patient P00002 say?\n"
            "Action1: Retrieval(s=s1:patient['P00002'], p=p1:record, o=o1:summary)\n"
            "Step2: What treats #1?\nAction2: Retrieval(s=o1, p=p2:treatment, o=o2:drug)\n"
            "Step3: Output #2\nAction3: Output(#2)")
KAG_REPLIES = [KAG_PLAN, f"<answer>{EXCERPT}</answer>", "<answer>furosemide</answer>", "<answer>furosemide</answer>"] * 3
# methods that call no tool while answering: nothing can be read, nothing can leave
NO_TOOLS_AT_RUN_TIME = {"base": "closed book", "cot": "closed book",
                        "diffrag": "answers from its own graph, built from documents, and calls no tool"}


def script_for(method: str) -> dict:
    replies = NATIVE_CALLS if method == "langchain-agent" else KAG_REPLIES if method == "kag-thinker" else ACTIONS
    return {"replies": replies, "mode": "sequence", "real_tools": ["EMR_SEARCH", "WEB_SEARCH"],
            "model_id": "scripted-egress",  # tcrag-auto reads its sigma from this name's stored calibration
            # token log-probs for the methods that read them (FLARE retrieves for a sentence with a
            # low-probability word, DRAGIN for a high-entropy one); "yes" scores well everywhere
            "token_scorer": {"default_logprob": -0.05, "logprobs": {"patient": -6.0, "p00002": -6.0},
                             "entropies": {"patient": 5.0}},
            "config": {"max_steps": 6, "max_new_tokens": 64, "answer_format": ["yes", "no", "maybe"]}}


@pytest.fixture
def searx(http_server, monkeypatch, tmp_path):
    """The logging SearxNG server, named where the real WEB_SEARCH looks for it; a cache with the
    scripted model's calibration (tcrag-auto)."""
    from tcrag_langgraph.monitor.calibration import Calibration, save_calibration

    queries: list[str] = []

    def respond(req, n):
        queries.append(req.query.get("q", [""])[0])
        return http_server.Reply(200, SEARX_OK)

    http_server.respond = respond
    monkeypatch.setenv("TCRAG_SEARXNG_URL", http_server.url)
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    save_calibration(Calibration(metric="cppl", sigma=2.0, auroc=0.8, model_id="scripted-egress", dataset="unit", n=50))
    return queries


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    path = users_file(tmp_path_factory.mktemp("egress-users") / "users.json", {
        DOCTOR: {"identity": "dr-lee", "roles": ["clinician"], "allowed_patient_ids": ["P00002"]},
        OTHER: {"identity": "dr-other", "roles": ["clinician"], "allowed_patient_ids": ["P00005"]}})
    return path


def served_tool_results(tmp_path, users, method: str, token: str) -> list[tuple[str, str]]:
    """Serve ``method`` and ask QUESTION as the user of ``token`` through ``/tcrag/stream_events``: the
    (tool, output) of every tool call the run made, in order, as the server streamed them."""
    script = script_file(tmp_path / f"{method}.json", script_for(method))
    options = {"options": {"knowledge_boundary": False}} if method == "kag-thinker" else {}
    graph = AgentSpec(method=method, script=str(script)).build(**options)
    with uvicorn_thread(create_app(graph=graph, users=UserDirectory.from_file(users))) as base:
        reply = httpx.post(f"{base}/tcrag/stream_events", headers={"Authorization": f"Bearer {token}"}, timeout=120,
                           json={"input": {"messages": [{"type": "human", "content": QUESTION}]}})
    assert reply.status_code == 200, reply.text
    events = [json.loads(line[len("data:"):]) for line in reply.text.splitlines() if line.startswith("data:")]
    assert events and not any(e.get("event") == "error" for e in events if isinstance(e, dict)), reply.text[-2000:]
    return [(e["name"], json.dumps(e["data"].get("output"))) for e in events
            if isinstance(e, dict) and e.get("event") == "on_tool_end"]


def after_the_record(results: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The tool results after the first EMR_SEARCH that returned P00002's record."""
    first = next((i for i, (tool, output) in enumerate(results)
                  if tool == "EMR_SEARCH" and "Patient P00002" in output), None)
    assert first is not None, [tool for tool, _ in results]  # the doctor may see P00002, and did
    return results[first + 1:]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_method_sends_anything_out_after_a_record(tmp_path, searx, users, method):
    results = served_tool_results(tmp_path, users, method, DOCTOR)
    assert searx == [], searx  # nothing reached the search server: not the record, not the question
    if method in NO_TOOLS_AT_RUN_TIME:
        assert results == [], NO_TOOLS_AT_RUN_TIME[method]
        return
    searches = [output for tool, output in after_the_record(results) if tool == "WEB_SEARCH"]
    assert searches, [tool for tool, _ in results]  # it tried: the rule was met, not missed
    assert all('"egress_refused"' in output for output in searches), searches


@pytest.mark.parametrize("method", ["fl-rag", "tcrag"])
def test_the_control_without_access_the_same_search_goes_out(tmp_path, searx, users, method):
    results = served_tool_results(tmp_path, users, method, OTHER)
    assert not any("Patient P00002" in output for _, output in results)  # forbidden to this doctor
    assert searx and not any("egress_refused" in output for _, output in results)  # the server logs what goes out


@pytest.mark.slow
def test_through_the_tcrag_serve_process(tmp_path, searx, users):
    """FL-RAG as the finding ran it (it retrieves with every tool each round): through `tcrag serve`."""
    port = free_port()
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--method", "fl-rag",
                     "--scripted", str(script_file(tmp_path / "s.json", script_for("fl-rag"))), "--users-file",
                     str(users), "--log-level", "warning")
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp_path / "serve.log", timeout=90):
        for token, sent in ((DOCTOR, False), (OTHER, True)):
            reply = httpx.post(f"http://127.0.0.1:{port}/tcrag/invoke",
                               json={"input": {"messages": [{"type": "human", "content": QUESTION}]}},
                               headers={"Authorization": f"Bearer {token}"}, timeout=120)
            assert reply.status_code == 200, reply.text
            assert bool(searx) is sent, (token, searx)
