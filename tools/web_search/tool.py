"""The ``WEB_SEARCH`` LangChain tool over any :class:`~.provider.SearchProvider`, built with the shared layer."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..layer import LayeredTool, ToolOptions, make_tool
from .encyclopedia import default_encyclopedia
from .provider import Result, SearchProvider
from .searxng import SearxngProvider

__all__ = ["WEB_SEARCH_NAME", "WEB_SEARCH_DESCRIPTION", "DEFAULT_OPTIONS", "WebSearchInput", "format_results", "web_tool", "default_web_tool"]

WEB_SEARCH_NAME = "WEB_SEARCH"
WEB_SEARCH_DESCRIPTION = (
    "Search a medical encyclopedia (or the web, if configured) for definitions of diseases, "
    "symptoms, phenotypes and ICD-10-CM diagnosis codes. Input: a short search query in plain text, "
    'e.g. type 2 diabetes complications, or JSON {"query": "...", "k": 3} (k = number of results, 1-10). '
    "Returns numbered results with a title, source URL and snippet."
)
_SNIPPET_CHARS = 600
#: Layer options of ``WEB_SEARCH`` unless the caller passes its own.
DEFAULT_OPTIONS = ToolOptions(timeout_s=20.0, retries=2, backoff=0.5, max_output_tokens=512, cache_size=128)


class WebSearchInput(BaseModel):
    """Arguments of WEB_SEARCH."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=500, description="What to look up, in plain words.")
    k: int = Field(default=3, ge=1, le=10, description="How many results to return.")


def format_results(query: str, results: Sequence[Result], *, snippet_chars: int = _SNIPPET_CHARS) -> str:
    """Numbered observation text; says so plainly when nothing was found.

    Example:
        >>> print(format_results("gout", [Result("Gout", "https://x/1", "Arthritis.")]))
        [1] Gout
        URL: https://x/1
        Arthritis.
    """
    if not results:
        return f"No results for {query!r}."
    blocks = []
    for i, r in enumerate(results, 1):
        snippet = r.snippet if len(r.snippet) <= snippet_chars else r.snippet[: snippet_chars - 1].rstrip() + "…"
        blocks.append(f"[{i}] {r.title}\nURL: {r.url}\n{snippet}".rstrip())
    return "\n\n".join(blocks)


def web_tool(
    provider: SearchProvider,
    *,
    name: str = WEB_SEARCH_NAME,
    description: str = WEB_SEARCH_DESCRIPTION,
    snippet_chars: int = _SNIPPET_CHARS,
    options: Optional[ToolOptions] = None,
    **overrides: Any,
) -> LayeredTool:
    """WEB_SEARCH over any provider, wrapped by the shared tool layer.

    Example:
        >>> from tcrag_langgraph.tools.web_search import EncyclopediaEntry, EncyclopediaProvider
        >>> p = EncyclopediaProvider(entries=[EncyclopediaEntry("X1", "Gout", "https://x/1",
        ...     "Gout: arthritis from urate crystals.", "demo")], persist=False)
        >>> print(web_tool(p).invoke({"query": "gout"}))
        [1] Gout
        URL: https://x/1
        Gout: arthritis from urate crystals.
    """
    if not callable(getattr(provider, "search", None)):
        raise TypeError("provider must have a search(query, k) method")
    options = DEFAULT_OPTIONS if options is None else options

    def run(args: WebSearchInput) -> str:
        return format_results(args.query, provider.search(args.query, args.k), snippet_chars=snippet_chars)

    afunc = None
    if callable(getattr(provider, "asearch", None)):

        async def afunc(args: WebSearchInput) -> str:
            return format_results(args.query, await provider.asearch(args.query, args.k), snippet_chars=snippet_chars)

    return make_tool(
        name,
        description,
        run,
        afunc=afunc,
        args_schema=WebSearchInput,
        options=options,
        # a provider that sends queries off the machine (SearxNG) makes the tool outbound (layer.egress)
        **{"transient": (ConnectionError,), "primary_field": "query",
           "sends_off_machine": bool(getattr(provider, "sends_off_machine", False)) or options.sends_off_machine,
           **overrides},
        secrets=(*overrides.get("secrets", options.secrets), *(getattr(provider, "secrets", ()) or ())),
    )


def default_web_tool(
    *,
    searxng_url: Optional[str] = None,
    api_key: Optional[str] = None,
    provider: Optional[SearchProvider] = None,
    http_timeout_s: float = 10.0,
    **tool_args: Any,
) -> LayeredTool:
    """The WEB_SEARCH tool: the offline encyclopedia, or a SearxNG server when ``searxng_url`` is given.

    ``searxng_url``/``api_key`` default to ``$TCRAG_SEARXNG_URL``/``$TCRAG_SEARCH_API_KEY``;
    other keywords go to :func:`web_tool` (``options``, or single ``ToolOptions`` fields such as ``retries``).

    Example:
        >>> default_web_tool().name
        'WEB_SEARCH'
    """
    if provider is None:
        url = searxng_url or os.environ.get("TCRAG_SEARXNG_URL")
        if url:
            key = api_key or os.environ.get("TCRAG_SEARCH_API_KEY")
            provider = SearxngProvider(url, api_key=key, timeout_s=http_timeout_s)
        else:
            provider = default_encyclopedia()
    return web_tool(provider, **tool_args)
