"""Runner: scoring, JSONL results, resume, settings check, summary files."""

from __future__ import annotations

import csv
import json

import pytest

from tcrag_langgraph import TCRAGConfig
from tcrag_langgraph.eval.datasets import QARecord
from tcrag_langgraph.methods.registry import build_methods
from tcrag_langgraph.eval.runner import SettingsMismatch, read_results, run_evaluation, score_answer
from tcrag_langgraph.eval.summary import summarize, summary_markdown, write_summary

from .helpers import TextScorer, make_doc_tool, model

RECS = [
    QARecord("q1", "Is aspirin an NSAID?", "yesno", ("yes",)),
    QARecord("q2", "Is insulin oral?", "yesno", ("no",)),
    QARecord("q3", "Pick", "mcq", ("B",), options={"A": "x", "B": "y", "C": "z"}),
]


def test_score_answer_per_task():
    assert score_answer(RECS[0], "Yes, it is.") == {"parsed": "yes", "correct": True}
    assert score_answer(RECS[1], "It depends") == {"parsed": None, "correct": False}
    assert score_answer(RECS[2], "I pick y") == {"parsed": "B", "correct": True}  # option text fallback
    open_rec = QARecord("o", "Explain", "open", ("aspirin inhibits cyclooxygenase",))
    s = score_answer(open_rec, "Aspirin inhibits cyclooxygenase.")
    assert s["em"] == 1.0 and s["f1"] == 1.0 and s["rouge_l_recall"] == 1.0 and 0 < s["bleu4"] <= s["bleu1"]


def _methods(answers):
    # No re-prompt for an answer out of format, so that an unparseable reply stays unparseable here
    # (re-prompting is tested in test_answer_format.py).
    return build_methods(["base"], model=model(*answers), config=TCRAGConfig(max_format_retries=0))


def test_rows_summary_and_unparseable_in_denominator(tmp_path):
    rows = run_evaluation(RECS, _methods(["Yes.", "It depends.", "B"]), progress=False)
    assert [r["correct"] for r in rows] == [True, False, True]
    s = summarize(rows)[0]
    assert (s["n"], s["correct"], s["unparseable"]) == (3, 2, 1)
    assert s["accuracy"] == pytest.approx(2 / 3)
    assert s["avg_llm_calls"] == 1.0 and s["avg_retrievals"] == 0.0
    paths = write_summary(summarize(rows, labels={"base": "Base"}), tmp_path)
    md = paths["markdown"].read_text()
    assert "| Base | 3 | 66.67 | " in md and " unparseable:1 " in md  # EM, its interval, the answers given
    table = list(csv.DictReader(paths["csv"].open()))
    assert table[0]["method"] == "base" and float(table[0]["accuracy"]) == pytest.approx(2 / 3)
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_are_appended_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "run"

    def interrupt_after_two(row):
        if row["id"] == "q2":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_evaluation(RECS, _methods(["Yes.", "No."]), out_dir=out, settings={"d": 1}, progress=False,
                       on_row=interrupt_after_two)
    assert [r["id"] for r in read_results(out / "results.jsonl")] == ["q1", "q2"]
    # Simulate a kill in the middle of writing the next row.
    with (out / "results.jsonl").open("a") as fh:
        fh.write('{"method": "base", "id": "q3", "ans')
    m = model("B")
    rows = run_evaluation(RECS, build_methods(["base"], model=m), out_dir=out, settings={"d": 1}, progress=False)
    assert len(m.seen) == 1  # only q3 was run again
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"] and all(r["correct"] for r in rows)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)
    # Stored rows are re-scored from their answers on resume.
    tampered = [json.loads(line) for line in lines]
    tampered[0]["correct"] = False
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tampered))
    rows = run_evaluation(RECS, build_methods(["base"], model=model("B")), out_dir=out, settings={"d": 1}, progress=False)
    assert rows[0]["correct"] is True


def test_a_different_experiment_in_the_same_folder_is_refused(tmp_path):
    run_evaluation(RECS[:1], _methods(["Yes."]), out_dir=tmp_path, settings={"sigma": 10}, progress=False)
    with pytest.raises(SettingsMismatch, match="sigma"):
        run_evaluation(RECS[:1], _methods(["Yes."]), out_dir=tmp_path, settings={"sigma": 5}, progress=False)
    with pytest.raises(SettingsMismatch, match="ids"):
        run_evaluation(RECS[:2], _methods(["Yes."]), out_dir=tmp_path, settings={"sigma": 10}, progress=False)


def test_corrupt_middle_line_is_an_error(tmp_path):
    f = tmp_path / "results.jsonl"
    f.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match=":2: corrupt"):
        read_results(f)


def test_seeded_runs_are_identical_and_exceptions_become_rows(tmp_path):
    class Exploding:
        def invoke(self, *a, **k):
            raise RuntimeError("graph bug")

    rows = run_evaluation(RECS[:1], {"boom": Exploding()}, progress=False)
    assert rows[0]["halt_reason"] == "exception" and not rows[0]["correct"] and "graph bug" in rows[0]["error"]

    import random

    class RandomAnswer:
        def invoke(self, state, config=None):
            return {"answer": random.choice(["yes", "no"])}

    a = run_evaluation(RECS * 1, {"r": RandomAnswer()}, seed=3, progress=False)
    b = run_evaluation(RECS * 1, {"r": RandomAnswer()}, seed=3, progress=False)
    assert [r["answer"] for r in a] == [r["answer"] for r in b]


def test_stack_machine_rows_carry_state_values_and_costs():
    graphs = build_methods(
        ["tcrag-cppl", "sr-rag"],
        model=model("Tool_Use: DOC_RAG\nTool_Input: aspirin", "Conclusion: yes"),
        tools=[make_doc_tool()],
        scorer=TextScorer({"yes": 2.0}),
    )
    rows = run_evaluation(RECS[:1], graphs, progress=False)
    tc, sr = rows
    react = build_methods(["react"], model=model("Thought: hmm", "Conclusion: yes"), scorer=TextScorer())
    row = run_evaluation(RECS[:1], react, progress=False)[0]
    assert row["correct"] and row["state_value"] is None  # monitor off: nothing measured (not the initial 1e9)
    assert tc["validated"] and tc["state_value"] == 2.0 and tc["retrievals"] == 1 and tc["llm_calls"] == 2
    # The shared script gives SR-RAG "Tool_Use: ..." first: not yes/no/maybe, so it is re-prompted once.
    assert sr["state_value"] is None and sr["retrievals"] == 1 and sr["llm_calls"] == 2
    assert sr["structured_answer"] == "yes" and tc["structured_answer"] == "yes"
    md = summary_markdown(summarize(rows))
    assert "Avg. Retrievals" in md and "Backtrack Prob. (%)" in md


def test_concurrent_runs_give_the_same_rows_in_the_same_order(tmp_path):
    """--concurrency 4 against --concurrency 1: the same greedy answers, halts and state values, the
    results file in the same order (so a run resumes the same way), more than one run in flight."""
    import threading
    import time as _time

    from tcrag_langgraph.methods.registry import build_methods

    from .helpers import DrugScorer, drug_model

    in_flight, peak, lock = [0], [0], threading.Lock()

    class SlowDrugModel(type(drug_model())):
        def _call(self, messages, stop=None, run_manager=None, **kwargs):
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            _time.sleep(0.05)  # a served model's latency, so runs overlap
            try:
                return super()._call(messages, stop=stop, run_manager=run_manager, **kwargs)
            finally:
                with lock:
                    in_flight[0] -= 1

    records = [QARecord(f"q{i}", f"Is drug {i} first-line?", "yesno", ("yes" if i < 3 else "no",)) for i in range(6)]
    keys = ("method", "id", "answer", "parsed", "correct", "halt_reason", "validated", "state_value", "llm_calls")
    outs = {}
    for n in (1, 4):
        graphs = build_methods(["base", "tcrag-cppl", "react"], model=SlowDrugModel(responses=["unused"], seen=[]),
                               scorer=DrugScorer(), sigmas={"cppl": 5.0})
        rows = run_evaluation(records, graphs, out_dir=tmp_path / f"n{n}", progress=False, concurrency=n)
        outs[n] = [tuple(r.get(k) for k in keys) for r in rows]
        in_file = [tuple(r.get(k) for k in keys) for r in read_results(tmp_path / f"n{n}" / "results.jsonl")]
        assert in_file == outs[n]
    assert outs[1] == outs[4] and len(outs[1]) == 18
    assert peak[0] > 1  # the second setting really ran several at once
    # A run stopped after 7 rows (and half a line) resumes at 4 in flight: the file it ends with is
    # the one-at-a-time file, and only the missing 11 runs were made.
    import shutil

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(tmp_path / "n1" / "run.json", resumed / "run.json")
    lines = (tmp_path / "n1" / "results.jsonl").read_text().splitlines(keepends=True)
    (resumed / "results.jsonl").write_text("".join(lines[:7]) + lines[7][:20])
    made = []
    graphs = build_methods(["base", "tcrag-cppl", "react"], model=SlowDrugModel(responses=["unused"], seen=[]),
                           scorer=DrugScorer(), sigmas={"cppl": 5.0})
    rows = run_evaluation(records, graphs, out_dir=resumed, progress=False, concurrency=4, on_row=made.append)
    assert len(made) == 11 and [tuple(r.get(k) for k in keys) for r in rows] == outs[1]
    assert [tuple(r.get(k) for k in keys) for r in read_results(resumed / "results.jsonl")] == outs[1]
    with pytest.raises(ValueError, match="concurrency"):
        run_evaluation(records, graphs, progress=False, concurrency=0)


def test_rows_keep_the_evidence_and_the_rejected_conclusions_and_what_a_rejection_changed():
    from tcrag_langgraph.eval.rejections import rejection_effects

    graphs = build_methods(
        ["tcrag-cppl", "sr-rag"],
        model=model("Conclusion: no", "Tool_Use: DOC_RAG\nTool_Input: aspirin", "Conclusion: yes"),
        tools=[make_doc_tool()],
        scorer=TextScorer({"yes": 2.0}, default=50.0),
    )
    tc, sr = run_evaluation(RECS[:1], graphs, progress=False)
    assert tc["rejected"] == ["no"] and tc["answer"] == "yes" and tc["validated"]
    assert tc["evidence"] == ["passage about aspirin"] and tc["metric"] == "cppl" and tc["sigma"] == 10.0
    assert sr["rejected"] == [] and sr["evidence"]  # SR-RAG's knowledge is its evidence
    effects = rejection_effects([tc, sr], RECS[:1])
    gold_yes = RECS[0].answers[0] == "yes"
    e = effects["tcrag-cppl"]
    assert (e.questions, e.rejected, e.changed) == (1, 1, 1)
    assert (e.wrong_to_right, e.right_to_wrong) == ((1, 0) if gold_yes else (0, 1))
    assert effects["sr-rag"].rejected == 0
    assert (e.tokens_with, e.calls_with) == (tc["total_tokens"], tc["llm_calls"]) and e.per_question(True)[1] == 3
    assert e.per_question(False) == (0.0, 0.0) and effects["sr-rag"].tokens_without == sr["total_tokens"] > 0
    # the row's short trace says what each step did, in order
    steps = [(e["action"], e["op"]) for e in tc["trace"]]
    assert steps == [("User_Query", "push"), ("Conclusion", "reject"), ("Tool_Use", "push"),
                     ("Conclusion", "push"), ("Halt", "halt")], steps
    assert tc["trace"][1]["content"] == "no" and tc["trace"][1]["value"] == 50.0
    call = next(e["detail"] for e in tc["trace"] if e["action"] == "Tool_Use")
    assert call["input"] == "aspirin" and call["error"] is None  # a tool call's detail stays an object


def test_a_long_tool_input_in_a_row_trace_never_hides_the_calls_error():
    from tcrag_langgraph.core.state import TraceEvent
    from tcrag_langgraph.eval.runner import TRACE_TEXT_CHARS, compact_trace

    detail = json.dumps({"tool": "DOC_RAG", "input": "x" * 500, "error": "repeated_call", "earlier_step": 1})
    row, = compact_trace([TraceEvent(step=3, action="Tool_Use", op="format_error", content="y" * 500, detail=detail)])
    assert row["detail"]["error"] == "repeated_call" and row["detail"]["earlier_step"] == 1
    assert len(row["detail"]["input"]) == TRACE_TEXT_CHARS and len(row["content"]) == TRACE_TEXT_CHARS
    plain, = compact_trace([TraceEvent(step=1, action="Backtrack", op="pop", detail="popped " + "z" * 500)])
    assert plain["detail"].startswith("popped") and len(plain["detail"]) == TRACE_TEXT_CHARS


def test_a_folder_another_process_is_writing_is_refused_until_that_process_ends(tmp_path):
    """Two writers would interleave their rows in one results.jsonl: the second is refused with a
    clear error, nothing of the folder changes, and the lock goes with the writer, even one killed."""
    import subprocess
    import sys

    from tcrag_langgraph.eval.runner import LOCK_FILE, RunFolderBusy

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom filelock import FileLock\n"
         f"lock = FileLock({str(out / LOCK_FILE)!r})\nlock.acquire()\nprint('held', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        records = [QARecord("q1", "Is aspirin an NSAID?", "yesno", ("yes",))]
        graphs = build_methods(["base"], model=model("yes"))
        with pytest.raises(RunFolderBusy, match="being written by another tcrag eval process"):
            run_evaluation(records, graphs, out_dir=out, progress=False)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # no settings, no rows
    finally:
        holder.kill()
        holder.wait()
    rows = run_evaluation(records, graphs, out_dir=out, progress=False)
    assert [r["answer"] for r in rows] == ["yes"] and len(read_results(out / "results.jsonl")) == 1


@pytest.mark.parametrize("records,options,message", [
    (RECS, {"concurrency": 0}, "concurrency must be a positive integer"),
    (RECS, {"concurrency": 2, "poison": object()}, "noise attack"),
    ([RECS[0], RECS[0]], {}, "record ids must be unique"),
])
def test_bad_arguments_are_refused_before_the_run_folder_is_made(records, options, message, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        run_evaluation(records, _methods(["Yes."]), out_dir=out, progress=False, **options)
    assert not out.exists()
