"""The `tcrag` command's fast paths (the real-model runs are in test_e2e_real_model.py)."""

from __future__ import annotations

from typer.testing import CliRunner

from tcrag_langgraph.cli import app

runner = CliRunner()


def test_help_lists_every_registered_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("ask", "index", "build-kg", "eval", "calibrate", "serve"):
        assert command in result.output


def test_bad_question_and_options_exit_2_without_loading_a_model():
    for args in (["ask", "   "], ["ask", "x" * 100_001], ["ask", "\x00\x01"], ["ask", "ok?", "--metric", "bleu"],
                 ["ask", "ok?", "--sigma", "-1"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)


def test_threads_must_be_positive():
    result = runner.invoke(app, ["ask", "ok?", "--threads", "0"])
    assert result.exit_code == 2
