"""FLARE (Jiang et al. 2023, "Active Retrieval Augmented Generation", FLARE-direct; paper Table 1).

The answer is written sentence by sentence. Each next sentence is first written tentatively without
retrieved evidence; if every one of its tokens has a probability of at least ``threshold`` under
the generator's own weights, it is kept. Otherwise the tools are searched with the tentative
sentence as the query (an ``Answer:`` line, which alone would find nothing, as the question followed
by the answer), and the sentence is written again with that evidence and kept as it is. With ``retrieve_question_first`` the first sentence is written
after a retrieval with the question, as FLARE's framework starts (q1 = x); it is off by default so
that every retrieval is one the confidence test asked for.

The probabilities are a teacher-forced pass of the scorer over the generator's weights (the state
monitor's ``token_logprobs``) on the sentence given the question and the answer so far; see
:mod:`.adaptive` for what that context is and for the loop, budgets (``max_steps`` caps the
retrieval rounds) and the answer rule. Not implemented: FLARE's masked queries (low-probability
tokens removed from the query) and its question-generation variant (FLARE-instruct).

``threshold`` 0.4 is a prior choice, not tuned on any split (FLARE reports its results over a range of
thresholds; a higher value retrieves more often).

Example:
    >>> from tcrag_langgraph.testing import ScriptedTokenScorer, recording_model, scripted_tool
    >>> scorer = ScriptedTokenScorer(logprobs={"perhaps": -2.0})   # P(perhaps) = 0.14 < 0.4
    >>> g = FLARE.build(model=recording_model(["It is perhaps X.", "It is metformin.", "Answer: yes"]),
    ...                       tools=[scripted_tool("DOC_RAG", "passage about {input}")], scorer=scorer)
    >>> out = g.invoke({"question": "Is metformin first-line?"})
    >>> out["answer"], [e["query"] for e in out["evidence"]], out["draft"].splitlines()[0]
    ('yes', ['It is perhaps X.'], 'It is metformin.')
"""

from __future__ import annotations

import math
from typing import Any, Optional

from pydantic import Field

from ..core import answer_format
from .adaptive import ActiveRetrievalKernel, ActiveRetrievalOptions, Trigger

__all__ = ["FLAREOptions", "FLARE"]


class FLAREOptions(ActiveRetrievalOptions):
    """FLARE's confidence threshold and start."""

    threshold: float = Field(default=0.4, gt=0.0, le=1.0,
                             description="A tentative sentence with a token below this probability triggers a "
                                         "retrieval with the sentence as the query.")
    retrieve_question_first: bool = Field(default=False,
                                          description="Retrieve with the question before the first sentence.")


class FLARE(ActiveRetrievalKernel):
    options_type = FLAREOptions
    method = "FLARE"
    default_name = "flare"
    reads_scores = True
    scorer_advice = "FLARE decides when to retrieve from token probabilities."

    def query_before(self, question: str, draft: str, last_piece: str, opts: Any) -> Optional[str]:
        return question if opts.retrieve_question_first and not draft and not last_piece else None

    def check(self, work: dict[str, Any], question: str, draft: str, piece: str, opts: Any) -> Optional[Trigger]:
        logprobs = self.probabilities_of(question, draft, piece)
        lowest = min(logprobs, default=0.0)
        if lowest >= math.log(opts.threshold):
            return None
        query = piece
        if answer_format.ANSWER_LABEL.match("\n" + piece):  # "Answer: yes" alone finds nothing: ask with the question
            query = f"{question} {answer_format.ANSWER_LABEL.sub(' ', chr(10) + piece).strip()}"
        return Trigger(keep="", query=query,
                       reason=f"a token of the tentative sentence has probability {math.exp(lowest):.3f} "
                              f"< {opts.threshold}")
