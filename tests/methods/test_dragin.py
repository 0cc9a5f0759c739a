"""DRAGIN (entropy-only RIND): a content token whose next-token entropy is above the threshold
triggers a retrieval; stopwords never do; the sentences before the trigger are kept."""

from __future__ import annotations

import pytest

from tcrag_langgraph.methods.registry import build_dragin_graph
from tcrag_langgraph.testing import ScriptedScorer, ScriptedTokenScorer, recording_model, scripted_tool

Q = "Is metformin first-line?"
REPLIES = ["It is the drug. The dose is 2 g. It is a cheap one.", "A dose of 1 g is usual.", "Answer: yes"]


def run(entropies, replies=REPLIES):
    model = recording_model(replies)
    graph = build_dragin_graph(model=model, tools=[scripted_tool("DOC_RAG", "Passage on {input}")],
                               scorer=ScriptedTokenScorer(entropies=entropies))
    return graph.invoke({"question": Q}), model


def test_a_high_entropy_content_token_triggers_and_the_sentences_before_it_are_kept():
    out, model = run({"dose": 4.0})
    assert out["tool_calls"] == 1 and [e["query"] for e in out["evidence"]] == ["metformin first-line dose"]
    assert out["draft"] == "It is the drug. A dose of 1 g is usual.\nAnswer: yes"
    assert "Passage on metformin first-line dose" in model.seen[1][-1].content
    assert "Your answer so far:\nIt is the drug." in model.seen[1][-1].content


def test_stopwords_and_low_entropy_tokens_never_trigger():
    out, _ = run({"the": 9.0, "is": 9.0, "a": 9.0, "dose": 2.4})  # stopwords, and a content token below 2.5
    assert out["tool_calls"] == 0
    assert out["draft"].startswith("It is the drug. The dose is 2 g. It is a cheap one.")


def test_the_answer_label_is_format_and_never_triggers():
    out, _ = run({"answer": 9.0}, replies=["Answer: yes"])
    assert out["tool_calls"] == 0
    out, _ = run({"answer": 9.0}, replies=["The answer is unclear.", "Answer: yes"])
    assert out["tool_calls"] == 1  # the word inside a sentence is content


def test_the_continuation_ends_at_its_answer_line_and_kept_sentences_are_traced():
    out, _ = run({"dose": 4.0}, replies=["Answer: no\nThe dose is 2 g."])
    assert out["tool_calls"] == 0 and out["draft"] == "Answer: no" and out["llm_calls"] == 1
    out, _ = run({"dose": 4.0})
    kept = [e for e in out["trace"] if e.detail == "kept before the trigger"]
    assert [e.content for e in kept] == ["It is the drug."]


def test_the_threshold_is_an_option_overridable_per_run():
    model = recording_model(REPLIES)
    graph = build_dragin_graph(model=model, tools=[scripted_tool("DOC_RAG", "x")],
                               scorer=ScriptedTokenScorer(entropies={"dose": 4.0}), options={"entropy_threshold": 5.0})
    assert graph.invoke({"question": Q})["tool_calls"] == 0
    assert graph.invoke({"question": Q}, context={"entropy_threshold": 3.0})["tool_calls"] == 1
    with pytest.raises(ValueError, match="entropy_threshold"):
        build_dragin_graph(model=model, scorer=ScriptedTokenScorer(), options={"entropy_threshold": -1})


def test_a_scorer_without_entropies_halts_with_a_clear_reason():
    graph = build_dragin_graph(model=recording_model(REPLIES), tools=[scripted_tool("DOC_RAG", "x")], scorer=ScriptedScorer())
    out = graph.invoke({"question": Q})
    assert out["halt_reason"] == "scorer_error" and "token_stats" in out["error"]
