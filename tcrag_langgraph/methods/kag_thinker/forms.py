"""The typed logical forms (:class:`LogicalForm`, its :class:`ContentItem` inputs, the parsed
:class:`LogicalPlan`) and :class:`LogicalFormParseError`; the parser that builds them is in
:mod:`.parsing`."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Function = Literal["Retrieval", "Math", "Deduce", "Output"]
DEDUCE_OPS = ("extract", "judgement", "entailment", "choice", "multiChoice")


class LogicalFormParseError(ValueError):
    """Model text holds no usable logical form(s). ``str(err)`` is written for the model."""


class ContentItem(BaseModel):
    """One input of a logical function: the answer of an earlier step, or literal text."""

    model_config = ConfigDict(extra="forbid")

    step: Optional[int] = Field(default=None, ge=1)
    text: Optional[str] = None


class LogicalForm(BaseModel):
    """One atomic sub-problem: its Step (natural language) and Action (logical function).

    ``references`` are the earlier steps whose answers it uses; ``bindings`` maps each ``#n`` and
    variable it mentions to what it stands for (substituted when the form is solved)."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=1)
    step: str = Field(min_length=1)
    function: Function
    action: str
    op: Optional[str] = None
    content: list[ContentItem] = Field(default_factory=list)
    target: Optional[str] = None
    references: list[int] = Field(default_factory=list)
    bindings: dict[str, ContentItem] = Field(default_factory=dict)
    defines: dict[str, ContentItem] = Field(default_factory=dict)


class LogicalPlan(BaseModel):
    """A parsed decomposition and the format repairs made to read it."""

    forms: list[LogicalForm]
    repairs: list[str] = Field(default_factory=list)
