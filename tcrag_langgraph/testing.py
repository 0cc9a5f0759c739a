"""Test doubles: a scripted chat model, a scripted state scorer and scripted tools.

None of these is a language model or a state monitor. They replay what a test or a demo script
wrote, so the graph, the servers and the notebooks can be exercised offline, fast and
deterministically. Used by the test suite, the notebooks' quick mode, ``tcrag serve --scripted``
and ``$TCRAG_STUDIO_SCRIPTED`` (``langgraph dev``). Importing this module does not build or load
the real agent or its model.

* :class:`ScriptedChatModel`: replies chosen from a script by what the prompt's stack shows
  (``mode="stack"``, safe under concurrency and across processes) or in call order
  (``mode="sequence"``).
* :class:`RecordingChatModel` / :func:`recording_model`: replies in call order and records every
  prompt (unit tests that assert on what the model was shown).
* :class:`ToolCallingChatModel` / :func:`tool_calling_model` / :func:`tool_call_reply`: the same for a
  model that calls tools natively (``bind_tools``, replies with ``tool_calls``), as LangChain's
  ``create_agent`` needs.
* :class:`ScriptedScorer`: the state value per scored text (exact or substring match).
* :class:`ScriptedTokenScorer`: per-word log-probabilities and entropies (the token-level scorer
  interface FLARE and DRAGIN read), each word one "token".
* :func:`scripted_tool`, :func:`scripted_components`, :func:`scripted_graph`: a whole graph from a
  script.

Script format (every key but ``replies`` optional)::

    {
      "replies": ["Thought: look up {question}",
                  "Tool_Use: DOC_RAG\\nTool_Input: {question}",
                  {"reply": "Conclusion: answer to {question}", "sleep_s": 0.5}],
      "mode": "stack",                      # or "sequence"
      "scores": {"answer to {question}": 2.0},
      "default_score": 50.0,
      "tools": {"DOC_RAG": "Scripted passage about {input}."},
      "config": {"max_steps": 8},           # TCRAGConfig fields (the graph's base config)
      "calls_log": "/tmp/calls.jsonl",      # one JSON line per model call (pid, index, question)
      "max_recorded_calls": 256,            # calls kept for inspection (null: all)
      "real_tools": false,                  # true: add the real default tools; or a list: those, in order
      "model_id": null,                     # the name stored calibrations are read under (sigma "auto")
      "token_scorer": null                  # {"default_logprob": -3.0, "logprobs": {"word": -5.0}, ...}:
    }                                       #   token log-probs instead of "scores" (FLARE, DRAGIN, ...)

A reply may carry native tool calls, ``{"reply": "", "tool_calls": [{"name": "EMR_SEARCH", "args": {...}}]}``,
for a method that binds tools (``langchain-agent``).

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
import uuid
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Optional, Union

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel, FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.tool import tool_call
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from .core.config import TCRAGConfig

__all__ = [
    "SCRIPT_ENV",
    "ScriptedReply",
    "ScriptedToolCall",
    "Script",
    "ScriptedChatModel",
    "ScriptedScorer",
    "ScriptedTokenScorer",
    "RecordingChatModel",
    "recording_model",
    "ToolCallingChatModel",
    "tool_calling_model",
    "tool_call_reply",
    "ScriptExhausted",
    "load_script",
    "scripted_tool",
    "scripted_components",
    "scripted_graph",
]

#: Environment variable naming a JSON script: selects the scripted model (testing / demo hook).
SCRIPT_ENV = "TCRAG_STUDIO_SCRIPTED"

_QUESTION_LINE = re.compile(r"^User_Query: ?(.*)$", re.MULTILINE)


class ScriptExhausted(RuntimeError):
    """Every scripted reply has been used; the graph ends the run with ``halt_reason='model_error'``."""


class ScriptedToolCall(BaseModel):
    """One native tool call a scripted reply carries."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class ScriptedReply(BaseModel):
    """One scripted model reply. ``marker`` (default: the reply's text after its ``Label:``) is what
    shows on the stack once the reply was applied; ``stack`` mode uses it to find its place."""

    model_config = ConfigDict(extra="forbid")

    reply: str
    marker: Optional[str] = None
    sleep_s: float = Field(default=0.0, ge=0.0, description="Sleep before answering (to interrupt a run mid-way).")
    tool_calls: list[ScriptedToolCall] = Field(
        default_factory=list, description="Native tool calls sent with the reply, each {'name': ..., 'args': {...}} "
                                          "(for a method that binds tools, e.g. langchain-agent).")

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
    max_recorded_calls: Optional[int] = Field(
        default=256, ge=0, description="Calls the model and scorer keep for inspection (None: all); bounds a demo server.")
    real_tools: Union[bool, list[str]] = Field(
        default=False, description="Also give the agent the real default tools (EMR_SEARCH ...): all, or those named, "
                                   "in the order named.")
    model_id: Optional[str] = Field(default=None, description="The scripted model's name for stored calibrations.")
    token_scorer: Optional[dict[str, Any]] = Field(
        default=None, description="ScriptedTokenScorer arguments (logprobs, entropies, default_logprob, "
                                  "default_entropy): a monitor with token log-probs, for FLARE, DRAGIN, KAG-Thinker and "
                                  "the generation values; replaces scores/default_score.")


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
    model_id: Optional[str] = Field(default=None, description="The name its calibrations are stored under (none: "
                                                              "it cannot be named, as a stand-in should not be)")
    calls_log: Optional[str] = None
    max_recorded_calls: Optional[int] = Field(default=None, ge=0, description="Keep only the last N calls (None: all).")
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _next: int = PrivateAttr(default=0)
    _count: int = PrivateAttr(default=0)
    _calls: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "tcrag-scripted"

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Every call so far in this process: ``{"index", "question"}`` (a copy)."""
        with self._lock:
            return list(self._calls)

    @property
    def call_count(self) -> int:
        """Calls so far in this process (all of them, also when only the last few are recorded)."""
        with self._lock:
            return self._count

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
            self._count += 1
            self._calls.append({"index": index, "question": question})
            _keep_last(self._calls, self.max_recorded_calls)
            if self.calls_log:
                with open(self.calls_log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"pid": os.getpid(), "index": index, "question": question}) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
        chosen = self.replies[index]
        if chosen.sleep_s:
            time.sleep(chosen.sleep_s)
        text = chosen.reply.replace("{question}", question)
        calls = [tool_call(name=c.name, args=dict(c.args), id=f"call_{index}_{i}") for i, c in enumerate(chosen.tool_calls)]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text, tool_calls=calls))])

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedChatModel":
        """The same model: which tools it calls is in the script (replies with ``tool_calls``)."""
        return self


class ScriptedScorer:
    """State-monitor stand-in: the value scripted for a scored text, else ``default``. Thread-safe;
    every call is recorded in :attr:`calls` as ``(query, text, metric)`` (only the last
    ``max_recorded_calls`` if set).

    ``match="exact"`` (default): a key equals the text (``{question}`` in a key is replaced by the
    run's question first). ``match="substring"``: the first key (in insertion order) contained in the
    text wins.

    Example:
        >>> ScriptedScorer({"yes to {question}": 2.0}).score("q?", "yes to q?", metric="cppl")
        2.0
        >>> ScriptedScorer({"yes": 1.0}, default=9.0, match="substring").score("q", "well, yes", metric="cppl")
        1.0
    """

    def __init__(self, values: Optional[Mapping[str, float]] = None, *, default: float = 50.0,
                 match: Literal["exact", "substring"] = "exact", max_recorded_calls: Optional[int] = None) -> None:
        if match not in ("exact", "substring"):
            raise ValueError(f"match must be 'exact' or 'substring', got {match!r}")
        self.values = {str(k): float(v) for k, v in (values or {}).items()}
        self.default = float(default)
        self.match = match
        self.max_recorded_calls = max_recorded_calls
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str, str]] = []

    def score(self, query: str, text: str, *, metric: str) -> float:
        with self._lock:
            self.calls.append((query, text, metric))
            _keep_last(self.calls, self.max_recorded_calls)
        for key, value in self.values.items():
            key = key.replace("{question}", query)
            if (key == text) if self.match == "exact" else (key in text):
                return value
        return self.default


class ScriptedTokenScorer:
    """Token-level scorer stand-in: ``token_logprobs`` / ``token_stats`` / ``score`` where every
    whitespace-separated word of the scored text is one "token", its log-probability and entropy
    the values scripted for the word (lower-cased, punctuation stripped), else the defaults. Every
    call is recorded in :attr:`calls` as ``(context, text)``.

    Example:
        >>> s = ScriptedTokenScorer(logprobs={"perhaps": -2.0}, entropies={"dose": 4.0})
        >>> s.token_logprobs("Q?", "Perhaps a dose.")
        [-2.0, -0.01, -0.01]
        >>> [round(t.entropy, 2) for t in s.token_stats("Q?", "Perhaps a dose.")]
        [0.1, 0.1, 4.0]
    """

    def __init__(self, logprobs: Optional[Mapping[str, float]] = None, entropies: Optional[Mapping[str, float]] = None,
                 *, default_logprob: float = -0.01, default_entropy: float = 0.1) -> None:
        if default_logprob > 0 or any(v > 0 for v in (logprobs or {}).values()):
            raise ValueError("log-probabilities must be <= 0")
        if default_entropy < 0 or any(v < 0 for v in (entropies or {}).values()):
            raise ValueError("entropies must be >= 0")
        self.logprobs = {_word_key(k): float(v) for k, v in (logprobs or {}).items()}
        self.entropies = {_word_key(k): float(v) for k, v in (entropies or {}).items()}
        self.default_logprob = float(default_logprob)
        self.default_entropy = float(default_entropy)
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []

    def token_stats(self, context: str, text: str) -> list:
        from .monitor.scoring import TokenStat

        words = text.split()
        if not words:
            raise ValueError("nothing to score: the text has no tokens")
        with self._lock:
            self.calls.append((context, text))
        # a word after the first carries its leading blank, as a real tokenizer's pieces do
        return [TokenStat((" " if i else "") + w, self.logprobs.get(_word_key(w), self.default_logprob),
                          self.entropies.get(_word_key(w), self.default_entropy)) for i, w in enumerate(words)]

    def token_logprobs(self, context: str, text: str) -> list[float]:
        return [t.logprob for t in self.token_stats(context, text)]

    def score(self, query: str, text: str, *, metric: str) -> float:
        from .monitor.state_values import token_logprobs_to_metric

        return token_logprobs_to_metric(self.token_logprobs(query, text), metric)


def _word_key(word: str) -> str:
    return re.sub(r"^\W+|\W+$", "", word.lower())


class RecordingChatModel(FakeListChatModel):
    """LangChain's ``FakeListChatModel`` (replies in call order, cycling) that also keeps every
    prompt it was sent in :attr:`seen` (one list of messages per call).

    Example:
        >>> m = recording_model(["Conclusion: yes"])
        >>> m.invoke("hi").content, len(m.seen)
        ('Conclusion: yes', 1)
    """

    seen: list = []

    def _call(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(list(messages))
        return super()._call(messages, stop=stop, run_manager=run_manager, **kwargs)


def recording_model(responses: Iterable[str]) -> RecordingChatModel:
    """A :class:`RecordingChatModel` replying ``responses`` in order, with an empty record."""
    return RecordingChatModel(responses=list(responses), seen=[])


class ToolCallingChatModel(FakeMessagesListChatModel):
    """LangChain's ``FakeMessagesListChatModel`` (scripted messages in call order, cycling) with tool
    calling: ``bind_tools`` binds the tools' schemas (as a provider model does) and records their names
    in :attr:`bound`; every prompt is kept in :attr:`seen`. Each reply is a fresh copy of its scripted
    message, so a call's id is not shared between runs' states.

    Example:
        >>> m = tool_calling_model([tool_call_reply("DOC_RAG", query="scurvy"), "Vitamin C."])
        >>> bound = m.bind_tools([scripted_tool("DOC_RAG", "x")])
        >>> [c["name"] for c in bound.invoke("What treats scurvy?").tool_calls], m.bound
        (['DOC_RAG'], [['DOC_RAG']])
        >>> bound.invoke("and then?").content
        'Vitamin C.'
    """

    seen: list = Field(default_factory=list)
    bound: list = Field(default_factory=list)

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        from langchain_core.utils.function_calling import convert_to_openai_tool

        schemas = [convert_to_openai_tool(t) for t in tools]
        self.bound.append([s["function"]["name"] for s in schemas])
        return self.bind(tools=schemas, **({"tool_choice": tool_choice} if tool_choice is not None else {}), **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        result = super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        reply = result.generations[0].message.model_copy(deep=True)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def tool_call_reply(name: str, content: str = "", **args: Any) -> AIMessage:
    """A scripted reply calling tool ``name`` with keyword arguments ``args`` (a call id of its own)."""
    return AIMessage(content=content, tool_calls=[tool_call(name=name, args=args, id=f"call_{uuid.uuid4().hex[:12]}")])


def tool_calling_model(replies: Iterable[Union[str, AIMessage]]) -> ToolCallingChatModel:
    """A :class:`ToolCallingChatModel` replying ``replies`` in order (a string is a reply without calls)."""
    return ToolCallingChatModel(responses=[r if isinstance(r, AIMessage) else AIMessage(content=r) for r in replies])


def _keep_last(records: list, limit: Optional[int]) -> None:
    """Drop the oldest records beyond ``limit`` (a long-running demo server must not grow)."""
    if limit is not None and len(records) > limit:
        del records[: len(records) - limit]


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


def scripted_tool(name: str, template: str) -> BaseTool:
    """A LangChain tool named ``name`` returning ``template`` with ``{input}`` replaced by its input."""

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
    tools = [scripted_tool(n, t) for n, t in script.tools.items()]
    if script.real_tools:
        from .tools import default_tools

        real = {t.name: t for t in default_tools()}
        names = list(real) if script.real_tools is True else script.real_tools
        unknown = [n for n in names if n not in real]
        if unknown:
            raise ValueError(f"real_tools names {unknown}; the default tools are {list(real)}")
        tools.extend(real[n] for n in names)
    try:
        scorer = (ScriptedTokenScorer(**script.token_scorer) if script.token_scorer is not None
                  else ScriptedScorer(script.scores, default=script.default_score,
                                      max_recorded_calls=script.max_recorded_calls))
    except TypeError as exc:  # an unknown key in token_scorer
        raise ValueError(f"token_scorer: {exc}") from None
    return {
        "model": ScriptedChatModel(replies=script.replies, mode=script.mode, model_id=script.model_id,
                                   calls_log=script.calls_log, max_recorded_calls=script.max_recorded_calls),
        "scorer": scorer,
        "tools": tools,
        "config": TCRAGConfig.model_validate(script.config),
    }


def scripted_graph(source: Union[str, os.PathLike[str], Mapping[str, Any], Script], *, checkpointer: Any = None,
                   name: str = "tcrag", tools: Optional[Iterable[BaseTool]] = None, **build_options: Any):
    """The TC-RAG graph over the scripted model, scorer and tools of ``source``.

    ``tools`` (real LangChain tools, e.g. EMR_SEARCH) are given to the agent besides the script's
    own; other keyword arguments go to :func:`~tcrag_langgraph.methods.tcrag.graph.build_graph`.
    """
    from .methods.tcrag.graph import build_graph

    components = scripted_components(source)
    components["tools"] = [*components["tools"], *(tools or [])]
    return build_graph(**components, checkpointer=checkpointer, name=name, **build_options)
