"""Every user error exits 2 with one clear line on stderr, never a traceback, and costs nothing:
no model is loaded and nothing is written. Each case is driven through the `tcrag` command."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tcrag_langgraph.faces.cli import app

from .helpers_servers import free_port

Q = "Which vitamin deficiency causes scurvy?"
runner = CliRunner()


def _one_line_refusal(result, *expected: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def empty_cache(tmp_path):
    """An empty model cache: loading the packaged model would convert it into this folder."""
    folder = tmp_path / "cache"
    folder.mkdir()
    return folder


@pytest.mark.parametrize("args,expected", [
    (["--model", "openai:gpt-x"], ["Missing credentials", "--api-key-env"]),
    (["--model", "openai:gpt-x", "--api-key-env", "TCRAG_TEST_UNSET_KEY"], ["Missing credentials", "TCRAG_TEST_UNSET_KEY"]),
    (["--model", "openai:gpt-x", "--api-key-env", "sk-live-0123456789"], ["Invalid option", "never the key itself"]),
    (["--dtype", "float8"], ["Invalid option", "--dtype", "float32"]),
    (["--device", "tpu"], ["Invalid option", "--device"]),
    (["--sigma", "auto"], ["Not calibrated", "tcrag calibrate"]),
    (["--sigma", "-3"], ["Invalid option", "--sigma"]),
    (["--method", "hykge"], ["Invalid option", "choose from"]),
    (["--scorer", "/no/such/model"], ["Invalid option", "--scorer"]),
    (["--base-url", "http://127.0.0.1:1/v1"], ["Invalid option", "provider:model"]),
    (["--model", "./no-such.gguf"], ["Invalid model", "does not exist"]),
    (["--es-url", "localhost:9200"], ["Invalid option", "--es-url"]),
])
def test_ask_refuses_user_errors_in_one_line_before_any_model_loads(args, expected, empty_cache):
    env = {"OPENAI_API_KEY": None, "TCRAG_TEST_UNSET_KEY": None, "TCRAG_CACHE_DIR": str(empty_cache)}
    line = _one_line_refusal(runner.invoke(app, ["ask", Q, *args], env=env), *expected)
    assert "sk-live-0123456789" not in line
    assert list(empty_cache.iterdir()) == []  # nothing converted, loaded or written


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused(empty_cache):
    _one_line_refusal(runner.invoke(app, ["ask", Q, "--device", "cuda"], env={"TCRAG_CACHE_DIR": str(empty_cache)}),
                      "Invalid option", "no CUDA GPU")


def test_an_unreachable_provider_is_one_line(monkeypatch):
    port = free_port()  # nothing listens there
    result = runner.invoke(app, ["ask", Q, "--model", "openai:served", "--base-url", f"http://127.0.0.1:{port}/v1",
                                 "--api-key-env", "TCRAG_TEST_KEY", "--no-state-monitor", "--no-tools", "--json"],
                           env={"TCRAG_TEST_KEY": "sk-test"})
    _one_line_refusal(result, "Model error", "Connection")


def test_index_that_finds_nothing_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_refusal(runner.invoke(app, ["index", str(tmp_path / "no-such-path")]), "nothing to index")
    assert not (tmp_path / ".tcrag").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("   \n")
    _one_line_refusal(runner.invoke(app, ["index", str(empty), "--out", str(tmp_path / "store")]), "nothing to index")
    assert not (tmp_path / "store").exists()


def test_serve_refuses_user_errors_in_one_line(empty_cache):
    env = {"OPENAI_API_KEY": None, "TCRAG_CACHE_DIR": str(empty_cache)}
    _one_line_refusal(runner.invoke(app, ["serve", "--model", "openai:gpt-x"], env=env), "Missing credentials")
    _one_line_refusal(runner.invoke(app, ["serve", "--sigma", "auto"], env=env), "Not calibrated")
    _one_line_refusal(runner.invoke(app, ["serve", "--dtype", "float8"], env=env), "--dtype")
    _one_line_refusal(runner.invoke(app, ["serve", "--host", "0.0.0.0"], env={**env, "TCRAG_AUTH_USERS": None}),
                      "without authentication")
    assert list(empty_cache.iterdir()) == []


@pytest.mark.parametrize("command", [["ask", Q], ["serve"]])
def test_a_script_refuses_model_flags_beside_it_and_a_bad_script_is_named(command, tmp_path, empty_cache):
    """--scripted replaces the model and its monitor: a model flag next to it would be silently
    ignored, so both faces refuse it (one rule, agent.spec.AgentSpec)."""
    script = tmp_path / "script.json"
    script.write_text('{"replies": ["Conclusion: yes"], "default_score": 1}', encoding="utf-8")
    env = {"TCRAG_CACHE_DIR": str(empty_cache)}
    line = _one_line_refusal(runner.invoke(app, [*command, "--scripted", str(script), "--dtype", "float16",
                                                 "--scorer", str(tmp_path)], env=env), "Invalid option")
    assert "--dtype, --scorer" in line and "--model" not in line  # the flags given, not a fixed list
    script.write_text("{not json", encoding="utf-8")
    _one_line_refusal(runner.invoke(app, [*command, "--scripted", str(script)], env=env), "Invalid script")
    assert list(empty_cache.iterdir()) == []


def test_eval_and_calibrate_refuse_missing_credentials_without_a_traceback(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "q0", "question": "Is aspirin an NSAID?", "answer": "yes"}\n')
    for command in ("eval", "calibrate"):
        result = runner.invoke(app, [command, "--dataset", str(data), "--model", "openai:gpt-x", "--api-key-env",
                                     "TCRAG_TEST_UNSET_KEY", "--out", str(tmp_path / command)],
                               env={"TCRAG_TEST_UNSET_KEY": None, "COLUMNS": "300"})
        _one_line_refusal(result, "TCRAG_TEST_UNSET_KEY", "is not set")
        assert not (tmp_path / command).exists()


@pytest.mark.parametrize("args,expected", [
    (["eval", "--dataset", "pubmedqa", "--out", "OUT", "--sigma-cppl", "abc"],
     ["Invalid option", "--sigma-cppl", "sigma must be a number or 'auto'", "tcrag eval --help"]),
    (["eval", "--dataset", "no-such-set", "--out", "OUT"], ["Invalid option", "--dataset", "no such file"]),
    (["eval", "--dataset", "medmcqa", "--split", "test", "--out", "OUT"], ["unknown MedMCQA split"]),
    (["eval", "--dataset", "pubmedqa", "--out", "OUT", "--sigma", "ppl=3"], ["--sigma", "METRIC=VALUE"]),
    (["calibrate", "--dataset", "pubmedqa"], ["Missing option '--out'", "tcrag calibrate --help"]),
    (["calibrate", "--dataset", "pubmedqa", "--out", "OUT", "--metric", "cppl,ppl"], ["--metric", "answer_prob"]),
    (["ask", "Q?", "--no-such-flag"], ["Usage", "No such option: --no-such-flag"]),
])
def test_usage_errors_of_every_command_are_one_line(args, expected, tmp_path):
    """typer's boxed usage screen is replaced by one line (kind, message, where help is) for every sub-command."""
    out = tmp_path / "out"
    result = runner.invoke(app, [str(out) if a == "OUT" else a for a in args], env={"COLUMNS": "80"})
    line = _one_line_refusal(result, *expected)
    assert "╭" not in result.output and "│" not in line  # no box
    assert not out.exists()


def test_version_and_help_in_the_users_words():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"tcrag {version('tcrag-langgraph')}"
    import typer.main

    checked = 0
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            # by kind, not class: typer >= 0.2x uses its own copy of click, whose Option is not click.Option
            if param.param_type_name == "option" and param.name != "help":
                checked += 1
                text = param.help or ""
                assert text, f"tcrag {name} {param.opts[0]} has no help"
                for internal in ("`", "tcrag_langgraph.", "TCRAGConfig", ":func:", "resolve_sigma"):
                    assert internal not in text, f"tcrag {name} {param.opts[0]}: {text!r}"
        assert "`" not in (command.help or ""), f"tcrag {name}'s description has reST markup"
    assert checked > 50, checked  # every command's options were read (none would pass vacuously)


def test_help_into_a_closed_pipe_ends_quietly():
    """`tcrag ask --help | head -1`: the reader goes away mid-help. The command ends without a
    traceback (the one-line error handler once raised AttributeError on every exit it did not expect)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "from tcrag_langgraph.faces.cli import app; app()", "ask", "--help"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**__import__("os").environ, "COLUMNS": "80"})
    assert child.stdout.read(1)  # the help has begun
    child.stdout.close()  # the reader leaves, like `head` after its lines
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) in (0, 1), stderr
    assert "Traceback" not in stderr and "AttributeError" not in stderr, stderr


def test_an_abort_is_one_word_not_a_traceback(monkeypatch):
    """typer turns an end of input inside a command into Abort; the handler must name it, not crash."""
    import typer

    from tcrag_langgraph.faces import cli

    group = typer.main.get_command(cli.app)
    monkeypatch.setattr(type(group).__mro__[1], "main", lambda *a, **k: (_ for _ in ()).throw(typer.Abort()))
    with pytest.raises(SystemExit) as exited:
        group.main(["ask", Q])
    assert exited.value.code == 1
