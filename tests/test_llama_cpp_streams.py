"""A stream of LlamaCppChatModel never holds the model for others (issue 40, item 1): the reply is
generated in a worker thread that holds the model's lock, never across a yield to the consumer. A
cancelled run leaves the model at its next token, and a caller waits at most busy_timeout_s.
The packaged GGUF, greedy, short replies; the hang checks wait generously and fail rather than hang."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.run_control import ModelBusy, RunCancelled, RunControl, controlled

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


LONG = "Write a long story about a cat."  # 400 tokens without an end-of-generation token (greedy)


def test_a_cancelled_run_leaves_the_model_at_its_next_token(chat):
    """Cancel on disconnect, the model half: a run cancelled mid-reply (by a server whose client left)
    stops decoding at the next token with RunCancelled, and the model answers the next caller."""
    expected = chat.invoke(PROMPTS[1]).content
    control = RunControl()
    with controlled(control):
        stream = chat.stream(LONG, max_new_tokens=400)
        next(stream)  # decoding has begun, in the worker that holds the model
        control.cancel("the client disconnected")
        with pytest.raises(RunCancelled, match="the client disconnected"):
            pieces = [chunk.content for chunk in stream]
            print(f"not cancelled: {len(''.join(pieces))} more characters")  # what broken code prints
    with controlled(control), pytest.raises(RunCancelled):  # the kernel's path (invoke) stops at its first token
        chat.invoke(LONG, max_new_tokens=400)
    assert _invoke_in_thread(chat, PROMPTS[1]) == expected


def test_a_caller_waiting_longer_than_busy_timeout_gets_model_busy(chat):
    """In Python, a clear 'busy' instead of an unbounded wait: the lock is held by another thread (as a
    long reply would), and a model with busy_timeout_s gives up after it, naming the wait."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with chat.llama_model.lock:
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait(WAIT_S)
    chat.busy_timeout_s = 0.5
    try:
        with pytest.raises(ModelBusy, match=r"was busy: another call held it for 0\.\d s, longer than this "
                                            r"model's busy_timeout_s \(0\.5 s\)"):
            chat.invoke(PROMPTS[0])
    finally:
        chat.busy_timeout_s = None
        release.set()
        holder.join(WAIT_S)
