"""FS-RAG (paper Table 1, "Naive RAG"; Trivedi et al. 2023, IRCoT-style): retrieve every sentence.

Before every sentence of the answer the method retrieves, the first time with the question, then
with the sentence written just before; each sentence is written with that round's evidence (the
first sentence of one continuation). The shared loop, budgets and answer rule: :mod:`.adaptive`
(``max_steps`` caps the retrieval rounds: after it the sentences are written without retrieving).

Example:
    >>> from tcrag_langgraph.testing import recording_model, scripted_tool
    >>> g = build_fs_rag_graph(model=recording_model(["Metformin lowers glucose. More.", "Answer: yes"]),
    ...                        tools=[scripted_tool("DOC_RAG", "passage about {input}")])
    >>> out = g.invoke({"question": "Is metformin first-line?"})
    >>> out["answer"], [e["query"] for e in out["evidence"]]
    ('yes', ['Is metformin first-line?', 'Metformin lowers glucose.'])
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from ..machine.config import TCRAGConfig
from .adaptive import ActiveRetrievalKernel, ActiveRetrievalOptions, build_active_graph

__all__ = ["FSRAGOptions", "build_fs_rag_graph"]


class FSRAGOptions(ActiveRetrievalOptions):
    """FS-RAG has only the shared options (a sentence is the window)."""


class _FixedSentence(ActiveRetrievalKernel):
    options_type = FSRAGOptions
    method = "FS-RAG"

    def query_before(self, question: str, draft: str, last_piece: str, opts: Any) -> Optional[str]:
        return last_piece or question


def build_fs_rag_graph(*, model: BaseChatModel | str | None = None, tools: Optional[Sequence[BaseTool]] = None,
                       scorer: Any = None, config: Optional[TCRAGConfig | dict[str, Any]] = None,
                       options: FSRAGOptions | Mapping[str, Any] | None = None, checkpointer: Any = None,
                       store: Any = None, name: str = "fs-rag", trust_client_identity: bool = False,
                       model_kwargs: Optional[Mapping[str, Any]] = None):
    """FS-RAG: retrieve with the previous sentence before writing the next one."""
    return build_active_graph(_FixedSentence, model=model, tools=tools, scorer=scorer, config=config,
                              options=options, checkpointer=checkpointer, store=store, name=name,
                              trust_client_identity=trust_client_identity, model_kwargs=model_kwargs,
                              reads_scores=False)
