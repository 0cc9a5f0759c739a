"""Answers in the asked form: a set of allowed answers, or a Pydantic schema.

Like ``response_format`` in LangChain's ``create_agent``: the run is told what form its final answer
must take, a Conclusion that does not fit is not accepted (the model is told what is allowed and
asked again), and the final message carries the structured answer.

* choices (``["yes", "no", "maybe"]``, option letters ``["A", "B", "C", "D"]``): the Conclusion must
  name exactly one of them. "Yes.", "yes, because ...", "**B**", "(B) Aorta" and "Option B" fit;
  "B or C", "I am not sure" and an echoed option list do not.
* a Pydantic model class: the Conclusion must hold one JSON object that validates against it.

Example:
    >>> fit(["yes", "no", "maybe"], "Yes, vitamin C deficiency causes scurvy.")
    'yes'
    >>> fit(["A", "B", "C", "D"], "(B) Aorta")
    'B'
    >>> problem(["A", "B", "C", "D"], "B or C")
    'the answer must be exactly one of A, B, C, D; it names B, C'
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional, Sequence, Union

from pydantic import BaseModel, ValidationError

__all__ = ["AnswerFormat", "ANSWER_LABEL", "check", "final_answer", "fit", "problem", "instructions", "validate_format"]

#: Allowed answers (matched case-insensitively), or a Pydantic model the answer must validate against.
AnswerFormat = Union[tuple[str, ...], type[BaseModel]]

_MARKUP = re.compile(r"[*_`#>\"'“”‘’\[\]]")
_LEAD = re.compile(r"^\s*(?:final\s+answer|answer|conclusion|option|choice)\s*(?:is)?\s*[:：\-]?\s*", re.IGNORECASE)


#: an "Answer:" label opening a line ("Final answer:", "**Answer**:", "答案：" too), and the blanks after it
ANSWER_LABEL = re.compile(r"(?:^|\n)\s*(?:\*\*)?(?:final\s+answer|answer|答案)(?:\*\*)?\s*[:：]\s*", re.IGNORECASE)


def final_answer(text: str, *, keep_label: bool = True) -> str:
    r"""The last "Answer:" line of a reply and what follows it (without the label when
    ``keep_label=False``); the whole reply, stripped, when it has no such line or nothing follows.

    Example:
        >>> final_answer("Steps...\nAnswer: no")
        'Answer: no'
        >>> final_answer("Steps...\nAnswer: no", keep_label=False)
        'no'
        >>> final_answer("no label")
        'no label'
    """
    matches = list(ANSWER_LABEL.finditer(text))
    if not matches:
        return text.strip()
    last = matches[-1]
    return text[last.start() if keep_label else last.end():].strip() or text.strip()


def validate_format(value: Any) -> Optional[AnswerFormat]:
    """Normalise a user's answer format: None, a non-empty list of distinct answers, or a model class."""
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, BaseModel):
        return value
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError("answer_format must be a list of allowed answers or a Pydantic model class")
    choices = tuple(str(c).strip() for c in value)
    if not choices or any(not c for c in choices):
        raise ValueError("answer_format needs at least one non-empty allowed answer")
    if len({c.casefold() for c in choices}) != len(choices):
        raise ValueError(f"answer_format has duplicate answers: {list(choices)}")
    return choices


def instructions(fmt: Optional[AnswerFormat], *, subject: str = "Your Conclusion") -> str:
    """One line telling the model what its answer must be ("" without a format). ``subject`` names
    the answer in the method's own terms (TC-RAG's Conclusion; "The line after 'Answer:'" for a
    method that reads an ``Answer:`` line), so the rule never names an action the method lacks.

    >>> instructions(("yes", "no"))
    'Your Conclusion must be exactly one of: yes, no (write just that answer).'
    >>> instructions(("A", "B"), subject="The line after 'Answer:'")
    "The line after 'Answer:' must be exactly one of: A, B (write just that answer)."
    """
    if fmt is None:
        return ""
    if isinstance(fmt, tuple):
        return f"{subject} must be exactly one of: {', '.join(fmt)} (write just that answer)."
    schema = json.dumps(fmt.model_json_schema(), ensure_ascii=False)
    return f"{subject} must be one JSON object matching this schema: {schema}"


def check(fmt: Optional[AnswerFormat], text: str) -> tuple[Any, Optional[str]]:
    """``(structured answer, None)`` when ``text`` fits ``fmt``, else ``(None, what is wrong)``.

    Without a format every text fits and the structured answer is the text itself. ``fmt`` may be
    given as a user would (a list of answers); it is normalised by :func:`validate_format`.
    """
    fmt = validate_format(fmt)
    if fmt is None:
        return text, None
    if isinstance(fmt, tuple):
        return _check_choices(fmt, text)
    return _check_schema(fmt, text)


def fit(fmt: Optional[AnswerFormat], text: str) -> Any:
    """The structured answer, or ``None`` if ``text`` does not fit."""
    return check(fmt, text)[0]


def problem(fmt: Optional[AnswerFormat], text: str) -> Optional[str]:
    """Why ``text`` does not fit ``fmt`` (``None`` if it does)."""
    return check(fmt, text)[1]


def _mentions(choices: Sequence[str], text: str) -> list[str]:
    """The choices ``text`` names as whole words, in the order of ``choices``."""
    found = []
    for choice in choices:
        # A one-letter option is matched as written: "A" is an option, "a" is an article.
        flags = 0 if len(choice) == 1 else re.IGNORECASE
        if re.search(rf"(?<![\w]){re.escape(choice)}(?![\w])", text, flags=flags):
            found.append(choice)
    return found


def _check_choices(choices: tuple[str, ...], text: str) -> tuple[Optional[str], Optional[str]]:
    allowed = ", ".join(choices)
    cleaned = _LEAD.sub("", _MARKUP.sub(" ", text or "")).strip()
    if not cleaned:
        return None, f"the answer is empty; it must be exactly one of {allowed}"
    lines = [line.strip() for line in cleaned.splitlines() if line.strip()]
    if len(lines) > 1 and sum(bool(_mentions(choices, line[:3])) for line in lines) > 1:
        return None, f"the answer lists several options line by line; it must be exactly one of {allowed}"
    # Exact answer, possibly with punctuation around it: "B", "(B)", "yes."
    bare = cleaned.strip(" .,:;!?()").casefold()
    for choice in choices:
        if bare == choice.casefold():
            return choice, None
    # The answer leads with one choice: "Yes, because ...", "B) Aorta", "B. Aorta is ..."
    head = re.match(r"[(\s]*([\w+\-]+)", cleaned)
    if head:
        word = head.group(1).casefold()
        leading = [c for c in choices if c.casefold() == word]
        rest = cleaned[head.end():]
        # "B) Aorta" / "B. Aorta" / "Yes, because ...": a label or a word set off by punctuation.
        # "No idea" / "Yes it might" are not answers that lead with a choice.
        labelled = bool(re.match(r"\s*[).:]", rest))
        set_off = not rest.strip() or bool(re.match(r"\s*[,;!\-–—]", rest)) or labelled
        first_sentence = re.split(r"[.;\n]", rest, maxsplit=1)[0]
        others = [] if labelled else [c for c in _mentions(choices, first_sentence) if c not in leading]
        if len(leading) == 1 and set_off and not others:
            return leading[0], None
        if leading and others:
            return None, f"the answer must be exactly one of {allowed}; it names {', '.join([*leading, *others])}"
    # "... the answer is B." / "..., so: yes." — a choice stated as the answer, or closing the text.
    stated = [c for c in choices if re.search(
        rf"(?:answer|conclusion)\s*(?:is|:)\s*\(?{re.escape(c)}\)?(?![\w])|(?<![\w]){re.escape(c)}\s*[.!]*\s*$",
        cleaned, flags=0 if len(c) == 1 else re.IGNORECASE)]
    if len(stated) == 1:
        return stated[0], None
    named = _mentions(choices, cleaned)
    if len(named) > 1:
        return None, f"the answer must be exactly one of {allowed}; it names {', '.join(named)}"
    return None, f"the answer must be exactly one of {allowed}"


def _check_schema(schema: type[BaseModel], text: str) -> tuple[Optional[BaseModel], Optional[str]]:
    start, end = (text or "").find("{"), (text or "").rfind("}")
    if start < 0 or end <= start:
        return None, f"the answer must be one JSON object for {schema.__name__}"
    try:
        return schema.model_validate_json(text[start:end + 1]), None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the object"
        return None, f"the answer does not match {schema.__name__}: {where}: {first.get('msg')}"
