"""Answers in the asked format in the evaluation harness (issue 11, item 3).

The direct methods (Base, CoT, SR-RAG) enforce ``answer_format`` like the stack machine's
Conclusion; the runner gives every method the format of each question; scoring reads
``structured_answer``; the summary reports validated vs unvalidated accuracy and repeated calls.
"""

from __future__ import annotations

import pytest
from langchain_core.tools import tool

from tcrag_langgraph import TCRAGConfig
from tcrag_langgraph.core.state import TraceEvent
from tcrag_langgraph.eval.datasets import QARecord, answer_format_for
from tcrag_langgraph.eval.runner import repeated_executed_calls, run_evaluation, score_answer
from tcrag_langgraph.eval.summary import summarize, summary_markdown
from tcrag_langgraph.methods.registry import build_method, build_methods

from .helpers import TextScorer, make_doc_tool, model

YNM = {"answer_format": ["yes", "no", "maybe"]}
YES_NO = QARecord("q1", "Is aspirin an NSAID?", "yesno", ("yes",))
PICK = QARecord("q2", "Which vessel leaves the left ventricle?", "mcq", ("B",), options={"A": "Vena cava", "B": "Aorta", "C": "Vein"})
MULTI = QARecord("q3", "Which are NSAIDs?", "mcq", ("A", "C"), options={"A": "ibuprofen", "B": "insulin", "C": "naproxen"})


def test_base_reply_out_of_format_is_re_prompted_with_what_is_allowed():
    m = model("It is a drug that many people take.", "Yes.")
    out = build_method("base", model=m).invoke({"question": "Is aspirin an NSAID?"}, context=YNM)
    assert (out["answer"], out["structured_answer"], out["llm_calls"], out["halt_reason"]) == ("Yes.", "yes", 2, "answered")
    assert "exactly one of: yes, no, maybe" in m.seen[0][0].content  # the rule is in the first prompt
    reprompt = m.seen[1]
    assert reprompt[-2].content == "It is a drug that many people take."
    assert "could not be used" in reprompt[-1].content and "yes, no, maybe" in reprompt[-1].content


def test_re_prompts_are_bounded_by_max_format_retries():
    m = model("B or C")
    graph = build_method("base", model=m, config=TCRAGConfig(max_format_retries=1))
    out = graph.invoke({"question": "Pick"}, context={"answer_format": ["A", "B", "C"]})
    assert out["llm_calls"] == 2 and len(m.seen) == 2
    assert out["structured_answer"] is None and out["halt_reason"] == "format_error"
    assert "names B, C" in out["error"] and out["answer"] == "B or C"


def test_without_a_format_the_direct_methods_are_unchanged():
    m = model("Probably.")
    out = build_method("base", model=m).invoke({"question": "Is it?"})
    assert out["llm_calls"] == 1 and out["structured_answer"] is None and "Conclusion" not in m.seen[0][0].content


def test_cot_checks_the_final_answer_line_only():
    m = model("Step 1: vena cava returns blood; the aorta leaves.\nAnswer: B")
    out = build_method("cot", model=m).invoke({"question": "Which?"}, context={"answer_format": ["A", "B", "C"]})
    assert out["structured_answer"] == "B" and out["llm_calls"] == 1


def test_cot_reads_the_answer_line_when_an_explanation_follows_it():
    # Qwen-0.5B on PubMedQA: the explanation after "Answer: no" names every option
    m = model('Answer: no\nExplanation:\nThe answer "no" is correct; "yes" and "maybe" are not.')
    out = build_method("cot", model=m).invoke({"question": "Does it?"}, context=YNM)
    assert (out["structured_answer"], out["llm_calls"], out["halt_reason"]) == ("no", 1, "answered")
    vague = model("Answer: yes or no\nmaybe")  # a line that does not fit is still re-prompted
    out = build_method("cot", model=vague, config=TCRAGConfig(max_format_retries=1)).invoke({"question": "Q?"}, context=YNM)
    assert out["structured_answer"] is None and out["llm_calls"] == 2


def test_sr_rag_calls_tools_through_the_tool_pipeline():
    @tool("BROKEN")
    def broken(query: str) -> str:
        """Always fails."""
        raise RuntimeError("index offline")

    @tool("LONG")
    def long_tool(query: str) -> str:
        """Returns a long text."""
        return "aspirin " * 2000

    m = model("yes")
    cfg = TCRAGConfig(max_observation_tokens=20)
    out = build_method("sr-rag", model=m, tools=[broken, long_tool], config=cfg).invoke({"question": "Q?"}, context=YNM)
    errors = [k for k in out["knowledge"] if "error" in k]
    texts = [k for k in out["knowledge"] if "text" in k]
    assert len(errors) == 1 and "index offline" in errors[0]["error"] and errors[0]["tool"] == "BROKEN"
    assert texts[0]["text"].endswith("…[trimmed]") and len(texts[0]["text"].split()) < 40
    assert out["tool_calls"] == 2 and out["structured_answer"] == "yes"


def test_answer_format_per_question():
    assert answer_format_for(YES_NO) == ("yes", "no", "maybe")
    assert answer_format_for(PICK) == ("A", "B", "C")
    fmt = answer_format_for(MULTI)  # several letters: a schema, not a single choice
    assert fmt.model_validate({"letters": ["C", "A"]}).letters == ["C", "A"]
    with pytest.raises(ValueError):
        fmt.model_validate({"letters": ["D"]})
    assert answer_format_for(QARecord("o", "Explain", "open", ("x",))) is None


def test_runner_gives_every_method_the_question_format():
    direct = model("The aorta.", "B")  # option text first: not a letter, re-prompted
    stack = model("Conclusion: the aorta carries blood", "Conclusion: B")
    graphs = {
        **build_methods(["base"], model=direct),
        **build_methods(["tcrag-cppl"], model=stack, scorer=TextScorer({"B": 1.0})),
    }
    rows = run_evaluation([PICK], graphs, progress=False)
    assert [(r["method"], r["structured_answer"], r["correct"]) for r in rows] == [("base", "B", True), ("tcrag-cppl", "B", True)]
    assert "exactly one of: A, B, C" in direct.seen[0][0].content
    assert any("exactly one of: A, B, C" in msg.content for msg in stack.seen[0])
    assert rows[1]["llm_calls"] == 2 and rows[1]["validated"]


def test_multi_answer_question_end_to_end():
    m = model('{"letters": ["A", "C"]}')
    rows = run_evaluation([MULTI], build_methods(["base"], model=m), progress=False)
    assert rows[0]["structured_answer"] == {"letters": ["A", "C"]} and rows[0]["correct"] and rows[0]["parsed"] == "AC"


def test_scoring_prefers_the_structured_answer():
    # The text alone parses as "no"; the structured answer says yes and is what is scored.
    assert score_answer(YES_NO, "No, not at all.", "yes") == {"parsed": "yes", "correct": True}
    assert score_answer(YES_NO, "No, not at all.") == {"parsed": "no", "correct": False}
    assert score_answer(PICK, "A is wrong", "B") == {"parsed": "B", "correct": True}
    assert score_answer(PICK, "A", "Z") == {"parsed": "A", "correct": False}  # not an option: text is parsed
    assert score_answer(MULTI, "", {"letters": ["C", "A"]}) == {"parsed": "AC", "correct": True}


def _tool_event(step, tool_name, tool_input, error=None):
    import json

    return TraceEvent(step=step, action="Tool_Use", op="push",
                      detail=json.dumps({"tool": tool_name, "input": tool_input, "error": error}))


def test_repeated_executed_calls_are_read_from_the_trace():
    trace = [
        TraceEvent(step=0, action="User_Query", op="push", content="q"),
        _tool_event(1, "DOC_RAG", "Vitamin C"),
        _tool_event(2, "KG_RAG", "vitamin c"),            # other tool: not a repeat
        _tool_event(3, "DOC_RAG", "vitamin  c!"),          # same call after normalising: a repeat run
        _tool_event(4, "DOC_RAG", "vitamin c", "repeated_call"),  # refused, not run: not counted here
        TraceEvent(step=5, action="Backtrack", op="pop"),
        _tool_event(6, "DOC_RAG", "VITAMIN C"),            # run again after a Backtrack: a repeat
    ]
    assert repeated_executed_calls(trace) == 2
    assert repeated_executed_calls([e.model_dump() for e in trace]) == 2  # dict form (a stored trace)
    assert repeated_executed_calls(None) == 0


def test_refused_repeats_come_from_the_graph():
    m = model("Tool_Use: DOC_RAG\nTool_Input: aspirin", "Tool_Use: DOC_RAG\nTool_Input: Aspirin", "Conclusion: yes")
    graphs = build_methods(["react"], model=m, tools=[make_doc_tool()])
    row = run_evaluation([YES_NO], graphs, progress=False)[0]
    assert row["repeated_refused_calls"] == 1 and row["repeated_executed_calls"] == 0 and row["retrievals"] == 1


def _row(method, correct, validated, *, parsed="yes", total_tokens=0, llm_calls=1, retrievals=0, wall=1.0,
         executed=0, refused=0):
    return {"method": method, "id": f"{method}{correct}{validated}{total_tokens}", "task": "yesno",
            "answer": parsed or "hmm", "parsed": parsed, "correct": correct, "validated": validated,
            "halt_reason": "validated" if validated else "max_steps", "llm_calls": llm_calls, "retrievals": retrievals,
            "wall_time_s": wall, "total_tokens": total_tokens, "prompt_tokens": total_tokens, "completion_tokens": 0,
            "repeated_executed_calls": executed, "repeated_refused_calls": refused}


def test_summary_columns_by_hand():
    rows = [
        _row("tc", True, True, total_tokens=100, llm_calls=2, retrievals=1, wall=2.0),
        _row("tc", True, True, total_tokens=300, llm_calls=4, retrievals=3, wall=4.0, executed=1),
        _row("tc", False, True, total_tokens=200, llm_calls=3, retrievals=2, wall=3.0, refused=2),
        _row("tc", False, False, parsed=None, total_tokens=400, llm_calls=7, retrievals=2, wall=11.0, refused=1),
        _row("base", True, False, total_tokens=50),
        _row("base", False, False, total_tokens=70, wall=3.0),
    ]
    tc, base = summarize(rows)
    # tc: 2 of 4 right; 3 validated, 2 of them right; the one unvalidated is unparseable and wrong.
    assert (tc["accuracy"], tc["unparseable"], tc["validated"]) == (0.5, 1, 3)
    assert tc["accuracy_validated"] == pytest.approx(2 / 3) and tc["accuracy_unvalidated"] == 0.0
    assert tc["avg_total_tokens"] == 250.0 and tc["avg_llm_calls"] == 4.0 and tc["avg_retrievals"] == 2.0
    assert tc["avg_wall_time_s"] == 5.0
    assert (tc["repeated_executed_calls"], tc["repeated_refused_calls"]) == (1, 3)
    assert base["validated"] == 0 and base["accuracy_validated"] is None and base["accuracy_unvalidated"] == 0.5
    md = summary_markdown(summarize(rows, labels={"tc": "TC"})).splitlines()
    header = [c.strip() for c in md[0].strip("|").split("|")]
    tc_cells = dict(zip(header, [c.strip() for c in md[2].strip("|").split("|")]))
    assert tc_cells["Method"] == "TC" and tc_cells["EM (%)"] == "50.00" and tc_cells["Unparseable"] == "1"
    assert tc_cells["Validated"] == "3/4" and tc_cells["EM validated (%)"] == "66.67"
    assert tc_cells["EM unvalidated (%)"] == "0.00" and tc_cells["Avg. Total Tokens"] == "250.00"
    assert tc_cells["Repeated Calls Run"] == "1" and tc_cells["Repeated Calls Refused"] == "3"
    assert tc_cells["Avg. Interactions"] == "4.00" and tc_cells["Avg. Retrievals"] == "2.00"
    assert tc_cells["Avg. Time (s)"] == "5.00"
