"""A person reviews what the model cannot vouch for, through the real `tcrag serve` (issue 37 item 5):
the operator's --review-unvalidated pauses an unvalidated answer; the thread's owner resumes it with
POST /tcrag/threads/{thread_id}/review; nobody else can."""

from __future__ import annotations

import httpx
import pytest

from .helpers_servers import free_port, python_cmd, script_file, server_process, users_file

# Conclusions the scripted monitor scores at 50 (above sigma 10): never validated by the monitor (stack mode:
# a rejected Conclusion stays on the stack, so each try is a new one)
UNSURE = {"replies": [f"Conclusion: metformin{' ' * i}." for i in range(6)], "default_score": 50.0}
DOCTOR, OTHER = "doctor-token-0123456789abcdef", "other-token-0123456789abcdefgh"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-review")
    port = free_port()
    users = users_file(tmp / "users.json", {DOCTOR: {"identity": "dr-lee"}, OTHER: {"identity": "dr-other"}})
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools",
                     "--scripted", str(script_file(tmp / "script.json", UNSURE)), "--max-steps", "1",
                     "--users-file", str(users), "--review-unvalidated")
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp / "server.log", timeout=90):
        yield f"http://127.0.0.1:{port}"


def _ask(base: str, thread: str, token: str = DOCTOR) -> dict:
    reply = httpx.post(f"{base}/tcrag/invoke", headers={"Authorization": f"Bearer {token}"}, timeout=60, json={
        "input": {"messages": [{"type": "human", "content": "First-line drug for type 2 diabetes?"}]},
        "config": {"configurable": {"thread_id": thread}}})
    assert reply.status_code == 200, reply.text
    return reply.json()["output"]


def _review(base: str, thread: str, decision, token: str = DOCTOR) -> httpx.Response:
    return httpx.post(f"{base}/tcrag/threads/{thread}/review", headers={"Authorization": f"Bearer {token}"},
                      json={"decision": decision}, timeout=60)


def test_an_unvalidated_answer_waits_and_its_owner_approves_or_answers(served):
    paused = _ask(served, "t-approve")
    assert paused["response_metadata"]["halt_reason"] == "awaiting_review", paused
    assert _review(served, "t-approve", "approve", token=OTHER).status_code == 404  # another principal's thread
    done = _review(served, "t-approve", "approve")
    assert done.status_code == 200, done.text
    meta = done.json()["response_metadata"]
    assert meta["halt_reason"] == "reviewed" and meta["answer_validated"] is True
    assert "metformin" in done.json()["content"]
    assert _review(served, "t-approve", "approve").status_code == 404  # nothing waits any more

    _ask(served, "t-answer")
    done = _review(served, "t-answer", {"answer": "Metformin, with lifestyle changes"})
    assert done.json()["response_metadata"]["answer_validated"] is True
    assert "Metformin, with lifestyle changes" in done.json()["content"]


def test_a_rejected_answer_stays_unvalidated_and_bad_decisions_are_refused(served):
    _ask(served, "t-reject")
    for bad in ("maybe", {"answer": ""}, {"answer": "x", "approve": True}, None):
        refused = _review(served, "t-reject", bad)
        assert refused.status_code == 422 and "decision must be" in refused.text
    done = _review(served, "t-reject", "reject")
    meta = done.json()["response_metadata"]
    assert meta["answer_validated"] is False and meta["halt_reason"] != "reviewed"
    assert _review(served, "never-asked", "approve").status_code == 404
