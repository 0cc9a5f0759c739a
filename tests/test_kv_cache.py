"""Stack-aligned KV cache: pool mechanics on real DynamicCache objects, prefix stability of the
TC-RAG prompt at frame boundaries, and cached vs uncached greedy generation on the packaged model."""

from __future__ import annotations

import inspect
import threading

import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from transformers import DynamicCache

from tcrag_langgraph.core.state import Action, Frame, ToolCallRecord
from tcrag_langgraph.methods.tcrag.prompting import demonstrations, system_prompt, turn_text
from tcrag_langgraph.methods.tcrag.state import pop, push, render_stack, replace_top
from tcrag_langgraph.models.kv_cache import CacheLease, PrefixStateCache, PromptKVPool, common_prefix_len, crop_cache

LAYERS = 2


def _fill(cache: DynamicCache, ids: list[int]) -> None:
    """Append "states" that encode the token ids themselves, so a test can read back what a cache holds."""
    t = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1)
    for layer in range(LAYERS):
        cache.update(t + 1000 * layer, -t, layer)


def _held(cache: DynamicCache) -> list[int]:
    if not cache.layers or cache.get_seq_length() == 0:
        return []
    keys = cache.layers[0].keys
    return [int(x) for x in keys.view(-1).tolist()]


def _run(pool: PromptKVPool, prompt: list[int], generated: list[int] = ()) -> CacheLease:
    """What a generator does: prefill the uncached remainder, decode, give the cache back."""
    lease = pool.acquire(prompt)
    assert _held(lease.cache) == prompt[: lease.reused]  # the cache holds exactly the reused prefix
    _fill(lease.cache, list(prompt[lease.reused:]) + list(generated))
    pool.release(lease, list(prompt) + list(generated))
    return lease


# ----- pure mechanics (no model) -----

def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [6]) == 0
    assert common_prefix_len(torch.tensor([1, 2, 3]), (1, 2, 3)) == 3


def test_crop_cache_keeps_the_first_positions():
    cache = DynamicCache()
    _fill(cache, [10, 11, 12, 13])
    crop_cache(cache, 2)
    assert cache.get_seq_length() == 2 and _held(cache) == [10, 11]
    crop_cache(cache, 5)  # longer than held: unchanged
    assert _held(cache) == [10, 11]
    with pytest.raises(ValueError):
        crop_cache(cache, -1)


def test_push_reuses_prefix_and_pop_crops_to_the_frame_boundary():
    pool = PromptKVPool(DynamicCache, max_slots=1)
    system, q, f1, f2, suffix = [1, 2, 3], [4, 5], [6, 7, 8], [9, 10], [90, 91]
    first = _run(pool, system + q + suffix, generated=[50, 51])
    assert first.reused == 0
    pushed = _run(pool, system + q + f1 + suffix, generated=[52])
    assert pushed.reused == len(system + q)  # only the new frame and the suffix are prefilled
    pushed2 = _run(pool, system + q + f1 + f2 + suffix)
    assert pushed2.reused == len(system + q + f1)
    popped = _run(pool, system + q + f1 + suffix)  # Backtrack: back to the frame boundary
    assert popped.reused == len(system + q + f1)
    summary = _run(pool, system + q + [77] + suffix)  # Summary replaces the top frame
    assert summary.reused == len(system + q)
    s = pool.stats
    assert s.calls == 5 and s.prefill_tokens == s.prompt_tokens - s.reused_tokens
    assert s.reused_tokens == 5 + 8 + 8 + 5


def test_identical_prompt_leaves_one_token_to_compute():
    pool = PromptKVPool(DynamicCache)
    _run(pool, [1, 2, 3, 4])
    lease = pool.acquire([1, 2, 3, 4])
    assert lease.reused == 3 and _held(lease.cache) == [1, 2, 3]


def test_generated_tokens_are_reused_by_a_replayed_assistant_turn():
    pool = PromptKVPool(DynamicCache)
    prompt, out = [1, 2, 3], [40, 41, 42]
    # generate() feeds every generated token but the last one through the model
    lease = pool.acquire(prompt)
    _fill(lease.cache, prompt + out[:-1])
    pool.release(lease, prompt + out)
    again = pool.acquire(prompt + out + [99, 100])  # format re-prompt: the output replayed, then feedback
    assert again.reused == len(prompt) + len(out) - 1


def test_another_conversation_forks_instead_of_destroying_the_slot():
    pool = PromptKVPool(DynamicCache, max_slots=4, fork_min_tokens=3)
    shared = [1, 2, 3]
    a = shared + [10, 11, 12, 13, 14]
    b = shared + [20, 21, 22, 23]
    _run(pool, a)
    lease_b = _run(pool, b)
    assert lease_b.reused == len(shared) and pool.stats.forks == 1
    assert len(pool) == 2
    back_to_a = pool.acquire(a + [15])  # A's slot survived B
    assert back_to_a.reused == len(a) and _held(back_to_a.cache) == a


def test_small_losses_crop_in_place_without_copies():
    pool = PromptKVPool(DynamicCache, max_slots=4, fork_min_tokens=3)
    _run(pool, [1, 2, 3, 4, 90, 91])
    _run(pool, [1, 2, 3, 4, 5, 90, 91])  # loses the 2-token suffix only
    assert pool.stats.forks == 0 and len(pool) == 1


def test_lru_eviction_and_discard_on_error():
    pool = PromptKVPool(DynamicCache, max_slots=2, fork_min_tokens=1)
    for first in (10, 20, 30):
        _run(pool, [first, first + 1, first + 2])
    assert len(pool) == 2 and pool.stats.evictions == 1
    assert pool.acquire([10, 11, 12]).reused == 0  # the oldest went first
    lease = pool.acquire([20, 21, 22, 23])
    assert lease.reused == 3
    pool.release(lease, None)  # e.g. generate() raised: the half-written cache is dropped
    assert pool.acquire([20, 21, 22, 23]).reused == 0


def test_release_refuses_a_cache_whose_content_is_unknown():
    pool = PromptKVPool(DynamicCache)
    lease = pool.acquire([1, 2, 3])
    _fill(lease.cache, [1, 2, 3])
    pool.release(lease, [1, 2])  # fewer ids than positions held
    assert len(pool) == 0


def test_concurrent_leases_never_share_a_cache():
    pool = PromptKVPool(DynamicCache, max_slots=8, fork_min_tokens=1)
    _run(pool, [1, 2, 3, 4, 5])
    seen: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker(tag: int) -> None:
        try:
            barrier.wait()
            for step in range(20):
                prompt = [1, 2, 3, 100 + tag, step]
                lease = pool.acquire(prompt)
                seen.append(id(lease.cache))
                assert _held(lease.cache) == prompt[: lease.reused]
                _fill(lease.cache, prompt[lease.reused:])
                assert _held(lease.cache) == prompt  # nobody else wrote into it meanwhile
                pool.release(lease, prompt)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_prefix_state_cache_lru():
    cache = PrefixStateCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.take("a") == 1 and cache.take("a") is None  # taking removes
    cache.put("a", 1)
    cache.put("c", 3)
    cache.put("d", 4)
    assert len(cache) == 2 and cache.take("b") is None
    assert cache.hits == 1 and cache.misses == 2
    off = PrefixStateCache(0)
    off.put("a", 1)
    assert off.take("a") is None


# ----- the real prompt and model -----

# One torch thread and the shared packaged model: fixtures `one_torch_thread` and `lm` in conftest.py.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


ALLOWED = ["Thought", "Plan", "Summary", "Backtrack", "Conclusion"]


SHORT_SYSTEM = "Answer with one action line: Thought, Plan or Conclusion."


def _messages(stack, *, few_shot=True):
    # few_shot=False: a short system prompt too, to keep real-model tests fast
    msgs = [SystemMessage(content=system_prompt([], ALLOWED) if few_shot else SHORT_SYSTEM)]
    if few_shot:
        for shown, reply in demonstrations([], ALLOWED):
            msgs += [HumanMessage(content=shown), AIMessage(content=reply)]
    msgs.append(HumanMessage(content=turn_text(render_stack(stack))))
    return msgs


def _ids(lm, messages):
    from tcrag_langgraph.models.local import chat_turns

    return lm.tokenizer.apply_chat_template(chat_turns(messages), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


FRAMES = [
    Frame(action=Action.THOUGHT, content="Metformin is first-line for type 2 diabetes."),
    Frame(action=Action.TOOL_USE, content="search", tool_call=ToolCallRecord(
        tool="DOC_RAG", tool_input="metformin 500 mg", observation="Metformin (500-2000 mg/day)\nlowers HbA1c by 1-2%.")),
    Frame(action=Action.PLAN, content="1) check renal function; 2) start 500 mg"),
    Frame(action=Action.THOUGHT, content="二甲双胍是一线药物。"),
    Frame(action=Action.SUMMARY, content="Metformin, unless eGFR < 30."),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: f.action.value)
def test_prompt_is_prefix_stable_at_frame_boundaries(lm, frame):
    """After a push, every token up to the end of the previous top frame is shared with the old
    prompt (so reused); after a pop the shared part ends exactly at the frame boundary."""
    base = [Frame(action=Action.USER_QUERY, content="What treats type 2 diabetes?"), FRAMES[0]]
    before = _ids(lm, _messages(base))
    after = _ids(lm, _messages(push(base, frame)))
    # how many tokens the prompt text up to the end of the old top frame has on its own
    rendered = lm.tokenizer.apply_chat_template(
        [{"role": role, "content": text} for role, text in _turns(base)], add_generation_prompt=True, tokenize=False)
    boundary = rendered.index(render_stack(base)) + len(render_stack(base))
    expected = len(lm.tokenizer(rendered[:boundary], add_special_tokens=False)["input_ids"])
    assert rendered[:boundary].endswith(FRAMES[0].content)
    shared = common_prefix_len(before, after)
    # everything up to the frame boundary is reused; at most the separating newline beyond it
    assert shared >= expected and lm.tokenizer.decode(after[expected:shared]).strip() == ""
    # popping it again shares the same prefix with the pushed prompt
    assert common_prefix_len(after, _ids(lm, _messages(pop(push(base, frame))[0]))) == shared


def _turns(stack):
    out = [("system", system_prompt([], ALLOWED))]
    for shown, reply in demonstrations([], ALLOWED):
        out += [("user", shown), ("assistant", reply)]
    out.append(("user", turn_text(render_stack(stack))))
    return out


def test_trailing_whitespace_in_a_frame_costs_at_most_one_token(lm):
    base = [Frame(action=Action.USER_QUERY, content="Q?"), Frame(action=Action.THOUGHT, content="ends with a space ")]
    before = _ids(lm, _messages(base, few_shot=False))
    after = _ids(lm, _messages(push(base, FRAMES[2]), few_shot=False))
    frame_end = len(_ids(lm, _messages(base, few_shot=False))) - len(_suffix_ids(lm))
    assert common_prefix_len(before, after) >= frame_end - 1


def _suffix_ids(lm):
    # the fixed per-turn suffix: "\n\nWrite your next action." + end of turn + assistant header
    one = _ids(lm, [HumanMessage(content=turn_text("x"))])
    two = _ids(lm, [HumanMessage(content=turn_text("x\ny"))])
    n = 0
    while one[-1 - n] == two[-1 - n]:
        n += 1
    return one[-n:]


def _script(stack):
    """A scripted trajectory: pushes, a pop (Backtrack), a pop+push (Summary)."""
    yield stack
    stack = push(stack, FRAMES[0]); yield stack
    stack = push(stack, FRAMES[1]); yield stack
    stack, _ = pop(stack); yield stack
    stack = push(stack, FRAMES[2]); yield stack
    stack, _ = replace_top(stack, FRAMES[4]); yield stack


def _assert_same_greedy_output(lm, messages, cached_ids, plain_ids):
    """Equal token ids, or, if float noise of the split prefill flipped a near-tie, a logit gap
    below tolerance at the first differing position."""
    if cached_ids == plain_ids:
        return
    k = next(i for i, (a, b) in enumerate(zip(cached_ids, plain_ids)) if a != b)
    prompt = _ids(lm, messages)
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt + plain_ids[:k]])).logits[0, -1]
    gap = float(logits[plain_ids[k]] - logits[cached_ids[k]])
    assert abs(gap) < 1e-3, f"outputs differ at token {k} with a logit gap of {gap}"


def _gen_ids(chat, messages):
    out = chat.invoke(messages)
    return out, chat.local_model.tokenizer(out.content, add_special_tokens=False)["input_ids"]


def test_cached_generation_equals_uncached_over_pushes_and_pops(lm):
    from tcrag_langgraph.models.local import LocalChatModel

    cached = LocalChatModel(max_new_tokens=4, temperature=0.0)
    plain = LocalChatModel(max_new_tokens=4, temperature=0.0, kv_cache=False)
    start = [Frame(action=Action.USER_QUERY, content="What treats type 2 diabetes?")]
    reads = []
    for stack in _script(start):
        messages = _messages(stack, few_shot=False)  # short prompt: keeps the test fast
        a, a_ids = _gen_ids(cached, messages)
        b, b_ids = _gen_ids(plain, messages)
        _assert_same_greedy_output(lm, messages, a_ids, b_ids)
        reads.append(a.usage_metadata["input_token_details"]["cache_read"])
        assert "input_token_details" not in b.usage_metadata
    assert reads[0] == 0 and all(r > 0 for r in reads[1:])
    stats = cached.kv_cache_stats
    assert stats["calls"] == 6 and stats["prefill_tokens"] < stats["prompt_tokens"] / 2
    assert plain.kv_cache_stats["calls"] == 0


def test_concurrent_questions_get_their_own_answers(lm):
    from tcrag_langgraph.models.local import LocalChatModel

    cached = LocalChatModel(max_new_tokens=4, temperature=0.0, kv_cache_slots=2)
    plain = LocalChatModel(max_new_tokens=4, temperature=0.0, kv_cache=False)
    questions = ["What treats type 2 diabetes?", "Which vitamin deficiency causes scurvy?"]
    stacks = {q: [Frame(action=Action.USER_QUERY, content=q)] for q in questions}
    expected = {q: plain.invoke(_messages(stacks[q], few_shot=False)).content for q in questions}
    got: dict[str, list[str]] = {q: [] for q in questions}

    def run(q):
        for _ in range(2):
            got[q].append(cached.invoke(_messages(stacks[q], few_shot=False)).content)

    threads = [threading.Thread(target=run, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in questions:
        assert got[q] == [expected[q]] * 2
    assert cached.kv_cache_stats["reused_tokens"] > 0


@pytest.mark.slow
def test_cached_generation_equals_uncached_with_the_full_tcrag_prompt(lm):
    from tcrag_langgraph.models.local import LocalChatModel

    cached = LocalChatModel(max_new_tokens=12, temperature=0.0)
    plain = LocalChatModel(max_new_tokens=12, temperature=0.0, kv_cache=False)
    start = [Frame(action=Action.USER_QUERY, content="Is metformin safe in pregnancy?")]
    first = None
    for stack in _script(start):
        messages = _messages(stack)
        a, a_ids = _gen_ids(cached, messages)
        b, b_ids = _gen_ids(plain, messages)
        _assert_same_greedy_output(lm, messages, a_ids, b_ids)
        first = first or a.usage_metadata["input_tokens"]
    stats = cached.kv_cache_stats
    # after the first call only new frames and the turn suffix are prefilled: under 15% of the prompts
    assert stats["prefill_tokens"] - first < 0.15 * (stats["prompt_tokens"] - first)


def test_seeded_sampling_is_unchanged_by_the_cache(lm):
    from tcrag_langgraph.models.local import LocalChatModel

    messages = _messages([Frame(action=Action.USER_QUERY, content="Name a diuretic.")], few_shot=False)
    a = LocalChatModel(max_new_tokens=5, temperature=0.8, seed=7)
    b = LocalChatModel(max_new_tokens=5, temperature=0.8, seed=7, kv_cache=False)
    first = [a.invoke(messages).content, a.invoke(messages).content]  # second call hits the cache
    assert first == [b.invoke(messages).content, b.invoke(messages).content]
    assert a.kv_cache_stats["reused_tokens"] > 0


def test_stop_strings_end_generation(lm):
    from tcrag_langgraph.models.local import LocalChatModel

    chat = LocalChatModel(max_new_tokens=40, temperature=0.0)
    messages = [HumanMessage(content="List three fruits, one per line.")]
    free = chat.invoke(messages)
    assert "\n" in free.content  # without a stop string the model writes several lines
    stopped = chat.invoke(messages, stop=["\n"])
    assert "\n" not in stopped.content
    # generation itself stopped at the newline (not just the text cut afterwards)
    assert stopped.usage_metadata["output_tokens"] < free.usage_metadata["output_tokens"]


def test_a_stop_string_is_matched_in_the_reply_only_never_across_the_prompt(lm):
    """The prompt ends with a newline; a reply starting with "Thought:" must not stop at once on
    "\nThought:" (the newline belongs to the prompt)."""
    from tcrag_langgraph.models.local import LocalChatModel

    chat = LocalChatModel(max_new_tokens=30, temperature=0.0)
    messages = [HumanMessage(content="Reply with 'Thought: ' and then one sentence about scurvy.")]
    free = chat.invoke(messages)
    first_word = free.content.split()[0]
    stop = "\n" + first_word
    assert stop not in free.content  # the reply never has it after one of its own newlines...
    stopped = chat.invoke(messages, stop=[stop])
    # ...so generation must run exactly as without the stop (the old criteria stopped at token 1)
    assert stopped.content == free.content
    assert stopped.usage_metadata["output_tokens"] == free.usage_metadata["output_tokens"]


def test_the_cache_is_passed_by_the_keyword_the_installed_transformers_takes(lm):
    """transformers 5.24 renamed past_key_values to cache (the old name warns and goes in 5.40); an
    earlier 5.x takes only past_key_values. Scoring and generation pass it without a warning."""
    import warnings

    from tcrag_langgraph.models.kv_cache import cache_keyword
    from tcrag_langgraph.monitor.scoring import LocalLMScorer

    class OldModel:
        def forward(self, input_ids, past_key_values=None, use_cache=False):
            return None

    assert cache_keyword(OldModel()) == "past_key_values"
    assert cache_keyword(lm.model) == ("cache" if "cache" in inspect.signature(lm.model.forward).parameters
                                       else "past_key_values")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        LocalLMScorer(lm).score("Which vitamin prevents scurvy?", "Vitamin C.", metric="cppl")
