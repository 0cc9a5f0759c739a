"""Input repair: turn what a model wrote into a tool's validated arguments, or say clearly why not."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Optional

from pydantic import BaseModel, ValidationError

__all__ = ["InputRepairError", "repair_input", "describe_schema"]


class InputRepairError(ValueError):
    """The input could not be turned into the tool's arguments; the message tells the model why."""


_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)
_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("`", "`"), ("“", "”"), ("‘", "’"))


def _unwrap_text(text: str) -> str:
    """Strip code fences, backticks and matching outer quotes that models put around input."""
    text = text.strip()
    for _ in range(4):  # a few layers at most, e.g. "```'x'```"
        before = text
        match = _FENCE.match(text)
        if match:
            text = match.group(1).strip()
        for left, right in _QUOTE_PAIRS:
            if len(text) >= 2 and text.startswith(left) and text.endswith(right):
                text = text[len(left) : len(text) - len(right)].strip()
                break
        if text == before:
            break
    return text


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(key).lower())


def describe_schema(schema: type[BaseModel]) -> str:
    """``name (type[, optional])`` for each field: what the model is told to write."""
    parts = []
    for name, field in schema.model_fields.items():
        ann = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("typing.", "")
        parts.append(f"{name} ({ann}{'' if field.is_required() else ', optional'})")
    return ", ".join(parts)


def _primary(schema: type[BaseModel], primary_field: Optional[str]) -> Optional[str]:
    if primary_field:
        return primary_field
    fields = list(schema.model_fields)
    required = [n for n, f in schema.model_fields.items() if f.is_required()]
    if len(fields) == 1:
        return fields[0]
    if len(required) == 1:
        return required[0]
    return None


def repair_input(
    raw: Any,
    schema: type[BaseModel],
    *,
    primary_field: Optional[str] = None,
    text_parser: Optional[Callable[[str], Mapping[str, Any]]] = None,
) -> BaseModel:
    """Turn what a model wrote into a validated ``schema`` instance, or raise :class:`InputRepairError`.

    Repairs: plain text -> the primary field (or ``text_parser(text)``); JSON written as a string
    (also inside code fences/quotes) -> parsed; a wrong key name -> the field it matches ignoring
    case/punctuation, or the primary field when that is the only unknown key and the field is unset.

    Example:
        >>> from pydantic import BaseModel
        >>> class Q(BaseModel):
        ...     query: str
        ...     k: int = 5
        >>> repair_input('"heart failure"', Q)
        Q(query='heart failure', k=5)
        >>> repair_input({"Query": "x", "K": "3"}, Q)
        Q(query='x', k=3)
    """
    primary = _primary(schema, primary_field)
    expected = describe_schema(schema)

    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", errors="replace")
    if isinstance(raw, str):
        text = _unwrap_text(raw)
        if not text:
            raise InputRepairError(f"empty input; expected {expected}")
        if text[0] in "{[":
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputRepairError(
                    f"input looks like JSON but does not parse ({exc.msg} at char {exc.pos}); "
                    f"write a JSON object with {expected}, or plain text"
                ) from None
            if isinstance(parsed, dict):
                raw = parsed
            elif isinstance(parsed, list) and len(parsed) == 1 and isinstance(parsed[0], dict):
                raw = parsed[0]  # "[{...}]": one call wrapped in a list
            else:
                raise InputRepairError(f"expected a JSON object with {expected}, got a JSON {type(parsed).__name__}")
        elif text_parser is not None:
            try:
                raw = dict(text_parser(text))
            except InputRepairError:
                raise
            except (ValueError, TypeError) as exc:
                raise InputRepairError(f"could not read the input: {exc}; expected {expected}") from None
        elif primary is not None:
            raw = {primary: text}
        else:
            raise InputRepairError(f"plain text is ambiguous for this tool; write a JSON object with {expected}")

    if not isinstance(raw, Mapping):
        raise InputRepairError(f"expected text or a JSON object with {expected}, got {type(raw).__name__}")

    fields = schema.model_fields
    by_norm = {_norm_key(n): n for n in fields}
    for name, field in fields.items():
        if field.alias:
            by_norm.setdefault(_norm_key(field.alias), name)
    data: dict[str, Any] = {}
    unknown: dict[str, Any] = {}
    for key, value in raw.items():
        target = key if key in fields else by_norm.get(_norm_key(key))
        if target is None or target in data:
            unknown[key] = value
        else:
            data[target] = value
    if unknown:
        if len(unknown) == 1 and primary is not None and primary not in data:
            data[primary] = next(iter(unknown.values()))
        else:
            names = ", ".join(repr(k) for k in unknown)
            raise InputRepairError(f"unknown field(s) {names}; expected {expected}")
    if primary is not None and isinstance(data.get(primary), str):
        data[primary] = _unwrap_text(data[primary])

    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'input'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise InputRepairError(f"invalid input: {problems}; expected {expected}") from None


