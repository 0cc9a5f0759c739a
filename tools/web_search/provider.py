"""What every WEB_SEARCH backend offers: :class:`SearchProvider` returning :class:`Result` hits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Result", "SearchProvider"]


@dataclass(frozen=True)
class Result:
    """One search hit."""

    title: str
    url: str
    snippet: str


@runtime_checkable
class SearchProvider(Protocol):
    """What a search backend offers. Raise :class:`~tcrag_langgraph.tools.layer.ToolFailure` on failure."""

    name: str

    def search(self, query: str, k: int) -> list[Result]: ...
