"""Calibration tests on constructed state values."""

from __future__ import annotations

import numpy as np
import pytest

from tcrag_langgraph.eval.calibration import calibrate, propose_sigma, state_value_auroc


def test_auroc_extremes_and_hand_computed():
    assert state_value_auroc([1, 2, 8, 9], [True, True, False, False]) == 1.0
    assert state_value_auroc([8, 9, 1, 2], [True, True, False, False]) == 0.0
    assert state_value_auroc([5, 5, 5, 5], [True, False, True, False]) == 0.5
    # Pairs (correct, wrong): values correct {1, 4}, wrong {3, 6}. Lower is better:
    # (1,3) ok, (1,6) ok, (4,3) bad, (4,6) ok -> 3/4.
    assert state_value_auroc([1, 4, 3, 6], [True, True, False, False]) == pytest.approx(0.75)


def test_auroc_needs_both_classes_and_skips_missing():
    with pytest.raises(ValueError, match="both correct and wrong"):
        state_value_auroc([1, 2], [True, True])
    assert state_value_auroc([1, None, 9, float("nan")], [True, False, False, True]) == 1.0
    with pytest.raises(ValueError, match="labels"):
        state_value_auroc([1, 2], [True])


def test_youden_sigma_on_separable_values():
    p = propose_sigma([3.0, 4.0, 9.0, 12.0], [True, True, False, False])
    assert p.sigma == pytest.approx(6.5)  # midpoint of the gap
    assert (p.tpr, p.fpr, p.objective, p.decision_accuracy, p.accept_rate) == (1.0, 0.0, 1.0, 1.0, 0.5)


def test_accept_is_strictly_below_sigma_and_ties_take_smallest():
    # correct {1, 2}, wrong {2, 10}: sigma 1.5 -> TPR 1/2, FPR 0, J=0.5;
    # sigma 6 -> TPR 1, FPR 1/2, J=0.5 (a tie): the smaller sigma wins.
    p = propose_sigma([1.0, 2.0, 2.0, 10.0], [True, True, False, False])
    assert p.sigma == pytest.approx(1.5) and p.objective == pytest.approx(0.5)


def test_accuracy_rule_differs_from_youden_on_imbalanced_data():
    # 8 correct spread out, 2 wrong in the middle.
    values = [1, 2, 3, 4, 5, 6, 7, 8, 4.5, 4.6]
    labels = [True] * 8 + [False] * 2
    youden = propose_sigma(values, labels, rule="youden")
    acc = propose_sigma(values, labels, rule="accuracy")
    # Accept all: accuracy 8/10. Below 4.5: 4 right accepts + 2 right rejects = 6/10.
    assert acc.sigma > 8 and acc.objective == pytest.approx(0.8)
    # Youden: sigma between 4 and 4.5 gives J = 4/8 - 0 = 0.5; accept all gives 0; best is 0.5
    # unless a later cut does better: below 8.5 gives J = 1 - 1 = 0. So sigma = 4.25.
    assert youden.sigma == pytest.approx(4.25) and youden.objective == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown rule"):
        propose_sigma(values, labels, rule="f1")


def test_youden_matches_sklearn_roc_curve():
    from sklearn.metrics import roc_curve

    rng = np.random.default_rng(0)
    correct = rng.random(300) < 0.6
    values = np.where(correct, rng.normal(8, 3, 300), rng.normal(12, 3, 300)).round(2)
    fpr, tpr, _ = roc_curve(correct, -values, drop_intermediate=False)
    best_j = float(np.max(tpr - fpr))
    p = propose_sigma(values.tolist(), correct.tolist())
    assert p.objective == pytest.approx(best_j)
    accepted = values < p.sigma
    assert p.tpr == pytest.approx(accepted[correct].mean()) and p.fpr == pytest.approx(accepted[~correct].mean())


def test_calibrate_summary():
    r = calibrate([1.0, 2.0, None, 7.0, 9.0], [True, True, False, False, True])
    assert (r.n, r.n_correct, r.n_wrong, r.n_missing) == (4, 3, 1, 1)
    assert r.median_correct == 2.0 and r.median_wrong == 7.0
    assert r.auroc == pytest.approx(2 / 3)  # pairs vs wrong 7: 1 ok, 2 ok, 9 bad
    assert r.to_dict()["proposal"]["sigma"] == r.sigma


# --- stored calibrations: sigma per model (issue 11 item 5) ---------------------------------------

import json  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from tcrag_langgraph.core.config import TCRAGConfig  # noqa: E402
from tcrag_langgraph.monitor.calibration import (  # noqa: E402
    Calibration,
    CalibrationNotFoundError,
    default_calibration_path,
    load_calibration,
    resolve_sigma,
    save_calibration,
)

H = "tests.eval.helpers"
from tcrag_langgraph.testing import ScriptedScorer  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(root))
    return root


def _calibration(**changes):
    values = dict(metric="cppl", sigma=6.5, auroc=0.81, model_id="qwen2.5-coder-0.5b-instruct",
                  dataset="pubmedqa:trainval", n=40)
    return Calibration(**{**values, **changes})


def test_default_location_is_under_the_cache_dir(cache):
    assert default_calibration_path("Qwen/Qwen2.5 0.5B", "uct") == cache / "calibration" / "Qwen_Qwen2.5_0.5B.uct.json"
    with pytest.raises(ValueError, match="unknown metric"):
        default_calibration_path("m", "ppl")


def test_save_then_load_round_trip(cache):
    stored = _calibration(details={"rule": "youden"})
    path = save_calibration(stored)
    assert path == default_calibration_path(stored.model_id, "cppl") and path.is_file()
    data = json.loads(path.read_text())
    assert {"metric", "sigma", "auroc", "model_id", "dataset", "n", "created"} <= set(data)
    assert data["created"].endswith("+00:00")
    assert load_calibration(model_id=stored.model_id, metric="cppl") == stored
    elsewhere = save_calibration(stored, cache / "mine.json")
    assert load_calibration(elsewhere, model_id=stored.model_id, metric="cppl").sigma == 6.5


def test_missing_or_mismatched_calibrations_are_clear_errors(cache):
    with pytest.raises(CalibrationNotFoundError, match="tcrag calibrate .*--metric uct"):
        load_calibration(model_id="m", metric="uct")
    path = save_calibration(_calibration(), cache / "c.json")
    with pytest.raises(ValueError, match="measured for model 'qwen2.5-coder-0.5b-instruct', not 'other'"):
        load_calibration(path, model_id="other", metric="cppl")
    with pytest.raises(ValueError, match="calibrates cppl, not uct"):
        load_calibration(path, model_id="qwen2.5-coder-0.5b-instruct", metric="uct")
    path.write_text('{"metric": "cppl", "sigma": -1}')
    with pytest.raises(ValueError, match="not a valid calibration file.*missing"):
        load_calibration(path, model_id="m", metric="cppl")
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a valid calibration file"):
        load_calibration(path, model_id="m", metric="cppl")
    for bad in (dict(sigma=0.0), dict(sigma=float("inf")), dict(auroc=1.5), dict(n=0), dict(model_id=" "),
                dict(metric="bleu")):
        with pytest.raises(ValueError):
            _calibration(**bad)


def test_resolve_sigma_for_numbers_defaults_and_auto(cache):
    assert resolve_sigma(TCRAGConfig(sigma=3.0), "m") == 3.0
    assert resolve_sigma(TCRAGConfig(metric="uct"), "m") == 20.0
    auto = TCRAGConfig(sigma="auto")
    with pytest.raises(ValueError, match="resolve_sigma"):
        auto.effective_sigma
    with pytest.raises(CalibrationNotFoundError):
        resolve_sigma(auto, "qwen2.5-coder-0.5b-instruct")
    save_calibration(_calibration())
    save_calibration(_calibration(metric="uct", sigma=0.9))
    assert resolve_sigma(auto, "qwen2.5-coder-0.5b-instruct") == 6.5
    assert resolve_sigma(auto.merged({"metric": "uct"}), "qwen2.5-coder-0.5b-instruct") == 0.9
    with pytest.raises(CalibrationNotFoundError):
        resolve_sigma(auto, "another-model")


def test_config_sigma_accepts_auto_and_numbers_only():
    assert TCRAGConfig(sigma=" Auto ").sigma == "auto"
    assert TCRAGConfig(sigma="2.5").sigma == 2.5
    for bad in ("automatic", True, 0, -1.0, float("nan"), "inf"):
        with pytest.raises(ValueError):
            TCRAGConfig(sigma=bad)


def test_calibrate_command_stores_what_sigma_auto_loads(app, data, tmp_path, cache):
    # Scripted: correct answers score 1-4, wrong ones 7-8 -> AUROC 1, Youden sigma 5.5 (see test_cli).
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer", f"{H}:drug_scorer",
            "--out", str(tmp_path / "cal"), "--no-progress", "--metric", "uct", "--model-id", "scripted-drugs"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    stored = load_calibration(model_id="scripted-drugs", metric="uct")
    assert (stored.sigma, stored.auroc, stored.n, stored.dataset) == (5.5, 1.0, 6, str(data))
    assert stored.details["rule"] == "youden" and stored.details["supported"] is True
    # stored per task (the JSONL file's name); without a task the only task's calibration is found
    assert stored.task == "yn" and str(default_calibration_path("scripted-drugs", "uct", "yn")) in result.output
    assert resolve_sigma(TCRAGConfig(metric="uct", sigma="auto"), "scripted-drugs") == 5.5
    assert resolve_sigma(TCRAGConfig(metric="uct", sigma="auto", calibration_task="yn"), "scripted-drugs") == 5.5
    with pytest.raises(CalibrationNotFoundError, match="on task 'medmcqa'"):
        resolve_sigma(TCRAGConfig(metric="uct", sigma="auto", calibration_task="medmcqa"), "scripted-drugs")


def test_calibrate_does_not_store_an_unsupported_sigma_unless_asked(app, data, tmp_path, cache):
    base = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer", f"{H}:reversed_drug_scorer",
            "--no-progress", "--model-id", "reversed"]
    result = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0 and "not stored" in result.output
    with pytest.raises(CalibrationNotFoundError):
        load_calibration(model_id="reversed", metric="cppl")
    target = tmp_path / "forced.json"
    result = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b"), "--save-unsupported",
                                      "--calibration-file", str(target)])
    assert result.exit_code == 0, result.output
    assert load_calibration(target, model_id="reversed", metric="cppl").details["supported"] is False
    assert not default_calibration_path("reversed", "cppl", "yn").exists()


def test_calibrate_without_a_model_id_measures_but_does_not_store(app, data, tmp_path, cache):
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer", f"{H}:drug_scorer",
            "--out", str(tmp_path / "c"), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "--model-id" in result.output and "AUROC" in result.output
    assert not (cache / "calibration").exists()


def test_calibrate_refuses_to_score_a_model_with_another_one(app, data, tmp_path, cache):
    """The default --scorer local means the generator's own weights; a scripted generator has none."""
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--out", str(tmp_path / "d"),
            "--no-progress", "--model-id", "scripted"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code != 0
    assert "--scorer" in result.output and "wo-monitor" in result.output  # the command's own words
    assert not (tmp_path / "d" / "results.jsonl").exists()


def test_eval_sigma_auto_uses_the_stored_calibration_of_the_model(app, data, tmp_path, cache):
    # yes scores 1.0: validated when sigma > 1, rejected (and repeated, so halted) when sigma < 1
    base = ["eval", "--dataset", str(data), "--method", "tcrag-cppl", "--model", f"{H}:named_yes_model",
            "--scorer", f"{H}:yes_low_scorer", "--no-progress", "--limit", "2", "--seed", "0"]
    missing = CliRunner().invoke(app, [*base, "--sigma-cppl", "auto", "--out", str(tmp_path / "a")],
                                 env={"COLUMNS": "300"})
    assert missing.exit_code != 0 and "scripted-named" in missing.output and "calibrate" in missing.output
    for sigma, validated in ((0.5, False), (2.0, True)):
        save_calibration(_calibration(model_id="scripted-named", sigma=sigma))
        out = tmp_path / f"s{sigma}"
        result = CliRunner().invoke(app, [*base, "--sigma-cppl", " AUTO", "--out", str(out)])
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert [r["validated"] for r in rows] == [validated, validated]
        assert json.loads((out / "run.json").read_text())["sigmas"] == {"cppl": sigma}
    for bad in ("abc", "0", "-1", "nan"):
        r = CliRunner().invoke(app, [*base, "--sigma-cppl", bad, "--out", str(tmp_path / "bad")], env={"COLUMNS": "300"})
        assert r.exit_code != 0 and "--sigma-cppl" in r.output


def test_calibrate_measures_both_metrics_on_one_run(app, data, tmp_path, cache):
    out = tmp_path / "both"
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer", f"{H}:drug_scorer",
            "--out", str(out), "--no-progress", "--metric", "cppl, uct", "--model-id", "scripted-both"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for metric in ("cppl", "uct"):
        report = json.loads((out / f"calibration.{metric}.json").read_text())
        assert report["metric"] == metric and report["auroc"] == 1.0
        assert len((out / f"state_values.{metric}.jsonl").read_text().splitlines()) == 6
        assert load_calibration(model_id="scripted-both", metric=metric).sigma == 5.5
    assert not (out / "calibration.json").exists()
    assert len((out / "results.jsonl").read_text().splitlines()) == 6  # the method ran once, not per metric
    refused = CliRunner().invoke(app, [*args, "--calibration-file", str(tmp_path / "x.json")], env={"COLUMNS": "300"})
    assert refused.exit_code != 0 and "one metric" in refused.output
    bad = CliRunner().invoke(app, [*args[:-4], "--metric", "cppl,ppl"], env={"COLUMNS": "300"})
    assert bad.exit_code != 0 and "--metric" in bad.output


def test_calibrate_measures_every_state_value_on_the_runs_own_evidence(app, data, tmp_path, cache):
    """--metric all: the evidence values and answer_prob are computed from what the run's tools returned
    (kept in results.jsonl), with the real packaged model's log-probs, by the stack machine's own rule;
    each is stored per model, task and metric."""
    from tcrag_langgraph.eval.datasets import format_question, load_dataset
    from tcrag_langgraph.monitor.state_values import (
        GENERATION_VALUES,
        STATE_VALUES,
        choice_value,
        evidence_context,
        token_logprobs_to_metric,
    )
    from tests.eval.helpers import packaged_scorer

    out = tmp_path / "all"
    args = ["calibrate", "--dataset", str(data), "--model", f"{H}:looking_drug_model", "--scorer",
            f"{H}:packaged_scorer", "--tools", f"{H}:doc_tools", "--out", str(out), "--no-progress", "--metric", "all",
            "--model-id", "scripted-looking", "--save-unsupported", "--temperature", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    records = {r.id: r for r in load_dataset(str(data))}
    assert {i: r["evidence"] for i, r in rows.items()} == {f"q{i}": [f"passage about drug {i}"] for i in range(6)}
    scorer = packaged_scorer()
    for metric in GENERATION_VALUES:  # a scripted model's replies carry no log-probs: missing, never made up
        values = {v["id"]: v["value"] for v in map(json.loads, (out / f"state_values.{metric}.jsonl").read_text().splitlines())}
        assert len(values) == 6 and all(v is None for v in values.values())
        assert f"cannot calibrate {metric}" in result.output
    for metric in (m for m in STATE_VALUES if m not in GENERATION_VALUES):
        values = {v["id"]: v["value"] for v in map(json.loads, (out / f"state_values.{metric}.jsonl").read_text().splitlines())}
        assert len(values) == 6 and all(v is not None for v in values.values())
        stored = load_calibration(model_id="scripted-looking", metric=metric, task="yn")
        assert stored.task == "yn" and default_calibration_path("scripted-looking", metric, "yn").is_file()
        for qid in ("q1", "q4"):  # one wrong "yes" and one wrong "no"
            question, answer = format_question(records[qid]), rows[qid]["answer"]
            context = evidence_context(question, rows[qid]["evidence"])
            if metric == "consistency":  # resampled by the (scripted) generator: k = 5 agreements or not
                assert round(values[qid] * 5, 6) in {0, 1, 2, 3, 4, 5}, values[qid]
                continue
            if metric in ("cppl", "uct"):
                expected = scorer.score(question, answer, metric=metric)
            elif metric == "answer_prob":
                expected = choice_value({c: sum(scorer.token_logprobs(context, f"Conclusion: {c}"))
                                         for c in ("yes", "no", "maybe")}, answer)
            else:
                expected = token_logprobs_to_metric(scorer.token_logprobs(context, answer), metric.split("_")[0])
            assert values[qid] == pytest.approx(expected, rel=1e-4), (metric, qid)  # cached prefixes: float noise
    # evidence changes the value: the evidence-conditioned cppl is not the paper's
    paper = {v["id"]: v["value"] for v in map(json.loads, (out / "state_values.cppl.jsonl").read_text().splitlines())}
    given = {v["id"]: v["value"] for v in map(json.loads, (out / "state_values.cppl_evidence.jsonl").read_text().splitlines())}
    assert all(abs(paper[q] - given[q]) > 1e-6 * paper[q] for q in paper)
    assert "best AUROC first" in result.output


def test_eval_tcrag_auto_picks_answer_prob_for_a_task_whose_answers_are_choices(app, data, tmp_path, cache):
    """tcrag eval builds its graphs before any run declares its answers: the runs' one answer format
    (yes/no/maybe here) must reach that choice, or sigma="auto" could never pick answer_prob."""
    from tcrag_langgraph.eval.datasets import task_name

    task = task_name(str(data))
    for metric, auroc, sigma in (("cppl", 0.60, 0.3), ("answer_prob", 0.90, 0.45)):
        save_calibration(_calibration(model_id="scripted-named", metric=metric, auroc=auroc, sigma=sigma, task=task,
                                      details={"supported": True}))
    out = tmp_path / "auto"
    result = CliRunner().invoke(app, ["eval", "--dataset", str(data), "--method", "tcrag-auto", "--model",
                                      f"{H}:named_yes_model", "--scorer", f"{H}:yes_likely_token_scorer",
                                      "--no-progress", "--limit", "2", "--seed", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["metric"], r["sigma"], r["validated"]) for r in rows] == [("answer_prob", 0.45, True)] * 2


def test_a_cppl_sigma_given_beside_tcrag_auto_is_tcrag_cppl_s_not_auto_s(app, data, tmp_path, cache):
    """--sigma-cppl once turned tcrag-auto into tcrag-cppl (its "auto" was replaced by the cppl sigma)."""
    from tcrag_langgraph.eval.datasets import task_name

    save_calibration(_calibration(model_id="scripted-named", metric="answer_prob", auroc=0.90, sigma=0.45,
                                  task=task_name(str(data)), details={"supported": True}))
    out = tmp_path / "both"
    result = CliRunner().invoke(app, ["eval", "--dataset", str(data), "--method", "tcrag-auto,tcrag-cppl",
                                      "--sigma-cppl", "1e6", "--model", f"{H}:named_yes_model",
                                      "--scorer", f"{H}:yes_likely_token_scorer", "--no-progress", "--limit", "1",
                                      "--seed", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = {json.loads(line)["method"]: json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()}
    assert (rows["tcrag-auto"]["metric"], rows["tcrag-auto"]["sigma"]) == ("answer_prob", 0.45)
    assert (rows["tcrag-cppl"]["metric"], rows["tcrag-cppl"]["sigma"]) == ("cppl", 1e6)


def test_sigma_auto_picks_the_state_value_with_the_best_auroc_on_the_task(cache):
    from tcrag_langgraph.monitor.calibration import resolve_monitor

    model = "scripted-named"  # NamedModel's id
    for metric, auroc, supported in (("cppl", 0.60, True), ("uct_evidence", 0.80, True), ("answer_prob", 0.90, True),
                                     ("cppl_evidence", 0.95, False)):
        save_calibration(_calibration(model_id=model, metric=metric, auroc=auroc, sigma=auroc / 2, task="pubmedqa",
                                      details={"supported": supported}))
    save_calibration(_calibration(model_id=model, metric="uct", auroc=0.99, sigma=7.0, task="medmcqa",
                                  details={"supported": True}))
    auto = TCRAGConfig(sigma="auto", calibration_task="pubmedqa")
    # answer_prob needs the allowed answers declared; the unsupported cppl_evidence is never picked
    assert resolve_monitor(auto, model) == ("uct_evidence", 0.4)
    assert resolve_monitor(auto.merged({"answer_format": ["yes", "no", "maybe"]}), model) == ("answer_prob", 0.45)
    assert resolve_monitor(TCRAGConfig(sigma="auto", calibration_task="medmcqa"), model) == ("uct", 7.0)
    # a metric the configuration sets itself stays; merging other options keeps it "not set"
    assert resolve_monitor(auto.merged({"metric": "cppl"}), model) == ("cppl", 0.3)
    assert resolve_monitor(auto.merged({"max_steps": 3}), model) == ("uct_evidence", 0.4)
    # several tasks and none named: which one is ambiguous for uct? only medmcqa has it -> found
    assert resolve_monitor(TCRAGConfig(sigma="auto", metric="uct"), model) == ("uct", 7.0)
    with pytest.raises(ValueError, match="say which one"):
        save_calibration(_calibration(model_id=model, metric="uct", auroc=0.5, sigma=2.0, task="pubmedqa"))
        resolve_monitor(TCRAGConfig(sigma="auto", metric="uct"), model)
    # the graph builds with what the calibration chose
    from tcrag_langgraph import build_graph
    from tests.eval.helpers import NamedModel

    out = build_graph(model=NamedModel(responses=["Conclusion: yes"]), scorer=ScriptedScorer(),
                      config=TCRAGConfig(sigma="auto", calibration_task="pubmedqa", max_steps=2)).invoke({"question": "q?"})
    assert (out["metric"], out["sigma"]) == ("uct_evidence", 0.4)


def test_medmcqa_calibration_split_is_disjoint_from_dev():
    from tcrag_langgraph.eval.datasets import load_dataset

    dev = {r.id for r in load_dataset("medmcqa")}
    calibration = {r.id for r in load_dataset("medmcqa", split="calibration")}
    everything = {r.id for r in load_dataset("medmcqa", split="all")}
    assert dev.isdisjoint(calibration) and dev | calibration == everything
    assert 0.08 < len(calibration) / len(everything) < 0.17
    with pytest.raises(ValueError, match="unknown MedMCQA split"):
        load_dataset("medmcqa", split="test")


def test_calibrate_reads_the_generation_values_off_the_runs_replies(app, tmp_path, cache):
    """--metric gen_answer_prob,gen_cppl with the packaged GGUF (llama.cpp): the runs ask the model for
    its tokens' log-probs and keep the final answer's values; calibrate measures those, with no pass
    after the run (the values in state_values.jsonl are the ones in results.jsonl)."""
    data = tmp_path / "yn.jsonl"  # golds the 135M model gets partly right (it tends to answer "no" first)
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Is drug {i} safe?",
                                        "answer": "no" if i in (0, 3) else "yes"}) + "\n" for i in range(6)))
    out = tmp_path / "gen"
    args = ["calibrate", "--dataset", str(data), "--out", str(out), "--no-progress", "--metric",
            "gen_answer_prob,gen_cppl", "--no-save", "--temperature", "0", "--max-steps", "2",
            "--max-new-tokens", "24"]
    result = CliRunner().invoke(app, args)
    rows = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert rows and all(r["halt_reason"] not in ("scorer_error", "model_error") for r in rows.values())
    recorded = {i: r["generation_values"] for i, r in rows.items() if r.get("generation_values")}
    assert recorded, "no run kept the log-probs of its answer's reply"
    assert all(0 <= g["gen_answer_prob"] <= 1 for g in recorded.values() if "gen_answer_prob" in g)
    assert all(g["gen_cppl"] >= 1 and g["gen_entropy"] >= 0 for g in recorded.values())
    if len({bool(r["correct"]) for r in rows.values()}) < 2:  # the 135M model may get all six wrong
        assert result.exit_code == 1 and "needs both correct and wrong answers" in result.output
        return
    for metric in ("gen_answer_prob", "gen_cppl"):
        values = {v["id"]: v["value"] for v in map(json.loads, (out / f"state_values.{metric}.jsonl").read_text()
                                                   .splitlines())}
        assert {i: v for i, v in values.items() if v is not None} == {
            i: g[metric] for i, g in recorded.items() if metric in g}


def test_the_bootstrap_interval_holds_the_auroc_and_narrows_with_more_answers():
    import random

    from tcrag_langgraph.eval.calibration import auroc_bootstrap_interval, state_value_auroc

    rng = random.Random(0)

    def sample(n):
        correct = [rng.random() < 0.5 for _ in range(n)]
        return [rng.gauss(0.0 if c else 0.8, 1.0) for c in correct], correct

    small, large = sample(60), sample(600)
    widths = []
    for values, correct in (small, large):
        low, high = auroc_bootstrap_interval(values, correct, seed=1)
        assert low < state_value_auroc(values, correct) < high
        assert auroc_bootstrap_interval(values, correct, seed=1) == (low, high)  # seeded
        widths.append(high - low)
    assert widths[1] < widths[0] / 2
    with pytest.raises(ValueError, match="both correct and wrong"):
        auroc_bootstrap_interval([0.1, 0.2], [True, True])
