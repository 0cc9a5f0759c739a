"""KAG-Thinker's options (:class:`KAGThinkerOptions`); a run's overrides split between them and
:class:`~tcrag_langgraph.TCRAGConfig` in the run kernel's settings."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from ...core.arguments import MethodOptions

_MAX_FORMS_CAP = 16
_MAX_TURNS_CAP = 8


class KAGThinkerOptions(MethodOptions):
    """KAG-Thinker's own bounds and switches (generation and tool limits come from
    :class:`~tcrag_langgraph.TCRAGConfig`: ``max_new_tokens``, ``temperature``,
    ``max_format_retries``, ``max_observation_tokens``, ``tool_timeout_s``, ``max_question_chars``).

    Both are overridable per run: ``context={"max_depth_turns": 1, "temperature": 0.0}``.

    Example:
        >>> KAGThinkerOptions(max_depth_turns=2).min_token_prob
        0.3
    """

    max_logical_forms: int = Field(default=6, ge=1, le=_MAX_FORMS_CAP,
                                   description="Logical forms one decomposition may hold (Output included).")
    max_plan_tokens: Optional[int] = Field(
        default=None, ge=16, le=4096,
        description="New tokens of the decomposition reply, a whole plan of logical forms (None: the shared "
        "max_new_tokens, which a one-action budget such as 150 can cut mid-plan). Per call only for LocalChatModel.")
    max_depth_turns: int = Field(default=3, ge=1, le=_MAX_TURNS_CAP,
                                 description="Retrieve-focus turns per Retrieval sub-question.")
    knowledge_boundary: bool = Field(
        default=True, description="Try the model's own answer first (both tests must pass to skip retrieval); "
        "False retrieves for every Retrieval form and needs no scorer.")
    min_token_prob: float = Field(default=0.3, gt=0.0, le=1.0,
                                  description="tau: the likelihood test passes when the answer's lowest token "
                                  "probability is at least this (not calibrated for any model yet).")
    retrieval_tools: Optional[tuple[str, ...]] = Field(
        default=None, description="Names of the tools a depth turn calls (None: every tool of the graph).")
