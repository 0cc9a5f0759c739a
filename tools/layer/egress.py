"""The egress rule: record text does not leave the machine through an outbound tool.

Once a run's stack holds output of a tool that returns patient records (``ToolOptions(holds_records=
True)``: EMR_SEARCH), a tool that sends its input off the machine (``ToolOptions(sends_off_machine=
True)``: WEB_SEARCH over SearxNG, KG_RAG over a remote SPARQL endpoint) refuses an input that
carries record text, with a :class:`~tcrag_langgraph.tools.base.ToolError` of kind
``"egress_refused"`` (an error frame the model sees). Only the operator's trusted configuration can
allow it: ``ToolOptions(allow_record_egress=True)`` on the outbound tool, set where the tool is
built; nothing in a request or a run's context can.

**What counts as record text**, compared on lower-cased word tokens (runs of letters and digits,
joined by ``.``, ``-``, ``/`` or ``:`` inside a token, e.g. ``p00002``, ``e11.9``, ``2021-03-04``):

* a *distinctive token* of a record: one holding a digit, at least 3 characters long (patient ids,
  ICD-10 codes, dates, lab values, doses); or
* any *4 consecutive words* of a record.

Tokens and 4-word sequences that also occur in the run's ``User_Query`` are not record text: the
user wrote them. The rule looks at every string of the tool's validated arguments.

How a run's records reach the layer: the agent puts :func:`egress_context` into the tool call's
``config["configurable"][RECORDS_KEY]``, rebuilt from the stack for each call (so a popped frame no
longer counts); a value a client sent under that key is replaced.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping, Optional

__all__ = ["RECORDS_KEY", "egress_context", "with_egress_context", "record_text_in", "egress_problem"]

#: Where the agent hands a tool call the record text on the run's stack.
RECORDS_KEY = "tcrag_records_on_stack"
_TOKEN = re.compile(r"[^\W_]+(?:[.\-/:][^\W_]+)*")
_SHINGLE = 4


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _distinctive(tokens: Iterable[str]) -> set[str]:
    return {t for t in tokens if len(t) >= 3 and any(c.isdigit() for c in t)}


def _shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + _SHINGLE]) for i in range(len(tokens) - _SHINGLE + 1)}


def egress_context(stack: Iterable[Any], tools: Mapping[str, Any]) -> dict[str, Any]:
    """``{"records": [...], "public": question}`` for the frames on ``stack``: the observations of
    successful calls of tools whose options say ``holds_records``, and the User_Query text.

    Frames are read by duck typing (``action``, ``content``, ``tool_call.tool/observation/is_error``),
    so any agent with such frames can use it.
    """
    records: list[str] = []
    public: list[str] = []
    for frame in stack:
        action = getattr(getattr(frame, "action", None), "value", getattr(frame, "action", None))
        if action == "User_Query":
            public.append(str(getattr(frame, "content", "") or ""))
        call = getattr(frame, "tool_call", None)
        if call is None or getattr(call, "is_error", False):
            continue
        options = getattr(tools.get(getattr(call, "tool", None)), "options", None)
        if getattr(options, "holds_records", False):
            records.append(str(getattr(call, "observation", "") or ""))
    return {"records": records, "public": "\n".join(public)}


def with_egress_context(config: Optional[Mapping[str, Any]], stack: Iterable[Any],
                        tools: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with :data:`RECORDS_KEY` set from ``stack`` (replacing whatever was there)."""
    config = dict(config or {})
    config["configurable"] = {**(config.get("configurable") or {}), RECORDS_KEY: egress_context(stack, tools)}
    return config


def record_text_in(text: str, context: Any) -> Optional[str]:
    """The first piece of record text ``text`` carries (quoted for a message), else None."""
    if not isinstance(context, Mapping):
        return None
    records = [r for r in (context.get("records") or ()) if isinstance(r, str) and r]
    if not records:
        return None
    public = _tokens(str(context.get("public") or ""))
    public_tokens, public_shingles = set(public), _shingles(public)
    asked = _tokens(text)
    for record in records:
        held = _tokens(record)
        distinctive = _distinctive(held) - public_tokens
        for token in asked:
            if token in distinctive:
                return f'"{token}"'
        shingles = _shingles(held) - public_shingles
        for i in range(len(asked) - _SHINGLE + 1):
            if tuple(asked[i:i + _SHINGLE]) in shingles:
                return '"' + " ".join(asked[i:i + _SHINGLE]) + '"'
    return None


def egress_problem(tool_name: str, args: Any, config: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why the call of outbound tool ``tool_name`` with ``args`` (validated arguments) is refused, else None."""
    context = ((config or {}).get("configurable") or {}).get(RECORDS_KEY)
    if not context:
        return None
    dumped = args.model_dump(mode="json") if hasattr(args, "model_dump") else args
    strings: list[str] = []

    def collect(value: Any) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, Mapping):
            for v in value.values():
                collect(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v)

    collect(dumped if not isinstance(dumped, str) else json.loads(json.dumps(dumped)))
    found = record_text_in("\n".join(strings), context)
    if found is None:
        return None
    return (f"refused: this input repeats patient-record text from this run ({found}), and {tool_name} sends its "
            "input off this machine; the operator has not allowed that. Search with general terms instead "
            "(no identifiers, codes, dates or values from the record).")
