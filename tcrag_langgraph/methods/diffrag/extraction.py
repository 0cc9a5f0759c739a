"""Asking the chat model for triples: :func:`extract_triples` (bounded re-prompts while no triple
parses), :func:`extract_triples_together` (many texts, the first replies decoded together by a model
that can) and the counters of its calls and tokens (:class:`ExtractionCalls`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig

from ...core.config import TCRAGConfig
from ...core.kernel import RunKernel
from ...core.usage import count_tokens, message_tokens
from ...models.constrained import GRAMMAR_KEY, constraint_for
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
    first_reply: Optional[str] = None,
) -> tuple[Triple, ...]:
    """Ask ``model`` for triples about ``text``; re-prompt up to ``max_retries`` times while none parse.

    ``constrain``: constrain the replies to :func:`.reply_forms.triples_form` where the model takes it
    (None: the kernel's ``constrain_replies``). ``first_reply``: the first attempt's reply, already
    generated (and counted in ``calls``) by the caller. Returns the triples (possibly none: the caller
    decides what an empty result means). Model failures propagate (as the kernel's ``RunFailure``).
    """
    calls = calls if calls is not None else ExtractionCalls()
    messages = _extraction_messages(system, text, max_triples)
    kernel = model if isinstance(model, RunKernel) else RunKernel(model, [], None, TCRAGConfig())
    cfg = kernel.base_config if constrain is None else kernel.base_config.model_copy(
        update={"constrain_replies": constrain})
    for attempt in range(max_retries + 1):
        if attempt == 0 and first_reply is not None:
            out = first_reply
        else:
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


def _extraction_messages(system: str, text: str, max_triples: int) -> list[BaseMessage]:
    return [SystemMessage(content=system.format(n=max_triples)), HumanMessage(content=text)]


def decodes_together(model: Any) -> bool:
    """Whether ``model`` can decode several greedy replies in one batch (``greedy_replies``: the llama.cpp
    chat model; not after its fallback to transformers, which this loads the model to find out)."""
    return getattr(model, "decodes_together", False) is True and getattr(model, "backend", None) == "llama_cpp"


def extract_triples_together(
    model: BaseChatModel,
    system: str,
    texts: Sequence[str],
    *,
    max_triples: int,
    max_retries: int,
    max_new_tokens: int,
    constrain: bool,
    sequences: int,
) -> list[tuple[tuple[Triple, ...], ExtractionCalls]]:
    """:func:`extract_triples` for each of ``texts``, greedy, the first attempts decoded ``sequences`` at a
    time by a model that :func:`decodes_together` (re-prompts, rare, one at a time); ``(triples, calls)``
    per text, in order. Counted as :meth:`RunKernel.ask <tcrag_langgraph.core.kernel.RunKernel.ask>` counts
    a call, so a batched build's tokens compare with a plain one's."""
    if not decodes_together(model):
        raise ValueError(f"{type(model).__name__} cannot decode replies together; use extract_triples")
    conversations = [_extraction_messages(system, text, max_triples) for text in texts]
    constraint = constraint_for(model, triples_form(max_triples)) if constrain else None
    grammar = constraint.kwargs.get(GRAMMAR_KEY) if constraint is not None else None
    replies = model.greedy_replies(conversations, max_new_tokens=max_new_tokens, grammar=grammar,
                                   sequences=sequences)
    found = []
    for text, messages, reply in zip(texts, conversations, replies):
        calls = ExtractionCalls(llm_calls=1, prompt_tokens=sum(message_tokens(m) for m in messages),
                                completion_tokens=count_tokens(reply.text))
        triples = extract_triples(model, system, text, max_triples=max_triples, max_retries=max_retries,
                                  max_new_tokens=max_new_tokens, calls=calls, constrain=constrain,
                                  first_reply=reply.text)
        found.append((triples, calls))
    return found
