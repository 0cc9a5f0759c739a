"""Cached state scoring: the User_Query prefix served from the LRU gives the same cppl/uct as a
full teacher-forced pass, costs a pass over the frame only, and stays bounded."""

from __future__ import annotations

import math

import pytest

from tcrag_langgraph.monitor.scoring import LocalLMScorer

QUERY = "A 58-year-old man with type 2 diabetes and eGFR 25 asks which oral drug he should start."
TEXTS = [
    "Thought: Metformin is contraindicated below an eGFR of 30.",
    "Tool_Use: DOC_RAG\nTool_Input: metformin renal\nTool_Observation: Avoid metformin if eGFR < 30.",
    "Conclusion: a DPP-4 inhibitor such as linagliptin.",
    "Yes",  # a single token: no pass beyond the cached prefix at all
]


# One torch thread and the shared packaged model: fixtures `one_torch_thread` and `lm` in conftest.py.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair(lm):
    return LocalLMScorer(lm), LocalLMScorer(lm, prefix_cache=0)


@pytest.mark.parametrize("metric", ["cppl", "uct"])
def test_cached_scores_equal_full_recomputation(pair, metric):
    cached, full = pair
    for text in TEXTS:
        expected = full.score(QUERY, text, metric=metric)
        assert cached.score(QUERY, text, metric=metric) == pytest.approx(expected, rel=1e-4)
        # a second time the prefix comes from the cache (taken, extended, cropped back): same value
        assert cached.score(QUERY, text, metric=metric) == pytest.approx(expected, rel=1e-4)


def test_token_logprobs_match_per_token(pair):
    cached, full = pair
    a = cached.token_logprobs(QUERY, TEXTS[1])
    b = full.token_logprobs(QUERY, TEXTS[1])
    assert len(a) == len(b) > 10
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-3


def test_prefix_is_computed_once_and_cropped_back(lm):
    scorer = LocalLMScorer(lm)
    for text in TEXTS[:3]:
        scorer.score(QUERY, text, metric="cppl")
    assert scorer.prefix_cache.misses == 1 and scorer.prefix_cache.hits == 2
    (key, (cache, last)), = scorer.prefix_cache._items.items()
    assert cache.get_seq_length() == len(key)  # the scored frame was cropped away again
    assert last.shape == (1, lm.model.config.vocab_size)


def test_a_scoring_call_runs_the_model_over_the_frame_only(lm):
    scorer = LocalLMScorer(lm)
    seen: list[int] = []

    def record(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        seen.append(ids.shape[1])

    handle = lm.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        scorer.score(QUERY, TEXTS[0], metric="cppl")
        first = list(seen)
        seen.clear()
        scorer.score(QUERY, TEXTS[2], metric="cppl")
    finally:
        handle.remove()
    text_len = len(lm.tokenizer(TEXTS[2], add_special_tokens=False)["input_ids"])
    assert len(first) == 2  # a miss: prefix pass, then the frame
    assert seen == [text_len - 1]  # a hit: the frame's tokens (its last one predicts nothing scored)


def test_lru_is_bounded_and_queries_do_not_mix(lm):
    scorer = LocalLMScorer(lm, prefix_cache=2)
    reference = LocalLMScorer(lm, prefix_cache=0)
    queries = ["Which drug lowers LDL?", "What causes scurvy?", "Is aspirin an NSAID?"]
    for q in queries + queries[:1]:
        assert scorer.score(q, TEXTS[2], metric="cppl") == pytest.approx(
            reference.score(q, TEXTS[2], metric="cppl"), rel=1e-4)
    assert len(scorer.prefix_cache) == 2
    assert scorer.prefix_cache.hits == 0  # the first query had been evicted by the third


def test_truncated_inputs_still_match(lm):
    cached = LocalLMScorer(lm, max_tokens=48)
    full = LocalLMScorer(lm, max_tokens=48, prefix_cache=0)
    long_query = "history " * 80
    value = cached.score(long_query, TEXTS[1], metric="cppl")
    assert math.isfinite(value)
    assert value == pytest.approx(full.score(long_query, TEXTS[1], metric="cppl"), rel=1e-4)


def test_scores_are_independent_of_cache_history(lm):
    """A cache left over from other frames must not change a frame's score (no state leaks)."""
    warm = LocalLMScorer(lm)
    for text in TEXTS:
        warm.score(QUERY, text, metric="cppl")
    fresh = LocalLMScorer(lm)
    assert warm.score(QUERY, TEXTS[0], metric="cppl") == pytest.approx(
        fresh.score(QUERY, TEXTS[0], metric="cppl"), rel=1e-5)


def test_prefix_cache_option_is_validated():
    with pytest.raises(ValueError):
        LocalLMScorer(prefix_cache=-1)
