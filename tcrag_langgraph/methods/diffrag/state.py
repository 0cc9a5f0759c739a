"""TCM-DiffRAG's graph state (:class:`DiffRAGState`), why a run ends (:data:`HALT_REASONS`) and how a
node adds its tokens to the run's usage."""

from __future__ import annotations

from typing import Any, Mapping

from ...machine.state import MethodState


#: Why a run ended: an answer from the evidence, bad input, the chat model raised (or wrote
#: nothing), the answer did not fit ``TCRAGConfig.answer_format`` after the re-prompts, or the
#: graph / embedder / packaged graph could not be read.
HALT_REASONS = ("answered", "invalid_input", "model_error", "format_error", "retrieval_error")


class DiffRAGState(MethodState, total=False):
    """TCM-DiffRAG's graph state: :class:`~tcrag_langgraph.machine.state.MethodState` (question, answer, costs,
    trace) plus the reasoning path, the recalled evidence and the answering model's raw reply."""

    reasoning_path: list[list[str]]
    path_source: str  # "model" or "question" (fallback when no triple could be parsed)
    evidence: list[dict[str, Any]]
    raw_output: str
    retrievals: int


def add_token_usage(state: Mapping[str, Any], prompt: int, completion: int) -> dict[str, int]:
    """The run's ``token_usage`` with a node's prompt and completion tokens added."""
    old = state.get("token_usage") or {}
    return {"prompt": old.get("prompt", 0) + prompt, "completion": old.get("completion", 0) + completion}
