"""Tables that say what is real: intervals, paired tests, the majority row and answer counts, on
constructed runs whose values are known."""

from __future__ import annotations

import json

import pytest

from tcrag_langgraph.eval.summary import summarize, summary_markdown, table_rows
from tcrag_langgraph.eval.significance import MAJORITY, accuracy_ci, answer_counts, majority_rows, mcnemar


def yesno_rows(method: str, answers: list[str], golds: list[str]) -> list[dict]:
    return [{"method": method, "id": f"q{i}", "task": "yesno", "gold": [g], "answer": a, "parsed": a,
             "correct": a == g, "validated": False, "halt_reason": "answered"} for i, (a, g) in enumerate(zip(answers, golds))]


GOLD = ["yes"] * 15 + ["no"] * 5


def test_the_interval_is_a_seeded_bootstrap_around_the_accuracy():
    half = [True] * 50 + [False] * 50
    lo, hi = accuracy_ci(half)
    assert lo < 0.5 < hi and 0.15 < hi - lo < 0.25  # about +-1.96 * sqrt(.25/100) = +-0.098
    assert accuracy_ci(half) == (lo, hi)  # seeded: the same rows give the same interval
    narrow = accuracy_ci([True] * 500 + [False] * 500)
    assert narrow[1] - narrow[0] < hi - lo  # more questions, a narrower interval
    assert accuracy_ci([True] * 7) == (1.0, 1.0) and accuracy_ci([]) is None


def test_mcnemar_counts_the_discordant_questions_and_tests_them_exactly():
    a = [True] * 10 + [False] * 5 + [True] * 5
    b = [False] * 10 + [False] * 5 + [True] * 5
    test = mcnemar(a, b)
    assert (test.n, test.only_first, test.only_second) == (20, 10, 0)
    assert test.p_value == pytest.approx(2 * 0.5 ** 10)  # exact two-sided binomial
    assert mcnemar([True, False], [True, False]).p_value == 1.0  # no discordant pair: no evidence
    assert mcnemar([True, False, True, False], [False, True, False, True]).p_value == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mcnemar([True], [True, False])


def test_the_majority_row_answers_the_most_common_gold_answer():
    rows = yesno_rows("sr-rag", ["yes"] * 20, GOLD) + yesno_rows("tcrag-cppl", ["no"] * 20, GOLD)
    majority = majority_rows(rows)
    assert len(majority) == 20 and {r["parsed"] for r in majority} == {"yes"}  # once per question
    assert sum(r["correct"] for r in majority) == 15
    mcq = [{"method": "m", "id": str(i), "task": "mcq", "gold": g, "parsed": "A", "correct": False}
           for i, g in enumerate([["C"], ["C"], ["A", "B"], ["B", "A"], ["B", "A"]])]
    assert {r["parsed"] for r in majority_rows(mcq)} == {"AB"}  # gold letters sorted: AB (3 times) beats C (2)


def test_answer_counts_show_a_method_that_answers_the_same_to_everything():
    rows = yesno_rows("base", ["no"] * 18 + ["maybe", None], GOLD)  # type: ignore[list-item]
    assert answer_counts(rows) == {"no": 18, "maybe": 1, "unparseable": 1}


def test_every_table_has_intervals_paired_tests_and_the_majority_row():
    # SR-RAG right on 16 of 20, TC-RAG on 11: TC-RAG loses 5 questions SR-RAG wins, wins none
    sr = ["yes"] * 15 + ["no", "yes", "yes", "yes", "yes"]
    tc = ["yes"] * 10 + ["no"] * 5 + ["no", "yes", "yes", "yes", "yes"]
    rows = yesno_rows("sr-rag", sr, GOLD) + yesno_rows("tcrag-cppl", tc, GOLD)
    summary = {s["method"]: s for s in summarize(table_rows(rows), labels={"sr-rag": "SR-RAG", "tcrag-cppl": "TC-RAG-cppl"})}
    assert set(summary) == {"sr-rag", "tcrag-cppl", MAJORITY}
    assert summary["sr-rag"]["accuracy"] == pytest.approx(16 / 20) and summary["tcrag-cppl"]["accuracy"] == pytest.approx(11 / 20)
    vs = summary["tcrag-cppl"]["vs_sr_rag"]
    assert (vs.only_first, vs.only_second) == (0, 5) and vs.p_value == pytest.approx(2 * 0.5 ** 5)
    assert summary["sr-rag"]["vs_tcrag"].only_first == 5 and "vs_sr_rag" not in summary["sr-rag"]
    assert summary[MAJORITY]["accuracy"] == pytest.approx(0.75) and summary[MAJORITY]["label"] == "Majority answer (yes)"
    assert list(summary["tcrag-cppl"]["answer_counts"].items()) == [("yes", 14), ("no", 6)]  # most frequent first
    lo, hi = summary["sr-rag"]["accuracy_ci"]
    assert lo < 0.8 < hi
    md = summary_markdown(list(summary.values()))
    header = md.splitlines()[0]
    assert "EM 95% CI" in header and "vs SR-RAG (+/- McNemar p)" in header and "vs TC-RAG (+/- McNemar p)" in header
    assert "| TC-RAG-cppl | 20 | 55.00 | " in md and "+0/-5 p=0.0625" in md and "| Majority answer (yes) | 20 | 75.00 |" in md
    assert "yes:14 no:6" in md


def test_the_csv_keeps_the_paired_tests_when_a_reference_method_comes_first(tmp_path):
    """SR-RAG listed first has no test against itself; the CSV's columns must still hold the others'."""
    import csv

    from tcrag_langgraph.eval.summary import write_summary

    sr = ["yes"] * 15 + ["no", "yes", "yes", "yes", "yes"]
    tc = ["yes"] * 10 + ["no"] * 5 + ["no", "yes", "yes", "yes", "yes"]
    rows = yesno_rows("sr-rag", sr, GOLD) + yesno_rows("tcrag-cppl", tc, GOLD)
    paths = write_summary(summarize(table_rows(rows)), tmp_path)
    table = {r["method"]: r for r in csv.DictReader(paths["csv"].open())}
    assert json.loads(table["tcrag-cppl"]["vs_sr_rag"])["only_second"] == 5
    assert table["sr-rag"]["vs_sr_rag"] == "" and json.loads(table["sr-rag"]["vs_tcrag"])["only_first"] == 5
    assert list(table["sr-rag"])[-1] == "halt_reasons"
