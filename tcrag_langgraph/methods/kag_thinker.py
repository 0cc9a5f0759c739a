"""KAG-Thinker (kag-thinker.md, section 3 and appendix A) as a LangGraph graph on TC-RAG's parts.

The question is decomposed once, breadth-wise, into *logical forms*: each a natural-language
sub-question (``Step``) and a logical function (``Action``: ``Retrieval``, ``Math``, ``Deduce`` or
``Output``) that may use earlier answers through ``#n`` (or the variables an earlier action bound,
such as ``o1``). The forms are then solved in order:

* ``Retrieval``: *knowledge-boundary determination* (section 3.2, "generate first, then assess"):
  the model answers from its own knowledge, then the answer is kept only when BOTH the model's
  stated confidence (a True/False self-check) and the likelihood test (the lowest token
  probability of the answer, from the scorer's ``token_logprobs``, at least ``min_token_prob``)
  pass. Otherwise *depth solving* (section 3.1.2, 3.3): retrieve with the tools (through
  :func:`~tcrag_langgraph.tools.layer.invoke_tool`), focus on what answers the sub-question, then
  answer or issue the next Retrieval logical form, for at most ``max_depth_turns`` turns.
* ``Math``: an arithmetic expression (the form's target, or one the model writes) evaluated by
  :func:`evaluate_arithmetic`, an AST walker over a whitelist of node types (never ``eval``).
* ``Deduce``: the model reasons over the referenced answers (op extract / judgement / entailment /
  choice / multiChoice).
* ``Output``: the referenced answers are the final answer.

Model text is parsed strictly into typed pydantic models (:func:`parse_logical_forms`), with
format repairs recorded and a re-prompt naming the problem, at most ``max_format_retries`` times.

Example:
    >>> from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply
    >>> replies = ["Step1: What is 6 times 7?\\nAction1: Math(content=[], target='6*7')->m1\\n"
    ...            "Step2: Output #1.\\nAction2: Output(#1)"]
    >>> model = ScriptedChatModel(replies=[ScriptedReply(reply=r) for r in replies], mode="sequence")
    >>> graph = build_kag_thinker_graph(model=model, tools=[], options={"knowledge_boundary": False})
    >>> out = graph.invoke({"question": "What is 6 times 7?"})
    >>> out["answer"], out["halt_reason"], out["llm_calls"]
    ('42', 'answered', 1)
"""

from __future__ import annotations

import ast
import difflib
import html
import json
import math
import operator
import re
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Annotated, TypedDict

from .. import answer_format
from ..auth import caller_for_run
from ..config import CALLER_KEY, TCRAGConfig, resolve_config
from ..events import emit
from ..run_input import child_config, extract_question, last_human_is
from ..prompting import message_text
from ..result import RunResult
from ..scoring import MonitorUnavailableError, scorer_for_model
from ..state import TraceEvent
from ..tools.layer import invoke_tool, is_tool_error
from ..tools.tokens import count_tokens

__all__ = [
    "KAGThinkerOptions",
    "KAGThinkerState",
    "LogicalForm",
    "ContentItem",
    "LogicalPlan",
    "LogicalFormParseError",
    "ArithmeticRefused",
    "FocusResult",
    "parse_logical_forms",
    "parse_focus",
    "parse_boundary_answer",
    "parse_confidence",
    "evaluate_arithmetic",
    "build_kag_thinker_graph",
    "NODE_NAMES",
]

NODE_NAMES = ("Start", "Decompose", "Retrieval", "Depth_Solve", "Math", "Deduce", "Output")
Function = Literal["Retrieval", "Math", "Deduce", "Output"]
DEDUCE_OPS = ("extract", "judgement", "entailment", "choice", "multiChoice")
_MAX_FORMS_CAP = 16
_MAX_TURNS_CAP = 8


# =============================================================================================
# Options
# =============================================================================================


class KAGThinkerOptions(BaseModel):
    """KAG-Thinker's own bounds and switches (generation and tool limits come from
    :class:`~tcrag_langgraph.TCRAGConfig`: ``max_new_tokens``, ``temperature``,
    ``max_format_retries``, ``max_observation_tokens``, ``tool_timeout_s``, ``max_question_chars``).

    Both are overridable per run: ``context={"max_depth_turns": 1, "temperature": 0.0}``.

    Example:
        >>> KAGThinkerOptions(max_depth_turns=2).min_token_prob
        0.3
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_logical_forms: int = Field(default=6, ge=1, le=_MAX_FORMS_CAP,
                                   description="Logical forms one decomposition may hold (Output included).")
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

    def merged(self, values: Mapping[str, Any]) -> "KAGThinkerOptions":
        """A copy with ``values`` (fields of this model only) applied."""
        return self if not values else type(self).model_validate({**self.model_dump(), **values})


def _split_overrides(layer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(TCRAGConfig fields, KAGThinkerOptions fields)`` set by one override layer."""
    if layer is None:
        return {}, {}
    if isinstance(layer, KAGThinkerOptions):
        return {}, {k: getattr(layer, k) for k in layer.model_fields_set}
    if isinstance(layer, TCRAGConfig):
        return {k: getattr(layer, k) for k in layer.model_fields_set}, {}
    if not isinstance(layer, Mapping):
        raise ValueError(f"context must be a mapping, TCRAGConfig or KAGThinkerOptions, not {type(layer).__name__}")
    values = dict(layer)
    ours = {k: v for k, v in values.items() if k in KAGThinkerOptions.model_fields}
    base = {k: v for k, v in values.items() if k in TCRAGConfig.model_fields}
    return base, ours


# =============================================================================================
# Logical forms: typed models and the strict parser
# =============================================================================================


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


_FUNCTION_WORDS: dict[str, Function] = {
    "retrieval": "Retrieval", "retrieve": "Retrieval", "search": "Retrieval", "lookup": "Retrieval",
    "math": "Math", "calculate": "Math", "compute": "Math", "calculation": "Math",
    "deduce": "Deduce", "deduction": "Deduce", "reason": "Deduce", "infer": "Deduce",
    "output": "Output", "return": "Output",
}
_LABEL = re.compile(
    r"^[ \t>#*\-•]*\**[ \t]*(?P<kind>step|action)[ \t]*(?P<num>\d+)?[ \t]*\**[ \t]*(?::|\.(?=\s)|\)|-(?=\s))[ \t]*(?P<body>.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_CALL = re.compile(r"^(?P<fn>[A-Za-z_][A-Za-z_ ]*?)\s*\((?P<args>.*)\)\s*(?:->\s*(?P<alias>[A-Za-z_]\w*))?$", re.DOTALL)
_HASH_REF = re.compile(r"#(\d+)")
_VARIABLE = re.compile(r"^[A-Za-z]{1,12}_?\d+$")  # how the paper names variables: o1, s2, math_3


def _normalise(text: Any) -> str:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = html.unescape(text)
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", " ", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("：", ":").replace("（", "(").replace("）", ")")
    text = text.replace("\\n", "\n")  # a model copying the paper's template writes literal \n
    return re.sub(r"```[a-zA-Z]*\n?", "\n", text)


def _strip_think(text: str, repairs: list[str]) -> str:
    """The part after ``<think>...</think>`` and inside ``<answer>...</answer>`` (either optional)."""
    text = re.sub(r"<think>.*?</think>", " ", text, flags=re.DOTALL | re.IGNORECASE)
    found = re.search(r"<answer>(.*?)(?:</answer>|$)", text, flags=re.DOTALL | re.IGNORECASE)
    if found:
        if not re.search(r"</answer>", text, flags=re.IGNORECASE):
            repairs.append("unclosed <answer> read to the end")
        return found.group(1)
    return text


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes."""
    parts, depth, quote, current = [], 0, "", []
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    tail = "".join(current).strip()
    if tail:
        parts.append(tail)
    return [p for p in parts if p]


def _unquote(value: str) -> str:
    value = value.strip()
    while len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"`":
        value = value[1:-1].strip()
    return value


def _resolve_function(name: str, repairs: list[str]) -> Function:
    key = re.sub(r"[^a-z]", "", name.lower())
    if key in _FUNCTION_WORDS:
        resolved = _FUNCTION_WORDS[key]
        if name != resolved:
            repairs.append(f"function {name!r} read as {resolved}")
        return resolved
    close = difflib.get_close_matches(key, list(_FUNCTION_WORDS), n=1, cutoff=0.75)
    if close:
        resolved = _FUNCTION_WORDS[close[0]]
        repairs.append(f"function {name!r} matched to {resolved}")
        return resolved
    raise LogicalFormParseError(
        f"unknown logical function {name!r}: use one of Retrieval, Math, Deduce, Output")


class _FormReader:
    """Reads the Action of form ``index`` against the variables earlier forms defined."""

    def __init__(self, index: int, known: Mapping[str, ContentItem], repairs: list[str]) -> None:
        self.index = index
        self.known = dict(known)
        self.repairs = repairs
        self.bindings: dict[str, ContentItem] = {}
        self.defines: dict[str, ContentItem] = {}

    def hash_refs(self, text: str) -> None:
        for m in _HASH_REF.finditer(text):
            k = int(m.group(1))
            if not 1 <= k < self.index:
                allowed = f"use #1..#{self.index - 1}" if self.index > 1 else "Step1 can refer to nothing"
                raise LogicalFormParseError(f"Step{self.index} refers to #{k}, which is not an earlier step ({allowed})")
            self.bindings[f"#{k}"] = ContentItem(step=k)

    def item(self, raw: str) -> ContentItem:
        """A content / argument value: a reference (``#n`` or a known variable) or literal text."""
        value = _unquote(raw)
        if re.fullmatch(r"#\d+", value):
            self.hash_refs(value)
            return self.bindings[value]
        if value in self.known:
            self.bindings[value] = self.known[value]
            return self.known[value]
        if _VARIABLE.match(value):
            raise LogicalFormParseError(
                f"Action{self.index} uses the variable {value!r}, which no earlier action defined "
                f"(defined so far: {', '.join(sorted(self.known)) or 'none'}); refer to earlier answers as #n")
        self.hash_refs(value)
        return ContentItem(text=value)

    def mentions(self, text: str) -> None:
        """Record ``#n`` and known variables named inside free text (a target, a step)."""
        self.hash_refs(text)
        for name in self.known:
            if re.search(rf"(?<![\w#]){re.escape(name)}(?!\w)", text):
                self.bindings[name] = self.known[name]


def _read_action(body: str, step: str, reader: _FormReader) -> LogicalForm:
    body = body.strip().strip("`*").strip().rstrip(".;")
    call = _CALL.match(body)
    if not call:
        raise LogicalFormParseError(
            f"Action{reader.index} must be a call such as Retrieval(s=..., p=..., o=...), "
            f"Math(content=[...], target='...'), Deduce(op=..., content=[...], target='...') or Output(#n); "
            f"got {body[:120]!r}")
    function = _resolve_function(call.group("fn").strip(), reader.repairs)
    args = _split_top_level(call.group("args"))
    alias = call.group("alias")
    reader.mentions(step)
    op: Optional[str] = None
    content: list[ContentItem] = []
    target: Optional[str] = None
    keys = [a.partition("=")[0].strip().lower() for a in args if "=" in a]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise LogicalFormParseError(f"Action{reader.index} sets {', '.join(repeated)} more than once: one value each")
    if function == "Retrieval":
        for arg in args:
            key, eq, value = arg.partition("=")
            if not eq:
                reader.item(arg)  # a positional value: check its references
                continue
            key, value = key.strip(), value.strip()
            definition = re.match(r"^(?P<name>[A-Za-z_]\w*)\s*:\s*(?P<type>[^\[]*)(?:\[(?P<label>.*)\])?$", value)
            if definition and key in ("s", "p", "o"):
                label = _unquote(definition.group("label") or "")
                # The object is what the step finds; a named subject or an edge stands for its name.
                meaning = ContentItem(text=label or definition.group("type").strip()) if key != "o" and (
                    label or key == "p") else ContentItem(step=reader.index)
                reader.defines[definition.group("name")] = meaning
                reader.hash_refs(value)
            else:
                reader.item(value)
    elif function in ("Math", "Deduce"):
        for arg in args:
            key, eq, value = arg.partition("=")
            key = key.strip().lower()
            if not eq:
                raise LogicalFormParseError(
                    f"Action{reader.index}: {function} takes keyword arguments (content=[...], target='...'), "
                    f"got {arg[:80]!r}")
            if key == "content":
                inner = value.strip()
                if inner.startswith("[") and inner.endswith("]"):
                    inner = inner[1:-1]
                content = [reader.item(v) for v in _split_top_level(inner)]
            elif key == "target":
                target = _unquote(value)
                reader.mentions(target)
            elif key == "op" and function == "Deduce":
                op = _unquote(value)
            else:
                raise LogicalFormParseError(
                    f"Action{reader.index}: {function} has no argument {key!r} "
                    f"(it takes {'op, ' if function == 'Deduce' else ''}content and target)")
        if function == "Deduce":
            if op is None:
                op = "extract"
                reader.repairs.append(f"Action{reader.index}: Deduce without op read as op=extract")
            canonical = {o.lower(): o for o in DEDUCE_OPS}.get(op.lower().replace("-", "").replace("_", ""))
            if canonical is None:
                raise LogicalFormParseError(
                    f"Action{reader.index}: Deduce op {op!r} is not one of {', '.join(DEDUCE_OPS)}")
            op = canonical
        if not target:
            target = step
            reader.repairs.append(f"Action{reader.index}: {function} without target aims at its Step")
        if alias:
            reader.defines[alias] = ContentItem(step=reader.index)
    else:  # Output
        if not args:
            raise LogicalFormParseError(f"Action{reader.index}: Output needs the answers to output, e.g. Output(#1)")
        for arg in args:
            if _unquote(arg) == f"#{reader.index}" and reader.index > 1:
                # A final step outputting "itself" (Step2: list them / Output(#2)) means the answer before it.
                arg = f"#{reader.index - 1}"
                reader.repairs.append(f"Action{reader.index}: Output(#{reader.index}) read as Output({arg})")
            item = reader.item(arg)
            if item.step is None:
                raise LogicalFormParseError(
                    f"Action{reader.index}: Output takes references to earlier answers (#n or a variable), "
                    f"got {arg[:80]!r}")
            content.append(item)
    if function == "Retrieval" and alias:
        reader.defines[alias] = ContentItem(step=reader.index)
    references = sorted({b.step for b in reader.bindings.values() if b.step is not None})
    return LogicalForm(index=reader.index, step=step, function=function, action=body, op=op, content=content,
                       target=target, references=references, bindings=reader.bindings, defines=reader.defines)


def _labelled_blocks(text: str) -> list[tuple[str, Optional[int], str]]:
    """``(kind, number, body)`` for every Step/Action label, the body running to the next label."""
    hits = list(_LABEL.finditer(text))
    blocks = []
    for i, m in enumerate(hits):
        end = hits[i + 1].start() if i + 1 < len(hits) else len(text)
        body = (m.group("body") + text[m.end():end]).strip().strip("*").strip()
        blocks.append((m.group("kind").lower(), int(m.group("num")) if m.group("num") else None, body))
    return blocks


def parse_logical_forms(text: Any, *, max_forms: int = 6) -> LogicalPlan:
    """Read a breadth decomposition (``Step1: ... / Action1: ...`` pairs) into typed logical forms.

    Repairs (recorded in :attr:`LogicalPlan.repairs`): ``<think>``/``<answer>`` wrappers, markdown,
    full-width colons, HTML entities, missing step numbers, function-name variants and typos, a
    missing Deduce op or target, a missing final ``Output`` (``Output(#last)`` is added), an Output
    step naming itself (``StepN ... Output(#N)`` is read as ``Output(#N-1)``). Anything
    else unusable raises :class:`LogicalFormParseError` whose message is for the model: no steps, a
    Step without an Action, numbering out of order, an unknown function, a reference to an unknown
    variable or to a step that is not earlier (``#n`` with ``n`` >= its own number), an Output that
    is not last, more than ``max_forms`` forms.

    Example:
        >>> plan = parse_logical_forms("Step1: Who wrote The Pequod?\\nAction1: Retrieval(s=s1:book['The Pequod'], "
        ...                            "p=p1:author, o=o1:person)\\nStep2: When was #1 born?\\n"
        ...                            "Action2: Retrieval(s=o1, p=p2:birth, o=o2:date)")
        >>> [(f.index, f.function, f.references) for f in plan.forms]
        [(1, 'Retrieval', []), (2, 'Retrieval', [1]), (3, 'Output', [2])]
    """
    if max_forms < 1:
        raise ValueError("max_forms must be at least 1")
    repairs: list[str] = []
    body = _strip_think(_normalise(text), repairs)
    blocks = _labelled_blocks(body)
    if not any(kind == "step" for kind, _, _ in blocks):
        raise LogicalFormParseError(
            "no logical forms found: write each sub-question as 'StepN: ...' followed by 'ActionN: Function(...)'")
    pairs: list[tuple[str, str]] = []
    for kind, number, text_body in blocks:
        expected = len(pairs) + 1 if kind == "step" else len(pairs)
        if kind == "step":
            if number is None:
                repairs.append(f"Step without a number read as Step{expected}")
            elif number != expected:
                raise LogicalFormParseError(f"steps must be numbered 1, 2, 3 ... in order: found Step{number} "
                                            f"where Step{expected} was expected")
            if not text_body:
                raise LogicalFormParseError(f"Step{expected} has no sub-question")
            if pairs and not pairs[-1][1]:
                raise LogicalFormParseError(f"Step{len(pairs)} has no Action: write 'Action{len(pairs)}: Function(...)'")
            pairs.append((text_body, ""))
        else:
            if not pairs:
                raise LogicalFormParseError("an Action came before any Step: write 'Step1: ...' first")
            if number is not None and number != expected:
                raise LogicalFormParseError(f"Action{number} follows Step{expected}: number it Action{expected}")
            if pairs[-1][1]:
                raise LogicalFormParseError(f"Step{expected} has two Actions: write one Action per Step")
            pairs[-1] = (pairs[-1][0], text_body)
    if not pairs[-1][1]:
        raise LogicalFormParseError(f"Step{len(pairs)} has no Action: write 'Action{len(pairs)}: Function(...)'")
    forms: list[LogicalForm] = []
    known: dict[str, ContentItem] = {}
    for index, (step, action) in enumerate(pairs, start=1):
        form = _read_action(action, step, _FormReader(index, known, repairs))
        if forms and forms[-1].function == "Output":
            raise LogicalFormParseError(f"Output must be the last step, but Step{index} follows it")
        known.update(form.defines)
        forms.append(form)
    if forms[-1].function != "Output":
        last = forms[-1].index
        repairs.append(f"no Output step: Output(#{last}) added")
        forms.append(LogicalForm(index=last + 1, step=f"Output #{last}.", function="Output", action=f"Output(#{last})",
                                 content=[ContentItem(step=last)], references=[last],
                                 bindings={f"#{last}": ContentItem(step=last)}))
    if len(forms) > max_forms:
        raise LogicalFormParseError(f"{len(forms)} steps is too many: decompose into at most {max_forms} steps, "
                                    "the last one an Output")
    return LogicalPlan(forms=forms, repairs=repairs)


def _parse_next_retrieval(text: str, *, index: int, known: Mapping[str, ContentItem],
                          repairs: list[str]) -> LogicalForm:
    """The next Retrieval logical form a depth turn issued (``Step: ... / Action: Retrieval(...)``),
    read as a new formulation of sub-question ``index`` (its references: earlier steps only)."""
    blocks = _labelled_blocks(text)
    steps = [b for k, _, b in blocks if k == "step"]
    actions = [b for k, _, b in blocks if k == "action"]
    if not steps:
        raise LogicalFormParseError("write either <answer>...</answer>, or the next 'Step: ...' and "
                                    "'Action: Retrieval(...)' to search for")
    action = actions[0] if actions else f"Retrieval(query='{steps[0]}')"
    if not actions:
        repairs.append("next Step without an Action read as a Retrieval of its text")
    form = _read_action(action, steps[0], _FormReader(index, known, repairs))
    if form.function != "Retrieval":
        raise LogicalFormParseError(f"while solving a sub-question the next action must be a Retrieval, "
                                    f"not {form.function}")
    return form


# =============================================================================================
# Other replies: knowledge boundary, focus, deduce, math
# =============================================================================================

_REFUSAL = re.compile(r"can'?t answer|cannot answer|need to retrieve|unable to answer|don'?t know|not sure",
                      re.IGNORECASE)


# What the prompts show as blanks to fill in; a reply that copies one has not answered.
_PLACEHOLDERS = {"", "...", "the answer", "your answer", "answer", "the facts that bear on the question"}


def _is_placeholder(text: str) -> bool:
    return re.sub(r"\s+", " ", text.lower()).strip(" .*`'\"") in {p.strip(" .") for p in _PLACEHOLDERS}


def _boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` (nested braces allowed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin: i - 1 if depth == 0 else i].strip()


def _tagged(text: str, tag: str) -> Optional[str]:
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL | re.IGNORECASE)
    return found[-1].strip() if found else None


def parse_boundary_answer(text: Any) -> Optional[str]:
    """The model's own answer to a sub-question (Table 2: ``<answer>\\boxed{...}</answer>``), or
    ``None`` when it said it cannot answer or gave no answer in that form.

    Example:
        >>> parse_boundary_answer("Melville wrote it. <answer>\\\\boxed{Herman Melville}</answer>")
        'Herman Melville'
        >>> parse_boundary_answer("Based on my internal knowledge, I can't answer this question") is None
        True
    """
    body = _normalise(text)
    inner = _tagged(body, "answer")
    answer = _boxed(inner if inner is not None else body)
    if answer is None:
        answer = inner
    if not answer or _REFUSAL.search(answer) or _is_placeholder(answer):
        return None
    return answer


def parse_confidence(text: Any) -> Optional[bool]:
    """The True/False of the self-check (Table 3); ``None`` when the reply holds neither (the
    graph then treats the answer as not confident).

    Example:
        >>> parse_confidence("Step by step... <answer>\\\\boxed{True}</answer>"), parse_confidence("hmm")
        (True, None)
    """
    body = _normalise(text)
    for candidate in (_boxed(body), _tagged(body, "answer")):
        if candidate is not None:
            word = re.sub(r"[^a-z]", "", candidate.lower())
            if word in ("true", "false"):
                return word == "true"
    words = re.findall(r"\b(true|false)\b", body, flags=re.IGNORECASE)
    return words[-1].lower() == "true" if words else None


class FocusResult(BaseModel):
    """A depth turn's reading of the references: what bears on the sub-question, and either the
    answer or the next Retrieval logical form."""

    focus: str = ""
    answer: Optional[str] = None
    next_form: Optional[LogicalForm] = None
    repairs: list[str] = Field(default_factory=list)


def parse_focus(text: Any, *, index: int, known: Optional[Mapping[str, ContentItem]] = None) -> FocusResult:
    """Read a focusing-and-reasoning reply: ``<focus>...</focus>`` (optional), then ``<answer>...</answer>``
    or the next ``Step: ... / Action: Retrieval(...)``. An answer wins over a next step written too.

    Example:
        >>> parse_focus("<focus>Ref 0 names the host.</focus><answer>Joey Lawrence</answer>", index=1).answer
        'Joey Lawrence'
    """
    repairs: list[str] = []
    body = re.sub(r"<think>.*?</think>", " ", _normalise(text), flags=re.DOTALL | re.IGNORECASE)
    focus = _tagged(body, "focus") or ""
    inner = _tagged(body, "answer")
    if inner is None:
        line = re.search(r"^\s*\**(?:final\s+)?answer\**\s*:\s*(.+)$", body, flags=re.IGNORECASE | re.MULTILINE)
        if line:
            inner = line.group(1).strip()
            repairs.append("'Answer:' line read as <answer>")
    if inner is not None:
        answer = _boxed(inner) or inner.strip()
        if _is_placeholder(answer):
            raise LogicalFormParseError("the <answer> holds the prompt's placeholder: write the actual answer "
                                        "found in the references, or the next Step and Action")
        if not _REFUSAL.search(answer):
            return FocusResult(focus=focus, answer=answer, repairs=repairs)
    next_form = _parse_next_retrieval(body, index=index, known=known or {}, repairs=repairs)
    return FocusResult(focus=focus, next_form=next_form, repairs=repairs)


def _parse_deduction(text: Any) -> str:
    body = re.sub(r"<think>.*?</think>", " ", _normalise(text), flags=re.DOTALL | re.IGNORECASE)
    inner = _tagged(body, "answer")
    if inner is None:
        line = re.search(r"^\s*\**(?:final\s+)?answer\**\s*:\s*(.+)$", body, flags=re.IGNORECASE | re.MULTILINE)
        inner = line.group(1) if line else None
    answer = (_boxed(inner) or inner.strip()) if inner is not None else ""
    if _is_placeholder(answer):
        raise LogicalFormParseError("wrap your actual conclusion in <answer>...</answer>")
    return answer


class ArithmeticRefused(ValueError):
    """The text is not a plain arithmetic expression (or its value is out of bounds)."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"abs": abs, "min": min, "max": max, "round": round,
                                               "sqrt": math.sqrt}
_MAX_EXPRESSION_CHARS = 500
_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 1e100


def evaluate_arithmetic(expression: str) -> float | int:
    """The value of a plain arithmetic expression, computed by walking its syntax tree.

    Allowed: numbers, ``+ - * / // % **``, unary ``+ -``, parentheses, and the functions
    ``abs min max round sqrt`` with positional arguments. Anything else (names, attributes,
    strings, subscripts, lambdas, ``__import__('os')``...) raises :class:`ArithmeticRefused`, as do
    exponents above 64 in size and values above 1e100 (so no expression can exhaust the machine).
    Commas between digit groups (``1,035.2``) are read as thousands separators.

    Example:
        >>> evaluate_arithmetic("210.4 + 569.2 + 1,035.2 + 2044.5 + 1035")
        4894.3
        >>> evaluate_arithmetic("__import__('os')")
        Traceback (most recent call last):
        ...
        tcrag_langgraph.methods.kag_thinker.ArithmeticRefused: calls allowed only to abs, max, min, round, sqrt
    """
    if not isinstance(expression, str):
        raise ArithmeticRefused(f"the expression must be text, not {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    if "(" not in text or not re.search(r"[A-Za-z_]\s*\(", text):  # in a call, max(1,200) has two arguments
        text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    if not text:
        raise ArithmeticRefused("the expression is empty")
    if len(text) > _MAX_EXPRESSION_CHARS:
        raise ArithmeticRefused(f"the expression is longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as err:
        raise ArithmeticRefused(f"not an arithmetic expression: {err.msg if isinstance(err, SyntaxError) else err}") from None
    value = _walk(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return round(value, 10)
    return round(value, 10) if isinstance(value, float) else value


def _walk(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ArithmeticRefused(f"only numbers are allowed, not {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_walk(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ArithmeticRefused(f"exponents above {_MAX_EXPONENT} are not computed")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ArithmeticRefused("division by zero") from None
        except (OverflowError, ValueError, TypeError) as err:
            raise ArithmeticRefused(f"cannot compute: {err}") from None
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS) or node.keywords:
            raise ArithmeticRefused(f"calls allowed only to {', '.join(sorted(_FUNCTIONS))}")
        args = [_walk(a) for a in node.args]
        try:
            return _bounded(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError) as err:
            raise ArithmeticRefused(f"cannot compute {node.func.id}: {err}") from None
    raise ArithmeticRefused(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _bounded(value: Any) -> float | int:
    if isinstance(value, complex) or not isinstance(value, (int, float)):
        raise ArithmeticRefused("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value) or abs(value) > _MAX_MAGNITUDE:
        raise ArithmeticRefused(f"the value is out of range (above {_MAX_MAGNITUDE:g})")
    return value


def _expression_side(text: str) -> str:
    """In ``total = 3 + 4`` the right side, in ``3 + 4 = 7`` the left: the side that computes."""
    if text.count("=") != 1:
        return text
    left, right = (part.strip() for part in text.split("="))
    if re.fullmatch(r"[A-Za-z_ ]+", left) or not left:
        return right
    return left


def _format_number(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _first_number(text: str) -> Optional[str]:
    found = _NUMBER.search(text or "")
    return found.group(0).replace(",", "") if found else None


# =============================================================================================
# Prompts (the paper's Tables 1-4, adapted to this package's four functions and tools)
# =============================================================================================

DECOMPOSE_INSTRUCTIONS = """You decompose a user question into logical steps that can each be solved on their own.
Functions:
- Retrieval: look up a fact (subject, predicate, object). Usage: Retrieval(s=s1:type['name'], p=p1:relation, o=o1:type)
- Math: compute a number. Usage: Math(content=['#1', '#2'], target='arithmetic expression, e.g. #1 + #2')->m1
- Deduce: reason over earlier answers. Usage: Deduce(op=extract|judgement|entailment|choice|multiChoice, content=['#1', '#2'], target='what to decide')->d1
- Output: give the final answer. Usage: Output(#n)
Rules: write StepN (the sub-question in words) and ActionN (the function) for every step; use #1 for the
answer of Step1, #2 for Step2, and so on (only earlier steps); at most {max_forms} steps; the last step is Output."""

DECOMPOSE_EXAMPLE_QUESTION = "Which film has the director who died first, Hit Parade Of 1947 or Khiladi 420?"
DECOMPOSE_EXAMPLE_REPLY = """Step1: Who is the director of Hit Parade Of 1947?
Action1: Retrieval(s=s1:film['Hit Parade Of 1947'], p=p1:director, o=o1:person)
Step2: When did #1 die?
Action2: Retrieval(s=o1, p=p2:deathtime, o=o2:date)
Step3: Who is the director of Khiladi 420?
Action3: Retrieval(s=s3:film['Khiladi 420'], p=p3:director, o=o3:person)
Step4: When did #3 die?
Action4: Retrieval(s=o3, p=p4:deathtime, o=o4:date)
Step5: Which film was directed by the director who died first according to #2 and #4?
Action5: Deduce(op=choice, content=['#2', '#4'], target='which film was directed by the director who died first')->d5
Step6: Output #5.
Action6: Output(#5)"""

BOUNDARY_PROMPT = """Can you answer the following question step by step?
If you can, wrap your answer with <answer>\\boxed{{your answer}}</answer>.
If you can't, just reply that based on my internal knowledge, I can't answer this question, I need to retrieve external knowledge.
Question: {question}"""

CONFIDENCE_PROMPT = """Analyze whether the answer to the following question is correct?
Please think step-by-step before arriving at your conclusion.
If yes, answer True; if no, answer False.
Wrap your answer with <answer>\\boxed{{True/False}}</answer>.
Question: {question}
Answer: {answer}"""

FOCUS_PROMPT = """According to the question and references, find what in the references answers the question.
Write them as <focus>...</focus>.
If the references answer the question, then write the answer as <answer>...</answer>.
If they do not, write the next search instead:
Step: (the sub-question to search for next)
Action: Retrieval(s=..., p=..., o=...)
{known}References:
{references}
Question: {question}"""

DEDUCE_PROMPT = """Reason over the known facts to reach the target ({op}).
Known facts:
{content}
Target: {target}
Original question: {question}
Think briefly, then wrap the result in <answer>...</answer>."""

OUTPUT_PROMPT = """Question: {question}
Answers found for its sub-questions:
{facts}
Answer so far: {answer}
{rule}
Write the final answer in <answer>...</answer>."""

MATH_PROMPT = """Write one arithmetic expression (numbers, + - * / ** and parentheses only) that computes the target.
Known facts:
{content}
Target: {target}
Wrap the expression in <expression>...</expression>."""


# =============================================================================================
# The graph
# =============================================================================================


class KAGThinkerState(TypedDict, total=False):
    """Graph state. Input ``{"question": ...}`` or ``{"messages": [...]}``. Every value is plain
    data (logical forms as ``LogicalForm.model_dump()`` dicts) so any checkpointer stores it."""

    question: Optional[str]
    messages: Annotated[list[AnyMessage], add_messages]
    forms: list[dict[str, Any]]  # the plan: LogicalForm dicts
    cursor: int  # index (0-based) into forms of the form being solved
    solutions: list[dict[str, Any]]  # one per solved form: index, function, answer, source, resolved
    depth: Optional[dict[str, Any]]  # the Retrieval form being depth-solved: query, turn, draft, focus
    steps: int
    llm_calls: int
    tool_calls: int
    token_usage: dict[str, int]
    trace: list[TraceEvent]
    answer: Optional[str]
    structured_answer: Any  # the answer in TCRAGConfig.answer_format, when one was asked for
    answer_validated: bool
    halt_reason: Optional[str]
    error: Optional[str]


class _Fault(Exception):
    """Ends the run with ``halt_reason`` (a model failure, format retries spent, ...)."""

    def __init__(self, reason: str, message: str, update: Optional[dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.update = update or {}


class _Solver:
    """Holds model, tools, scorer and options; its methods are the graph nodes."""

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, config: TCRAGConfig,
                 options: KAGThinkerOptions, *, trust_client_identity: bool) -> None:
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.scorer = scorer
        self.base_config = config
        self.base_options = options
        self.trust_client_identity = trust_client_identity

    # ----- configuration and bookkeeping -----
    def settings(self, config: RunnableConfig, runtime: Runtime) -> tuple[TCRAGConfig, KAGThinkerOptions]:
        context = getattr(runtime, "context", None)
        configurable = (config or {}).get("configurable") or {}
        base_values, our_values = _split_overrides(context)
        cfg = resolve_config(self.base_config, configurable=configurable, context=base_values,
                             trust_client_identity=self.trust_client_identity)
        options = self.base_options.merged({**_split_overrides(configurable)[1], **our_values})
        unknown = [n for n in (options.retrieval_tools or ()) if n not in self.tools]
        if unknown:
            raise ValueError(f"retrieval_tools names tools this graph does not have: {unknown}")
        return cfg, options

    @staticmethod
    def event(state: Mapping[str, Any], config: RunnableConfig, *, action: str, op: str = "push", content: str = "",
              detail: Optional[dict[str, Any]] = None) -> list[TraceEvent]:
        """Emit one event live; return the extended trace."""
        event = TraceEvent(step=state.get("steps", 0), action=action, op=op, content=content[:2000],
                           stack_depth=len(state.get("solutions") or []),
                           detail=json.dumps(detail, ensure_ascii=False, default=str) if detail is not None else None)
        emit(event, config)
        return [*(state.get("trace") or []), event]

    def ask(self, state: dict[str, Any], messages: list[BaseMessage], cfg: TCRAGConfig,
            config: RunnableConfig) -> str:
        """One model call; counts it and its tokens into ``state`` (a working copy)."""
        from ..models import LocalChatModel

        kwargs: dict[str, Any] = {}
        if isinstance(self.model, LocalChatModel):  # only the packaged model takes these per call
            kwargs.update(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        try:
            reply = self.model.invoke(messages, config=child_config(config), **kwargs)
        except Exception as exc:  # a model/server failure ends the run with the reason
            raise _Fault("model_error", f"{type(exc).__name__}: {exc}") from exc
        text = message_text(reply.content)
        usage = dict(state.get("token_usage") or {"prompt": 0, "completion": 0})
        usage["prompt"] += sum(count_tokens(message_text(m.content)) for m in messages)
        usage["completion"] += count_tokens(text)
        state.update(llm_calls=state.get("llm_calls", 0) + 1, token_usage=usage)
        return text

    def ask_parsed(self, state: dict[str, Any], messages: list[BaseMessage], parse: Callable[[str], Any],
                   cfg: TCRAGConfig, config: RunnableConfig, *, what: str, instructions: str) -> Any:
        """Ask, parse; on a parse error re-prompt with the error, at most ``max_format_retries`` times."""
        history = list(messages)
        for attempt in range(cfg.max_format_retries + 1):
            text = self.ask(state, history, cfg, config)
            try:
                return parse(text)
            except (LogicalFormParseError, ArithmeticRefused) as err:
                state["trace"] = self.event(state, config, action=what, op="format_error", content=text[:500],
                                            detail={"error": str(err), "attempt": attempt + 1})
                history += [AIMessage(content=text[:2000] or "(empty)"),
                            HumanMessage(content=f"Your reply could not be used: {err}.\n{instructions}")]
                last_error = err
        raise _Fault("format_error", f"no usable {what} after {cfg.max_format_retries + 1} tries: {last_error}")

    def halt(self, state: Mapping[str, Any], config: RunnableConfig, *, reason: str, answer: Optional[str],
             validated: bool, error: Optional[str] = None, extra: Optional[dict[str, Any]] = None) -> Command:
        update = dict(extra or {})
        final = {**state, **update}
        trace = self.event(final, config, action="Halt", op="halt", content=answer or "",
                           detail={"halt_reason": reason, **({"error": error} if error else {})})
        update.update(trace=trace, answer=answer, answer_validated=validated, halt_reason=reason, error=error,
                      depth=None)
        result = RunResult.from_state({**final, **update})
        update["messages"] = [AIMessage(content=result.text, response_metadata=result.metadata())]
        return Command(goto=END, update=update)

    def guarded(self, node: Callable[..., Command]) -> Callable[..., Command]:
        """Run a node; a :class:`_Fault` (model error, format retries spent) halts the run cleanly."""

        def run(state: KAGThinkerState, config: RunnableConfig, runtime: Runtime) -> Command:
            work: dict[str, Any] = {}
            try:
                return node(state, config, runtime, work)
            except _Fault as fault:
                return self.halt({**state, **work}, config, reason=fault.reason, answer=None, validated=False,
                                 error=str(fault), extra=work)

        run.__name__ = getattr(node, "__name__", "node")
        run.__annotations__ = {k: v for k, v in node.__annotations__.items() if k != "work"}
        return run

    def route(self, forms: list[dict[str, Any]], cursor: int) -> str:
        return forms[cursor]["function"]

    @staticmethod
    def answers(state: Mapping[str, Any]) -> dict[int, str]:
        return {s["index"]: s["answer"] for s in state.get("solutions") or []}

    @staticmethod
    def resolve(item: ContentItem, answers: Mapping[int, str]) -> str:
        if item.step is not None:
            return answers.get(item.step, "")
        return item.text or ""

    def substitute(self, text: str, form: LogicalForm, answers: Mapping[int, str], *, numeric: bool = False) -> str:
        """``text`` with each ``#n`` and bound variable replaced by what it stands for (for Math:
        the first number of that answer; an answer without one raises :class:`ArithmeticRefused`)."""

        def value(name: str) -> str:
            item = form.bindings.get(name)
            if item is None:
                return name
            resolved = self.resolve(item, answers)
            if not numeric:
                return resolved
            number = _first_number(resolved)
            if number is None:
                raise ArithmeticRefused(f"{name} ({resolved[:80]!r}) holds no number")
            return f"({number})"

        names = sorted(form.bindings, key=len, reverse=True)
        if not names:
            return text
        pattern = "|".join(re.escape(n) if n.startswith("#") else rf"(?<![\w#]){re.escape(n)}(?!\w)" for n in names)
        return re.sub(pattern, lambda m: value(m.group(0)), text)

    def known_facts(self, form: LogicalForm, answers: Mapping[int, str]) -> str:
        lines = []
        for item in form.content:
            lines.append(f"- #{item.step}: {answers.get(item.step, '')}" if item.step is not None else f"- {item.text}")
        for k in form.references:
            if not any(i.step == k for i in form.content):
                lines.append(f"- #{k}: {answers.get(k, '')}")
        return "\n".join(lines) or "(none)"

    def solved(self, state: Mapping[str, Any], work: dict[str, Any], config: RunnableConfig, form: LogicalForm, *,
               answer: str, source: str, resolved: bool = True, detail: Optional[dict[str, Any]] = None) -> Command:
        """Record the form's answer and go to the next form."""
        solutions = [*(state.get("solutions") or []), {"index": form.index, "function": form.function,
                                                        "answer": answer, "source": source, "resolved": resolved}]
        work.update(solutions=solutions, steps=state.get("steps", 0) + 1, depth=None)
        merged = {**state, **work}
        work["trace"] = self.event(merged, config, action=form.function, op="push", content=answer,
                                   detail={"step": form.index, "source": source, "resolved": resolved, **(detail or {})})
        cursor = state["cursor"] + 1
        work["cursor"] = cursor
        return Command(goto=self.route(state["forms"], cursor), update=work)

    # ----- nodes -----
    def start(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Decompose", "__end__"]
    ]:
        cfg, _ = self.settings(config, runtime)
        base = {"forms": [], "cursor": 0, "solutions": [], "depth": None, "steps": 0, "llm_calls": 0,
                "tool_calls": 0, "token_usage": {"prompt": 0, "completion": 0}, "trace": [], "answer": None,
                "structured_answer": None,
                "answer_validated": False, "halt_reason": None, "error": None}
        question, problem = extract_question(state, cfg)
        if problem is not None:
            return self.halt({**state, **base}, config, reason="invalid_input", answer=None, validated=False,
                             error=problem, extra={**base, "question": None})
        update = {**base, "question": question}
        update["trace"] = self.event(update, config, action="User_Query", content=question)
        if not last_human_is(state, question):
            update["messages"] = [HumanMessage(content=question)]
        return Command(goto="Decompose", update=update)

    def decompose(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
                  work: dict[str, Any]) -> Command[Literal["Retrieval", "Math", "Deduce", "Output", "__end__"]]:
        cfg, options = self.settings(config, runtime)
        instructions = DECOMPOSE_INSTRUCTIONS.format(max_forms=options.max_logical_forms)
        messages: list[BaseMessage] = [
            SystemMessage(content=instructions),
            HumanMessage(content=f"Question: {DECOMPOSE_EXAMPLE_QUESTION}"), AIMessage(content=DECOMPOSE_EXAMPLE_REPLY),
            HumanMessage(content=f"Question: {state['question']}"),
        ]
        work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"),
                    steps=state.get("steps", 0))
        plan = self.ask_parsed(work, messages, lambda t: parse_logical_forms(t, max_forms=options.max_logical_forms),
                               cfg, config, what="Logical_Form",
                               instructions="Write StepN: / ActionN: pairs as in the example, the last one an Output.")
        forms = [f.model_dump() for f in plan.forms]
        for form in plan.forms:
            detail = {"step": form.index, "function": form.function, "action": form.action,
                      "references": form.references}
            if form.index == 1 and plan.repairs:
                detail["repairs"] = plan.repairs
            work["trace"] = self.event(work, config, action="Logical_Form", content=form.step, detail=detail)
        work.update(forms=forms, cursor=0, steps=work["steps"] + 1)
        return Command(goto=self.route(forms, 0), update=work)

    def retrieval(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
                  work: dict[str, Any]) -> Command[Literal["Depth_Solve", "Retrieval", "Math", "Deduce", "Output", "__end__"]]:
        """Knowledge-boundary determination: generate first, then assess (both tests must pass)."""
        cfg, options = self.settings(config, runtime)
        form = LogicalForm.model_validate(state["forms"][state["cursor"]])
        answers = self.answers(state)
        question = self.substitute(form.step, form, answers)
        work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"))
        depth = {"index": form.index, "query": question, "turn": 0, "draft": None, "focus": ""}
        if not options.knowledge_boundary:
            work.update(depth=depth)
            return Command(goto="Depth_Solve", update=work)
        if self.scorer is None or not hasattr(self.scorer, "token_logprobs"):
            raise _Fault("scorer_error", "knowledge_boundary is on for this run, but the graph has no scorer with "
                         "token_logprobs (build it with one, or run with knowledge_boundary=False)")
        prompt = BOUNDARY_PROMPT.format(question=question)
        generated = parse_boundary_answer(self.ask(work, [HumanMessage(content=prompt)], cfg, config))
        check: dict[str, Any] = {"step": form.index, "question": question, "generated": generated,
                                 "tau": options.min_token_prob}
        confident = likely = False
        if generated is not None:
            verdict = parse_confidence(self.ask(
                work, [HumanMessage(content=CONFIDENCE_PROMPT.format(question=question, answer=generated))], cfg, config))
            confident = verdict is True
            try:
                logprobs = list(self.scorer.token_logprobs(prompt, generated))
                min_prob = math.exp(min(logprobs)) if logprobs else 0.0
                likely = min_prob >= options.min_token_prob
                check["min_token_prob"] = round(min_prob, 6)
            except Exception as exc:  # no likelihood, no pass: the step retrieves (an error is never evidence)
                check["likelihood_error"] = f"{type(exc).__name__}: {exc}"
            check.update(stated_confidence=verdict)
        check.update(confident=confident, likely=likely, skip_retrieval=confident and likely)
        work["trace"] = self.event({**state, **work}, config, action="Knowledge_Boundary", content=generated or "",
                                   detail=check)
        if confident and likely:
            return self.solved(state, work, config, form, answer=generated, source="internal")
        work.update(depth={**depth, "draft": generated})
        return Command(goto="Depth_Solve", update=work)

    def depth_solve(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
                    work: dict[str, Any]) -> Command[Literal["Depth_Solve", "Retrieval", "Math", "Deduce", "Output", "__end__"]]:
        """One depth turn: retrieve with the current query, focus, then answer or issue the next form."""
        cfg, options = self.settings(config, runtime)
        form = LogicalForm.model_validate(state["forms"][state["cursor"]])
        depth = dict(state["depth"])
        turn = depth["turn"] + 1
        work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"),
                    tool_calls=state.get("tool_calls", 0), steps=state.get("steps", 0) + 1)
        references, called = self.retrieve(depth["query"], cfg, options, config)
        work["tool_calls"] += len(called)
        work["trace"] = self.event({**state, **work}, config, action="Retrieve", content=depth["query"],
                                   detail={"step": form.index, "turn": turn, "calls": called})
        if not references:  # nothing usable came back: a further turn would ask the same tools again
            return self.unresolved(state, work, config, form, depth, turn, why="no usable references")
        answers = self.answers(state)
        known = {name: item for f in state["forms"][: state["cursor"]] for name, item in
                 LogicalForm.model_validate(f).defines.items()}
        # The form's own named entities may be searched again; its own answer is what is sought.
        known.update({name: item for name, item in form.defines.items() if item.step != form.index})
        earlier = "".join(f"#{k}: {answers.get(k, '')}\n" for k in form.references)
        prompt = FOCUS_PROMPT.format(
            known=f"Known answers:\n{earlier}" if earlier else "",
            references="\n".join(f"{i}. [{tool}] {text}" for i, (tool, text) in enumerate(references)),
            question=depth["query"])
        focus: FocusResult = self.ask_parsed(
            work, [HumanMessage(content=prompt)], lambda t: parse_focus(t, index=form.index, known=known), cfg, config,
            what="Focus", instructions="Write <focus>...</focus> then <answer>...</answer>, or Step: ... and "
            "Action: Retrieval(...).")
        detail = {"step": form.index, "turn": turn, "focus": focus.focus, "repairs": focus.repairs}
        if focus.answer is not None:
            work["trace"] = self.event({**state, **work}, config, action="Focus", content=focus.answer,
                                       detail={**detail, "outcome": "answer"})
            return self.solved(state, work, config, form, answer=focus.answer, source="retrieved",
                               detail={"turns": turn})
        next_query = self.substitute(focus.next_form.step, focus.next_form, answers)
        work["trace"] = self.event({**state, **work}, config, action="Logical_Form", content=next_query,
                                   detail={**detail, "outcome": "next_form", "action": focus.next_form.action})
        depth.update(turn=turn, focus=focus.focus or depth.get("focus", ""), query=next_query)
        if turn >= options.max_depth_turns:
            return self.unresolved(state, work, config, form, depth, turn,
                                   why=f"no answer within {options.max_depth_turns} depth turns")
        work["depth"] = depth
        return Command(goto="Depth_Solve", update=work)

    def unresolved(self, state: Mapping[str, Any], work: dict[str, Any], config: RunnableConfig, form: LogicalForm,
                   depth: Mapping[str, Any], turn: int, *, why: str) -> Command:
        """The turn bound (or the tools) ran out: keep the best text there is, marked unresolved."""
        answer = depth.get("focus") or depth.get("draft") or "unknown"
        return self.solved(state, work, config, form, answer=answer, source="unresolved", resolved=False,
                           detail={"turns": turn, "why": why})

    def retrieve(self, query: str, cfg: TCRAGConfig, options: KAGThinkerOptions,
                 config: RunnableConfig) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
        """Call each retrieval tool once through the tool layer; errors are recorded, never evidence."""
        child = child_config(config)
        caller = caller_for_run(config, base=cfg.caller)  # trusted identity only, never the client's words
        child["configurable"] = {**child.get("configurable", {}), CALLER_KEY: caller}
        names = options.retrieval_tools if options.retrieval_tools is not None else tuple(self.tools)
        references, called = [], []
        for name in names:
            outcome = invoke_tool(self.tools[name], query, config=child, timeout_s=cfg.tool_timeout_s,
                                  max_output_tokens=cfg.max_observation_tokens)
            if is_tool_error(outcome):
                called.append({"tool": name, "error": outcome.kind})
            else:
                called.append({"tool": name, "chars": len(outcome)})
                references.append((name, outcome))
        return references, called

    def math(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
             work: dict[str, Any]) -> Command[Literal["Retrieval", "Math", "Deduce", "Output", "__end__"]]:
        """Evaluate the target as arithmetic (references replaced by their numbers); if it is not
        arithmetic, the model writes the expression (re-prompted with the evaluator's refusal)."""
        cfg, _ = self.settings(config, runtime)
        form = LogicalForm.model_validate(state["forms"][state["cursor"]])
        answers = self.answers(state)
        work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"))
        try:
            expression = self.substitute(form.target or "", form, answers, numeric=True)
            value = evaluate_arithmetic(expression)
            written_by = "target"
        except ArithmeticRefused:
            def parse(text: str) -> tuple[str, float | int]:
                body = _normalise(text)
                raw = _tagged(body, "expression")
                if raw is None:
                    lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
                    raw = lines[-1] if lines else ""
                raw = _expression_side(raw)
                expr = self.substitute(raw, form, answers, numeric=True)
                return expr, evaluate_arithmetic(expr)

            prompt = MATH_PROMPT.format(content=self.known_facts(form, answers),
                                        target=self.substitute(form.target or form.step, form, answers))
            expression, value = self.ask_parsed(work, [HumanMessage(content=prompt)], parse, cfg, config, what="Math",
                                                instructions="Write only numbers, + - * / ** and parentheses "
                                                "inside <expression>...</expression>.")
            written_by = "model"
        return self.solved(state, work, config, form, answer=_format_number(value), source="math",
                           detail={"expression": expression, "written_by": written_by})

    def deduce(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime,
               work: dict[str, Any]) -> Command[Literal["Retrieval", "Math", "Deduce", "Output", "__end__"]]:
        cfg, _ = self.settings(config, runtime)
        form = LogicalForm.model_validate(state["forms"][state["cursor"]])
        answers = self.answers(state)
        work.update(trace=state.get("trace"), llm_calls=state.get("llm_calls", 0), token_usage=state.get("token_usage"))
        prompt = DEDUCE_PROMPT.format(op=form.op or "extract", content=self.known_facts(form, answers),
                                      target=self.substitute(form.target or form.step, form, answers),
                                      question=state["question"])
        answer = self.ask_parsed(work, [HumanMessage(content=prompt)], _parse_deduction, cfg, config, what="Deduce",
                                 instructions="End with <answer>your conclusion</answer>.")
        return self.solved(state, work, config, form, answer=answer, source="deduce", detail={"op": form.op})

    def output(self, state: KAGThinkerState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["__end__"]]:
        """The referenced answers are the final answer; with an ``answer_format`` the executor puts
        them in that form (the model is asked only when they do not already fit)."""
        cfg, _ = self.settings(config, runtime)
        form = LogicalForm.model_validate(state["forms"][state["cursor"]])
        answers = self.answers(state)
        parts = [answers.get(item.step, "") for item in form.content if item.step is not None]
        answer = "; ".join(p for p in parts if p) or None
        unresolved = [s["index"] for s in state.get("solutions") or [] if not s["resolved"]]
        work: dict[str, Any] = {"steps": state.get("steps", 0) + 1, "trace": state.get("trace"),
                                "llm_calls": state.get("llm_calls", 0), "token_usage": state.get("token_usage")}
        fmt = cfg.answer_format
        structured, reason, error = None, "answered", None
        if answer is None:
            reason, error = "no_answer", "the Output step's references have no answer"
        elif fmt is not None:
            structured, problem = answer_format.check(fmt, answer)
            if problem is not None:
                try:
                    answer, structured = self.formatted(work, state, form, answers, answer, fmt, cfg, config)
                except _Fault as fault:
                    reason, error = fault.reason, str(fault)
        work["trace"] = self.event({**state, **work}, config, action="Output", content=answer or "",
                                   detail={"step": form.index, "outputs": form.references, "unresolved": unresolved})
        work["structured_answer"] = structured
        return self.halt(state, config, reason=reason, answer=answer, extra=work, error=error,
                         validated=reason == "answered" and not unresolved)

    def formatted(self, work: dict[str, Any], state: Mapping[str, Any], form: LogicalForm, answers: Mapping[int, str],
                  answer: str, fmt: Any, cfg: TCRAGConfig, config: RunnableConfig) -> tuple[str, Any]:
        """``(answer, structured answer)`` in the asked format, re-prompted at most ``max_format_retries`` times."""
        rule = answer_format.instructions(fmt).replace("Your Conclusion", "The final answer")

        def parse(text: str) -> tuple[str, Any]:
            body = re.sub(r"<think>.*?</think>", " ", _normalise(text), flags=re.DOTALL | re.IGNORECASE)
            final = _tagged(body, "answer") or body.strip()
            structured, problem = answer_format.check(fmt, final)
            if problem is not None:
                raise LogicalFormParseError(problem)
            return final, structured

        prompt = OUTPUT_PROMPT.format(question=state["question"], facts=self.known_facts(form, answers), answer=answer,
                                      rule=rule)
        return self.ask_parsed(work, [HumanMessage(content=prompt)], parse, cfg, config, what="Output", instructions=rule)


def build_kag_thinker_graph(
    *,
    model: BaseChatModel | str | None = None,
    tools: Optional[Sequence[BaseTool]] = None,
    scorer: Any = None,
    config: Optional[TCRAGConfig | dict[str, Any]] = None,
    options: Optional[KAGThinkerOptions | dict[str, Any]] = None,
    checkpointer: Any = None,
    name: str = "kag-thinker",
    trust_client_identity: bool = False,
):
    """Build and compile the KAG-Thinker graph.

    Args:
        model: a LangChain chat model, a local path / ``.gguf`` or ``"provider:model"`` name
            (:func:`~tcrag_langgraph.models.resolve_chat_model`); ``None``: the packaged SmolLM2.
        tools: the tools a depth turn retrieves with (unique names); may be empty.
        scorer: anything with ``token_logprobs(context, text) -> list[float]`` for the likelihood
            test. ``None``: the generator's own weights (:func:`~tcrag_langgraph.scoring.scorer_for_model`,
            which raises :class:`~tcrag_langgraph.scoring.MonitorUnavailableError` for a model without
            trusted log-probs: then pass a scorer or ``options={"knowledge_boundary": False}``).
        config: :class:`~tcrag_langgraph.TCRAGConfig` (generation and tool limits, format retries).
        options: :class:`KAGThinkerOptions` (decomposition, depth and boundary settings).
        checkpointer: any LangGraph checkpointer; give it ``serde=tcrag_langgraph.integration.checkpoint_serde()``.
        trust_client_identity: let a run's context set ``caller`` (see :func:`tcrag_langgraph.build_graph`).

    Returns:
        A compiled graph: ``invoke({"question": ...})``; per-run overrides of either options model
        through ``context=``. Its recursion limit covers the largest plan the option bounds allow.
    """
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    opts = options if isinstance(options, KAGThinkerOptions) else KAGThinkerOptions.model_validate(options or {})
    tools = list(tools or [])
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise ValueError(f"tools must be LangChain BaseTool instances, got {type(tool).__name__}")
    if len({t.name for t in tools}) != len(tools):
        raise ValueError("tool names must be unique")
    unknown = [n for n in (opts.retrieval_tools or ()) if n not in {t.name for t in tools}]
    if unknown:
        raise ValueError(f"retrieval_tools names tools not given: {unknown}")
    if not (model is None or isinstance(model, (BaseChatModel, str))):
        raise ValueError(f"model must be a LangChain chat model, a path or a 'provider:model' name, "
                         f"got {type(model).__name__}")
    if not isinstance(model, BaseChatModel):
        from ..models import resolve_chat_model

        model = resolve_chat_model(model, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    if opts.knowledge_boundary:
        if scorer is None:
            try:
                scorer = scorer_for_model(model)
            except MonitorUnavailableError as err:
                raise MonitorUnavailableError(
                    f"{err} For KAG-Thinker the scorer is the likelihood test of the knowledge boundary: pass "
                    "scorer=, or build with options={'knowledge_boundary': False} (every Retrieval step "
                    "then retrieves).") from None
        if not callable(getattr(scorer, "token_logprobs", None)):
            raise ValueError(f"the likelihood test needs a scorer with token_logprobs(context, text); "
                             f"{type(scorer).__name__} has none (or build with knowledge_boundary=False)")
    solver = _Solver(model, tools, scorer, cfg, opts, trust_client_identity=trust_client_identity)
    builder = StateGraph(KAGThinkerState)
    builder.add_node("Start", solver.start)
    builder.add_node("Decompose", solver.guarded(solver.decompose))
    builder.add_node("Retrieval", solver.guarded(solver.retrieval))
    builder.add_node("Depth_Solve", solver.guarded(solver.depth_solve))
    builder.add_node("Math", solver.guarded(solver.math))
    builder.add_node("Deduce", solver.guarded(solver.deduce))
    builder.add_node("Output", solver.output)
    builder.add_edge(START, "Start")
    graph = builder.compile(checkpointer=checkpointer, name=name)
    # Worst case: Start, Decompose, and per form its node plus every depth turn (a caller's own
    # recursion_limit still wins).
    return graph.with_config(recursion_limit=2 + _MAX_FORMS_CAP * (1 + _MAX_TURNS_CAP) + 1)
