"""Algorithm 1 as pure functions: every rule checked without LangGraph, models or tools."""

import sys

import pytest

from tcrag_langgraph.core.state import Action, ToolCallRecord
from tcrag_langgraph.methods.tcrag import transitions as T
from tcrag_langgraph.methods.tcrag.transitions import HaltReason


def fresh(sigma=10.0, value=1e9):
    return T.start("What treats scurvy?", initial_state_value=value, sigma=sigma).machine()


def test_start_pushes_the_question_with_a_large_state_value():
    t = T.start("Q?", initial_state_value=1e9, sigma=10)
    assert [f.action for f in t.stack] == [Action.USER_QUERY]
    assert t.state_value == 1e9 and t.steps == 0 and t.event.op == "push" and t.halt is None


def test_thought_is_clamped_to_sigma_so_it_never_ends_the_run():
    t = T.thought(fresh(), "Vitamin C.", score=2.0)
    assert t.state_value == 10.0 and t.scored == 2.0 and t.halt is None
    assert t.stack[-1].state_before == 1e9 and t.stack[-1].state_after == 10.0
    assert T.thought(fresh(), "Vitamin C.", score=25.0).state_value == 25.0


def test_thought_without_monitor_keeps_the_value():
    t = T.thought(fresh(), "x", score=None)
    assert t.state_value == 1e9 and t.scored is None


def test_plan_and_tool_use_push_and_keep_the_value():
    m = T.thought(fresh(), "t", score=30.0).machine()
    p = T.plan(m, "search first")
    assert p.state_value == 30.0 and p.stack[-1].action is Action.PLAN and p.steps == 2
    record = ToolCallRecord(tool="DOC_RAG", tool_input="scurvy", observation="[1] vitamin C")
    u = T.tool_use(p.machine(), record)
    assert u.state_value == 30.0 and u.stack[-1].tool_call == record and u.event.content == "[1] vitamin C"


def test_backtrack_restores_the_value_from_before_the_popped_thought():
    m1 = T.thought(fresh(), "first", score=30.0).machine()
    m2 = T.thought(m1, "second", score=50.0).machine()
    b = T.backtrack(m2)
    assert b.event.op == "pop" and b.state_value == 30.0 and b.state_set
    assert [f.content for f in b.stack[1:]] == ["first"]


def test_backtrack_of_a_non_thought_keeps_the_value():
    m = T.plan(T.thought(fresh(), "t", score=30.0).machine(), "p").machine()
    b = T.backtrack(m)
    assert b.state_value == 30.0 and not b.state_set


def test_nothing_to_pop_is_a_noop_not_an_exception():
    for t in (T.backtrack(fresh()), T.summary(fresh(), "s")):
        assert t.event.op == "noop" and len(t.stack) == 1 and t.steps == 1


def test_summary_replaces_the_top_frame():
    m = T.plan(fresh(), "long plan").machine()
    s = T.summary(m, "short")
    assert s.event.op == "pop+push" and [f.action for f in s.stack] == [Action.USER_QUERY, Action.SUMMARY]


def test_conclusion_below_sigma_validates_and_halts():
    t = T.conclusion(fresh(), "Vitamin C.", score=3.0)
    assert t.halt is HaltReason.VALIDATED and t.answer == "Vitamin C." and t.state_value == 3.0
    assert t.stack[-1].action is Action.CONCLUSION


def test_conclusion_at_or_above_sigma_becomes_a_thought_with_its_value():
    t = T.conclusion(fresh(), "Maybe B3.", score=10.0)  # f < sigma is strict
    assert t.halt is None and t.answer is None and t.event.op == "reject"
    assert t.stack[-1].action is Action.THOUGHT and t.state_value == 10.0


def test_conclusion_without_monitor_is_accepted_unvalidated():
    t = T.conclusion(fresh(), "C", score=None)
    assert t.halt is HaltReason.CONCLUSION_UNMONITORED and t.answer == "C" and t.state_value == 1e9


def test_a_conclusion_the_monitor_cannot_judge_ends_the_run_whatever_its_value():
    t = T.unjudged_conclusion(fresh(), "Maybe B3.", score=12.0)  # rejected by conclusion(): noise here
    assert t.halt is HaltReason.MONITOR_CANNOT_JUDGE and t.answer == "Maybe B3." and t.state_value == 12.0
    assert t.stack[-1].action is Action.CONCLUSION and t.event.op == "push" and t.event.state_value == 12.0
    assert T.unjudged_conclusion(fresh(), "C", score=3.0).halt is HaltReason.VALIDATED  # the kernel marks it unjudged
    assert T.unjudged_conclusion(fresh(), "C", score=None).halt is HaltReason.CONCLUSION_UNMONITORED


def test_review_rejection_turns_the_conclusion_back_into_a_thought():
    accepted = T.conclusion(fresh(), "C", score=3.0)
    r = T.review_reject(accepted.machine(), "check the dose")
    assert r.stack[-1].action is Action.THOUGHT and "check the dose" in r.stack[-1].content
    assert r.state_value == 10.0 and r.steps == accepted.steps


def test_unverified_answer_is_the_topmost_model_text_never_an_observation():
    m = T.thought(fresh(), "my guess", score=30.0).machine()
    m = T.tool_use(m, ToolCallRecord(tool="X", observation="evidence")).machine()
    assert T.unverified_answer(m.stack) == "my guess"
    assert T.unverified_answer(fresh().stack) is None


def test_module_needs_no_model_or_graph_builder():
    import subprocess

    code = ("import sys, tcrag_langgraph.methods.tcrag.transitions; "
            "bad = [m for m in ('torch', 'transformers', 'tcrag_langgraph.methods.tcrag.graph') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_rejection_past_max_rejections_ends_the_run_with_that_conclusion():
    m = fresh(sigma=10)
    assert T.limited_conclusion(m, "Insulin", score=30.0, rejections=0, max_rejections=1).event.op == "reject"
    t = T.limited_conclusion(m, "Insulin", score=30.0, rejections=1, max_rejections=1)
    assert t.halt is HaltReason.REJECTIONS_SPENT and t.answer == "Insulin" and t.state_value == 30.0
    assert t.stack[-1].action is Action.CONCLUSION and "ended unvalidated" in t.event.detail
    assert T.limited_conclusion(m, "Metformin", score=3.0, rejections=5, max_rejections=0).halt is HaltReason.VALIDATED
    assert T.limited_conclusion(m, "x", score=None, rejections=5, max_rejections=0).halt is HaltReason.CONCLUSION_UNMONITORED
    rejected = T.conclusion(m, "Insulin", score=30.0)
    assert T.rejections_so_far([rejected.event]) == 1 and T.rejections_so_far([]) == 0


@pytest.mark.parametrize("reason", list(HaltReason))
def test_halt_reasons_are_plain_strings(reason):
    assert isinstance(reason.value, str) and HaltReason(reason.value) is reason
