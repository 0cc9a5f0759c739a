""":class:`LayeredTool` and :func:`make_tool`: a backend function behind the shared layer, as a LangChain tool."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import threading
import time
from typing import Any, Awaitable, Callable, Mapping, Optional, Union

from cachetools import LRUCache
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import BaseModel, PrivateAttr
from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt, stop_before_delay, wait_exponential

from ..base import ToolError
from ..identity import caller_from_config
from ..secrets import protect_logs, scrub_secrets
from .egress import egress_problem
from .options import ToolFailure, ToolOptions
from .outcome import bounded_error, bounded_observation, tool_error
from .pool import DeadlineExceeded, arun_before_deadline, current_limits, run_before_deadline
from .repair import InputRepairError, repair_input

__all__ = ["LayeredTool", "make_tool"]

logger = logging.getLogger("tcrag_langgraph.tools.layer")

ToolFunc = Callable[..., Union[str, ToolError]]
AsyncToolFunc = Callable[..., Awaitable[Union[str, ToolError]]]


class _LRU:
    """A thread-safe :class:`cachetools.LRUCache` of observations; only successful ones go in."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: LRUCache[str, str] = LRUCache(maxsize=size)
        self._lock = threading.Lock()

    def get(self, key: str) -> Optional[str]:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._data[key] = value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def _takes_config(func: Callable[..., Any]) -> bool:
    try:
        return "config" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


class LayeredTool(BaseTool):
    """A LangChain tool whose every call goes through the shared layer; built by :func:`make_tool`.

    ``invoke`` returns a ``str`` or a :class:`ToolError` (never raises). Invoked with a LangChain
    ``ToolCall`` it returns a ``ToolMessage`` whose ``status`` is ``"error"`` for a ToolError, with
    the ToolError as its ``artifact``; a success carries ``{"tool", "status": "success", "chars"}``
    (LangChain's ``content_and_artifact`` contract: an artifact is never None). Called through
    :func:`~tcrag_langgraph.tools.layer.invoke_tool`, the call's ``timeout_s`` and
    ``max_output_tokens`` replace the tool's own for that call (one deadline, not two).
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

    def _effective_options(self) -> ToolOptions:
        """The tool's options with the running call's overrides (from ``invoke_tool``) applied."""
        limits = current_limits()
        if limits is None:
            return self._options
        update = {k: v for k, v in (("timeout_s", limits.timeout_s), ("max_output_tokens", limits.max_output_tokens)) if v is not None}
        return self._options.model_copy(update=update) if update else self._options

    def _error(self, options: ToolOptions, kind: str, message: str, *, retryable: bool = False) -> ToolError:
        error = tool_error(self.name, kind, message, max_tokens=options.max_output_tokens, secrets=options.secrets, retryable=retryable)
        logger.info("tool %s failed: %s: %s", self.name, kind, error.message)
        return error

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, ToolFailure):
            return exc.retryable
        return isinstance(exc, self._options.transient)

    def _prepare(self, tool_input: Any, config: Optional[RunnableConfig], options: ToolOptions) -> tuple[Any, Optional[str]] | ToolError:
        try:
            args = repair_input(tool_input, self.args_schema, primary_field=options.primary_field, text_parser=self._text_parser)
        except InputRepairError as exc:
            return self._error(options, "bad_input", str(exc))
        key = None
        if self._cache is not None:
            key = json.dumps(args.model_dump(mode="json"), sort_keys=True, default=str)
            if any(f is not None and _takes_config(f) for f in (self._func, self._afunc)):
                # Results may depend on who asks (EMR): never serve one caller's result to another.
                caller = caller_from_config(config)
                key += "|" + (caller.model_dump_json() if caller else "anonymous")
        return args, key

    def _cached(self, key: Optional[str], options: ToolOptions) -> Optional[str]:
        hit = self._cache.get(key) if key is not None and self._cache is not None else None
        return None if hit is None else bounded_observation(hit, options.max_output_tokens)

    def _finish(self, result: Any, key: Optional[str], options: ToolOptions) -> str | ToolError:
        if isinstance(result, ToolError):
            return bounded_error(result, options.max_output_tokens, options.secrets)
        if not isinstance(result, str):
            return self._error(options, "bad_response", f"backend returned {type(result).__name__}, not text")
        text = scrub_secrets(result.replace("\x00", "").strip(), options.secrets)
        if not text:
            return self._error(options, "bad_response", "backend returned empty text")
        if key is not None and self._cache is not None:
            self._cache.put(key, text)  # kept whole: a later call may allow more tokens
        return bounded_observation(text, options.max_output_tokens)

    def _exception_to_error(self, exc: BaseException, options: ToolOptions) -> ToolError:
        if isinstance(exc, ToolFailure):
            return self._error(options, exc.kind, exc.message, retryable=exc.retryable)
        if isinstance(exc, (DeadlineExceeded, TimeoutError, asyncio.TimeoutError)):
            return self._error(options, "timeout", f"no answer within {options.timeout_s:g} s", retryable=True)
        if self._is_transient(exc):
            return self._error(
                options,
                "unavailable",
                f"backend failed after {options.retries + 1} attempt(s): {type(exc).__name__}: {exc}",
                retryable=True,
            )
        return self._error(options, "internal", f"{type(exc).__name__}: {exc}")

    def _retry_kwargs(self, options: ToolOptions, deadline: float) -> dict[str, Any]:
        # The call's one deadline also bounds the retries: no attempt (or backoff wait) past it.
        return dict(
            stop=stop_after_attempt(options.retries + 1) | stop_before_delay(max(0.0, deadline - time.monotonic())),
            wait=wait_exponential(multiplier=options.backoff, max=options.max_backoff) if options.backoff > 0 else wait_exponential(0, 0),
            retry=retry_if_exception(self._is_transient),
            reraise=True,
        )

    @staticmethod
    def _call_kwargs(func: Callable[..., Any], config: Optional[RunnableConfig]) -> dict[str, Any]:
        return {"config": config} if _takes_config(func) else {}

    def _sync_attempts(self, args: BaseModel, config: Optional[RunnableConfig], options: ToolOptions, deadline: float) -> Any:
        if self._func is None:  # async-only backend: a private event loop in the worker thread
            return asyncio.run(self._async_attempts(args, config, options, deadline))
        func, kwargs = self._func, self._call_kwargs(self._func, config)
        for attempt in Retrying(**self._retry_kwargs(options, deadline)):
            with attempt:
                return func(args, **kwargs)

    async def _async_attempts(self, args: BaseModel, config: Optional[RunnableConfig], options: ToolOptions, deadline: float) -> Any:
        afunc = self._afunc
        assert afunc is not None
        kwargs = self._call_kwargs(afunc, config)

        async def attempts() -> Any:
            async for attempt in AsyncRetrying(**self._retry_kwargs(options, deadline)):
                with attempt:
                    return await afunc(args, **kwargs)

        try:
            return await asyncio.wait_for(attempts(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise DeadlineExceeded() from None

    # -- sync path

    def _run(self, tool_input: Any, *, config: RunnableConfig, run_manager: Any = None) -> tuple[Any, Any]:
        options = self._effective_options()
        try:
            result = self._run_layer(tool_input, config, options)
        except Exception as exc:  # the contract: a tool never raises
            result = self._error(options, "internal", f"{type(exc).__name__}: {exc}")
        return result, self._artifact(result)

    def _artifact(self, result: str | ToolError) -> Any:
        """What a ToolMessage carries beside the text: the ToolError, or what succeeded."""
        if isinstance(result, ToolError):
            return result
        return {"tool": self.name, "status": "success", "chars": len(result)}

    def _begin(self, tool_input: Any, config: Optional[RunnableConfig], options: ToolOptions) -> Any:
        """The call's deadline and validated arguments, or its outcome already (bad input, cache hit)."""
        deadline = time.monotonic() + options.timeout_s
        prepared = self._prepare(tool_input, config, options)
        if isinstance(prepared, ToolError):
            return prepared
        args, key = prepared
        if options.sends_off_machine and not options.allow_record_egress:
            refused = egress_problem(self.name, args, config, options.record_egress_check)  # the egress rule
            if refused:
                return self._error(options, "egress_refused", refused)
        hit = self._cached(key, options)
        return hit if hit is not None else (args, key, deadline)

    def _run_layer(self, tool_input: Any, config: Optional[RunnableConfig], options: Optional[ToolOptions] = None) -> str | ToolError:
        options = options or self._options
        begun = self._begin(tool_input, config, options)
        if not isinstance(begun, tuple):
            return begun
        args, key, deadline = begun
        try:
            result = run_before_deadline(lambda: self._sync_attempts(args, config, options, deadline), deadline)
        except Exception as exc:
            return self._exception_to_error(exc, options)
        return self._finish(result, key, options)

    # -- async path

    async def _arun(self, tool_input: Any, *, config: RunnableConfig, run_manager: Any = None) -> tuple[Any, Any]:
        options = self._effective_options()
        try:
            result = await self._arun_layer(tool_input, config, options)
        except Exception as exc:
            result = self._error(options, "internal", f"{type(exc).__name__}: {exc}")
        return result, self._artifact(result)

    async def _arun_layer(self, tool_input: Any, config: Optional[RunnableConfig], options: ToolOptions) -> str | ToolError:
        begun = self._begin(tool_input, config, options)
        if not isinstance(begun, tuple):
            return begun
        args, key, deadline = begun
        try:
            if self._afunc is not None:
                result = await self._async_attempts(args, config, options, deadline)
            else:  # sync backend: a worker of the shared pool, same deadline
                result = await arun_before_deadline(lambda: self._sync_attempts(args, config, options, deadline), deadline)
        except Exception as exc:
            return self._exception_to_error(exc, options)
        return self._finish(result, key, options)

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
    options: Optional[ToolOptions] = None,
    text_parser: Optional[Callable[[str], Mapping[str, Any]]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    **overrides: Any,
) -> LayeredTool:
    """Wrap ``func(args)`` (or ``func(args, config=...)``) into a never-raising LangChain tool.

    Args:
        name: tool name the agent writes (e.g. ``"WEB_SEARCH"``).
        description: what the agent prompt shows for the tool.
        func: sync backend taking the validated ``args_schema`` instance; returns text or ToolError.
        args_schema: pydantic model of the arguments (also the JSON schema for tool-calling LLMs).
        afunc: optional native async backend used by ``ainvoke`` (else ``func`` runs in the tool pool).
        options: a :class:`ToolOptions`; tool factories build one and pass it here.
        text_parser: turns plain text into an arguments dict (overrides ``primary_field``).
        metadata: the LangChain tool's ``metadata``, e.g. a schema for writing its input
            (:data:`~tcrag_langgraph.tools.base.WRITTEN_INPUT_SCHEMA`).
        **overrides: any :class:`ToolOptions` field, replacing the one in ``options``:
            ``timeout_s`` (one call, retries included -> ToolError kind "timeout"), ``retries``,
            ``backoff``, ``max_backoff`` (tenacity exponential backoff on ``transient`` errors
            only), ``max_output_tokens`` (budget of observations and error messages, cl100k
            tokens), ``cache_size`` (LRU of successful observations keyed by the normalised
            arguments and caller), ``transient`` (exception types worth retrying; a
            :class:`ToolFailure` with ``retryable=True`` also is), ``primary_field`` (field
            receiving plain-text input), ``secrets`` (scrubbed in every encoding from
            observations, errors and logs).

    Example:
        >>> from pydantic import BaseModel
        >>> class Q(BaseModel):
        ...     query: str
        >>> t = make_tool("UPPER", "Upper-case text.", lambda a: a.query.upper(), args_schema=Q, cache_size=8)
        >>> t.invoke({"query": "abc"}), t.cache_info["size"]
        ('ABC', 1)
        >>> make_tool("UPPER", "Upper-case text.", lambda a: a.query.upper(), args_schema=Q,
        ...           options=ToolOptions(retries=0), timeout_s=5).options.timeout_s
        5.0
    """
    if func is None and afunc is None:
        raise ValueError("make_tool needs func or afunc")
    if not (isinstance(args_schema, type) and issubclass(args_schema, BaseModel)):
        raise TypeError("args_schema must be a pydantic BaseModel subclass")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name or ""):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    if not description or not description.strip():
        raise ValueError("tool description must not be empty")
    if options is not None and not isinstance(options, ToolOptions):
        raise TypeError(f"options must be a ToolOptions, got {type(options).__name__}")
    unknown = sorted(set(overrides) - set(ToolOptions.model_fields))
    if unknown:
        raise TypeError(f"make_tool() got unexpected keyword argument(s): {', '.join(unknown)}")
    base = dict(options) if options is not None else {}
    resolved = ToolOptions(**{**base, **overrides})
    if resolved.primary_field is not None and resolved.primary_field not in args_schema.model_fields:
        raise ValueError(f"primary_field {resolved.primary_field!r} is not a field of {args_schema.__name__}")
    if resolved.secrets:
        protect_logs(resolved.secrets)  # the clients a backend uses log URLs and headers too
    tool = LayeredTool(name=name, description=description.strip(), args_schema=args_schema,
                       metadata=dict(metadata) if metadata is not None else None)
    tool._func = func
    tool._afunc = afunc
    tool._options = resolved
    tool._text_parser = text_parser
    tool._cache = _LRU(resolved.cache_size) if resolved.cache_size > 0 else None
    return tool
