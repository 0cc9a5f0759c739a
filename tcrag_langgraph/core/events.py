"""Live events: every push, pop, state change, tool call and halt of a run, as it happens.

One :class:`~tcrag_langgraph.core.state.TraceEvent` is emitted two ways, because the faces listen in
different places: LangGraph's ``stream_mode="custom"`` (and the LangGraph API / Studio) reads the
stream writer; ``astream_events`` and LangServe's ``/stream_events`` read callback custom events.
Every method of this package (TC-RAG and the papers' other systems) emits through :func:`emit`.
"""

from __future__ import annotations

from typing import Any, Optional

from langchain_core.callbacks.manager import dispatch_custom_event
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer

from .state import TraceEvent

__all__ = ["EVENT_NAME", "emit"]

#: Name of the custom events (``stream_mode="custom"`` payload ``type`` and ``astream_events`` name).
EVENT_NAME = "tcrag"


def emit(event: TraceEvent, config: Optional[RunnableConfig]) -> dict[str, Any]:
    """Send ``event`` to both listeners (a no-op outside a run) and return the payload sent."""
    payload = {"type": EVENT_NAME, **event.model_dump()}
    try:
        get_stream_writer()(payload)
    except Exception:  # outside a graph run there is no stream to write to
        pass
    try:
        dispatch_custom_event(EVENT_NAME, payload, config=config)
    except Exception:  # no callback manager / parent run: nothing listens
        pass
    return payload
