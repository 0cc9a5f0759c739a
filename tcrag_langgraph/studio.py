"""The TC-RAG graph for LangGraph Studio / ``langgraph dev`` (see ``langgraph.json``), and the
scripted model used to demo and test servers without a real language model.

``langgraph.json`` points at :data:`graph`. It is compiled **without** a checkpointer (the LangGraph
API server refuses one and brings its own). By default it is the real agent: the packaged
SmolLM2-135M-Instruct as generator and state monitor (loaded lazily on the first run).

Testing / demo hook: if the environment variable ``TCRAG_STUDIO_SCRIPTED`` names a JSON script,
the graph instead uses :class:`ScriptedChatModel` and :class:`ScriptedScorer` built from it. That
is NOT a language model: it replays the replies written in the file, so servers can be exercised
offline, fast and deterministically. The script format (every key but ``replies`` optional)::

    {
      "replies": ["Thought: look up {question}",
                  "Tool_Use: DOC_RAG\\nTool_Input: {question}",
                  {"reply": "Conclusion: answer to {question}", "sleep_s": 0.5}],
      "mode": "stack",                      # or "sequence"
      "scores": {"answer to {question}": 2.0},
      "default_score": 50.0,
      "tools": {"DOC_RAG": "Scripted passage about {input}."},
      "config": {"max_steps": 8},           # TCRAGConfig fields (the graph's base config)
      "calls_log": "/tmp/calls.jsonl"       # one JSON line per model call (pid, index, question)
    }

``{question}`` in replies, markers and score keys is replaced by the run's question; ``{input}`` in a
tool template by the tool input.

Example:
    >>> g = scripted_graph({"replies": ["Conclusion: yes to {question}"], "default_score": 1.0})
    >>> out = g.invoke({"question": "Is water wet?"})
    >>> out["answer"], out["halt_reason"]
    ('yes to Is water wet?', 'validated')
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Union

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from tcrag_langgraph.config import TCRAGConfig
from tcrag_langgraph.graph import build_graph

__all__ = [
    "SCRIPT_ENV",
    "ScriptedReply",
    "Script",
    "ScriptedChatModel",
    "ScriptedScorer",
    "ScriptExhausted",
    "load_script",
    "scripted_components",
    "scripted_graph",
    "make_graph",
    "graph",
]

#: Environment variable naming a JSON script: selects the scripted model (testing / demo hook).
SCRIPT_ENV = "TCRAG_STUDIO_SCRIPTED"

_QUESTION_LINE = re.compile(r"^User_Query: ?(.*)$", re.MULTILINE)


class ScriptExhausted(RuntimeError):
    """Every scripted reply has been used; the graph ends the run with ``halt_reason='model_error'``."""


class ScriptedReply(BaseModel):
    """One scripted model reply. ``marker`` (default: the reply's text after its ``Label:``) is what
    shows on the stack once the reply was applied; ``stack`` mode uses it to find its place."""

    model_config = ConfigDict(extra="forbid")

    reply: str
    marker: Optional[str] = None
    sleep_s: float = Field(default=0.0, ge=0.0, description="Sleep before answering (to interrupt a run mid-way).")

    def marker_for(self, question: str) -> str:
        if self.marker is not None:
            return self.marker.replace("{question}", question)
        text = self.reply.replace("{question}", question)
        head, sep, rest = text.partition(":")
        return rest.strip() if sep else text.strip()


class Script(BaseModel):
    """A parsed script file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    replies: list[ScriptedReply] = Field(min_length=1)
    mode: Literal["stack", "sequence"] = "stack"
    scores: dict[str, float] = Field(default_factory=dict)
    default_score: float = 50.0
    tools: dict[str, str] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    calls_log: Optional[str] = None


def load_script(source: Union[str, os.PathLike[str], Mapping[str, Any], Script]) -> Script:
    """A :class:`Script` from a JSON file path, a dict or a Script.

    Example:
        >>> load_script({"replies": ["Conclusion: x"]}).mode
        'stack'
    """
    if isinstance(source, Script):
        return source
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    replies = [r if isinstance(r, Mapping) else {"reply": r} for r in data.get("replies", [])]
    return Script.model_validate({**data, "replies": replies})


class ScriptedChatModel(BaseChatModel):
    """A deterministic, thread-safe, process-independent stand-in for a chat model.

    ``mode="stack"`` (default): the reply is the first scripted reply whose marker is not yet on
    the stack shown in the prompt, so the choice depends only on the prompt. Concurrent runs and a
    run resumed in another process therefore get the right reply. It cannot script a ``Backtrack``
    (which leaves no marker); use ``mode="sequence"`` (replies in call order, one counter per
    model instance) for that.

    Example:
        >>> m = ScriptedChatModel(replies=[ScriptedReply(reply="Conclusion: {question}!")])
        >>> m.invoke([HumanMessage(content="Begin!\\nUser_Query: hi\\n\\nWrite your next action.")]).content
        'Conclusion: hi!'
    """

    replies: list[ScriptedReply]
    mode: Literal["stack", "sequence"] = "stack"
    calls_log: Optional[str] = None
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _next: int = PrivateAttr(default=0)
    _calls: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "tcrag-scripted"

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every call so far in this process: ``{"index", "question"}`` (a copy)."""
        with self._lock:
            return list(self._calls)

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        shown = _stack_text(messages)
        found = _QUESTION_LINE.search(shown)
        question = found.group(1).strip() if found else ""
        with self._lock:
            if self.mode == "sequence":
                index = self._next
                self._next += 1
            else:
                index = next((i for i, r in enumerate(self.replies) if r.marker_for(question) not in shown),
                             len(self.replies))
            if index >= len(self.replies):
                raise ScriptExhausted(f"all {len(self.replies)} scripted replies used (question {question!r})")
            self._calls.append({"index": index, "question": question})
            if self.calls_log:
                with open(self.calls_log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"pid": os.getpid(), "index": index, "question": question}) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
        chosen = self.replies[index]
        if chosen.sleep_s:
            time.sleep(chosen.sleep_s)
        text = chosen.reply.replace("{question}", question)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


class ScriptedScorer:
    """State monitor stand-in: the value scripted for a text (``{question}`` allowed in keys), else
    ``default``. Thread-safe; records calls.

    Example:
        >>> ScriptedScorer({"yes to {question}": 2.0}).score("q?", "yes to q?", metric="cppl")
        2.0
    """

    def __init__(self, values: Optional[Mapping[str, float]] = None, *, default: float = 50.0) -> None:
        self.values = dict(values or {})
        self.default = float(default)
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str, str]] = []

    def score(self, query: str, text: str, *, metric: str) -> float:
        with self._lock:
            self.calls.append((query, text, metric))
        for key, value in self.values.items():
            if key.replace("{question}", query) == text:
                return float(value)
        return self.default


def _stack_text(messages: list[BaseMessage]) -> str:
    """The user turn showing the stack (the last human message holding a ``User_Query:`` line)."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage) and isinstance(message.content, str) and _QUESTION_LINE.search(
                message.content) and message.content.startswith("Begin!"):
            return message.content
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.content if isinstance(message.content, str) else str(message.content)
    return ""


def _scripted_tool(name: str, template: str) -> BaseTool:
    def run(query: str) -> str:
        return template.replace("{input}", query)

    return StructuredTool.from_function(run, name=name, description=f"Scripted tool {name} (returns a fixed text).")


def scripted_components(source: Union[str, os.PathLike[str], Mapping[str, Any], Script]) -> dict[str, Any]:
    """``build_graph`` keyword arguments (model, scorer, tools, config) for a script.

    Example:
        >>> kw = scripted_components({"replies": ["Conclusion: x"], "tools": {"T": "t"}})
        >>> sorted(kw), [t.name for t in kw["tools"]]
        (['config', 'model', 'scorer', 'tools'], ['T'])
    """
    script = load_script(source)
    return {
        "model": ScriptedChatModel(replies=script.replies, mode=script.mode, calls_log=script.calls_log),
        "scorer": ScriptedScorer(script.scores, default=script.default_score),
        "tools": [_scripted_tool(n, t) for n, t in script.tools.items()],
        "config": TCRAGConfig.model_validate(script.config),
    }


def scripted_graph(source: Union[str, os.PathLike[str], Mapping[str, Any], Script], *, checkpointer: Any = None,
                   name: str = "tcrag"):
    """The TC-RAG graph over the scripted model, scorer and tools of ``source``."""
    return build_graph(**scripted_components(source), checkpointer=checkpointer, name=name)


def make_graph(*, script: Optional[str] = None, tools: bool = True):
    """The graph Studio serves: scripted if ``script`` (or ``$TCRAG_STUDIO_SCRIPTED``) is set, else the
    real agent (packaged local model, default tools). Never has a checkpointer."""
    script = script or os.environ.get(SCRIPT_ENV) or None
    if script:
        return scripted_graph(script)
    from .tools import default_tools

    return build_graph(tools=default_tools() if tools else [], name="tcrag")


#: The graph exported to ``langgraph.json`` (``./tcrag_langgraph/studio.py:graph``).
graph = make_graph()
