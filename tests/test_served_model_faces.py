"""A served model keeps its state monitor on every face: ``tcrag ask``, ``tcrag eval``, ``tcrag
calibrate`` and ``build_graph(model_kwargs=...)`` against one real loopback OpenAI-compatible server
(tests/completions_logprob_server.py): its chat completions are generated, and its prompt
log-probs computed, by the packaged SmolLM2 weights. The key travels only through an environment
variable named by ``--api-key-env`` (the server answers 401 without it)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tcrag_langgraph.faces.cli import app
from tcrag_langgraph.monitor.scoring import LocalLMScorer

from .helpers_servers import REPO, free_port, python_cmd, server_process

KEY_ENV = "TCRAG_TEST_SERVED_KEY"
API_KEY = "sk-served-monitor-test-0123456789"
Q = "Which vitamin deficiency causes scurvy?"
runner = CliRunner()
pytestmark = pytest.mark.slow  # the real packaged model behind a real server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("served") / "server.log"
    cmd = python_cmd(str(REPO / "tests" / "completions_logprob_server.py"), "--port", str(port),
                     "--api-key-env", KEY_ENV)
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/health", log=log, env={KEY_ENV: API_KEY},
                        timeout=180):
        yield f"http://127.0.0.1:{port}/v1"


def _served_args(url: str) -> list[str]:
    return ["--model", "openai:smollm2", "--base-url", url, "--api-key-env", KEY_ENV]


def _scored(trace: list[dict]) -> list[tuple[str, float]]:
    """(text, value) of every Conclusion the monitor scored."""
    return [(e["content"], e["state_value"]) for e in trace
            if e["action"] == "Conclusion" and e["state_value"] is not None and e["content"]]


def test_ask_with_a_served_model_scores_with_the_served_log_probs(served, lm):
    args = ["ask", Q, *_served_args(served), "--scorer", served, "--scorer-start-text", lm.tokenizer.bos_token,
            "--no-tools", "--max-steps", "2", "--max-new-tokens", "24", "--temperature", "0", "--json"]
    result = runner.invoke(app, args, env={KEY_ENV: API_KEY})
    assert result.exit_code in (0, 1), result.output
    out = json.loads(result.stdout[result.stdout.index("{"):])
    assert out["llm_calls"] >= 1 and out["halt_reason"] != "model_error", out
    scored = _scored(out["trace"])
    assert scored, out["trace"]
    local = LocalLMScorer(lm, prefix_cache=0)
    for text, value in scored:  # the served monitor's value is eq. 2 over the same weights
        assert value == pytest.approx(local.score(Q, text, metric="cppl"), rel=1e-3)
    assert API_KEY not in result.output


def test_a_served_model_without_a_scorer_asked_for_cppl_is_refused_with_the_flags(served):
    result = runner.invoke(app, ["ask", Q, *_served_args(served), "--no-tools", "--metric", "cppl"],
                           env={KEY_ENV: API_KEY})
    assert result.exit_code == 2
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    for flag in ("--scorer", "--no-state-monitor", "--metric consistency"):
        assert flag in message


def test_a_provider_error_is_one_line_and_exit_2(served):
    result = runner.invoke(app, ["ask", Q, *_served_args(served), "--no-tools", "--no-state-monitor", "--json"],
                           env={KEY_ENV: "sk-wrong-key"})
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    error_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(error_lines) == 1 and error_lines[0].startswith("Model error:") and "401" in error_lines[0]


def test_build_graph_hands_model_kwargs_to_the_served_model(served, lm):
    from tcrag_langgraph import build_graph
    from tcrag_langgraph.monitor.served import CompletionsLogprobScorer

    scorer = CompletionsLogprobScorer(served, model="smollm2", api_key=API_KEY, start_text=lm.tokenizer.bos_token)
    graph = build_graph(model="openai:smollm2", model_kwargs={"base_url": served, "api_key": API_KEY, "max_retries": 0},
                        scorer=scorer, config={"max_steps": 1, "max_new_tokens": 24, "temperature": 0.0})
    out = graph.invoke({"question": Q})
    assert out["llm_calls"] >= 1 and out["halt_reason"] != "model_error", out.get("error")
    assert out["state_value"] is not None
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    with pytest.raises(ValueError, match="model_kwargs"):  # they make a model from a name, never change a built one
        build_graph(model=FakeListChatModel(responses=["x"]), model_kwargs={"base_url": served},
                    config={"enable_state_monitor": False})


def test_eval_and_calibrate_take_the_served_model_and_its_monitor(served, tmp_path):
    data = tmp_path / "yn.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answer": a}) + "\n" for i, (q, a) in
                            enumerate([("Is vitamin C deficiency the cause of scurvy?", "yes"),
                                       ("Is insulin made in the liver?", "no")])))
    common = [*_served_args(served), "--scorer", served, "--max-steps", "1", "--max-new-tokens", "16",
              "--temperature", "0", "--no-progress"]
    result = runner.invoke(app, ["eval", "--dataset", str(data), "--method", "tcrag-cppl", *common,
                                 "--out", str(tmp_path / "eval")], env={KEY_ENV: API_KEY})
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r.get("error") is None or "model_error" not in str(r.get("error")) for r in rows)
    settings = (tmp_path / "eval").rglob("*.json")
    assert API_KEY not in "".join(p.read_text() for p in settings)
    result = runner.invoke(app, ["calibrate", "--dataset", str(data), *common, "--no-save",
                                 "--out", str(tmp_path / "cal")], env={KEY_ENV: API_KEY})
    assert result.exit_code == 0, result.output
    values = [json.loads(line) for line in (tmp_path / "cal" / "state_values.jsonl").read_text().splitlines()]
    assert values and all(v["value"] is None or v["value"] > 0 for v in values)


def test_serve_with_a_served_model_keeps_its_monitor(served, lm, tmp_path):
    """`tcrag serve --model openai:NAME --base-url --api-key-env --scorer`: the served run is the run
    `tcrag ask` makes with the same options (whose values the first test checks against the weights)."""
    import httpx

    from .helpers_servers import free_port, server_process, users_file

    options = ["--scorer", served, "--scorer-start-text", lm.tokenizer.bos_token, "--no-tools", "--max-steps", "2",
               "--max-new-tokens", "24", "--temperature", "0"]
    asked = runner.invoke(app, ["ask", Q, *_served_args(served), *options, "--json"], env={KEY_ENV: API_KEY})
    assert asked.exit_code in (0, 1), asked.output
    expected = json.loads(asked.stdout[asked.stdout.index("{"):])
    assert expected["state_value"] is not None and expected["halt_reason"] != "model_error"
    token = "serve-served-token-0123456789"
    users = users_file(tmp_path / "users.json", {token: {"identity": "tester"}})
    port = free_port()
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--users-file", str(users),
                     *_served_args(served), *options)
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp_path / "serve.log",
                        env={KEY_ENV: API_KEY}, timeout=120):
        body = {"input": {"messages": [{"type": "human", "content": Q}]}}
        r = httpx.post(f"http://127.0.0.1:{port}/tcrag/invoke", json=body,
                       headers={"Authorization": f"Bearer {token}"}, timeout=300)
        assert r.status_code == 200, r.text
    meta = r.json()["output"]["response_metadata"]
    assert meta["halt_reason"] == expected["halt_reason"] and meta["metric"] == "cppl"
    assert meta["state_value"] == pytest.approx(expected["state_value"], rel=1e-6)
    assert meta["stack"] == [f["action"] for f in expected["stack"]]
    assert API_KEY not in (tmp_path / "serve.log").read_text()


def test_studio_takes_its_model_and_monitor_from_the_environment(served, lm, monkeypatch):
    """Studio has no command line: TCRAG_MODEL / TCRAG_BASE_URL / TCRAG_API_KEY_ENV / TCRAG_SCORER name
    what --model / --base-url / --api-key-env / --scorer name for ask; the monitor keeps scoring."""
    from tcrag_langgraph.agent.spec import UserError
    from tcrag_langgraph.faces.studio import make_graph

    for name, value in (("TCRAG_MODEL", "openai:smollm2"), ("TCRAG_BASE_URL", served), ("TCRAG_API_KEY_ENV", KEY_ENV),
                        (KEY_ENV, API_KEY), ("TCRAG_SCORER", served),
                        ("TCRAG_SCORER_START_TEXT", lm.tokenizer.bos_token)):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TCRAG_STUDIO_SCRIPTED", raising=False)
    graph = make_graph(tools=False)
    out = graph.invoke({"question": Q}, context={"max_steps": 2, "max_new_tokens": 24, "temperature": 0.0})
    assert out["llm_calls"] >= 1 and out["halt_reason"] != "model_error", out.get("error")
    scored = _scored([e.model_dump() for e in out["trace"]])
    assert scored, out["trace"]
    local = LocalLMScorer(lm, prefix_cache=0)
    for text, value in scored:
        assert value == pytest.approx(local.score(Q, text, metric="cppl"), rel=1e-3)
    monkeypatch.setenv("TCRAG_API_KEY_ENV", "TCRAG_TEST_UNSET_KEY")
    monkeypatch.delenv("TCRAG_TEST_UNSET_KEY", raising=False)
    with pytest.raises(UserError, match="TCRAG_TEST_UNSET_KEY"):
        make_graph(tools=False)
