"""Noise poisoning of the first retrieval."""

from __future__ import annotations

import pytest

from tcrag_langgraph.eval.datasets import QARecord
from tcrag_langgraph.eval.efficiency import UsageMeter
from tcrag_langgraph.methods.registry import build_method
from tcrag_langgraph.eval.noise import IRRELEVANT_NOISE, NoiseBank, PoisonController, poison_tools
from tcrag_langgraph.tools.tokens import count_tokens
from tcrag_langgraph.tools.base import ToolError

from .helpers import TextScorer, make_doc_tool, model


def mcq(i: int, subject: str) -> QARecord:
    return QARecord(f"m{i}", f"question {i}", "mcq", ("A",), options={"A": "a", "B": "b"},
                    metadata={"subject": subject, "explanation": f"explanation {i} about {subject}"})


RECS = [mcq(0, "Pharmacology"), mcq(1, "Anatomy"), mcq(2, "Pharmacology"), mcq(3, "Anatomy")]


def test_relevant_noise_comes_from_other_questions_of_the_same_subject():
    bank = NoiseBank.from_records(RECS)
    assert bank.relevant["m0"] == ["explanation 2 about Pharmacology"]
    assert bank.noise_for(RECS[1], "relevant", seed=0) == "explanation 3 about Anatomy"
    irrelevant = bank.noise_for(RECS[0], "irrelevant", seed=5)
    assert irrelevant in IRRELEVANT_NOISE
    assert bank.noise_for(RECS[0], "irrelevant", seed=5) == irrelevant  # deterministic
    assert bank.noise_for(RECS[0], "mixed", seed=5) == f"{irrelevant}\nexplanation 2 about Pharmacology"
    with pytest.raises(ValueError):
        bank.noise_for(RECS[0], "adversarial", seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        NoiseBank.from_records(RECS[:1])


def test_pubmedqa_relevant_noise_uses_shared_mesh_terms():
    recs = [
        QARecord("p1", "q", "yesno", ("yes",), context="ctx1", metadata={"meshes": ["Aspirin", "Stroke"]}),
        QARecord("p2", "q", "yesno", ("no",), context="ctx2", metadata={"meshes": ["Diabetes"]}),
        QARecord("p3", "q", "yesno", ("no",), context="ctx3", metadata={"meshes": ["Stroke", "Aspirin"]}),
    ]
    assert NoiseBank.from_records(recs).relevant["p1"] == ["ctx3"]


def test_structural_replaces_only_the_first_call_of_each_question():
    ctrl = PoisonController(NoiseBank.from_records(RECS), mode="structural", kind="relevant", seed=0)
    tool = poison_tools([make_doc_tool("real")], ctrl)[0]
    assert tool.name == "DOC_RAG" and tool.args == make_doc_tool().args
    with pytest.raises(RuntimeError, match="begin"):
        tool.invoke("x")
    ctrl.begin(RECS[0])
    assert tool.invoke("aspirin") == "explanation 2 about Pharmacology"
    assert tool.invoke("aspirin") == "real aspirin"
    ctrl.begin(RECS[1])
    assert not ctrl.poisoned
    assert tool.invoke({"query": "femur"}) == "explanation 3 about Anatomy" and ctrl.poisoned


def test_partial_appends_and_keeps_noise_within_the_token_budget():
    ctrl = PoisonController(NoiseBank.from_records(RECS), mode="partial", kind="relevant", seed=0, max_tokens=40)
    tool = poison_tools([make_doc_tool("word " * 200)], ctrl)[0]
    ctrl.begin(RECS[0])
    out = tool.invoke("x")
    assert out.startswith("word word") and out.endswith("\nexplanation 2 about Pharmacology")
    assert count_tokens(out) <= 40 + 5  # budget plus the trim marker


def test_partial_on_a_failed_first_call_leaves_noise_alone():
    from langchain_core.tools import tool as make_tool

    @make_tool("DOC_RAG")
    def failing(query: str):
        """Fails softly."""
        return ToolError("DOC_RAG", "unavailable", "index down")

    ctrl = PoisonController(NoiseBank.from_records(RECS), mode="partial", kind="irrelevant", seed=0)
    out = poison_tools([failing], ctrl)[0]
    ctrl.begin(RECS[0])
    assert out.invoke("x") in IRRELEVANT_NOISE and ctrl.first_call_failed is True


def test_poisoned_observation_reaches_the_stack_and_is_counted_once():
    ctrl = PoisonController(NoiseBank.from_records(RECS), mode="structural", kind="irrelevant", seed=1)
    tools = poison_tools([make_doc_tool()], ctrl)
    m = model("Tool_Use: DOC_RAG\nTool_Input: aspirin", "Backtrack: irrelevant", "Conclusion: A")
    graph = build_method("tcrag-cppl", model=m, tools=tools, scorer=TextScorer({"A": 1.0}))
    ctrl.begin(RECS[0])
    meter = UsageMeter()
    out = graph.invoke({"question": "question 0"}, config={"callbacks": [meter]})
    pushed = [e for e in out["trace"] if e.action == "Tool_Use"]
    assert pushed[0].content == ctrl.noise and ctrl.noise in IRRELEVANT_NOISE
    assert meter.retrievals == 1
    assert [(e.action, e.op) for e in out["trace"]][2] == ("Backtrack", "pop")


def test_a_poisoned_tool_keeps_the_schema_its_input_is_written_to():
    """The wrapper keeps the tool's metadata: EMR_SEARCH's schema for writing its input reaches TC-RAG's
    grammar in an attack run as in a plain one."""
    from tcrag_langgraph.methods.tcrag.reply_forms import action_form
    from tcrag_langgraph.tools import default_tools

    ctrl = PoisonController(NoiseBank.from_records(RECS), mode="structural", kind="irrelevant", seed=1)
    emr = default_tools(documents=False, web=False, knowledge_graph=False)
    wrapped = poison_tools(emr, ctrl)
    assert wrapped[0].metadata == emr[0].metadata and wrapped[0].metadata
    assert action_form(["Tool_Use"], wrapped).grammar == action_form(["Tool_Use"], emr).grammar
