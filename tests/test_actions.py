"""parse_action: what real models write, and a property test that no string crashes it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcrag_langgraph.core.state import Action
from tcrag_langgraph.methods.tcrag.actions import ActionParseError, format_instructions, parse_action

TOOLS = ["DOC_RAG", "KG_RAG", "WEB_SEARCH"]


@pytest.mark.parametrize(
    "text,action,content",
    [
        ("Thought: check the dose", "Thought", "check the dose"),
        ("thought: lower case", "Thought", "lower case"),
        ("THOUGHT : shouting", "Thought", "shouting"),
        ("Thought：full-width colon", "Thought", "full-width colon"),
        ("Thought missing the colon", "Thought", "missing the colon"),
        ("**Thought:** bold label", "Thought", "bold label"),
        ("**Plan**: bold then colon", "Plan", "bold then colon"),
        ("### Plan\nsearch, then answer", "Plan", "search, then answer"),
        ("- Summary: the abstract says yes", "Summary", "the abstract says yes"),
        ("Sure! Here is my step.\nPlan: look it up", "Plan", "look it up"),
        ("Backtrack: irrelevant", "Backtrack", "irrelevant"),
        ("Backtrack", "Backtrack", ""),
        ("Final Answer: yes", "Conclusion", "yes"),
        ("Conclusion: B", "Conclusion", "B"),
        ("Thought: I now know the final answer. Conclusion: maybe", "Conclusion", "maybe"),
        ("Thought: first\nPlan: second", "Thought", "first"),
        ("Thought:\nThought: the stutter is skipped", "Thought", "the stutter is skipped"),
        ("Thought:\nPlan: look it up", "Plan", "look it up"),
        ("思考：需要检索文献", "Thought", "需要检索文献"),
        ("```\nConclusion: fenced\n```", "Conclusion", "fenced"),
    ],
)
def test_plain_actions(text, action, content):
    parsed = parse_action(text, TOOLS)
    assert parsed.action.value == action
    assert parsed.content == content


@pytest.mark.parametrize(
    "text,tool,tool_input",
    [
        ("Tool_Use: DOC_RAG\nTool_Input: metformin dose", "DOC_RAG", "metformin dose"),
        ("Tool Use: doc_rag\nTool Input: metformin", "DOC_RAG", "metformin"),
        ("Tool_Use: `KG_RAG`", "KG_RAG", None),
        ("Tool_Use: [WEB_SEARCH]\nTool_Input: \"aspirin\"", "WEB_SEARCH", "aspirin"),
        ("Tool_Use: DOC-RAG.", "DOC_RAG", None),
        ("Tool_Use: DOC_RAGG", "DOC_RAG", None),
        ("Action: KG_RAG\nAction Input: {\"query\": \"asthma\"}", "KG_RAG", {"query": "asthma"}),
        ("Tool_Use: DOC_RAG[insulin types]", "DOC_RAG", "insulin types"),
        ("Tool_Use: DOC_RAG(insulin types)", "DOC_RAG", "insulin types"),
        ("Tool_Use: DOC_RAG\nTool_Input: {'query': 'asthma', 'k': 3}", "DOC_RAG", {"query": "asthma", "k": 3}),
        ('{"tool": "KG_RAG", "input": "asthma"}', "KG_RAG", "asthma"),
        ("Tool_Use: DOC_RAG\nTool_Input: x\nTool_Observation: made up", "DOC_RAG", "x"),
        ("Tool_Use: DOC_RAG\nTool_Input: {broken json", "DOC_RAG", "{broken json"),
    ],
)
def test_tool_use(text, tool, tool_input):
    parsed = parse_action(text, TOOLS)
    assert parsed.action is Action.TOOL_USE
    assert parsed.tool == tool
    assert parsed.tool_input == tool_input


def test_invented_observation_is_dropped():
    parsed = parse_action("Tool_Use: DOC_RAG\nTool_Input: q\nObservation: Metformin cures all.\nConclusion: yes", TOOLS)
    assert parsed.action is Action.TOOL_USE
    assert any("observation" in r for r in parsed.repairs)
    with pytest.raises(ActionParseError):
        parse_action("Observation: the answer is yes", TOOLS)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("I don't know what to do", "no action label"),
        ("Thought:", "empty"),
        ("Tool_Use: GOOGLE", "unknown tool"),
        ("Thoughtful remarks only", "no action label"),
    ],
)
def test_unusable_output_explains_itself(text, needle):
    with pytest.raises(ActionParseError, match=needle):
        parse_action(text, TOOLS)


def test_unlabeled_prose_can_be_read_as_a_thought():
    parsed = parse_action("The first-line drug is metformin.", TOOLS, unlabeled_as="Thought")
    assert parsed.action is Action.THOUGHT and parsed.content == "The first-line drug is metformin."
    for junk in ("?!?", "42", "ok", "\x00\x01"):
        with pytest.raises(ActionParseError):
            parse_action(junk, TOOLS, unlabeled_as="Thought")
    with pytest.raises(ActionParseError, match="no action label"):
        parse_action("The first-line drug is metformin.", TOOLS)


def test_disallowed_and_toolless_actions():
    with pytest.raises(ActionParseError, match="Backtrack is not available"):
        parse_action("Backtrack: x", TOOLS, allowed=["Thought", "Conclusion"])
    with pytest.raises(ActionParseError, match="no tools are available"):
        parse_action("Tool_Use: DOC_RAG", [])


def test_an_action_written_as_a_tool_is_that_action_unless_a_tool_has_its_name():
    # Qwen2.5-Coder-0.5B's reply on every re-prompt of a closed-book MedMCQA run (no tools at all)
    out = parse_action("Tool_Use: Backtrack\nSummary: The lateral spread is by the enamel lamellae.", [])
    assert out.action is Action.BACKTRACK and any("read as the Backtrack action" in r for r in out.repairs)
    out = parse_action("Tool_Use: Summary - vitamin C cures scurvy", TOOLS)
    assert out.action is Action.SUMMARY and out.content == "vitamin C cures scurvy"
    out = parse_action("Tool_Use: Conclusion: B", [])  # an empty Tool_Use label, then the real action
    assert out.action is Action.CONCLUSION and out.content == "B"
    # a tool of that name is the tool; an unknown word is still an unknown tool
    assert parse_action("Tool_Use: summary", ["Summary"]).tool == "Summary"
    with pytest.raises(ActionParseError, match="unknown tool 'Reflect'"):
        parse_action("Tool_Use: Reflect", TOOLS)
    with pytest.raises(ActionParseError, match="no tools are available"):
        parse_action("Tool_Use: PubMed search", [])


def test_an_action_the_run_does_not_allow_gives_way_to_the_allowed_one_after_it():
    # the 0.5B with no tools: its reasoning is in the Summary after an impossible Tool_Use
    out = parse_action("Tool_Use: Isotretinoin\nSummary: Isotretinoin causes these defects.", [])
    assert out.action is Action.SUMMARY and out.content == "Isotretinoin causes these defects."
    assert any("took the Summary that followed" in r for r in out.repairs)
    out = parse_action("Backtrack: wrong path\nConclusion: B", TOOLS, allowed=["Thought", "Conclusion"])
    assert out.action is Action.CONCLUSION and out.content == "B"
    with pytest.raises(ActionParseError, match="Backtrack is not available"):  # nothing allowed after it
        parse_action("Backtrack: wrong path\nPlan: search again", TOOLS, allowed=["Thought", "Conclusion"])


def test_format_instructions_list_only_allowed_actions():
    text = format_instructions(["Thought", "Tool_Use", "Conclusion"], ["DOC_RAG"])
    assert "Tool_Use: <one of DOC_RAG>" in text and "Backtrack" not in text


_labels = st.sampled_from(["Thought", "Plan", "Summary", "Backtrack", "Conclusion", "thought", "PLAN", "Final Answer"])
# Control characters are stripped as junk, so they are left out of well-formed bodies.
_body = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters=":："), min_size=1, max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=400), st.binary(max_size=64), st.none(), st.integers()))
def test_never_crashes_on_any_input(text):
    try:
        parsed = parse_action(text, TOOLS)
    except ActionParseError as err:
        assert str(err)
        return
    assert parsed.action in set(Action) - {Action.USER_QUERY}
    if parsed.action is Action.TOOL_USE:
        assert parsed.tool in TOOLS
    elif parsed.action is not Action.BACKTRACK:
        assert parsed.content.strip()


@settings(max_examples=300, deadline=None)
@given(_labels, _body, st.sampled_from(["", "  ", "**", "## "]))
def test_well_formed_actions_round_trip(label, body, prefix):
    text = f"{prefix}{label}: {body}"
    try:
        parsed = parse_action(text, TOOLS)
    except ActionParseError:
        # Only a body with no readable text may be rejected.
        assert not re.sub(r"[*_`\s]+", "", body)
        return
    expected = {"final answer": "Conclusion"}.get(label.lower(), label.capitalize())
    assert parsed.action.value == expected or parsed.action is Action.CONCLUSION  # a body may hold "Answer: ..."


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(TOOLS), st.text(max_size=80), st.text(max_size=80))
def test_observation_text_never_reaches_the_action(tool, tool_input, invented):
    text = f"Tool_Use: {tool}\nTool_Input: {tool_input}\nTool_Observation: SECRET-{invented}"
    try:
        parsed = parse_action(text, TOOLS)
    except ActionParseError:
        return
    assert "SECRET-" not in str(parsed.tool_input) and "SECRET-" not in parsed.content
