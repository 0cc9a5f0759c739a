"""`tcrag eval` / `tcrag calibrate` with scripted models, tools and scorers (module:callable)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

H = "tests.eval.helpers"


def test_eval_writes_results_summary_and_plot(app, data, tmp_path):
    out = tmp_path / "run"
    args = ["eval", "--dataset", str(data), "--method", "base,tcrag-cppl", "--model", f"{H}:always_yes_model",
            "--scorer", f"{H}:yes_low_scorer", "--out", str(out), "--no-progress", "--limit", "4", "--seed", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["method"] for r in rows} == {"base", "tcrag-cppl"}
    # Always "yes": correct exactly on the questions whose gold label is yes.
    for r in rows:
        assert r["correct"] == (r["gold"] == ["yes"])
    assert all(r["validated"] for r in rows if r["method"] == "tcrag-cppl")
    assert "| TC-RAG-cppl | 4 |" in result.output
    assert (out / "summary.md").exists() and (out / "summary.csv").exists() and (out / "accuracy_vs_cost.png").exists()
    # The same command again resumes: nothing new is run, the same table comes out.
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and len((out / "results.jsonl").read_text().splitlines()) == 8
    # Other settings into the same folder are refused.
    other = CliRunner().invoke(app, [*args[:-2], "--seed", "2"])
    assert other.exit_code != 0 and "other settings" in other.output
    # Questions in flight at once: the same rows and table, and the majority-answer row beside the methods.
    par = CliRunner().invoke(app, [*args[:-7], "--out", str(tmp_path / "par"), "--no-progress", "--limit", "4",
                                   "--seed", "1", "--concurrency", "3"])
    assert par.exit_code == 0, par.output
    assert (tmp_path / "par" / "results.jsonl").read_text().count("\n") == 8
    assert [json.loads(x)["answer"] for x in (tmp_path / "par" / "results.jsonl").read_text().splitlines()] == [
        r["answer"] for r in rows]
    assert "Majority answer" in par.output and "EM 95% CI" in par.output


def test_eval_noise_attack_needs_tools_and_marks_rows(app, data, tmp_path):
    base = ["eval", "--dataset", str(data), "--method", "tcrag-cppl", "--model", f"{H}:tool_then_yes_model",
            "--scorer", f"{H}:yes_low_scorer", "--no-progress", "--attack", "structural", "--noise", "irrelevant"]
    refused = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a")])
    assert refused.exit_code != 0 and "needs tools" in refused.output
    in_flight = CliRunner().invoke(app, [*base, "--tools", f"{H}:doc_tools", "--out", str(tmp_path / "c"),
                                         "--concurrency", "2"], env={"COLUMNS": "300"})
    assert in_flight.exit_code != 0 and "--concurrency 1" in in_flight.output
    out = tmp_path / "b"
    result = CliRunner().invoke(app, [*base, "--tools", f"{H}:doc_tools", "--out", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["poisoned"] and r["retrievals"] == 1 for r in rows)
    assert "Attacked (%)" in (out / "summary.md").read_text()


def test_eval_rejects_bad_options(app, data, tmp_path):
    r = CliRunner().invoke(app, ["eval", "--dataset", str(data), "--method", "hykge", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "unknown methods" in r.output
    r = CliRunner().invoke(app, ["eval", "--dataset", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)],
                           env={"COLUMNS": "300"})
    assert r.exit_code != 0 and "not a known dataset" in r.output


def test_calibrate_reports_auroc_and_sigma(app, data, tmp_path):
    out = tmp_path / "cal"
    # Drugs 0-2 get "yes", 3-5 "no"; gold is yes for even numbers, so q1 and q4 are wrong.
    # Values: correct q0=1, q2=2, q3=3, q5=4; wrong q1=7, q4=8 -> AUROC 1, Youden sigma (4+7)/2.
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer", f"{H}:drug_scorer",
            "--out", str(out), "--no-progress", "--metric", "uct"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "calibration.json").read_text())
    assert report["auroc"] == 1.0 and report["proposal"]["sigma"] == 5.5 and report["metric"] == "uct"
    assert (report["n_correct"], report["n_wrong"], report["n_missing"]) == (4, 2, 0)
    values = [json.loads(line) for line in (out / "state_values.jsonl").read_text().splitlines()]
    assert [v["value"] for v in values] == [1.0, 7.0, 2.0, 3.0, 8.0, 4.0]
    assert "AUROC (lower value = correct): 1.000" in result.output and "warning" not in result.output


def test_calibrate_needs_both_classes(app, data, tmp_path):
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:always_yes_model", "--scorer",
            f"{H}:yes_low_scorer", "--out", str(tmp_path / "c"), "--no-progress", "--limit", "1", "--seed", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "cannot calibrate" in result.output


def test_calibrate_warns_when_values_carry_no_signal(app, data, tmp_path):
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer",
            f"{H}:reversed_drug_scorer", "--out", str(tmp_path / "w"), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "AUROC (lower value = correct): 0.000" in result.output and "warning: the state value" in result.output


def test_calibrate_crp_rag_stores_its_sufficiency_threshold_for_auto(app, data, tmp_path, monkeypatch):
    """CRP-RAG's threshold is calibrated like sigma: the path scores of a run that never abstains,
    stored under <model>+crp-rag, then read by sufficiency_threshold="auto"."""
    from tcrag_langgraph.methods.registry import build_method
    from tcrag_langgraph.monitor.calibration import default_calibration_path
    from tests.eval.helpers import crp_model, doc_tools, reasoning_drug_scorer

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "cal"
    args = ["calibrate", "--dataset", str(data), "--method", "crp-rag", "--model", f"{H}:crp_model",
            "--scorer", f"{H}:reasoning_drug_scorer", "--tools", f"{H}:doc_tools", "--out", str(out), "--no-progress",
            "--temperature", "0", "--method-options", '{"crp-rag": {"sufficiency_threshold": 0.5}}']
    refused = CliRunner().invoke(app, [*args[:-2], "--metric", "uct", "--out", str(tmp_path / "u")],
                                 env={"COLUMNS": "300"})
    assert refused.exit_code != 0 and "sufficiency is measured in cppl" in refused.output
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["halt_reason"] != "abstained" for r in rows)  # the given 0.5 was overridden
    report = json.loads((out / "calibration.json").read_text())
    # path scores: correct (drugs 0, 2, 4) 1.0, 2.0, 1.5; wrong 8.0 -> Youden threshold (2 + 8) / 2
    assert report["method"] == "crp-rag" and report["auroc"] == 1.0 and report["proposal"]["sigma"] == 5.0
    stored = default_calibration_path("scripted-named+crp-rag", "cppl", "yn")  # stored per task
    assert stored.exists() and f"stored for sufficiency_threshold='auto' (model 'scripted-named+crp-rag'): {stored}" \
        in result.output.replace("\n", ""), result.output
    graph = build_method("crp-rag", model=crp_model(), tools=doc_tools(), scorer=reasoning_drug_scorer(),
                         options={"sufficiency_threshold": "auto"})
    answered = graph.invoke({"question": "Is drug 2 safe?"})
    abstained = graph.invoke({"question": "Is drug 3 safe?"})
    assert answered["halt_reason"] != "abstained" and abstained["halt_reason"] == "abstained"


def test_eval_model_names_go_through_resolve_chat_model(app, data, tmp_path, monkeypatch):
    from tcrag_langgraph.agent.spec import AgentSpec
    from tcrag_langgraph.core.config import TCRAGConfig
    from tcrag_langgraph.models.local import LocalChatModel

    def resolve_model(name, *, max_new_tokens, temperature):  # as tcrag eval names its model
        return AgentSpec(model=name, config=TCRAGConfig(max_new_tokens=max_new_tokens,
                                                        temperature=temperature)).generator()

    # A .gguf path and a folder become LocalChatModel with the run's settings (nothing is loaded yet).
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    m = resolve_model(str(gguf), max_new_tokens=77, temperature=0.0)
    assert isinstance(m, LocalChatModel) and m.max_new_tokens == 77 and m.temperature == 0.0
    # A module:callable factory is still a factory; an unknown provider name is a clear usage error.
    assert type(resolve_model(f"{H}:always_yes_model", max_new_tokens=1, temperature=0.0)).__name__ == "RecordingChatModel"
    r = CliRunner().invoke(app, ["eval", "--dataset", str(data), "--method", "base", "--model", "nosuch-provider:x",
                                 "--out", str(tmp_path / "o"), "--no-progress"], env={"COLUMNS": "300"})
    assert r.exit_code != 0 and "nosuch-provider:x" in r.output and "module:callable" in r.output
    # A provider name is LangChain's init_chat_model with the run's settings (ChatOpenAI is built
    # without any network call; a served vLLM is the same with base_url).
    monkeypatch.setenv("OPENAI_API_KEY", "test-key-not-used")
    served = resolve_model("openai:served-model", max_new_tokens=33, temperature=0.0)
    assert type(served).__name__ == "ChatOpenAI" and served.model_name == "served-model" and served.max_tokens == 33


@pytest.mark.parametrize("method,module,function", [
    ("crp-rag", "crp_rag", "CRPRAG"), ("kag-thinker", "kag_thinker", "KAGThinker"),
])
def test_eval_gives_the_scorer_to_the_paper_methods_that_read_log_probs(app, data, tmp_path, monkeypatch, method,
                                                                        module, function):
    """CRP-RAG (sufficiency) and KAG-Thinker (likelihood test) score with --scorer, as TC-RAG does."""
    import importlib

    from tcrag_langgraph.methods.registry import build_method

    seen = {}

    def fake_builder(*, model, tools, scorer, config, **extra):
        seen.update(scorer=scorer, extra=extra)
        return build_method("base", model=model, config=config)

    monkeypatch.setattr(getattr(importlib.import_module(f"tcrag_langgraph.methods.{module}"), function), "build",
                        fake_builder)
    args = ["eval", "--dataset", str(data), "--method", method, "--model", f"{H}:always_yes_model",
            "--scorer", f"{H}:yes_low_scorer", "--out", str(tmp_path / "o"), "--no-progress", "--limit", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert type(seen["scorer"]).__name__ == "TextScorer" and seen["extra"] == {"options": None, "name": method}


def test_diffrag_indexes_the_documents_the_docs_tool_would_give(monkeypatch):
    """DiffRAG builds its own graph instead of calling tools: with --tools docs it reads the evaluated
    questions' own abstracts (real packaged data), and with --exclude-eval-docs as many others."""
    from tcrag_langgraph.eval import cli
    from tcrag_langgraph.eval.datasets import load_dataset, sample_records

    records = sample_records(load_dataset("pubmedqa", split="test", with_context=False), limit=3, seed=0)
    ids = {r.id for r in records}
    docs = cli._indexed_documents(["base", "diffrag"], "docs", records, False)
    assert {d.source_id for d in docs} == ids and all(d.sections for d in docs)
    others = cli._indexed_documents(["diffrag"], "web, docs", records, True)
    assert len(others) == 3 and not ids & {d.source_id for d in others}
    assert cli._indexed_documents(["diffrag"], "web", records, False) is None
    assert cli._indexed_documents(["base", "tcrag-cppl"], "docs", records, False) is None


def test_eval_method_options_are_validated_and_recorded_with_the_run(app, data, tmp_path, monkeypatch):
    import importlib

    from tcrag_langgraph.methods.registry import build_method

    common = ["eval", "--dataset", str(data), "--model", f"{H}:always_yes_model", "--scorer", f"{H}:yes_low_scorer",
              "--no-progress", "--limit", "1"]
    for bad, says in (("{nope", "not JSON"), ('{"crp-rag": 2}', "JSON object of objects"),
                      ('{"kag-thinker": {}}', "not run"),
                      ('{"crp-rag": {"fan_out": 99}}', "fan_out")):
        r = CliRunner().invoke(app, [*common, "--method", "crp-rag", "--method-options", bad,
                                     "--out", str(tmp_path / "bad")], env={"COLUMNS": "300"})
        assert r.exit_code != 0 and says in r.output, (bad, r.output)
    r = CliRunner().invoke(app, [*common, "--method", "base", "--method-options", '{"base": {"x": 1}}',
                                 "--out", str(tmp_path / "bad")], env={"COLUMNS": "300"})
    assert r.exit_code != 0 and "takes no method options" in r.output
    assert not (tmp_path / "bad").exists()  # nothing was run or written

    seen = {}

    def fake_builder(*, model, tools, scorer, config, **extra):
        seen.update(extra)
        return build_method("base", model=model, config=config)

    monkeypatch.setattr(importlib.import_module("tcrag_langgraph.methods.crp_rag").CRPRAG, "build", fake_builder)
    out = tmp_path / "crp"
    args = [*common, "--method", "crp-rag", "--method-options", '{"crp-rag": {"fan_out": 1}}', "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert seen == {"options": {"fan_out": 1}, "name": "crp-rag"}
    assert json.loads((out / "run.json").read_text())["method_options"] == {"crp-rag": {"fan_out": 1}}
    # other options are other settings for a resumed run, but not for joining the runs of other methods
    other = CliRunner().invoke(app, [*args[:-4], "--method-options", '{"crp-rag": {"fan_out": 2}}', "--out", str(out)])
    assert other.exit_code != 0
    plain = tmp_path / "plain"
    assert CliRunner().invoke(app, [*common, "--method", "base", "--out", str(plain)]).exit_code == 0
    assert "method_options" not in json.loads((plain / "run.json").read_text())
    joined = CliRunner().invoke(app, ["summarize", str(plain), str(out)])
    assert joined.exit_code == 0 and "1 questions, 2 methods" in joined.output


def test_summarize_merges_runs_of_the_same_questions_on_the_questions_all_finished(app, data, tmp_path):
    common = ["--dataset", str(data), "--model", f"{H}:always_yes_model", "--scorer", f"{H}:yes_low_scorer",
              "--no-progress", "--limit", "4", "--seed", "1"]
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert CliRunner().invoke(app, ["eval", *common, "--method", "base", "--out", str(first)]).exit_code == 0
    assert CliRunner().invoke(app, ["eval", *common, "--method", "tcrag-cppl", "--sigma-cppl", "3",
                                    "--out", str(second)]).exit_code == 0
    # a stopped run: drop the last question of the second run
    lines = (second / "results.jsonl").read_text().splitlines()
    (second / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    result = CliRunner().invoke(app, ["summarize", str(first), str(second), "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert "3 questions, 2 methods" in result.output
    assert "| Base | 3 |" in result.output and "| TC-RAG-cppl | 3 |" in result.output
    assert (tmp_path / "s" / "summary.md").exists()
    every = CliRunner().invoke(app, ["summarize", str(first), str(second), "--all"])
    assert "| Base | 4 |" in every.output and "| TC-RAG-cppl | 3 |" in every.output
    # other questions, or the same method twice, are refused
    assert CliRunner().invoke(app, ["eval", *common[:-1], "2", "--method", "cot", "--out", str(other)]).exit_code == 0
    from tcrag_langgraph.eval.runner import merge_runs

    assert CliRunner().invoke(app, ["summarize", str(first), str(other)]).exit_code != 0
    with pytest.raises(ValueError, match=r"other settings \(.*seed"):
        merge_runs([first, other])
    with pytest.raises(ValueError, match="'base' is in both"):
        merge_runs([first, first])
    with pytest.raises(ValueError, match="no such folder"):
        merge_runs([tmp_path / "nothing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no run"):
        merge_runs([tmp_path / "empty"])


def test_runs_of_other_sizes_from_one_draw_are_compared_on_the_questions_both_hold(app, data, tmp_path):
    """As table 3 (100 questions, with a reply cache) beside table 1 (200, without)."""
    common = ["--dataset", str(data), "--model", f"{H}:always_yes_model", "--no-progress", "--seed", "1",
              "--temperature", "0"]
    big, small = tmp_path / "big", tmp_path / "small"
    assert CliRunner().invoke(app, ["eval", *common, "--limit", "5", "--method", "base", "--out", str(big)]).exit_code == 0
    assert CliRunner().invoke(app, ["eval", *common, "--limit", "3", "--method", "cot", "--reply-cache",
                                    "--out", str(small)]).exit_code == 0
    ids = [set(json.loads((f / "run.json").read_text())["ids"]) for f in (big, small)]
    shared = ids[0] & ids[1]
    assert shared and len(shared) < 5
    joined = CliRunner().invoke(app, ["summarize", str(big), str(small)])
    assert joined.exit_code == 0, joined.output
    assert f"{len(shared)} questions, 2 methods" in joined.output
    assert f"| Base | {len(shared)} |" in joined.output
    # every question of every run is not a table of paired rows: refused, with the way that works
    every = CliRunner().invoke(app, ["summarize", str(big), str(small), "--all"], env={"COLUMNS": "300"})
    assert every.exit_code != 0 and "ids, limit" in every.output and "common questions" in every.output


def test_summarize_counts_what_the_monitors_rejections_changed(app, data, tmp_path):
    """The questions are reloaded from run.json to read each first rejected Conclusion as a label."""
    run = tmp_path / "run"
    args = ["eval", "--dataset", str(data), "--method", "base", "--model", f"{H}:always_yes_model",
            "--out", str(run), "--no-progress", "--limit", "4", "--seed", "1"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "State-monitor rejections" not in first.output
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    yes_q = next(r for r in rows if r["gold"] == ["yes"])
    no_q = next(r for r in rows if r["gold"] == ["no"])
    yes_q["rejected"] = ["No, it is not."]  # rejected wrong, final "yes" right: wrong to right
    no_q["rejected"] = ["Yes."]  # the final answer is the rejected one: no change
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = CliRunner().invoke(app, ["summarize", str(run), "--out", str(tmp_path / "s")])
    assert table.exit_code == 0, table.output
    assert "| Base | 4 | 2 | 1 | 1 | 0 | 1 | 0 |" in table.output
    assert "| Base | 4 | 2 | 1 | 1 | 0 | 1 | 0 |" in (tmp_path / "s" / "rejections.md").read_text()
    # the dataset gone: the accuracy table still comes, with a line saying why the counts do not
    data.unlink()
    gone = CliRunner().invoke(app, ["summarize", str(run)])
    assert gone.exit_code == 0 and "| Base | 4 |" in gone.output
    assert "rejections not counted" in gone.output and "State-monitor rejections" not in gone.output


def test_summarize_reloads_questions_with_the_runs_own_field_names_and_index_base(app, tmp_path):
    """--fields is kept in run.json as the JSON text given, --answer-index-base beside it."""
    path = tmp_path / "mcq.jsonl"
    path.write_text("".join(json.dumps({"q": f"Which {i}?", "choices": ["x", "y"], "gold": 1}) + "\n" for i in range(2)))
    run = tmp_path / "run"
    args = ["eval", "--dataset", str(path), "--fields", '{"question": "q", "options": "choices", "answer": "gold"}',
            "--answer-index-base", "0", "--method", "base", "--model", f"{H}:always_yes_model",
            "--out", str(run), "--no-progress"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert json.loads((run / "run.json").read_text())["answer_index_base"] == 0
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    rows[0]["rejected"] = ["B"]  # right (index 1 of a 0-based list), and the final "yes" is no option
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = CliRunner().invoke(app, ["summarize", str(run)])
    assert table.exit_code == 0, table.output
    assert "rejections not counted" not in table.output
    assert "| Base | 2 | 1 | 1 | 0 | 1 | 0 | 1 |" in table.output
