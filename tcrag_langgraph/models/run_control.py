"""Stopping and pausing a run from outside it, and a bounded wait for a busy model.

A run's nodes are synchronous and run in worker threads (LangGraph runs a sync node of an async run
in a thread): cancelling the asyncio task that awaits a run does not stop the thread, which would go
on using the model, step after step, for a client that has gone. A :class:`RunControl` is what the
thread checks instead:

* the run kernel calls :func:`run_checkpoint` before every node and every model call: a cancelled
  run raises :class:`RunCancelled` there, a paused one waits there (never while holding a model);
* the local chat models check :attr:`RunControl.cancelled` after every generated token, so a
  cancelled run also leaves the model it is decoding with within a token.

``tcrag serve`` gives every request its own control (cancelled when the client disconnects or stops
reading a stream past its bound; paused while a write to that client waits). In Python::

    control = RunControl()
    with controlled(control):      # in the thread (or task) that starts the run
        graph.invoke({"question": "..."})   # another thread may call control.cancel("why")

A control reaches the run's worker threads as a context variable (LangGraph and LangChain copy the
caller's context into them); a thread started by hand gets it by calling :func:`controlled` itself.

:class:`ModelBusy` is the other half of waiting: a local chat model built with ``busy_timeout_s``
raises it when another call has held the model longer than that (:func:`hold_model`), naming the
wait, instead of queueing without bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from typing import Iterator, Optional

__all__ = ["RunCancelled", "RunControl", "ModelBusy", "controlled", "current_run", "run_checkpoint", "hold_model"]


class RunCancelled(BaseException):
    """A run was cancelled from outside (its client went away, its stream stalled past its bound, or a
    caller cancelled its :class:`RunControl`). A ``BaseException``, like ``asyncio.CancelledError``:
    the many ``except Exception`` handlers of a run (model errors, tool errors, the monitor's) must not
    turn a cancellation into a halt reason and carry on."""


class ModelBusy(RuntimeError):
    """A call waited longer than its bound (``busy_timeout_s``) for a model another call held."""


class RunControl:
    """What the outside holds of one run (or of the runs of one request): cancel it, or pause it at its
    next step. Thread-safe; :meth:`checkpoint` is called from the run's worker threads.

    Example:
        >>> control = RunControl()
        >>> control.checkpoint()          # running: returns at once
        >>> control.cancel("the client disconnected")
        >>> control.cancelled, control.reason
        (True, 'the client disconnected')
        >>> control.checkpoint()
        Traceback (most recent call last):
        ...
        tcrag_langgraph.models.run_control.RunCancelled: the client disconnected
    """

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self._go = threading.Event()  # clear while paused
        self._go.set()
        self._lock = threading.Lock()
        self._active = 0  # worker threads inside a node of this run now
        self._idle = threading.Event()
        self._idle.set()
        self.reason: Optional[str] = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, reason: str) -> None:
        """Cancel the run: it raises :class:`RunCancelled` at its next checkpoint or generated token. The
        first reason given is kept."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
        self._cancelled.set()
        self._go.set()  # a paused run wakes up to be cancelled

    def pause(self) -> None:
        """Hold the run at its next checkpoint (a node or a model call starting) until :meth:`resume`."""
        if not self.cancelled:
            self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def checkpoint(self) -> None:
        """Where a run may stop or wait: :class:`RunCancelled` if cancelled, a wait while paused."""
        self._go.wait()
        if self._cancelled.is_set():
            raise RunCancelled(self.reason or "the run was cancelled")

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Counts a worker thread inside one of the run's nodes (:meth:`wait_idle` waits for none)."""
        with self._lock:
            self._active += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._idle.set()

    @property
    def active(self) -> int:
        """Worker threads inside one of the run's nodes now."""
        return self._active

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Wait until no worker thread is inside one of the run's nodes (a cancelled run's last node has
        stopped); False if ``timeout`` passed first."""
        return self._idle.wait(timeout)


_CURRENT: contextvars.ContextVar[Optional[RunControl]] = contextvars.ContextVar("tcrag_run_control", default=None)


def current_run() -> Optional[RunControl]:
    """The control of the run this code belongs to, if its starter gave one."""
    return _CURRENT.get()


@contextlib.contextmanager
def controlled(control: RunControl) -> Iterator[RunControl]:
    """Runs started inside this block (and the threads and tasks they start) answer to ``control``."""
    token = _CURRENT.set(control)
    try:
        yield control
    finally:
        _CURRENT.reset(token)


def run_checkpoint() -> None:
    """:meth:`RunControl.checkpoint` of the current run; nothing without a control."""
    control = _CURRENT.get()
    if control is not None:
        control.checkpoint()


@contextlib.contextmanager
def hold_model(lock: threading.RLock, *, timeout_s: Optional[float], name: str) -> Iterator[None]:
    """Hold a model's ``lock``; with ``timeout_s``, raise :class:`ModelBusy` after waiting that long."""
    started = time.monotonic()
    if not lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
        raise ModelBusy(f"model {name} was busy: another call held it for {time.monotonic() - started:.1f} s, "
                        f"longer than this model's busy_timeout_s ({timeout_s:g} s); try again later")
    try:
        yield
    finally:
        lock.release()
