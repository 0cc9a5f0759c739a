"""Per-question cost (paper Table 2): LLM interactions, retrievals, wall time, tokens, stack ops.

Costs are measured the same way for every method, from LangChain callbacks rather than from each
method's own bookkeeping:

* **LLM interactions**: chat-model (or LLM) calls started, format re-prompts included. The state
  monitor's scoring passes are not interactions (they are forward passes, not generations).
* **Retrievals**: tool calls started (``tool_errors`` counts the ones that failed), plus the recalls a
  method makes from its own knowledge without a tool (TCM-DiffRAG's graph recall: one per
  ``Recall`` push in its live events, :data:`OWN_RETRIEVAL_ACTIONS`).
* **Tokens**: cl100k tokens (tiktoken, :func:`tcrag_langgraph.tools.tokens.count_tokens`) of every prompt
  message sent and every completion received, tool calls included, and of the tool schemas a call
  binds (:mod:`tcrag_langgraph.core.usage`, the run kernel's own rule). ``completion_tokens`` is what
  the model wrote; ``total_tokens`` adds the prompts, which for a stack machine grow with the stack.
* **Backtracks / Summaries**: trace events that really popped a frame (``op == "pop"``) or replaced
  the top one (``op == "pop+push"``); a Backtrack on a bare User_Query (``noop``) is not counted.
* **Replayed replies** (``tcrag eval --reply-cache``, :mod:`tcrag_langgraph.eval.reply_cache`):
  ``cached_calls`` counts the calls answered from the cache, ``replayed_s`` the seconds their
  generations took when first made, which ``wall_time_s`` includes (so a method's time reads as if it
  had generated every reply).

Example:
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> meter = UsageMeter()
    >>> _ = FakeListChatModel(responses=["B"]).invoke("Which?", config={"callbacks": [meter]})
    >>> meter.llm_calls, meter.completion_tokens
    (1, 1)
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from ..core.events import EVENT_NAME
from ..core.usage import message_tokens, tools_tokens
from ..tools.layer import is_tool_error
from ..tools.tokens import count_tokens
from .reply_cache import HIT_KEY, SECONDS_KEY

__all__ = ["UsageMeter", "QuestionCost", "count_stack_ops", "question_cost", "mean_costs", "COST_FIELDS",
           "OWN_RETRIEVAL_ACTIONS"]

#: Live-event actions that are a retrieval made without a tool (TCM-DiffRAG recalls from its own graph).
OWN_RETRIEVAL_ACTIONS = frozenset({"Recall"})

COST_FIELDS = (
    "llm_calls",
    "retrievals",
    "tool_errors",
    "wall_time_s",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "backtracks",
    "summaries",
    "steps",
    "cached_calls",
    "replayed_s",
)


class UsageMeter(BaseCallbackHandler):
    """Callback handler counting LLM calls, tool calls and tokens (thread-safe).

    Pass it in ``config={"callbacks": [meter]}``; the TC-RAG graph and the baselines forward
    callbacks to the model and the tools.
    """

    raise_error = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.llm_calls = 0
            self.prompt_tokens = 0
            self.completion_tokens = 0
            self.retrievals = 0
            self.tool_errors = 0
            self.tool_names: list[str] = []
            self._tool_runs: set[UUID] = set()
            self.cached_calls = 0
            self.replayed_s = 0.0

    # ----- models -----
    def on_chat_model_start(self, serialized: Mapping[str, Any], messages: list[list[Any]], **kwargs: Any) -> None:
        tokens = sum(message_tokens(m) for batch in messages for m in batch)
        tokens += len(messages) * tools_tokens((kwargs.get("invocation_params") or {}).get("tools"))
        with self._lock:
            self.llm_calls += len(messages)
            self.prompt_tokens += tokens

    def on_llm_start(self, serialized: Mapping[str, Any], prompts: list[str], **kwargs: Any) -> None:
        tokens = sum(count_tokens(p) for p in prompts)
        with self._lock:
            self.llm_calls += len(prompts)
            self.prompt_tokens += tokens

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        tokens, hits, replayed = 0, 0, 0.0
        for batch in getattr(response, "generations", []) or []:
            for gen in batch:
                message = getattr(gen, "message", None)
                tokens += message_tokens(message) if message is not None else count_tokens(getattr(gen, "text", ""))
                metadata = getattr(message, "response_metadata", None) or {}
                if metadata.get(HIT_KEY):
                    hits += 1
                    replayed += float(metadata.get(SECONDS_KEY) or 0.0)
        with self._lock:
            self.completion_tokens += tokens
            self.cached_calls += hits
            self.replayed_s += replayed

    # ----- tools -----
    def on_tool_start(self, serialized: Mapping[str, Any], input_str: str, *, run_id: UUID, **kwargs: Any) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name") or "?"
        with self._lock:
            self.retrievals += 1
            self.tool_names.append(str(name))
            self._tool_runs.add(run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        # Tools of this project return a ToolError value instead of raising.
        if is_tool_error(output):
            with self._lock:
                self.tool_errors += 1

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self.tool_errors += 1

    # ----- retrievals without a tool -----
    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if (name == EVENT_NAME and isinstance(data, Mapping) and data.get("op") == "push"
                and data.get("action") in OWN_RETRIEVAL_ACTIONS):
            with self._lock:
                self.retrievals += 1


@dataclass(frozen=True)
class QuestionCost:
    """What one question cost one method."""

    llm_calls: int
    retrievals: int
    tool_errors: int
    wall_time_s: float
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    backtracks: int
    summaries: int
    steps: int
    cached_calls: int = 0
    replayed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _field(event: Any, name: str) -> Any:
    return event.get(name) if isinstance(event, Mapping) else getattr(event, name, None)


def count_stack_ops(trace: Optional[Iterable[Any]]) -> tuple[int, int]:
    """``(backtracks, summaries)`` that changed the stack, from a run's trace.

    Example:
        >>> count_stack_ops([{"action": "Backtrack", "op": "pop"}, {"action": "Backtrack", "op": "noop"},
        ...                  {"action": "Summary", "op": "pop+push"}])
        (1, 1)
    """
    backtracks = summaries = 0
    for event in trace or []:
        action, op = _field(event, "action"), _field(event, "op")
        if action == "Backtrack" and op == "pop":
            backtracks += 1
        elif action == "Summary" and op == "pop+push":
            summaries += 1
    return backtracks, summaries


def question_cost(output: Mapping[str, Any], meter: UsageMeter, *, wall_time_s: float) -> QuestionCost:
    """Combine a run's output state (trace, steps) with what the meter counted; ``wall_time_s`` is
    the measured time plus the seconds of the replies replayed from a reply cache."""
    backtracks, summaries = count_stack_ops(output.get("trace"))
    return QuestionCost(
        llm_calls=meter.llm_calls,
        retrievals=meter.retrievals,
        tool_errors=meter.tool_errors,
        wall_time_s=float(wall_time_s) + meter.replayed_s,
        prompt_tokens=meter.prompt_tokens,
        completion_tokens=meter.completion_tokens,
        total_tokens=meter.prompt_tokens + meter.completion_tokens,
        backtracks=backtracks,
        summaries=summaries,
        steps=int(output.get("steps") or 0),
        cached_calls=meter.cached_calls,
        replayed_s=round(meter.replayed_s, 3),
    )


def mean_costs(costs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per-field means over questions (Table 2 rows)."""
    if not costs:
        return {name: 0.0 for name in COST_FIELDS}
    return {name: sum(float(c.get(name) or 0) for c in costs) / len(costs) for name in COST_FIELDS}

