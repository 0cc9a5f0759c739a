"""Which tool a model calls first, for each order in which TC-RAG's prompt describes the tools.

With several tools, a small model's first call depends on where each tool is described and which tool
the worked examples search with more than on what the descriptions say (benchmarks/RESULTS.md section
33). This prints, per layout, the first reply of the model to each of N PubMedQA-L trainval questions
(closed book, yes/no/maybe, replies constrained as ``tcrag eval`` constrains them) and a count per action
and tool: one model call per question, so a layout costs about 3 s a question with the 1.5B on two cores.

    python benchmarks/first_tool_choice.py --model qwen2.5-coder-1.5b --questions 30 \\
        --layout "EMR_SEARCH,KG_RAG,WEB_SEARCH,DOC_RAG" --layout "DOC_RAG,KG_RAG,WEB_SEARCH,EMR_SEARCH"

A layout names the tools in the order they are *described* (the last one nearest the action lines); the
worked examples search with ``--examples-tool`` (default: the first tool of the tool set, as TC-RAG does).
Without ``--layout`` it measures the layout TC-RAG uses, the tool set described last to first.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402


def first_replies(model, tools, described, examples_tool, questions, answer_choices):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    from tcrag_langgraph.core import answer_format
    from tcrag_langgraph.core.state import Action, Frame
    from tcrag_langgraph.methods.registry import tcrag_config_for
    from tcrag_langgraph.methods.tcrag.graph import STOP_SEQUENCES
    from tcrag_langgraph.methods.tcrag.prompting import demonstrations, system_prompt, turn_text
    from tcrag_langgraph.methods.tcrag.reply_forms import action_form
    from tcrag_langgraph.methods.tcrag.state import render_stack
    from tcrag_langgraph.models.constrained import constraint_for

    offered = tcrag_config_for("react").allowed_actions(has_tools=True)
    rule = answer_format.instructions(answer_choices)
    # system_prompt describes its tools last to first: give it the layout reversed to describe the layout
    system = SystemMessage(system_prompt(list(reversed(described)), offered))
    shown = demonstrations([examples_tool], offered, with_observation=True)
    constraint = constraint_for(model, action_form(offered, tools, answer_choices))
    for question in questions:
        messages = [system]
        for turn, reply in shown:
            messages += [HumanMessage(turn), AIMessage(reply)]
        stack = [Frame(action=Action.USER_QUERY, content=question)]
        messages.append(HumanMessage(turn_text(render_stack(stack), steps_left=8, answer_rule=rule)))
        out = model.invoke(messages, stop=STOP_SEQUENCES, max_new_tokens=150, temperature=0,
                           **(constraint.kwargs if constraint else {}))
        yield str(out.content)


def kind(reply: str) -> str:
    """``Tool_Use:NAME`` for a tool call, else the action label."""
    first = reply.split("\n", 1)[0]
    label, _, rest = first.partition(":")
    return f"Tool_Use:{rest.strip()}" if label == "Tool_Use" else label


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--questions", type=int, default=30, help="PubMedQA-L trainval questions (issue 39's sample)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--layout", action="append", default=[], help="tool names in the order described (repeatable)")
    p.add_argument("--examples-tool", default=None, help="the tool the worked examples search with")
    p.add_argument("--show", action="store_true", help="print every reply")
    args = p.parse_args()

    from tcrag_langgraph.agent.spec import AgentSpec
    from tcrag_langgraph.eval.datasets import format_question, load_dataset, sample_records

    print(machine())
    parts = AgentSpec(model=args.model, tools="default").assemble(["react"])
    by_name = {t.name: t for t in parts.tools}
    records = sample_records(load_dataset("pubmedqa", split="trainval", with_context=False),
                             limit=args.questions, seed=args.seed)
    questions = [format_question(r, include_context=False) for r in records]
    examples_tool = by_name[args.examples_tool] if args.examples_tool else parts.tools[0]
    layouts = args.layout or [",".join(t.name for t in reversed(parts.tools))]
    for layout in layouts:
        described = [by_name[name.strip()] for name in layout.split(",")]
        counts = collections.Counter()
        for reply in first_replies(parts.model, parts.tools, described, examples_tool, questions, ("yes", "no", "maybe")):
            counts[kind(reply)] += 1
            if args.show:
                print("  ", json.dumps(reply[:160]))
        print(f"described {layout}; examples search with {examples_tool.name}: {dict(counts.most_common())}", flush=True)


if __name__ == "__main__":
    main()
