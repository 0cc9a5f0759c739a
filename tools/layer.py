"""One layer for every TC-RAG tool: input repair, validation, time limit, retries, trimming, caching.

:func:`make_tool` wraps a plain backend function into a LangChain :class:`~langchain_core.tools.BaseTool`
that never raises. On success it returns the observation text (trimmed to a token budget); on any
failure it returns a :class:`~tcrag_langgraph.tools.base.ToolError` the graph shows as an error.

The backend function receives the *validated* pydantic model of its arguments, and, if it declares
a ``config`` parameter, the call's ``RunnableConfig`` (for the caller identity). It may return a
``str`` (the observation) or a :class:`ToolError`, raise :class:`ToolFailure` to pick the error kind,
or raise one of the ``transient`` exception types to be retried with exponential backoff.

Example:
    >>> from pydantic import BaseModel
    >>> class Q(BaseModel):
    ...     query: str
    >>> echo = make_tool("ECHO", "Repeat the query.", lambda a: f"you said {a.query}", args_schema=Q)
    >>> echo.invoke("hello")
    'you said hello'
    >>> echo.invoke({"text": "hi"})          # wrong key, mapped to the only field
    'you said hi'
    >>> echo.invoke('```{"query": "x"}```')  # JSON inside a code fence
    'you said x'
    >>> echo.invoke({"query": 3, "k": 1}).kind
    'bad_input'
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from .identity import caller_from_config
from .tokens import trim_to_tokens

from .base import ToolError

__all__ = [
    "ToolFailure",
    "ToolOptions",
    "LayeredTool",
    "make_tool",
    "repair_input",
    "InputRepairError",
]

logger = logging.getLogger(__name__)

ToolFunc = Callable[..., Union[str, ToolError]]
AsyncToolFunc = Callable[..., Awaitable[Union[str, ToolError]]]


class ToolFailure(Exception):
    """Raised by a backend to choose the :class:`ToolError` kind it turns into.

    ``retryable=True`` also makes the layer retry it (like a ``transient`` exception type).

    Example:
        >>> raise ToolFailure("unavailable", "search server answered 503", retryable=True)
        Traceback (most recent call last):
        ...
        tcrag_langgraph.tools.layer.ToolFailure: search server answered 503
    """

    def __init__(self, kind: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retryable = retryable


class InputRepairError(ValueError):
    """The input could not be turned into the tool's arguments; the message tells the model why."""


class ToolOptions(BaseModel):
    """Validated options of :func:`make_tool` (all keyword-only there).

    Example:
        >>> ToolOptions(timeout_s=5, retries=1).retries
        1
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    timeout_s: float = Field(default=30.0, gt=0, le=3600, description="Wall-clock limit of one tool call, retries included.")
    retries: int = Field(default=2, ge=0, le=10, description="Extra attempts after a transient failure.")
    backoff: float = Field(default=0.5, ge=0, le=60, description="First backoff wait in seconds; doubles per retry.")
    max_backoff: float = Field(default=8.0, ge=0, le=300)
    max_output_tokens: int = Field(default=512, ge=1, le=100_000)
    cache_size: int = Field(default=0, ge=0, le=100_000, description="LRU entries of successful results; 0 = no cache.")
    transient: tuple[type[BaseException], ...] = Field(default=(ConnectionError,), description="Exception types worth a retry.")
    primary_field: Optional[str] = Field(default=None, description="Field that receives plain text input.")
    secrets: tuple[str, ...] = Field(default=(), repr=False, description="Strings scrubbed from every error message and log.")

    @field_validator("transient", mode="before")
    @classmethod
    def _exception_types(cls, value: Any) -> Any:
        if isinstance(value, type):
            value = (value,)
        value = tuple(value)
        for item in value:
            if not (isinstance(item, type) and issubclass(item, BaseException)):
                raise ValueError(f"transient must hold exception types, got {item!r}")
        return value

    @field_validator("secrets", mode="before")
    @classmethod
    def _drop_empty_secrets(cls, value: Any) -> Any:
        return tuple(s for s in (value or ()) if s)


# --------------------------------------------------------------------------- input repair

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)
_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("`", "`"), ("“", "”"), ("‘", "’"))


def _unwrap_text(text: str) -> str:
    """Strip code fences, backticks and matching outer quotes that models put around input."""
    text = text.strip()
    for _ in range(4):  # a few layers at most, e.g. "```'x'```"
        before = text
        match = _FENCE.match(text)
        if match:
            text = match.group(1).strip()
        for left, right in _QUOTE_PAIRS:
            if len(text) >= 2 and text.startswith(left) and text.endswith(right):
                text = text[len(left) : len(text) - len(right)].strip()
                break
        if text == before:
            break
    return text


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(key).lower())


def _describe_schema(schema: type[BaseModel]) -> str:
    parts = []
    for name, field in schema.model_fields.items():
        ann = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("typing.", "")
        parts.append(f"{name} ({ann}{'' if field.is_required() else ', optional'})")
    return ", ".join(parts)


def _primary(schema: type[BaseModel], primary_field: Optional[str]) -> Optional[str]:
    if primary_field:
        return primary_field
    fields = list(schema.model_fields)
    required = [n for n, f in schema.model_fields.items() if f.is_required()]
    if len(fields) == 1:
        return fields[0]
    if len(required) == 1:
        return required[0]
    return None


def repair_input(
    raw: Any,
    schema: type[BaseModel],
    *,
    primary_field: Optional[str] = None,
    text_parser: Optional[Callable[[str], Mapping[str, Any]]] = None,
) -> BaseModel:
    """Turn what a model wrote into a validated ``schema`` instance, or raise :class:`InputRepairError`.

    Repairs: plain text -> the primary field (or ``text_parser(text)``); JSON written as a string
    (also inside code fences/quotes) -> parsed; a wrong key name -> the field it matches ignoring
    case/punctuation, or the primary field when that is the only unknown key and the field is unset.

    Example:
        >>> from pydantic import BaseModel
        >>> class Q(BaseModel):
        ...     query: str
        ...     k: int = 5
        >>> repair_input('"heart failure"', Q)
        Q(query='heart failure', k=5)
        >>> repair_input({"Query": "x", "K": "3"}, Q)
        Q(query='x', k=3)
    """
    primary = _primary(schema, primary_field)
    expected = _describe_schema(schema)

    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", errors="replace")
    if isinstance(raw, str):
        text = _unwrap_text(raw)
        if not text:
            raise InputRepairError(f"empty input; expected {expected}")
        if text[0] in "{[":
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputRepairError(
                    f"input looks like JSON but does not parse ({exc.msg} at char {exc.pos}); "
                    f"write a JSON object with {expected}, or plain text"
                ) from None
            if isinstance(parsed, dict):
                raw = parsed
            elif isinstance(parsed, list) and len(parsed) == 1 and isinstance(parsed[0], dict):
                raw = parsed[0]  # "[{...}]": one call wrapped in a list
            else:
                raise InputRepairError(f"expected a JSON object with {expected}, got a JSON {type(parsed).__name__}")
        elif text_parser is not None:
            try:
                raw = dict(text_parser(text))
            except InputRepairError:
                raise
            except (ValueError, TypeError) as exc:
                raise InputRepairError(f"could not read the input: {exc}; expected {expected}") from None
        elif primary is not None:
            raw = {primary: text}
        else:
            raise InputRepairError(f"plain text is ambiguous for this tool; write a JSON object with {expected}")

    if not isinstance(raw, Mapping):
        raise InputRepairError(f"expected text or a JSON object with {expected}, got {type(raw).__name__}")

    fields = schema.model_fields
    by_norm = {_norm_key(n): n for n in fields}
    for name, field in fields.items():
        if field.alias:
            by_norm.setdefault(_norm_key(field.alias), name)
    data: dict[str, Any] = {}
    unknown: dict[str, Any] = {}
    for key, value in raw.items():
        target = key if key in fields else by_norm.get(_norm_key(key))
        if target is None or target in data:
            unknown[key] = value
        else:
            data[target] = value
    if unknown:
        if len(unknown) == 1 and primary is not None and primary not in data:
            data[primary] = next(iter(unknown.values()))
        else:
            names = ", ".join(repr(k) for k in unknown)
            raise InputRepairError(f"unknown field(s) {names}; expected {expected}")
    if primary is not None and isinstance(data.get(primary), str):
        data[primary] = _unwrap_text(data[primary])

    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'input'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise InputRepairError(f"invalid input: {problems}; expected {expected}") from None


# --------------------------------------------------------------------------- the tool


class _LRU:
    """Tiny thread-safe LRU over an OrderedDict; only successful observations go in."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Optional[str]:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class _CallTimeout(Exception):
    pass


def _takes_config(func: Callable[..., Any]) -> bool:
    try:
        return "config" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


class LayeredTool(BaseTool):
    """A LangChain tool whose every call goes through the shared layer; built by :func:`make_tool`.

    ``invoke`` returns a ``str`` or a :class:`ToolError` (never raises). Invoked with a LangChain
    ``ToolCall`` it returns a ``ToolMessage`` whose ``status`` is ``"error"`` for a ToolError, with
    the ToolError as its ``artifact``.
    """

    response_format: str = "content_and_artifact"  # artifact carries the ToolError for ToolMessages

    _func: Optional[ToolFunc] = PrivateAttr(default=None)
    _afunc: Optional[AsyncToolFunc] = PrivateAttr(default=None)
    _options: ToolOptions = PrivateAttr()
    _text_parser: Optional[Callable[[str], Mapping[str, Any]]] = PrivateAttr(default=None)
    _cache: Optional[_LRU] = PrivateAttr(default=None)

    # LangChain would validate against args_schema and raise; the layer repairs and validates itself.
    def _to_args_and_kwargs(self, tool_input: Any, tool_call_id: Optional[str]) -> tuple[tuple, dict]:
        return (tool_input,), {}

    @property
    def options(self) -> ToolOptions:
        return self._options

    @property
    def cache_info(self) -> dict[str, int]:
        return {"size": len(self._cache) if self._cache else 0, "max": self._options.cache_size}

    def clear_cache(self) -> None:
        if self._cache is not None:
            self._cache.clear()

    # -- helpers

    def _scrub(self, text: str) -> str:
        for secret in self._options.secrets:
            text = text.replace(secret, "***")
        return text

    def _error(self, kind: str, message: str, *, retryable: bool = False) -> ToolError:
        message = self._scrub(message)
        logger.info("tool %s failed: %s: %s", self.name, kind, message)
        return ToolError(tool=self.name, kind=kind, message=message, retryable=retryable)

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, ToolFailure):
            return exc.retryable
        return isinstance(exc, self._options.transient)

    def _prepare(self, tool_input: Any, config: Optional[RunnableConfig]) -> tuple[Any, Optional[str]] | ToolError:
        try:
            args = repair_input(
                tool_input, self.args_schema, primary_field=self._options.primary_field, text_parser=self._text_parser
            )
        except InputRepairError as exc:
            return self._error("bad_input", str(exc))
        key = None
        if self._cache is not None:
            key = json.dumps(args.model_dump(mode="json"), sort_keys=True, default=str)
            if any(f is not None and _takes_config(f) for f in (self._func, self._afunc)):
                # Results may depend on who asks (EMR): never serve one caller's result to another.
                caller = caller_from_config(config)
                key += "|" + (caller.model_dump_json() if caller else "anonymous")
        return args, key

    def _finish(self, result: Any, key: Optional[str]) -> str | ToolError:
        if isinstance(result, ToolError):
            return ToolError(result.tool, result.kind, self._scrub(result.message), result.retryable)
        if not isinstance(result, str):
            return self._error("bad_response", f"backend returned {type(result).__name__}, not text")
        text = result.replace("\x00", "").strip()
        if not text:
            return self._error("bad_response", "backend returned empty text")
        text = trim_to_tokens(text, self._options.max_output_tokens)
        if key is not None and self._cache is not None:
            self._cache.put(key, text)
        return text

    def _exception_to_error(self, exc: BaseException) -> ToolError:
        if isinstance(exc, ToolFailure):
            return self._error(exc.kind, exc.message, retryable=exc.retryable)
        if isinstance(exc, (_CallTimeout, TimeoutError)):
            return self._error("timeout", f"no answer within {self._options.timeout_s:g} s", retryable=True)
        if self._is_transient(exc):
            return self._error(
                "unavailable",
                f"backend failed after {self._options.retries + 1} attempt(s): {type(exc).__name__}: {exc}",
                retryable=True,
            )
        logger.debug("tool %s internal error", self.name, exc_info=False)
        return self._error("internal", f"{type(exc).__name__}: {exc}")

    def _retry_kwargs(self) -> dict[str, Any]:
        o = self._options
        return dict(
            stop=stop_after_attempt(o.retries + 1) | stop_after_delay(o.timeout_s),
            wait=wait_exponential(multiplier=o.backoff, max=o.max_backoff) if o.backoff > 0 else wait_exponential(0, 0),
            retry=retry_if_exception(self._is_transient),
            reraise=True,
        )

    def _call_kwargs(self, func: Callable[..., Any], config: Optional[RunnableConfig]) -> dict[str, Any]:
        return {"config": config} if _takes_config(func) else {}

    # -- sync path

    def _run(self, tool_input: Any, *, config: RunnableConfig, run_manager: Any = None) -> tuple[Any, Any]:
        try:
            result = self._run_layer(tool_input, config)
        except Exception as exc:  # the contract: a tool never raises
            result = self._error("internal", f"{type(exc).__name__}: {exc}")
        return result, (result if isinstance(result, ToolError) else None)

    def _run_layer(self, tool_input: Any, config: Optional[RunnableConfig]) -> str | ToolError:
        prepared = self._prepare(tool_input, config)
        if isinstance(prepared, ToolError):
            return prepared
        args, key = prepared
        if key is not None and (hit := self._cache.get(key)) is not None:
            return hit
        if self._func is None:  # async-only backend: drive it on a private loop
            # in a fresh thread, so this works even when the caller's thread runs an event loop
            return self._finish_or_error(lambda: self._with_deadline(lambda: asyncio.run(self._acall(args, config))), key)
        func = self._func
        kwargs = self._call_kwargs(func, config)

        def attempt_all() -> Any:
            for attempt in Retrying(**self._retry_kwargs()):
                with attempt:
                    return func(args, **kwargs)

        return self._finish_or_error(lambda: self._with_deadline(attempt_all), key)

    def _finish_or_error(self, call: Callable[[], Any], key: Optional[str]) -> str | ToolError:
        try:
            result = call()
        except Exception as exc:
            return self._exception_to_error(exc)
        return self._finish(result, key)

    def _with_deadline(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` in a daemon thread and stop waiting after ``timeout_s``.

        A Python thread cannot be killed; the retry loop's stop_after_delay makes an abandoned
        call give up on its own rather than retry forever.
        """
        box: dict[str, Any] = {}
        ctx = contextvars.copy_context()

        def target() -> None:
            try:
                box["value"] = ctx.run(call)
            except BaseException as exc:  # handed back to the caller thread
                box["error"] = exc

        thread = threading.Thread(target=target, name=f"tool-{self.name}", daemon=True)
        thread.start()
        thread.join(self._options.timeout_s)
        if thread.is_alive():
            raise _CallTimeout()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    # -- async path

    async def _acall(self, args: BaseModel, config: Optional[RunnableConfig]) -> Any:
        afunc = self._afunc
        assert afunc is not None
        kwargs = self._call_kwargs(afunc, config)

        async def attempt_all() -> Any:
            async for attempt in AsyncRetrying(**self._retry_kwargs()):
                with attempt:
                    return await afunc(args, **kwargs)

        try:
            return await asyncio.wait_for(attempt_all(), self._options.timeout_s)
        except asyncio.TimeoutError:
            raise _CallTimeout() from None

    async def _arun(self, tool_input: Any, *, config: RunnableConfig, run_manager: Any = None) -> tuple[Any, Any]:
        try:
            if self._afunc is None:
                # Sync backend: the sync path (with its own deadline) in a worker thread.
                result = await asyncio.to_thread(self._run_layer, tool_input, config)
            else:
                prepared = self._prepare(tool_input, config)
                if isinstance(prepared, ToolError):
                    result = prepared
                else:
                    args, key = prepared
                    hit = self._cache.get(key) if key is not None else None
                    if hit is not None:
                        result = hit
                    else:
                        try:
                            result = self._finish(await self._acall(args, config), key)
                        except Exception as exc:
                            result = self._exception_to_error(exc)
        except Exception as exc:
            result = self._error("internal", f"{type(exc).__name__}: {exc}")
        return result, (result if isinstance(result, ToolError) else None)

    # -- ToolMessage status for LangChain tool-calling agents

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        return _mark_error(super().invoke(input, config, **kwargs))

    async def ainvoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:
        return _mark_error(await super().ainvoke(input, config, **kwargs))


def _mark_error(output: Any) -> Any:
    if isinstance(output, ToolMessage) and isinstance(output.artifact, ToolError):
        output.status = "error"
    return output


def make_tool(
    name: str,
    description: str,
    func: Optional[ToolFunc] = None,
    *,
    args_schema: type[BaseModel],
    afunc: Optional[AsyncToolFunc] = None,
    timeout_s: float = 30.0,
    retries: int = 2,
    backoff: float = 0.5,
    max_backoff: float = 8.0,
    max_output_tokens: int = 512,
    cache_size: int = 0,
    transient: Sequence[type[BaseException]] | type[BaseException] = (ConnectionError,),
    primary_field: Optional[str] = None,
    text_parser: Optional[Callable[[str], Mapping[str, Any]]] = None,
    secrets: Sequence[str] = (),
) -> LayeredTool:
    """Wrap ``func(args)`` (or ``func(args, config=...)``) into a never-raising LangChain tool.

    Args:
        name: tool name the agent writes (e.g. ``"WEB_SEARCH"``).
        description: what the agent prompt shows for the tool.
        func: sync backend taking the validated ``args_schema`` instance; returns text or ToolError.
        args_schema: pydantic model of the arguments (also the JSON schema for tool-calling LLMs).
        afunc: optional native async backend used by ``ainvoke`` (else ``func`` runs in a thread).
        timeout_s: limit for one call, retries included -> ToolError(kind="timeout").
        retries, backoff, max_backoff: tenacity exponential backoff on ``transient`` errors only.
        max_output_tokens: observation is trimmed to this many cl100k tokens.
        cache_size: LRU of successful observations keyed by the normalised arguments (and caller).
        transient: exception types worth retrying (a :class:`ToolFailure` with ``retryable=True`` also is).
        primary_field: field receiving plain-text input (default: the only / only required field).
        text_parser: turns plain text into an arguments dict (overrides ``primary_field``).
        secrets: strings (API keys) scrubbed from every error message and log line.

    Example:
        >>> from pydantic import BaseModel
        >>> class Q(BaseModel):
        ...     query: str
        >>> t = make_tool("UPPER", "Upper-case text.", lambda a: a.query.upper(), args_schema=Q, cache_size=8)
        >>> t.invoke({"query": "abc"}), t.cache_info["size"]
        ('ABC', 1)
    """
    if func is None and afunc is None:
        raise ValueError("make_tool needs func or afunc")
    if not (isinstance(args_schema, type) and issubclass(args_schema, BaseModel)):
        raise TypeError("args_schema must be a pydantic BaseModel subclass")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name or ""):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    if not description or not description.strip():
        raise ValueError("tool description must not be empty")
    options = ToolOptions(
        timeout_s=timeout_s,
        retries=retries,
        backoff=backoff,
        max_backoff=max_backoff,
        max_output_tokens=max_output_tokens,
        cache_size=cache_size,
        transient=transient,
        primary_field=primary_field,
        secrets=tuple(secrets),
    )
    if primary_field is not None and primary_field not in args_schema.model_fields:
        raise ValueError(f"primary_field {primary_field!r} is not a field of {args_schema.__name__}")
    tool = LayeredTool(name=name, description=description.strip(), args_schema=args_schema)
    tool._func = func
    tool._afunc = afunc
    tool._options = options
    tool._text_parser = text_parser
    tool._cache = _LRU(cache_size) if cache_size > 0 else None
    return tool
