"""The forms of CRP-RAG's replies (:class:`~tcrag_langgraph.models.constrained.ReplyForm`): a sampled
reasoning step, a sub-question (prompt A.1), a merge (A.2), an answer whose few lines of reasoning fit the
reply's budget and end in ``Answer: <one of the allowed answers>`` (the last step of a path, the integration A.5), and that
answer line alone (their format re-prompts). The parsers of
:mod:`.parsing` and :func:`~tcrag_langgraph.core.answer_format.check` still read every reply.

Left free on purpose: the reasoning that decides sufficiency (prompt A.4), since its perplexity *is*
the decision and a grammar would change the text it measures; the knowledge aggregation (A.3), which no
parser reads (it is evidence text); the steps of a path before its last.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from ...models.constrained import ReplyForm, gbnf_literal

__all__ = ["QUESTION_WORDS", "MAX_QUESTION_CHARS", "STEP_FORM", "MERGE_FORM", "answer_form", "answer_line_form",
           "reasoning_chars"]

#: words a sub-question begins with (capitalised, as the first word of the step)
QUESTION_WORDS = ("What", "Which", "How", "Why", "When", "Where", "Who", "Whose", "Does", "Do", "Did", "Is", "Are",
                  "Was", "Were", "Can", "Could", "Should", "Would", "Will", "Has", "Have", "Had", "To what",
                  "In what", "In which")
#: longest sub-question (characters): one sentence that fits ``max_step_tokens`` (96) with the Final line
MAX_QUESTION_CHARS = 240

# A step is a sub-question: a question word, one line without another '?', then '?'. The paper's A.1 also
# allows "an explanation"; the 1.5B's explanations were research plans ("Conduct a study comparing ...")
# and notes of ignorance ("If we don't know anything about ..., it's not clear ...") written before any
# retrieval (tv47crp: 76 of 127 nodes did not begin with a question word; the paths made only of
# sub-questions answered "maybe" 1 time in 9, the others 17 in 48).
_SUB_QUESTION = ('( ' + " | ".join(gbnf_literal(w + " ") for w in QUESTION_WORDS)
                 + f' ) [^\\n?]{{2,{MAX_QUESTION_CHARS}}} "?"')
_QUESTION_PATTERN = ("^(" + "|".join(QUESTION_WORDS) + ") [^\n?]{2," + str(MAX_QUESTION_CHARS) + "}[?]$")

#: prompt A.1: ``Next step: <a sub-question>`` then ``Final: yes|no``, nothing else
STEP_FORM = ReplyForm(
    "crp_rag_step", f'root ::= "Next step: " {_SUB_QUESTION} "\\nFinal: " ( "yes" | "no" )\n',
    schema={"type": "object", "additionalProperties": False, "required": ["next_step", "final"],
            "properties": {"next_step": {"type": "string", "pattern": _QUESTION_PATTERN},
                           "final": {"type": "boolean"}}},
    from_json=lambda v: f"Next step: {v['next_step']}\nFinal: {'yes' if v['final'] else 'no'}")

#: prompt A.2: one ``Next step:`` line, a sub-question (a reply without one kept the first step: a preamble instead)
MERGE_FORM = ReplyForm(
    "crp_rag_merge", f'root ::= "Next step: " {_SUB_QUESTION}\n',
    schema={"type": "object", "additionalProperties": False, "required": ["next_step"],
            "properties": {"next_step": {"type": "string", "pattern": _QUESTION_PATTERN}}},
    from_json=lambda v: f"Next step: {v['next_step']}")

#: the reasoning before the answer line: at most this many lines
REASONING_LINES = 3
#: characters of reasoning a token of the reply's budget pays for. Most English runs ~4 characters a
#: token; 3 leaves room for digits (one token each) and the answer line, so the reasoning stops before
#: the budget cuts the reply: at 150 tokens the 1.5B wrote one unbroken line until the budget ran out,
#: and the answer line the form puts last was never reached (3 of 15 trainval runs, session 22).
CHARS_PER_TOKEN = 3
_ANSWER_LINE_TOKENS = 16  # "Answer: maybe." and the line breaks, with room to spare


def reasoning_chars(max_new_tokens: int) -> int:
    """The characters of reasoning a reply of ``max_new_tokens`` tokens has room for before its answer line."""
    return max(0, int(max_new_tokens) - _ANSWER_LINE_TOKENS) * CHARS_PER_TOKEN


def _spelled(choices: tuple[str, ...]) -> str:
    spelled = sorted({s for c in choices for s in (c, c[:1].upper() + c[1:])})
    return "( " + " | ".join(gbnf_literal(s) for s in spelled) + ' ) "."?'


@functools.lru_cache(maxsize=32)
def _answer_form(choices: tuple[str, ...], chars: int) -> ReplyForm:
    per_line = chars // REASONING_LINES
    if per_line < 1:
        return _answer_line_form(choices)
    grammar = (f'root ::= ( [^\\n]{{1,{per_line}}} "\\n" ){{0,{REASONING_LINES}}} "Answer: " '
               + _spelled(choices) + "\n")
    schema = {"type": "object", "additionalProperties": False, "required": ["reasoning", "answer"],
              "properties": {"reasoning": {"type": "string", "maxLength": chars},
                             "answer": {"type": "string", "enum": list(choices)}}}
    return ReplyForm("crp_rag_answer", grammar, schema=schema,
                     from_json=lambda v: f"{v['reasoning']}\nAnswer: {v['answer']}".strip())


@functools.lru_cache(maxsize=32)
def _answer_line_form(choices: tuple[str, ...]) -> ReplyForm:
    schema = {"type": "object", "additionalProperties": False, "required": ["answer"],
              "properties": {"answer": {"type": "string", "enum": list(choices)}}}
    return ReplyForm("crp_rag_answer_line", 'root ::= "Answer: " ' + _spelled(choices) + "\n", schema=schema,
                     from_json=lambda v: f"Answer: {v['answer']}")


def answer_form(answer_format: Any, *, max_new_tokens: int = 500) -> Optional[ReplyForm]:
    """At most :data:`REASONING_LINES` lines of reasoning that fit the reply's budget
    (:func:`reasoning_chars`), then ``Answer: <choice>`` as the last line, for an answer format of choices;
    None otherwise (a free answer, or a pydantic one: parse only)."""
    if not (isinstance(answer_format, tuple) and answer_format):
        return None
    return _answer_form(tuple(answer_format), reasoning_chars(max_new_tokens))


def answer_line_form(answer_format: Any) -> Optional[ReplyForm]:
    """The ``Answer: <choice>`` line alone: the form of a format re-prompt (the reply before it already
    reasoned, and a second run of reasoning is what the budget cut); None as for :func:`answer_form`."""
    if not (isinstance(answer_format, tuple) and answer_format):
        return None
    return _answer_line_form(tuple(answer_format))
