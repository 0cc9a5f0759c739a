"""Self-RAG with prompted reflections: Retrieve? decides, IsRel filters passages, IsSup and IsUse rank
the candidates."""

from __future__ import annotations

from tcrag_langgraph.methods.adaptive import FIRST_PIECE_WITH_EVIDENCE
from tcrag_langgraph.methods.registry import build_self_rag_graph
from tcrag_langgraph.methods.self_rag import read_reflection
from tcrag_langgraph.testing import recording_model, scripted_tool

Q = "Is metformin first-line?"
DOCS = "[1] source: a\nMetformin is first-line.\n\n[2] source: b\nAn unrelated text.\n\n[3] source: c\nMetformin is old."


def run(replies, **options):
    model = recording_model(replies)
    graph = build_self_rag_graph(model=model, tools=[scripted_tool("DOC_RAG", DOCS)], options=options or None)
    return graph.invoke({"question": Q}), model


def test_no_to_retrieve_answers_without_calling_a_tool():
    out, model = run(["No", "Metformin is first-line.\nAnswer: yes"])
    assert (out["tool_calls"], out["llm_calls"], out["answer"]) == (0, 2, "yes")
    assert "Would searching" in model.seen[0][-1].content


def test_yes_retrieves_once_and_the_best_supported_relevant_candidate_wins():
    replies = ["Yes",
               "Relevant", "Metformin is first-line.\nAnswer: yes", "Fully supported", "4",   # passage 1
               "Irrelevant",                                                                   # passage 2
               "Relevant", "Metformin is old.\nAnswer: maybe", "No support", "5"]            # passage 3
    out, model = run(replies)
    assert out["tool_calls"] == 1 and out["evidence"][0]["query"] == Q
    assert out["answer"] == "yes"  # 1 + 1 + 0.5 * 0.75 beats 1 + 0 + 0.5 * 1
    assert out["llm_calls"] == len(replies)  # no candidate for the irrelevant passage
    candidate_prompts = [call[-1].content for call in model.seen if FIRST_PIECE_WITH_EVIDENCE in call[-1].content]
    assert len(candidate_prompts) == 2 and "An unrelated text" not in " ".join(candidate_prompts)


def test_max_passages_and_an_unclear_retrieve_reply():
    out, _ = run(["Maybe", "Irrelevant", "Answer: no"], max_passages=1)  # unclear: retrieve; no relevant passage
    assert out["tool_calls"] == 1 and out["answer"] == "no"
    out, _ = run(["Maybe", "Answer: no"], retrieve_when_unclear=False)
    assert out["tool_calls"] == 0 and out["answer"] == "no"


def test_reflection_replies_are_read_leniently_and_unclear_ones_are_none():
    assert read_reflection("retrieve", "No, it would not.") == 0.0
    assert read_reflection("isrel", "The passage is not relevant.") == 0.0
    assert read_reflection("isrel", "**Relevant**") == 1.0
    assert read_reflection("isuse", "I'd say 3.") == 0.5
    assert read_reflection("isuse", "very useful") is None
