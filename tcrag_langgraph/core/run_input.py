"""What a run is asked, and what it hands on: the question read from ``{"question": ...}`` or the
last human message and checked, and the part of a run's config passed to models and tools.

Shared by the TC-RAG graph and the papers' other methods (:mod:`tcrag_langgraph.methods`), so every
method refuses the same bad input with the same words.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig

from ..tools.layer.outcome import content_text
from .config import TCRAGConfig

__all__ = ["question_problem", "extract_question", "last_human_is", "child_config"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f]")


def child_config(config: RunnableConfig) -> dict[str, Any]:
    """The part of a run's config handed to a model or tool call: callbacks, tags, metadata and the
    user's ``configurable`` keys (LangGraph's own ``__...`` keys stay with the graph)."""
    keep = ("callbacks", "tags", "metadata", "run_name", "max_concurrency")
    child = {k: config[k] for k in keep if config and k in config}
    child["configurable"] = {k: v for k, v in (config or {}).get("configurable", {}).items() if not k.startswith("__")}
    return child


def last_human_is(state: Mapping[str, Any], question: str) -> bool:
    """Whether the conversation already ends with ``question`` as its last human message."""
    for message in reversed(state.get("messages") or []):
        if isinstance(message, HumanMessage):
            return content_text(message.content).strip() == question
    return False


def extract_question(state: Mapping[str, Any], cfg: TCRAGConfig) -> tuple[str, Optional[str]]:
    """The question and, if it cannot be used, why not."""
    raw: Any = state.get("question")
    messages = state.get("messages") or []
    # A chat turn ends with the user's message; it is newer than a question left from the last turn.
    if messages and isinstance(messages[-1], HumanMessage):
        raw = messages[-1].content
        if isinstance(raw, list):
            raw = content_text(raw)
    if raw is None:
        return "", "no question: give {'question': ...} or {'messages': [...]} ending with a human message"
    return question_problem(raw, cfg)


def question_problem(raw: Any, cfg: TCRAGConfig) -> tuple[str, Optional[str]]:
    """``(cleaned question, None)``, or ``("", why it cannot be used)``."""
    if not isinstance(raw, str):
        return "", f"the question must be text, not {type(raw).__name__}"
    question = _CONTROL.sub(" ", raw).strip()
    if not question:
        return "", "the question is empty"
    if len(question) > cfg.max_question_chars:
        return "", (f"the question is {len(question):,} characters long; the limit is {cfg.max_question_chars:,} "
                    "(raise max_question_chars, or shorten it)")
    if not any(ch.isalnum() for ch in question):
        return "", "the question contains no readable text"
    return question, None
