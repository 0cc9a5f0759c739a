"""FS-RAG (paper Table 1, "Naive RAG"; Trivedi et al. 2023, IRCoT-style): retrieve every sentence.

Before every sentence of the answer the method retrieves, the first time with the question, then
with the sentence written just before; each sentence is written with that round's evidence (the
first sentence of one continuation). The shared loop, budgets and answer rule: :mod:`.adaptive`
(``max_steps`` caps the retrieval rounds: after it the sentences are written without retrieving).

Example:
    >>> from tcrag_langgraph.testing import recording_model, scripted_tool
    >>> g = FSRAG.build(model=recording_model(["Metformin lowers glucose. More.", "Answer: yes"]),
    ...                        tools=[scripted_tool("DOC_RAG", "passage about {input}")])
    >>> out = g.invoke({"question": "Is metformin first-line?"})
    >>> out["answer"], [e["query"] for e in out["evidence"]]
    ('yes', ['Is metformin first-line?', 'Metformin lowers glucose.'])
"""

from __future__ import annotations

from .adaptive import ActiveRetrievalOptions, RetrieveEveryPieceKernel

__all__ = ["FSRAGOptions", "FSRAG"]


class FSRAGOptions(ActiveRetrievalOptions):
    """FS-RAG has only the shared options (a sentence is the window)."""


class FSRAG(RetrieveEveryPieceKernel):
    options_type = FSRAGOptions
    method = "FS-RAG"
    default_name = "fs-rag"
