"""The shared tool layer: repair, validation, time limit, retries, trimming, caching, never raising."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import quote, quote_plus

import httpx

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from pydantic import BaseModel, Field, ValidationError

from tcrag_langgraph.tools.identity import CALLER_KEY, CallerContext, caller_from_config
from tcrag_langgraph.tools.tokens import count_tokens
from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.layer import (
    TOOL_POOL_WORKERS,
    InputRepairError,
    ToolFailure,
    ToolOptions,
    ainvoke_tool,
    invoke_tool,
    is_tool_error,
    make_tool,
    repair_input,
)
from tcrag_langgraph.tools.secrets import CredentialGuard, guarded_httpx_async_client, guarded_httpx_client, scrub_secrets


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


# ---------------------------------------------------------------- invoke_tool: one pipeline for any tool


class Plain(BaseTool):
    """A plain LangChain tool (not made by make_tool) running ``behave(text)``."""

    name: str = "PLAIN"
    description: str = "plain tool"
    behave: Callable[[str], Any]

    def _run(self, query: str) -> Any:
        return self.behave(query)


def test_invoke_tool_one_deadline_overrides_the_tools_own_and_bounds_retries():
    calls = []

    def slow_flaky(args):
        calls.append(time.monotonic())
        time.sleep(0.3)
        raise ConnectionError("reset")

    # the tool's own limit is 30 s with 9 retries; the call's 0.8 s is the only deadline
    t = tool(slow_flaky, timeout_s=30, retries=9)
    start = time.monotonic()
    err = invoke_tool(t, "x", timeout_s=0.8)
    elapsed = time.monotonic() - start
    assert isinstance(err, ToolError) and err.kind in {"timeout", "unavailable"}
    assert elapsed < 1.3  # about the deadline, not twice it
    time.sleep(0.4)  # let an abandoned attempt finish: no retry may start after the deadline
    assert len(calls) <= 3 and all(c - start < 0.8 for c in calls)


@pytest.mark.parametrize("kind", ["layered", "plain"])
def test_invoke_tool_times_out_within_about_the_deadline(kind):
    def sleep(_):
        time.sleep(2)
        return "late"

    t = tool(sleep, timeout_s=30) if kind == "layered" else Plain(behave=sleep)
    start = time.monotonic()
    err = invoke_tool(t, "x", timeout_s=0.4)
    elapsed = time.monotonic() - start
    assert isinstance(err, ToolError) and err.kind == "timeout" and "0.4 s" in err.message
    assert 0.35 < elapsed < 0.9


def test_error_messages_obey_the_token_budget():
    huge = " ".join(f"term{i}" for i in range(12_000))  # ~60k characters
    assert len(huge) > 60_000

    def echo_parser(text):
        raise ValueError(f"no code found in {text}")

    t = make_tool("P", "d", lambda a: "x", args_schema=Pair, text_parser=echo_parser)
    for outcome in (
        invoke_tool(t, huge, max_output_tokens=100),  # bad_input that echoes the input
        invoke_tool(tool(lambda a: (_ for _ in ()).throw(KeyError(a.query))), huge, max_output_tokens=100),
        invoke_tool(tool(lambda a: ToolError("TEST_TOOL", "forbidden", a.query)), huge, max_output_tokens=100),
        invoke_tool(Plain(behave=lambda q: (_ for _ in ()).throw(RuntimeError(q))), huge, max_output_tokens=100),
    ):
        assert is_tool_error(outcome)
        assert count_tokens(str(outcome)) <= 100 + 5 and str(outcome).endswith("[trimmed]")
    # the tool's own budget applies to its errors when no per-call budget is given
    err = tool(lambda a: (_ for _ in ()).throw(KeyError(a.query)), max_output_tokens=50).invoke(huge)
    assert count_tokens(str(err)) <= 50 + 5


def test_observations_trimmed_to_the_per_call_budget_and_cache_keeps_the_whole_text():
    text = " ".join(f"w{i}" for i in range(600))
    t = tool(lambda a: text, max_output_tokens=20, cache_size=4)
    small = invoke_tool(t, "x")
    assert count_tokens(small) <= 25 and small.endswith("[trimmed]")
    big = invoke_tool(t, "x", max_output_tokens=5000)  # served from cache, untrimmed
    assert big == text and t.cache_info["size"] == 1
    assert count_tokens(invoke_tool(Plain(behave=lambda q: text), "x", max_output_tokens=30)) <= 35


def test_plain_tool_faults_are_typed_errors():
    raised = invoke_tool(Plain(behave=lambda q: 1 / 0), "x")
    assert isinstance(raised, ToolError) and raised.kind == "exception" and "ZeroDivisionError" in raised.message
    for empty in ("", "   ", None, []):
        out = invoke_tool(Plain(behave=lambda q, e=empty: e), "x")
        assert isinstance(out, ToolError) and out.kind == "bad_response"
    returned = invoke_tool(Plain(behave=lambda q: ToolError("PLAIN", "forbidden", "no")), "x")
    assert returned == ToolError("PLAIN", "forbidden", "no")
    assert invoke_tool(Plain(behave=lambda q: f"ok {q}"), "x") == "ok x"
    # a ToolCall input gives a ToolMessage inside; the outcome is still text or ToolError
    call = {"type": "tool_call", "id": "c1", "name": "TEST_TOOL", "args": {"query": "a"}}
    assert invoke_tool(tool(Counter()), call) == "q=a k=3"
    assert invoke_tool(tool(Counter(fail=9, exc=KeyError("k"))), call).kind == "internal"


def test_invoke_tool_rejects_bad_limits():
    for kwargs in ({"timeout_s": 0}, {"timeout_s": -1}, {"max_output_tokens": 0}, {"max_output_tokens": 2.5}):
        with pytest.raises(ValueError):
            invoke_tool(tool(Counter()), "x", **kwargs)


def _tool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("tcrag-tool"))


def test_pool_is_reused_and_bounded():
    layered, plain = tool(Counter()), Plain(behave=lambda q: "ok")
    for _ in range(3):  # warm up
        invoke_tool(layered, "x"), invoke_tool(plain, "x")
    before = threading.active_count()
    for _ in range(50):
        assert invoke_tool(layered, "x") == "q=x k=3" and invoke_tool(plain, "x") == "ok"
    assert threading.active_count() == before  # no thread per call
    # overrunning calls hold workers, but the pool never grows past its bound
    hang = Plain(behave=lambda q: time.sleep(0.5) or "late")
    outcomes = [invoke_tool(hang, "x", timeout_s=0.02) for _ in range(30)]
    assert all(isinstance(o, ToolError) and o.kind == "timeout" for o in outcomes)
    assert _tool_threads() <= TOOL_POOL_WORKERS
    assert threading.active_count() <= before + TOOL_POOL_WORKERS


def test_is_tool_error():
    err = ToolError("T", "timeout", "slow")
    assert is_tool_error(err)
    assert not is_tool_error(str(err))  # text is never guessed at
    assert not is_tool_error("ok") and not is_tool_error(None)
    assert is_tool_error(ToolMessage(content="x", tool_call_id="1", status="error"))
    assert is_tool_error(ToolMessage(content="x", tool_call_id="1", artifact=err))
    assert not is_tool_error(ToolMessage(content="x", tool_call_id="1"))


async def test_ainvoke_tool_same_outcomes():
    async def hang(args):
        await asyncio.sleep(3)
        return "never"

    t = make_tool("HANG", "d", afunc=hang, args_schema=Query, timeout_s=30)
    start = time.monotonic()
    err = await ainvoke_tool(t, "x", timeout_s=0.3)
    assert isinstance(err, ToolError) and err.kind == "timeout" and time.monotonic() - start < 0.9
    slow_plain = Plain(behave=lambda q: time.sleep(2) or "late")
    err = await ainvoke_tool(slow_plain, "x", timeout_s=0.3)
    assert isinstance(err, ToolError) and err.kind == "timeout"
    assert await ainvoke_tool(tool(Counter()), {"query": "a"}, max_output_tokens=3) == "q=a k …[trimmed]"
    raised = await ainvoke_tool(Plain(behave=lambda q: 1 / 0), "x")
    assert isinstance(raised, ToolError) and raised.kind == "exception"


def test_make_tool_takes_one_options_object_and_overrides():
    opts = ToolOptions(timeout_s=5, retries=1, max_output_tokens=64, secrets=("k1",))
    t = make_tool("T", "d", lambda a: "x", args_schema=Query, options=opts, retries=0)
    assert (t.options.timeout_s, t.options.retries, t.options.max_output_tokens, t.options.secrets) == (5, 0, 64, ("k1",))
    assert make_tool("T", "d", lambda a: "x", args_schema=Query, options=opts).options == opts
    with pytest.raises(TypeError, match="retrys"):
        make_tool("T", "d", lambda a: "x", args_schema=Query, retrys=1)
    with pytest.raises(TypeError, match="ToolOptions"):
        make_tool("T", "d", lambda a: "x", args_schema=Query, options={"retries": 1})


# ---------------------------------------------------------------- secrets in every encoding


USER, PASSWORD, API_KEY, TOKEN = "svc-reader", "p@ss/w0rd+Z", "sk-live-9f8e7d6c", "tok.abc-123_XYZ"


def _leaks(text: str) -> list[str]:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    forms = [PASSWORD, API_KEY, TOKEN, quote(PASSWORD, safe=""), quote_plus(PASSWORD), basic, basic.rstrip("=")]
    return [f for f in forms if f in text]


def test_scrub_secrets_every_encoding():
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    text = (
        f"url=https://{USER}:{quote(PASSWORD, safe='')}@db.example/x?key={quote_plus(API_KEY)} "
        f"plain={PASSWORD} hdr='Authorization': 'Basic {basic}' bare={basic} Bearer {TOKEN} "
        f"b64key={base64.b64encode(API_KEY.encode()).decode()}"
    )
    clean = scrub_secrets(text, [USER, PASSWORD, API_KEY, TOKEN])
    assert _leaks(clean) == [] and USER not in clean
    assert base64.b64encode(API_KEY.encode()).decode() not in clean
    assert "https://***@db.example/x" in clean and "Basic ***" in clean and "Bearer ***" in clean
    # by position, even when the secret was not declared
    assert scrub_secrets("see https://u:pw@h/ and Authorization: Bearer abc.def") == "see https://***@h/ and Authorization: Bearer ***"
    # ordinary text is left alone
    assert scrub_secrets("Basic metabolic panel; authorization pending") == "Basic metabolic panel; authorization pending"


def test_secrets_scrubbed_from_observations_errors_and_logs_through_a_real_tool(http_server, caplog):
    http_server.respond = lambda req, n: http_server.Reply(
        200 if req.path == "/ok" else 500, {"you_sent": req.headers, "path": req.path, "query": req.query}
    )

    def backend(args):
        url = f"http://{USER}:{quote(PASSWORD, safe='')}@{http_server.url.removeprefix('http://')}/{args.query}"
        response = httpx.get(url, params={"key": API_KEY}, headers={"X-Api-Key": API_KEY, "X-Token": f"Bearer {TOKEN}"})
        if response.status_code >= 400:
            raise ToolFailure("unavailable", f"{url} answered {response.status_code}: {response.text}")
        return response.text

    t = make_tool("ECHO_HTTP", "d", backend, args_schema=Query, secrets=[USER, PASSWORD, API_KEY, TOKEN], max_output_tokens=2000)
    with caplog.at_level("DEBUG"):
        ok = invoke_tool(t, "ok")
        failed = invoke_tool(t, "fail")
    seen = http_server.requests[0].headers
    assert seen["authorization"].startswith("Basic ") and seen["x-api-key"] == API_KEY  # the server really echoed them
    assert isinstance(ok, str) and "you_sent" in ok and "Basic ***" in ok
    assert isinstance(failed, ToolError) and "answered 500" in failed.message
    for text in (ok, failed.message, caplog.text):
        assert _leaks(text) == [], text


def test_credentials_stay_on_their_origin_across_redirects(http_server, second_http_server):
    second_http_server.respond = lambda req, n: second_http_server.Reply(200, {"headers": req.headers})
    http_server.respond = lambda req, n: http_server.Reply(302, b"", headers={"Location": f"{second_http_server.url}/landing"})
    headers = {"X-Api-Key": API_KEY, "Authorization": f"Bearer {TOKEN}", "X-Searx-Key": API_KEY}

    with httpx.Client(headers=headers, follow_redirects=True) as unguarded:  # the problem being fixed
        unguarded.get(f"{http_server.url}/search")
    leaked = second_http_server.requests[-1].headers
    assert leaked["x-api-key"] == API_KEY and "authorization" not in leaked  # httpx drops only Authorization

    with guarded_httpx_client(http_server.url, headers=headers, extra_headers=["X-Searx-Key"], follow_redirects=True) as client:
        assert client.get(f"{http_server.url}/search").status_code == 200
    assert http_server.requests[-1].headers["x-api-key"] == API_KEY  # the configured origin still gets them
    landed = second_http_server.requests[-1].headers
    assert not {"x-api-key", "x-searx-key", "authorization"} & set(landed)


async def test_async_guarded_client_strips_cross_origin_credentials(http_server, second_http_server):
    second_http_server.respond = lambda req, n: second_http_server.Reply(200, {})
    http_server.respond = lambda req, n: http_server.Reply(307, b"", headers={"Location": f"{second_http_server.url}/x"})
    async with guarded_httpx_async_client(http_server.url, headers={"X-Api-Key": API_KEY}, follow_redirects=True) as client:
        await client.get(f"{http_server.url}/y")
    assert http_server.requests[-1].headers["x-api-key"] == API_KEY
    assert "x-api-key" not in second_http_server.requests[-1].headers


def test_credential_guard_needs_an_origin():
    with pytest.raises(ValueError, match="origin"):
        CredentialGuard()


@pytest.mark.parametrize(
    "module", ["layer", "layer.options", "layer.repair", "layer.outcome", "layer.tool", "layer.pipeline", "secrets"]
)
def test_docstring_examples_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"tcrag_langgraph.tools.{module}"), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
