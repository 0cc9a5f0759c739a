"""LangGraph Studio: langgraph.json, and a real `langgraph dev` server driven through langgraph_sdk."""

from __future__ import annotations

import pytest

from .helpers_servers import REPO, langgraph_dev, script_file, users_file

TOKEN = "studio-test-token-5d1e"

SCRIPT = {
    "replies": ["Thought: about {question}", "Tool_Use: DOC_RAG\nTool_Input: {question}",
                "Conclusion: first answer to {question}", "Conclusion: second answer to {question}"],
    "scores": {"about {question}": 40.0, "first answer to {question}": 15.0, "second answer to {question}": 5.0},
    "tools": {"DOC_RAG": "passage on {input}"},
}


def test_langgraph_json_exports_the_studio_graph_with_a_description():
    from langgraph_cli.config import validate_config_file

    config = validate_config_file(REPO / "langgraph.json")
    spec = config["graphs"]["tcrag"]
    assert spec["path"] == "./tcrag_langgraph/faces/studio.py:studio_graph"
    assert "stack" in spec["description"] and "sigma" in spec["description"]
    assert "TCRAG_STUDIO_SCRIPTED" in spec["description"]  # the demo hook is disclosed where Studio shows it
    assert config["auth"]["path"] == "./tcrag_langgraph/faces/auth.py:auth"  # identity from our authenticator only
    assert config["auth"]["disable_studio_auth"] is True  # no unauthenticated "Studio user" bypass


def test_importing_studio_or_the_doubles_builds_no_graph():
    import subprocess
    import sys

    code = ("import sys, tcrag_langgraph.faces.studio as s, tcrag_langgraph.testing; "
            "print(bool(s._built), 'tcrag_langgraph.methods.tcrag.graph' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False", "False"]


def test_default_studio_graph_is_the_real_agent_without_checkpointer(monkeypatch):
    import importlib

    monkeypatch.delenv("TCRAG_STUDIO_SCRIPTED", raising=False)
    studio = importlib.reload(importlib.import_module("tcrag_langgraph.faces.studio"))
    assert studio.graph.checkpointer is None
    assert set(studio.graph.nodes) >= {"Start", "Generate", "Thought", "Conclusion", "Human_Review"}
    assert studio.graph.get_name() == "tcrag"


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("studio")
    users = users_file(tmp / "users.json", {TOKEN: {"identity": "studio-tester"}})
    with langgraph_dev(tmp, script=script_file(tmp / "script.json", SCRIPT), users=users) as base:
        yield base


@pytest.fixture(scope="module")
def client(dev_server):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=dev_server, api_key=None, headers={"Authorization": f"Bearer {TOKEN}"})


@pytest.mark.slow
def test_studio_shows_nodes_state_and_description(client):
    (assistant,) = client.assistants.search(graph_id="tcrag")
    assert "Turing-Complete" in (assistant.get("description") or "")
    nodes = [n["id"] for n in client.assistants.get_graph(assistant["assistant_id"])["nodes"]]
    assert nodes == ["__start__", "Start", "Generate", "Thought", "Plan", "Tool_Use", "Summary", "Backtrack",
                     "Conclusion", "Human_Review", "Review_Unvalidated", "__end__"]
    schemas = client.assistants.get_schemas(assistant["assistant_id"])
    assert {"stack", "state_value", "sigma", "metric", "trace"} <= set(schemas["state_schema"]["properties"])
    assert {"sigma", "metric", "max_steps"} <= set(schemas["context_schema"]["properties"])


@pytest.mark.slow
def test_run_streams_node_updates_custom_events_and_answer(client):
    thread = client.threads.create()
    parts = list(client.runs.stream(thread["thread_id"], "tcrag", input={"question": "What treats scurvy?"},
                                    stream_mode=["updates", "custom"]))
    updates = [next(iter(p.data)) for p in parts if p.event == "updates"]
    assert updates == ["Start", "Generate", "Thought", "Generate", "Tool_Use", "Generate", "Conclusion",
                       "Generate", "Conclusion"]
    custom = [(p.data["action"], p.data["op"]) for p in parts if p.event == "custom"]
    assert custom == [("User_Query", "push"), ("Thought", "push"), ("Tool_Use", "push"), ("Conclusion", "reject"),
                      ("Conclusion", "push"), ("Halt", "halt")]
    values = client.threads.get_state(thread["thread_id"])["values"]
    assert values["answer"] == "second answer to What treats scurvy?" and values["halt_reason"] == "validated"
    assert [f["action"] for f in values["stack"]] == ["User_Query", "Thought", "Tool_Use", "Thought", "Conclusion"]
    assert values["stack"][2]["tool_call"]["observation"] == "passage on What treats scurvy?"
    assert values["sigma"] == 10.0 and values["state_value"] == 5.0


@pytest.mark.slow
def test_runtime_options_via_context_and_configurable_are_honoured(client):
    out = client.runs.wait(None, "tcrag", input={"question": "q1?"}, context={"sigma": 20})
    assert out["sigma"] == 20.0 and out["answer"] == "first answer to q1?"  # 15 < 20
    out = client.runs.wait(None, "tcrag", input={"question": "q2?"}, context={"metric": "uct"})
    assert out["metric"] == "uct" and out["sigma"] == 20.0 and out["answer"] == "first answer to q2?"
    out = client.runs.wait(None, "tcrag", input={"question": "q3?"}, context={"max_steps": 2})
    # budget of 2 (Thought, Tool_Use), then the one final Conclusion written at the budget: rejected (15 > 10)
    assert out["halt_reason"] == "max_steps" and out["steps"] == 3 and out["answer_validated"] is False
    assert out["answer"] == "first answer to q3?"
    out = client.runs.wait(None, "tcrag", input={"question": "q4?"}, config={"configurable": {"sigma": 16}})
    assert out["sigma"] == 16.0 and out["answer"] == "first answer to q4?"


@pytest.mark.slow
def test_human_review_interrupt_and_resume_through_the_api(client):
    thread = client.threads.create()
    tid = thread["thread_id"]
    client.runs.wait(tid, "tcrag", input={"question": "review me?"}, context={"require_review": True})
    state = client.threads.get_state(tid)
    assert state["next"] == ["Human_Review"]
    (interrupt,) = state["tasks"][0]["interrupts"]
    assert interrupt["value"]["answer"] == "second answer to review me?"
    out = client.runs.wait(tid, "tcrag", command={"resume": "approve"}, context={"require_review": True})
    assert out["answer"] == "second answer to review me?" and out["answer_validated"] is True
    assert client.threads.get_state(tid)["next"] == []


@pytest.mark.slow
def test_an_unvalidated_answer_waits_for_a_reviewer_through_the_api(client):
    """review_unvalidated (issue 37): the budget runs out with a Conclusion the monitor rejected; the
    run pauses in the kernel's Review_Unvalidated node and the reviewer's answer ends it."""
    tid = client.threads.create()["thread_id"]
    context = {"review_unvalidated": True, "max_steps": 2}
    client.runs.wait(tid, "tcrag", input={"question": "q5?"}, context=context)
    state = client.threads.get_state(tid)
    assert state["next"] == ["Review_Unvalidated"]
    (pause,) = state["tasks"][0]["interrupts"]
    assert pause["value"]["answer"] == "first answer to q5?" and pause["value"]["halt_reason"] == "max_steps"
    out = client.runs.wait(tid, "tcrag", command={"resume": {"answer": "the reviewer's answer"}}, context=context)
    assert out["answer"] == "the reviewer's answer" and out["answer_validated"] is True
    assert out["halt_reason"] == "reviewed" and client.threads.get_state(tid)["next"] == []
