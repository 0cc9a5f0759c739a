"""Shared tool contract: the typed error result every TC-RAG tool returns instead of evidence.

A tool that fails returns a :class:`ToolError` (or raises); the graph turns either into an error
frame the model sees as an error, never as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ToolError"]


@dataclass(frozen=True)
class ToolError:
    """A failed tool call. ``kind`` is a short machine-readable category."""

    tool: str
    kind: str  # e.g. "timeout", "unavailable", "bad_input", "bad_response", "forbidden", "internal"
    message: str
    retryable: bool = False

    def __str__(self) -> str:
        return f"[{self.tool} error: {self.kind}] {self.message}"
