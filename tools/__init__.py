"""TC-RAG agent tools (installed as ``tcrag_langgraph.tools``).

Four tool families from the paper (appendix 8.7.2), each a LangChain tool behind one retry and
format-repair layer (:mod:`.layer`), each with an embedded default that needs no server:

* ``DOC_RAG``    documents: embedded BM25 + MiniLM store, or Elasticsearch (:mod:`.documents`)
* ``WEB_SEARCH`` web and encyclopedia search: offline HPO/ICD-10-CM, or SearxNG (:mod:`.web_search`)
* ``KG_RAG``     knowledge graph: rdflib / SPARQL endpoint (:mod:`.knowledge_graph`)
* ``EMR_SEARCH`` electronic medical records: SQLite / SQLAlchemy URL (:mod:`.emr`)

Any agent runs any of them (or any other LangChain tool) with :func:`invoke_tool`: one deadline, one
token budget, observation text or a :class:`ToolError` (:func:`is_tool_error`). Importing this package
loads no agent, model or LangGraph graph; the layer's names load on first use.

Example:
    >>> from tcrag_langgraph.tools import default_tools
    >>> [t.name for t in default_tools()]  # doctest: +SKIP
    ['DOC_RAG', 'WEB_SEARCH', 'KG_RAG', 'EMR_SEARCH']
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import ToolError

__all__ = ["ToolError", "default_tools", "invoke_tool", "ainvoke_tool", "is_tool_error", "make_tool", "ToolOptions", "ToolOutcome"]

_FROM_LAYER = frozenset(__all__[2:])


def __getattr__(name: str) -> Any:  # the layer (langchain_core, tenacity, tiktoken) loads on first use
    if name in _FROM_LAYER:
        return getattr(importlib.import_module(".layer", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_tools(
    *,
    documents: bool = True,
    knowledge_graph: bool = True,
    web: bool = True,
    emr: bool = True,
) -> list[Any]:
    """The embedded default tools (heavy data loads lazily, on a tool's first call)."""
    # The order is measured. The document search first: TC-RAG's worked examples search with the first tool,
    # and its prompt describes the tools last to first (methods/tcrag/prompting.py): EMR_SEARCH, KG_RAG,
    # WEB_SEARCH, DOC_RAG. So described, Qwen2.5-Coder-1.5B called DOC_RAG first on 24 of 30 PubMedQA-L
    # trainval questions; with KG_RAG described next to DOC_RAG, on 16 (KG_RAG 12); with DOC_RAG described
    # first, on none (benchmarks/RESULTS.md section 33). The records last: methods that call every tool in
    # turn (SR-RAG, FL-RAG) query the outbound tools before any record text is in the run, which the tool
    # layer's egress rule would make them refuse.
    tools: list[Any] = []
    if documents:
        from .documents import default_document_tool

        tools.append(default_document_tool())
    if web:
        from .web_search import default_web_tool

        tools.append(default_web_tool())
    if knowledge_graph:
        from .knowledge_graph import default_knowledge_graph_tool

        tools.append(default_knowledge_graph_tool())
    if emr:
        from .emr import default_emr_tool

        tools.append(default_emr_tool())
    return tools
