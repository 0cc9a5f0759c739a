"""The egress rule: record text does not leave the machine through an outbound tool.

A tool that returns patient records says so (``ToolOptions(holds_records=True)``: EMR_SEARCH); a
tool that sends its input off the machine says so (``ToolOptions(sends_off_machine=True)``:
WEB_SEARCH over SearxNG, KG_RAG over a SPARQL endpoint, DOC_RAG over Elasticsearch). Once a run has
read a record, an outbound tool refuses with a :class:`~tcrag_langgraph.tools.base.ToolError` of kind
``"egress_refused"`` (an error frame the model sees), by the tool's ``record_egress_check``:

* ``"flow"`` (the default): **every** call for the rest of the run. Information flow, not text
  matching: a Summary, a paraphrase, full-width digits or base64 carry a record as well as a quote,
  and no matcher sees through all of them.
* ``"match"`` (an operator's choice, weaker): only an input that carries record text, compared after
  normalising both (NFKC, zero-width characters dropped, ``E11 65`` read as ``E11.65``), and any
  input holding an encoded string it cannot read (base64 and the like). What counts as record text,
  on lower-cased word tokens (runs of letters and digits joined by ``.``, ``-``, ``/`` or ``:``,
  e.g. ``p00002``, ``e11.9``, ``2021-03-04``): a *distinctive token* of a record (holding a digit, at
  least 3 characters: ids, codes, dates, values; also with its separators removed), or any *4
  consecutive words* of a record. Tokens and 4-word sequences that also occur in the run's
  ``User_Query`` are not record text: the user wrote them. Spelled-out numbers and reordered words
  pass it: that is why it is not the default.

Only the operator's trusted configuration can allow record egress: ``ToolOptions(allow_record_egress=
True)`` on the outbound tool, set where the tool is built; nothing in a request or a run's context can.

How a run's records reach the layer: the run kernel (every method's one door to tools,
``RunKernel.call_tool``) puts :func:`run_egress_context` of everything the run has read into the call's
``config["configurable"][RECORDS_KEY]`` (a popped or summarised frame still counts); a value a client
sent under that key is replaced. A tool called outside an agent of this package has no such key.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any, Iterable, Mapping, Optional

__all__ = ["RECORDS_KEY", "run_egress_context", "record_text_in", "egress_problem"]

#: Where the agent hands a tool call the record text on the run's stack.
RECORDS_KEY = "tcrag_records_on_stack"
_TOKEN = re.compile(r"[^\W_]+(?:[.\-/:][^\W_]+)*")
_SHINGLE = 4
_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"))
#: a long run of base64 / hex / url-safe characters: an encoding the rule cannot read
_ENCODED = re.compile(r"[A-Za-z0-9+/_=-]{24,}")


def _normal(text: str) -> str:
    """``text`` as compared: NFKC (full-width digits are digits), invisible characters dropped, lower case."""
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE).lower()


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(_normal(text))


def _squashed(token: str) -> str:
    return re.sub(r"[.\-/:]", "", token)


def _distinctive(tokens: Iterable[str]) -> set[str]:
    return {t for t in tokens if len(t) >= 3 and any(c.isdigit() for c in t)}


def _shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + _SHINGLE]) for i in range(len(tokens) - _SHINGLE + 1)}


def run_egress_context(records: Iterable[str], question: str) -> dict[str, Any]:
    """The context of a run that has read ``records`` (record-holding observations) for ``question``."""
    held = [r for r in records if isinstance(r, str) and r]
    return {"records": held, "public": question or "", "read": bool(held)}


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
    # a code or value written with other separators ("E11 65", "E11-65") is the record's "e11.65"
    joined = {_squashed(t) for t in asked} | {asked[i] + asked[i + 1] for i in range(len(asked) - 1)}
    for record in records:
        held = _tokens(record)
        distinctive = _distinctive(held) - public_tokens
        for token in asked:
            if token in distinctive:
                return f'"{token}"'
        squashed = {_squashed(t): t for t in distinctive}
        for token in joined:
            if token in squashed:
                return f'"{squashed[token]}"'
        shingles = _shingles(held) - public_shingles
        for i in range(len(asked) - _SHINGLE + 1):
            if tuple(asked[i:i + _SHINGLE]) in shingles:
                return '"' + " ".join(asked[i:i + _SHINGLE]) + '"'
    return None


def egress_problem(tool_name: str, args: Any, config: Optional[Mapping[str, Any]],
                   check: str = "flow") -> Optional[str]:
    """Why the call of outbound tool ``tool_name`` with ``args`` (validated arguments) is refused, else
    None; ``check`` is the tool's ``record_egress_check`` (see the module docstring)."""
    context = ((config or {}).get("configurable") or {}).get(RECORDS_KEY)
    if not isinstance(context, Mapping) or not (context.get("read") or context.get("records")):
        return None
    if check != "match":
        return (f"refused: this run has read patient records, and {tool_name} sends its input off this machine; "
                "the operator has not allowed that. Answer from what the run already holds.")
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
    encoded = next((m.group(0) for text in strings for m in _ENCODED.finditer(_normal(text))
                    if any(c.isdigit() for c in m.group(0)) and any(c.isalpha() for c in m.group(0))), None)
    if encoded is not None:
        return (f"refused: this input holds an encoded string ({encoded[:16]}...) that the record check cannot read, "
                f"and {tool_name} sends its input off this machine. Search with plain general terms.")
    found = record_text_in("\n".join(strings), context)
    if found is None:
        return None
    return (f"refused: this input repeats patient-record text from this run ({found}), and {tool_name} sends its "
            "input off this machine; the operator has not allowed that. Search with general terms instead "
            "(no identifiers, codes, dates or values from the record).")
