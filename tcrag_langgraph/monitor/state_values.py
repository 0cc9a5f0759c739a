"""The state values the monitor can use, and what each one is conditioned on.

=================  ==========================================================================  =======
``metric``         the value of a Conclusion (or Thought)                                      sigma
=================  ==========================================================================  =======
``cppl``           eq. 2 of the paper: conditional perplexity given the User_Query             10
``uct``            eq. 3 of the paper: token entropy (given the User_Query)                    20
``cppl_evidence``  eq. 2 conditioned on the User_Query AND the tool observations on the stack  10
``uct_evidence``   eq. 3 over the text's tokens predicted given the same context               20
``answer_prob``    1 - the normalised probability the model gives the chosen answer among the  0.5
                   allowed ones (yes/no/maybe, option letters), given question and evidence
``consistency``    1 - the share of k answers the model samples again for the question and     0.5
                   evidence that agree with the Conclusion (:mod:`.consistency`; no log-probs)
``gen_*``          read off the log-probs of the reply that wrote the Conclusion (no second     :mod:`.generation`
                   pass): ``gen_answer_prob``, ``gen_cppl``, ``gen_entropy``
=================  ==========================================================================  =======

``cppl`` and ``uct`` are the paper's and stay the defaults. The others go beyond it (issue 23):
eq. 2 conditions only on the User_Query, so for a one-word answer it measures the model's prior
for that word, not whether the evidence on the stack supports it. ``answer_prob`` needs a declared
answer format whose answers are a list of choices; a Thought has no answer to weigh, so under it a
Thought's value is sigma (a Thought never ends a run anyway), as under ``consistency``. Every value
but ``consistency`` comes from the same log-prob source, the generator's own weights
(``token_logprobs`` of the scorer), with the same teacher-forced pass; ``consistency`` needs only
chat completions, so it serves any model, a served one included; the evidence values apply the paper's formulas to the token log-probs given
the whole context (a scorer's own ``score`` may leave the context out of uct, as eq. 3 does).

Example:
    >>> round(choice_value({"yes": -0.1, "no": -2.4, "maybe": -3.0}, "yes"), 4)
    0.1344
    >>> choice_value({"yes": -0.1, "no": -2.4}, "no") > 0.5
    True
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional, Sequence

from .generation import GENERATION_VALUES

__all__ = ["STATE_VALUES", "PAPER_VALUES", "SAMPLED_VALUES", "GENERATION_VALUES", "DEFAULT_SIGMA", "base_metric", "uses_evidence", "choice_value",
           "evidence_context", "measure", "token_logprobs_to_metric", "scorer_score", "LogprobScorer"]

#: every selectable state value
STATE_VALUES = ("cppl", "uct", "cppl_evidence", "uct_evidence", "answer_prob", "consistency", *GENERATION_VALUES)
#: the values that need no log-probs (a scorer that samples the generator measures them)
SAMPLED_VALUES = ("consistency",)
#: the paper's own (eq. 2 and eq. 3)
PAPER_VALUES = ("cppl", "uct")
#: sigma when none is given: the paper's 10 / 20 (section 8.7.6) for its values and their evidence
#: variants; 0.5 for ``answer_prob`` (accept an answer the model prefers over all others together)
#: and for ``consistency`` (accept an answer more than half of the samples repeat)
#: (the generation values' are explained in :mod:`.generation`)
DEFAULT_SIGMA: dict[str, float] = {"cppl": 10.0, "uct": 20.0, "cppl_evidence": 10.0, "uct_evidence": 20.0,
                                   "answer_prob": 0.5, "consistency": 0.5,
                                   "gen_answer_prob": 0.5, "gen_cppl": 1.5, "gen_entropy": 0.7,
                                   "gen_combined": 0.5}


def token_logprobs_to_metric(logprobs: list[float], metric: str) -> float:
    """cppl or uct from the log-probabilities of the scored tokens (the formulas, in one place)."""
    if not logprobs:
        raise ValueError("nothing to score: the text has no tokens")
    if metric == "cppl":
        return math.exp(-sum(logprobs) / len(logprobs))
    if metric == "uct":
        return -sum(math.exp(lp) * lp for lp in logprobs)
    raise ValueError(f"unknown metric {metric!r}; use 'cppl' or 'uct'")

def base_metric(metric: str) -> Optional[str]:
    """The formula a value applies to token log-probs (``cppl``/``uct``); None for ``answer_prob``, the
    sampled values and the generation values, which apply neither to a scorer's log-probs."""
    if metric not in STATE_VALUES:
        raise ValueError(f"unknown state value {metric!r}; choose from {', '.join(STATE_VALUES)}")
    if metric == "answer_prob" or metric in SAMPLED_VALUES or metric in GENERATION_VALUES:
        return None
    return metric.split("_")[0]


class LogprobScorer:
    """Base of the scorers that read cppl and uct off the token log-probs of one pass (the transformers,
    llama.cpp and completions-server scorers): a subclass gives :meth:`token_logprobs`; the rule that
    picks the context (the User_Query for cppl, none for uct unless ``uct_given_query``) lives here."""

    #: condition uct on the User_Query too (the paper does not)
    uct_given_query: bool = False

    def token_logprobs(self, context: str, text: str) -> list[float]:
        """log P of each token of ``text`` given ``context``."""
        raise NotImplementedError

    def score(self, query: str, text: str, *, metric: str) -> float:
        if metric not in ("cppl", "uct"):
            raise ValueError(f"unknown metric {metric!r}; use 'cppl' or 'uct'")
        context = query if (metric == "cppl" or self.uct_given_query) else ""
        return token_logprobs_to_metric(self.token_logprobs(context, text), metric)


def uses_evidence(metric: str) -> bool:
    """Whether the value is conditioned on the tool observations as well as the User_Query."""
    base_metric(metric)
    return metric not in PAPER_VALUES


def evidence_context(question: str, observations: Sequence[str]) -> str:
    """The context an evidence-conditioned value scores against: the User_Query, then what the tools
    returned (in stack order). Without observations it is the User_Query alone."""
    if not observations:
        return question
    return question + "\n\nEvidence:\n" + "\n\n".join(o.strip() for o in observations if o.strip())


def choice_value(logprob_sums: Mapping[str, float], chosen: str) -> float:
    """``1 - P(chosen)`` where P normalises ``exp(sum of token log-probs)`` over the allowed answers."""
    if chosen not in logprob_sums:
        raise ValueError(f"{chosen!r} is not one of the allowed answers {sorted(logprob_sums)}")
    top = max(logprob_sums.values())
    weights = {answer: math.exp(value - top) for answer, value in logprob_sums.items()}
    return 1.0 - weights[chosen] / sum(weights.values())


def scorer_score(scorer: object, query: str, text: str, *, metric: str, **options: object) -> float:
    """A scorer's eq. 2 / eq. 3 value (or a sampled value, with its ``options``): its ``score``
    method, or the scorer itself when it is a plain function ``(query, text, metric=...)``."""
    if hasattr(scorer, "score"):
        return scorer.score(query, text, metric=metric, **options)  # type: ignore[attr-defined]
    return scorer(query, text, metric=metric, **options)  # type: ignore[operator]


def measure(metric: str, question: str, text: str, *, score: Callable[..., float],
            token_logprobs: Callable[[str, str], Sequence[float]], evidence: Sequence[str] = (),
            choices: Optional[Sequence[str]] = None, usage: Optional[dict[str, int]] = None) -> float:
    """The state value ``metric`` of ``text`` (a Conclusion or Thought; for ``answer_prob`` the chosen
    answer) for ``question`` with the tool observations ``evidence``: the one rule the stack machine
    applies at every step and ``tcrag calibrate`` applies to a finished run's answer.

    ``score(query, text, metric=...)`` is the scorer's own eq. 2 / eq. 3; ``token_logprobs(context,
    text)`` its teacher-forced log-probs. ``answer_prob`` needs ``choices`` (the allowed answers).
    ``usage`` (a run's counters) is charged the model calls a sampled value makes.

    Example:
        >>> lp = lambda context, text: [-0.1] if "yes" in text else [-2.3]
        >>> round(measure("answer_prob", "Q?", "yes", score=None, token_logprobs=lp, choices=("yes", "no")), 4)
        0.0998
        >>> round(measure("cppl_evidence", "Q?", "yes", score=None, token_logprobs=lp, evidence=["doc"]), 4)
        1.1052
    """
    base = base_metric(metric)
    if metric in GENERATION_VALUES:
        raise ValueError(f"{metric} is read off the reply that wrote the text (monitor.generation), not measured "
                         "afterwards")
    if not uses_evidence(metric):
        return float(score(question, text, metric=metric))
    context = evidence_context(question, evidence)
    if metric in SAMPLED_VALUES:  # the scorer samples the generator for the question and evidence
        spent = {} if usage is None else {"usage": usage}
        return float(score(context, text, metric=metric, choices=tuple(choices or ()), **spent))
    if base is None:  # answer_prob
        if not choices:
            raise ValueError("answer_prob needs the allowed answers (a declared answer format with choices)")
        return choice_value({c: sum(token_logprobs(context, f"Conclusion: {c}")) for c in choices}, text)
    return token_logprobs_to_metric(list(token_logprobs(context, text)), base)
