"""Constrained generation: the form a method's reply must take, and what each kind of model is given
so that it keeps to it.

The small models that run here know more than they can write down in a method's format (issue 41:
Qwen2.5-Coder-1.5B ended 44 of 50 KAG-Thinker runs in ``format_error``). A model runner that
constrains decoding makes a reply of the declared form by construction. A method declares the form of
a step once, as a :class:`ReplyForm`, and passes it to ``RunKernel.ask(..., form=...)``; this module
is the one place that decides what a model gets:

===========================================  ===================================================================
model                                        given
===========================================  ===================================================================
:class:`~.llama_cpp.LlamaCppChatModel`       the form's GBNF grammar, applied by llama.cpp's own grammar
                                             sampler (``grammar=`` per call)
an OpenAI-compatible server that honoured    the same grammar in the request body (``extra_body={"grammar":
a GBNF grammar in one probe                  ...}``: llama.cpp's servers, llama-cpp-python's too)
an OpenAI-compatible server that honoured    ``response_format={"type": "json_schema", ...}`` with the form's
a JSON schema in one probe                   JSON schema (OpenAI, vLLM, SGLang, Ollama); the JSON reply is
                                             rendered back into the method's text format (:attr:`ReplyForm.from_json`)
anything else (transformers, a scripted      nothing: today's parse-and-repair
model, a server that honours neither)
===========================================  ===================================================================

Whatever the model got, the method's parser still reads (and validates) the reply: a grammar is a
context-free constraint and cannot check everything the parser does, and a reply cut by the token
budget is cut whatever the grammar says. ``TCRAGConfig(constrain_replies=False)`` turns it all off.
"""

from __future__ import annotations

import contextvars
import json
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

__all__ = ["ReplyForm", "Constraint", "constraint_for", "gbnf_literal", "json_schema_rules", "served_constraint",
           "GRAMMAR_KEY"]

#: the per-call keyword that carries a GBNF grammar to a model that takes one (LlamaCppChatModel)
GRAMMAR_KEY = "grammar"


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (quotes, backslashes and control characters escaped).

    Example:
        >>> gbnf_literal('say "hi"\\n')
        '"say \\\\"hi\\\\"\\\\n"'
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


#: schema keywords left out before a schema becomes grammar rules (see json_schema_rules)
_UNROLLED_BOUNDS = ("maxLength", "maxItems", "minItems", "maxProperties")


def _without_bounds(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_bounds(v) for k, v in schema.items() if k not in _UNROLLED_BOUNDS}
    if isinstance(schema, list):
        return [_without_bounds(v) for v in schema]
    return schema


def json_schema_rules(schema: Mapping[str, Any], name: str) -> str:
    """GBNF rules for the JSON values that validate against ``schema``, made by llama-cpp-python's own
    converter (``llama_cpp.llama_grammar.json_schema_to_gbnf``): the root rule is named ``name`` and every
    other rule ``name-<rule>``, so several schemas (one per tool) live in one grammar.

    Length and count bounds are left out: the converter unrolls ``maxLength: 2000`` (DOC_RAG's query) into
    2000 nested rules, and whoever reads the value checks them anyway (the tool layer validates a tool's
    input against its schema)."""
    from .llama_cpp_native import import_llama_cpp

    import_llama_cpp()
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    rules = json_schema_to_gbnf(json.dumps(_without_bounds(dict(schema))))
    names = {line.split("::=", 1)[0].strip() for line in rules.splitlines() if "::=" in line}

    def renamed(rule: str) -> str:
        return name if rule == "root" else f"{name}-{rule}"

    out = []
    for line in rules.splitlines():
        if "::=" not in line:
            continue
        head, body = line.split("::=", 1)
        out.append(f"{renamed(head.strip())} ::= {_rename_refs(body, names, renamed)}")
    return "\n".join(out)


def _rename_refs(body: str, names: set, renamed: Callable[[str], str]) -> str:
    """``body`` of a GBNF rule with its references to ``names`` renamed; string literals and character
    classes (where the same letters are text) are copied as they are."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch in "\"[":
            close = "\"" if ch == "\"" else "]"
            j = i + 1
            while j < len(body) and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            out.append(body[i: j + 1])
            i = j + 1
        elif ch.isalnum() or ch == "-":
            j = i
            while j < len(body) and (body[j].isalnum() or body[j] == "-"):
                j += 1
            word = body[i:j]
            out.append(renamed(word) if word in names else word)
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class ReplyForm:
    """The form of one kind of reply, declared once by the method that reads it.

    ``grammar``: GBNF text whose ``root`` rule is the whole reply (llama.cpp's grammar format). It
    should admit every reply the method's parser accepts as a correct one, and as little else as it
    can; the parser still validates. ``schema`` / ``from_json``: for servers that take a JSON schema
    but no grammar, the reply's JSON form and how a reply in that form becomes the text the method's
    parser reads (both or neither). ``name``: what traces and errors call it.
    """

    name: str
    grammar: str
    schema: Optional[Mapping[str, Any]] = field(default=None, compare=False)
    from_json: Optional[Callable[[Any], str]] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if "root" not in self.grammar or "::=" not in self.grammar:
            raise ValueError(f"reply form {self.name!r}: the grammar needs a 'root ::= ...' rule")
        if (self.schema is None) != (self.from_json is None):
            raise ValueError(f"reply form {self.name!r}: a JSON schema needs from_json (and from_json a schema)")


@dataclass(frozen=True)
class Constraint:
    """What one call sends to keep a reply to its form: ``how`` (``grammar``, ``server_grammar`` or
    ``json_schema``), the call's extra keyword arguments, and :meth:`reply_text`, the reply as the
    method's parser reads it."""

    how: str
    kwargs: Mapping[str, Any]
    form: ReplyForm

    def reply_text(self, text: str) -> str:
        """A JSON-schema reply rendered into the method's text format; other replies as they are. A reply
        that is not the JSON asked for (a server that stopped honouring it, a reply cut by the token
        budget) is handed on as it is: the parser refuses it like any other unusable reply."""
        if self.how != "json_schema" or self.form.from_json is None:
            return text
        try:
            return self.form.from_json(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError):
            return text


def constraint_for(model: Any, form: Optional[ReplyForm]) -> Optional[Constraint]:
    """What ``model`` is given to keep a reply to ``form`` (None: nothing; the parser repairs what it can).

    A model declaring ``takes_grammar = True`` (this package's llama.cpp chat model) gets the grammar
    per call; an OpenAI-compatible chat model gets what its server honoured in one probe
    (:func:`served_constraint`); any other model nothing."""
    if form is None:
        return None
    if getattr(model, "takes_grammar", False) is True:
        return Constraint("grammar", {GRAMMAR_KEY: form.grammar}, form)
    served = served_constraint(model)
    if served == "grammar":
        return Constraint("server_grammar", {"extra_body": {GRAMMAR_KEY: form.grammar}}, form)
    if served == "json_schema" and form.schema is not None:
        fmt = {"type": "json_schema", "json_schema": {"name": form.name, "schema": dict(form.schema)}}
        return Constraint("json_schema", {"response_format": fmt}, form)
    return None


# ----- what a served model's server honours, probed once per model object -----
_PROBED: dict[int, tuple[weakref.ref, Optional[str]]] = {}
_PROBING = threading.Lock()

#: the probes: a reply that can only come out of a server honouring the constraint (the prompt asks for
#: something else, so a server that ignores the field answers "OK")
_PROBE_PROMPT = "Reply with the word OK."
_PROBE_GRAMMAR = 'root ::= "7203"'
_PROBE_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                 "additionalProperties": False}


def served_constraint(model: Any) -> Optional[str]:
    """``"grammar"`` when ``model`` is an OpenAI-compatible chat model whose server honours a GBNF
    ``grammar`` in the request body, else ``"json_schema"`` when it honours ``response_format`` with a
    JSON schema, else None. Asked once per model object (at most two calls of a few tokens); a server
    that refuses a probe (HTTP 400 for an unknown field, say) does not take that constraint."""
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:  # without langchain-openai there is no such model
        return None
    if not isinstance(model, BaseChatOpenAI):
        return None
    with _PROBING:  # runs in flight at once (tcrag eval --concurrency) probe a model once, not once each
        known = _PROBED.get(id(model))
        if known is not None and known[0]() is model:
            return known[1]
        found = _probe(model)
        _PROBED[id(model)] = (weakref.ref(model), found)
        weakref.finalize(model, _PROBED.pop, id(model), None)
        return found


def _probe(model: Any) -> Optional[str]:
    # asked in a context of its own: inside the run that first needs it, LangChain's callbacks counted the
    # probe's calls into that run, and with runs in flight which row carried them was a race
    return contextvars.Context().run(_ask_server, model)


def _ask_server(model: Any) -> Optional[str]:
    found: Optional[str] = None
    try:
        reply = model.invoke(_PROBE_PROMPT, max_tokens=8, extra_body={GRAMMAR_KEY: _PROBE_GRAMMAR})
        if str(reply.content).strip() == "7203":
            found = "grammar"
    except Exception:
        pass
    if found is None:
        try:
            fmt = {"type": "json_schema", "json_schema": {"name": "probe", "schema": _PROBE_SCHEMA}}
            reply = model.invoke(_PROBE_PROMPT, max_tokens=16, response_format=fmt)
            value = json.loads(str(reply.content))
            if isinstance(value, dict) and isinstance(value.get("n"), int):
                found = "json_schema"
        except Exception:
            pass
    return found
