"""Framework overhead: one TC-RAG step through the LangGraph graph vs the same algorithm as a plain loop.

The model is ``FakeListChatModel`` (zero latency, scripted), the scorer returns constants and the
tool is an in-memory function, so what is timed is the machinery: prompt building, action parsing,
stack operations, state-graph bookkeeping (channels, ``Command`` routing, trace events, custom
stream events, token counting). The plain loop uses the same building blocks
(``prompting``, ``actions.parse_action``, ``state.push/pop/replace_top``) and the same model and
tool objects.

    python benchmarks/graph_overhead.py [--runs 200] [--profile]
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, parser  # noqa: E402

SCRIPT = [
    "Thought: I should look up the renal dosing of metformin.",
    "Tool_Use: DOC_RAG\nTool_Input: metformin renal impairment",
    "Thought: This passage is about another population.",
    "Backtrack: that thought was off track.",
    "Summary: The retrieved passage does not cover eGFR below 30.",
    "Plan: 1) search the label 2) conclude",
    "Tool_Use: DOC_RAG\nTool_Input: metformin contraindication",
    "Backtrack: irrelevant result.",
    "Thought: Metformin is contraindicated below eGFR 30.",
    "Conclusion: No, metformin is contraindicated at an eGFR of 25.",
]
QUESTION = "Is metformin safe for a patient with an eGFR of 25 mL/min?"
SIGMA = 10.0


class ConstantScorer:
    """Everything scores above sigma except the final Conclusion."""

    def score(self, query: str, text: str, *, metric: str) -> float:
        return 1.0 if text.startswith("No, metformin") else 50.0


def make_parts():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.tools import tool

    @tool("DOC_RAG")
    def doc_rag(query: str) -> str:
        """Search PubMed abstracts for passages relevant to a query."""
        return f"Passage about {query}: metformin is renally cleared."

    return FakeListChatModel(responses=SCRIPT), doc_rag, ConstantScorer()


def plain_loop(model, tool, scorer, *, max_steps: int = 12) -> tuple[str, int]:
    """Algorithm 1 as an ordinary Python loop over the same building blocks."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    from tcrag_langgraph.core.state import Action, Frame, ToolCallRecord
    from tcrag_langgraph.methods.tcrag.actions import parse_action
    from tcrag_langgraph.methods.tcrag.graph import STOP_SEQUENCES
    from tcrag_langgraph.methods.tcrag.prompting import demonstrations, system_prompt, turn_text
    from tcrag_langgraph.methods.tcrag.state import pop, push, render_stack, replace_top

    allowed = ["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion"]
    stack = [Frame(action=Action.USER_QUERY, content=QUESTION)]
    value = 1e9
    for step in range(1, max_steps + 1):
        messages = [SystemMessage(content=system_prompt([tool], allowed))]
        for shown, reply in demonstrations([tool], allowed):
            messages += [HumanMessage(content=shown), AIMessage(content=reply)]
        messages.append(HumanMessage(content=turn_text(render_stack(stack))))
        text = model.invoke(messages, stop=STOP_SEQUENCES).content
        parsed = parse_action(text, [tool.name], allowed=allowed, unlabeled_as="Thought")
        action = parsed.action
        if action is Action.THOUGHT:
            value = max(scorer.score(QUESTION, parsed.content, metric="cppl"), SIGMA)
            stack = push(stack, Frame(action=action, content=parsed.content, step=step))
        elif action is Action.PLAN:
            stack = push(stack, Frame(action=action, content=parsed.content, step=step))
        elif action is Action.TOOL_USE:
            observation = tool.invoke(parsed.tool_input or QUESTION)
            record = ToolCallRecord(tool=tool.name, tool_input=parsed.tool_input, observation=observation)
            stack = push(stack, Frame(action=action, content=parsed.content, tool_call=record, step=step))
        elif action is Action.SUMMARY:
            stack, _ = replace_top(stack, Frame(action=action, content=parsed.content, step=step))
        elif action is Action.BACKTRACK:
            stack, _ = pop(stack)
        elif action is Action.CONCLUSION:
            value = scorer.score(QUESTION, parsed.content, metric="cppl")
            if value < SIGMA:
                return parsed.content, step
            stack = push(stack, Frame(action=Action.THOUGHT, content=parsed.content, step=step))
    return "", max_steps


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--profile", action="store_true", help="print where a graph step spends its time")
    args = p.parse_args()
    from tcrag_langgraph import TCRAGConfig, build_graph

    model, tool, scorer = make_parts()
    graph = build_graph(model=model, tools=[tool], scorer=scorer, config=TCRAGConfig(sigma=SIGMA, max_steps=12))
    out = graph.invoke({"question": QUESTION})
    assert out["halt_reason"] == "validated" and out["steps"] == len(SCRIPT), (out["halt_reason"], out["steps"])
    answer, steps = plain_loop(model, tool, scorer)
    assert steps == len(SCRIPT) and answer == out["answer"], (answer, steps)

    def graph_run():
        graph.invoke({"question": QUESTION})

    def loop_run():
        plain_loop(model, tool, scorer)

    def bare_run():  # the loop without the chat model's LangChain call (a list lookup instead)
        class Bare:
            i = 0

            def invoke(self, messages, stop=None):
                from langchain_core.messages import AIMessage

                text = SCRIPT[Bare.i % len(SCRIPT)]
                Bare.i += 1
                return AIMessage(content=text)
        plain_loop(Bare(), tool, scorer)

    for fn in (graph_run, loop_run, bare_run):  # warm-up: imports, prompt-file caches
        for _ in range(3):
            fn()
    times = {"graph": [], "loop": [], "bare": []}
    for _ in range(args.runs):  # interleaved so that load changes hit all variants alike
        for name, fn in (("graph", graph_run), ("loop", loop_run), ("bare", bare_run)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    n = len(SCRIPT)
    med = {k: statistics.median(v) / n * 1e3 for k, v in times.items()}
    print(f"machine: {machine()}")
    print(f"{args.runs} runs of a {n}-step scripted trajectory (pushes, Tool_Use, Backtrack, Summary, Conclusion)\n")
    print(f"per agent step (median):   graph {med['graph']:.3f} ms | plain loop {med['loop']:.3f} ms | "
          f"plain loop without the LangChain model call {med['bare']:.3f} ms")
    print(f"framework overhead per step: graph - loop = {med['graph'] - med['loop']:.3f} ms "
          f"(graph/loop = {med['graph'] / med['loop']:.2f}x)")
    print(f"per LangGraph node: {med['graph'] * n / (2 * n + 1):.3f} ms (Start + {n} x (Generate + action node))")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            graph_run()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
