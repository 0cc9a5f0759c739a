"""The one error every document store raises (its own file: the stores and the embedding code both
raise it, and neither should import the other for it)."""

from __future__ import annotations

__all__ = ["StoreError"]


class StoreError(RuntimeError):
    """A store operation failed. ``kind`` follows :class:`~tcrag_langgraph.tools.base.ToolError`
    ("unavailable", "timeout", "bad_response", "forbidden", "bad_input", "internal")."""

    def __init__(self, message: str, *, kind: str = "internal", retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
