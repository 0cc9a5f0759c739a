"""The agent as a tool for another agent: a ``{"question": str}`` tool returning the answer and
whether it was validated, driven by LangChain's ``create_agent`` and LangGraph's prebuilt agent
through a tool-calling scripted model (a test double that writes one tool call, then a final
answer quoting what the tool returned)."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from tcrag_langgraph.faces.agent_tool import agent_as_tool
from tcrag_langgraph.testing import scripted_graph

QUESTION = "Which vitamin deficiency causes scurvy?"
ANSWER = "Vitamin C deficiency causes scurvy."


class ToolCallingScript(BaseChatModel):
    """Asks the bound tool once with ``question``, then answers with the tool's result."""

    question: str = QUESTION
    seen_tools: list[str] = []

    @property
    def _llm_type(self) -> str:
        return "tool-calling-script"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ToolCallingScript":
        from langchain_core.utils.function_calling import convert_to_openai_tool

        self.seen_tools = [json.dumps(convert_to_openai_tool(t)["function"], sort_keys=True) for t in tools]
        return self

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if results:
            reply = AIMessage(content=f"The research agent says: {results[-1].content}")
        else:
            reply = AIMessage(content="", tool_calls=[{"name": "medical_question", "args": {"question": self.question},
                                                       "id": "call-1", "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _graph(score: float):
    return scripted_graph({"replies": ["Tool_Use: DOC_RAG\nTool_Input: {question}", f"Conclusion: {ANSWER}"],
                           "tools": {"DOC_RAG": "Scurvy follows a lack of ascorbic acid ({input})."},
                           "scores": {ANSWER: score}})


def _tool_result(messages: list[BaseMessage]) -> dict:
    (result,) = [m for m in messages if isinstance(m, ToolMessage)]
    return json.loads(result.content)


def test_the_tool_schema_is_one_question():
    tool = agent_as_tool(_graph(2.0))
    assert tool.tool_call_schema.model_json_schema()["properties"].keys() == {"question"}
    assert tool.tool_call_schema.model_json_schema()["required"] == ["question"]
    assert tool.invoke({"question": QUESTION}) == {"answer": ANSWER, "validated": True, "halt_reason": "validated"}
    with pytest.raises(ValueError):  # a wrong argument shape is refused by the schema
        tool.invoke({"messages": [QUESTION]})


def test_create_agent_calls_it_and_reads_answer_and_validation():
    from langchain.agents import create_agent

    model = ToolCallingScript()
    agent = create_agent(model, tools=[agent_as_tool(_graph(2.0))], system_prompt="Use the tool.")
    out = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]})
    assert _tool_result(out["messages"]) == {"answer": ANSWER, "validated": True, "halt_reason": "validated"}
    assert out["messages"][-1].content.startswith("The research agent says:")
    (schema,) = model.seen_tools
    assert json.loads(schema)["parameters"]["properties"].keys() == {"question"}


async def test_langgraph_prebuilt_agent_async_and_an_unvalidated_answer_says_so():
    from langgraph.prebuilt import create_react_agent

    agent = create_react_agent(ToolCallingScript(), tools=[agent_as_tool(_graph(50.0), context={"max_steps": 2})])
    out = await agent.ainvoke({"messages": [{"role": "user", "content": QUESTION}]})
    result = _tool_result(out["messages"])
    assert result["validated"] is False and result["halt_reason"] != "validated"
