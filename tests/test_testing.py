"""The test doubles' script keys (tcrag_langgraph.testing) that let a script drive every method:
native tool calls, the real tools in a chosen order, a name for stored calibrations, token log-probs."""

from __future__ import annotations

import pytest

from tcrag_langgraph.models.local import chat_model_id
from tcrag_langgraph.testing import ScriptedScorer, ScriptedTokenScorer, scripted_components


def test_a_reply_with_tool_calls_is_a_native_tool_call_and_bind_tools_keeps_the_script():
    parts = scripted_components({"replies": [{"reply": "", "tool_calls": [{"name": "EMR_SEARCH", "args": {"q": 1}}]},
                                             "Done."], "mode": "sequence"})
    model = parts["model"].bind_tools([])
    first, second = model.invoke("hi"), model.invoke("hi again")
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("EMR_SEARCH", {"q": 1})] and first.tool_calls[0]["id"]
    assert second.content == "Done." and second.tool_calls == []


def test_real_tools_may_be_named_in_order_and_an_unknown_name_is_refused():
    parts = scripted_components({"replies": ["Conclusion: x"], "real_tools": ["EMR_SEARCH", "WEB_SEARCH"]})
    assert [t.name for t in parts["tools"]] == ["EMR_SEARCH", "WEB_SEARCH"]
    assert [t.name for t in scripted_components({"replies": ["x"], "real_tools": True})["tools"]] == [
        "DOC_RAG", "WEB_SEARCH", "KG_RAG", "EMR_SEARCH"]  # default_tools() order
    with pytest.raises(ValueError, match="NOPE"):
        scripted_components({"replies": ["x"], "real_tools": ["NOPE"]})


def test_model_id_names_the_model_only_when_the_script_gives_one():
    assert chat_model_id(scripted_components({"replies": ["x"], "model_id": "scripted-a"})["model"]) == "scripted-a"
    with pytest.raises(ValueError, match="cannot tell which model"):
        chat_model_id(scripted_components({"replies": ["x"]})["model"])  # a stand-in is not a model to calibrate


def test_a_bad_tool_call_or_token_scorer_is_a_clear_error():
    with pytest.raises(ValueError, match="name"):
        scripted_components({"replies": [{"reply": "", "tool_calls": [{"args": {}}]}]})
    with pytest.raises(ValueError, match="token_scorer"):
        scripted_components({"replies": ["x"], "token_scorer": {"default_lp": -1.0}})
    with pytest.raises(ValueError, match="<= 0"):
        scripted_components({"replies": ["x"], "token_scorer": {"default_logprob": 1.0}})


def test_token_scorer_replaces_the_scores():
    plain = scripted_components({"replies": ["x"], "default_score": 3.0})["scorer"]
    assert isinstance(plain, ScriptedScorer) and plain.score("q", "t", metric="cppl") == 3.0
    tokens = scripted_components({"replies": ["x"], "token_scorer": {"default_logprob": -0.5, "logprobs": {"dose": -4.0}}})
    assert isinstance(tokens["scorer"], ScriptedTokenScorer)
    assert tokens["scorer"].token_logprobs("q", "a dose") == [-0.5, -4.0]
