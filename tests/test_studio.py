"""LangGraph Studio: langgraph.json, and a real `langgraph dev` server driven through langgraph_sdk."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from .helpers_servers import REPO, free_port, script_file, server_process

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
    assert spec["path"] == "./tcrag_langgraph/studio.py:graph"
    assert "stack" in spec["description"] and "sigma" in spec["description"]
    assert "TCRAG_STUDIO_SCRIPTED" in spec["description"]  # the demo hook is disclosed where Studio shows it


def test_default_studio_graph_is_the_real_agent_without_checkpointer(monkeypatch):
    import importlib

    monkeypatch.delenv("TCRAG_STUDIO_SCRIPTED", raising=False)
    studio = importlib.reload(importlib.import_module("tcrag_langgraph.studio"))
    assert studio.graph.checkpointer is None
    assert set(studio.graph.nodes) >= {"Start", "Generate", "Thought", "Conclusion", "Human_Review"}
    assert studio.graph.get_name() == "tcrag"


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory):
    exe = shutil.which("langgraph", path=str(Path(sys.executable).parent)) or shutil.which("langgraph")
    if exe is None:
        pytest.fail("langgraph CLI (langgraph-cli[inmem]) is not installed")
    tmp = tmp_path_factory.mktemp("studio")
    port = free_port()
    script = script_file(tmp / "script.json", SCRIPT)
    cmd = [exe, "dev", "--host", "127.0.0.1", "--port", str(port), "--no-browser", "--no-reload"]
    env = {"TCRAG_STUDIO_SCRIPTED": str(script), "LANGGRAPH_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false"}
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/ok", log=tmp / "dev.log", env=env,
                        timeout=180, cwd=REPO):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def client(dev_server):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=dev_server)


@pytest.mark.slow
def test_studio_shows_nodes_state_and_description(client):
    (assistant,) = client.assistants.search(graph_id="tcrag")
    assert "Turing-Complete" in (assistant.get("description") or "")
    nodes = [n["id"] for n in client.assistants.get_graph(assistant["assistant_id"])["nodes"]]
    assert nodes == ["__start__", "Start", "Generate", "Thought", "Plan", "Tool_Use", "Summary", "Backtrack",
                     "Conclusion", "Human_Review", "__end__"]
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
    assert out["halt_reason"] == "max_steps" and out["steps"] == 2 and out["answer_validated"] is False
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
