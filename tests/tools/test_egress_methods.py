"""The egress rule is the kernel's, so it holds for every method (issue 40, item 3): once a run has
read a record (the real EMR_SEARCH), an outbound tool (the real WEB_SEARCH over a SearxNG server on
127.0.0.1 that logs every query) is refused for the rest of the run, whatever the method. FL-RAG and
SR-RAG retrieve with every tool on their own (no injection needed: it is how they retrieve); TC-RAG's
own case, a Summary laundering the record, is in tests/tools/test_egress.py. Every method's tool
calls go through the one door that applies the rule (RunKernel.call_tool)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tcrag_langgraph.core.config import CallerContext, TCRAGConfig
from tcrag_langgraph.methods.registry import METHODS, build_method
from tcrag_langgraph.testing import ScriptedScorer, recording_model, tool_call_reply, tool_calling_model
from tcrag_langgraph.tools.emr import EMRDatabase, emr_tool
from tcrag_langgraph.tools.web_search import SearxngProvider, web_tool

SEARX_OK = {"query": "x", "results": [{"title": "Result", "url": "https://example.org/r", "content": "text"}]}
CALLER = CallerContext(user_id="dr-lee", allowed_patient_ids=("P00002",))
METHODS_DIR = Path(__file__).resolve().parents[2] / "tcrag_langgraph" / "methods"


@pytest.fixture(scope="module")
def emr():
    return emr_tool(EMRDatabase(None, n_patients=60, seed=7))


def searx(http_server):
    queries: list[str] = []

    def respond(req, n):
        queries.append(req.query.get("q", [""])[0])
        return http_server.Reply(200, SEARX_OK)

    http_server.respond = respond
    return web_tool(SearxngProvider(http_server.url, timeout_s=5.0), retries=0, cache_size=0), queries


@pytest.mark.parametrize("method", ["fl-rag", "sr-rag"])
def test_a_method_that_retrieves_with_every_tool_sends_nothing_after_a_record(http_server, emr, method):
    search, queries = searx(http_server)
    replies = ["Patient P00002 was admitted with heart failure.", "The NT-proBNP was high.", "Done."] * 4
    graph = build_method(method, model=recording_model(replies), tools=[emr, search],
                         scorer=ScriptedScorer(default=1.0),
                         config=TCRAGConfig(caller=CALLER, max_steps=3, max_new_tokens=32))
    out = graph.invoke({"question": "Summarise the record of patient P00002."})
    assert out["records_read"], out.get("error")  # the record was read (the caller may see it) ...
    assert queries == []  # ... and nothing, not even the question, went to the search server after it
    refused = [k for k in (out.get("knowledge") or out.get("evidence") or []) if k.get("tool") == "WEB_SEARCH"]
    assert refused and all("egress_refused" in k.get("error", "") for k in refused), refused


def test_without_a_record_the_same_method_searches(http_server, emr):
    """The control: no record read (the caller may not see P00002), the search goes out."""
    search, queries = searx(http_server)
    graph = build_method("sr-rag", model=recording_model(["Done."] * 4), tools=[emr, search],
                         scorer=ScriptedScorer(default=1.0),
                         config=TCRAGConfig(caller=CallerContext(user_id="dr-x"), max_steps=3, max_new_tokens=32))
    out = graph.invoke({"question": "Summarise the record of patient P00002."})
    assert not out["records_read"] and len(queries) == 1


def test_the_langchain_agent_sends_nothing_after_a_record(http_server, emr):
    """LangChain's create_agent runs each tool call in a LangGraph task of its own (in threads, two at
    once when the model asks for two); answered by the kernel's door they still carry what the run has
    read: after the record, both searches are refused. The control: without a record they go out."""
    search, queries = searx(http_server)
    lookup = tool_call_reply("EMR_SEARCH", operation="lookup", patient_id="P00002")
    two_searches = calls_at_once(tool_call_reply("WEB_SEARCH", query="heart failure"),
                                 tool_call_reply("WEB_SEARCH", query="NT-proBNP"))
    for caller, sent in ((CALLER, 0), (CallerContext(user_id="dr-x"), 2)):
        graph = build_method("langchain-agent", model=tool_calling_model([lookup, two_searches, "Done."]),
                             tools=[emr, search], config=TCRAGConfig(caller=caller, max_steps=4))
        out = graph.invoke({"question": "Summarise the record of patient P00002."})
        assert out["answer"] == "Done." and out["tool_calls"] == 3 and bool(out["records_read"]) == (sent == 0)
        searched = [k for k in out["knowledge"] if k["tool"] == "WEB_SEARCH"]
        assert len(searched) == 2 and all(("egress_refused" in k.get("error", "")) == (sent == 0) for k in searched)
        assert len(queries) == sent


def calls_at_once(*replies):
    """One scripted reply making the calls of ``replies`` at once."""
    return replies[0].model_copy(update={"tool_calls": [c for r in replies for c in r.tool_calls]})


def test_every_method_calls_tools_only_through_the_kernel():
    """No method module invokes a tool itself: the kernel's call_tool (which applies the egress rule,
    the identity and the bounds) is the one door."""
    offenders = []
    for path in METHODS_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name in ("invoke_tool", "ainvoke_tool", "_run_layer", "run"):
                    offenders.append(f"{path.relative_to(METHODS_DIR)}:{node.lineno} {name}")
                target = getattr(node.func, "value", None)
                if name in ("invoke", "ainvoke") and "tool" in ast.unparse(target).lower():
                    offenders.append(f"{path.relative_to(METHODS_DIR)}:{node.lineno} {ast.unparse(node.func)}")
    assert offenders == []
    assert all(hasattr(spec.holder, "call_tool") for spec in METHODS.values())
