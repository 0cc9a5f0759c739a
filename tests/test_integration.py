"""The TC-RAG graph as a node of a parent MessagesState graph and as a Runnable in LCEL chains."""

from __future__ import annotations

from operator import itemgetter

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command

from tcrag_langgraph import TCRAGConfig
from tcrag_langgraph.faces.integration import as_chat_runnable, checkpoint_serde, tcrag_events, to_graph_input
from tcrag_langgraph.testing import scripted_graph

SCRIPT = {
    "replies": ["Thought: recall {question}", "Tool_Use: DOC_RAG\nTool_Input: {question}", "Conclusion: answer({question})"],
    "scores": {"recall {question}": 30.0, "answer({question})": 2.0},
    "tools": {"DOC_RAG": "doc about {input}"},
}


def parent_graph(agent, *, checkpointer=None):
    """A user's chat app: a triage node rewrites the question, TC-RAG answers, a formatter signs it."""

    def triage(state: MessagesState):
        last = state["messages"][-1]
        return {"messages": [HumanMessage(content=f"(medical) {last.content}")]}

    def sign(state: MessagesState):
        return {"messages": [AIMessage(content=f"{state['messages'][-1].content} -- checked by TC-RAG")]}

    builder = StateGraph(MessagesState)
    builder.add_node("triage", triage)
    builder.add_node("tcrag", agent)  # the compiled graph itself is the node
    builder.add_node("sign", sign)
    builder.add_edge(START, "triage")
    builder.add_edge("triage", "tcrag")
    builder.add_edge("tcrag", "sign")
    builder.add_edge("sign", END)
    return builder.compile(checkpointer=checkpointer)


def test_agent_as_a_node_of_a_messages_state_graph():
    parent = parent_graph(scripted_graph(SCRIPT))
    out = parent.invoke({"messages": [HumanMessage(content="What treats scurvy?")]})
    assert [(m.type, m.content) for m in out["messages"]] == [
        ("human", "What treats scurvy?"),
        ("human", "(medical) What treats scurvy?"),
        ("ai", "answer((medical) What treats scurvy?)"),
        ("ai", "answer((medical) What treats scurvy?) -- checked by TC-RAG"),
    ]
    assert out["messages"][2].response_metadata["halt_reason"] == "validated"
    assert set(out) == {"messages"}  # the parent keeps only its own keys


def test_parent_streams_subgraph_updates_and_tcrag_events():
    parent = parent_graph(scripted_graph(SCRIPT))
    chunks = list(parent.stream({"messages": [HumanMessage(content="Why?")]}, stream_mode=["updates", "custom"],
                                subgraphs=True))
    top = [next(iter(c[2])) for c in chunks if c[0] == () and c[1] == "updates"]
    assert top == ["triage", "tcrag", "sign"]
    inner = [c for c in chunks if c[0] and c[0][0].startswith("tcrag:")]
    assert [next(iter(c[2])) for c in inner if c[1] == "updates"] == [
        "Start", "Generate", "Thought", "Generate", "Tool_Use", "Generate", "Conclusion"]
    events = list(tcrag_events(chunks))
    assert [(e["action"], e["op"]) for e in events] == [
        ("User_Query", "push"), ("Thought", "push"), ("Tool_Use", "push"), ("Conclusion", "push"), ("Halt", "halt")]
    assert events[2]["content"] == "doc about (medical) Why?" and events[-1]["state_value"] == 2.0
    # the custom events come from the subgraph namespace, before the parent's next node runs
    first_custom = next(i for i, c in enumerate(chunks) if c[1] == "custom")
    sign_update = next(i for i, c in enumerate(chunks) if c[0] == () and c[1] == "updates" and "sign" in c[2])
    assert first_custom < sign_update and chunks[first_custom][0][0].startswith("tcrag:")


async def test_parent_astream_events_show_tcrag_custom_events():
    parent = parent_graph(scripted_graph(SCRIPT))
    seen = []
    async for ev in parent.astream_events({"messages": [HumanMessage(content="Why?")]}, version="v2"):
        if ev["event"] == "on_custom_event" and ev["name"] == "tcrag":
            seen.append((ev["data"]["action"], ev["metadata"]["langgraph_node"]))
    assert seen == [("User_Query", "Start"), ("Thought", "Thought"), ("Tool_Use", "Tool_Use"),
                    ("Conclusion", "Conclusion"), ("Halt", "Conclusion")]


def test_review_interrupt_inside_the_node_pauses_and_resumes_the_parent():
    agent = scripted_graph({**SCRIPT, "config": {"require_review": True}})
    parent = parent_graph(agent, checkpointer=InMemorySaver(serde=checkpoint_serde()))
    cfg = {"configurable": {"thread_id": "p1"}}
    paused = parent.invoke({"messages": [HumanMessage(content="Dose?")]}, cfg)
    assert paused["__interrupt__"][0].value["answer"] == "answer((medical) Dose?)"
    assert parent.get_state(cfg).next == ("tcrag",)
    done = parent.invoke(Command(resume="approve"), cfg)
    assert done["messages"][-1].content == "answer((medical) Dose?) -- checked by TC-RAG"


def test_lcel_chain_with_prompt_and_parser():
    chain = (ChatPromptTemplate.from_messages([("system", "be brief"), ("human", "Explain {topic}")])
             | as_chat_runnable(scripted_graph(SCRIPT)) | StrOutputParser())
    assert chain.invoke({"topic": "ketosis"}) == "answer(Explain ketosis)"
    assert chain.batch([{"topic": "a"}, {"topic": "b"}]) == ["answer(Explain a)", "answer(Explain b)"]


def test_plain_graph_in_an_lcel_chain_with_runtime_options():
    graph = scripted_graph({**SCRIPT, "scores": {"recall {question}": 30.0, "answer({question})": 12.0}})
    chain = RunnableLambda(lambda q: {"question": q}) | graph | itemgetter("answer", "halt_reason", "sigma")
    assert chain.invoke("q?", config={"configurable": {"sigma": 20}}) == ("answer(q?)", "validated", 20.0)
    answer, reason, sigma = chain.invoke("q?", config={"configurable": {"max_steps": 2}})
    # two actions, then the final Conclusion: 12 >= default 10, so it is the flagged answer
    assert (answer, reason, sigma) == ("answer(q?)", "max_steps", 10.0)


async def test_chat_runnable_streams_a_final_message_and_events():
    chat = as_chat_runnable(scripted_graph(SCRIPT))
    chunks = [c async for c in chat.astream([SystemMessage(content="s"), HumanMessage(content="Q?")])]
    assert len(chunks) == 1 and chunks[0].content == "answer(Q?)"
    assert chunks[0].response_metadata["stack"] == ["User_Query", "Thought", "Tool_Use", "Conclusion"]
    names = [e["name"] async for e in chat.astream_events("Q?", version="v2") if e["event"] == "on_custom_event"]
    assert names == ["tcrag"] * 5


def test_to_graph_input_rejects_what_it_cannot_use():
    import pytest

    with pytest.raises(ValueError):
        to_graph_input({"text": "hi"})
    with pytest.raises(TypeError):
        to_graph_input(42)
    assert to_graph_input({"question": "q"}) == {"question": "q"}
    assert TCRAGConfig().max_steps > 3  # the budget override above really lowers it
