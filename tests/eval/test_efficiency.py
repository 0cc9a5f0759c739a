"""Cost meter tests."""

from __future__ import annotations

from langchain_core.tools import tool

from tcrag_langgraph.eval.efficiency import UsageMeter, count_stack_ops, mean_costs, question_cost
from tcrag_langgraph.tools.tokens import count_tokens
from tcrag_langgraph.tools.base import ToolError

from .helpers import model


def test_meter_counts_calls_and_tokens_with_tiktoken():
    meter = UsageMeter()
    m = model("Metformin is first line.", "Yes")
    m.invoke("What is first line for type 2 diabetes?", config={"callbacks": [meter]})
    m.invoke("Sure?", config={"callbacks": [meter]})
    assert meter.llm_calls == 2
    assert meter.prompt_tokens == count_tokens("What is first line for type 2 diabetes?") + count_tokens("Sure?")
    assert meter.completion_tokens == count_tokens("Metformin is first line.") + count_tokens("Yes")
    meter.reset()
    assert (meter.llm_calls, meter.prompt_tokens) == (0, 0)


def test_meter_counts_tool_calls_and_errors():
    @tool("BROKEN")
    def broken(query: str) -> str:
        """Always fails."""
        raise ValueError("boom")

    @tool("SOFT_FAIL")
    def soft(query: str):
        """Returns a ToolError value."""
        return ToolError("SOFT_FAIL", "timeout", "slow")

    meter = UsageMeter()
    soft.invoke("x", config={"callbacks": [meter]})
    try:
        broken.invoke("x", config={"callbacks": [meter]})
    except ValueError:
        pass
    assert meter.retrievals == 2 and meter.tool_errors == 2 and meter.tool_names == ["SOFT_FAIL", "BROKEN"]


def test_stack_ops_and_question_cost():
    trace = [
        {"action": "Backtrack", "op": "pop"},
        {"action": "Backtrack", "op": "noop"},
        {"action": "Summary", "op": "pop+push"},
        {"action": "Summary", "op": "noop"},
        {"action": "Tool_Use", "op": "push"},
    ]
    assert count_stack_ops(trace) == (1, 1)
    assert count_stack_ops(None) == (0, 0)
    meter = UsageMeter()
    meter.llm_calls, meter.prompt_tokens, meter.completion_tokens = 3, 100, 20
    cost = question_cost({"trace": trace, "steps": 5}, meter, wall_time_s=1.5)
    assert (cost.total_tokens, cost.backtracks, cost.summaries, cost.steps, cost.wall_time_s) == (120, 1, 1, 5, 1.5)
    means = mean_costs([cost.to_dict(), {**cost.to_dict(), "llm_calls": 5}])
    assert means["llm_calls"] == 4.0 and means["total_tokens"] == 120.0
