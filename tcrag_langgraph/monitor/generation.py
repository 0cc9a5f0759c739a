"""State values read off the generation's own token log-probs: no second pass, no second server.

A chat model that returns the log-probabilities of the tokens it generates (llama.cpp through
:class:`~tcrag_langgraph.models.llama_cpp.LlamaCppChatModel`; OpenAI-compatible chat servers asked
for ``logprobs`` / ``top_logprobs``: OpenAI, vLLM, llama.cpp's server, Ollama since 0.12) gives, with
the reply itself, everything these values need:

===================  ===============================================================================  =====
``gen_answer_prob``  1 - the probability of the chosen answer among the allowed ones (yes/no/maybe,     0.5
                     option letters), from ``top_logprobs`` at the position where the answer starts
``gen_cppl``         exp(- mean log-prob) of the Conclusion's tokens as generated: the perplexity of    1.5
                     the text given everything the model saw (system prompt, stack, evidence)
``gen_entropy``      the mean entropy (nats) of the next-token distribution at the Conclusion's         0.7
                     tokens, from ``top_logprobs`` (the mass outside the top ``k`` counted as one
                     outcome: a lower bound of the full entropy)
``gen_combined``     1 - the probability that the answer is right, from the three above through a       0.5
                     logistic regression that ``tcrag calibrate --metric gen_combined`` fits for the
                     model and task (:mod:`.combination`; a run without that calibration is refused)
===================  ===============================================================================  =====

Lower is better, as for every state value. They are conditioned on the whole prompt the model
answered, evidence included, unlike the paper's cppl (eq. 2, the User_Query only). Their sigmas
above are starting points with a plain meaning (an answer the model prefers over all others
together; an average token probability of 2/3; ...), not measurements: ``tcrag calibrate --metric
gen_answer_prob`` measures a model's own on a task. A token outside the top ``k`` at the answer
position has probability 0 there (the chosen token is always counted).

Example:
    >>> tokens = [GeneratedToken("Conclusion", -0.01, {"Conclusion": -0.01}),
    ...           GeneratedToken(":", -0.01, {":": -0.01}),
    ...           GeneratedToken(" yes", -0.2, {" yes": -0.2, " no": -1.8, " maybe": -4.0})]
    >>> values = generation_values(tokens, "yes", chosen="yes", choices=("yes", "no", "maybe"))
    >>> round(values["gen_answer_prob"], 3), round(values["gen_cppl"], 3)
    (0.183, 1.221)
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Mapping, NamedTuple, Optional, Sequence

__all__ = ["GENERATION_VALUES", "TOP_LOGPROBS", "GeneratedToken", "reply_tokens", "content_tokens",
           "generation_values", "returns_logprobs", "NoGenerationLogprobs"]

#: the state values read off the generation's own log-probs
GENERATION_VALUES = ("gen_answer_prob", "gen_cppl", "gen_entropy", "gen_combined")
#: alternatives asked for at each generated token (OpenAI accepts up to 20)
TOP_LOGPROBS = 10


class NoGenerationLogprobs(ValueError):
    """The reply carries no token log-probs (the model or server does not return them)."""


class GeneratedToken(NamedTuple):
    """One generated token: its text, its log-probability, and the top alternatives at its position
    (text -> log-probability, the token itself among them)."""

    text: str
    logprob: float
    top: Mapping[str, float]


def reply_tokens(message: Any) -> Optional[list[GeneratedToken]]:
    """The generated tokens of a chat reply, from ``response_metadata["logprobs"]["content"]`` (the
    OpenAI shape, which langchain-openai and :class:`LlamaCppChatModel` both give); None when absent."""
    meta = getattr(message, "response_metadata", None) or {}
    logprobs = meta.get("logprobs") if isinstance(meta, Mapping) else None
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not content:
        return None
    tokens = []
    for item in content:
        if not isinstance(item, Mapping) or item.get("logprob") is None:
            return None
        top = {str(alt["token"]): float(alt["logprob"]) for alt in item.get("top_logprobs") or []
               if isinstance(alt, Mapping) and alt.get("logprob") is not None}
        text = str(item.get("token") or "")
        top.setdefault(text, float(item["logprob"]))
        tokens.append(GeneratedToken(text, float(item["logprob"]), top))
    return tokens


def content_tokens(tokens: Sequence[GeneratedToken], content: str) -> list[GeneratedToken]:
    """The tokens that wrote ``content`` (an action's text): those overlapping its last occurrence in
    the reply the tokens spell (case-insensitive if need be); all of them when it cannot be found
    (a repaired or reworded action)."""
    joined = "".join(t.text for t in tokens)
    needle = content.strip()
    start = joined.rfind(needle) if needle else -1
    if start < 0 and needle:
        start = joined.lower().rfind(needle.lower())
    if start < 0:
        return list(tokens)
    end, out, pos = start + len(needle), [], 0
    for token in tokens:
        nxt = pos + len(token.text)
        if nxt > start and pos < end:
            out.append(token)
        pos = nxt
    return out or list(tokens)


def _norm(text: str) -> str:
    return text.strip().lower()


def _answer_prob(tokens: Sequence[GeneratedToken], chosen: str, choices: Sequence[str]) -> Optional[float]:
    """1 - P(chosen) / P(any allowed answer) at the first token that starts the chosen answer: each
    alternative there counts for the answers it begins (" Yes" and "yes" both for "yes")."""
    want = _norm(chosen)
    for token in tokens:
        word = _norm(token.text)
        if not word or not want.startswith(word):
            continue
        mass = dict.fromkeys((_norm(c) for c in choices), 0.0)
        for alt, logprob in token.top.items():
            piece = _norm(alt)
            if piece:
                for answer in mass:
                    if answer.startswith(piece):
                        mass[answer] += math.exp(logprob)
        total = sum(mass.values())
        return 1.0 - mass[want] / total if total > 0 else None
    return None


def _entropy(top: Mapping[str, float]) -> float:
    probs = [math.exp(lp) for lp in top.values()]
    rest = max(0.0, 1.0 - sum(probs))
    return -sum(p * math.log(p) for p in [*probs, rest] if p > 0)


def generation_values(tokens: Sequence[GeneratedToken], content: str, *, chosen: Optional[str] = None,
                      choices: Optional[Sequence[str]] = None) -> dict[str, float]:
    """Every generation value of ``content`` (an action's text) that ``tokens`` (the reply's) allow:
    ``gen_cppl`` and ``gen_entropy`` always, ``gen_answer_prob`` when the allowed answers ``choices``
    and the one ``chosen`` (what the content answers) are given and the tokens write it. Raises
    :class:`NoGenerationLogprobs` when there are no tokens."""
    if not tokens:
        raise NoGenerationLogprobs("the model's reply carries no token log-probabilities")
    own = content_tokens(tokens, content)
    values = {"gen_cppl": math.exp(-sum(t.logprob for t in own) / len(own)),
              "gen_entropy": sum(_entropy(t.top) for t in own) / len(own)}
    if choices and chosen in choices:
        value = _answer_prob(own, chosen, choices)
        if value is not None:
            values["gen_answer_prob"] = value
    return values


#: id(model) -> (a weak reference to it, its probe's answer); an entry leaves with its model
_PROBED: dict[int, tuple[weakref.ref, bool]] = {}


def returns_logprobs(model: Any) -> bool:
    """Whether ``model``'s replies carry the log-probs of their tokens when asked: a model that says so
    (``returns_logprobs``, e.g. LlamaCppChatModel), or an OpenAI-compatible chat model whose server
    answered one probe of one token with them (asked once per model object)."""
    declared = getattr(model, "returns_logprobs", None)
    if isinstance(declared, bool):
        return declared
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:  # without langchain-openai there is no such model
        return False
    if not isinstance(model, BaseChatOpenAI):
        return False
    known = _PROBED.get(id(model))
    if known is not None and known[0]() is model:
        return known[1]
    try:
        reply = model.invoke("Reply with: OK", logprobs=True, top_logprobs=1, max_tokens=1)
        found = reply_tokens(reply) is not None
    except Exception:  # a server that refuses the request returns no log-probs either
        found = False
    _PROBED[id(model)] = (weakref.ref(model), found)
    weakref.finalize(model, _PROBED.pop, id(model), None)
    return found
