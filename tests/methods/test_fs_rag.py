"""FS-RAG: a retrieval before every sentence, with the question first, then the previous sentence."""

from __future__ import annotations

from tcrag_langgraph.methods.registry import build_fs_rag_graph
from tcrag_langgraph.testing import recording_model, scripted_tool

Q = "Is metformin first-line?"


def test_every_sentence_is_preceded_by_a_retrieval_with_the_previous_sentence():
    model = recording_model(["Metformin lowers glucose. It is cheap.", "It is safe. Really.", "Answer: yes"])
    graph = build_fs_rag_graph(model=model, tools=[scripted_tool("DOC_RAG", "Passage on {input}"),
                                                   scripted_tool("KG_RAG", "Fact on {input}")])
    out = graph.invoke({"question": Q})
    assert out["draft"] == "Metformin lowers glucose. It is safe.\nAnswer: yes"  # one sentence per call
    assert [e["query"] for e in out["evidence"] if e["tool"] == "DOC_RAG"] == [Q, "Metformin lowers glucose.",
                                                                            "It is safe."]
    assert out["tool_calls"] == 6 and out["retrieval_rounds"] == 3  # every tool each round
    # a sentence sees only the evidence retrieved for it
    assert "Passage on Metformin lowers glucose." in model.seen[1][-1].content
    assert f"Passage on {Q}" not in model.seen[1][-1].content
