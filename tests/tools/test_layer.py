"""The shared tool layer: repair, validation, time limit, retries, trimming, caching, never raising."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Optional

import pytest
from langchain_core.messages import ToolMessage
from pydantic import BaseModel, Field, ValidationError

from tcrag_langgraph.tools.identity import CALLER_KEY, CallerContext, caller_from_config
from tcrag_langgraph.tools.tokens import count_tokens
from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.layer import InputRepairError, ToolFailure, make_tool, repair_input


class Query(BaseModel):
    query: str = Field(min_length=1)
    k: int = Field(default=3, ge=1, le=20)


class Pair(BaseModel):
    a: str
    b: str


class Counter:
    """A backend that records its calls and fails the first ``fail`` times."""

    def __init__(self, fail: int = 0, exc: Optional[BaseException] = None, result=None) -> None:
        self.calls: list[Query] = []
        self.fail = fail
        self.exc = exc or ConnectionError("connection reset")
        self.result = result
        self.lock = threading.Lock()

    def __call__(self, args: Query):
        with self.lock:
            self.calls.append(args)
            n = len(self.calls)
        if n <= self.fail:
            raise self.exc
        return self.result if self.result is not None else f"q={args.query} k={args.k}"


def tool(func, **kw):
    kw.setdefault("backoff", 0.0)
    return make_tool("TEST_TOOL", "A test tool.", func, args_schema=Query, **kw)


# ---------------------------------------------------------------- input repair


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("heart failure", "q=heart failure k=3"),
        ('"heart failure"', "q=heart failure k=3"),
        ("`heart failure`", "q=heart failure k=3"),
        ("```\nheart failure\n```", "q=heart failure k=3"),
        ('{"query": "asthma", "k": 2}', "q=asthma k=2"),
        ('```json\n{"query": "asthma", "k": 2}\n```', "q=asthma k=2"),
        ("'{\"query\": \"asthma\"}'", "q=asthma k=3"),
        ({"query": "asthma"}, "q=asthma k=3"),
        ({"Query": "asthma", "K": "4"}, "q=asthma k=4"),  # case and str->int coercion
        ({"search_term": "asthma"}, "q=asthma k=3"),  # one unknown key -> the primary field
        ({"question": "asthma", "k": 5}, "q=asthma k=5"),
        ({"query": "  'asthma' "}, "q=asthma k=3"),
        ('[{"query": "gout"}]', "q=gout k=3"),
    ],
)
def test_repairs_what_models_write(raw, expected):
    assert tool(Counter()).invoke(raw) == expected


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("", "empty input"),
        ("  ``  ", "empty input"),
        ('{"query": "x",', "does not parse"),
        ('["a", "b"]', "JSON list"),
        ({"query": "x", "foo": 1, "bar": 2}, "unknown field(s) 'foo', 'bar'"),
        ({"query": "x", "foo": 1}, "unknown field(s) 'foo'"),  # primary already set: ambiguous
        ({"query": "x", "k": 999}, "k: Input should be less than or equal to 20"),
        ({"query": ["not", "text"]}, "query: Input should be a valid string"),
        (12, "got int"),
    ],
)
def test_unrepairable_input_is_bad_input_with_actionable_message(raw, fragment):
    backend = Counter()
    result = tool(backend).invoke(raw) if not isinstance(raw, int) else tool(backend)._run_layer(raw, None)
    assert isinstance(result, ToolError)
    assert result.kind == "bad_input" and result.tool == "TEST_TOOL"
    assert fragment in result.message
    assert "query (str)" in result.message  # tells the model what to write instead
    assert backend.calls == []  # the backend never saw bad input


def test_plain_text_needs_a_primary_field_when_several_are_required():
    with pytest.raises(InputRepairError, match="ambiguous"):
        repair_input("just text", Pair)
    with pytest.raises(InputRepairError, match="b: Field required"):
        repair_input("just text", Pair, primary_field="a")
    # a text parser decides for itself
    parsed = repair_input("x|y", Pair, text_parser=lambda t: dict(zip("ab", t.split("|"))))
    assert (parsed.a, parsed.b) == ("x", "y")


def test_text_parser_errors_become_bad_input():
    def parser(text):
        raise ValueError("no code found")

    t = make_tool("P", "d", lambda a: "x", args_schema=Pair, text_parser=parser)
    err = t.invoke("hello")
    assert isinstance(err, ToolError) and err.kind == "bad_input" and "no code found" in err.message


# ---------------------------------------------------------------- time limit and retries


def test_slow_backend_times_out_quickly():
    def slow(args):
        time.sleep(3)
        return "late"

    start = time.monotonic()
    err = tool(slow, timeout_s=0.3).invoke("x")
    elapsed = time.monotonic() - start
    assert isinstance(err, ToolError) and err.kind == "timeout" and err.retryable
    assert elapsed < 1.5


def test_transient_failures_are_retried_then_succeed():
    backend = Counter(fail=2)
    assert tool(backend, retries=2).invoke("x") == "q=x k=3"
    assert len(backend.calls) == 3


def test_transient_failures_exhaust_retries_as_unavailable():
    backend = Counter(fail=10)
    err = tool(backend, retries=1).invoke("x")
    assert isinstance(err, ToolError) and err.kind == "unavailable" and err.retryable
    assert "2 attempt(s)" in err.message and "connection reset" in err.message
    assert len(backend.calls) == 2


def test_backoff_is_exponential():
    backend = Counter(fail=2)
    start = time.monotonic()
    assert tool(backend, retries=2, backoff=0.1).invoke("x") == "q=x k=3"
    # waits 0.1 then 0.2 s (tenacity wait_exponential)
    assert 0.28 <= time.monotonic() - start < 2.0


def test_non_transient_errors_are_not_retried():
    backend = Counter(fail=5, exc=KeyError("boom"))
    err = tool(backend, retries=3).invoke("x")
    assert isinstance(err, ToolError) and err.kind == "internal" and "KeyError" in err.message
    assert len(backend.calls) == 1


def test_tool_failure_picks_kind_and_retryability():
    backend = Counter(fail=1, exc=ToolFailure("unavailable", "503 from server", retryable=True))
    assert tool(backend, retries=1).invoke("x") == "q=x k=3"
    assert len(backend.calls) == 2
    hard = Counter(fail=5, exc=ToolFailure("forbidden", "not yours"))
    err = tool(hard, retries=3).invoke("x")
    assert (err.kind, err.message, len(hard.calls)) == ("forbidden", "not yours", 1)


def test_custom_transient_types():
    backend = Counter(fail=1, exc=OSError("flaky disk"))
    assert tool(backend, retries=1, transient=OSError).invoke("x") == "q=x k=3"


# ---------------------------------------------------------------- output handling


@pytest.mark.parametrize("bad", [b"bytes", 42, ["a"], "   ", "\x00"])
def test_garbage_backend_output_is_bad_response(bad):
    err = tool(lambda a: bad).invoke("x")
    assert isinstance(err, ToolError) and err.kind == "bad_response"


def test_none_output_is_bad_response():
    err = tool(lambda a: None).invoke("x")
    assert isinstance(err, ToolError) and err.kind == "bad_response"


def test_output_is_trimmed_to_token_budget():
    long_text = " ".join(f"word{i}" for i in range(2000))
    out = tool(lambda a: long_text, max_output_tokens=40).invoke("x")
    assert isinstance(out, str) and out.endswith("[trimmed]")
    assert count_tokens(out) <= 40 + 5  # budget plus the trim marker
    assert out.startswith("word0 word1")


def test_backend_tool_error_passes_through():
    err = tool(lambda a: ToolError("TEST_TOOL", "forbidden", "no access")).invoke("x")
    assert err == ToolError("TEST_TOOL", "forbidden", "no access")


# ---------------------------------------------------------------- cache


def test_cache_hits_on_normalised_input_and_never_caches_errors():
    backend = Counter()
    t = tool(backend, cache_size=2)
    assert t.invoke("asthma") == t.invoke({"query": "asthma"}) == t.invoke('"asthma"') == "q=asthma k=3"
    assert len(backend.calls) == 1
    t.invoke("b")
    t.invoke("c")  # evicts "asthma" (LRU of 2)
    t.invoke("asthma")
    assert len(backend.calls) == 4
    assert t.cache_info == {"size": 2, "max": 2}

    failing = Counter(fail=1, exc=KeyError("x"))
    t2 = tool(failing, cache_size=4)
    assert isinstance(t2.invoke("y"), ToolError)
    assert t2.invoke("y") == "q=y k=3"  # the error was not cached
    assert len(failing.calls) == 2


def test_cache_is_per_caller_when_backend_reads_config():
    seen = []

    def who(args, config):
        caller = caller_from_config(config)
        seen.append(caller.user_id if caller else None)
        return f"for {seen[-1]}"

    t = make_tool("WHO", "d", who, args_schema=Query, cache_size=8)
    cfg = lambda uid: {"configurable": {CALLER_KEY: CallerContext(user_id=uid)}}
    assert t.invoke("x", config=cfg("alice")) == "for alice"
    assert t.invoke("x", config=cfg("bob")) == "for bob"
    assert t.invoke("x", config=cfg("alice")) == "for alice"
    assert t.invoke("x") == "for None"
    assert seen == ["alice", "bob", None]


# ---------------------------------------------------------------- secrets, async, LangChain


def test_secrets_never_appear_in_errors(caplog):
    key = "sk-supersecret-123"

    def leaky(args):
        raise ConnectionError(f"failed to reach https://api.example/?key={key}")

    with caplog.at_level("DEBUG"):
        err = tool(leaky, retries=0, secrets=[key]).invoke("x")
    assert isinstance(err, ToolError) and key not in err.message and "***" in err.message
    assert key not in caplog.text
    assert key not in repr(tool(leaky, secrets=[key]).options)


async def test_ainvoke_with_sync_backend_and_async_backend():
    assert await tool(Counter()).ainvoke({"query": "a"}) == "q=a k=3"

    calls = []

    async def afunc(args):
        calls.append(args.query)
        if len(calls) == 1:
            raise ConnectionError("once")
        return f"async {args.query}"

    t = make_tool("ASYNC", "d", afunc=afunc, args_schema=Query, backoff=0)
    assert await t.ainvoke("b") == "async b"
    assert calls == ["b", "b"]
    # sync invoke of an async-only tool works even while an event loop runs in this thread
    assert t.invoke("c") == "async c"


async def test_async_timeout_cancels():
    async def hang(args):
        await asyncio.sleep(5)
        return "never"

    t = make_tool("HANG", "d", afunc=hang, args_schema=Query, timeout_s=0.2)
    start = time.monotonic()
    err = await t.ainvoke("x")
    assert isinstance(err, ToolError) and err.kind == "timeout"
    assert time.monotonic() - start < 1.5
    err2 = await tool(lambda a: time.sleep(2) or "late", timeout_s=0.2).ainvoke("x")
    assert isinstance(err2, ToolError) and err2.kind == "timeout"


def test_tool_call_gives_tool_message_with_error_status():
    t = tool(Counter(fail=9, exc=KeyError("x")))
    msg = t.invoke({"type": "tool_call", "id": "call-1", "name": "TEST_TOOL", "args": {"query": "a"}})
    assert isinstance(msg, ToolMessage) and msg.status == "error"
    assert isinstance(msg.artifact, ToolError) and msg.content.startswith("[TEST_TOOL error: internal]")
    ok = tool(Counter()).invoke({"type": "tool_call", "id": "call-2", "name": "TEST_TOOL", "args": {"query": "a"}})
    assert ok.status == "success" and ok.content == "q=a k=3"


def test_schema_is_exposed_for_tool_calling_llms():
    t = tool(Counter())
    schema = t.tool_call_schema.model_json_schema()
    assert schema["required"] == ["query"] and set(schema["properties"]) == {"query", "k"}


def test_dict_keys_that_collide_with_langchain_kwargs_are_safe():
    # "config"/"run_manager" as keys must not clash with LangChain's injected kwargs
    err = tool(Counter()).invoke({"config": "x", "run_manager": "y"})
    assert isinstance(err, ToolError) and err.kind == "bad_input"
    assert tool(Counter()).invoke({"config": "x"}) == "q=x k=3"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"retries": -1}, "retries"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"transient": (int,)}, "exception types"),
        ({"primary_field": "nope"}, "primary_field"),
    ],
)
def test_options_are_validated(kwargs, match):
    with pytest.raises((ValueError, ValidationError), match=match):
        make_tool("T", "d", lambda a: "x", args_schema=Query, **kwargs)


def test_bad_tool_definitions_are_rejected():
    with pytest.raises(ValueError, match="func or afunc"):
        make_tool("T", "d", args_schema=Query)
    with pytest.raises(ValueError, match="tool name"):
        make_tool("bad name!", "d", lambda a: "x", args_schema=Query)
    with pytest.raises(TypeError):
        make_tool("T", "d", lambda a: "x", args_schema=dict)
