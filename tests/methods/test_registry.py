"""Methods: every baseline and ablation built from the same model, tools and scorer."""

from __future__ import annotations

import pytest

from tcrag_langgraph import TCRAGConfig
from tcrag_langgraph.eval.efficiency import UsageMeter, question_cost
from tcrag_langgraph.methods.registry import METHOD_NAMES, METHODS, build_method, build_methods, tcrag_config_for

from ..eval.helpers import TextScorer, make_doc_tool, model

Q = "Which drug? Options: A. x B. y"


def system_text(m) -> str:
    return m.seen[0][0].content


def test_method_table_matches_the_paper_rows():
    # The paper's rows come first; the other papers' methods (kag-thinker, ...) follow them.
    assert METHOD_NAMES[:9] == (
        "base", "cot", "sr-rag", "react", "tcrag-cppl", "tcrag-uct", "wo-backtrack", "wo-summary", "wo-monitor",
    )
    assert {METHODS[n].label for n in METHOD_NAMES} >= {"ReAct", "TC-RAG-cppl", "w/o State Monitor"}


def test_switches_of_stack_machine_methods():
    base = TCRAGConfig(max_steps=7, sigma=4.0)
    react = tcrag_config_for("react", config=base)
    assert (react.enable_backtrack, react.enable_summary, react.enable_state_monitor, react.max_steps) == (False, False, False, 7)
    assert tcrag_config_for("tcrag-cppl", config=base).effective_sigma == 4.0  # same metric keeps its sigma
    assert tcrag_config_for("tcrag-uct", config=base).effective_sigma == 20.0  # cppl's sigma is not reused
    assert tcrag_config_for("tcrag-uct", config=base, sigmas={"uct": 2.5}).effective_sigma == 2.5
    wo = tcrag_config_for("wo-backtrack", config=base)
    assert not wo.enable_backtrack and wo.enable_summary and wo.enable_state_monitor
    with pytest.raises(ValueError, match="unknown method"):
        build_method("hykge", model=model("x"))  # a Table 1 baseline still absent
    with pytest.raises(ValueError, match="not a stack-machine"):
        tcrag_config_for("base")


def test_base_and_cot_make_one_call_without_tools():
    tool = make_doc_tool()
    m = model("B")
    out = build_method("base", model=m, tools=[tool]).invoke({"question": Q})
    assert (out["answer"], out["llm_calls"], out["tool_calls"], out["halt_reason"]) == ("B", 1, 0, "answered")
    assert m.seen[0][1].content == Q
    cot_model = model("Step 1: x is wrong.\nStep 2: y fits.\nAnswer: B")
    out = build_method("cot", model=cot_model).invoke({"question": Q})
    assert out["answer"] == "B" and "step by step" in system_text(cot_model)


def test_sr_rag_retrieves_once_per_tool_then_answers():
    m = model("B")
    meter = UsageMeter()
    tools = [make_doc_tool("doc:"), make_doc_tool("kb:")]
    tools[1].name = "KG_RAG"
    out = build_method("sr-rag", model=m, tools=tools).invoke({"question": Q}, config={"callbacks": [meter]})
    assert out["tool_calls"] == 2 and out["llm_calls"] == 1
    assert meter.retrievals == 2 and meter.tool_names == ["DOC_RAG", "KG_RAG"] and meter.llm_calls == 1
    prompt = m.seen[0][1].content
    assert f"[DOC_RAG]\ndoc: {Q}" in prompt and f"[KG_RAG]\nkb: {Q}" in prompt


def test_model_error_is_a_wrong_answer_not_a_crash():
    class Broken(type(model("x"))):
        def _call(self, *a, **k):
            raise RuntimeError("server down")

    out = build_method("base", model=Broken(responses=["x"], seen=[])).invoke({"question": Q})
    assert out["answer"] is None and out["halt_reason"] == "model_error" and "server down" in out["error"]


def test_react_is_the_stack_machine_without_backtrack_summary_and_monitor():
    m = model("Tool_Use: DOC_RAG\nTool_Input: aspirin", "Conclusion: B")
    scorer = TextScorer(default=99.0)  # would reject every Conclusion if the monitor were on
    out = build_method("react", model=m, tools=[make_doc_tool()], scorer=scorer).invoke({"question": Q})
    assert out["answer"] == "B" and out["halt_reason"] == "conclusion_unmonitored" and not out["answer_validated"]
    prompt = system_text(m)
    assert "Tool_Use:" in prompt and "Backtrack:" not in prompt and "Summary:" not in prompt
    assert not any(call[1] == "B" for call in scorer.calls)


def test_tcrag_validates_with_the_monitor_and_the_ablations_differ():
    script = ["Tool_Use: DOC_RAG\nTool_Input: aspirin", "Backtrack: not useful", "Conclusion: A", "Conclusion: B"]
    scorer = TextScorer({"B": 2.0, "A": 30.0})
    meter = UsageMeter()
    m = model(*script)
    out = build_method("tcrag-cppl", model=m, tools=[make_doc_tool()], scorer=scorer).invoke(
        {"question": Q}, config={"callbacks": [meter]}
    )
    assert out["answer"] == "B" and out["answer_validated"] and out["halt_reason"] == "validated"
    cost = question_cost(out, meter, wall_time_s=0.0)
    assert (cost.llm_calls, cost.retrievals, cost.backtracks, cost.summaries) == (4, 1, 1, 0)
    # The meter's own tiktoken counts agree with the graph's bookkeeping.
    assert (cost.prompt_tokens, cost.completion_tokens) == (out["token_usage"]["prompt"], out["token_usage"]["completion"])
    assert {c[2] for c in scorer.calls} == {"cppl"}

    uct_scorer = TextScorer({"A": 1.0})
    build_method("tcrag-uct", model=model("Conclusion: A"), scorer=uct_scorer).invoke({"question": Q})
    assert uct_scorer.calls and {c[2] for c in uct_scorer.calls} == {"uct"}

    m2 = model("Conclusion: A")
    out = build_method("wo-monitor", model=m2, scorer=TextScorer(default=99.0)).invoke({"question": Q})
    assert out["answer"] == "A" and out["halt_reason"] == "conclusion_unmonitored"
    m3 = model("Conclusion: A")
    build_method("wo-backtrack", model=m3, tools=[make_doc_tool()], scorer=TextScorer({"A": 1.0})).invoke({"question": Q})
    assert "Backtrack:" not in system_text(m3) and "Summary:" in system_text(m3)
    m4 = model("Conclusion: A")
    build_method("wo-summary", model=m4, tools=[make_doc_tool()], scorer=TextScorer({"A": 1.0})).invoke({"question": Q})
    assert "Summary:" not in system_text(m4) and "Backtrack:" in system_text(m4)


def test_build_methods_shares_pieces_and_rejects_unknown():
    graphs = build_methods(["base", "react", "base"], model=model("Conclusion: B"), scorer=TextScorer())
    assert list(graphs) == ["base", "react"]
    with pytest.raises(ValueError, match="unknown methods"):
        build_methods(["base", "sure"], model=model("x"))  # SuRe: a Table 1 baseline still absent
    with pytest.raises(TypeError):
        build_method("base", model=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a model folder"):  # a name is resolved like every builder's
        build_method("base", model="gpt")


def test_only_a_method_that_indexes_documents_gets_them_and_reads_them_whole(monkeypatch):
    import importlib

    seen = {}

    def fake(name):
        def builder(*, model, tools, scorer, config, **extra):
            seen[name] = extra
            return build_method("base", model=model, config=config)
        return builder

    monkeypatch.setattr(importlib.import_module("tcrag_langgraph.methods.diffrag").DiffRAG, "build", fake("diffrag"))
    monkeypatch.setattr(importlib.import_module("tcrag_langgraph.methods.crp_rag").CRPRAG, "build", fake("crp"))
    docs = ["doc-a", "doc-b"]
    build_methods(["diffrag", "crp-rag"], model=model("Conclusion: yes"), documents=docs)
    assert seen["diffrag"] == {"documents": docs, "options": {"max_passages": 5000}, "name": "diffrag"}
    assert seen["crp"] == {"options": None, "name": "crp-rag"}
    build_method("diffrag", model=model("Conclusion: yes"))
    assert seen["diffrag"] == {"options": None, "name": "diffrag"}
    # a method's own options reach its builder, beside the documents (the caller's values win)
    build_methods(["diffrag", "crp-rag"], model=model("Conclusion: yes"), documents=docs,
                  method_options={"crp-rag": {"fan_out": 1}, "diffrag": {"max_passages": 3}})
    assert seen["crp"] == {"options": {"fan_out": 1}, "name": "crp-rag"}
    assert seen["diffrag"] == {"documents": docs, "options": {"max_passages": 3}, "name": "diffrag"}


def test_method_options_are_refused_where_they_cannot_apply():
    with pytest.raises(ValueError, match="takes no method options"):
        build_method("tcrag-cppl", model=model("Conclusion: yes"), options={"fan_out": 1})
    with pytest.raises(ValueError, match="not run"):
        build_methods(["base"], model=model("Conclusion: yes"), method_options={"crp-rag": {"fan_out": 1}})
    with pytest.raises(ValueError, match="fan_out"):  # the method's own options model validates them
        build_method("crp-rag", model=model("Conclusion: yes"), options={"fan_out": 99})


def test_the_faces_default_is_tc_rag_with_the_configuration_as_given():
    """``tcrag ask``, ``tcrag serve`` and Studio build through the registry: the default method keeps
    the metric, switches and sigma the user set (the table's rows name their metric)."""
    from tcrag_langgraph.methods.registry import DEFAULT_METHOD

    cfg = TCRAGConfig(metric="uct", sigma=3.0, enable_backtrack=False)
    scorer = TextScorer({"yes": 1.0})
    out = build_method(DEFAULT_METHOD, model=model("Conclusion: yes"), scorer=scorer, config=cfg).invoke(
        {"question": "Q?"})
    assert (out["metric"], out["sigma"], out["halt_reason"]) == ("uct", 3.0, "validated")
    assert DEFAULT_METHOD not in METHOD_NAMES and not METHODS[DEFAULT_METHOD].in_tables  # not an evaluation row
    with pytest.raises(ValueError, match="takes no method options"):
        build_method(DEFAULT_METHOD, model=model("Conclusion: yes"), scorer=scorer, options={"fan_out": 1})
