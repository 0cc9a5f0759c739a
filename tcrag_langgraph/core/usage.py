"""How a model call's tokens are counted: the one rule of the run kernel's own count
(:meth:`~.kernel.RunKernel.ask`, ``token_usage``) and of the evaluation's meter
(:class:`~tcrag_langgraph.eval.efficiency.UsageMeter`), so every method's cost reads the same way.

Tokens are cl100k tokens (:func:`~tcrag_langgraph.tools.tokens.count_tokens`) of what the model is
shown and writes, whatever its own tokenizer: a message's text, and the tool calls it makes as the
model writes them (name and JSON arguments; a malformed call as written). A model given tools by
``bind_tools`` is also shown their schemas (:func:`tools_tokens`), which a method that describes its
tools in its prompt text pays as prompt text. The chat template's own markup is counted for no one.

Example:
    >>> from langchain_core.messages import AIMessage
    >>> message_tokens(AIMessage(content="", tool_calls=[{"name": "DOC_RAG", "args": {"query": "scurvy"}, "id": "1"}]))
    19
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Optional

from ..tools.layer.outcome import content_text
from ..tools.tokens import count_tokens

__all__ = ["message_tokens", "tools_tokens"]


def message_tokens(message: Any) -> int:
    """Tokens of one message (a LangChain message, or a bare content value): its text and its tool calls."""
    tokens = count_tokens(content_text(getattr(message, "content", message)))
    for call in getattr(message, "tool_calls", None) or []:
        tokens += count_tokens(json.dumps({"name": call["name"], "arguments": call["args"]}, ensure_ascii=False))
    for call in getattr(message, "invalid_tool_calls", None) or []:
        tokens += count_tokens(str(call.get("args") or ""))
    return tokens


def tools_tokens(schemas: Optional[Iterable[Any]]) -> int:
    """Tokens of the tool schemas a model call is given (its ``tools`` keyword, as JSON)."""
    return sum(count_tokens(s if isinstance(s, str) else json.dumps(s, ensure_ascii=False, default=str))
               for s in schemas or [])
