"""The forms of CRP-RAG's replies (:class:`~tcrag_langgraph.models.constrained.ReplyForm`): a sampled
reasoning step (prompt A.1), a merge (A.2), and an answer that ends in ``Answer: <one of the allowed
answers>`` (the last step of a path, the integration A.5, their format re-prompts). The parsers of
:mod:`.parsing` and :func:`~tcrag_langgraph.core.answer_format.check` still read every reply.

Left free on purpose: the reasoning that decides sufficiency (prompt A.4), since its perplexity *is*
the decision and a grammar would change the text it measures; the knowledge aggregation (A.3), which no
parser reads (it is evidence text); the steps of a path before its last.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from ...models.constrained import ReplyForm, gbnf_literal

__all__ = ["STEP_FORM", "MERGE_FORM", "answer_form"]

#: prompt A.1: ``Next step: <one line>`` then ``Final: yes|no``, nothing else
STEP_FORM = ReplyForm(
    "crp_rag_step", 'root ::= "Next step: " [^\\n]+ "\\nFinal: " ( "yes" | "no" )\n',
    schema={"type": "object", "additionalProperties": False, "required": ["next_step", "final"],
            "properties": {"next_step": {"type": "string"}, "final": {"type": "boolean"}}},
    from_json=lambda v: f"Next step: {v['next_step']}\nFinal: {'yes' if v['final'] else 'no'}")

#: prompt A.2: one ``Next step:`` line (a reply without one kept the first step: a preamble instead)
MERGE_FORM = ReplyForm(
    "crp_rag_merge", 'root ::= "Next step: " [^\\n]+\n',
    schema={"type": "object", "additionalProperties": False, "required": ["next_step"],
            "properties": {"next_step": {"type": "string"}}},
    from_json=lambda v: f"Next step: {v['next_step']}")


@functools.lru_cache(maxsize=32)
def _answer_form(choices: tuple[str, ...]) -> ReplyForm:
    spelled = sorted({s for c in choices for s in (c, c[:1].upper() + c[1:])})
    grammar = ('root ::= ( [^\\n]* "\\n" )* "Answer: " ( ' + " | ".join(gbnf_literal(s) for s in spelled)
               + ' ) "."?\n')
    schema = {"type": "object", "additionalProperties": False, "required": ["reasoning", "answer"],
              "properties": {"reasoning": {"type": "string"}, "answer": {"type": "string", "enum": list(choices)}}}
    return ReplyForm("crp_rag_answer", grammar, schema=schema,
                     from_json=lambda v: f"{v['reasoning']}\nAnswer: {v['answer']}".strip())


def answer_form(answer_format: Any) -> Optional[ReplyForm]:
    """Free lines of reasoning, then ``Answer: <choice>`` as the last line, for an answer format of choices;
    None otherwise (a free answer, or a pydantic one: parse only)."""
    return _answer_form(tuple(answer_format)) if isinstance(answer_format, tuple) and answer_format else None
