"""The forms of KAG-Thinker's replies (:class:`~tcrag_langgraph.models.constrained.ReplyForm`): the
breadth plan of logical forms, a depth turn's focus, a deduction, a Math expression and the final
answer in its allowed choices. The nodes pass them to ``ask_parsed(..., form=...)``; the parsers of
:mod:`.parsing` and :mod:`.replies` still read (and validate) every reply.

The plan's grammar is unrolled over the step numbers (at most ``max_logical_forms`` forms), which is
what lets a context-free grammar say what the parser checks about numbering and references:

* ``Step<i>:`` and ``Action<i>:`` pairs numbered 1, 2, 3 ... in order, one Action per Step;
* step ``i`` refers only to earlier steps (``#1`` .. ``#<i-1>``, never followed by another digit), in
  its text and in its action; a ``#`` that is not such a reference is not written;
* an Action is one of the four functions with its arguments in the form of the prompt's usage lines:
  ``Retrieval(s=..., p=..., o=...)`` whose definitions are named after the step (``s<i>:type['name']``,
  ``p<i>:relation``, ``o<i>:type``) or whose subject is an earlier answer; ``Deduce(op=..., content=[...],
  target='...')`` with one of its five ops, content of earlier answers or quoted text; ``Math`` over
  earlier answers and numbers, its first item an earlier answer (so never at step 1: a Math of constants
  computes nothing of the question), with an arithmetic target (as the usage line says);
  ``Output(#k, ...)`` of earlier answers, which ends the plan;
* content lists of at most ``MAX_CONTENT_ITEMS`` items, expressions of at most ``MAX_TERMS`` terms;
* at most ``max_logical_forms`` forms: the last possible step can only be the Output; a plan may
  also end after a non-Output step, which the parser completes with ``Output(#last)`` as before.

Variables are what the grammar can only partly track: which exist depends on the earlier steps'
functions. An earlier answer is ``#k``, as the prompt's rules ask; a variable only in the one case the
grammar can know, ``o<i-1>`` right after a Retrieval (which always defines it here), as the prompt's own
example writes it (``s=o1`` in step 2): every step rule comes in two variants, after a Retrieval or not.
The parser still reads any variable in replies of unconstrained models.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from ...models.constrained import ReplyForm, gbnf_literal
from .forms import DEDUCE_OPS

__all__ = ["plan_form", "focus_form", "DEDUCE_FORM", "MATH_FORM", "answer_choice_form"]

# Text that may not hold a '#' (only references write one), a newline, or (inside quotes) a quote.
_PLAIN = r"[^\n#]"
_QUOTED = r"[^\n#']"
_TYPE = "typename ::= [A-Za-z] [A-Za-z0-9_ ]{0,40}"
# What goes between the numbers and references of an arithmetic expression: operators, parentheses and
# the evaluator's functions (arithmetic.evaluate_arithmetic); two terms never touch, so "#1" "2" is no "#12"
# (bounded, as are the lists and expressions below: greedy decoding of the 1.5B otherwise repeated
# "round/" or "'3', '1', " until the token limit, the same on every retry: 2 of 30 trainval plans)
_ARITH_SEP = 'arithsep ::= ( [+*/()%, -] | "abs" | "min" | "max" | "round" | "sqrt" ){1,6}'
#: at most this many items in a Deduce or Math content list, and terms in an arithmetic expression
MAX_CONTENT_ITEMS = 8
MAX_TERMS = 12


def _refs(i: int) -> Optional[str]:
    """The references step ``i`` may make (``#1`` .. ``#<i-1>``) as one alternative; None for step 1."""
    return " | ".join(gbnf_literal(f"#{k}") for k in range(1, i)) or None


def _text_rule(name: str, i: int, plain: str) -> str:
    """Free text of step ``i`` whose '#' only ever starts a reference to an earlier step, and a reference is
    never followed by a digit (``#1`` then ``2`` would read as ``#12``)."""
    if i == 1:
        return f"{name} ::= {plain}+"
    after = f"( ref{i} ( {plain[:-1]}0-9] {plain}* )? )"  # a reference, then text that starts with no digit
    return f"{name} ::= ( {plain}+ | {after} ) {after}*"


def _step_rules(i: int) -> list[str]:
    """The rules only step ``i`` uses: its references, texts and output, and its actions in two variants:
    ``...{i}v`` where the step before was a Retrieval (whose object variable ``o<i-1>`` an action may
    name, as the prompt's example does: ``s=o1``), ``...{i}n`` where it was not (or for step 1)."""
    rules = []
    refs = _refs(i)
    if refs:
        rules.append(f"ref{i} ::= {refs}")
        rules.append(f"output{i} ::= \"Output(\" ref{i} ( \", \" ref{i} )* \")\"")
    rules.append(_text_rule(f"text{i}", i, _PLAIN))
    rules.append(_text_rule(f"quoted{i}", i, _QUOTED))
    label = f'( "[\'" quoted{i} "\']" )?'
    for variant in ("n", "v") if i > 1 else ("n",):
        earlier = [f"ref{i}"] if refs else []
        if variant == "v":
            earlier.append(gbnf_literal(f"o{i - 1}"))
        subject = " | ".join([f'"s{i}:" typename {label}', *earlier])
        rules.append(f"retrieval{i}{variant} ::= \"Retrieval(s=\" ( {subject} ) \", p=p{i}:\" typename "
                     f"\", o=o{i}:\" typename {label} \")\"")
        item = "\"'\" ( " + " | ".join([*earlier, f"{_QUOTED}+"]) + " ) \"'\""
        rules.append(f"deduceargs{i}{variant} ::= \"content=[\" {item} ( \", \" {item} ){{0,{MAX_CONTENT_ITEMS - 1}}} "
                     f"\"], target='\" quoted{i} \"'\"")
        if not earlier:
            continue  # no Math: with no earlier answer to compute over it computes nothing of the question
        # Math computes over earlier answers (its first item is one) and numbers; its target is the
        # arithmetic (the prompt's usage). 12 of 28 trainval plans began with a Math of constants only.
        term = " | ".join([*earlier, "[0-9.]+"])
        rules.append(f"term{i}{variant} ::= {term}")
        rules.append(f"mathargs{i}{variant} ::= \"content=['\" ( {' | '.join(earlier)} ) \"'\" "
                     f"( \", '\" term{i}{variant} \"'\" ){{0,{MAX_CONTENT_ITEMS - 1}}} \"], target='\" arithsep? "
                     f"term{i}{variant} ( arithsep term{i}{variant} ){{0,{MAX_TERMS - 1}}} arithsep? \"'\"")
    return rules


def _steps(i: int, max_forms: int) -> list[str]:
    """Step ``i`` in both variants: its Step line, then a work action (and maybe the next step, whose
    variant says whether this one was a Retrieval) or, from step 2 on, the Output that ends the plan."""
    rules = []
    for variant in ("n", "v") if i > 1 else ("n",):
        head = f"\"Step{i}: \" text{i} \"\\nAction{i}: \""
        more = i < max_forms
        found = f"retrieval{i}{variant}" + (f" ( \"\\n\" step{i + 1}v )?" if more else "")
        math = [f"\"Math(\" mathargs{i}{variant} \")\" ( \"->m{i}\" )?"] if i > 1 else []  # step 1 has nothing to compute over
        worked = ("( " + " | ".join([*math, f"\"Deduce(op=\" deduceop \", \" deduceargs{i}{variant} \")\" ( \"->d{i}\" )?"])
                  + " )") + (f" ( \"\\n\" step{i + 1}n )?" if more else "")
        options = ([found, worked] if more else []) + ([f"output{i}"] if i > 1 else [])
        rules.append(f"step{i}{variant} ::= {head} ( " + " | ".join(options) + " )")
    return rules


@functools.lru_cache(maxsize=32)
def plan_form(max_forms: int) -> Optional[ReplyForm]:
    """The form of a breadth decomposition of at most ``max_forms`` logical forms (None for 1: no plan
    fits, since a Retrieval needs the Output after it and an Output alone refers to nothing)."""
    if max_forms < 2:
        return None
    rules = ["root ::= step1n", _TYPE, _ARITH_SEP, "deduceop ::= " + " | ".join(gbnf_literal(op) for op in DEDUCE_OPS)]
    for i in range(1, max_forms + 1):
        rules.extend(_steps(i, max_forms))
        rules.extend(_step_rules(i))
    # no quote inside the call: a pattern's "." would let the string run on past its own closing quote
    # (llama-cpp-python's converter turns it into "any character"; measured: the model wrote the next keys there)
    action = '^(Retrieval|Math|Deduce|Output)\\([^"\\n]*\\)(->[A-Za-z_][A-Za-z0-9_]*)?$'
    schema = {"type": "object", "additionalProperties": False, "required": ["steps"], "properties": {"steps": {
        "type": "array", "minItems": 1, "maxItems": max_forms, "items": {
            "type": "object", "additionalProperties": False, "required": ["step", "action"],
            "properties": {"step": {"type": "string"}, "action": {"type": "string", "pattern": action}}}}}}
    return ReplyForm("kag_thinker_plan", "\n".join(rules) + "\n", schema=schema, from_json=_plan_text)


def _plan_text(value: Any) -> str:
    """A plan in its JSON form as the ``StepN: / ActionN:`` text the parser reads."""
    return "\n".join(f"Step{i}: {s['step']}\nAction{i}: {s['action']}" for i, s in enumerate(value["steps"], start=1))


@functools.lru_cache(maxsize=32)
def focus_form(index: int) -> ReplyForm:
    """The form of a depth turn on sub-question ``index``: ``<focus>...</focus>``, then ``<answer>...</answer>``
    or the next search as ``Step: ... / Action: Retrieval(...)`` (references to earlier steps only)."""
    rules = [
        "root ::= \"<focus>\" ( filled [^<]* )? \"</focus>\\n\" ( \"<answer>\" filled [^<]* \"</answer>\" | \"Step: \" "
        f"text{index} \"\\nAction: \" retrieval{index}n )",
        # what a filled-in tag begins with: not the prompt's "..." (the 1.5B copied "<focus>...</focus>
        # <answer>...</answer>" from the prompt on every retry: 1 of 30 trainval runs, 3 of 30 in another)
        "filled ::= [^<. \\n\\t]",
        _TYPE, _ARITH_SEP, *_step_rules(index),
    ]
    schema = {"type": "object", "additionalProperties": False, "required": ["focus", "answer", "step", "action"],
              "properties": {"focus": {"type": "string"}, "answer": {"type": "string"},
                             "step": {"type": "string"}, "action": {"type": "string"}}}
    return ReplyForm("kag_thinker_focus", "\n".join(rules) + "\n", schema=schema, from_json=_focus_text)


def _focus_text(value: Any) -> str:
    """A focus reply in its JSON form as text: the answer when there is one, else the next step."""
    head = f"<focus>{value['focus']}</focus>\n"
    if str(value.get("answer") or "").strip():
        return head + f"<answer>{value['answer']}</answer>"
    return head + f"Step: {value['step']}\nAction: {value['action']}"


def _tagged_text(tag: str) -> Any:
    return lambda value: f"<{tag}>{value[tag]}</{tag}>"


#: a deduction: free reasoning (no tags), then its conclusion in <answer>...</answer>
DEDUCE_FORM = ReplyForm(
    "kag_thinker_deduce", 'root ::= [^<]* "<answer>" [^<]+ "</answer>"\n',
    schema={"type": "object", "additionalProperties": False, "required": ["answer"],
            "properties": {"answer": {"type": "string"}}}, from_json=_tagged_text("answer"))

#: a Math expression: numbers, operators, parentheses, the evaluator's functions and #n references
MATH_FORM = ReplyForm(
    "kag_thinker_math",
    f'root ::= "<expression>" arithsep? term ( arithsep term ){{0,{MAX_TERMS - 1}}} arithsep? "</expression>"\n'
    'term ::= [0-9.]+ | "#" [0-9]+\n' + _ARITH_SEP + "\n",
    schema={"type": "object", "additionalProperties": False, "required": ["expression"],
            "properties": {"expression": {"type": "string"}}}, from_json=_tagged_text("expression"))


@functools.lru_cache(maxsize=32)
def answer_choice_form(choices: tuple[str, ...]) -> ReplyForm:
    """Free reasoning (no tags), then the final answer as exactly one of the allowed ``choices`` in
    <answer>...</answer> (in JSON: ``reasoning``, at most 400 characters, then ``answer``)."""
    grammar = 'root ::= [^<]* "<answer>" ( ' + " | ".join(gbnf_literal(c) for c in choices) + ' ) "</answer>"\n'
    schema = {"type": "object", "additionalProperties": False, "required": ["reasoning", "answer"],
              "properties": {"reasoning": {"type": "string", "maxLength": 400},
                             "answer": {"type": "string", "enum": list(choices)}}}
    return ReplyForm("kag_thinker_answer", grammar, schema=schema, from_json=_reasoned_answer)


def _reasoned_answer(value: Any) -> str:
    return f"{value.get('reasoning') or ''}\n<answer>{value['answer']}</answer>".lstrip()

