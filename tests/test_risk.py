"""Validation with a stated risk and every answer's confidence (tcrag_langgraph.monitor.risk; issue 37
item 1): the certified threshold, its guarantee checked by simulation, the calibration that stores
what it needs, and TC-RAG validating (or refusing to) by it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tcrag_langgraph import build_graph
from tcrag_langgraph.core.config import TCRAGConfig, request_option_fields
from tcrag_langgraph.monitor.calibration import Calibration, CalibrationNotFoundError, save_calibration
from tcrag_langgraph.monitor.risk import binomial_upper_bound, confidence_at, risk_threshold
from tcrag_langgraph.testing import ScriptedScorer
from tests.eval.helpers import named_yes_model

H = "tests.eval.helpers"
Q = "Is aspirin an NSAID?"


@pytest.mark.parametrize("errors,n,delta", [(0, 10, 0.1), (3, 40, 0.05), (12, 200, 0.01), (59, 60, 0.2)])
def test_the_bound_is_clopper_pearson(errors, n, delta):
    from scipy.stats import beta

    assert binomial_upper_bound(errors, n, delta) == pytest.approx(beta.ppf(1 - delta, errors + 1, n - errors),
                                                                    abs=1e-9)
    assert binomial_upper_bound(n, n, delta) == 1.0


def _draw(rng, n):
    """State values in [0, 1) whose answers are right with probability 1 - 0.6 * value."""
    values = rng.random(n)
    return values, rng.random(n) < 1 - 0.6 * values


def test_the_guarantee_holds_in_simulation():
    """Over 300 calibration samples of 200 answers, the error rate among fresh answers validated at the
    certified sigma exceeds the risk in at most a delta share of them (with sampling slack)."""
    rng = np.random.default_rng(7)
    risk, delta, trials, violations, coverages = 0.2, 0.1, 300, 0, []
    for _ in range(trials):
        values, correct = _draw(rng, 200)
        found = risk_threshold(values.tolist(), correct.tolist(), risk=risk, delta=delta)
        if found is None:  # nothing certified: nothing validated, no violation possible
            coverages.append(0.0)
            continue
        assert found.bound <= risk and found.errors <= found.accepted
        fresh, right = _draw(rng, 5000)
        accepted = right[fresh < found.sigma]
        violations += (1 - accepted.mean()) > risk
        coverages.append(found.coverage)
    assert violations <= delta * trials
    assert 0.2 < np.mean(coverages) < 0.7  # not vacuous: a real share of the answers is validated


def test_nothing_is_certified_without_evidence_for_it():
    assert risk_threshold([0.1, 0.2, 0.3], [True, True, True], risk=0.1) is None  # three answers are too few
    assert risk_threshold([0.1] * 50 + [0.9] * 50, [False] * 50 + [True] * 50, risk=0.3) is None  # confident=wrong
    found = risk_threshold([0.1] * 60 + [0.9] * 60, [True] * 60 + [False] * 60, risk=0.1, delta=0.1)
    assert found.accepted == 60 and found.errors == 0 and 0.1 < found.sigma < 0.9  # ties go together
    with pytest.raises(ValueError, match="risk"):
        risk_threshold([0.1], [True], risk=1.5)


def test_risk_is_a_build_time_option_and_excludes_sigma():
    with pytest.raises(ValueError, match="risk or sigma"):
        TCRAGConfig(risk=0.1, sigma=5)
    assert TCRAGConfig(risk=0.1).risk_delta == 0.1
    assert "risk" not in request_option_fields() and "risk_delta" not in request_option_fields()


def _store(tmp_path, monkeypatch, values, correct, *, metric="cppl"):
    from tcrag_langgraph.eval.calibration import confidence_fit

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    save_calibration(Calibration(metric=metric, sigma=5.0, auroc=0.9, model_id="scripted-named", dataset="unit",
                                 n=len(values), details={"pairs": {"values": values, "correct": correct},
                                                         "confidence": confidence_fit(values, correct)}))


def _run(score, **config):
    graph = build_graph(model=named_yes_model(), scorer=ScriptedScorer({}, default=score),
                        config={"max_steps": 1, **config})
    return graph.invoke({"question": Q})


def test_tcrag_validates_by_the_certified_threshold_and_reports_confidence(tmp_path, monkeypatch):
    values = [1.0 + i / 10 for i in range(100)] + [20.0 + i / 10 for i in range(100)]
    correct = [True] * 100 + [False] * 100  # below 11: right; above 20: wrong
    _store(tmp_path, monkeypatch, values, correct)
    certified = risk_threshold(values, correct, risk=0.1, delta=0.1)
    assert certified is not None and certified.sigma > 10.9 and certified.errors / certified.accepted < 0.1
    out = _run(3.0, risk=0.1)
    assert out["answer_validated"] is True and out["sigma"] == pytest.approx(certified.sigma)
    assert out["confidence"] == pytest.approx(1.0)
    out = _run(25.0, risk=0.1)  # above the certified sigma: not validated, and its confidence says why
    assert out["answer_validated"] is False and out["confidence"] == pytest.approx(0.0)
    # without risk the paper's sigma decides, and the stored calibration still gives the confidence
    out = _run(3.0)
    assert out["sigma"] == 10.0 and out["confidence"] == pytest.approx(1.0)
    assert out["messages"][-1].response_metadata["confidence"] == pytest.approx(1.0)


def test_with_risk_only_a_first_conclusion_is_validated(tmp_path, monkeypatch):
    """The calibration measured first Conclusions: one written again after a rejection was selected for
    its low value, so under risk it ends the run unvalidated and without a confidence; the paper's sigma
    still validates it."""
    from tests.eval.helpers import NamedModel

    values = [1.0 + i / 10 for i in range(100)] + [20.0 + i / 10 for i in range(100)]
    _store(tmp_path, monkeypatch, values, [True] * 100 + [False] * 100)

    def run(**config):
        model = NamedModel(responses=["Conclusion: maybe", "Backtrack:", "Conclusion: yes"])
        scorer = ScriptedScorer({"maybe": 25.0, "yes": 3.0}, default=25.0, match="substring")
        return build_graph(model=model, scorer=scorer, config={"max_steps": 4, **config}).invoke({"question": Q})

    out = run(risk=0.1)
    assert [(e.action, e.op) for e in out["trace"] if e.action == "Conclusion"] == [("Conclusion", "reject"),
                                                                                     ("Conclusion", "push")]
    assert out["answer"] == "yes" and out["answer_validated"] is False
    assert out["halt_reason"] == "rewritten_conclusion" and "first Conclusion only" in out["error"]
    assert out["confidence"] is None
    assert out["messages"][-1].response_metadata["halt_reason"] == "rewritten_conclusion"
    out = run(sigma=10.0)  # the paper's threshold: its rule is Algorithm 1's, a rejection changes nothing
    assert out["answer"] == "yes" and out["answer_validated"] is True and out["halt_reason"] == "validated"


def test_a_calibration_that_certifies_nothing_validates_nothing_and_says_why(tmp_path, monkeypatch):
    _store(tmp_path, monkeypatch, [1.0, 2.0, 3.0, 4.0, 30.0], [True, True, False, True, False])
    out = _run(0.5, risk=0.05)
    assert out["answer_validated"] is False and out["halt_reason"] == "monitor_cannot_judge"
    assert "cannot certify an error rate of at most 0.05" in out["error"]


def test_risk_without_a_calibration_is_refused_when_the_graph_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(CalibrationNotFoundError, match="tcrag calibrate"):
        build_graph(model=named_yes_model(), scorer=ScriptedScorer({}, default=1.0), config={"risk": 0.1})
    out = build_graph(model=named_yes_model(), scorer=ScriptedScorer({}, default=1.0)).invoke(
        {"question": Q}, context={"max_steps": 1})
    assert out["confidence"] is None  # no calibration: no confidence, never a made-up one


def test_risk_asks_nothing_of_a_method_without_the_monitor(tmp_path, monkeypatch):
    # one risk for every row of an evaluation: ReAct and the ablation without the monitor judge nothing
    from tcrag_langgraph import build_agent

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "empty"))
    for method in ("react", "wo-monitor"):
        out = build_agent(method, model=named_yes_model(), scorer=ScriptedScorer({}, default=1.0),
                          config=TCRAGConfig(risk=0.2, max_steps=1)).invoke({"question": Q})
        assert out["halt_reason"] == "conclusion_unmonitored" and out["answer"] == "yes", out.get("error")


def test_calibrate_stores_the_answers_the_confidence_fit_and_the_risk_levels(tmp_path, monkeypatch):
    from tcrag_langgraph.faces.cli import app
    from tcrag_langgraph.monitor.calibration import load_calibration

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "yn.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Is drug {i} safe?",
                                        "answer": "yes" if i % 2 == 0 else "no"}) + "\n" for i in range(6)))
    result = CliRunner().invoke(app, ["calibrate", "--dataset", str(data), "--model", f"{H}:drug_model", "--scorer",
                                      f"{H}:drug_scorer", "--metric", "uct", "--model-id", "scripted-drug",
                                      "--out", str(tmp_path / "c"), "--no-progress"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "risk 0.1 (confidence 0.9): no threshold certified on this sample" in result.output  # 6 answers
    stored = load_calibration(model_id="scripted-drug", metric="uct", task="yn")
    assert sorted(stored.details["pairs"]["values"]) == [1.0, 2.0, 3.0, 4.0, 7.0, 8.0]
    assert [level["risk"] for level in stored.details["risk_levels"]] == [0.05, 0.1, 0.2, 0.3]
    fit = stored.details["confidence"]
    assert confidence_at(1.0, fit["thresholds"], fit["probabilities"]) == 1.0
    assert confidence_at(8.0, fit["thresholds"], fit["probabilities"]) == 0.0
