"""Parsing of the model's output: triples (:class:`Triple`, strictly read by :func:`parse_triples`,
with the repairs it allows) and the final answer line of the answering model's reply.

Example:
    >>> final_answer("The evidence says so.\\nAnswer: yes")
    'yes'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...core import answer_format

#: Longest triple part, in characters.
MAX_PART_CHARS = 200
_SPACE = re.compile(r"\s+")
_LIST_MARK = re.compile(r"^\s*(?:[-*\u2022]+|\d{1,3}[.)]|triple\s*\d*\s*[:.)])\s*", re.IGNORECASE)
#: The part a reasoning path writes for what is unknown.
UNKNOWN = "?"


class Triple(BaseModel):
    """One (subject, relation, object) fact; parts are single-line text, ``?`` marks an unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: str = Field(min_length=1, max_length=MAX_PART_CHARS)
    relation: str = Field(min_length=1, max_length=MAX_PART_CHARS)
    object: str = Field(min_length=1, max_length=MAX_PART_CHARS)

    @field_validator("subject", "relation", "object", mode="before")
    @classmethod
    def _clean(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"a triple part must be text, not {type(value).__name__}")
        text = _SPACE.sub(" ", value).strip().strip("\"'`*").strip()
        if text != UNKNOWN and not any(ch.isalnum() for ch in text):
            raise ValueError(f"a triple part needs readable text, got {value!r}")
        return text

    @property
    def key(self) -> str:
        """Case-insensitive identity of the fact (the overlay shadows general triples by it)."""
        return "|".join(p.casefold() for p in (self.subject, self.relation, self.object))

    @property
    def text(self) -> str:
        """What is embedded for semantic matching (unknown parts left out)."""
        return " ".join(p for p in (self.subject, self.relation, self.object) if p != UNKNOWN)

    def as_list(self) -> list[str]:
        return [self.subject, self.relation, self.object]


@dataclass(frozen=True)
class TripleParse:
    """What :func:`parse_triples` found: the triples and, per rejected line, why."""

    triples: tuple[Triple, ...]
    problems: tuple[str, ...] = ()


def _parts_of(line: str) -> Optional[list[str]]:
    """The three parts of one line in the ``s | r | o`` form, or a repaired ``(s, r, o)`` form."""
    if "|" in line:
        return [p for p in line.strip().strip("|").split("|")]
    inner = line.strip().rstrip(".;")
    if inner[:1] in "([" and inner[-1:] in ")]":
        pieces = inner[1:-1].split(",")
        return pieces if len(pieces) == 3 else None
    return None


def _from_json(text: str) -> Optional[list[Any]]:
    stripped = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    if not stripped.startswith("["):
        return None
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, list) else None


def parse_triples(text: str, *, max_triples: int, allow_unknown: bool = False) -> TripleParse:
    """Triples written one per line as ``subject | relation | object``.

    Repairs: list markers (``1.``, ``-``) are dropped, a ``(s, r, o)`` line with exactly two commas
    and a JSON list of ``[s, r, o]`` / ``{"subject", "relation", "object"}`` items are read too.
    Anything else is rejected with a reason (never evaluated). Duplicates (case-insensitive) are
    kept once; at most ``max_triples`` are returned. ``?`` is an allowed part only with
    ``allow_unknown`` (a reasoning path's unknown).

    Example:
        >>> p = parse_triples("- a | b | c\\n(x, y, z)\\nbad line\\nA | B | C", max_triples=5)
        >>> [t.as_list() for t in p.triples], p.problems
        ([['a', 'b', 'c'], ['x', 'y', 'z']], ("line 3 'bad line': not 'subject | relation | object'",))
    """
    if not isinstance(text, str):
        raise ValueError(f"model output must be text, not {type(text).__name__}")
    if not isinstance(max_triples, int) or max_triples < 1:
        raise ValueError(f"max_triples must be a positive int, got {max_triples!r}")
    candidates: list[tuple[str, Any]] = []
    items = _from_json(text)
    if items is not None:
        for i, item in enumerate(items, start=1):
            if isinstance(item, Mapping):
                item = [item.get("subject"), item.get("relation"), item.get("object")]
            candidates.append((f"item {i}", item))
    else:
        for n, raw in enumerate(text.splitlines(), start=1):
            line = _LIST_MARK.sub("", raw, count=1).strip()
            if not line or line.rstrip(":").casefold() in {"triples", "reasoning path", "answer"}:
                continue
            # the line's start goes into the problem so the re-prompt and the trace show what was wrong
            candidates.append((f"line {n} {line[:40]!r}", _parts_of(line)))
    triples: list[Triple] = []
    problems: list[str] = []
    seen: set[str] = set()
    for where, parts in candidates:
        if not isinstance(parts, list) or len(parts) != 3:
            problems.append(f"{where}: not 'subject | relation | object'")
            continue
        try:
            triple = Triple(subject=parts[0], relation=parts[1], object=parts[2])
        except ValueError as exc:
            problems.append(f"{where}: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}")
            continue
        if UNKNOWN in (triple.subject, triple.object) and not allow_unknown or triple.relation == UNKNOWN:
            problems.append(f"{where}: '?' is not a fact")
            continue
        if triple.key in seen:
            continue
        if len(triples) == max_triples:
            problems.append(f"{where}: more than {max_triples} triples, the rest were dropped")
            break
        seen.add(triple.key)
        triples.append(triple)
    return TripleParse(tuple(triples), tuple(problems))


def final_answer(text: str) -> str:
    """The text after the last ``Answer:`` line of a reply, or the whole reply when it has none."""
    return answer_format.final_answer(text, keep_label=False)
