"""Tool calling of the local chat models (models/chat_turns.py): which templates show tools themselves,
how the tools, calls and results reach a prompt otherwise, how a reply's calls are read, and
``bind_tools`` on the packaged SmolLM2 through llama.cpp and transformers (real generation; a 135M
model's arguments are not reliable, the call a forced ``tool_choice`` starts is)."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from tcrag_langgraph.models.chat_turns import (TOOL_CALL_OPEN, parse_reply, renders_tool_calls, template_inputs,
                                               tool_choice_of, tool_schemas)


@tool("DOC_RAG")
def doc_rag(query: str) -> str:
    """Search medical documents for passages about the query."""
    return query


SCHEMAS = tool_schemas([doc_rag])

#: a template with a tools section in the <tool_call> convention (the shape of Qwen2.5's)
WITH_TOOLS = (
    "{% if tools %}[tools]{% for t in tools %}{{ t | tojson }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}[tool]{{ m.content }}\n"
    "{% elif m.tool_calls %}[assistant]{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}\n"
    "{% else %}[{{ m.role }}]{{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
#: no tools section (the packaged SmolLM2's is like this)
PLAIN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: shows the tools but writes calls its own way: the model would answer in a syntax nobody reads here
OTHER_SYNTAX = WITH_TOOLS.replace("<tool_call>", "[call]").replace("</tool_call>", "[/call]")

HISTORY = [SystemMessage("Be brief."), HumanMessage("What treats scurvy?"),
           AIMessage("", tool_calls=[{"name": "DOC_RAG", "args": {"query": "scurvy"}, "id": "c1"}]),
           ToolMessage("Vitamin C treats scurvy.", tool_call_id="c1", name="DOC_RAG")]


def test_a_template_shows_tools_itself_only_in_the_tool_call_convention():
    assert renders_tool_calls(WITH_TOOLS)
    assert not renders_tool_calls(PLAIN) and not renders_tool_calls(OTHER_SYNTAX)
    assert not renders_tool_calls("{{ raise_exception('no tools here') }}")


def test_tools_calls_and_results_reach_a_template_with_a_tools_section_in_its_own_format():
    turns, shown = template_inputs(HISTORY, SCHEMAS, WITH_TOOLS)
    assert shown == SCHEMAS and turns[0] == {"role": "system", "content": "Be brief."}
    assert turns[2]["tool_calls"][0]["function"] == {"name": "DOC_RAG", "arguments": {"query": "scurvy"}}
    assert turns[3] == {"role": "tool", "content": "Vitamin C treats scurvy.", "name": "DOC_RAG", "tool_call_id": "c1"}


def test_without_a_tools_section_the_tools_calls_and_results_are_written_into_the_turns():
    turns, shown = template_inputs(HISTORY, SCHEMAS, PLAIN)
    assert shown is None and [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("Be brief.\n\n# Tools") and '"name": "DOC_RAG"' in turns[0]["content"]
    assert turns[2]["content"] == f'{TOOL_CALL_OPEN}\n{{"name": "DOC_RAG", "arguments": {{"query": "scurvy"}}}}\n</tool_call>'
    assert turns[3]["content"] == "<tool_response>\nVitamin C treats scurvy.\n</tool_response>"
    # no system message: the tools section is the first turn; no tools: the turns as they always were
    assert template_inputs(HISTORY[1:2], SCHEMAS, PLAIN)[0][0]["content"].startswith("# Tools")
    assert template_inputs(HISTORY[:2], None, PLAIN) == ([{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "What treats scurvy?"}], None)


def test_a_reply_is_read_for_its_calls():
    content, calls, invalid = parse_reply(
        'Looking it up.\n<tool_call>\n{"name": "DOC_RAG", "arguments": {"query": "scurvy"}}\n</tool_call>\n'
        '<tool_call>{"name": "DOC_RAG", "arguments": "{\\"query\\": \\"vitamin C\\"}"}</tool_call>')
    assert content == "Looking it up." and invalid == []
    assert [c["args"] for c in calls] == [{"query": "scurvy"}, {"query": "vitamin C"}]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)
    _, calls, invalid = parse_reply('<tool_call>{"name": "DOC_RAG", "arguments": {"query": ')  # cut off
    assert calls == [] and invalid[0]["name"] == "DOC_RAG" and invalid[0]["id"]
    _, calls, invalid = parse_reply('<tool_call>["DOC_RAG"]</tool_call>')
    assert calls == [] and invalid[0]["name"] is None and "arguments" in invalid[0]["error"]
    # a reply that is only a call object names a given tool, or it is an answer
    assert parse_reply('[{"name": "DOC_RAG", "arguments": {"query": "x"}}]', ["DOC_RAG"])[1][0]["name"] == "DOC_RAG"
    assert parse_reply('{"answer": "yes"}', ["DOC_RAG"]) == ('{"answer": "yes"}', [], [])
    assert parse_reply('{"name": "DOC_RAG", "arguments": {}}')[1] == []  # no tools given: text


def test_tool_choice_is_checked():
    assert [tool_choice_of(c, SCHEMAS) for c in (None, "auto", "none", "any", "required", True, "DOC_RAG",
                                                  {"type": "function", "function": {"name": "DOC_RAG"}})] == [
        None, None, "none", "any", "any", "DOC_RAG", "DOC_RAG", "DOC_RAG"]
    with pytest.raises(ValueError, match="tool_choice must be .*DOC_RAG.*'PUBMED'"):
        tool_choice_of("PUBMED", SCHEMAS)
    with pytest.raises(ValueError, match="exactly one tool"):
        tool_choice_of(True, SCHEMAS * 2)


@pytest.fixture(scope="module")
def gguf():
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    # one thread: llama.cpp's spinning threads crawl on a busy 2-core machine
    return LlamaCppChatModel(n_threads=1, max_new_tokens=24, temperature=0.0)


def test_the_packaged_gguf_is_shown_the_tools_and_starts_a_forced_call(gguf):
    lm = gguf.llama_model
    prompt = lm.detokenize(lm.prompt_ids([HumanMessage("What treats scurvy?")], tools=SCHEMAS))
    assert "# Tools" in prompt and '"name": "DOC_RAG"' in prompt  # SmolLM2's template has no tools section
    reply = gguf.bind_tools([doc_rag], tool_choice="DOC_RAG").invoke("What treats scurvy?")
    written = reply.tool_calls + reply.invalid_tool_calls
    assert written and written[0]["name"] == "DOC_RAG" and written[0]["id"].startswith("call_"), reply
    assert reply.usage_metadata["output_tokens"] >= 1
    # a stream with tools carries the whole reply in one chunk (its calls are read from the whole reply;
    # LangChain closes every stream with an empty last chunk)
    chunks = list(gguf.bind_tools([doc_rag], tool_choice="any").stream("What treats scurvy?"))
    assert [bool(c.tool_call_chunks) for c in chunks] == [True, False] and not chunks[1].content
    # tool_choice="none": no tools shown, the reply is text
    plain = gguf.bind_tools([doc_rag], tool_choice="none").invoke("What treats scurvy?")
    assert plain.tool_calls == [] and plain.content


def test_the_transformers_backend_calls_tools_the_same_way(gguf, one_torch_thread):
    from tcrag_langgraph.models.local import LocalChatModel

    chat = LocalChatModel(max_new_tokens=12, temperature=0.0)
    prefix = '<tool_call>\n{"name": "'
    ids = chat._prompt_ids(HISTORY, SCHEMAS, prefix)[0].tolist()
    assert ids == gguf.llama_model.prompt_ids(HISTORY, tools=SCHEMAS, reply_prefix=prefix)  # one prompt, two backends
    text = chat.local_model.tokenizer.decode(ids)
    assert '"name": "DOC_RAG"' in text and text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')
    reply = chat.bind_tools([doc_rag], tool_choice="DOC_RAG").invoke("What treats scurvy?")
    written = reply.tool_calls + reply.invalid_tool_calls
    assert written and written[0]["name"] == "DOC_RAG", reply
