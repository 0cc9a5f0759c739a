"""Sampling consistency: a state value for any chat model, log-probs or not.

The monitor asks the generator itself ``k`` more times for a short answer to the same question,
given the same evidence, at a sampling temperature, and measures how many of those answers agree
with the Conclusion. The state value is ``1 - agreement`` (lower is better, as for the paper's
values), so ``sigma=0.5`` accepts a Conclusion that more than half of the samples repeat. It needs
nothing but chat completions: a served model (OpenAI-compatible, Ollama, vLLM, llama.cpp's server)
keeps a monitor without a second server that returns prompt log-probs.

What it costs: ``k`` short generations per scored Conclusion or Thought (``max_new_tokens`` each;
a local model reuses the shared prompt's cache). What it measures is self-consistency, not truth:
a model that is consistently wrong is consistently validated. Its AUROC on a task is measured by
``tcrag calibrate --metric consistency``, like every other state value's.

Example:
    >>> same_answer("Yes, it is.", "yes", choices=("yes", "no", "maybe"))
    True
    >>> same_answer("Vitamin C", "Scurvy comes from a lack of vitamin C.", choices=())
    True
    >>> same_answer("Vitamin D", "Scurvy comes from a lack of vitamin C.", choices=())
    False
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from langchain_core.messages import HumanMessage, SystemMessage

from ..tools.layer.outcome import content_text

__all__ = ["SamplingConsistencyScorer", "same_answer", "DEFAULT_SAMPLES"]

#: samples per scored text when none is given (issue 37: "k (default 5)")
DEFAULT_SAMPLES = 5

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset("a an the is are was were of to in on for and or it its by with be as at this that "
                       "conclusion answer final".split())


def _choice_of(text: str, choices: Sequence[str]) -> Optional[str]:
    """The first allowed answer ``text`` names as a word (case-insensitive), else None."""
    words = _WORD.findall(text.lower())
    allowed = {c.lower(): c for c in choices}
    for word in words:
        if word in allowed:
            return allowed[word]
    return None


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


def same_answer(sample: str, conclusion: str, *, choices: Sequence[str] = ()) -> bool:
    """Whether a sampled answer says what the Conclusion says: with allowed answers, the same one
    (the first named); otherwise more than half of the shorter one's content words appear in the other
    (so "Vitamin D" does not agree with "a deficiency of vitamin C")."""
    if choices:
        chosen = _choice_of(conclusion, choices)
        return chosen is not None and _choice_of(sample, choices) == chosen
    a, b = _content_words(sample), _content_words(conclusion)
    if not a or not b:
        return False
    return len(a & b) > min(len(a), len(b)) / 2


class SamplingConsistencyScorer:
    """The ``consistency`` state value from ``model``'s own samples (see the module docstring).

    ``k`` samples at ``temperature``, each at most ``max_new_tokens`` tokens. ``score(context, text,
    metric="consistency", choices=...)`` is ``1 - (samples agreeing with text) / k``.
    """

    def __init__(self, model: Any, *, k: int = DEFAULT_SAMPLES, temperature: float = 0.8,
                 max_new_tokens: int = 24) -> None:
        if model is None or not callable(getattr(model, "invoke", None)):
            raise ValueError("SamplingConsistencyScorer needs a chat model to sample from")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a whole number >= 1, not {k!r}")
        if not 0.0 < float(temperature) <= 2.0:
            raise ValueError(f"temperature must be in (0, 2] (samples must differ), not {temperature!r}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a whole number >= 1, not {max_new_tokens!r}")
        self.model, self.k, self.temperature, self.max_new_tokens = model, k, float(temperature), max_new_tokens

    def _settings(self) -> dict[str, Any]:
        """The per-call sampling settings in the model's own words."""
        from ..models.local import takes_generation_settings

        if takes_generation_settings(self.model):  # this package's local models
            return {"temperature": self.temperature, "max_new_tokens": self.max_new_tokens}
        return {"temperature": self.temperature, "max_tokens": self.max_new_tokens}  # OpenAI-style providers

    def samples(self, context: str, *, choices: Sequence[str] = ()) -> list[str]:
        """``k`` short answers of the model to ``context`` (the question, and the evidence when given)."""
        ask = ("Answer with exactly one of: " + ", ".join(choices) + "." if choices
               else "Answer in a few words.")
        messages = [SystemMessage(content=f"You answer questions. {ask} Write only the answer."),
                    HumanMessage(content=context)]
        settings = self._settings()
        return [content_text(self.model.invoke(messages, **settings).content).strip() for _ in range(self.k)]

    def score(self, context: str, text: str, *, metric: str = "consistency", choices: Sequence[str] = (),
              usage: Optional[dict[str, int]] = None) -> float:
        """``1 - agreeing / k``; ``usage`` (a run's counters: ``llm_calls``, ``prompt``, ``completion``),
        when given, is charged the ``k`` calls and their tokens, so a run reports what its monitor cost."""
        if metric != "consistency":
            raise ValueError(f"SamplingConsistencyScorer measures the consistency state value, not {metric!r}")
        answer = re.sub(r"^\s*conclusion\s*:\s*", "", text, flags=re.IGNORECASE)
        samples = self.samples(context, choices=choices)
        if usage is not None:
            from ..tools.tokens import count_tokens

            usage["llm_calls"] = usage.get("llm_calls", 0) + self.k
            usage["prompt"] = usage.get("prompt", 0) + self.k * count_tokens(context)
            usage["completion"] = usage.get("completion", 0) + sum(count_tokens(s) for s in samples)
        agreeing = sum(same_answer(s, answer, choices=choices) for s in samples)
        return 1.0 - agreeing / self.k
