"""The generation values (monitor/generation.py): read off the log-probs of the reply that wrote the
text, with no second pass. The rules on hand-made tokens, then the packaged GGUF through
LlamaCppChatModel and a TC-RAG run monitored by them."""

from __future__ import annotations

import math
from functools import reduce

import pytest
from langchain_core.messages import AIMessage

from tcrag_langgraph.monitor.generation import (
    GeneratedToken,
    NoGenerationLogprobs,
    content_tokens,
    generation_values,
    reply_tokens,
)

Q = "Is vitamin C deficiency the cause of scurvy?"


def _tok(text: str, logprob: float, **alternatives: float) -> GeneratedToken:
    return GeneratedToken(text, logprob, {text: logprob, **{k.replace("_", " "): v for k, v in alternatives.items()}})


def test_reply_tokens_read_openais_shape_and_nothing_else():
    meta = {"logprobs": {"content": [
        {"token": "Conclusion", "logprob": -0.1, "top_logprobs": [{"token": "Conclusion", "logprob": -0.1}]},
        {"token": ": yes", "logprob": -0.5, "top_logprobs": [{"token": ": no", "logprob": -1.2}]},
    ]}}
    tokens = reply_tokens(AIMessage(content="Conclusion: yes", response_metadata=meta))
    assert [t.text for t in tokens] == ["Conclusion", ": yes"]
    assert tokens[1].top == {": no": -1.2, ": yes": -0.5}  # the chosen token is always among its alternatives
    assert reply_tokens(AIMessage(content="x")) is None
    assert reply_tokens(AIMessage(content="x", response_metadata={"logprobs": None})) is None
    assert reply_tokens(AIMessage(content="x", response_metadata={"logprobs": {"content": [{"token": "x"}]}})) is None


def test_content_tokens_are_the_ones_that_wrote_the_action():
    tokens = [_tok("Thought", -0.1), _tok(": yes", -0.2), _tok("\n", -0.1), _tok("Conclusion", -0.1),
              _tok(":", -0.1), _tok(" Y", -0.3), _tok("es", -0.05)]
    assert [t.text for t in content_tokens(tokens, "Yes")] == [" Y", "es"]  # the last occurrence
    assert [t.text for t in content_tokens(tokens, "YES")] == [" Y", "es"]  # case-insensitive when need be
    assert content_tokens(tokens, "something reworded") == tokens  # not found: the whole reply


def test_answer_probability_counts_every_spelling_of_each_allowed_answer():
    tokens = [_tok("Conclusion:", -0.01), _tok(" yes", math.log(0.5), Yes=math.log(0.2), _no=math.log(0.2),
                                               _maybe=math.log(0.05))]
    values = generation_values(tokens, "yes", chosen="yes", choices=("yes", "no", "maybe"))
    assert values["gen_answer_prob"] == pytest.approx(1 - 0.7 / 0.95)
    assert values["gen_cppl"] == pytest.approx(2.0)  # exp(-log 0.5): the answer's own token only
    probs = [0.5, 0.2, 0.2, 0.05]
    rest = 1 - sum(probs)
    assert values["gen_entropy"] == pytest.approx(-sum(p * math.log(p) for p in [*probs, rest]))
    # the allowed answers absent from the top alternatives weigh nothing; the chosen one is always there
    alone = generation_values([_tok(" no", -2.0, _the=-0.2)], "no", chosen="no", choices=("yes", "no"))
    assert alone["gen_answer_prob"] == pytest.approx(0.0)
    # no answer among the choices, or no choices: no gen_answer_prob, the other two still
    assert set(generation_values(tokens, "yes", chosen=None, choices=("yes", "no"))) == {"gen_cppl", "gen_entropy"}
    assert set(generation_values(tokens, "yes")) == {"gen_cppl", "gen_entropy"}
    with pytest.raises(NoGenerationLogprobs):
        generation_values([], "yes")


@pytest.fixture(scope="module")
def packaged_chat():
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    return LlamaCppChatModel(max_new_tokens=12, temperature=0.0, seed=0)


def test_the_packaged_gguf_returns_its_tokens_log_probs_when_asked(packaged_chat):
    plain = packaged_chat.invoke("Is the sky blue? Answer yes or no.")
    assert "logprobs" not in plain.response_metadata  # only when asked
    reply = packaged_chat.invoke("Is the sky blue? Answer yes or no.", logprobs=True, top_logprobs=5)
    assert reply.content == plain.content  # asking for log-probs changes nothing of the reply
    tokens = reply_tokens(reply)
    assert tokens and "".join(t.text for t in tokens).strip() == reply.content
    for token in tokens:  # greedy: each token is the most probable of its alternatives
        assert token.logprob <= 0 and len(token.top) <= 5
        assert token.logprob == pytest.approx(max(token.top.values()))
        assert sum(math.exp(v) for v in token.top.values()) <= 1 + 1e-6
    streamed = reduce(lambda a, b: a + b, packaged_chat.stream("Is the sky blue? Answer yes or no.", logprobs=True,
                                                               top_logprobs=5))
    assert [t.text for t in reply_tokens(streamed)] == [t.text for t in tokens]


def test_tcrag_monitored_by_the_replys_own_answer_probability(packaged_chat):
    from tcrag_langgraph import build_graph

    graph = build_graph(model=packaged_chat, tools=[], config={
        "metric": "gen_answer_prob", "answer_format": ["yes", "no"], "max_steps": 3, "max_new_tokens": 24,
        "temperature": 0.0})
    out = graph.invoke({"question": Q})
    assert out["halt_reason"] not in ("scorer_error", "model_error"), out.get("error")
    conclusions = [h for h in out["state_history"] if h["action"] == "Conclusion"]
    if out.get("answer_generation_values"):  # the run ended on a Conclusion: its value is the one judged
        value = out["answer_generation_values"]["gen_answer_prob"]
        assert 0.0 <= value <= 1.0 and conclusions and conclusions[-1]["value"] == value
        assert out["answer_validated"] is (value < 0.5)
        assert set(out["answer_generation_values"]) == {"gen_answer_prob", "gen_cppl", "gen_entropy"}
    else:
        assert out["halt_reason"] in ("max_steps", "format_error")


@pytest.mark.parametrize("method", ["base", "sr-rag"])
def test_the_direct_baselines_record_their_answers_values_as_their_confidence(packaged_chat, method):
    # the risk-coverage curves rank a baseline's answers by the same reply-read values as TC-RAG's
    from tcrag_langgraph import TCRAGConfig, build_agent

    config = {"answer_format": ["yes", "no"], "max_new_tokens": 12, "temperature": 0.0, "max_format_retries": 1}
    recorded = build_agent(method, model=packaged_chat, tools=[],
                           config=TCRAGConfig(**config, record_generation_values=True)).invoke({"question": Q})
    plain = build_agent(method, model=packaged_chat, tools=[], config=TCRAGConfig(**config)).invoke({"question": Q})
    assert recorded["answer"] == plain["answer"]  # reading the log-probs changes nothing of the answer
    assert not plain.get("answer_generation_values")  # only when asked
    if recorded.get("structured_answer") in ("yes", "no"):
        values = recorded["answer_generation_values"]
        assert set(values) == {"gen_answer_prob", "gen_cppl", "gen_entropy"}
        assert 0.0 <= values["gen_answer_prob"] <= 1.0 and values["gen_cppl"] >= 1.0
    else:
        assert recorded["halt_reason"] == "format_error"


def test_a_model_whose_replies_carry_no_log_probs_halts_with_the_reason():
    from tcrag_langgraph import build_graph
    from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply

    chat = ScriptedChatModel(replies=[ScriptedReply(reply="Conclusion: yes")], mode="sequence")
    graph = build_graph(model=chat, tools=[], config={"metric": "gen_answer_prob", "answer_format": ["yes", "no"]})
    out = graph.invoke({"question": Q})
    assert out["halt_reason"] == "scorer_error" and not out["answer_validated"]
    assert "no token log-probabilities" in out["error"] and "consistency" in out["error"]


def test_monitor_config_picks_the_replys_log_probs_for_a_model_that_returns_them():
    from tcrag_langgraph.core.config import TCRAGConfig
    from tcrag_langgraph.methods.tcrag.graph import monitor_config
    from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply

    class WithLogprobs(ScriptedChatModel):
        returns_logprobs: bool = True

    replies = [ScriptedReply(reply="Conclusion: yes")]
    choices = TCRAGConfig(answer_format=["yes", "no"])
    assert monitor_config(choices, WithLogprobs(replies=replies)).metric == "gen_answer_prob"
    assert monitor_config(TCRAGConfig(), WithLogprobs(replies=replies)).metric == "gen_cppl"
    assert monitor_config(choices, ScriptedChatModel(replies=replies)).metric == "consistency"
    # a value asked for is kept; the fallback never overrides a choice
    assert monitor_config(TCRAGConfig(metric="uct"), WithLogprobs(replies=replies)).metric == "uct"
