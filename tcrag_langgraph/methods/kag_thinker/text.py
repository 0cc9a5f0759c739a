"""Text clean-up shared by the parsers of model replies: normalising, ``<think>``/``<answer>``
wrappers, ``\\boxed{...}``, tags, quotes and top-level splitting."""

from __future__ import annotations

import html
import re
from typing import Any, Optional


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
