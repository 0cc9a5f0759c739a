"""The base of CRP-RAG's node holder: the model, tools, scorer and embedder, and the helpers every
node uses (per-run settings, trace events, counted model calls, perplexity scores, the halt)."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...machine.config import TCRAGConfig, resolve_config
from ...machine.events import emit
from ...tools.layer.outcome import content_text
from ...machine.result import RunResult
# The stack machine's input and config handling, one home for every method of the package.
from ...machine.run_input import child_config
from ...machine.state import TraceEvent
from ...tools.tokens import count_tokens
from .options import CRPRAGOptions

__all__ = ["RunFailure", "CRPRAGMachine"]


class RunFailure(Exception):
    """A model or scorer failure that ends the run with ``halt_reason``."""

    def __init__(self, reason: str, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.reason = reason


class CRPRAGMachine:
    """Holds the model, tools, scorer and embedder and the helpers of the graph nodes; the stages'
    node classes (construction, knowledge, answering) build on it."""

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, embeddings: Any,
                 config: TCRAGConfig, options: CRPRAGOptions) -> None:
        self.model = model
        self.tools = list(tools)
        self.scorer = scorer
        self.embeddings = embeddings
        self.config = config
        self.options = options

    # ----- helpers -----
    def settings(self, config: RunnableConfig, runtime: Runtime) -> tuple[CRPRAGOptions, TCRAGConfig]:
        """This run's options and shared config: ``context=`` may be CRPRAGOptions, TCRAGConfig or a
        mapping of either's fields; ``configurable`` may set TCRAGConfig fields (as for TC-RAG)."""
        context = getattr(runtime, "context", None)
        own: Any = None
        shared: Any = None
        if isinstance(context, CRPRAGOptions):
            own = context
        elif isinstance(context, TCRAGConfig):
            shared = context
        elif isinstance(context, Mapping):
            unknown = sorted(set(context) - set(CRPRAGOptions.model_fields) - set(TCRAGConfig.model_fields))
            if unknown:
                raise ValueError(f"unknown options {unknown}")
            own = {k: v for k, v in context.items() if k in CRPRAGOptions.model_fields}
            shared = {k: v for k, v in context.items() if k in TCRAGConfig.model_fields}
        elif context is not None:
            raise ValueError(f"context must be CRPRAGOptions, TCRAGConfig or a mapping, not {type(context).__name__}")
        return self.options.merged(own), resolve_config(self.config, configurable=(config or {}).get("configurable"),
                                                        context=shared)

    @staticmethod
    def record(config: RunnableConfig, events: list[TraceEvent], *, step: int,
               action: str, op: str, content: str = "", nodes: int = 0, value: Optional[float] = None,
               detail: Optional[dict[str, Any]] = None) -> None:
        event = TraceEvent(step=step, action=action, op=op, content=content[:2000], stack_depth=nodes,
                           state_value=value,
                           detail=None if detail is None else json.dumps(detail, ensure_ascii=False, default=str))
        emit(event, config)
        events.append(event)

    def ask(self, counters: dict[str, Any], messages: list[BaseMessage], config: RunnableConfig, *,
            max_new_tokens: int, temperature: float) -> str:
        """One model call (counted, tokens metered); a failure becomes a ``model_error`` halt."""
        from ...models.local import LocalChatModel

        kwargs: dict[str, Any] = {}
        if isinstance(self.model, LocalChatModel):  # only our model takes these per call
            kwargs.update(max_new_tokens=max_new_tokens, temperature=temperature)
        counters["llm_calls"] += 1
        counters["prompt"] += sum(count_tokens(content_text(m.content)) for m in messages)
        try:
            reply = self.model.invoke(messages, config=child_config(config), **kwargs)
        except Exception as exc:
            raise RunFailure("model_error", exc) from exc
        text = content_text(reply.content).strip()
        counters["completion"] += count_tokens(text)
        return text

    def score(self, context: str, text: str) -> float:
        try:
            if hasattr(self.scorer, "score"):
                value = float(self.scorer.score(context, text, metric="cppl"))
            else:
                value = float(self.scorer(context, text, metric="cppl"))
        except Exception as exc:
            raise RunFailure("scorer_error", exc) from exc
        if not math.isfinite(value):
            raise RunFailure("scorer_error", ValueError(f"the scorer returned {value}"))
        return value

    @staticmethod
    def counters(state: Mapping[str, Any]) -> dict[str, Any]:
        usage = state.get("token_usage") or {}
        return {"llm_calls": state.get("llm_calls", 0), "tool_calls": state.get("tool_calls", 0),
                "prompt": usage.get("prompt", 0), "completion": usage.get("completion", 0),
                "steps": state.get("steps", 0)}

    @staticmethod
    def totals(counters: Mapping[str, Any]) -> dict[str, Any]:
        return {"llm_calls": counters["llm_calls"], "tool_calls": counters["tool_calls"], "steps": counters["steps"],
                "token_usage": {"prompt": counters["prompt"], "completion": counters["completion"]}}

    def halt(self, state: Mapping[str, Any], config: RunnableConfig, counters: dict[str, Any],
             events: list[TraceEvent], *, reason: str, answer: Optional[str] = None, validated: bool = False,
             error: Optional[str] = None, extra: Optional[dict[str, Any]] = None) -> Command:
        nodes = (extra or {}).get("nodes", state.get("nodes") or [])
        self.record(config, events, step=counters["steps"], action="Halt", op="halt", content=answer or "",
                    nodes=len(nodes), value=(extra or {}).get("path_score", state.get("path_score")),
                    detail={"halt_reason": reason, "error": error})
        update: dict[str, Any] = {**(extra or {}), **self.totals(counters),
                                  "trace": [*state.get("trace", []), *events], "answer": answer,
                                  "answer_validated": validated, "halt_reason": reason, "error": error}
        result = RunResult.from_state({**state, **update})
        update["messages"] = [AIMessage(content=result.text, response_metadata=result.metadata())]
        return Command(goto=END, update=update)
