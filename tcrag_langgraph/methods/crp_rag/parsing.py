"""Parsing CRP-RAG's model output: a sampled reasoning step (prompt A.1, :func:`parse_step`, strict,
typed, with recorded repairs) and a merge reply (prompt A.2, :func:`merged_step`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["MAX_STEP_CHARS", "ParsedStep", "StepParseError", "parse_step", "merged_step"]

#: Longest reasoning-step text kept (a step is one sentence; a rambling sample is cut, not refused).
MAX_STEP_CHARS = 400

# --------------------------------------------------------------------------------------------
# Parsing a sampled step: strict, typed, with repair; the caller re-prompts on StepParseError
# --------------------------------------------------------------------------------------------


class StepParseError(ValueError):
    """The model's reply holds no usable reasoning step."""


@dataclass(frozen=True)
class ParsedStep:
    """One reasoning step from a reply, whether it is final, and what had to be repaired."""

    text: str
    final: bool
    repairs: tuple[str, ...] = field(default_factory=tuple)


_STEP_LABEL = re.compile(r"^\s*(?:[*_#>-]+\s*)?(?:next\s+)?(?:reasoning\s+)?step(?:\s*\d+)?\s*(?:[*_]+\s*)?[:：]\s*(.*)$",
                         re.IGNORECASE)
_FINAL_LABEL = re.compile(r"^\s*(?:[*_#>-]+\s*)?final(?:\s+step)?\s*(?:[*_]+\s*)?[:：]\s*(.*)$", re.IGNORECASE)
_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def parse_step(text: str) -> ParsedStep:
    """The step in a reply to prompt A.1 (``Next step: ...`` / ``Final: yes|no``).

    Repairs (listed in ``repairs``): a reply without the label uses its first line; a missing or
    unreadable ``Final:`` line means "not final"; a step longer than ``MAX_STEP_CHARS`` is cut.

    Example:
        >>> parse_step("Next step: Check the dose.\\nFinal: no")
        ParsedStep(text='Check the dose.', final=False, repairs=())
        >>> parse_step("1. The answer is B.\\nFinal: YES").repairs
        ('no Next step label: used the first line',)
        >>> parse_step("   ")
        Traceback (most recent call last):
        ...
        tcrag_langgraph.methods.crp_rag.parsing.StepParseError: the reply is empty
    """
    if not isinstance(text, str) or not text.strip():
        raise StepParseError("the reply is empty")
    repairs: list[str] = []
    lines = [line for line in text.splitlines() if line.strip()]
    step: Optional[str] = None
    final: Optional[bool] = None
    for i, line in enumerate(lines):
        found_final = _FINAL_LABEL.match(line)
        if found_final:
            if final is None:
                word = found_final.group(1).strip(" \t*_.").lower()
                final = True if word in ("yes", "true") else False if word in ("no", "false") else None
                if final is None:
                    repairs.append(f"unreadable Final value {word[:20]!r}: taken as no")
                    final = False
            continue
        found_step = _STEP_LABEL.match(line)
        if found_step and step is None:
            step = found_step.group(1).strip()
            if not step and i + 1 < len(lines) and not _FINAL_LABEL.match(lines[i + 1]):
                step = lines[i + 1].strip()
    if step is None:
        first = next((line for line in lines if not _FINAL_LABEL.match(line)), "")
        step = _LIST_MARK.sub("", first).strip()
        repairs.append("no Next step label: used the first line")
    step = step.strip().strip("*_").strip()
    if sum(ch.isalpha() for ch in step) < 3:  # "...", "2": no step (seen from SmolLM2)
        raise StepParseError("no reasoning step after 'Next step:'")
    if len(step) > MAX_STEP_CHARS:
        step = step[:MAX_STEP_CHARS].rstrip() + "…"
        repairs.append(f"step cut to {MAX_STEP_CHARS} characters")
    if final is None:
        repairs.append("no Final line: taken as no")
        final = False
    return ParsedStep(text=step, final=final, repairs=tuple(repairs))


def merged_step(text: str) -> Optional[str]:
    """The step of a merge reply (prompt A.2): its ``Next step:`` line, or ``None`` when it has none.

    Unlike :func:`parse_step` there is no first-line repair: a merge reply without the label is
    usually a preamble ("To summarize ... as follows:", seen from Qwen2.5-Coder-0.5B), and the caller
    keeps the original step instead.

    Example:
        >>> merged_step("Sure.\\nNext step: Find metformin's drug class.")
        "Find metformin's drug class."
        >>> merged_step("To summarize the paragraphs, we can write:") is None
        True
    """
    for line in (text or "").splitlines():
        found = _STEP_LABEL.match(line)
        if found:
            step = found.group(1).strip().strip("*_").strip()
            if sum(ch.isalpha() for ch in step) >= 3:
                return step[:MAX_STEP_CHARS].rstrip()
    return None
