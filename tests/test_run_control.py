"""A run answers to its RunControl (models/run_control.py): the kernel checks it before every node and
every model call, so a cancelled run stops there and a paused one waits there. Scripted model and
scorer; the waits are for events (a thread inside a node), never for time."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tcrag_langgraph import build_graph
from tcrag_langgraph.models.run_control import RunCancelled, RunControl, controlled

from .conftest import ScriptedScorer, scripted

THOUGHTS = [f"Thought: thought {i}" for i in range(10)]


def graph_over(model):
    return build_graph(model=model, tools=[], scorer=ScriptedScorer(default=50.0), config={"max_steps": 6})


def test_a_cancelled_run_stops_before_its_next_model_call():
    model = scripted(THOUGHTS)
    control = RunControl()
    control.cancel("the client disconnected")
    with controlled(control), pytest.raises(RunCancelled, match="the client disconnected"):
        graph_over(model).invoke({"question": "q?"})
    assert model.seen == []


def test_a_run_cancelled_during_a_model_call_makes_no_other():
    control = RunControl()

    class CancelsOnFirstCall(type(scripted([]))):
        def _call(self, messages, stop=None, run_manager=None, **kwargs):
            control.cancel("the client went away during the first call")  # as a server does, from another thread
            return super()._call(messages, stop=stop, run_manager=run_manager, **kwargs)

    model = CancelsOnFirstCall(responses=THOUGHTS, seen=[])
    with controlled(control), pytest.raises(RunCancelled):
        graph_over(model).invoke({"question": "q?"})
    assert len(model.seen) == 1


def test_a_paused_run_waits_at_its_next_node_and_goes_on_when_resumed():
    model = scripted(THOUGHTS)
    control = RunControl()
    control.pause()
    out = {}

    def run() -> None:
        with controlled(control):
            out["state"] = graph_over(model).invoke({"question": "q?"})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while control.active == 0 and thread.is_alive():  # inside the first node, at its checkpoint
        time.sleep(0.01)
    assert model.seen == [] and "state" not in out
    control.resume()
    thread.join(60)
    assert out["state"]["halt_reason"] == "max_steps" and control.wait_idle(0)


def test_the_control_reaches_the_worker_threads_of_an_async_run():
    """Under ainvoke LangGraph runs the sync nodes in worker threads: they must see the caller's control."""
    model = scripted(THOUGHTS)
    control = RunControl()
    control.cancel("cancelled before the run")

    async def run():
        with controlled(control):
            await graph_over(model).ainvoke({"question": "q?"})

    with pytest.raises(RunCancelled):
        asyncio.run(run())
    assert model.seen == []
