"""Drop-in helpers for using the TC-RAG graph inside the LangChain / LangGraph ecosystem.

The compiled graph from :func:`~tcrag_langgraph.build_graph` already *is* a LangGraph node and a
LangChain ``Runnable``; nothing needs wrapping to add it to a parent ``MessagesState`` graph::

    parent = StateGraph(MessagesState)
    parent.add_node("tcrag", build_graph(...))   # reads the last human message, appends the answer

The parent only keeps the keys it declares (``messages``); TC-RAG's own keys (stack, trace, state
value ...) stay in the subgraph and are visible when streaming with ``subgraphs=True``.

What this module adds is the adapter for chains that speak *messages* rather than graph state:
:func:`as_chat_runnable` takes a string, a prompt value, a list of messages or ``{"messages": ...}``
and returns one :class:`~langchain_core.messages.AIMessage` whose ``response_metadata`` carries
the halt reason, validation flag, state value, sigma, metric and step count. It is what
``tcrag serve`` exposes over LangServe.

Example:
    >>> from langchain_core.prompts import ChatPromptTemplate
    >>> from tcrag_langgraph.testing import scripted_graph
    >>> graph = scripted_graph({"replies": ["Conclusion: about {question}"], "default_score": 1.0})
    >>> chain = ChatPromptTemplate.from_template("Q: {topic}?") | as_chat_runnable(graph)
    >>> msg = chain.invoke({"topic": "scurvy"})
    >>> msg.content, msg.response_metadata["halt_reason"]
    ('about Q: scurvy?', 'validated')
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Optional

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from pydantic import BaseModel, Field

from ..core.events import EVENT_NAME
from ..core.result import RunResult

__all__ = ["ChatInput", "to_graph_input", "to_ai_message", "as_chat_runnable", "tcrag_events", "checkpoint_serde", "STATE_TYPES"]


class ChatInput(BaseModel):
    """Chat input: the conversation so far, ending with the user's question."""

    messages: list[AnyMessage] = Field(description="Conversation; the last human message is the question.")


def to_graph_input(value: Any) -> dict[str, Any]:
    """Convert chain input into TC-RAG graph input.

    Accepts a question string, a ``PromptValue``, a list of messages, a :class:`ChatInput`, or a
    mapping with ``messages`` or ``question`` (passed through).

    Example:
        >>> to_graph_input("Why?")
        {'question': 'Why?'}
        >>> to_graph_input([HumanMessage(content="Why?")])["messages"][0].content
        'Why?'
    """
    if isinstance(value, str):
        return {"question": value}
    if isinstance(value, PromptValue):
        return {"messages": value.to_messages()}
    if isinstance(value, ChatInput):
        return {"messages": list(value.messages)}
    if isinstance(value, BaseMessage):
        return {"messages": [value]}
    if isinstance(value, Mapping):
        if "messages" in value or "question" in value:
            return dict(value)
        raise ValueError("a mapping input needs a 'messages' or 'question' key")
    if isinstance(value, (list, tuple)):
        return {"messages": list(value)}
    raise TypeError(f"cannot use {type(value).__name__} as TC-RAG input")


def to_ai_message(state: Mapping[str, Any]) -> AIMessage:
    """The final answer of a run as an AIMessage, with run facts in ``response_metadata``.

    A run paused for human review (``__interrupt__``) has no answer yet: that is reported in the
    metadata (``halt_reason='awaiting_review'``) rather than hidden.
    """
    result = RunResult.from_state(state)
    facts = result.metadata()
    if state.get("__interrupt__"):
        facts["halt_reason"] = "awaiting_review"
        return AIMessage(content="(waiting for human review)", response_metadata=facts)
    messages = state.get("messages") or []
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage):
        return AIMessage(content=last.content, id=last.id, response_metadata={**last.response_metadata, **facts})
    return AIMessage(content=result.text, response_metadata=facts)


def as_chat_runnable(graph: Runnable, *, name: str = "tcrag_chat") -> Runnable:
    """``input -> graph -> AIMessage`` as one LCEL runnable (typed for LangServe's chat playground).

    Config (``configurable`` options such as ``sigma`` or ``thread_id``) and callbacks flow
    through to the graph, so ``astream_events`` still shows the ``tcrag`` custom events.
    """
    def run(value: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        return graph.invoke(value, config)

    async def arun(value: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        return await graph.ainvoke(value, config)

    # The graph runs as one step (its final state feeds the answer); streaming such a chain yields
    # the final AIMessage, while astream_events still shows every node and tcrag event inside.
    chain = (RunnableLambda(to_graph_input, name="to_tcrag_input")
             | RunnableLambda(run, afunc=arun, name=graph.get_name())
             | RunnableLambda(to_ai_message, name="to_ai_message"))
    return chain.with_types(input_type=ChatInput, output_type=AIMessage).with_config(run_name=name)


def tcrag_events(chunks: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """Pick the ``tcrag`` stack events out of any ``stream()`` output.

    Works with ``stream_mode="custom"``, a list of modes (``(mode, chunk)`` pairs) and
    ``subgraphs=True`` (``(namespace, mode, chunk)`` triples), so a parent graph can follow the
    agent's pushes, pops and halts.

    Example:
        >>> list(tcrag_events([((), "custom", {"type": "tcrag", "op": "push"}), ((), "updates", {})]))
        [{'type': 'tcrag', 'op': 'push'}]
    """
    for chunk in chunks:
        payload: Optional[Any] = chunk
        if isinstance(chunk, tuple):
            if len(chunk) == 3:
                payload = chunk[2] if chunk[1] == "custom" else None
            elif len(chunk) == 2:
                if chunk[0] == "custom":
                    payload = chunk[1]
                elif isinstance(chunk[0], tuple):  # (namespace, chunk) with a single custom mode
                    payload = chunk[1]
                else:
                    payload = None
        if isinstance(payload, dict) and payload.get("type") == EVENT_NAME:
            yield payload


#: The pydantic types TC-RAG keeps in graph state (stack frames, trace events).
STATE_TYPES = (("tcrag_langgraph.core.state", "Action"), ("tcrag_langgraph.core.state", "Frame"),
               ("tcrag_langgraph.core.state", "ParsedAction"),
               ("tcrag_langgraph.core.state", "ToolCallRecord"), ("tcrag_langgraph.core.state", "TraceEvent"))


def checkpoint_serde():
    """A checkpoint serializer that allows TC-RAG's state types, for any LangGraph checkpointer.

    Without it, restoring a checkpoint logs "Deserializing unregistered type ... Frame ... This will
    be blocked in a future version" for every stack frame and trace event.

    Example:
        >>> from langgraph.checkpoint.memory import InMemorySaver
        >>> saver = InMemorySaver(serde=checkpoint_serde())
    """
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    return JsonPlusSerializer(allowed_msgpack_modules=list(STATE_TYPES))
