"""State values beyond the paper's (monitor/state_values.py): conditioned on the evidence on the stack,
or the probability of the chosen answer among the allowed ones; and a rejection that leads somewhere."""

from __future__ import annotations

import math

import pytest
from langchain_core.tools import tool

from tcrag_langgraph import TCRAGConfig, build_graph
from tcrag_langgraph.monitor.calibration import Calibration
from tcrag_langgraph.monitor.scoring import LocalLMScorer, token_logprobs_to_metric
from tcrag_langgraph.monitor.state_values import DEFAULT_SIGMA, STATE_VALUES, choice_value, evidence_context
from tcrag_langgraph.testing import ScriptedScorer, recording_model

QUESTION = "Does vitamin C deficiency cause scurvy?"
PASSAGE = "Scurvy is caused by a lack of vitamin C (ascorbic acid) in the diet."


@tool("DOC_RAG")
def doc_rag(query: str) -> str:
    """Search medical documents."""
    return PASSAGE


def run(metric: str, scorer, replies, **cfg):
    graph = build_graph(model=recording_model(replies), tools=[doc_rag], scorer=scorer,
                        config=TCRAGConfig(metric=metric, max_steps=6, **cfg))
    return graph.invoke({"question": QUESTION})


@pytest.fixture(scope="module")
def real_scorer():
    return LocalLMScorer()  # the packaged SmolLM2: real log-probs, the generator's own weights


def test_evidence_values_are_eq_2_and_3_given_the_observations_too(real_scorer):
    replies = ["Tool_Use: DOC_RAG\nTool_Input: scurvy", "Conclusion: Yes, vitamin C deficiency causes scurvy."]
    answer = "Yes, vitamin C deficiency causes scurvy."
    for metric, base in (("cppl_evidence", "cppl"), ("uct_evidence", "uct")):
        out = run(metric, real_scorer, replies, sigma=1e6)
        observation = out["stack"][1].tool_call.observation
        assert PASSAGE in observation
        direct = token_logprobs_to_metric(real_scorer.token_logprobs(evidence_context(QUESTION, [observation]), answer),
                                          base)
        assert out["state_value"] == pytest.approx(direct, rel=1e-6) and out["halt_reason"] == "validated"
        # and it is not the paper's value: the evidence changes what the answer costs the model
        assert not math.isclose(direct, real_scorer.score(QUESTION, answer, metric=base), rel_tol=1e-3)


def test_answer_prob_is_one_minus_the_normalised_probability_of_the_chosen_answer(real_scorer):
    replies = ["Tool_Use: DOC_RAG\nTool_Input: scurvy", "Conclusion: yes"]
    out = run("answer_prob", real_scorer, replies, sigma=0.99, answer_format=["yes", "no", "maybe"])
    context = evidence_context(QUESTION, [out["stack"][1].tool_call.observation])
    sums = {a: sum(real_scorer.token_logprobs(context, f"Conclusion: {a}")) for a in ("yes", "no", "maybe")}
    expected = 1 - math.exp(sums["yes"]) / sum(math.exp(v) for v in sums.values())
    assert out["state_value"] == pytest.approx(expected, rel=1e-6) and 0.0 <= expected <= 1.0
    assert out["structured_answer"] == "yes" and out["halt_reason"] == "validated"


def test_choice_value_and_its_bounds():
    assert choice_value({"a": 0.0, "b": 0.0}, "a") == pytest.approx(0.5)
    assert choice_value({"a": -1000.0, "b": 0.0}, "b") == pytest.approx(0.0)  # no overflow or underflow
    with pytest.raises(ValueError, match="allowed answers"):
        choice_value({"a": 0.0}, "c")


def test_answer_prob_needs_a_list_of_choices_and_every_value_has_a_default_sigma():
    from pydantic import BaseModel

    class Letters(BaseModel):
        letters: list[str]

    with pytest.raises(ValueError, match="answer_format"):
        TCRAGConfig(metric="answer_prob", answer_format=Letters)
    TCRAGConfig(metric="answer_prob", enable_state_monitor=False, answer_format=Letters)  # not used: no check
    # no format at build time: a run may bring one in its context (tcrag eval does); without one it halts
    out = build_graph(model=recording_model(["Conclusion: yes"]), tools=[doc_rag], scorer=ScriptedScorer(),
                      config=TCRAGConfig(metric="answer_prob", max_steps=3)).invoke({"question": QUESTION})
    assert out["halt_reason"] == "scorer_error" and "allowed answers" in out["error"]
    class PrefersYes(ScriptedScorer):
        def token_logprobs(self, context, text):
            return [-0.1] if text.endswith("yes") else [-3.0]

    with_context = build_graph(model=recording_model(["Conclusion: yes"]), tools=[doc_rag], scorer=PrefersYes(),
                               config=TCRAGConfig(metric="answer_prob", max_steps=3)).invoke(
        {"question": QUESTION}, context={"answer_format": ["yes", "no"]})
    assert with_context["halt_reason"] == "validated" and with_context["structured_answer"] == "yes"
    assert TCRAGConfig(metric="answer_prob", answer_format=["yes", "no"]).effective_sigma == 0.5
    assert set(DEFAULT_SIGMA) == set(STATE_VALUES)
    for metric in STATE_VALUES:  # the calibration store keeps a sigma for each
        Calibration(metric=metric, sigma=0.4, auroc=0.7, model_id="m", dataset="d", n=10)


def test_a_repeated_conclusion_is_scored_again_only_after_new_evidence():
    """With an evidence value, a rejected Conclusion written again after a new observation may now be
    supported: it is scored; written again with no new evidence, the run halts as repeated."""

    class ByContext(ScriptedScorer):
        """cppl 1 when the context holds evidence, else 50, whatever the text."""

        def score(self, query, text, *, metric):
            return math.exp(-self.token_logprobs(query, text)[0])

        def token_logprobs(self, context, text):
            return [-math.log(1.0 if "Evidence:" in context else 50.0)]

    after_evidence = run("cppl_evidence", ByContext(), [
        "Conclusion: yes", "Tool_Use: DOC_RAG\nTool_Input: scurvy", "Conclusion: yes"])
    assert after_evidence["halt_reason"] == "validated" and after_evidence["state_value"] == 1.0
    no_new_evidence = run("cppl_evidence", ByContext(), ["Conclusion: yes", "Thought: hmm", "Conclusion: yes"])
    assert no_new_evidence["halt_reason"] == "repeated_conclusion"
    # the paper's value depends on the question and the text only: repeated halts at once, as before
    paper = run("cppl", ByContext(), ["Conclusion: yes", "Tool_Use: DOC_RAG\nTool_Input: scurvy", "Conclusion: yes"])
    assert paper["halt_reason"] == "repeated_conclusion"


def test_a_rejected_conclusion_tells_the_model_what_to_do_instead():
    model = recording_model(["Conclusion: maybe", "Tool_Use: DOC_RAG\nTool_Input: scurvy vitamin C",
                             "Conclusion: yes"])
    graph = build_graph(model=model, tools=[doc_rag], scorer=ScriptedScorer({"yes": 1.0}, default=50.0),
                        config=TCRAGConfig(max_steps=6, enable_backtrack=False))
    out = graph.invoke({"question": QUESTION})
    assert out["halt_reason"] == "validated" and out["answer"] == "yes"
    turns = [m[-1].content for m in model.seen]
    assert "not supported" not in turns[0]
    assert "Your last Conclusion was not supported (state value 50)" in turns[1]
    assert "search with a new, more specific query (Tool_Use)" in turns[1] and "Tool_Use: <one of DOC_RAG>" in turns[1]
    assert "Backtrack" not in turns[1].split("not supported")[1]
    assert "not supported" not in turns[2]  # only right after the rejection
