"""The `tcrag` command: flags generated from TCRAGConfig, scripted runs end to end through the
command, and one run with the real packaged model and tools (slow)."""

from __future__ import annotations

import json
import typing
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from tcrag_langgraph.core.config import TCRAGConfig
from tcrag_langgraph.agent.flags import NOT_FLAGS, _flag_for, config_flags, config_from_flags
from tcrag_langgraph.agent.spec import FACE_DEFAULTS
from tcrag_langgraph.faces.cli import app

runner = CliRunner()
Q = "Which vitamin deficiency causes scurvy?"


def _script(tmp_path, **extra) -> str:
    script = {
        "replies": ["Tool_Use: DOC_RAG\nTool_Input: scurvy vitamin",
                    "Conclusion: Yes, vitamin C deficiency causes scurvy."],
        "tools": {"DOC_RAG": "Scurvy is caused by a lack of vitamin C ({input})."},
        "scores": {"Yes, vitamin C deficiency causes scurvy.": 2.0},
        **extra,
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    return str(path)


def _json(result) -> dict:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_help_lists_every_registered_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("ask", "index", "build-kg", "eval", "calibrate", "serve"):
        assert command in result.output


def test_every_config_field_is_a_flag_or_excluded_with_a_reason():
    flagged = {flag.field for flag in config_flags()}
    assert flagged | set(NOT_FLAGS) == set(TCRAGConfig.model_fields)
    assert not flagged & set(NOT_FLAGS) and all(NOT_FLAGS.values())
    result = runner.invoke(app, ["ask", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for flag in config_flags():
        option = flag.parameter.default
        assert option.param_decls[0].split("/")[0] in result.output
        if option.help:
            assert option.help[:40] in " ".join(result.output.split())
    for own in ("--model", "--device", "--dtype", "--json", "--threads", "--seed", "--no-tools"):
        assert own in result.output
    assert "--caller" not in result.output and "--require-review" not in result.output


def test_flag_shapes_follow_the_field_types():
    class Options(BaseModel):
        enable_widget: bool = True
        mode: Literal["a", "b"] = "a"
        limit: int = Field(default=3, description="How many.")
        threshold: Optional[float | Literal["auto"]] = None
        allowed: Optional[tuple[str, ...]] = None
        mapping: dict[str, int] = Field(default_factory=dict)

    fields = Options.model_fields
    widget = _flag_for("enable_widget", fields["enable_widget"]).parameter
    assert widget.default.param_decls == ("--widget/--no-widget",) and widget.default.default is None
    assert widget.annotation == Optional[bool]
    assert typing.get_args(typing.get_args(_flag_for("mode", fields["mode"]).parameter.annotation)[0]) == ("a", "b")
    limit = _flag_for("limit", fields["limit"]).parameter
    assert limit.annotation == Optional[int] and limit.default.help == "How many."
    assert _flag_for("threshold", fields["threshold"]).parameter.default.metavar == "NUMBER|auto"
    allowed = _flag_for("allowed", fields["allowed"])
    assert allowed.to_value("yes, no ,maybe") == ["yes", "no", "maybe"]
    with pytest.raises(TypeError, match="NOT_FLAGS"):
        _flag_for("mapping", fields["mapping"])


def test_only_flags_that_were_given_are_set_and_they_override_the_base():
    none_given = {flag.field: None for flag in config_flags()}
    defaults = config_from_flags(none_given)
    assert defaults.model_fields_set == set(FACE_DEFAULTS) and defaults.max_new_tokens == FACE_DEFAULTS["max_new_tokens"]
    assert config_from_flags({**none_given, "max_new_tokens": 500}).max_new_tokens == 500
    cfg = config_from_flags({**none_given, "max_steps": 3, "enable_summary": False, "answer_format": "yes,no"})
    assert cfg.model_fields_set == {"max_steps", "enable_summary", "answer_format", *FACE_DEFAULTS}
    assert (cfg.max_steps, cfg.enable_summary, cfg.answer_format) == (3, False, ("yes", "no"))
    # a flag equal to TCRAGConfig's default still overrides a base that differs (set, not guessed)
    base = TCRAGConfig(metric="uct", max_steps=7)
    merged = config_from_flags({**none_given, "metric": "cppl"}, base=base)
    assert (merged.metric, merged.max_steps) == ("cppl", 7)


def test_bad_question_and_options_exit_2_without_loading_a_model():
    for args in (["ask", "   "], ["ask", "x" * 100_001], ["ask", "\x00\x01"], ["ask", "ok?", "--metric", "bleu"],
                 ["ask", "ok?", "--sigma", "-1"], ["ask", "ok?", "--sigma", "lots"], ["ask", "ok?", "--max-steps", "0"],
                 ["ask", "ok?", "--answer-format", "yes,,no"], ["ask", "ok?", "--answer-format", "yes,YES"],
                 ["ask", "ok?", "--model", "/no/such/model"], ["ask", "ok?", "--model", "openai:x", "--device", "cpu"],
                 ["ask", "ok?", "--dtype", "int3"], ["ask", "ok?", "--scripted", "s.json", "--model", "x"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)


def test_threads_must_be_positive():
    result = runner.invoke(app, ["ask", "ok?", "--threads", "0"])
    assert result.exit_code == 2


def test_json_is_the_run_result_with_its_sources(tmp_path):
    result = runner.invoke(app, ["ask", Q, "--scripted", _script(tmp_path), "--json", "--answer-format", "yes,no"])
    data = _json(result)
    assert result.exit_code == 0
    assert data["answer"] == "Yes, vitamin C deficiency causes scurvy."
    assert data["structured_answer"] == "yes" and data["answer_validated"] is True
    assert data["halt_reason"] == "validated" and data["sigma"] == 10.0
    assert data["sources"] == [{"tool": "DOC_RAG", "tool_input": "scurvy vitamin", "step": 1}]
    assert data["trace"][-1]["op"] == "halt"


def test_live_view_ends_with_answer_status_sources_and_structured_answer(tmp_path):
    result = runner.invoke(app, ["ask", Q, "--scripted", _script(tmp_path), "--answer-format", "yes,no"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    tail = result.stdout[result.stdout.index("Answer:"):]
    assert "Answer: Yes, vitamin C deficiency causes scurvy." in tail
    assert 'Structured answer: "yes"' in tail
    assert "Status: validated" in tail
    assert 'step 1: DOC_RAG "scurvy vitamin"' in tail
    assert "Tool_Use" in result.stdout[:result.stdout.index("Answer:")]  # the live events came first


def test_config_flags_reach_the_run(tmp_path):
    thoughts = _script(tmp_path, replies=["Thought: one", "Thought: two", "Conclusion: no idea"],
                       scores={"no idea": 2.0}, default_score=50.0)
    data = _json(runner.invoke(app, ["ask", Q, "--scripted", thoughts, "--json", "--max-steps", "2"]))
    assert [e["action"] for e in data["trace"] if e["op"] == "push"][1:] == ["Thought", "Thought", "Conclusion"]
    assert data["steps"] == 3 and data["halt_reason"] == "validated" and data["answer"] == "no idea"
    # sigma below the conclusion's value: the same run is not validated
    data = _json(runner.invoke(app, ["ask", Q, "--scripted", thoughts, "--json", "--max-steps", "2", "--sigma", "1"]))
    assert data["answer_validated"] is False and data["sigma"] == 1.0
    # the script's own config is the base; a flag overrides it
    capped = _script(tmp_path, replies=["Thought: one", "Conclusion: no idea"], scores={"no idea": 2.0},
                     config={"max_steps": 1, "metric": "uct"})
    data = _json(runner.invoke(app, ["ask", Q, "--scripted", capped, "--json", "--metric", "cppl"]))
    assert data["metric"] == "cppl" and data["steps"] == 2


def test_no_answer_exits_1_and_says_why(tmp_path):
    script = _script(tmp_path, replies=["Conclusion: maybe"], config={"max_format_retries": 0})
    result = runner.invoke(app, ["ask", Q, "--scripted", script, "--json", "--answer-format", "yes,no"])
    data = _json(result)
    assert result.exit_code == 1 and data["answer"] is None and data["halt_reason"] == "format_error"


@pytest.mark.slow
def test_real_packaged_model_and_tools_live_view():
    """`tcrag ask` as a user runs it: packaged SmolLM2, the four default tools, the live view."""
    result = runner.invoke(app, ["ask", Q, "--max-steps", "2", "--max-new-tokens", "48", "--temperature", "0"],
                           env={"COLUMNS": "200"})
    assert result.exit_code in (0, 1), result.output
    assert "tools=DOC_RAG, WEB_SEARCH, KG_RAG, EMR_SEARCH" in result.stdout
    tail = result.stdout[result.stdout.index("Answer:"):]
    assert "Status:" in tail and "Sources:" in tail
    assert "#" in result.stdout[:result.stdout.index("Answer:")]  # at least one live event line


def test_readme_field_table_names_every_field_and_its_flag():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = [line for line in readme.split("## In your LangChain")[0].splitlines()
            if line.startswith("| `") and "|" in line[1:]]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert named == set(TCRAGConfig.model_fields)
    flags_cell = " ".join(row.split("|")[2] for row in rows)
    for flag in config_flags():
        option = flag.parameter.default.param_decls[0].split("/")[0]
        assert option.removeprefix("--") in flags_cell, option
    defaults = {name: row.split("|")[3] for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    for name in ("max_steps", "max_new_tokens", "temperature", "max_format_retries"):
        assert f"{TCRAGConfig.model_fields[name].default:g}" in defaults[name], name
