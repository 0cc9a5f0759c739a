"""The admission gate of ``tcrag serve``: a bounded fair queue before the runs, and runs that end with
their clients.

:class:`RunGate` is an ASGI middleware around the run routes (``POST`` to ``/tcrag/.../invoke``,
``/batch``, ``/stream``, ``/stream_log``, ``/stream_events``), under the operator's
:class:`~tcrag_langgraph.faces.serve_guard.RunLimits`:

* **Admission**: at most ``max_concurrent_runs`` runs at once; the others wait in a first-come
  first-served queue (:class:`anyio.CapacityLimiter`, which hands a freed place to the longest
  waiter). A request that finds ``max_queue`` waiting, or waits ``max_queue_wait_s``, gets 503 with
  ``Retry-After``: the median of the recent run times times the runs ahead per place.
* **Cancel on disconnect**: the gate reads the request body itself and then watches the connection;
  when the client goes (a closed connection, a timed-out client), the request's
  :class:`~tcrag_langgraph.models.run_control.RunControl` is cancelled (its worker threads stop at
  their next step or generated token and leave the model) and the route is cancelled; a request
  still in the queue leaves it.
* **Backpressure for a stalled client**: while a write to the client waits (its socket and the
  server's write buffer are full: the client stopped reading), the run is paused at its next step,
  so it cannot pile up events the client does not read. A write that waits ``stream_stall_s``
  cancels the run and closes the connection.
* A run's place is freed only once its worker threads have left its nodes, so ``running`` counts
  runs that really use the model (:meth:`RunQueue.snapshot`, shown by ``GET /healthz``).

Runs started in Python are not queued here: a local chat model built with ``busy_timeout_s`` raises
:class:`~tcrag_langgraph.models.run_control.ModelBusy` instead of waiting longer than that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import statistics
import time
from collections import deque
from typing import Any, Optional, Sequence

import anyio

from ..models.run_control import RunCancelled, RunControl, controlled
from .serve_guard import RUN_PATHS, RunLimits

__all__ = ["RunGate", "RunQueue", "send_refusal", "GATED_ROUTES"]

#: The last path segment of the routes that start runs (LangServe's, under the app's path).
GATED_ROUTES = frozenset((*RUN_PATHS, "batch"))
_RECENT_RUNS = 16  # run times the Retry-After estimate is the median of
_log = logging.getLogger("tcrag_langgraph.serve")


async def send_refusal(send: Any, status: int, detail: str, extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer ``status`` with ``{"detail": detail}`` (the server's one shape of a refusal)."""
    payload = json.dumps({"detail": detail}).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *extra_headers]})
    await send({"type": "http.response.body", "body": payload})


class RunQueue:
    """Admission to runs under :class:`RunLimits`, and what the server says about its load.

    Example:
        >>> queue = RunQueue(RunLimits(max_concurrent_runs=2))
        >>> queue.snapshot()["running"], queue.retry_after()
        (0, 1)
    """

    def __init__(self, limits: RunLimits) -> None:
        self.limits = limits
        self._limiter: Optional[anyio.CapacityLimiter] = None  # made on the server's event loop
        self._recent: deque[float] = deque(maxlen=_RECENT_RUNS)
        self._started: dict[RunControl, float] = {}
        self.finished = 0  # answered in full
        self.cancelled = 0  # the client went away or stopped reading
        self.failed = 0  # the route failed before its answer was complete
        self.refused = 0  # 503

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limits.max_concurrent_runs)
        return self._limiter

    def snapshot(self) -> dict[str, Any]:
        """Runs going now, requests waiting, and the counts so far (``GET /healthz``)."""
        stats = self._limiter.statistics() if self._limiter is not None else None
        return {"running": stats.borrowed_tokens if stats else 0, "waiting": stats.tasks_waiting if stats else 0,
                "max_concurrent_runs": self.limits.max_concurrent_runs, "max_queue": self.limits.max_queue,
                "finished": self.finished, "cancelled": self.cancelled, "failed": self.failed,
                "refused": self.refused}

    def retry_after(self) -> int:
        """Seconds until the runs now running and waiting are likely done: the median of the recent run
        times (or the age of the oldest run going, before any has finished) times the runs ahead per
        place; at least 1."""
        now = time.monotonic()
        typical = statistics.median(self._recent) if self._recent else max(
            (now - t for t in self._started.values()), default=1.0)
        stats = self._limiter.statistics() if self._limiter is not None else None
        ahead = (stats.borrowed_tokens + stats.tasks_waiting) if stats else 0
        return max(1, math.ceil(typical * max(ahead, 1) / self.limits.max_concurrent_runs))

    async def admit(self, control: RunControl) -> Optional[str]:
        """Wait for a place for ``control``'s run: None once it has one, else why not (a 503)."""
        limiter, limits = self.limiter, self.limits
        stats = limiter.statistics()
        if stats.borrowed_tokens >= limits.max_concurrent_runs and stats.tasks_waiting >= limits.max_queue:
            return (f"server busy: {stats.borrowed_tokens} run(s) going and {stats.tasks_waiting} request(s) "
                    f"waiting, the most this server queues (max_queue {limits.max_queue})")
        with anyio.move_on_after(limits.max_queue_wait_s):
            await limiter.acquire_on_behalf_of(control)
            self._started[control] = time.monotonic()
            return None
        return (f"server busy: waited {limits.max_queue_wait_s:g} s in the queue (max_queue_wait_s) without "
                "a free run")

    def release(self, control: RunControl, *, outcome: str, timed: bool) -> None:
        """Free ``control``'s place; ``outcome`` is ``finished``, ``cancelled`` or ``failed``; ``timed``: its
        time counts for :meth:`retry_after` (a run that answered 200, not a refusal of the route)."""
        started = self._started.pop(control)
        setattr(self, outcome, getattr(self, outcome) + 1)
        if timed:
            self._recent.append(time.monotonic() - started)
        self.limiter.release_on_behalf_of(control)


class RunGate:
    """ASGI middleware: admission, cancel on disconnect and backpressure for the run routes (see the
    module); other requests pass through. ``release_after_s`` bounds how long a cancelled run's place is
    held for its worker threads to leave (a tool call ends by its own deadline)."""

    def __init__(self, app: Any, *, queue: RunQueue, prefix: str, release_after_s: float) -> None:
        self.app = app
        self.queue = queue
        self.prefix = prefix
        self.release_after_s = release_after_s

    def gated(self, scope: dict) -> bool:
        if scope["type"] != "http" or scope["method"] != "POST":
            return False
        path = scope["path"].rstrip("/")
        return path.startswith(self.prefix) and path.rsplit("/", 1)[-1] in GATED_ROUTES

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not self.gated(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []  # the body, read here so that the watcher below owns `receive`
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        control = RunControl()
        run_scope = anyio.CancelScope()
        gone = anyio.Event()
        answered = False  # the whole response was handed to the server: a disconnect now ends nothing
        stalled = False  # the client stopped reading: the rest of the response is dropped
        status = 0
        handed_body = False
        limits = self.queue.limits

        async def app_receive() -> dict:
            nonlocal handed_body
            if not handed_body:
                handed_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def paced_send(message: dict) -> None:
            nonlocal answered, stalled, status
            if stalled:
                return
            if message["type"] != "http.response.body":
                status = message.get("status", status)
                await send(message)
                return
            control.pause()  # the run waits at its next step while this write waits for the client
            try:
                with anyio.move_on_after(limits.stream_stall_s) as waiting:
                    await send(message)
            finally:
                control.resume()
            if waiting.cancelled_caught:
                # The client stopped reading: cancel the run (paused at its next step, or decoding: it
                # stops there or at its next token) and drop what the route still sends. Not failing
                # this send is deliberate: LangServe's stream then ends by the run's RunCancelled, where
                # a failed send would close its generator mid-yield (an error traceback per stalled
                # client). The response stays incomplete, so the server closes the connection.
                stalled = True
                control.cancel(f"the client read nothing for {limits.stream_stall_s:g} s (stream_stall_s)")
            elif not message.get("more_body", False):
                answered = True

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not answered:
                control.cancel("the client disconnected")
                run_scope.cancel()

        watcher = asyncio.ensure_future(watch())
        admitted = False
        try:
            with run_scope:
                problem = await self.queue.admit(control)
                if problem is not None:
                    self.queue.refused += 1
                    wait = self.queue.retry_after()
                    await send_refusal(send, 503, f"{problem}; retry after about {wait} s",
                                       [(b"retry-after", str(wait).encode())])
                    return
                admitted = True
                try:
                    with controlled(control):  # the run's nodes and model calls answer to this control
                        await self.app(scope, app_receive, paced_send)
                except* RunCancelled:  # the run ended as this gate asked; anything else is the route's error
                    if not control.cancelled:
                        raise
        finally:
            watcher.cancel()
            if admitted:
                with anyio.CancelScope(shield=True):
                    await self._release(control, answered=answered, ok=answered and status == 200)

    async def _release(self, control: RunControl, *, answered: bool, ok: bool) -> None:
        outcome = "finished" if answered else "cancelled" if control.cancelled else "failed"
        if not answered:
            if not control.cancelled:  # the route failed: nobody is left to answer, stop what still runs
                control.cancel("the response failed before the run ended")
            _log.info("run %s: %s", outcome, control.reason)
        deadline = time.monotonic() + self.release_after_s
        while control.active and time.monotonic() < deadline:  # its threads stop at their next step or token
            await anyio.sleep(0.02)
        if control.active:
            _log.warning("a cancelled run still had %d thread(s) in a node after %.0f s; freeing its place anyway",
                         control.active, self.release_after_s)
        self.queue.release(control, outcome=outcome, timed=ok)
