"""The peer row, ``langchain-agent``: LangChain's own create_agent on the run kernel. Its answer, its
format re-prompt and its bounds; its tool calls through the kernel's one door (counted, recorded, a
failing or unknown tool an error the model sees); its model calls counted the way eval's meter counts
every method; a model without tool calling refused at build; and the packaged GGUF through llama.cpp
calling the tools with bind_tools (tests/test_chat_turns.py tests the model side)."""

from __future__ import annotations

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from tcrag_langgraph import TCRAGConfig
from tcrag_langgraph.core.result import RunResult
from tcrag_langgraph.eval.efficiency import UsageMeter, question_cost
from tcrag_langgraph.methods.registry import METHOD_NAMES, METHODS, build_method
from tcrag_langgraph.testing import recording_model, scripted_tool, tool_call_reply, tool_calling_model

Q = "What treats scurvy?"
YES_NO = {"answer_format": ["yes", "no", "maybe"]}


def doc_tool():
    return scripted_tool("DOC_RAG", "Vitamin C treats {input}.")


def run(model, tools=(), config=None, context=None):
    meter = UsageMeter()
    graph = build_method("langchain-agent", model=model, tools=list(tools), config=config)
    out = graph.invoke({"question": Q}, config={"callbacks": [meter]}, context=context)
    return out, meter


def test_the_agent_calls_a_tool_through_the_kernel_and_answers():
    model = tool_calling_model([tool_call_reply("DOC_RAG", query="scurvy"), "Vitamin C."])
    out, meter = run(model, [doc_tool()])
    result = RunResult.from_state(out)
    assert (result.answer, result.halt_reason, result.answer_validated) == ("Vitamin C.", "answered", False)
    assert (result.llm_calls, result.tool_calls, result.steps) == (2, 1, 2)
    assert result.evidence == ["Vitamin C treats scurvy."]
    assert model.bound and model.bound[0] == ["DOC_RAG"]  # create_agent bound the tools natively
    returned = [m for m in model.seen[1] if isinstance(m, ToolMessage)]  # the observation, as a ToolMessage
    assert [(m.content, m.status) for m in returned] == [("Vitamin C treats scurvy.", "success")]
    uses = [e for e in result.trace if e.action == "Tool_Use"]
    assert [e.content for e in uses] == ["DOC_RAG"] and '"input": {"query": "scurvy"}' in uses[0].detail
    # eval's meter saw each model call and the one tool call once (the kernel's door, not a second run
    # by the agent's ToolNode), and counts the tokens as the run did
    cost = question_cost(out, meter, wall_time_s=0.0)
    assert (cost.llm_calls, cost.retrievals, cost.steps) == (2, 1, 2)
    assert (cost.prompt_tokens, cost.completion_tokens) == (out["token_usage"]["prompt"], out["token_usage"]["completion"])
    # the bound tool's schema and the call the model wrote are counted, not only the message texts
    assert out["token_usage"]["completion"] > len("Vitamin C.".split()) + 3


def test_an_answer_out_of_format_is_re_prompted_in_the_same_conversation():
    model = tool_calling_model(["Vitamin C deficiency, probably.", "Yes."])
    out, _ = run(model, [doc_tool()], context=YES_NO)
    assert (out["answer"], out["structured_answer"], out["format_retries"], out["llm_calls"]) == ("Yes.", "yes", 1, 2)
    system, *rest = model.seen[1]
    assert "must be exactly one of: yes, no, maybe" in system.content
    assert rest[-1].content.startswith("Your answer could not be used") and rest[-2].content == "Vitamin C deficiency, probably."
    out, _ = run(tool_calling_model(["Perhaps."]), [doc_tool()], config=TCRAGConfig(max_format_retries=1), context=YES_NO)
    assert (out["answer"], out["halt_reason"], out["structured_answer"]) == ("Perhaps.", "format_error", None)


def test_the_agent_is_bounded_by_max_steps():
    model = tool_calling_model([tool_call_reply("DOC_RAG", query="scurvy")])  # calls the tool for ever
    out, meter = run(model, [doc_tool()], config=TCRAGConfig(max_steps=3))
    assert (out["answer"], out["halt_reason"], out["llm_calls"], out["tool_calls"]) == (None, "max_steps", 3, 3)
    assert "3 model calls" in out["error"] and meter.llm_calls == 3


def test_a_failing_or_unknown_tool_is_an_error_the_model_sees():
    @tool("DOC_RAG")
    def broken(query: str) -> str:
        """Search medical documents."""
        raise ConnectionError("index down")

    model = tool_calling_model([tool_call_reply("DOC_RAG", query="scurvy"), tool_call_reply("PUBMED", query="x"),
                                "No evidence."])
    out, meter = run(model, [broken])
    assert (out["answer"], out["tool_calls"], out["llm_calls"]) == ("No evidence.", 1, 3)  # the unknown tool never ran
    errors = [m for m in model.seen[2] if isinstance(m, ToolMessage)]
    assert [m.status for m in errors] == ["error", "error"]
    assert "index down" in errors[0].content and "unknown_tool" in errors[1].content and "DOC_RAG" in errors[1].content
    assert out["knowledge"][0]["tool"] == "DOC_RAG" and "index down" in out["knowledge"][0]["error"]
    assert RunResult.from_state(out).evidence == [] and meter.tool_errors == 1


def test_a_model_error_halts_the_run():
    class Down(type(tool_calling_model(["x"]))):
        def _generate(self, *args, **kwargs):
            raise RuntimeError("server down")

    out, _ = run(Down(responses=[]), [doc_tool()])
    assert (out["answer"], out["halt_reason"]) == (None, "model_error") and "server down" in out["error"]


def test_a_model_without_tool_calling_is_refused_when_the_method_is_built():
    with pytest.raises(ValueError, match="needs a chat model with tool calling.*RecordingChatModel"):
        build_method("langchain-agent", model=recording_model(["x"]), tools=[doc_tool()])


def test_the_peer_is_a_row_of_the_tables_and_not_a_studio_graph():
    spec = METHODS["langchain-agent"]
    assert "langchain-agent" in METHOD_NAMES and spec.label == "LangChain agent" and not spec.studio
    assert spec.uses_tools and not spec.uses_scorer


def test_the_packaged_gguf_runs_the_agent_with_native_tool_calls(monkeypatch):
    """The packaged SmolLM2 through llama.cpp: its template has no tools section, so the tools are
    described in the system turn and its reply read for calls. A 135M model's calls are not reliable:
    whatever it writes, the run ends through the kernel with the counts eval reads."""
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
    from tcrag_langgraph.models.llama_cpp_model import LlamaCppModel

    seen = []
    real = LlamaCppModel.prompt_ids

    def spy(lm, messages, **kwargs):
        seen.append(kwargs.get("tools"))
        return real(lm, messages, **kwargs)

    monkeypatch.setattr(LlamaCppModel, "prompt_ids", spy)
    model = LlamaCppChatModel(n_threads=1, temperature=0.0)  # one thread: spinning threads crawl on a busy machine
    out, meter = run(model, [doc_tool()], config=TCRAGConfig(max_steps=2, max_new_tokens=24))
    assert out["halt_reason"] in ("answered", "max_steps"), out.get("error")
    assert seen and seen[0][0]["function"]["name"] == "DOC_RAG"  # the tools reached the prompt
    assert out["llm_calls"] == meter.llm_calls >= 1 and out["tool_calls"] == meter.retrievals
    assert (out["token_usage"]["prompt"], out["token_usage"]["completion"]) == (meter.prompt_tokens,
                                                                                meter.completion_tokens)
