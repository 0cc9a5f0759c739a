"""TCM-DiffRAG's graph state (:class:`DiffRAGState`) and why a run ends (:data:`HALT_REASONS`)."""

from __future__ import annotations

from typing import Any

from ...core.state import MethodState

#: Why a run ended: an answer from the evidence, bad input, the chat model raised (or wrote
#: nothing), the answer did not fit ``TCRAGConfig.answer_format`` after the re-prompts, or the
#: graph / embedder / packaged graph could not be read.
HALT_REASONS = ("answered", "invalid_input", "model_error", "format_error", "retrieval_error")


class DiffRAGState(MethodState, total=False):
    """TCM-DiffRAG's graph state: :class:`~tcrag_langgraph.core.state.MethodState` (question, answer, costs,
    trace) plus the reasoning path, the recalled evidence and the answering model's raw reply."""

    reasoning_path: list[list[str]]
    path_source: str  # "model" or "question" (fallback when no triple could be parsed)
    evidence: list[dict[str, Any]]
    raw_output: str
    retrievals: int

