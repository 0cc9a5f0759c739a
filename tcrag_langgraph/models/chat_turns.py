"""What a local chat model is shown and what its reply means: chat-template turns, the tools it is
given (``bind_tools``) and the tool calls it writes. Both local backends (transformers and llama.cpp)
render their prompts and read their replies here, so they call tools the same way.

The calls are written in one convention, the one Qwen2.5's and other Hermes-style chat templates
teach their models: a JSON object with the function's name and arguments between ``<tool_call>`` and
``</tool_call>``, and a result shown between ``<tool_response>`` and ``</tool_response>``. The
prompt gets the tools one of two ways:

* the template has a tools section that writes calls in that convention (found by rendering a probe
  conversation, :func:`renders_tool_calls`): the tools, the earlier calls and their results go to the
  template in transformers' chat-template format (``tools=``, ``tool_calls``, role ``tool``), so the
  model sees the tool prompt it was trained on;
* any other template (the packaged SmolLM2's has no tools section): the tools are described in the
  system turn in the same convention (:func:`describe_tools`), earlier calls are written into their
  assistant turns as ``<tool_call>`` blocks and results are user turns inside ``<tool_response>``.

Either way the reply is read one way (:func:`parse_reply`): every ``<tool_call>`` block becomes a
LangChain tool call with an id of its own; a block that is not a JSON object naming a function is an
invalid tool call (LangChain's ``invalid_tool_calls``, which ``create_agent`` answers with an error
message to the model). A reply that is nothing but such an object (or a list of them), bare or in a
code fence, naming a given tool, is a call too: asked with its own template's tools section,
Qwen2.5-Coder-1.5B-Instruct answered "What treats scurvy?" with ```` ```json {"name": "DOC_RAG",
"arguments": {"query": "scurvy"}} ``` ```` instead of a ``<tool_call>`` block. ``tool_choice`` other than auto is kept by starting the reply with the opening
of a call (:func:`reply_prefix`): the model must write a call, the arguments are its own.

Example:
    >>> content, calls, invalid = parse_reply('Let me look.\\n<tool_call>\\n{"name": "DOC_RAG", '
    ...                                       '"arguments": {"query": "scurvy"}}\\n</tool_call>')
    >>> content, calls[0]["name"], calls[0]["args"], invalid
    ('Let me look.', 'DOC_RAG', {'query': 'scurvy'}, [])
"""

from __future__ import annotations

import json
import re
import uuid
from functools import lru_cache
from typing import Any, Optional, Sequence

from langchain_core.messages import AIMessage, BaseMessage, InvalidToolCall, ToolCall, ToolMessage
from langchain_core.messages.tool import invalid_tool_call, tool_call
from langchain_core.utils.function_calling import convert_to_openai_tool

from ..tools.layer.outcome import content_text

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "message_role", "chat_turns", "tool_schemas", "tool_choice_of",
           "reply_prefix", "renders_tool_calls", "template_inputs", "describe_tools", "call_text", "parse_reply"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

#: a call block; a reply that ends inside one (the budget ran out, or the model stopped before the
#: closing tag) still holds the call
_CALL_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)",
                         re.DOTALL)
_NAME_FIELD = re.compile(r'"name"\s*:\s*"([^"]+)"')
#: a whole reply in one code fence (```json ... ```)
_FENCED = re.compile(r"\A```[\w-]*\s*\n(.*?)\n?```\Z", re.DOTALL)


# ----- turns -----
def message_role(message: BaseMessage) -> str:
    """The chat-template role of a LangChain message (a tool or other message is a user turn)."""
    return {"human": "user", "ai": "assistant", "system": "system"}.get(message.type, "user")


def chat_turns(messages: Sequence[BaseMessage], *, native_tools: bool = False) -> list[dict[str, Any]]:
    """The messages as chat-template turns, the one way both local backends render a prompt.

    A message without tool calls is ``{"role", "content"}``. An assistant message's tool calls and a
    tool result are given to a template that renders them itself (``native_tools``) in transformers'
    format, else written as ``<tool_call>`` / ``<tool_response>`` text (the module docstring).
    """
    turns: list[dict[str, Any]] = []
    for message in messages:
        text = content_text(message.content)
        if isinstance(message, ToolMessage):
            if native_tools:
                turns.append({"role": "tool", "content": text, "name": message.name or "",
                              "tool_call_id": message.tool_call_id})
            else:
                turns.append({"role": "user", "content": f"{TOOL_RESPONSE_OPEN}\n{text}\n{TOOL_RESPONSE_CLOSE}"})
            continue
        turn: dict[str, Any] = {"role": message_role(message), "content": text}
        if isinstance(message, AIMessage) and (message.tool_calls or message.invalid_tool_calls):
            # a call the model wrote malformed is shown as it wrote it (the agent's error follows it)
            written = [f"{TOOL_CALL_OPEN}\n{c.get('args') or ''}\n{TOOL_CALL_CLOSE}" for c in message.invalid_tool_calls]
            if native_tools:
                turn["tool_calls"] = [{"type": "function", "id": c.get("id"),
                                       "function": {"name": c["name"], "arguments": c["args"]}}
                                      for c in message.tool_calls]
            else:
                written = [call_text(c["name"], c["args"]) for c in message.tool_calls] + written
            turn["content"] = "\n".join(([text] if text else []) + written)
        turns.append(turn)
    return turns


# ----- tools in the prompt -----
def tool_schemas(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI-style function schemas of LangChain tools, functions, Pydantic models or schema dicts
    (LangChain's own conversion, as every provider's ``bind_tools`` does it)."""
    return [convert_to_openai_tool(t) for t in tools]


def tool_choice_of(tool_choice: Any, schemas: Sequence[dict[str, Any]]) -> Optional[str]:
    """``tool_choice`` of ``bind_tools`` as this module keeps it: None (the model decides: None or
    ``"auto"``), ``"none"`` (no tools shown), ``"any"`` (some call: ``"any"``, ``"required"``, or
    ``True`` with one tool) or a function's name (also as ``{"type": "function", "function": {"name": ...}}``).
    Anything else, or a name that is not a given tool, is a ValueError.

    >>> tool_choice_of("required", [{"function": {"name": "f"}}])
    'any'
    """
    names = [s["function"]["name"] for s in schemas]
    if tool_choice is None or tool_choice == "auto":
        return None
    if tool_choice in ("none", "any"):
        return tool_choice
    if tool_choice == "required":
        return "any"
    if tool_choice is True:
        if len(names) != 1:
            raise ValueError(f"tool_choice=True needs exactly one tool, not {len(names)}")
        return names[0]
    if isinstance(tool_choice, dict):
        tool_choice = (tool_choice.get("function") or {}).get("name", tool_choice.get("name"))
    if isinstance(tool_choice, str) and tool_choice in names:
        return tool_choice
    raise ValueError(f"tool_choice must be None, 'auto', 'none', 'any', 'required' or one of the tools "
                     f"({', '.join(names) or 'none given'}), not {tool_choice!r}")


def reply_prefix(choice: Optional[str]) -> str:
    """The text a reply is started with so that it keeps ``choice`` (of :func:`tool_choice_of`)."""
    if choice in (None, "none"):
        return ""
    if choice == "any":
        return f'{TOOL_CALL_OPEN}\n{{"name": "'
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(choice)}, "arguments": '


def describe_tools(schemas: Sequence[dict[str, Any]]) -> str:
    """The tools section for a template without one: the schemas and how to call them."""
    listing = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return ("# Tools\n\nYou can call the functions whose JSON schemas are listed between <tools> and </tools>:\n"
            f"<tools>\n{listing}\n</tools>\n\nTo call one, write a JSON object with its name and arguments "
            f'between {TOOL_CALL_OPEN} and {TOOL_CALL_CLOSE}:\n{TOOL_CALL_OPEN}\n{{"name": "<function name>", '
            f'"arguments": {{<arguments>}}}}\n{TOOL_CALL_CLOSE}\nIts result comes back between '
            f"{TOOL_RESPONSE_OPEN} and {TOOL_RESPONSE_CLOSE}. When you need no call, answer directly.")


_PROBE_NAME, _PROBE_ARG, _PROBE_RESULT = "probe_fn_q7x", "probe_arg_q7x", "probe_result_q7x"


@lru_cache(maxsize=16)
def renders_tool_calls(template: str) -> bool:
    """Whether a chat template shows tools and writes calls and results in the ``<tool_call>``
    convention itself: a probe conversation rendered with it must show the tool's schema, the call
    inside a ``<tool_call>`` block and the result (a template that fails on it does not)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    schema = {"type": "function", "function": {"name": _PROBE_NAME, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}
    turns = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": _PROBE_NAME, "arguments": {"a": _PROBE_ARG}}}]},
             {"role": "tool", "name": _PROBE_NAME, "content": _PROBE_RESULT}]
    try:
        rendered, _ = render_jinja_template(conversations=[turns], tools=[schema], chat_template=template,
                                            add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that cannot render tool turns does not have them
        return False
    text = rendered[0]
    calls = [body for body in _CALL_BLOCK.findall(text) if _PROBE_ARG in body]
    return text.count(_PROBE_NAME) >= 2 and bool(calls) and _PROBE_RESULT in text


def template_inputs(messages: Sequence[BaseMessage], tools: Optional[Sequence[dict[str, Any]]],
                    template: str) -> tuple[list[dict[str, Any]], Optional[list[dict[str, Any]]]]:
    """``(turns, tools)`` to render ``template`` with: the tools go to a template that renders them
    (:func:`renders_tool_calls`), else into the system turn (:func:`describe_tools`; the first turn
    when the messages have no system message)."""
    native = bool(tools) and renders_tool_calls(template)
    turns = chat_turns(messages, native_tools=native)
    if not tools or native:
        return turns, (list(tools) if tools else None)
    section = describe_tools(tools)
    if turns and turns[0]["role"] == "system":
        turns[0] = {**turns[0], "content": f"{turns[0]['content']}\n\n{section}" if turns[0]["content"] else section}
    else:
        turns.insert(0, {"role": "system", "content": section})
    return turns, None


# ----- the reply -----
def call_text(name: str, args: Any) -> str:
    """One call as the model writes it."""
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def parse_reply(text: str, tool_names: Sequence[str] = ()) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    r"""``(content, tool_calls, invalid_tool_calls)`` of a reply: the text outside the ``<tool_call>``
    blocks, stripped, and each block as a LangChain tool call with a new id (a block that is not a JSON
    object with a string ``name`` and object ``arguments`` is an invalid tool call). Without blocks, a
    reply that is only such an object or a list of them (bare or fenced) whose names are all among
    ``tool_names`` is read as those calls (content ``""``); any other reply is content only.

    >>> parse_reply('<tool_call>{"name": "f", "arguments": {"x": 1}}')[1][0]["args"]  # the model stopped there
    {'x': 1}
    >>> parse_reply('<tool_call>{"name": "f", "arguments": oops}</tool_call>')[2][0]["error"]
    'not a JSON object: Expecting value'
    >>> parse_reply('```json\n{"name": "f", "arguments": {"x": 1}}\n```', ["f"])[1][0]["args"]
    {'x': 1}
    >>> parse_reply('{"name": "g", "arguments": {}}', ["f"])[:2]  # not a given tool: an answer
    ('{"name": "g", "arguments": {}}', [])
    """
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    if TOOL_CALL_OPEN not in text and tool_names:
        bare = _bare_calls(text, tool_names)
        if bare:
            return "", bare, []
    for body in _CALL_BLOCK.findall(text):
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError as exc:
            named = _NAME_FIELD.search(body)
            invalid.append(invalid_tool_call(name=named.group(1) if named else None, args=body, id=call_id,
                                             error=f"not a JSON object: {exc.msg}"))
            continue
        args = parsed.get("arguments", {}) if isinstance(parsed, dict) else None
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or not isinstance(args, dict):
            name = parsed.get("name") if isinstance(parsed, dict) and isinstance(parsed.get("name"), str) else None
            invalid.append(invalid_tool_call(name=name, args=body, id=call_id,
                                             error='a call must be {"name": "<function>", "arguments": {...}}'))
            continue
        calls.append(tool_call(name=parsed["name"], args=args, id=call_id))
    content = _CALL_BLOCK.sub("", text).strip()
    return content, calls, invalid


def _bare_calls(text: str, tool_names: Sequence[str]) -> list[ToolCall]:
    """The calls of a reply that is only a call object or a list of them (bare or in one code fence),
    each naming one of ``tool_names`` with object arguments; [] for any other reply."""
    stripped = text.strip()
    fenced = _FENCED.match(stripped)
    try:
        parsed = json.loads(fenced.group(1) if fenced else stripped)
    except json.JSONDecodeError:
        return []
    items = parsed if isinstance(parsed, list) else [parsed]
    if not items or not all(isinstance(i, dict) and i.get("name") in tool_names
                            and isinstance(i.get("arguments", {}), dict) for i in items):
        return []
    return [tool_call(name=i["name"], args=i.get("arguments", {}), id=f"call_{uuid.uuid4().hex[:24]}") for i in items]
