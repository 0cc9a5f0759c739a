"""Async runs (ainvoke/astream/astream_events), isolation of concurrent runs, and the live event
channels (stream_mode="custom", astream_events) carrying every stack event."""

from __future__ import annotations

import asyncio
import threading
import time

from langgraph.checkpoint.memory import InMemorySaver

from tcrag_langgraph.faces.integration import checkpoint_serde
from tcrag_langgraph import build_graph
from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply, scripted_components, scripted_graph

# Every kind of event: push (Thought, Plan, Tool_Use), pop (Backtrack), pop+push (Summary), a state
# value change with a rejected Conclusion, a tool call and the halt decision.
EVERYTHING = {
    "mode": "sequence",
    "replies": ["Thought: think about {question}", "Plan: search then answer",
                "Tool_Use: DOC_RAG\nTool_Input: metformin", "Backtrack: not useful", "Summary: condensed plan",
                "Conclusion: too early", "Conclusion: metformin"],
    "scores": {"think about {question}": 30.0, "too early": 25.0, "metformin": 3.0},
    "tools": {"DOC_RAG": "passage about {input}"},
}
EXPECTED = [("User_Query", "push"), ("Thought", "push"), ("Plan", "push"), ("Tool_Use", "push"), ("Backtrack", "pop"),
            ("Summary", "pop+push"), ("Conclusion", "reject"), ("Conclusion", "push"), ("Halt", "halt")]


def _key(e: dict) -> tuple:
    return (e["step"], e["action"], e["op"], e["content"], e["stack_depth"], e["state_value"], e["detail"])


async def test_astream_custom_and_astream_events_carry_the_whole_trace():
    graph = scripted_graph(EVERYTHING)
    custom, final = [], None
    async for mode, chunk in graph.astream({"question": "Q?"}, stream_mode=["custom", "values"]):
        if mode == "custom":
            custom.append(chunk)
        else:
            final = chunk
    trace = [e.model_dump() for e in final["trace"]]
    assert [(e["action"], e["op"]) for e in custom] == EXPECTED
    assert [_key(e) for e in custom] == [_key(e) for e in trace]  # live == recorded, field by field
    assert [e["state_value"] for e in custom][1:] == [30.0, 30.0, 30.0, 30.0, 30.0, 25.0, 3.0, 3.0]
    assert custom[3]["content"] == "passage about metformin" and '"DOC_RAG"' in custom[3]["detail"]
    assert custom[-1]["detail"] == "validated"

    graph = scripted_graph(EVERYTHING)
    events = [ev async for ev in graph.astream_events({"question": "Q?"}, version="v2")
              if ev["event"] == "on_custom_event"]
    assert {ev["name"] for ev in events} == {"tcrag"}
    assert [_key(ev["data"]) for ev in events] == [_key(e) for e in trace]
    assert [ev["metadata"]["langgraph_node"] for ev in events][:4] == ["Start", "Thought", "Plan", "Tool_Use"]


def test_sync_stream_custom_matches_the_trace():
    graph = scripted_graph(EVERYTHING)
    custom = list(graph.stream({"question": "Q?"}, stream_mode="custom"))
    final = scripted_graph(EVERYTHING).invoke({"question": "Q?"})
    assert [_key(e) for e in custom] == [_key(e.model_dump()) for e in final["trace"]]


async def test_ainvoke_runs_sync_nodes_off_the_event_loop():
    """The nodes are sync; under ainvoke LangGraph runs them in a thread pool, so a slow model does
    not block the loop: a ticker keeps ticking while the model sleeps."""
    graph = scripted_graph({"replies": [{"reply": "Thought: slow {question}", "sleep_s": 0.6},
                                        {"reply": "Conclusion: done", "sleep_s": 0.6}], "default_score": 1.0})
    ticks = 0
    loop_thread = threading.get_ident()

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    out = await graph.ainvoke({"question": "Q?"})
    elapsed = time.monotonic() - started
    task.cancel()
    assert out["answer"] == "done" and out["halt_reason"] == "validated"
    assert elapsed >= 1.2 and ticks >= 20  # ~60 possible; a blocked loop would give ~0
    assert threading.get_ident() == loop_thread


async def test_twenty_concurrent_runs_on_one_graph_never_mix_questions():
    script = {
        "replies": [{"reply": "Thought: thinking about {question}", "sleep_s": 0.05},
                    "Tool_Use: DOC_RAG\nTool_Input: {question}",
                    {"reply": "Conclusion: the answer to {question}", "sleep_s": 0.05}],
        "scores": {"thinking about {question}": 40.0, "the answer to {question}": 1.0},
        "tools": {"DOC_RAG": "evidence for {input}"},
    }
    parts = scripted_components(script)
    graph = build_graph(**parts)
    questions = [f"question number {i} about drug {i * 7}?" for i in range(20)]
    outs = await asyncio.gather(*(graph.ainvoke({"question": q}) for q in questions))
    for q, out in zip(questions, outs):
        assert out["question"] == q and out["answer"] == f"the answer to {q}"
        assert [f.content for f in out["stack"]][:2] == [q, f"thinking about {q}"]
        assert out["stack"][2].tool_call.observation == f"evidence for {q}"
        assert [m.content for m in out["messages"]] == [q, f"the answer to {q}"]
        assert [e.step for e in out["trace"]] == [0, 1, 2, 3, 3] and out["steps"] == 3
        assert all(q in e.content for e in out["trace"] if e.action != "Tool_Use")
    asked = [c["question"] for c in parts["model"].calls]
    assert sorted(asked) == sorted(questions * 3)
    assert asked != [q for q in dict.fromkeys(asked) for _ in range(3)]  # the runs really interleaved


async def test_concurrent_threads_with_a_checkpointer_stay_separate():
    graph = scripted_graph({"replies": ["Conclusion: re {question}"], "default_score": 1.0},
                           checkpointer=InMemorySaver(serde=checkpoint_serde()))

    async def converse(i: int):
        cfg = {"configurable": {"thread_id": f"user-{i}"}}
        await graph.ainvoke({"messages": [("human", f"hello from {i}")]}, cfg)
        return await graph.ainvoke({"messages": [("human", f"again from {i}")]}, cfg)

    outs = await asyncio.gather(*(converse(i) for i in range(10)))
    for i, out in enumerate(outs):
        assert [m.content for m in out["messages"]] == [
            f"hello from {i}", f"re hello from {i}", f"again from {i}", f"re again from {i}"]
        assert out["stack"][0].content == f"again from {i}" and len(out["trace"]) == 3


def test_scripted_model_answers_from_the_prompt_under_threads():
    """The test double itself is thread-safe: the stack-mode reply depends only on the prompt."""
    from concurrent.futures import ThreadPoolExecutor

    from langchain_core.messages import HumanMessage

    model = ScriptedChatModel(replies=[ScriptedReply(reply="Thought: t {question}"),
                                       ScriptedReply(reply="Conclusion: c {question}")])

    def ask(i: int) -> str:
        shown = f"Begin!\nUser_Query: q{i}\n" + ("Thought: t q%d\n" % i if i % 2 else "") + "\nWrite your next action."
        return model.invoke([HumanMessage(content=shown)]).content

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(40)))
    assert replies == [f"Conclusion: c q{i}" if i % 2 else f"Thought: t q{i}" for i in range(40)]
    assert len(model.calls) == 40
