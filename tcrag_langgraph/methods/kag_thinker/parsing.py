"""The strict parser of logical forms: a breadth decomposition (:func:`parse_logical_forms`) and
the next Retrieval form a depth turn issues, read into the typed models of :mod:`.forms` with
format repairs recorded."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from ...core.names import nearest_name
from .forms import DEDUCE_OPS, ContentItem, Function, LogicalForm, LogicalFormParseError, LogicalPlan
from .text import _normalise, _split_top_level, _strip_think, _unquote

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


def _resolve_function(name: str, repairs: list[str]) -> Function:
    key = re.sub(r"[^a-z]", "", name.lower())
    if key in _FUNCTION_WORDS:
        resolved = _FUNCTION_WORDS[key]
        if name != resolved:
            repairs.append(f"function {name!r} read as {resolved}")
        return resolved
    close = nearest_name(key, list(_FUNCTION_WORDS))
    if close is not None:
        resolved = _FUNCTION_WORDS[close]
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
        # A quoted word is text even when it looks like a variable ('T4' is a tumour stage); only a
        # bare one must be a variable an earlier action defined.
        if _VARIABLE.match(value) and value == raw.strip():
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


def parse_logical_forms(text: Any, *, max_forms: int = 6, cut: bool = False) -> LogicalPlan:
    """Read a breadth decomposition (``Step1: ... / Action1: ...`` pairs) into typed logical forms.

    Repairs (recorded in :attr:`LogicalPlan.repairs`): ``<think>``/``<answer>`` wrappers, markdown,
    full-width colons, HTML entities, missing step numbers, function-name variants and typos, a
    missing Deduce op or target, a missing final ``Output`` (``Output(#last)`` is added), an Output
    step naming itself (``StepN ... Output(#N)`` is read as ``Output(#N-1)``). Anything
    else unusable raises :class:`LogicalFormParseError` whose message is for the model: no steps, a
    Step without an Action, numbering out of order, an unknown function, a reference to an unknown
    variable or to a step that is not earlier (``#n`` with ``n`` >= its own number), an Output that
    is not last, more than ``max_forms`` forms.

    ``cut``: the token budget ended the reply (``finish_reason == "length"``). A plan that does not parse
    then loses its last, unfinished Step (and its Action) and is read again: the complete steps before
    it are a plan (recorded as a repair); if they are not, the first error stands. Only a reply known to
    be cut is shortened, so a plan the model finished is never changed.

    Example:
        >>> plan = parse_logical_forms("Step1: Who wrote The Pequod?\\nAction1: Retrieval(s=s1:book['The Pequod'], "
        ...                            "p=p1:author, o=o1:person)\\nStep2: When was #1 born?\\n"
        ...                            "Action2: Retrieval(s=o1, p=p2:birth, o=o2:date)")
        >>> [(f.index, f.function, f.references) for f in plan.forms]
        [(1, 'Retrieval', []), (2, 'Retrieval', [1]), (3, 'Output', [2])]
    """
    if max_forms < 1:
        raise ValueError("max_forms must be at least 1")
    try:
        return _parse_plan(text, max_forms)
    except LogicalFormParseError as first:
        body = _strip_think(_normalise(text), [])
        steps = [m for m in _LABEL.finditer(body) if m.group("kind").lower() == "step"]
        if not cut or len(steps) < 2:
            raise
        try:
            plan = _parse_plan(body[: steps[-1].start()], max_forms)
        except LogicalFormParseError:
            raise first from None
        label = f"Step{steps[-1].group('num') or len(steps)}"
        plan.repairs.append(f"the reply was cut off by the token budget: its unfinished {label} was left out")
        return plan


def _parse_plan(text: Any, max_forms: int) -> LogicalPlan:
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
