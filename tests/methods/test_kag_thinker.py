"""KAG-Thinker's graph: #n propagation, knowledge boundary, depth solving, Math, Deduce, Output,
events, checkpointing and bad input, with scripted models (every transition), plus one end-to-end
run with the packaged SmolLM2 and the real KG_RAG tool (slow). The parsers and the Math evaluator
have their own files (test_kag_thinker_parsing.py, _replies.py, _arithmetic.py)."""

from __future__ import annotations

import json
import logging
import math

import pytest
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver

from tcrag_langgraph.core.result import RunResult
from tcrag_langgraph.faces.integration import checkpoint_serde
from tcrag_langgraph.methods.kag_thinker import (
    KAGThinkerOptions,
    LogicalFormParseError,
    parse_boundary_answer,
    parse_focus,
)
from tcrag_langgraph.methods.registry import build_kag_thinker_graph
from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply, ScriptedScorer, recording_model


class LogprobScorer:
    """Likelihood-test double: scripted log-probs per scored answer text (every call recorded)."""

    def __init__(self, logprobs: dict[str, list[float]], default: list[float] | None = None) -> None:
        self.logprobs = logprobs
        self.default = default if default is not None else [math.log(0.01)]
        self.calls: list[tuple[str, str]] = []

    def token_logprobs(self, context: str, text: str) -> list[float]:
        self.calls.append((context, text))
        return self.logprobs.get(text, self.default)


def sequence_model(*replies: str) -> ScriptedChatModel:
    """Replies in call order; one call too many raises ScriptExhausted (the run halts model_error)."""
    return ScriptedChatModel(replies=[ScriptedReply(reply=r) for r in replies], mode="sequence")


def recording_tool(name: str, template: str, seen: list):
    def run(query: str) -> str:
        seen.append(query)
        return template.replace("{input}", query)

    return StructuredTool.from_function(run, name=name, description=f"test tool {name}")


def failing_tool(name: str):
    def run(query: str) -> str:
        raise RuntimeError("backend down")

    return StructuredTool.from_function(run, name=name, description="always fails")


def run_plan(replies: list[str], question: str, *, tools=None, config=None):
    """One run of the graph without the knowledge-boundary check, the model giving ``replies`` in order
    (recorded): the final state and the model."""
    model = recording_model(replies)
    graph = build_kag_thinker_graph(model=model, tools=tools, config=config, options={"knowledge_boundary": False})
    return graph.invoke({"question": question}), model


def events(out, action=None):
    return [e for e in out["trace"] if action is None or e.action == action]


def detail(event) -> dict:
    return json.loads(event.detail)


# ----------------------------------------------------------------------------------------------
# The graph
# ----------------------------------------------------------------------------------------------

MATH_PLAN = "Step1: What is 6 times 7?\nAction1: Math(content=[], target='6*7')->m1\nStep2: Output #1.\nAction2: Output(#1)"


def test_invalid_plan_is_reprompted_then_used():
    out, model = run_plan(["I think the answer is 42.", MATH_PLAN], "6 x 7?")
    assert (out["answer"], out["halt_reason"], out["answer_validated"], out["llm_calls"]) == ("42", "answered", True, 2)
    errors = events(out, "Logical_Form")
    assert [e.op for e in errors][0] == "format_error"
    second_prompt = model.seen[1]
    assert "could not be used: no logical forms found" in second_prompt[-1].content
    assert second_prompt[-2].content == "I think the answer is 42."


def test_reprompts_are_bounded():
    out, model = run_plan(["nonsense"], "6 x 7?", config={"max_format_retries": 2})  # cycles: always unusable
    assert out["halt_reason"] == "format_error" and out["answer"] is None
    assert out["llm_calls"] == 3 == len(model.seen)
    assert "after 3 tries" in out["error"]
    assert [e.op for e in out["trace"]].count("format_error") == 3 and out["trace"][-1].op == "halt"


def test_hash_references_propagate_into_queries_and_deduce():
    seen: list[str] = []
    tool = recording_tool("DOC", "Passage about {input}.", seen)
    plan = ("Step1: Who wrote The Pequod?\nAction1: Retrieval(s=s1:book['The Pequod'], p=p1:author, o=o1:person)\n"
            "Step2: Where was #1 born?\nAction2: Retrieval(s=o1, p=p2:birthplace, o=o2:place)\n"
            "Step3: Is #2 in the USA?\nAction3: Deduce(op=judgement, content=['o1', '#2'], target='is o2 in the USA')->d3\n"
            "Step4: Output #3\nAction4: Output(#3)")
    out, model = run_plan([plan, "<focus>ref 0</focus><answer>Herman Melville</answer>",
                           "<answer>New York City</answer>", "Yes, it is. <answer>Yes</answer>"],
                          "Was the author of The Pequod born in the USA?", tools=[tool])
    assert seen == ["Who wrote The Pequod?", "Where was Herman Melville born?"]
    deduce_prompt = model.seen[3][-1].content
    assert "- #1: Herman Melville" in deduce_prompt and "- #2: New York City" in deduce_prompt
    assert "Target: is New York City in the USA" in deduce_prompt and "(judgement)" in deduce_prompt
    assert out["answer"] == "Yes" and out["answer_validated"] and out["tool_calls"] == 2
    assert [s["source"] for s in out["solutions"]] == ["retrieved", "retrieved", "deduce"]


def test_a_choice_deduce_shows_literal_options_as_choices_and_its_reply_stays_in_the_trace():
    # the 1.5B's commonest plan on yes/no questions: one Deduce over the quoted options, no Retrieval
    plan = ("Step1: Does aspirin lower the risk of a second heart attack?\n"
            "Action1: Deduce(op=choice, content=['yes', 'no', 'maybe'], target='whether aspirin lowers the risk')->d1\n"
            "Step2: Output #1\nAction2: Output(#1)")
    reply = "Trials show aspirin lowers the risk of a second infarction. <answer>yes</answer>"
    out, model = run_plan([plan, reply], "Does aspirin lower the risk of a second heart attack?")
    prompt = model.seen[1][-1].content
    known = prompt.split("Known facts:\n", 1)[1].split("\n", 1)[0]
    assert known == "(none retrieved: reason from what you know)"
    assert "Choices: yes / no / maybe\n" in prompt and "- yes" not in prompt
    deduce = events(out, "Deduce")[-1]
    assert detail(deduce)["reply"] == reply and deduce.content == "yes"
    assert out["answer"] == "yes" and out["halt_reason"] == "answered"


def test_a_choice_deduce_over_earlier_answers_keeps_them_as_facts():
    seen: list[str] = []
    tool = recording_tool("DOC", "Passage about {input}.", seen)
    plan = ("Step1: Does aspirin lower infarction risk?\n"
            "Action1: Retrieval(s=s1:drug['aspirin'], p=p1:lowers, o=o1:risk)\n"
            "Step2: Pick the answer from #1.\n"
            "Action2: Deduce(op=choice, content=['#1', 'yes', 'no'], target='the answer')->d2\n"
            "Step3: Output #2\nAction3: Output(#2)")
    out, model = run_plan([plan, "<focus>ref 0</focus><answer>it lowers the risk by a quarter</answer>",
                           "The passage says it does. <answer>yes</answer>"], "Does aspirin lower infarction risk?",
                          tools=[tool])
    prompt = model.seen[2][-1].content
    assert "Known facts:\n- #1: it lowers the risk by a quarter\nChoices: yes / no\n" in prompt
    assert out["answer"] == "yes"


@pytest.mark.parametrize("verdict, min_prob, skipped", [
    ("True", 0.9, True), ("True", 0.05, False), ("False", 0.9, False), ("False", 0.05, False)])
def test_knowledge_boundary_needs_both_tests(verdict, min_prob, skipped):
    seen: list[str] = []
    tool = recording_tool("DOC", "Moby-Dick's Pequod ... by {input}", seen)
    plan = "Step1: Who is the author of The Pequod?\nAction1: Retrieval(s=s1:ship['The Pequod'], p=p1:author, o=o1:person)"
    replies = [plan, "It is Melville. <answer>\\boxed{Herman Melville}</answer>",
               f"Checking... <answer>\\boxed{{{verdict}}}</answer>"]
    if not skipped:
        replies.append("<focus>ref 0</focus><answer>Herman Melville (from references)</answer>")
    scorer = LogprobScorer({"Herman Melville": [math.log(0.99), math.log(min_prob), math.log(0.95)]})
    out = build_kag_thinker_graph(model=sequence_model(*replies), tools=[tool], scorer=scorer,
                                  options={"min_token_prob": 0.3}).invoke({"question": "Who wrote The Pequod?"})
    boundary = detail(events(out, "Knowledge_Boundary")[0])
    assert boundary["stated_confidence"] is (verdict == "True")
    assert boundary["min_token_prob"] == pytest.approx(min_prob)
    assert boundary["skip_retrieval"] is skipped
    assert scorer.calls == [(scorer.calls[0][0], "Herman Melville")] and "The Pequod" in scorer.calls[0][0]
    assert out["tool_calls"] == (0 if skipped else 1) and len(seen) == out["tool_calls"]
    assert out["answer"] == ("Herman Melville" if skipped else "Herman Melville (from references)")
    assert out["solutions"][0]["source"] == ("internal" if skipped else "retrieved")
    assert out["llm_calls"] == len(replies)


def test_boundary_refusal_retrieves_without_self_check_and_scorer_faults_fail_safe():
    class BrokenScorer:
        def token_logprobs(self, context, text):
            raise RuntimeError("scorer down")

    plan = "Step1: Who hosts Splash?\nAction1: Retrieval(s=s1:show['Splash'], p=p1:host, o=o1:person)"
    tool = recording_tool("DOC", "Splash is hosted by Joey Lawrence.", [])
    refusal = sequence_model(plan, "Based on my internal knowledge, I can't answer this question.",
                             "<answer>Joey Lawrence</answer>")
    out = build_kag_thinker_graph(model=refusal, tools=[tool], scorer=BrokenScorer()).invoke({"question": "Host?"})
    assert detail(events(out, "Knowledge_Boundary")[0])["generated"] is None and out["llm_calls"] == 3
    confident = sequence_model(plan, "<answer>\\boxed{Joey Lawrence}</answer>", "\\boxed{True}",
                               "<answer>Joey Lawrence</answer>")
    out = build_kag_thinker_graph(model=confident, tools=[tool], scorer=BrokenScorer()).invoke({"question": "Host?"})
    check = detail(events(out, "Knowledge_Boundary")[0])
    assert check["likelihood_error"] == "RuntimeError: scorer down" and check["skip_retrieval"] is False
    assert out["tool_calls"] == 1 and out["answer"] == "Joey Lawrence"


def test_depth_solving_is_bounded_in_turns():
    seen: list[str] = []
    tool = recording_tool("DOC", "Unrelated passage for {input}.", seen)
    plan = "Step1: Who directed Khiladi 420?\nAction1: Retrieval(s=s1:film['Khiladi 420'], p=p1:director, o=o1:person)"
    next_form = "<focus>{focus}</focus>\nStep: {query}\nAction: Retrieval(s=s1, p=p1:director, o=o1:person)"
    replies = [plan] + [next_form.format(focus=f"nothing {i}", query=f"query {i}") for i in range(1, 4)]
    out = build_kag_thinker_graph(model=sequence_model(*replies), tools=[tool],
                                  options={"knowledge_boundary": False, "max_depth_turns": 3}).invoke(
        {"question": "Who directed Khiladi 420?"})
    assert seen == ["Who directed Khiladi 420?", "query 1", "query 2"]  # the third next form is not searched
    assert out["tool_calls"] == 3 and out["llm_calls"] == 4
    assert out["solutions"][0] == {"index": 1, "function": "Retrieval", "answer": "nothing 3", "source": "unresolved",
                                   "resolved": False}
    assert out["halt_reason"] == "answered" and out["answer_validated"] is False
    assert [detail(e)["turn"] for e in events(out, "Retrieve")] == [1, 2, 3]
    # A per-run override lowers the bound.
    model = sequence_model(*replies)
    out = build_kag_thinker_graph(model=model, tools=[tool], options={"knowledge_boundary": False}).invoke(
        {"question": "Who directed Khiladi 420?"}, context={"max_depth_turns": 1})
    assert out["tool_calls"] == 1 and out["llm_calls"] == 2


def test_tool_errors_are_never_evidence():
    plan = "Step1: Who hosts Splash?\nAction1: Retrieval(s=s1:show['Splash'], p=p1:host, o=o1:person)"
    out = build_kag_thinker_graph(model=sequence_model(plan), tools=[failing_tool("DOC")],
                                  options={"knowledge_boundary": False}).invoke({"question": "Host?"})
    retrieve = detail(events(out, "Retrieve")[0])
    assert retrieve["calls"] == [{"tool": "DOC", "error": "exception"}]
    assert out["llm_calls"] == 1  # no focus call over nothing
    assert out["solutions"][0]["resolved"] is False and out["answer_validated"] is False
    assert out["knowledge"] == [] and RunResult.from_state(out).evidence == []


def test_the_retrieved_references_are_the_runs_evidence():
    seen: list[str] = []
    plan = "Step1: Who hosts Splash?\nAction1: Retrieval(s=s1:show['Splash'], p=p1:host, o=o1:person)"
    out = build_kag_thinker_graph(model=sequence_model(plan, "<answer>Ann Lee</answer>"),
                                  tools=[recording_tool("DOC", "Splash is hosted by Ann Lee ({input}).", seen)],
                                  options={"knowledge_boundary": False}).invoke({"question": "Host?"})
    assert out["answer"] == "Ann Lee" and len(seen) == 1
    assert out["knowledge"] == [{"tool": "DOC", "text": f"Splash is hosted by Ann Lee ({seen[0]})."}]
    assert RunResult.from_state(out).evidence == [f"Splash is hosted by Ann Lee ({seen[0]})."]


def test_math_from_references_and_model_written_expression_with_refusal():
    seen: list[str] = []
    tool = recording_tool("DOC", "{input}", seen)
    plan = ("Step1: How old is the patient?\nAction1: Retrieval(s=s1:patient['A'], p=p1:age, o=o1:years)\n"
            "Step2: Twice #1?\nAction2: Math(content=['#1'], target='#1 * 2')->m2\n"
            "Step3: Add ten years to #2.\nAction3: Math(content=['m2'], target='ten more years than m2')->m3\n"
            "Step4: Output #3\nAction4: Output(m3)")
    out, model = run_plan([plan, "<answer>21 years old</answer>", "<expression>__import__('os')</expression>",
                           "total = m2 + 10"], "Age in ten years, doubled first?", tools=[tool])
    maths = events(out, "Math")
    assert [e.content for e in maths if e.op == "push"] == ["42", "52"]
    assert [detail(e)["written_by"] for e in maths if e.op == "push"] == ["target", "model"]
    refusal = [e for e in maths if e.op == "format_error"]
    assert len(refusal) == 1 and "calls allowed only to" in detail(refusal[0])["error"]
    assert "- #2: 42" in model.seen[2][-1].content  # the model saw the referenced answer
    assert out["answer"] == "52" and out["llm_calls"] == 4


def test_math_without_a_number_in_the_reference_halts_after_bounded_reprompts():
    plan = ("Step1: Who?\nAction1: Retrieval(s=s1:x['a'], p=p1:r, o=o1:y)\n"
            "Step2: Double #1\nAction2: Math(content=['#1'], target='#1 * 2')->m2\nStep3: Out\nAction3: Output(#2)")
    out, model = run_plan([plan, "<answer>nobody</answer>", "#1 * 2", "<expression>#1 * 2</expression>"], "q?",
                          tools=[recording_tool("DOC", "x", [])], config={"max_format_retries": 1})
    assert out["halt_reason"] == "format_error" and "holds no number" in out["error"]
    assert out["llm_calls"] == 2 + 2


def test_output_joins_several_references_and_graph_shape():
    plan = ("Step1: A\nAction1: Math(content=[], target='1+1')->m1\nStep2: B\nAction2: Math(content=[], target='2*3')->m2\n"
            "Step3: Both\nAction3: Output(#1, m2)")
    graph = build_kag_thinker_graph(model=sequence_model(plan), options={"knowledge_boundary": False})
    out = graph.invoke({"question": "1+1 and 2*3?"})
    assert out["answer"] == "2; 6" and out["steps"] == 4
    result = RunResult.from_state(out)
    assert result.halt_reason == "answered" and out["messages"][-1].content == "2; 6"
    drawn = graph.get_graph().draw_mermaid()
    for edge in ("Decompose -.-> Retrieval", "Retrieval -.-> Depth_Solve", "Depth_Solve -.-> Depth_Solve",
                 "Math -.-> Output", "Deduce -.-> Math"):
        assert edge.replace(" -.-> ", " -.-> ") in drawn, edge


def test_events_stream_live_in_order():
    plan = "Step1: A\nAction1: Math(content=[], target='1+1')->m1\nStep2: Out\nAction2: Output(#1)"
    graph = build_kag_thinker_graph(model=sequence_model(plan), options={"knowledge_boundary": False})
    payloads = [c for c in graph.stream({"question": "1+1?"}, stream_mode="custom")]
    assert [(p["type"], p["action"], p["op"]) for p in payloads] == [
        ("tcrag", "User_Query", "push"), ("tcrag", "Logical_Form", "push"), ("tcrag", "Logical_Form", "push"),
        ("tcrag", "Math", "push"), ("tcrag", "Output", "push"), ("tcrag", "Halt", "halt")]


def test_checkpointed_run_pauses_and_resumes_without_repeating_calls(caplog):
    seen: list[str] = []
    plan = ("Step1: Who wrote The Pequod?\nAction1: Retrieval(s=s1:book['The Pequod'], p=p1:author, o=o1:person)\n"
            "Step2: Output #1\nAction2: Output(#1)")
    model = sequence_model(plan, "<answer>\\boxed{Melville}</answer>", "\\boxed{False}", "<answer>Herman Melville</answer>")
    saver = InMemorySaver(serde=checkpoint_serde())
    graph = build_kag_thinker_graph(model=model, tools=[recording_tool("DOC", "text on {input}", seen)],
                                    scorer=LogprobScorer({}), checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}}
    with caplog.at_level(logging.WARNING):
        paused = graph.invoke({"question": "Who wrote The Pequod?"}, config, interrupt_before=["Depth_Solve"])
        assert paused.get("halt_reason") is None and paused["depth"]["draft"] == "Melville"
        assert graph.get_state(config).next == ("Depth_Solve",)
        out = graph.invoke(None, config)
    assert out["answer"] == "Herman Melville" and model.call_count == 4 and seen == ["Who wrote The Pequod?"]
    assert not [r for r in caplog.records if "unregistered" in r.getMessage()]
    # A new question on the same thread starts clean.
    again = build_kag_thinker_graph(model=sequence_model(MATH_PLAN), checkpointer=saver,
                                    options={"knowledge_boundary": False}).invoke({"question": "6 x 7?"}, config)
    assert again["answer"] == "42" and again["trace"][0].content == "6 x 7?" and len(again["solutions"]) == 1


@pytest.mark.parametrize("payload, why", [
    ({"question": "   "}, "empty"), ({"question": 42}, "must be text"), ({"question": "?!"}, "no readable text"),
    ({}, "no question")])
def test_bad_input_halts_without_model_calls(payload, why):
    model = sequence_model(MATH_PLAN)
    out = build_kag_thinker_graph(model=model, options={"knowledge_boundary": False}).invoke(payload)
    assert out["halt_reason"] == "invalid_input" and why in out["error"] and model.call_count == 0
    assert out["trace"][-1].op == "halt"


def test_model_failure_halts_with_the_reason():
    model = ScriptedChatModel(replies=[ScriptedReply(reply=MATH_PLAN)], mode="sequence")
    graph = build_kag_thinker_graph(model=model, options={"knowledge_boundary": False})
    graph.invoke({"question": "6 x 7?"})
    out = graph.invoke({"question": "6 x 7 again?"})  # the script is spent
    assert out["halt_reason"] == "model_error" and "ScriptExhausted" in out["error"]


def test_bad_arguments_are_clear_errors():
    """TypeError for a wrong type, ValueError for a bad value (the same rule for every builder)."""
    model = sequence_model(MATH_PLAN)
    with pytest.raises(TypeError, match="BaseTool"):
        build_kag_thinker_graph(model=model, tools=["DOC"], options={"knowledge_boundary": False})
    tool = recording_tool("DOC", "x", [])
    with pytest.raises(ValueError, match="unique"):
        build_kag_thinker_graph(model=model, tools=[tool, tool], options={"knowledge_boundary": False})
    with pytest.raises(ValueError, match="not given"):
        build_kag_thinker_graph(model=model, tools=[tool], options={"knowledge_boundary": False,
                                                                     "retrieval_tools": ["WEB"]})
    with pytest.raises(ValueError, match="token_logprobs"):
        build_kag_thinker_graph(model=model, scorer=ScriptedScorer())
    with pytest.raises(ValueError):
        KAGThinkerOptions(max_depth_turns=0)
    with pytest.raises(ValueError):
        KAGThinkerOptions(unknown=1)
    with pytest.raises(TypeError, match="model must be"):
        build_kag_thinker_graph(model=3, options={"knowledge_boundary": False})
    graph = build_kag_thinker_graph(model=model, options={"knowledge_boundary": False})
    with pytest.raises(ValueError):
        graph.invoke({"question": "q?"}, context={"max_depth_turns": 99})


def test_the_plan_gets_its_own_token_budget():
    """A whole plan needs more tokens than one action: max_plan_tokens sets the decomposition's
    budget (per call, as LocalChatModel takes it); without it the shared max_new_tokens applies."""
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from pydantic import Field

    from tcrag_langgraph.models.local import LocalChatModel

    class BudgetRecorder(LocalChatModel):  # no weights are loaded: _generate is replaced
        budgets: list = Field(default_factory=list)

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            self.budgets.append(kwargs.get("max_new_tokens"))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=MATH_PLAN))])

    for options, expected in (({"max_plan_tokens": 400}, [400]), ({}, [96])):
        model = BudgetRecorder()
        graph = build_kag_thinker_graph(model=model, config={"max_new_tokens": 96},
                                        options={"knowledge_boundary": False, **options})
        assert graph.invoke({"question": "6 x 7?"})["answer"] == "42"
        assert model.budgets == expected
    with pytest.raises(ValueError):
        build_kag_thinker_graph(model=BudgetRecorder(), options={"max_plan_tokens": 8})


def test_registered_for_eval():
    from tcrag_langgraph.methods.registry import METHODS, build_method

    assert METHODS["kag-thinker"].takes_options
    graph = build_method("kag-thinker", model=sequence_model(MATH_PLAN), scorer=LogprobScorer({}))
    out = graph.invoke({"question": "6 x 7?"})
    assert out["answer"] == "42" and out["halt_reason"] == "answered"


@pytest.mark.slow
def test_end_to_end_with_smollm_and_the_knowledge_graph(one_torch_thread):
    from tcrag_langgraph.tools.knowledge_graph import default_knowledge_graph_tool

    from tcrag_langgraph.models.local import LocalChatModel
    from tcrag_langgraph.monitor.own_model import scorer_for_model

    model = LocalChatModel()
    graph = build_kag_thinker_graph(
        model=model, tools=[default_knowledge_graph_tool(max_entities=2)], scorer=scorer_for_model(model),
        config={"max_new_tokens": 96, "temperature": 0.0, "max_format_retries": 1},
        options={"max_logical_forms": 3, "max_depth_turns": 2})
    out = graph.invoke({"question": "Which phenotypes are associated with Marfan syndrome?"})
    assert out["halt_reason"] in {"answered", "format_error", "no_answer"}
    trace = out["trace"]
    assert trace[0].action == "User_Query" and trace[-1].op == "halt" and trace[-1].action == "Halt"
    assert sum(e.op == "halt" for e in trace) == 1
    # Bounded: decomposition retries, then per form at most a boundary check and the depth turns.
    assert out["llm_calls"] <= 2 + 3 * (2 + 2 * 2) and out["tool_calls"] <= 3 * 2
    assert out["tool_calls"] == sum(len(detail(e)["calls"]) for e in events(out, "Retrieve"))
    assert len(out["solutions"]) == len([e for e in trace if e.action in ("Retrieval", "Math", "Deduce")
                                         and e.op == "push"])
    for e in events(out, "Knowledge_Boundary"):
        check = detail(e)
        assert check["skip_retrieval"] == (check["confident"] and check["likely"])
        if "min_token_prob" in check:
            assert 0.0 <= check["min_token_prob"] <= 1.0
    if out["halt_reason"] == "answered":
        assert out["answer"] and out["messages"][-1].content == out["answer"]


def test_a_model_without_log_probs_needs_a_scorer_or_the_boundary_off():
    from tcrag_langgraph.monitor.scoring import MonitorUnavailableError

    with pytest.raises(MonitorUnavailableError, match="knowledge_boundary"):
        build_kag_thinker_graph(model=sequence_model(MATH_PLAN))
    graph = build_kag_thinker_graph(model=sequence_model(MATH_PLAN), options={"knowledge_boundary": False})
    assert graph.invoke({"question": "6 x 7?"})["answer"] == "42"


def test_per_run_overrides_are_checked():
    plan = "Step1: Who?\nAction1: Retrieval(s=s1:x['a'], p=p1:r, o=o1:y)\nStep2: Out\nAction2: Output(#1)"
    graph = build_kag_thinker_graph(model=sequence_model(plan), tools=[recording_tool("DOC", "x", [])],
                                    options={"knowledge_boundary": False})
    out = graph.invoke({"question": "q?"}, context={"knowledge_boundary": True})  # no scorer was built in
    assert out["halt_reason"] == "scorer_error" and "token_logprobs" in out["error"] and out["tool_calls"] == 0
    with pytest.raises(ValueError, match="context must be"):
        graph.invoke({"question": "q?"}, context=["max_depth_turns", 1])
    with pytest.raises(ValueError, match="retrieval_tools"):
        graph.invoke({"question": "q?"}, context={"retrieval_tools": ["WEB"]})


def test_output_puts_the_answer_in_the_asked_format():
    plan = ("Step1: Who wrote The Pequod?\nAction1: Retrieval(s=s1:book['The Pequod'], p=p1:author, o=o1:person)\n"
            "Step2: Output #1\nAction2: Output(#1)")
    tool = recording_tool("DOC", "The Pequod is the ship in Melville's Moby-Dick.", [])
    options = {"knowledge_boundary": False}
    # Already in the form: no model call.
    model = recording_model([plan, "<answer>Yes, Melville</answer>"])
    out = build_kag_thinker_graph(model=model, tools=[tool], options=options).invoke(
        {"question": "Did Melville write it?"}, context={"answer_format": ["yes", "no"]})
    assert (out["structured_answer"], out["llm_calls"], out["halt_reason"]) == ("yes", 2, "answered")
    # Not in the form: the Output executor asks, re-prompts once, then it fits.
    model = recording_model([plan, "<answer>Herman Melville</answer>", "<answer>B or A</answer>",
                             "Melville wrote it, and B names him.\n<answer>(B)</answer>"])
    out = build_kag_thinker_graph(model=model, tools=[tool], options=options).invoke(
        {"question": "Who wrote it? A. Hawthorne B. Melville"}, context={"answer_format": ["A", "B"]})
    assert (out["answer"], out["structured_answer"], out["llm_calls"]) == ("(B)", "B", 4)
    # the prompt shows each sub-question beside what it found, and asks for a sentence before the answer
    asked = model.seen[2][-1].content
    assert "- Who wrote The Pequod? -> Herman Melville" in asked and "exactly one of: A, B" in asked
    assert "one or two sentences" in asked
    # the reasoning that chose the answer is in the Output event
    assert detail(events(out, "Output")[-1])["reply"].startswith("Melville wrote it, and B names him.")
    assert out["messages"][-1].response_metadata["structured_answer"] == "B"
    # Never in the form: bounded, format_error, the unformatted answer kept, not validated.
    model = recording_model([plan, "<answer>Herman Melville</answer>", "<answer>Melville</answer>"])
    out = build_kag_thinker_graph(model=model, tools=[tool], config={"max_format_retries": 1}, options=options).invoke(
        {"question": "Who wrote it? A. Hawthorne B. Melville"}, context={"answer_format": ["A", "B"]})
    assert out["halt_reason"] == "format_error" and out["answer"] == "Herman Melville"
    assert out["structured_answer"] is None and out["answer_validated"] is False and out["llm_calls"] == 4


def test_a_copied_placeholder_is_not_an_answer():
    # Qwen2.5-Coder-0.5B answered a focus prompt with the template's own placeholder.
    with pytest.raises(LogicalFormParseError, match="placeholder"):
        parse_focus("<focus></focus><answer>The answer</answer>", index=1)
    assert parse_boundary_answer("<answer>\\boxed{your answer}</answer>") is None
    plan = "Step1: Who hosts Splash?\nAction1: Retrieval(s=s1:show['Splash'], p=p1:host, o=o1:person)"
    out, model = run_plan([plan, "<answer>the answer</answer>", "<answer>Joey Lawrence</answer>"], "Host?",
                          tools=[recording_tool("DOC", "Hosted by Joey Lawrence.", [])])
    assert out["answer"] == "Joey Lawrence" and [e.op for e in events(out, "Focus")] == ["format_error", "push"]
