"""A stream of LlamaCppChatModel never holds the model for others (issue 40, item 1): the reply is
generated in a worker thread that holds the model's lock, never across a yield to the consumer.
The packaged GGUF, greedy, short replies; the hang checks wait generously and fail rather than hang."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

PROMPTS = ("Name a fruit.", "Name a colour.")
WAIT_S = 120  # far beyond a 24-token reply of the 135M model: only a held lock gets near it


@pytest.fixture(scope="module")
def chat():
    model = LlamaCppChatModel(max_new_tokens=24, temperature=0.0, seed=0)
    model.invoke("warm up")
    return model


def _invoke_in_thread(chat, prompt):
    """``chat.invoke(prompt)`` in a thread: the reply, or None when it was still waiting after WAIT_S."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("reply", chat.invoke(prompt).content), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    return result.get("reply")


def test_a_stalled_stream_does_not_hold_the_model(chat):
    expected = chat.invoke(PROMPTS[1]).content
    stalled = chat.stream(PROMPTS[0])
    first = next(stalled)  # one chunk read, then the consumer stops reading (a stalled client)
    assert first is not None
    assert _invoke_in_thread(chat, PROMPTS[1]) == expected  # answered, and right, meanwhile
    stalled.close()


def test_an_abandoned_stream_stops_and_leaves_the_model_usable(chat):
    expected = [chat.invoke(p).content for p in PROMPTS]
    for _ in range(20):  # 20 consumers that walk away after one chunk
        stream = chat.stream(PROMPTS[0])
        next(stream)
        stream.close()
    assert [_invoke_in_thread(chat, p) for p in PROMPTS] == expected


def test_two_async_streams_at_once_neither_raises_nor_locks(chat):
    expected = [chat.invoke(p).content for p in PROMPTS]

    async def read(prompt, stop_after=None):
        text = ""
        stream = chat.astream(prompt)
        async for chunk in stream:
            text += chunk.content
            if stop_after is not None and len(text) >= stop_after:
                await stream.aclose()  # an abandoned async stream
                break
        return text

    async def both():
        return await asyncio.gather(*(read(p) for p in PROMPTS), read(PROMPTS[0], stop_after=1))

    replies = asyncio.run(both())
    assert [r.strip() for r in replies[:2]] == expected
    assert _invoke_in_thread(chat, PROMPTS[0]) == expected[0]
