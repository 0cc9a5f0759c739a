"""The form of TC-RAG's reply (:class:`~tcrag_langgraph.models.constrained.ReplyForm`): exactly one
action line, as the system prompt and the demonstrations show it.

* ``Thought:``, ``Plan:``, ``Summary:`` then the text on the same line; ``Backtrack:`` with an optional
  reason; only the actions this step offers (the ablations', the final turn's Conclusion alone);
* ``Tool_Use: <tool>`` naming one of the run's tools exactly, then ``Tool_Input:`` on the next line: a
  line of plain text, or a JSON object that validates against the tool's schema for writing its input
  where it gives one (EMR_SEARCH), else its argument schema (rules by llama-cpp-python's converter,
  :func:`~tcrag_langgraph.models.constrained.json_schema_rules`);
* ``Conclusion:`` then its text; with an answer format of choices (yes/no/maybe, option letters) the
  Conclusion is one of them (as written or capitalised), with a pydantic answer format a JSON object of
  its schema.

One action per reply and one line per content: the reply ends after it, so a model cannot go on to write
a second action or an observation of its own. :func:`~.actions.parse_action` still reads the reply (and
the answer format still checks a Conclusion): what the grammar cannot know, e.g. a Conclusion the state
monitor rejected before, is the graph's to judge as ever.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Optional, Sequence

from langchain_core.tools import BaseTool
from pydantic import BaseModel

from ...models.constrained import ReplyForm, gbnf_literal, json_schema_rules
from ...tools.base import WRITTEN_INPUT_SCHEMA

__all__ = ["action_form"]

_LINE = "[^\\n]+"


def _rule_name(name: str) -> str:
    return "x" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _tool_schema(tool: BaseTool) -> Optional[dict]:
    """The JSON schema the tool's input is written to: the one for writing it, where the tool gives one
    (``metadata[WRITTEN_INPUT_SCHEMA]``: EMR_SEARCH's arguments require nothing, its validator codes or a
    condition), else its arguments' schema (None when it has none to give)."""
    written = (getattr(tool, "metadata", None) or {}).get(WRITTEN_INPUT_SCHEMA)
    if isinstance(written, dict):
        return written
    schema = getattr(tool, "args_schema", None)
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    return None


def action_form(allowed: Sequence[str], tools: Sequence[BaseTool], answer_format: Any = None) -> ReplyForm:
    """The form of one reply offering the ``allowed`` actions with ``tools`` (Tool_Use only with tools),
    its Conclusion in ``answer_format`` (a tuple of choices, a pydantic model class, or None)."""
    schemas = tuple((t.name, json.dumps(_tool_schema(t), sort_keys=True) if _tool_schema(t) else None) for t in tools)
    if isinstance(answer_format, type) and issubclass(answer_format, BaseModel):
        answer: Any = json.dumps(answer_format.model_json_schema(), sort_keys=True)
    else:
        answer = tuple(answer_format) if answer_format else None
    return _action_form(tuple(allowed), schemas, answer)


@functools.lru_cache(maxsize=64)
def _action_form(allowed: tuple[str, ...], tools: tuple[tuple[str, Optional[str]], ...], answer: Any) -> ReplyForm:
    rules: list[str] = [f"line ::= {_LINE}"]
    options: list[str] = []
    for action in allowed:
        if action in ("Thought", "Plan", "Summary"):
            options.append(f"{gbnf_literal(action + ': ')} line")
        elif action == "Backtrack":
            options.append('"Backtrack:" ( " " line )?')
        elif action == "Conclusion":
            options.append('"Conclusion: " answer')
            rules.append(_answer_rule(answer))
        elif action == "Tool_Use" and tools:
            calls = []
            for name, schema in tools:
                rule = "input-" + _rule_name(name)
                plain = '[^\\n{ ] [^\\n]*'  # a line of text; one starting with "{" is the tool's JSON
                json_rules = _schema_rules(schema, rule + "-json")
                rules.extend([json_rules, f"{rule} ::= {plain} | {rule}-json"] if json_rules else [f"{rule} ::= {plain}"])
                calls.append(f'{gbnf_literal(name)} "\\nTool_Input: " {rule}')
            options.append('"Tool_Use: " ( ' + " | ".join(calls) + " )")
    if not options:
        raise ValueError(f"no action of {list(allowed)} can be written in this run")
    rules.insert(0, "root ::= " + " | ".join(f"( {o} )" for o in options))
    schema = _json_form(allowed, [name for name, _ in tools])
    return ReplyForm("tcrag_action", "\n".join(rules) + "\n", schema=schema, from_json=_action_text)


def _schema_rules(schema: Optional[str], name: str) -> Optional[str]:
    """Rules for JSON of ``schema``; None without a schema or for one the converter cannot turn into rules
    (a tool's input is then a line of text only: the tool layer parses and validates it, as before)."""
    if schema is None:
        return None
    try:
        return json_schema_rules(json.loads(schema), name)
    except Exception:  # noqa: BLE001 - the converter's failures are not typed; the form stays usable without
        return None


def _answer_rule(answer: Any) -> str:
    if isinstance(answer, tuple):  # choices, as written or capitalised, then at most a full stop
        spelled = sorted({s for c in answer for s in (c, c[:1].upper() + c[1:])})
        return "answer ::= ( " + " | ".join(gbnf_literal(s) for s in spelled) + ' ) "."?'
    rules = _schema_rules(answer, "answer") if isinstance(answer, str) else None  # a pydantic format's schema
    return rules or f"answer ::= {_LINE}"


def _json_form(allowed: Sequence[str], tools: Sequence[str]) -> dict:
    """The reply's JSON form for servers that take a schema but no grammar: the action, its text, and for
    Tool_Use the tool and its input."""
    properties: dict[str, Any] = {"action": {"type": "string", "enum": list(allowed)}, "content": {"type": "string"}}
    if tools and "Tool_Use" in allowed:
        properties.update(tool={"type": "string", "enum": list(tools)}, tool_input={"type": "string"})
    return {"type": "object", "additionalProperties": False, "required": list(properties), "properties": properties}


def _action_text(value: Any) -> str:
    """A reply in its JSON form as the action line the parser reads."""
    if value["action"] == "Tool_Use":
        return f"Tool_Use: {value['tool']}\nTool_Input: {value['tool_input']}"
    return f"{value['action']}: {value['content']}".rstrip()
