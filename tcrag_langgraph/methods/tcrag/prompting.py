"""Build the TC-RAG system prompt (paper appendix 8.6) from the template files in ``prompts/``."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from string import Template
from typing import Any, Optional, Sequence

from langchain_core.tools import BaseTool

from ...core.state import Action, Frame, ToolCallRecord

__all__ = ["system_prompt", "demonstrations", "load_prompt_file", "turn_text", "final_turn_text", "rejected_note",
           "repeated_call_note"]


@lru_cache(maxsize=16)
def load_prompt_file(name: str) -> str:
    """Text of a packaged prompt file (``tcrag_langgraph.prompts``)."""
    return resources.files("tcrag_langgraph.prompts").joinpath(name).read_text(encoding="utf-8")


def system_prompt(tools: Sequence[BaseTool], allowed_actions: Sequence[str], *, language: str = "en") -> str:
    """The system prompt offering exactly ``allowed_actions`` and describing ``tools``, last to first: the
    first tool, the one the worked examples search with (:func:`demonstrations`), is described nearest the
    action lines. With the four default tools described in the order given, Qwen2.5-Coder-1.5B passed over
    ``DOC_RAG`` (described first) on 30 of 30 PubMedQA-L trainval questions and called ``EMR_SEARCH``, on 21
    with its description's own example; described last to first it called ``DOC_RAG`` first on 24 of 30
    (benchmarks/RESULTS.md section 33)."""
    shown = list(reversed(tools))
    names = ", ".join(t.name for t in shown)
    if tools:
        descriptions = "\n".join(f"{t.name}: {' '.join((t.description or '').split())}" for t in shown)
    else:
        descriptions = "(no tools in this run: answer from your own knowledge)" if language == "en" else "（本次没有可用工具：请根据自己的知识回答）"
    lines = json.loads(load_prompt_file(f"actions_{language}.json"))
    # Every action the prompt names must be one the run offers: a closed-book prompt that listed
    # Tool_Use ("... Tool_Use, Summary and Backtrack may repeat") drew Tool_Use replies from the
    # 1.5B in 111 of 362 ReAct turns on MedMCQA, each a format error and a re-prompt.
    line_of = dict(lines, Thought=lines["Thought"] if tools else lines["Thought_without_tools"])
    action_lines = "\n".join(Template(line_of[a]).safe_substitute(tool_names=names) for a in allowed_actions)
    repeatable = [a for a in allowed_actions if a != "Conclusion"]
    repeat_line = Template(lines["repeat_line"]).safe_substitute(names=_join(repeatable, language)) if repeatable else ""
    return Template(load_prompt_file(f"tcrag_{language}.txt")).safe_substitute(
        tool_descriptions=descriptions, action_lines=action_lines, repeat_line=repeat_line
    )


def _join(words: Sequence[str], language: str) -> str:
    """``A, B and C`` (``A、B 和 C`` in Chinese)."""
    comma, last = (", ", " and ") if language == "en" else ("、", " 和 ")
    return words[0] if len(words) == 1 else comma.join(words[:-1]) + last + words[-1]


def rejected_note(event: Any, ways: Sequence[str], tool_names: Sequence[str] = ()) -> str:
    """What the model is told while a Conclusion the monitor rejected is unanswered (it stays on the
    stack as a Thought): that it was not supported, and the actions it may take before concluding,
    in the exact form to write them (Qwen2.5-Coder-0.5B copied a prose description of an action,
    "Tool_Use with a new, more specific query", as its action)."""
    from .actions import format_instructions

    value = f" (state value {event.state_value:.3g})" if getattr(event, "state_value", None) is not None else ""
    head = f"Your last Conclusion was not supported{value}; it is kept above as a Thought."
    if "Conclusion" in ways:  # nothing else to do in this run
        return f"{head} Do not repeat it."
    why = {"Tool_Use": "search with a new, more specific query (Tool_Use)",
           "Backtrack": "drop a misleading step (Backtrack)", "Summary": "condense the evidence (Summary)"}
    purposes = ", ".join(why[w] for w in ways if w in why)
    return f"{head} Before you conclude again, {purposes}. " + format_instructions(ways, tool_names)


def repeated_call_note(tool: str, earlier_step: int) -> str:
    """What the model is told, once, when it writes a tool call whose result is already on the stack (it
    is not run again, and nothing is pushed): where that result is and what to do instead. A second
    repeat ends the search; the final turn says so (:func:`final_turn_text`'s ``why``)."""
    return (f"You already called {tool} with this input at step {earlier_step}; its result is on the stack above. "
            "Do not call it again: write your Conclusion from what is on the stack, or call a tool with a "
            "different Tool_Input. Repeating a call ends the search.")


def turn_text(rendered_stack: str, *, steps_left: Optional[int] = None, answer_rule: str = "",
              rejected: str = "") -> str:
    """The user turn that shows the stack and asks for the next action (with the steps left, the
    answer's required form and a note on a just-rejected Conclusion, when there are such)."""
    notes = [rejected] if rejected else []
    if steps_left is not None:
        notes.append(f"Steps left: {steps_left}." + (" Write your Conclusion now." if steps_left <= 1 else ""))
    if answer_rule:
        notes.append(answer_rule)
    tail = ("\n" + " ".join(notes)) if notes else ""
    return "Begin!\n" + rendered_stack + "\n\nWrite your next action." + tail


def final_turn_text(rendered_stack: str, *, answer_rule: str = "", why: str = "No steps are left.") -> str:
    """The user turn once the step budget is spent (or the search ended, ``why`` says): only a
    Conclusion is asked for."""
    rule = f" {answer_rule}" if answer_rule else ""
    return ("Begin!\n" + rendered_stack + f"\n\n{why} Write your final answer to the User_Query now, "
            "as one line: Conclusion: <answer>." + rule)


def demonstrations(tools: Sequence[BaseTool], allowed_actions: Sequence[str], *, language: str = "en",
                   with_observation: bool = False) -> list[tuple[str, str]]:
    """Worked (user turn, reply) pairs showing the format; small models follow examples far better
    than instructions. Only actions available in this run are demonstrated.

    Examples that search and then conclude from an observation on the stack (without the Thought)
    halved the 1.5B's calls on PubMedQA-L trainval with one tool, but with four tools it then toured
    them to the step budget, copied the example into an answer and lost a right answer of the main
    job (benchmarks/RESULTS.md sections 21-22): not taken. Without any examples the 1.5B, its replies
    constrained to the format, answered "maybe" to 15 of 16 trainval questions (section 29): they are
    what makes it search and commit to an answer.

    ``with_observation`` (``TCRAGConfig.example_from_observation``): with tools, the Conclusion example
    shows the example's own search on the stack with its result, rendered as a real tool frame is. On 60
    PubMedQA-L trainval questions it cut TC-RAG's calls from 3.63 to 2.80 and its tokens by 24 % at the same
    accuracy; with four tools and free-form questions it lost two of the main job's five answers
    (section 30), hence on by default only where the answer is one of listed choices
    (``TCRAGConfig.conclusion_example_from_observation``)."""
    tool = tools[0].name if tools else ""
    pairs = []
    for example in json.loads(load_prompt_file(f"examples_{language}.json")):
        if any(need not in allowed_actions for need in example["needs"]):
            continue
        if "Tool_Use" in example["needs"] and not tools:
            continue
        stack = example["stack"]
        seen = example.get("observation")
        if with_observation and seen and tools and "Tool_Use" in allowed_actions:
            call = ToolCallRecord(tool=tool, tool_input=seen["input"], observation=seen["text"])
            stack += "\n" + Frame(action=Action.TOOL_USE, tool_call=call).render()
        pairs.append((turn_text(stack), Template(example["reply"]).safe_substitute(tool=tool)))
    return pairs
