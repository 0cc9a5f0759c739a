"""Shared tool contract: the typed error result every TC-RAG tool returns instead of evidence.

A tool that fails returns a :class:`ToolError` (or raises); the graph turns either into an error
frame the model sees as an error, never as evidence.

A tool may also carry, in its LangChain ``metadata`` under :data:`WRITTEN_INPUT_SCHEMA`, a JSON schema
for *writing* its input where its argument schema admits more than the tool accepts (a validator
asking for one field or another): an agent that constrains a model's JSON to a schema uses that one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ToolError", "WRITTEN_INPUT_SCHEMA"]

#: The ``metadata`` key of a tool's JSON schema for writing its input (see the module docstring).
WRITTEN_INPUT_SCHEMA = "written_input_schema"


@dataclass(frozen=True)
class ToolError:
    """A failed tool call. ``kind`` is a short machine-readable category."""

    tool: str
    kind: str  # e.g. "timeout", "unavailable", "bad_input", "bad_response", "forbidden", "internal"
    message: str
    retryable: bool = False

    def __str__(self) -> str:
        return f"[{self.tool} error: {self.kind}] {self.message}"
