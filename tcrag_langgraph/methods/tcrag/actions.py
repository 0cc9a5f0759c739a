"""Action grammar and format repair: raw model text -> one typed TC-RAG action.

Small and large models rarely write the format exactly. :func:`parse_action` accepts case
variants, missing or full-width colons, markdown, extra prose around the action, several actions
in one output, tool names with stray characters or small typos, JSON or plain tool input, and
drops any ``Observation:`` the model invented (observations only ever come from real tool calls).
When nothing usable is found it raises :class:`ActionParseError`, whose message is written for the
model, so the graph can re-prompt with it.

Example:
    >>> a = parse_action("**thought**： I should look this up", ["DOC_RAG"])
    >>> a.action.value, a.content
    ('Thought', 'I should look this up')
    >>> a = parse_action('Tool_Use: doc-rag\\nTool_Input: {"query": "aspirin"}', ["DOC_RAG"])
    >>> a.tool, a.tool_input
    ('DOC_RAG', {'query': 'aspirin'})
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from ...core.names import nearest_name
from ...core.state import TOOL_OUTPUT_CLOSE, TOOL_OUTPUT_OPEN, TOOL_OUTPUT_QUOTE, Action
from .state import ParsedAction

__all__ = ["ParsedAction", "ActionParseError", "parse_action", "format_instructions"]


class ActionParseError(ValueError):
    """The model output holds no usable action. ``str(err)`` is a message for the model."""



# Label spellings (normalised: lower case, "_" for any run of space/underscore/hyphen) -> role.
# "input", "observation" and "query" are roles of their own, not actions.
_LABELS: dict[str, str] = {
    "thought": "Thought", "thoughts": "Thought", "thinking": "Thought",
    "plan": "Plan", "planning": "Plan",
    "tool_use": "Tool_Use", "tooluse": "Tool_Use", "action": "Tool_Use", "tool": "Tool_Use",
    "tool_input": "input", "toolinput": "input", "action_input": "input", "input": "input",
    "summary": "Summary", "summarize": "Summary", "summarise": "Summary",
    "backtrack": "Backtrack", "back_track": "Backtrack", "backtracking": "Backtrack",
    "conclusion": "Conclusion", "final_answer": "Conclusion", "answer": "Conclusion",
    "tool_observation": "observation", "observation": "observation", "tool_error": "observation",
    "user_query": "query", "question": "query",
    # Chinese prompt variant.
    "思考": "Thought", "计划": "Plan", "工具使用": "Tool_Use", "工具输入": "input", "总结": "Summary",
    "回溯": "Backtrack", "结论": "Conclusion", "工具观察": "observation", "观察": "observation",
}
# Labels safe to recognise without a colon (at the start of a line only).
_BARE_OK = {"thought", "plan", "tool_use", "summary", "backtrack", "conclusion", "final_answer"}
# Labels recognised in the middle of a line (with a colon), as in "... Conclusion: B".
_INLINE_OK = {
    "thought", "plan", "tool_use", "tool_input", "action_input", "summary", "backtrack",
    "conclusion", "final_answer", "answer", "tool_observation", "observation", "tool_error",
    "思考", "计划", "工具使用", "工具输入", "总结", "回溯", "结论", "工具观察", "观察",
}

_ALT = "|".join(sorted((re.escape(k).replace("_", r"[ _\-]?") for k in _LABELS), key=len, reverse=True))
_LINE_LABEL = re.compile(
    r"^[ \t>#*\-•\d.)\[]*\**[ \t]*(?P<label>" + _ALT + r")[ \t]*\**[ \t]*\]?[ \t]*(?P<sep>[:=]|-(?=\s))?[ \t]*\**",
    re.IGNORECASE | re.MULTILINE,
)
_INLINE_LABEL = re.compile(r"(?<![\w])\**(?P<label>" + _ALT + r")\**[ \t]*(?P<sep>:)", re.IGNORECASE)
_ACTION_ROLES = {a.value for a in Action if a is not Action.USER_QUERY}



def _key(label: str) -> str:
    return re.sub(r"[\s_\-]+", "_", label.strip().lower())


def _role(label: str) -> Optional[str]:
    return _LABELS.get(_key(label))


@dataclass
class _Segment:
    role: str
    label: str
    start: int
    body_start: int
    end: int = 0
    text: str = ""


def _find_segments(text: str) -> list[_Segment]:
    hits: dict[int, _Segment] = {}
    for m in _LINE_LABEL.finditer(text):
        label = m.group("label")
        role = _role(label)
        if role is None:
            continue
        if m.group("sep") is None and not _bare_label_ok(text, m):
            continue
        hits[m.start("label")] = _Segment(role, label, m.start(), m.end())
    for m in _INLINE_LABEL.finditer(text):
        if m.start("label") in hits:
            continue
        if _key(m.group("label")) not in _INLINE_OK:
            continue
        role = _role(m.group("label"))
        if role is None:
            continue
        # Skip if it lies inside an already-found segment header.
        if any(s.start <= m.start() < s.body_start for s in hits.values()):
            continue
        hits[m.start("label")] = _Segment(role, m.group("label"), m.start(), m.end())
    segments = [hits[k] for k in sorted(hits)]
    for i, seg in enumerate(segments):
        seg.end = segments[i + 1].start if i + 1 < len(segments) else len(text)
        seg.text = _clean(text[seg.body_start: seg.end])
    return segments


def _bare_label_ok(text: str, m: re.Match[str]) -> bool:
    """A label without a colon counts only if unambiguous, a whole word, and followed by text."""
    if _key(m.group("label")) not in _BARE_OK:
        return False
    after = text[m.end("label"):]
    if _key(m.group("label")) == "backtrack" and not after.strip(" \t\n*."):
        return True  # Backtrack needs no text
    if not after or not (after[0].isspace() or after[0] == "*"):
        return False
    line, _, below = after.partition("\n")
    if line.strip(" \t*#"):
        return True
    # A heading such as "### Plan" followed by its text on the next line.
    return bool(below.strip())


def _is_prose(text: str) -> bool:
    """Readable text: three or more words, or a short CJK sentence."""
    words = re.findall(r"[^\W\d_]{2,}", text)
    cjk = re.findall(r"[\u4e00-\u9fff]", text)
    return len(words) >= 3 or len(cjk) >= 4


def _clean(body: str) -> str:
    body = body.strip()
    body = re.sub(r"^[*_`\s]+|[*_`\s]+$", "", body) if body.strip("*_` \n\t") else ""
    return body.strip()


_FENCED_OUTPUT = re.compile(re.escape(TOOL_OUTPUT_OPEN) + r".*?(?:" + re.escape(TOOL_OUTPUT_CLOSE) + r"|\Z)", re.DOTALL)
_QUOTED_LINE = re.compile(r"^[ \t]*" + re.escape(TOOL_OUTPUT_QUOTE.strip()) + r".*$\n?", re.MULTILINE)


def _normalise(text: Any) -> str:
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    # NULs and other C0 controls (except newline/tab) are never meaningful in an action.
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", " ", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("：", ":")
    # Code fences around the whole answer.
    text = re.sub(r"```[a-zA-Z]*\n?", "\n", text)
    # Tool output the model copied: never a source of actions (it is data, not the model's words).
    text = _FENCED_OUTPUT.sub("\n", text)
    text = _QUOTED_LINE.sub("", text)
    return text


def _norm_name(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "", name.lower())


def _resolve_tool(raw: str, tool_names: Sequence[str]) -> tuple[Optional[str], str, list[str]]:
    """Return (tool name or None, leftover text on the line, repairs)."""
    repairs: list[str] = []
    if not tool_names:
        return None, raw, repairs
    by_norm = {_norm_name(n): n for n in tool_names}
    first_line = raw.split("\n", 1)[0].strip()
    # Exact (normalised) match of a leading token: DOC_RAG, `doc_rag`, [DOC-RAG], DOC_RAG[query]
    m = re.match(r"^[\s\[\(`'\"*<]*([A-Za-z0-9_\-\. ]+?)[\]\)`'\"*>]*\s*(?:$|[\[\(:{]|\s)", first_line)
    candidates: list[str] = []
    if m:
        candidates.append(m.group(1))
    candidates.extend(re.findall(r"[A-Za-z][A-Za-z0-9_\-]*", first_line))
    for cand in candidates:
        norm = _norm_name(cand)
        if norm in by_norm:
            name = by_norm[norm]
            if cand != name:
                repairs.append(f"tool name {cand!r} read as {name!r}")
            leftover = first_line[first_line.find(cand) + len(cand):]
            return name, leftover, repairs
    for cand in candidates:
        close = nearest_name(_norm_name(cand), list(by_norm))
        if close is not None:
            name = by_norm[close]
            repairs.append(f"tool name {cand!r} matched to {name!r}")
            leftover = first_line[first_line.find(cand) + len(cand):]
            return name, leftover, repairs
    return None, first_line, repairs


def _parse_tool_input(raw: str) -> Any:
    """JSON object/list if it looks like one (tolerating single quotes), else plain text."""
    s = raw.strip()
    # DOC_RAG[query] / DOC_RAG(query): the brackets are syntax, not input.
    if len(s) >= 2 and (s[0], s[-1]) in {("[", "]"), ("(", ")")} and not s.startswith("[{"):
        s = s[1:-1].strip()
    if s.startswith("{") or s.startswith("[{"):
        for loader in (json.loads, ast.literal_eval):
            try:
                value = loader(s)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, (dict, list)):
                return value
    # Strip matching quotes/backticks around plain text.
    while len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'`":
        s = s[1:-1].strip()
    return s


def _tool_from_json(body: str, tool_names: Sequence[str]) -> Optional[tuple[str, Any]]:
    s = body.strip()
    if not s.startswith("{"):
        return None
    value = _parse_tool_input(s)
    if not isinstance(value, dict):
        return None
    name = value.get("tool") or value.get("name") or value.get("tool_name") or value.get("action")
    if not isinstance(name, str):
        return None
    resolved, _, _ = _resolve_tool(name, tool_names)
    if resolved is None:
        return None
    args = None
    for key in ("input", "tool_input", "arguments", "args", "query", "action_input", "parameters"):
        if key in value:
            args = value[key]
            break
    if isinstance(args, str) and args.strip().startswith("{"):
        args = _parse_tool_input(args)
    return resolved, args


def parse_action(
    text: Any,
    tool_names: Iterable[str] = (),
    *,
    allowed: Optional[Iterable[str]] = None,
    unlabeled_as: Optional[str] = None,
) -> ParsedAction:
    """Turn raw model output into exactly one action, or raise :class:`ActionParseError`.

    ``allowed`` restricts the actions (e.g. without Backtrack in an ablation); by default every
    action is allowed, and Tool_Use only when ``tool_names`` is non-empty. ``unlabeled_as="Thought"``
    reads readable prose with no label at all as that action (small models often drop the label)
    instead of rejecting it.
    Never raises anything but :class:`ActionParseError`.
    """
    try:
        return _parse(text, list(tool_names), allowed, unlabeled_as)
    except ActionParseError:
        raise
    except Exception as exc:  # defensive: any bug here must not crash a run
        raise ActionParseError(f"could not read an action from your reply ({type(exc).__name__})") from exc


def _parse(text: Any, tool_names: list[str], allowed: Optional[Iterable[str]], unlabeled_as: Optional[str]) -> ParsedAction:
    allowed_set = set(allowed) if allowed is not None else set(_ACTION_ROLES)
    if not tool_names:
        allowed_set.discard("Tool_Use")
    src = _normalise(text)
    if not src.strip():
        raise ActionParseError("your reply was empty")
    repairs: list[str] = []
    segments = _find_segments(src)
    # Everything from an invented observation onwards is the model talking to itself.
    for i, seg in enumerate(segments):
        if seg.role == "observation":
            repairs.append("dropped an observation the model wrote itself")
            segments = segments[:i]
            break
    actions = [s for s in segments if s.role in _ACTION_ROLES]
    if not actions:
        json_tool = _tool_from_json(src, tool_names) if "Tool_Use" in allowed_set else None
        if json_tool:
            return ParsedAction(Action.TOOL_USE, tool=json_tool[0], tool_input=json_tool[1], repairs=("read a JSON tool call",))
        prose = _clean(src[: segments[0].start] if segments else src)
        if unlabeled_as in allowed_set and _is_prose(prose):
            return ParsedAction(Action(unlabeled_as), content=prose, repairs=(f"unlabeled text read as a {unlabeled_as}",))
        raise ActionParseError(
            "no action label found; start your reply with one of: "
            + ", ".join(f"'{a}:'" for a in _ordered(allowed_set))
        )
    # An empty label followed by a real action ("Thought:\nThought: ...", "Tool_Use: Conclusion: B") is a
    # stutter, not an action.
    filled = [s for s in actions if _has_body(s)]
    if filled and filled[0] is not actions[0]:
        repairs.append("skipped an empty action label")
        actions = filled
    chosen = actions[0]
    # The paper's prompt ends with "Thought: I now know the final answer. Conclusion: ...".
    if chosen.role == "Thought":
        later = [s for s in actions[1:] if s.role == "Conclusion" and s.text]
        if later and "Conclusion" in allowed_set:
            chosen = later[0]
            repairs.append("took the Conclusion that followed the Thought")
    if len(actions) > 1:
        repairs.append(f"used the first of {len(actions)} actions")
    if chosen.role == "Tool_Use":
        named = _action_named_as_tool(chosen, tool_names)
        if named is not None:
            repairs.append(f"'Tool_Use: {named.role}' read as the {named.role} action")
            chosen = named
    role = chosen.role
    if role not in allowed_set:
        # "Tool_Use: Isotretinoin\nSummary: Isotretinoin ..." with no tools: the action that cannot run is
        # dropped and the next one that can is taken (the 0.5B's reasoning was otherwise lost).
        later = [s for s in actions[actions.index(chosen) + 1:] if s.role in allowed_set and _has_body(s)]
        if later:
            repairs.append(f"{role} is not available in this run: took the {later[0].role} that followed")
            chosen, role = later[0], later[0].role
    if role not in allowed_set:
        if role == "Tool_Use" and not tool_names:
            raise ActionParseError("no tools are available in this run; do not use Tool_Use")
        raise ActionParseError(
            f"{role} is not available in this run; use one of: " + ", ".join(_ordered(allowed_set))
        )
    action = Action(role)
    if action is Action.TOOL_USE:
        return _tool_action(chosen, segments, tool_names, repairs)
    content = chosen.text
    if action is not Action.BACKTRACK and not content:
        raise ActionParseError(f"your {role} was empty; write its text after '{role}:'")
    return ParsedAction(action, content=content, repairs=tuple(repairs))


def _has_body(segment: _Segment) -> bool:
    """Whether an action segment is a real action: it has text, or it is a Backtrack (which needs none)."""
    return bool(segment.text) or segment.role == "Backtrack"


def _action_named_as_tool(chosen: _Segment, tool_names: list[str]) -> Optional[_Segment]:
    """"Tool_Use: Backtrack": one of the machine's own actions written as a tool (Qwen2.5-Coder-0.5B
    wrote it on closed-book MedMCQA questions with no tools), as that action, its text the rest of the
    line; None when the word is not an action or is one of the run's tools."""
    m = re.match(r"\s*[`'\"*\[(]*([^\W\d][\w\- ]*?)[`'\"*\])]*\s*(?:[:=\-]\s*|$|\s)(.*)", chosen.text, re.DOTALL)
    if not m:
        return None
    word, rest = m.group(1), m.group(2)
    role = _role(word)
    if role not in _ACTION_ROLES or role == "Tool_Use" or _norm_name(word) in {_norm_name(t) for t in tool_names}:
        return None
    return _Segment(role=role, label=word, start=chosen.start, body_start=chosen.body_start, end=chosen.end,
                    text=rest.strip())


def _tool_action(chosen: _Segment, segments: list[_Segment], tool_names: list[str], repairs: list[str]) -> ParsedAction:
    body = chosen.text
    json_tool = _tool_from_json(body, tool_names)
    if json_tool:
        return ParsedAction(Action.TOOL_USE, content=body, tool=json_tool[0], tool_input=json_tool[1], repairs=tuple(repairs))
    name, leftover, name_repairs = _resolve_tool(body, tool_names)
    repairs.extend(name_repairs)
    if name is None:
        shown = body.split("\n", 1)[0][:80]
        raise ActionParseError(
            f"unknown tool {shown!r}; Tool_Use must name exactly one of: {', '.join(tool_names)}"
        )
    tool_input: Any = None
    idx = segments.index(chosen)
    following = segments[idx + 1] if idx + 1 < len(segments) else None
    if following is not None and following.role == "input" and following.text:
        tool_input = _parse_tool_input(following.text)
    else:
        rest = leftover.strip()
        rest = re.sub(r"^[\]\)`'\"*>]+", "", rest).strip()
        rest = re.sub(r"^(?:with|using|for|on|:|-|=)\s*", "", rest, flags=re.IGNORECASE).strip()
        if not rest:
            lines = body.split("\n", 1)
            rest = lines[1].strip() if len(lines) > 1 else ""
        if rest:
            tool_input = _parse_tool_input(rest)
            repairs.append("read the tool input from the Tool_Use line")
    if isinstance(tool_input, str) and not tool_input.strip():
        tool_input = None
    return ParsedAction(Action.TOOL_USE, content=body, tool=name, tool_input=tool_input, repairs=tuple(repairs))


_ORDER = ["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion"]


def _ordered(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [n for n in _ORDER if n in names]


def format_instructions(allowed: Iterable[str], tool_names: Sequence[str]) -> str:
    """The reminder sent back to the model after an unusable reply."""
    parts = []
    for name in _ordered(allowed):
        if name == "Tool_Use":
            parts.append(f"Tool_Use: <one of {', '.join(tool_names)}>\nTool_Input: <what to search for>")
        elif name == "Backtrack":
            parts.append("Backtrack: <why the last step was useless>")
        else:
            parts.append(f"{name}: <text>")
    return "Reply with exactly ONE action, in one of these forms:\n" + "\n".join(parts)
