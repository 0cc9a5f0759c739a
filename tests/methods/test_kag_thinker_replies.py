"""KAG-Thinker's parsers of the other model replies (:mod:`tcrag_langgraph.methods.kag_thinker.replies`):
the knowledge-boundary answer, the self-check and a depth turn's focus."""

from __future__ import annotations

import pytest

from tcrag_langgraph.methods.kag_thinker import (
    ContentItem,
    LogicalFormParseError,
    parse_boundary_answer,
    parse_confidence,
    parse_focus,
)


def test_small_reply_parsers():
    assert parse_boundary_answer("<answer>\\boxed{Herman {Melville}}</answer>") == "Herman {Melville}"
    assert parse_boundary_answer("\\boxed{42}") == "42"
    assert parse_boundary_answer("<answer>I can't answer this question</answer>") is None
    assert parse_boundary_answer("no idea") is None
    assert parse_confidence("<answer>\\boxed{False}</answer>") is False
    assert parse_confidence("... so the answer is True.") is True
    assert parse_confidence("maybe") is None
    focus = parse_focus("<focus>ref 1</focus>\nStep: Who is #1's wife?\nAction: Retrieval(s=o1, p=p2:wife, o=o2:person)",
                        index=2, known={"o1": ContentItem(step=1)})
    assert focus.answer is None and focus.next_form.references == [1]
    with pytest.raises(LogicalFormParseError):
        parse_focus("just rambling", index=1)
    with pytest.raises(LogicalFormParseError, match="must be a Retrieval"):
        parse_focus("Step: add\nAction: Math(content=['1'], target='1+1')", index=1)
