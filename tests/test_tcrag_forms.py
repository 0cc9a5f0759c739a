"""TC-RAG's declared reply form (:mod:`tcrag_langgraph.methods.tcrag.reply_forms`): one action line,
decided by llama.cpp's own grammar engine over the packaged GGUF's vocabulary against what
:func:`~tcrag_langgraph.methods.tcrag.actions.parse_action` reads, and a monitored run of the packaged
model under it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from tcrag_langgraph import TCRAGConfig, build_graph
from tcrag_langgraph.core import answer_format
from tcrag_langgraph.methods.tcrag.actions import parse_action
from tcrag_langgraph.methods.tcrag.reply_forms import action_form
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_grammar import grammar_accepts
from tcrag_langgraph.tools import default_tools

ALL = ["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion"]


@pytest.fixture(scope="module")
def lm():
    return LlamaCppChatModel(n_threads=1).llama_model


@pytest.fixture(scope="module")
def tools():
    return [t for t in default_tools() if t.name in ("DOC_RAG", "KG_RAG")]


@pytest.mark.parametrize("reply, action, tool_input", [
    ("Thought: Scurvy is caused by a lack of vitamin C.", "Thought", None),
    ("Tool_Use: DOC_RAG\nTool_Input: scurvy vitamin deficiency", "Tool_Use", "scurvy vitamin deficiency"),
    ('Tool_Use: DOC_RAG\nTool_Input: {"query": "scurvy", "k": 3}', "Tool_Use", {"query": "scurvy", "k": 3}),
    ('Tool_Use: KG_RAG\nTool_Input: {"entities": ["Marfan syndrome"]}', "Tool_Use", {"entities": ["Marfan syndrome"]}),
    ("Summary: Two trials found no effect.", "Summary", None),
    ("Backtrack:", "Backtrack", None),
    ("Conclusion: Yes.", "Conclusion", None),
    ("Conclusion: maybe", "Conclusion", None),
])
def test_the_action_grammar_admits_the_actions_the_parser_reads(lm, tools, reply, action, tool_input):
    parsed = parse_action(reply, [t.name for t in tools])
    assert (parsed.action.value, parsed.tool_input) == (action, tool_input)
    assert grammar_accepts(lm, action_form(ALL, tools, ("yes", "no", "maybe")).grammar, reply)


@pytest.mark.parametrize("reply", [
    "Tool_Use: DOC_RAGS\nTool_Input: scurvy",  # the parser would guess DOC_RAG; the grammar names tools exactly
    'Tool_Use: DOC_RAG\nTool_Input: {"q": "scurvy"}',  # JSON that is not DOC_RAG's arguments
    'Tool_Use: DOC_RAG\nTool_Input: {"query": "scurvy", "k": "three"}',
    "Tool_Use: WEB_SEARCH\nTool_Input: scurvy",  # not a tool of this run
    "Thought: I will search.\nTool_Use: DOC_RAG\nTool_Input: scurvy",  # two actions in one reply
    "Conclusion: yes, but maybe no.",  # not one of the allowed answers
    "Tool_Observation: vitamin C",  # an observation the model writes itself
    "The answer is yes.",  # no label
])
def test_the_action_grammar_refuses_what_a_run_cannot_use_as_it_is(lm, tools, reply):
    assert not grammar_accepts(lm, action_form(ALL, tools, ("yes", "no", "maybe")).grammar, reply)


@pytest.mark.parametrize("written, usable", [
    ('{"operation": "similar", "sex": "F"}', False),  # Qwen2.5-Coder-1.5B's: neither codes nor a condition
    ('{"sex": "F", "age_min": 60}', False),
    ('{"codes": ["heart failure"]}', False),  # not an ICD-10-CM code
    ('{"operation": "lookup"}', False),
    ('{"condition": "heart failure", "sex": "F"}', True),
    ('{"codes": ["E11.9", "I50"], "age_max": 80, "age_min": 60, "condition": "heart failure", "limit": 3}', True),
    ('{"patient_id": "P00042"}', True),
])
def test_records_input_is_written_to_what_the_records_tool_accepts(lm, written, usable):
    """EMR_SEARCH's JSON is written to the tool's schema for writing (codes, or a condition, or a patient
    id; tools/emr/parsing.py), not to its argument schema, which requires nothing: the grammar admits
    exactly what the tool's own validation accepts, here."""
    from pydantic import ValidationError

    from tcrag_langgraph.tools.emr.parsing import EMRInput

    emr = [t for t in default_tools() if t.name == "EMR_SEARCH"]
    reply = f"Tool_Use: EMR_SEARCH\nTool_Input: {written}"
    assert grammar_accepts(lm, action_form(ALL, emr, ("yes", "no", "maybe")).grammar, reply) is usable
    try:
        EMRInput.model_validate(parse_action(reply, ["EMR_SEARCH"]).tool_input)
        validated = True
    except ValidationError:
        validated = False
    assert validated is usable


def test_the_grammar_offers_only_the_steps_actions(lm, tools):
    final = action_form(["Conclusion"], tools, ("A", "B", "C", "D")).grammar
    assert grammar_accepts(lm, final, "Conclusion: B") and not grammar_accepts(lm, final, "Thought: hmm")
    class Dose(BaseModel):
        drug: str
        mg: int

    structured = action_form(["Conclusion"], [], Dose).grammar  # a pydantic answer format: its JSON
    assert answer_format.problem(Dose, '{"drug": "aspirin", "mg": 100}') is None
    assert grammar_accepts(lm, structured, 'Conclusion: {"drug": "aspirin", "mg": 100}')
    assert not grammar_accepts(lm, structured, 'Conclusion: {"drug": "aspirin", "mg": "a lot"}')
    without = action_form(["Thought", "Conclusion"], [], None).grammar  # no tools, no Backtrack, free answer
    assert grammar_accepts(lm, without, "Conclusion: Vitamin C deficiency.")
    assert not grammar_accepts(lm, without, "Backtrack: useless")
    assert not grammar_accepts(lm, without, "Tool_Use: DOC_RAG\nTool_Input: x")


def test_a_monitored_run_of_the_packaged_model_writes_only_usable_actions():
    chat = LlamaCppChatModel(n_threads=1)
    config = TCRAGConfig(max_steps=3, max_new_tokens=48, temperature=0.0, answer_format=("yes", "no"))
    graph = build_graph(model=chat, tools=[], config=config)
    out = graph.invoke({"question": "Is vitamin C deficiency the cause of scurvy?"})
    assert [e.detail for e in out["trace"] if e.op == "format_error"] == []
    assert out["structured_answer"] in ("yes", "no") and out["halt_reason"] != "format_error"
