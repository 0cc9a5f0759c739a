"""What ``tcrag serve`` accepts from a request before LangServe or the agent see it.

* :func:`input_problem`: the shape of ``input`` (``/invoke``, ``/stream``, ``/stream_log``,
  ``/stream_events``) and of every item of ``inputs`` (``/batch``): a chat input
  ``{"messages": [...]}`` whose messages each name a known ``type`` and hold text (a string, or a
  list of parts where a ``text`` part's ``text`` is a string). Anything
  else is a 422 with the reason, instead of an exception inside LangServe (a 500 that also reset the
  keep-alive connection).
* :class:`ServeCaps`: the operator's caps on the options a client may set per request that cost
  server time (``max_steps``, ``max_new_tokens``, ``max_question_chars``, ``max_format_retries``,
  ``tool_timeout_s``, ``max_observation_tokens``, the size of ``answer_format``) and on the inputs of
  one ``/batch``. They come from the server's configuration (``create_app(caps=...)``,
  ``tcrag serve --cap-...``), never from a request; a request over a cap is a 422 naming the cap.
* :class:`RunLimits`: the operator's bounds on load: runs at once, the queue before them (first come
  first served), the longest wait in it (beyond either: 503 with ``Retry-After``), and how long a run
  waits for a client that stopped reading its response (``tcrag serve --max-concurrent-runs ...``;
  enforced by :class:`~tcrag_langgraph.faces.serve_gate.RunGate`).
* :func:`recursion_limit_for`: the LangGraph ``recursion_limit`` a served run gets. LangServe runs
  every request with LangChain's default of 25 super-steps, which a run of 12 actions (the default
  ``max_steps``) already exceeds; the limit given here is above the longest run any valid
  :class:`~tcrag_langgraph.core.config.TCRAGConfig` allows, so every run ends by the graph's own halt
  (``max_steps``, a validated Conclusion, a format error), never by the recursion limit.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ServeCaps", "RunLimits", "input_problem", "caps_problem", "recursion_limit_for", "MESSAGE_TYPES", "RUN_PATHS"]

#: Message ``type`` values LangChain's message union accepts.
MESSAGE_TYPES = frozenset({"human", "ai", "system", "tool", "function", "chat", "AIMessageChunk",
                           "HumanMessageChunk", "SystemMessageChunk", "ToolMessageChunk", "FunctionMessageChunk",
                           "ChatMessageChunk"})
#: The LangServe routes (under the app's path) whose body carries ``input``; ``batch`` carries ``inputs``.
RUN_PATHS = ("invoke", "stream", "stream_log", "stream_events")


class ServeCaps(BaseModel):
    """The operator's caps on per-request cost options (server configuration, never a request).

    Example:
        >>> caps = ServeCaps(max_steps=20)
        >>> caps_problem({"max_steps": 30}, caps)
        'max_steps 30 is over the cap of this server (20; set by its operator)'
        >>> caps_problem({"max_steps": 20, "answer_format": ["yes", "no"]}, caps) is None
        True
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int = Field(default=50, ge=1, le=1000, description="Largest max_steps a request may ask for.")
    max_new_tokens: int = Field(default=1024, ge=1, le=8192, description="Largest max_new_tokens a request may ask for.")
    max_question_chars: int = Field(default=20_000, ge=1, le=10_000_000,
                                    description="Largest max_question_chars a request may ask for.")
    answer_format_items: int = Field(default=64, ge=1, le=10_000, description="Most allowed answers in answer_format.")
    answer_format_chars: int = Field(default=4_000, ge=1, le=1_000_000,
                                     description="Most characters in all of answer_format's answers together.")
    max_format_retries: int = Field(default=5, ge=0, le=20, description="Largest max_format_retries a request may ask for.")
    tool_timeout_s: float = Field(default=120.0, gt=0, le=3600, description="Largest tool_timeout_s a request may ask for.")
    max_observation_tokens: int = Field(default=4096, ge=16, le=100_000,
                                        description="Largest max_observation_tokens a request may ask for.")
    batch_inputs: int = Field(default=8, ge=1, le=1000, description="Most inputs one /batch request may hold.")


class RunLimits(BaseModel):
    """The operator's bounds on load (server configuration; one ``tcrag serve --NAME`` flag per field).

    A request to a run route (``/invoke``, ``/batch``, ``/stream``, ``/stream_log``, ``/stream_events``)
    runs when fewer than ``max_concurrent_runs`` runs are going (a ``/batch`` is one run: its inputs
    share the model anyway); else it waits in a queue, first come first served. A request that finds
    ``max_queue`` requests waiting, or that waited ``max_queue_wait_s``, gets 503 with ``Retry-After``.

    Example:
        >>> RunLimits().max_concurrent_runs, RunLimits().max_queue
        (1, 8)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrent_runs: int = Field(
        default=1, ge=1, le=256, description="Runs at once (a /batch is one run). 1 suits a local model, which "
        "decodes one reply at a time anyway; more suits a served model.")
    max_queue: int = Field(default=8, ge=0, le=10_000,
                           description="Requests that may wait for a run, first come first served; one more gets "
                           "503 with Retry-After.")
    max_queue_wait_s: float = Field(default=120.0, gt=0, le=86_400,
                                    description="Longest wait in the queue (seconds); then 503 with Retry-After.")
    stream_stall_s: float = Field(
        default=30.0, gt=0, le=3_600, description="How long a run waits for a client that stopped reading its "
        "response (seconds); then the run is cancelled and the connection closed.")


def caps_problem(options: dict[str, Any], caps: ServeCaps) -> Optional[str]:
    """Why the (already validated) per-request ``options`` exceed ``caps``, else None."""
    for name in ("max_steps", "max_new_tokens", "max_question_chars", "max_format_retries", "tool_timeout_s",
                 "max_observation_tokens"):
        value = options.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > getattr(caps, name):
            return f"{name} {value} is over the cap of this server ({getattr(caps, name)}; set by its operator)"
    answers = options.get("answer_format")
    if isinstance(answers, (list, tuple)):
        if len(answers) > caps.answer_format_items:
            return (f"answer_format has {len(answers)} answers; this server allows at most "
                    f"{caps.answer_format_items} (set by its operator)")
        chars = sum(len(a) for a in answers if isinstance(a, str))
        if chars > caps.answer_format_chars:
            return (f"answer_format's answers hold {chars} characters; this server allows at most "
                    f"{caps.answer_format_chars} (set by its operator)")
    return None


def _content_problem(content: Any, where: str) -> Optional[str]:
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"{where}.content must be text or a list of parts, not {_kind(content)}"
    for j, part in enumerate(content):
        if isinstance(part, str):
            continue
        if not isinstance(part, dict):
            return f"{where}.content[{j}] must be text or an object, not {_kind(part)}"
        if not isinstance(part.get("type"), str):
            return f"{where}.content[{j}] needs a 'type' (e.g. \"text\")"
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            return f"{where}.content[{j}].text must be text, not {_kind(part.get('text'))}"
    return None


def _message_problem(message: Any, where: str) -> Optional[str]:
    if not isinstance(message, dict):
        return f"{where} must be a message object, not {_kind(message)}"
    kind = message.get("type")
    if kind is None:
        return f"{where} has no 'type' (one of human, ai, system, tool)"
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        return f"{where}.type {kind!r} is not a message type (one of human, ai, system, tool)"
    if "content" not in message:
        return f"{where} has no 'content'"
    problem = _content_problem(message["content"], where)
    if problem:
        return problem
    if kind == "tool" and not (isinstance(message.get("tool_call_id"), str) and message["tool_call_id"].strip()):
        return f"{where} (a tool message) needs 'tool_call_id', the id of the tool call it answers"
    if kind == "ai" and message.get("tool_calls") is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            return f"{where}.tool_calls must be a list of tool calls, not {_kind(calls)}"
        for j, call in enumerate(calls):
            if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("args"), dict)
                    and isinstance(call.get("id"), (str, type(None)))):
                return (f"{where}.tool_calls[{j}] must be an object with 'name' (text), 'args' (an object) and "
                        "'id' (text or null)")
    try:  # anything else LangChain itself would refuse to read as a message
        from langchain_core.messages import convert_to_messages

        convert_to_messages([message])
    except Exception as exc:
        return f"{where} is not a valid {kind} message: {type(exc).__name__}: {exc}"
    return None


def _one_input_problem(value: Any, where: str) -> Optional[str]:
    if not isinstance(value, dict):
        return f"{where} must be {{\"messages\": [...]}}, not {_kind(value)}"
    messages = value.get("messages")
    if not isinstance(messages, list):
        return f"{where} needs 'messages', a list of messages"
    for i, message in enumerate(messages):
        problem = _message_problem(message, f"{where}.messages[{i}]")
        if problem:
            return problem
    return None


def input_problem(route: str, body: Any, caps: Optional[ServeCaps] = None) -> Optional[str]:
    """Why a parsed request body cannot be run on ``route`` (the last path segment: ``invoke``,
    ``batch``, ...), else None. Bodies of other routes are not checked here.

    Example:
        >>> input_problem("invoke", {"input": {"messages": [{"content": "hi"}]}})
        "input.messages[0] has no 'type' (one of human, ai, system, tool)"
        >>> input_problem("batch", {"inputs": [5]})
        'inputs[0] must be {"messages": [...]}, not a number'
        >>> input_problem("invoke", {"input": {"messages": [{"type": "human", "content": "hi"}]}}) is None
        True
    """
    if not isinstance(body, dict):
        return None  # LangServe answers a non-object body with its own 422
    if route == "batch":
        inputs = body.get("inputs")
        if not isinstance(inputs, list):
            return "'inputs' must be a list of inputs"
        most = (caps or ServeCaps()).batch_inputs
        if len(inputs) > most:
            return f"'inputs' holds {len(inputs)} inputs; this server runs at most {most} per /batch (set by its operator)"
        for i, value in enumerate(inputs):
            problem = _one_input_problem(value, f"inputs[{i}]")
            if problem:
                return problem
        return None
    if route in RUN_PATHS and "input" in body:
        return _one_input_problem(body["input"], "input")
    return None


def recursion_limit_for(max_steps: int, max_format_retries: int) -> int:
    """Super-steps a run of at most ``max_steps`` actions may take, each action after at most
    ``max_format_retries`` re-prompts, plus one final Conclusion (asked for after a spent budget or
    unusable replies, with its own re-prompts), the start, a review and the halt, with room to spare.

    Example:
        >>> recursion_limit_for(12, 2) > 25
        True
    """
    per_action = max_format_retries + 2  # Generate (+ re-prompts) and the action's node
    return 2 * (4 + (max_steps + 2) * per_action)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
