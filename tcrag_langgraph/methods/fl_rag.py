"""FL-RAG (paper Table 1, "Naive RAG"; Khandelwal et al. 2020, Ram et al. 2023): retrieve every n tokens.

Before every piece of ``n_tokens`` tokens the answer retrieves, the first time with the question,
then with the piece written just before (the previous token window, as the paper's description of
the baseline says); each piece is written with that round's evidence. A piece is the first
``n_tokens`` tokens (cl100k, the project's counter) of one continuation; a local model is also asked
for only that many new tokens. The shared loop, budgets and answer rule: :mod:`.adaptive`
(``max_steps`` caps the retrieval rounds: after it the pieces are written without retrieving).

Example:
    >>> from tcrag_langgraph.testing import recording_model, scripted_tool
    >>> g = FLRAG.build(model=recording_model(["Metformin lowers glucose.", "Answer: yes"]),
    ...                        tools=[scripted_tool("DOC_RAG", "passage about {input}")], options={"n_tokens": 8})
    >>> out = g.invoke({"question": "Is metformin first-line?"})
    >>> out["answer"], [e["query"] for e in out["evidence"]]
    ('yes', ['Is metformin first-line?', 'Metformin lowers glucose.'])
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..core.config import TCRAGConfig
from .adaptive import ActiveRetrievalOptions, RetrieveEveryPieceKernel, trim_piece

__all__ = ["FLRAGOptions", "FLRAG"]


class FLRAGOptions(ActiveRetrievalOptions):
    """FL-RAG's window: a retrieval before every ``n_tokens`` tokens of answer."""

    n_tokens: int = Field(default=32, ge=1, le=1024, description="Tokens of answer written between two retrievals.")


class FLRAG(RetrieveEveryPieceKernel):
    options_type = FLRAGOptions
    method = "FL-RAG"
    default_name = "fl-rag"

    def piece_of(self, reply: str, opts: Any) -> str:
        return trim_piece(reply, opts.n_tokens)

    def call_budget(self, cfg: TCRAGConfig, opts: Any) -> int:
        return min(opts.n_tokens, cfg.max_new_tokens)  # a local model writes only the window
