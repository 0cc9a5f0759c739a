"""``review_unvalidated``: a run that would end with an answer the state monitor did not validate
pauses for a person (LangGraph ``interrupt``), on every method, and resumes with the reviewer's
decision (issue 37, item 5). Studio's resume through the real API is in tests/test_studio.py."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from tcrag_langgraph import build_graph
from tcrag_langgraph.core.kernel import REVIEW_NODE
from tcrag_langgraph.methods.registry import build_method
from tcrag_langgraph.testing import ScriptedScorer, recording_model

Q = "Is aspirin a non-steroidal anti-inflammatory drug?"


def _paused(graph, thread: str, question: str = Q, **context):
    config = {"configurable": {"thread_id": thread}}
    out = graph.invoke({"question": question}, config, context=context or None)
    return config, out


def _tcrag(replies, score: float):
    """TC-RAG whose Conclusions all score ``score`` (sigma 10: above it, never validated)."""
    return build_graph(model=recording_model(replies), scorer=ScriptedScorer({}, default=score),
                       config={"max_steps": 2, "review_unvalidated": True, "answer_format": ["yes", "no"]},
                       checkpointer=InMemorySaver())


def test_an_unvalidated_answer_waits_for_the_reviewer_and_approval_validates_it():
    graph = _tcrag(["Conclusion: yes"], score=50)
    config, out = _paused(graph, "t-approve")
    state = graph.get_state(config)
    assert state.next == (REVIEW_NODE,)
    (pause,) = state.tasks[0].interrupts
    assert pause.value["answer"] == "yes" and pause.value["halt_reason"] == "repeated_conclusion"
    assert "approve" in pause.value["instructions"]
    done = graph.invoke(Command(resume="approve"), config)
    assert done["answer"] == "yes" and done["answer_validated"] is True and done["halt_reason"] == "reviewed"
    assert "not validated by the state monitor (repeated_conclusion); approved by the reviewer" == done["error"]
    assert done["messages"][-1].response_metadata["answer_validated"] is True
    assert graph.get_state(config).next == ()


def test_the_reviewer_can_answer_instead_or_reject():
    graph = _tcrag(["Conclusion: yes"], score=50)
    config, _ = _paused(graph, "t-answer")
    done = graph.invoke(Command(resume={"answer": "no"}), config)
    assert (done["answer"], done["structured_answer"], done["answer_validated"]) == ("no", "no", True)
    assert done["halt_reason"] == "reviewed" and "answered by the reviewer" in done["error"]
    config, _ = _paused(graph, "t-reject")
    done = graph.invoke(Command(resume="reject"), config)
    assert done["answer"] == "yes" and done["answer_validated"] is False and done["halt_reason"] == "repeated_conclusion"
    assert "the reviewer did not approve it" in done["error"]


def test_a_validated_answer_and_a_run_without_the_option_do_not_pause():
    graph = _tcrag(["Conclusion: yes"], score=1)  # below sigma: validated by the monitor
    config, out = _paused(graph, "t-valid")
    assert out["answer_validated"] is True and out["halt_reason"] == "validated"
    assert graph.get_state(config).next == ()
    config, out = _paused(_tcrag(["Conclusion: yes"], score=50), "t-off", review_unvalidated=False)
    assert out["halt_reason"] == "repeated_conclusion"  # the option per run, through the context


def test_every_method_pauses_the_same_way():
    """The review is the run kernel's: a baseline's answer (never validated) pauses too."""
    graph = build_method("base", model=recording_model(["yes"]), config={"review_unvalidated": True},
                         checkpointer=InMemorySaver())
    config, out = _paused(graph, "t-base")
    assert graph.get_state(config).next == (REVIEW_NODE,)
    done = graph.invoke(Command(resume={"approve": True}), config)
    assert done["answer_validated"] is True and done["halt_reason"] == "reviewed"


@pytest.mark.parametrize("field", ["review_unvalidated", "require_review"])
def test_a_server_client_cannot_ask_for_a_pause_it_cannot_resume(field):
    from tcrag_langgraph.core.config import request_option_fields

    assert field not in request_option_fields()  # the operator decides (tcrag serve --review-unvalidated)
