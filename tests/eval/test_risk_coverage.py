"""Risk-coverage curves, AURC and the validated answers' error rate (tcrag_langgraph.eval.risk_coverage)."""

from __future__ import annotations

import math
import random

import pytest

from tcrag_langgraph.eval.risk_coverage import (aurc, plot_risk_coverage, risk_coverage, risk_coverage_markdown,
                                                validated_errors)


def _rows(method: str, pairs, *, validated_below=None):
    return [{"method": method, "id": f"q{i}", "correct": c, "generation_values": {} if v is None else {"gen_answer_prob": v},
             "validated": validated_below is not None and v is not None and v < validated_below}
            for i, (v, c) in enumerate(pairs)]


def test_a_value_that_ranks_right_answers_first_has_the_smaller_area():
    rng = random.Random(0)
    correct = [rng.random() < 0.6 for _ in range(200)]
    informative = _rows("a", [(rng.random() * 0.5 if c else 0.5 + rng.random() * 0.5, c) for c in correct])
    shuffled = _rows("b", [(rng.random(), c) for c in correct])
    curves = risk_coverage(informative + shuffled)
    good, chance = aurc(curves["a"]["gen_answer_prob"]), aurc(curves["b"]["gen_answer_prob"])
    error = 1 - sum(correct) / len(correct)
    acc = 1 - error
    assert good == pytest.approx(error + acc * math.log(acc), abs=0.01)  # the best any ranking can do
    assert good < 0.15 < chance and chance == pytest.approx(error, abs=0.1)
    # at full coverage every curve ends at the method's error rate
    assert curves["a"]["gen_answer_prob"][-1] == (1.0, pytest.approx(error))


def test_questions_without_a_value_come_last():
    rows = _rows("m", [(None, True), (0.2, False), (0.1, True)])
    curve = risk_coverage(rows)["m"]["gen_answer_prob"]
    assert [round(r, 3) for _, r in curve] == [0.0, 0.5, 0.333]  # q0 (no value, right) accepted last


def test_the_validated_answers_error_rate_and_its_interval():
    rows = _rows("m", [(0.1, True)] * 18 + [(0.1, False)] * 2 + [(0.9, False)] * 20, validated_below=0.5)
    found = validated_errors(rows)["m"]
    assert (found["questions"], found["validated"], found["errors"]) == (40, 20, 2)
    assert found["coverage"] == 0.5 and found["error_rate"] == pytest.approx(0.1)
    low, high = found["error_interval"]
    assert low == pytest.approx(0.01235, abs=1e-4) and high == pytest.approx(0.31698, abs=1e-4)  # Clopper-Pearson
    none = validated_errors(_rows("n", [(0.9, True)], validated_below=0.5))["n"]
    assert none["error_rate"] is None and none["error_interval"] is None


def test_tables_and_plot(tmp_path):
    rows = _rows("tcrag-gen", [(0.1, True), (0.7, False)], validated_below=0.5) + _rows("react", [(0.3, True), (0.2, False)])
    table = risk_coverage_markdown(rows, labels={"tcrag-gen": "TC-RAG-gen"})
    assert "| TC-RAG-gen | 0.250 |" in table and "| react | 0.750 |" in table  # its wrong answer ranked first
    assert "| TC-RAG-gen | 2 | 50.0 | 1 | 50.0 | 0 | 0.0 (0.0-97.5) | 100.0 |" in table
    assert plot_risk_coverage(rows, tmp_path / "rc.png").stat().st_size > 1000
    assert plot_risk_coverage([{"method": "x", "correct": True}], tmp_path / "none.png") is None
    assert risk_coverage_markdown([{"method": "x", "correct": True, "validated": False}]) == ""
