"""FL-RAG: a retrieval before every n tokens of answer, the question first, then the previous window."""

from __future__ import annotations

import pytest
from tcrag_langgraph.tools.tokens import count_tokens

from tcrag_langgraph.methods.registry import build_fl_rag_graph
from tcrag_langgraph.testing import recording_model, scripted_tool

Q = "Is metformin first-line?"


def run(replies, *, n_tokens=4, config=None):
    model = recording_model(replies)
    graph = build_fl_rag_graph(model=model, tools=[scripted_tool("DOC_RAG", "Passage on {input}")], config=config,
                               options={"n_tokens": n_tokens})
    return graph.invoke({"question": Q}), model


def test_every_window_of_n_tokens_is_preceded_by_a_retrieval_with_the_previous_window():
    replies = ["Metformin lowers hepatic glucose output in", "most adults with type two diabetes", "Answer: yes"]
    out, model = run(replies)
    pieces = [e.content for e in out["trace"] if e.action == "Thought"]
    assert len(pieces) == 3
    # the first 4 tokens of each reply (a whole reply when shorter)
    assert [count_tokens(p) for p in pieces] == [4, 4, 3] and all(r.startswith(p) for r, p in zip(replies, pieces))
    assert [e["query"] for e in out["evidence"]] == [Q, *pieces[:2]]
    assert out["tool_calls"] == 3 and out["answer"] == "yes"
    # each window was written with the evidence of the retrieval just before it
    for call, query in zip(model.seen, [Q, *pieces[:2]]):
        assert f"Passage on {query}" in call[-1].content


def test_a_bigger_window_retrieves_less_and_max_steps_caps_the_rounds():
    out, _ = run(["Metformin lowers glucose.", "Answer: yes"], n_tokens=64)
    assert out["tool_calls"] == 2
    out, _ = run(["one two three four", "five six seven eight", "nine ten", "Answer: yes"], n_tokens=4,
                 config={"max_steps": 2})
    assert out["retrieval_rounds"] == 2 and out["answer"] == "yes"


def test_the_window_is_a_validated_option():
    with pytest.raises(ValueError, match="n_tokens"):
        run(["x"], n_tokens=0)
