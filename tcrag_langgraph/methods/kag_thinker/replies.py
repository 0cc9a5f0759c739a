"""Parsers of the other model replies: the knowledge-boundary answer and self-check, a depth
turn's focus (answer or next Retrieval form), and a deduction."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from pydantic import BaseModel, Field

from .forms import ContentItem, LogicalForm, LogicalFormParseError
from .parsing import _parse_next_retrieval
from .text import _boxed, _normalise, _tagged

_REFUSAL = re.compile(r"can'?t answer|cannot answer|need to retrieve|unable to answer|don'?t know|not sure",
                      re.IGNORECASE)


# What the prompts show as blanks to fill in; a reply that copies one has not answered.
_PLACEHOLDERS = {"", "...", "the answer", "your answer", "answer", "the facts that bear on the question"}


def _is_placeholder(text: str) -> bool:
    return re.sub(r"\s+", " ", text.lower()).strip(" .*`'\"") in {p.strip(" .") for p in _PLACEHOLDERS}


def parse_boundary_answer(text: Any) -> Optional[str]:
    """The model's own answer to a sub-question (Table 2: ``<answer>\\boxed{...}</answer>``), or
    ``None`` when it said it cannot answer or gave no answer in that form.

    Example:
        >>> parse_boundary_answer("Melville wrote it. <answer>\\\\boxed{Herman Melville}</answer>")
        'Herman Melville'
        >>> parse_boundary_answer("Based on my internal knowledge, I can't answer this question") is None
        True
    """
    body = _normalise(text)
    inner = _tagged(body, "answer")
    answer = _boxed(inner if inner is not None else body)
    if answer is None:
        answer = inner
    if not answer or _REFUSAL.search(answer) or _is_placeholder(answer):
        return None
    return answer


def parse_confidence(text: Any) -> Optional[bool]:
    """The True/False of the self-check (Table 3); ``None`` when the reply holds neither (the
    graph then treats the answer as not confident).

    Example:
        >>> parse_confidence("Step by step... <answer>\\\\boxed{True}</answer>"), parse_confidence("hmm")
        (True, None)
    """
    body = _normalise(text)
    for candidate in (_boxed(body), _tagged(body, "answer")):
        if candidate is not None:
            word = re.sub(r"[^a-z]", "", candidate.lower())
            if word in ("true", "false"):
                return word == "true"
    words = re.findall(r"\b(true|false)\b", body, flags=re.IGNORECASE)
    return words[-1].lower() == "true" if words else None


class FocusResult(BaseModel):
    """A depth turn's reading of the references: what bears on the sub-question, and either the
    answer or the next Retrieval logical form."""

    focus: str = ""
    answer: Optional[str] = None
    next_form: Optional[LogicalForm] = None
    repairs: list[str] = Field(default_factory=list)


def parse_focus(text: Any, *, index: int, known: Optional[Mapping[str, ContentItem]] = None) -> FocusResult:
    """Read a focusing-and-reasoning reply: ``<focus>...</focus>`` (optional), then ``<answer>...</answer>``
    or the next ``Step: ... / Action: Retrieval(...)``. An answer wins over a next step written too.

    Example:
        >>> parse_focus("<focus>Ref 0 names the host.</focus><answer>Joey Lawrence</answer>", index=1).answer
        'Joey Lawrence'
    """
    repairs: list[str] = []
    body = re.sub(r"<think>.*?</think>", " ", _normalise(text), flags=re.DOTALL | re.IGNORECASE)
    focus = _tagged(body, "focus") or ""
    inner = _tagged(body, "answer")
    if inner is None:
        line = re.search(r"^\s*\**(?:final\s+)?answer\**\s*:\s*(.+)$", body, flags=re.IGNORECASE | re.MULTILINE)
        if line:
            inner = line.group(1).strip()
            repairs.append("'Answer:' line read as <answer>")
    if inner is not None:
        answer = _boxed(inner) or inner.strip()
        if _is_placeholder(answer):
            raise LogicalFormParseError("the <answer> holds the prompt's placeholder: write the actual answer "
                                        "found in the references, or the next Step and Action")
        if not _REFUSAL.search(answer):
            return FocusResult(focus=focus, answer=answer, repairs=repairs)
    next_form = _parse_next_retrieval(body, index=index, known=known or {}, repairs=repairs)
    return FocusResult(focus=focus, next_form=next_form, repairs=repairs)


def _parse_deduction(text: Any) -> str:
    body = re.sub(r"<think>.*?</think>", " ", _normalise(text), flags=re.DOTALL | re.IGNORECASE)
    inner = _tagged(body, "answer")
    if inner is None:
        line = re.search(r"^\s*\**(?:final\s+)?answer\**\s*:\s*(.+)$", body, flags=re.IGNORECASE | re.MULTILINE)
        inner = line.group(1) if line else None
    answer = (_boxed(inner) or inner.strip()) if inner is not None else ""
    if _is_placeholder(answer):
        raise LogicalFormParseError("wrap your actual conclusion in <answer>...</answer>")
    return answer
