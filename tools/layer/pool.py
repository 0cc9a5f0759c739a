"""The one deadline of a tool call and the one bounded thread pool that enforces it.

A sync tool backend cannot be interrupted, so the caller's thread hands it to a worker of a shared,
bounded :class:`~concurrent.futures.ThreadPoolExecutor` and stops waiting at the deadline. What
happens to a call that overruns: Python threads cannot be killed, so its worker keeps running the
backend until the backend returns (network clients of the tools carry their own socket timeouts);
the retry loop checks the same deadline and starts no new attempt after it; the result is thrown
away. While workers are held by overrunning calls, new calls wait in the pool's queue and that
wait counts against their own deadline, so a stuck backend makes later calls time out, never makes
the process start more threads.

A call made from inside a pool worker (a tool whose backend calls another tool) runs inline: the
outer call's deadline already bounds it, and a bounded pool waiting on itself could starve.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

__all__ = [
    "TOOL_POOL_WORKERS",
    "DeadlineExceeded",
    "CallLimits",
    "call_limits",
    "current_limits",
    "run_before_deadline",
    "arun_before_deadline",
]

T = TypeVar("T")

#: Workers of the shared tool pool. Tool calls wait on I/O, so this is not tied to the CPU count.
TOOL_POOL_WORKERS = 16

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=TOOL_POOL_WORKERS, thread_name_prefix="tcrag-tool")
_in_worker = threading.local()


class DeadlineExceeded(Exception):
    """The call's deadline passed before the backend answered."""


@dataclass(frozen=True)
class CallLimits:
    """Per-call overrides that :func:`~tcrag_langgraph.tools.layer.invoke_tool` hands to a LayeredTool."""

    timeout_s: Optional[float] = None
    max_output_tokens: Optional[int] = None


_LIMITS: contextvars.ContextVar[Optional[CallLimits]] = contextvars.ContextVar("tcrag_tool_call_limits", default=None)


def current_limits() -> Optional[CallLimits]:
    """The overrides of the tool call running in this context, if any."""
    return _LIMITS.get()


class call_limits:  # noqa: N801 - used like a function: ``with call_limits(...)``
    """Context manager setting :class:`CallLimits` for the tool call made inside it."""

    def __init__(self, limits: CallLimits) -> None:
        self._limits = limits
        self._token: Optional[contextvars.Token] = None

    def __enter__(self) -> CallLimits:
        self._token = _LIMITS.set(self._limits)
        return self._limits

    def __exit__(self, *exc: Any) -> None:
        assert self._token is not None
        _LIMITS.reset(self._token)


def _run_marked(ctx: contextvars.Context, call: Callable[[], T]) -> T:
    _in_worker.active = True
    try:
        return ctx.run(call)
    finally:
        _in_worker.active = False


def run_before_deadline(call: Callable[[], T], deadline: float) -> T:
    """``call()`` in the shared pool; its result, its exception, or :class:`DeadlineExceeded`.

    ``deadline`` is a :func:`time.monotonic` instant. The call sees the caller's context variables.
    """
    if getattr(_in_worker, "active", False):
        return call()
    future = _POOL.submit(_run_marked, contextvars.copy_context(), call)
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
        future.cancel()  # drops it if it is still queued; a running one finishes unobserved
        raise DeadlineExceeded() from None


async def arun_before_deadline(call: Callable[[], T], deadline: float) -> T:
    """Async twin of :func:`run_before_deadline`: await ``call()`` from the shared pool."""
    import asyncio

    if getattr(_in_worker, "active", False):
        return call()
    future = _POOL.submit(_run_marked, contextvars.copy_context(), call)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        future.cancel()
        raise DeadlineExceeded() from None
