"""State monitor math: cppl (eq. 2) and uct (eq. 3) against direct computations with the real model."""

from __future__ import annotations

import math

import pytest
import torch

from tcrag_langgraph.monitor.scoring import LocalLMScorer, StateScorer, token_logprobs_to_metric

QUERY = "What is the first-line drug for type 2 diabetes?"
TEXT = "Metformin is usually the first-line drug."


def test_metric_formulas_on_hand_computed_values():
    lps = [math.log(0.5), math.log(0.25)]
    assert token_logprobs_to_metric(lps, "cppl") == pytest.approx(math.exp((math.log(2) + math.log(4)) / 2))
    assert token_logprobs_to_metric(lps, "uct") == pytest.approx(0.5 * math.log(2) + 0.25 * math.log(4))
    with pytest.raises(ValueError, match="nothing to score"):
        token_logprobs_to_metric([], "cppl")
    with pytest.raises(ValueError, match="unknown metric"):
        token_logprobs_to_metric(lps, "bleu")


@pytest.fixture(scope="module")
def scorer():
    return LocalLMScorer()


def _direct_logprobs(lm, prefix_ids, text_ids):
    """One forward pass per scored token: an independent computation of log P(w_i | w_<i, prefix)."""
    out = []
    with torch.no_grad():
        for i, target in enumerate(text_ids):
            ids = torch.tensor([prefix_ids + text_ids[:i]])
            logits = lm.model(ids).logits[0, -1]
            out.append(torch.log_softmax(logits.double(), -1)[target].item())
    return out


def test_scorer_satisfies_the_protocol(scorer):
    assert isinstance(scorer, StateScorer)


def test_cppl_matches_direct_computation_and_hf_loss(scorer):
    lm = scorer.local_model
    tok = lm.tokenizer
    prefix = scorer._start_ids() + tok(QUERY + "\n", add_special_tokens=False)["input_ids"]
    text_ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    direct = _direct_logprobs(lm, prefix, text_ids)
    expected = math.exp(-sum(direct) / len(direct))
    assert scorer.score(QUERY, TEXT, metric="cppl") == pytest.approx(expected, rel=1e-4)
    # The same number from transformers' own loss with the context masked out (labels = -100).
    ids = torch.tensor([prefix + text_ids])
    labels = ids.clone()
    labels[0, : len(prefix)] = -100
    with torch.no_grad():
        loss = lm.model(ids, labels=labels).loss.item()
    assert scorer.score(QUERY, TEXT, metric="cppl") == pytest.approx(math.exp(loss), rel=1e-4)


def test_uct_matches_direct_computation(scorer):
    lm = scorer.local_model
    tok = lm.tokenizer
    text_ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    direct = _direct_logprobs(lm, scorer._start_ids(), text_ids)
    expected = -sum(math.exp(lp) * lp for lp in direct)
    assert scorer.score(QUERY, TEXT, metric="uct") == pytest.approx(expected, rel=1e-4)
    given_query = LocalLMScorer(lm, uct_given_query=True).score(QUERY, TEXT, metric="uct")
    assert given_query != pytest.approx(expected, rel=1e-6)  # the switch really changes the context


def test_relevant_answers_score_lower_than_noise(scorer):
    good = scorer.score(QUERY, TEXT, metric="cppl")
    noise = scorer.score(QUERY, "zebra quantum marmalade carburetor 7731 ukulele", metric="cppl")
    assert good < noise


def test_long_inputs_are_capped_not_crashing():
    small = LocalLMScorer(max_tokens=64)
    value = small.score("word " * 500, "answer " * 500, metric="cppl")
    assert math.isfinite(value) and value > 0


def test_empty_text_is_a_clear_error(scorer):
    with pytest.raises(ValueError, match="nothing to score"):
        scorer.score(QUERY, "", metric="cppl")
    with pytest.raises(ValueError, match="unknown metric"):
        scorer.score(QUERY, TEXT, metric="ppl")


# --- which scorer for which generator (issue 11 item 1) ---

def test_local_chat_model_gets_a_lazy_scorer_over_its_own_weights(lm):
    from tcrag_langgraph.models.local import LocalChatModel
    from tcrag_langgraph.monitor.own_model import scorer_for_model

    chat = LocalChatModel(max_new_tokens=4)
    monitor = scorer_for_model(chat)
    assert isinstance(monitor, LocalLMScorer)
    assert monitor._lm is None and chat._lm is None  # nothing loaded at build time
    assert monitor.local_model is chat.local_model


def test_chat_huggingface_over_a_pipeline_is_scored_by_its_own_model(lm):
    from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline
    from transformers import pipeline

    from tcrag_langgraph.monitor.own_model import scorer_for_model

    pipe = pipeline("text-generation", model=lm.model, tokenizer=lm.tokenizer, max_new_tokens=4)
    llm = HuggingFacePipeline(pipeline=pipe)
    chat = ChatHuggingFace(llm=llm, tokenizer=lm.tokenizer)
    for generator in (chat, llm):
        monitor = scorer_for_model(generator)
        assert monitor.local_model.model is pipe.model and monitor.local_model.tokenizer is pipe.tokenizer
        for metric in ("cppl", "uct"):
            assert monitor.score(QUERY, TEXT, metric=metric) == LocalLMScorer(lm).score(QUERY, TEXT, metric=metric)


def test_a_pipeline_over_other_weights_is_not_scored_by_the_packaged_model(lm):
    """A pipeline over a different (here: re-initialised) model must be scored by that model."""
    import copy

    import torch
    from langchain_huggingface import HuggingFacePipeline
    from transformers import pipeline

    from tcrag_langgraph.monitor.own_model import scorer_for_model

    other = copy.deepcopy(lm.model)
    with torch.no_grad():
        other.model.embed_tokens.weight.mul_(0.5)
    monitor = scorer_for_model(HuggingFacePipeline(pipeline=pipeline("text-generation", model=other, tokenizer=lm.tokenizer)))
    assert monitor.local_model.model is other
    assert monitor.score(QUERY, TEXT, metric="cppl") != pytest.approx(LocalLMScorer(lm).score(QUERY, TEXT, metric="cppl"))


def test_an_unknown_chat_model_is_refused_with_the_options():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from tcrag_langgraph.monitor.scoring import MonitorUnavailableError
    from tcrag_langgraph.monitor.own_model import scorer_for_model

    with pytest.raises(MonitorUnavailableError) as info:
        scorer_for_model(FakeListChatModel(responses=["x"]))
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "scorer=" in message and "CompletionsLogprobScorer" in message
    assert "enable_state_monitor=False" in message and "FakeListChatModel" in message


def test_served_chat_models_are_not_scored_implicitly():
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    from tcrag_langgraph.monitor.scoring import MonitorUnavailableError
    from tcrag_langgraph.monitor.own_model import scorer_for_model

    with pytest.raises(MonitorUnavailableError, match="ChatOpenAI"):
        scorer_for_model(ChatOpenAI(model="m", base_url="http://127.0.0.1:9/v1", api_key="sk-x"))


def test_scorer_arguments_are_checked():
    with pytest.raises(ValueError, match="at most one"):
        LocalLMScorer(model_path="x", model_loader=lambda: None)
    with pytest.raises(ValueError, match="unknown dtype"):
        LocalLMScorer(dtype="int3")
    from tcrag_langgraph.monitor.served import CompletionsLogprobScorer, RemoteScorerError

    assert CompletionsLogprobScorer.__module__ == "tcrag_langgraph.monitor.served"
    assert issubclass(RemoteScorerError, RuntimeError)


def test_token_stats_give_each_tokens_text_log_prob_and_entropy_as_a_direct_computation(scorer):
    """DRAGIN's per-token entropy: the entropy of the full next-token distribution, here from one plain
    forward pass over the whole sequence (no prefix cache, every position's logits); the log-probs are
    token_logprobs' own."""
    lm = scorer.local_model
    tok = lm.tokenizer
    prefix = scorer._start_ids() + tok(QUERY + "\n", add_special_tokens=False)["input_ids"]
    text_ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        rows = lm.model(torch.tensor([prefix + text_ids])).logits[0, len(prefix) - 1: -1].double()
    logp = torch.log_softmax(rows, -1)
    direct = (-(logp.exp() * logp).sum(-1)).tolist()
    assert len(direct) == len(text_ids)
    stats = scorer.token_stats(QUERY, TEXT)
    assert "".join(s.piece for s in stats) == TEXT
    assert [s.entropy for s in stats] == pytest.approx(direct, rel=1e-4)
    assert [s.logprob for s in stats] == pytest.approx(scorer.token_logprobs(QUERY, TEXT), rel=1e-5)
    assert max(direct) > 1.0 and min(direct) < max(direct)  # real, varying values
