"""The ``consistency`` state value (tcrag_langgraph.monitor.consistency): the generator's own
resampled answers, for any chat model, and TC-RAG monitored by it when the model has no log-probs.
Scripted models here test the rule and the transitions; tests/test_served_monitor.py runs it
against a real OpenAI-compatible server (llama.cpp's) and the packaged model."""

from __future__ import annotations

import pytest

from tcrag_langgraph import build_graph
from tcrag_langgraph.monitor.consistency import DEFAULT_SAMPLES, SamplingConsistencyScorer, same_answer
from tcrag_langgraph.monitor.state_values import DEFAULT_SIGMA, measure
from tcrag_langgraph.testing import recording_model

Q = "Is aspirin a non-steroidal anti-inflammatory drug?"


@pytest.mark.parametrize("sample,conclusion,choices,same", [
    ("Yes.", "yes", ("yes", "no", "maybe"), True),
    ("No, it is not.", "yes", ("yes", "no", "maybe"), False),
    ("I think maybe", "Conclusion: maybe", ("yes", "no", "maybe"), True),
    ("B", "B. Thiamine", ("A", "B", "C", "D"), True),
    ("I cannot tell", "yes", ("yes", "no"), False),  # names no allowed answer: no agreement
    ("Vitamin C deficiency", "Scurvy is caused by a deficiency of vitamin C.", (), True),
    ("Vitamin D", "Scurvy is caused by a deficiency of vitamin C.", (), False),
    ("", "yes", (), False),
])
def test_same_answer(sample, conclusion, choices, same):
    assert same_answer(sample, conclusion, choices=choices) is same


def test_the_value_is_one_minus_the_share_of_samples_that_agree():
    model = recording_model(["yes", "Yes, it is.", "no", "yes", "maybe"])
    scorer = SamplingConsistencyScorer(model)
    assert scorer.k == DEFAULT_SAMPLES
    value = scorer.score("Question: " + Q, "Conclusion: yes", metric="consistency", choices=("yes", "no", "maybe"))
    assert value == pytest.approx(1 - 3 / 5)
    assert len(model.seen) == 5  # k samples, each of the question and the allowed answers alone
    assert all("one of: yes, no, maybe" in m[0].content and m[-1].content == "Question: " + Q for m in model.seen)
    # through the one rule every state value goes through, with the evidence in the context
    scorer = SamplingConsistencyScorer(recording_model(["no"]), k=2)
    got = measure("consistency", Q, "yes", score=scorer.score, token_logprobs=None, evidence=["aspirin is an NSAID"],
                  choices=("yes", "no"))
    assert got == 1.0 and "aspirin is an NSAID" in scorer.model.seen[0][-1].content


def test_the_scorer_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="chat model"):
        SamplingConsistencyScorer(None)
    with pytest.raises(ValueError, match="k must"):
        SamplingConsistencyScorer(recording_model(["x"]), k=0)
    with pytest.raises(ValueError, match="samples must differ"):
        SamplingConsistencyScorer(recording_model(["x"]), temperature=0)
    with pytest.raises(ValueError, match="not 'cppl'"):
        SamplingConsistencyScorer(recording_model(["x"])).score("q", "a", metric="cppl")


def test_tcrag_without_log_probs_is_monitored_by_its_own_samples():
    """No scorer and no state value asked for: a model without log-probs is not refused; a Conclusion
    that its own samples contradict is rejected (kept as a Thought) and one they repeat is validated."""
    replies = ["Conclusion: no",  # the answer ...
               "yes", "yes", "yes", "no", "yes",  # ... that 4 of 5 samples contradict: rejected (0.8 > 0.5)
               "Conclusion: yes",  # the next answer ...
               "yes", "yes", "Yes.", "no", "yes"]  # ... that 4 of 5 repeat: validated (0.2 < 0.5)
    model = recording_model(replies)
    out = build_graph(model=model, config={"answer_format": ["yes", "no"], "max_steps": 4}).invoke({"question": Q})
    assert (out["metric"], out["sigma"]) == ("consistency", DEFAULT_SIGMA["consistency"])
    assert out["answer"] == "yes" and out["answer_validated"] is True and out["halt_reason"] == "validated"
    values = [h["value"] for h in out["state_history"]]
    assert values == [pytest.approx(0.8), pytest.approx(0.2)]
    # 2 generations and 2 x 5 samples, every call counted in the run's cost (the samples' tokens too)
    assert out["llm_calls"] == 12 == len(model.seen)
    from tcrag_langgraph.tools.tokens import count_tokens
    assert out["token_usage"]["completion"] == sum(count_tokens(r) for r in replies)


def test_a_thought_is_not_resampled():
    model = recording_model(["Thought: aspirin inhibits COX", "Conclusion: yes", "yes", "yes", "yes", "yes", "yes"])
    out = build_graph(model=model, config={"answer_format": ["yes", "no"]}).invoke({"question": Q})
    assert out["answer_validated"] is True and len(model.seen) == 2 + DEFAULT_SAMPLES == out["llm_calls"]


def test_calibrate_measures_consistency_by_resampling_the_model(tmp_path, monkeypatch):
    """tcrag calibrate --metric consistency needs no scorer: it resamples the generator itself."""
    import json

    from typer.testing import CliRunner

    from tcrag_langgraph.faces.cli import app

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "yn.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Is drug {i} safe?", "answer": a}) + "\n"
                            for i, a in enumerate(["yes", "yes", "no", "no", "yes", "yes"])), encoding="utf-8")
    result = CliRunner().invoke(app, ["calibrate", "--dataset", str(data), "--model", "tests.eval.helpers:yes_no_model",
                                      "--metric", "consistency", "--no-save", "--no-progress",
                                      "--out", str(tmp_path / "c")], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "AUROC (lower value = correct)" in result.output and "sigma" in result.output
