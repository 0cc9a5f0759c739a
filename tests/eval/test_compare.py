"""`tcrag compare`: one method's rows from two runs under other settings, paired by question."""

from __future__ import annotations

import json

from typer.testing import CliRunner

H = "tests.eval.helpers"


def _eval(app, data, out, model, method="base"):
    args = ["eval", "--dataset", str(data), "--method", method, "--model", f"{H}:{model}", "--no-progress",
            "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


def test_compare_pairs_each_method_on_the_questions_both_runs_finished(app, data, tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    _eval(app, data, before, "always_yes_model")  # right on the three "yes" questions
    _eval(app, data, after, "yes_no_model")  # yes, no, yes, ...: right on all six
    result = CliRunner().invoke(app, ["compare", str(before), str(after)])
    assert result.exit_code == 0, result.output
    assert f'- model: "{H}:always_yes_model" -> "{H}:yes_no_model"' in result.output
    assert "| Base | 6 | 3 | 6 | +3/-0 | 0.25 | 1.00 -> 1.00 |" in result.output
    # a stopped run: compared on the questions both finished
    lines = (after / "results.jsonl").read_text().splitlines()
    (after / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    stopped = CliRunner().invoke(app, ["compare", str(before), str(after)])
    assert "| Base | 5 | 3 | 5 | +2/-0 |" in stopped.output
    # the same run twice: nothing differs, nothing changed
    same = CliRunner().invoke(app, ["compare", str(before), str(before)])
    assert "- none" in same.output and "| Base | 6 | 3 | 3 | +0/-0 | 1 |" in same.output


def test_compare_refuses_runs_of_other_questions_and_folders_without_a_run(app, data, tmp_path):
    _eval(app, data, tmp_path / "a", "always_yes_model")
    other_data = tmp_path / "other.jsonl"
    other_data.write_text(json.dumps({"id": "q0", "question": "Is it?", "answer": "no"}) + "\n")
    _eval(app, other_data, tmp_path / "b", "always_yes_model")
    refused = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")], env={"COLUMNS": "300"})
    assert refused.exit_code != 0 and "asked other questions" in refused.output and "dataset" in refused.output
    (tmp_path / "empty").mkdir()
    assert "holds no run" in CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "empty")],
                                                env={"COLUMNS": "300"}).output
    _eval(app, data, tmp_path / "c", "always_yes_model", method="cot")
    apart = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "c")], env={"COLUMNS": "300"})
    assert apart.exit_code != 0 and "share no method" in apart.output
