"""Every method on every face: ``tcrag ask --method``, ``tcrag serve --method`` (a real server
subprocess) and one ``langgraph dev`` graph per method (the repository's langgraph.json), all
behind the same authentication, with the bounded budgets of ``tcrag ask`` by default (4 steps,
then the final Conclusion). The model is scripted (a test double, not a language model)."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from tcrag_langgraph.faces.cli import app
from tcrag_langgraph.agent.spec import FACE_DEFAULTS
from tcrag_langgraph.faces.studio import STUDIO_METHODS
from tcrag_langgraph.methods.registry import METHOD_NAMES

from .helpers_servers import REPO, free_port, langgraph_dev, python_cmd, script_file, server_process, users_file

TOKEN = "faces-methods-token-8c2f"
Q = "Is aspirin an NSAID?"
# A model that never concludes: different Thoughts (stack mode: each run starts at the first).
NEVER_CONCLUDES = {"replies": [f"Thought: thought {i} about {{question}}" for i in range(60)], "default_score": 50.0}
runner = CliRunner()


def _json(result) -> dict:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.fixture
def script(tmp_path):
    return script_file(tmp_path / "script.json", {
        "replies": ["Tool_Use: DOC_RAG\nTool_Input: aspirin", "Conclusion: Yes, aspirin is an NSAID."],
        "tools": {"DOC_RAG": "Aspirin is a nonsteroidal anti-inflammatory drug ({input})."},
        "scores": {"Yes, aspirin is an NSAID.": 2.0}})


def test_ask_method_picks_any_registry_method(script):
    default = _json(runner.invoke(app, ["ask", Q, "--scripted", str(script), "--json"]))
    assert default["halt_reason"] == "validated" and default["tool_calls"] == 1
    react = _json(runner.invoke(app, ["ask", Q, "--scripted", str(script), "--method", "react", "--json"]))
    assert react["halt_reason"] == "conclusion_unmonitored" and react["answer_validated"] is False
    base = _json(runner.invoke(app, ["ask", Q, "--scripted", str(script), "--method", "base", "--json"]))
    assert (base["llm_calls"], base["tool_calls"]) == (1, 0)
    sr = _json(runner.invoke(app, ["ask", Q, "--scripted", str(script), "--method", "sr-rag", "--json"]))
    assert sr["tool_calls"] == 1 and sr["llm_calls"] == 1
    refused = runner.invoke(app, ["ask", Q, "--scripted", str(script), "--method", "hykge"])
    assert refused.exit_code == 2 and "choose from" in refused.output
    for name in METHOD_NAMES:  # the refusal lists every registry name
        assert name in " ".join(refused.output.split())


def test_langgraph_json_has_a_graph_per_method_behind_the_same_auth():
    from langgraph_cli.config import validate_config_file

    config = validate_config_file(REPO / "langgraph.json")
    assert set(config["graphs"]) == set(STUDIO_METHODS)
    assert {"tcrag", "crp-rag", "kag-thinker", "diffrag", "base", "cot", "sr-rag", "react"} <= set(config["graphs"])
    assert all(m == "tcrag" or m in METHOD_NAMES for m in STUDIO_METHODS.values())
    assert config["auth"]["path"] == "./tcrag_langgraph/faces/auth.py:auth"


@pytest.mark.slow
def test_serve_method_and_run_options_behind_auth(tmp_path):
    users = users_file(tmp_path / "users.json", {TOKEN: {"identity": "tester"}})
    never = script_file(tmp_path / "never.json", NEVER_CONCLUDES)
    body = {"input": {"messages": [{"type": "human", "content": Q}]}}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for method, extra, check in (
        ("tcrag", [], lambda m: m["halt_reason"] == "max_steps" and m["steps"] == FACE_DEFAULTS["max_steps"] + 1),
        ("react", ["--max-steps", "3"], lambda m: m["halt_reason"] == "max_steps" and m["steps"] == 4),
        ("base", [], lambda m: m["halt_reason"] == "answered" and m["steps"] in (0, 1)),
    ):
        port = free_port()
        cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools",
                         "--scripted", str(never), "--users-file", str(users), "--method", method, *extra)
        with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp_path / f"{method}.log",
                            timeout=90):
            url = f"http://127.0.0.1:{port}/tcrag/invoke"
            assert httpx.post(url, json=body, timeout=60).status_code == 401
            r = httpx.post(url, json=body, headers=auth, timeout=60)
            assert r.status_code == 200, r.text
            meta = r.json()["output"]["response_metadata"]
            assert check(meta), (method, meta)
            assert httpx.get(f"http://127.0.0.1:{port}/healthz").json()["graph"] == method


@pytest.mark.slow
def test_every_method_graph_runs_under_langgraph_dev_with_the_same_auth(tmp_path):
    from langgraph_sdk import get_sync_client

    users = users_file(tmp_path / "users.json", {TOKEN: {"identity": "studio-tester"}})
    with langgraph_dev(tmp_path, script=script_file(tmp_path / "never.json", NEVER_CONCLUDES), users=users) as base:
        assert httpx.post(f"{base}/assistants/search", json={}).status_code in (401, 403)
        client = get_sync_client(url=base, api_key=None, headers={"Authorization": f"Bearer {TOKEN}"})
        graphs = {a["graph_id"] for a in client.assistants.search(limit=100)}
        assert graphs == set(STUDIO_METHODS)
        out = client.runs.wait(None, "tcrag", input={"question": Q})
        assert out["halt_reason"] == "max_steps" and out["steps"] == FACE_DEFAULTS["max_steps"] + 1  # ask's budget
        out = client.runs.wait(None, "react", input={"question": Q}, context={"max_steps": 2})
        assert out["halt_reason"] == "max_steps" and out["steps"] == 3
        out = client.runs.wait(None, "base", input={"question": Q})
        assert out["halt_reason"] == "answered" and out["answer"].startswith("Thought: thought 0")
        for graph_id in STUDIO_METHODS:  # every graph is built and shows its nodes
            (assistant,) = client.assistants.search(graph_id=graph_id)
            assert client.assistants.get_graph(assistant["assistant_id"])["nodes"]


def test_langgraph_json_is_the_registry_s_and_every_factory_it_names_exists(tmp_path):
    """langgraph.json is generated from the method registry (``tcrag studio-config``): a method marked
    for Studio is served without editing the file by hand, and a stale file fails here."""
    import json

    from typer.testing import CliRunner

    from tcrag_langgraph.faces import studio
    from tcrag_langgraph.faces.cli import app
    from tcrag_langgraph.methods.registry import langgraph_config

    assert json.loads((REPO / "langgraph.json").read_text(encoding="utf-8")) == langgraph_config()
    for graph in langgraph_config()["graphs"].values():
        assert callable(getattr(studio, graph["path"].rpartition(":")[2]))
    stale = tmp_path / "langgraph.json"
    stale.write_text((REPO / "langgraph.json").read_text(encoding="utf-8").replace('"react"', '"react-old"'))
    assert CliRunner().invoke(app, ["studio-config", "--check", str(stale)]).exit_code == 1
    assert CliRunner().invoke(app, ["studio-config", str(stale)]).exit_code == 0
    assert CliRunner().invoke(app, ["studio-config", "--check", str(stale)]).exit_code == 0
