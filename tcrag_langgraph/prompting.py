"""Build the TC-RAG system prompt (paper appendix 8.6) from the template files in ``prompts/``."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from string import Template
from typing import Sequence

from langchain_core.tools import BaseTool

__all__ = ["system_prompt", "load_prompt_file"]


@lru_cache(maxsize=16)
def load_prompt_file(name: str) -> str:
    """Text of a packaged prompt file (``tcrag_langgraph.prompts``)."""
    return resources.files("tcrag_langgraph.prompts").joinpath(name).read_text(encoding="utf-8")


def system_prompt(tools: Sequence[BaseTool], allowed_actions: Sequence[str], *, language: str = "en") -> str:
    """The system prompt offering exactly ``allowed_actions`` and describing ``tools``."""
    names = ", ".join(t.name for t in tools)
    if tools:
        descriptions = "\n".join(f"{t.name}: {' '.join((t.description or '').split())}" for t in tools)
    else:
        descriptions = "(no tools in this run: answer from your own knowledge)" if language == "en" else "（本次没有可用工具：请根据自己的知识回答）"
    lines = json.loads(load_prompt_file(f"actions_{language}.json"))
    action_lines = "\n".join(Template(lines[a]).safe_substitute(tool_names=names) for a in allowed_actions)
    return Template(load_prompt_file(f"tcrag_{language}.txt")).safe_substitute(
        tool_descriptions=descriptions, action_lines=action_lines
    )
