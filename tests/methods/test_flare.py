"""FLARE: a tentative sentence with a token below the probability threshold is the query, and is
written again with the evidence; a confident one is kept without retrieving."""

from __future__ import annotations

import math

import pytest

from tcrag_langgraph.core.state import TOOL_OUTPUT_OPEN
from tcrag_langgraph.methods.adaptive import scoring_context
from tcrag_langgraph.methods.registry import build_flare_graph
from tcrag_langgraph.testing import ScriptedScorer, ScriptedTokenScorer, recording_model, scripted_tool

Q = "Is metformin the first-line drug for type 2 diabetes?"
REPLIES = ["Metformin is first-line. More text.", "It is perhaps risky.", "It is safe in most patients.",
           "Answer: yes"]


def run(replies=REPLIES, *, p_perhaps=0.3, context=None, config=None, options=None):
    model = recording_model(replies)
    scorer = ScriptedTokenScorer(logprobs={"perhaps": math.log(p_perhaps)})
    graph = build_flare_graph(model=model, tools=[scripted_tool("DOC_RAG", "Passage on {input}")], scorer=scorer,
                              config=config, options=options)
    return graph.invoke({"question": Q}, context=context), model, scorer


def test_a_sentence_below_the_threshold_is_the_query_and_is_written_again_with_the_evidence():
    out, model, scorer = run()
    assert [e["query"] for e in out["evidence"]] == ["It is perhaps risky."]
    assert out["tool_calls"] == 1 and out["retrieval_rounds"] == 1
    assert out["draft"] == "Metformin is first-line. It is safe in most patients.\nAnswer: yes"
    assert out["answer"] == "yes" and out["halt_reason"] == "answered" and out["llm_calls"] == 4
    prompts = [call[-1].content for call in model.seen]
    # only the regenerated sentence saw the evidence, fenced as data
    assert [TOOL_OUTPUT_OPEN in p for p in prompts] == [False, False, True, False]
    assert "Passage on It is perhaps risky." in prompts[2]
    # each tentative sentence was scored given the question and the answer so far
    assert scorer.calls[:2] == [(scoring_context(Q, ""), "Metformin is first-line."),
                                (scoring_context(Q, "Metformin is first-line."), "It is perhaps risky.")]
    assert len(scorer.calls) == 3  # the regenerated sentence is not scored again; the answer line is


def test_a_sentence_at_or_above_the_threshold_does_not_retrieve_and_the_threshold_is_per_run():
    out, _, _ = run(context={"threshold": 0.25})  # P = 0.3 >= 0.25
    assert out["tool_calls"] == 0 and out["evidence"] == []
    assert "perhaps" in out["draft"]
    out, _, _ = run(p_perhaps=0.4)  # the boundary: exactly the threshold is confident enough
    assert out["tool_calls"] == 0


def test_max_steps_caps_the_retrieval_rounds():
    replies = ["It is perhaps A.", "Better A.", "It is perhaps B.", "Answer: yes"]
    out, _, _ = run(replies, config={"max_steps": 1})
    assert out["retrieval_rounds"] == 1 and "perhaps B" in out["draft"]
    out, _, _ = run(replies + ["Better B.", "Answer: yes"], config={"max_steps": 2})
    assert out["retrieval_rounds"] == 2


def test_an_improbable_answer_line_is_searched_with_the_question():
    out, _, _ = run(["Metformin is first-line.", "Answer: perhaps", "Answer: yes"])
    assert [e["query"] for e in out["evidence"]] == [f"{Q} perhaps"] and out["answer"] == "yes"


def test_retrieve_question_first_starts_with_the_question():
    out, _, scorer = run(["Metformin is first-line.", "Answer: yes"], options={"retrieve_question_first": True})
    assert [e["query"] for e in out["evidence"]] == [Q]
    assert [text for _, text in scorer.calls] == ["Answer: yes"]  # the first sentence came after a retrieval


def test_an_out_of_format_answer_is_re_prompted():
    out, model, _ = run(["Metformin is first-line.", "Answer: probably", "Answer: no"],
                        context={"answer_format": ["yes", "no", "maybe"]})
    assert out["structured_answer"] == "no" and out["format_retries"] == 1 and out["halt_reason"] == "answered"
    assert "could not be used" in model.seen[-1][-1].content


def test_options_are_validated_and_a_scorer_without_token_log_probs_halts_cleanly():
    with pytest.raises(ValueError, match="threshold"):
        run(options={"threshold": 1.5})
    graph = build_flare_graph(model=recording_model(REPLIES), tools=[scripted_tool("DOC_RAG", "x")], scorer=ScriptedScorer())
    out = graph.invoke({"question": Q})
    assert out["halt_reason"] == "scorer_error" and "token_logprobs" in out["error"]
