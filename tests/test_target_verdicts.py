"""scripts/target_verdicts.py on constructed rows whose verdicts are known by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tcrag_langgraph.eval.summary import summarize, table_rows

_spec = importlib.util.spec_from_file_location(
    "target_verdicts", Path(__file__).resolve().parent.parent / "scripts" / "target_verdicts.py")
target_verdicts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(target_verdicts)


def _row(method, qid, answer, gold, *, validated=False, tokens=100):
    return {"method": method, "id": qid, "task": "yesno", "gold": [gold], "answer": answer, "structured_answer": answer,
            "parsed": answer, "correct": answer == gold, "validated": validated, "halt_reason": "validated" if validated
            else "max_steps", "error": None, "llm_calls": 1, "retrievals": 1, "tool_errors": 0, "wall_time_s": 1.0,
            "prompt_tokens": tokens - 10, "completion_tokens": 10, "total_tokens": tokens, "backtracks": 0,
            "summaries": 0, "steps": 1}


def test_each_target_is_judged_from_the_rows():
    gold = ["yes"] * 6 + ["no"] * 4
    rows = []
    for i, g in enumerate(gold):
        q = f"q{i}"
        # TC-RAG right on 8 of 10, validated exactly on its right answers but one; 300 tokens
        rows.append(_row("tcrag-answer", q, g if i < 8 else ("no" if g == "yes" else "yes"),
                         g, validated=i < 7, tokens=300))
        rows.append(_row("sr-rag", q, "yes", g, tokens=50))                 # 6 of 10
        rows.append(_row("wo-monitor", q, g if i < 9 else "maybe", g, tokens=200))  # 9 of 10
        rows.append(_row("react", q, g if i % 2 else "maybe", g, tokens=500))      # 5 of 10
    lines = target_verdicts.verdicts(summarize(table_rows(rows)), rows, tcrag="tcrag-answer",
                                     ablation="wo-monitor", sr_rag="sr-rag", react="react")
    text = "\n".join(lines)
    assert "EM 80.0 %" in lines[0]
    assert "TC-RAG >= sr-rag: MET (80.0 vs 60.0; +2/-0 on 10 shared" in text
    assert "TC-RAG >= wo-monitor: NOT MET (80.0 vs 90.0; +0/-1" in text
    assert "majority row (" in text and "MET (80.0 vs 60.0)" in text  # always "yes": 6 of 10
    # validated 7 (all right) vs unvalidated 3 (1 right): 100 vs 33.3 %
    assert "validated answers right more often than unvalidated: MET (100.0 vs 33.3 %, 7 of 10 validated)" in text
    assert "by at least 10 points: MET (+66.7 points)" in text
    assert "tokens <= 0.7x react's: MET (300 vs 500 per question, 0.60x)" in text
    assert "tokens <= 0.7x wo-monitor's: NOT MET (300 vs 200 per question, 1.50x)" in text


def test_missing_methods_are_not_measured():
    rows = [_row("tcrag-answer", "q0", "yes", "yes", validated=True)]
    text = "\n".join(target_verdicts.verdicts(summarize(table_rows(rows)), rows, tcrag="tcrag-answer",
                                              ablation="wo-monitor", sr_rag="sr-rag", react="react"))
    assert "TC-RAG >= sr-rag: not measured" in text and "0.7x react's: not measured" in text
    assert "validated against unvalidated: not measured" in text
    assert target_verdicts.verdicts([], [], tcrag="tcrag-answer", ablation="a", sr_rag="b", react="c") == [
        "tcrag-answer: not in these runs; nothing to judge"]
