"""Asking the chat model for triples: :func:`extract_triples` (bounded re-prompts while no triple
parses) and the counters of its calls and tokens (:class:`ExtractionCalls`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig

from ...core.config import TCRAGConfig
from ...core.kernel import RunKernel
from .parsing import Triple, parse_triples
from .prompts import REPROMPT
from .reply_forms import triples_form


@dataclass
class ExtractionCalls:
    """LLM calls and tokens of one extraction (added to a run's counters)."""

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    problems: list[str] = field(default_factory=list)


def extract_triples(
    model: BaseChatModel | RunKernel,
    system: str,
    text: str,
    *,
    max_triples: int,
    max_retries: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    allow_unknown: bool = False,
    config: Optional[RunnableConfig] = None,
    calls: Optional[ExtractionCalls] = None,
    constrain: Optional[bool] = None,
) -> tuple[Triple, ...]:
    """Ask ``model`` for triples about ``text``; re-prompt up to ``max_retries`` times while none parse.

    ``constrain``: constrain the replies to :func:`.reply_forms.triples_form` where the model takes it
    (None: the kernel's ``constrain_replies``). Returns the triples (possibly none: the caller decides
    what an empty result means). Model failures propagate (as the kernel's ``RunFailure``).
    """
    calls = calls if calls is not None else ExtractionCalls()
    messages: list[BaseMessage] = [
        SystemMessage(content=system.format(n=max_triples)),
        HumanMessage(content=text),
    ]
    kernel = model if isinstance(model, RunKernel) else RunKernel(model, [], None, TCRAGConfig())
    cfg = kernel.base_config if constrain is None else kernel.base_config.model_copy(
        update={"constrain_replies": constrain})
    for attempt in range(max_retries + 1):
        work: dict[str, Any] = {}
        out = kernel.ask(work, messages, cfg, config, max_new_tokens=max_new_tokens, temperature=temperature,
                         form=triples_form(max_triples))  # a failure raises RunFailure
        calls.llm_calls += work["llm_calls"]
        calls.prompt_tokens += work["token_usage"]["prompt"]
        calls.completion_tokens += work["token_usage"]["completion"]
        parsed = parse_triples(out, max_triples=max_triples, allow_unknown=allow_unknown)
        calls.problems.extend(f"attempt {attempt + 1}: {p}" for p in parsed.problems)
        if parsed.triples:
            return parsed.triples
        why = "; ".join(parsed.problems[:3]) or "empty reply"
        messages = [*messages, AIMessage(content=out), HumanMessage(content=REPROMPT.format(problems=why))]
    return ()
