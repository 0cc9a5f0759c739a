"""Greedy replies decoded together (tcrag_langgraph.models.llama_cpp_batch, through
``LlamaCppChatModel.greedy_replies``) on the packaged SmolLM2 GGUF run by llama.cpp: the replies come
back in order, keep to a grammar, end where they should, and are the model's own greedy replies where
its choice is clear; bad input is refused before anything is decoded."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_batch import MAX_SEQUENCES, greedy_batch
from tcrag_langgraph.models.llama_cpp_grammar import GrammarError

QUESTIONS = ("What is the capital of France?", "Name a fruit that is yellow.", "What colour is the sky?",
             "How many legs does a cat have?", "What do bees make?")


@pytest.fixture(scope="module")
def chat():
    return LlamaCppChatModel(max_new_tokens=12, temperature=0.0, n_threads=1)


def conversation(question: str) -> list:
    return [SystemMessage("You answer in a few words."), HumanMessage(question)]


def test_every_reply_keeps_to_the_grammar_and_comes_back_in_its_prompts_place(chat):
    # five prompts in two sequences: three start as others end (continuous batching)
    grammar = 'root ::= "Answer: " ( "yes" | "no" ) "."\n'
    replies = chat.greedy_replies([conversation(q) for q in QUESTIONS], grammar=grammar, sequences=2)
    assert [r.text in ("Answer: yes.", "Answer: no.") for r in replies] == [True] * 5
    assert all(r.finish_reason == "stop" and 0 < r.completion_tokens < 12 for r in replies)
    prompts = [chat.llama_model.prompt_ids(conversation(q)) for q in QUESTIONS]
    assert [r.prompt_tokens for r in replies] == [len(p) for p in prompts]


def test_a_clear_greedy_reply_is_the_reply_the_model_gives_alone(chat):
    """Batched kernels may round a near tie the other way, so a batched reply is compared with the
    one-at-a-time reply up to the first token where the model's first choice beat its second by less
    than 0.5 nats."""
    alone = [chat.invoke(conversation(q), logprobs=True, top_logprobs=2) for q in QUESTIONS]
    together = chat.greedy_replies([conversation(q) for q in QUESTIONS], sequences=3)
    compared = 0
    for single, batched in zip(alone, together):
        clear = ""
        for token in single.response_metadata["logprobs"]["content"]:
            first, second = token["top_logprobs"][:2]
            if first["logprob"] - second["logprob"] < 0.5:
                break
            clear += token["token"]
        if clear.strip():
            assert batched.text.startswith(clear.strip()), (clear, batched.text)
            compared += len(clear.strip())
    if compared < 10:
        pytest.skip("the packaged model's replies were not clear enough on this machine to compare")


def test_the_token_budget_ends_a_reply_with_length(chat):
    replies = chat.greedy_replies([conversation("Write a long story about a dragon.")] * 2, max_new_tokens=5)
    assert [(r.completion_tokens, r.finish_reason) for r in replies] == [(5, "length")] * 2
    assert replies[0].text == replies[1].text != ""


def test_bad_input_is_refused_before_anything_is_decoded(chat):
    lm = chat.llama_model
    prompt = lm.prompt_ids(conversation("Hi"))
    assert chat.greedy_replies([]) == []
    with pytest.raises(ValueError, match="at least one prompt"):
        greedy_batch(lm, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="sequences"):
        greedy_batch(lm, [prompt], max_new_tokens=4, sequences=MAX_SEQUENCES + 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_batch(lm, [prompt], max_new_tokens=0)
    with pytest.raises(ValueError, match="at least one token"):
        greedy_batch(lm, [prompt, []], max_new_tokens=4)
    with pytest.raises(ValueError, match="exceeds the context"):
        greedy_batch(lm, [prompt], max_new_tokens=lm.n_ctx)
    with pytest.raises(GrammarError):
        chat.greedy_replies([conversation("Hi")], grammar="root ::= (")


def test_a_cancelled_run_stops_the_batch_and_leaves_the_model_usable(chat):
    from tcrag_langgraph.models.run_control import RunCancelled, RunControl, controlled

    control = RunControl()
    control.cancel("the client went away")
    with controlled(control), pytest.raises(RunCancelled, match="client went away"):
        chat.greedy_replies([conversation(q) for q in QUESTIONS], sequences=2)
    assert len(chat.greedy_replies([conversation("Hi")], max_new_tokens=3)) == 1
