"""Where a method's tokens go, per question (``tcrag summarize``, ``tcrag eval``).

A run of the stack machine splits the prompt tokens of its model calls (``token_usage`` of its
result, counted with the package's tokenizer, :func:`~tcrag_langgraph.tools.tokens.count_tokens`)
into the fixed prefix (system prompt and demonstrations), the stack, and the re-prompts after
unusable replies, and marks the completions it wasted: Conclusions the state monitor rejected, tool
calls refused as repeats, replies that could not be used. ``cacheable`` is the prefix of every call
after a run's first, what a provider's prompt cache could serve (a provider still bills it, at a
discount where it offers one). Other methods report prompt and completion only.

Example:
    >>> rows = [{"method": "tcrag-cppl", "token_split": {"prompt": 900, "completion": 60, "prompt_prefix": 600,
    ...          "prompt_stack": 250, "prompt_reprompt": 50, "completion_rejected": 10, "prompt_cacheable": 300}},
    ...         {"method": "react", "token_split": {"prompt": 300, "completion": 20}}]
    >>> split = token_split(rows)
    >>> split["tcrag-cppl"]["prompt_prefix"], split["react"]["prompt_prefix"]
    (600.0, None)
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["SPLIT_FIELDS", "token_split", "token_split_markdown"]

#: (key in a run's token_usage, column heading), in the table's order
SPLIT_FIELDS = (
    ("prompt", "prompt"),
    ("prompt_prefix", "of which: system + demos"),
    ("prompt_stack", "stack"),
    ("prompt_reprompt", "re-prompts"),
    ("completion", "completion"),
    ("completion_rejected", "of which: rejected Conclusions"),
    ("completion_refused_repeat", "refused repeats"),
    ("completion_unusable", "unusable replies"),
    ("prompt_cacheable", "cacheable prefix"),
)


def token_split(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Optional[float]]]:
    """Per method, the mean of each :data:`SPLIT_FIELDS` key per question (None where the method does
    not report it); rows without a ``token_split`` (older runs) are left out."""
    by_method: dict[str, list[Mapping[str, int]]] = {}
    for row in rows:
        if isinstance(row.get("token_split"), Mapping):
            by_method.setdefault(row["method"], []).append(row["token_split"])
    out: dict[str, dict[str, Optional[float]]] = {}
    for method, splits in by_method.items():
        split_kind = any("prompt_prefix" in s for s in splits)  # a method that splits its prompt at all
        out[method] = {key: (sum(float(s.get(key, 0)) for s in splits) / len(splits)
                             if key in ("prompt", "completion") or split_kind else None)
                       for key, _ in SPLIT_FIELDS}
    return out


def token_split_markdown(split: Mapping[str, Mapping[str, Optional[float]]],
                         labels: Optional[Mapping[str, str]] = None) -> str:
    """The split as a Markdown table, one row per method (empty string when there is nothing)."""
    if not split:
        return ""
    head = "| method | " + " | ".join(title for _, title in SPLIT_FIELDS) + " |"
    lines = [head, "|" + " --- |" * (len(SPLIT_FIELDS) + 1)]
    for method, means in split.items():
        cells = ["-" if means[key] is None else f"{means[key]:,.0f}" for key, _ in SPLIT_FIELDS]
        lines.append(f"| {(labels or {}).get(method, method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
