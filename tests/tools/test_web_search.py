"""WEB_SEARCH: the offline encyclopedia over real packaged data, and SearxNG over a real loopback server."""

from __future__ import annotations

import time

import pytest

from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.web_search import (
    WEB_SEARCH_NAME,
    EncyclopediaEntry,
    EncyclopediaProvider,
    Result,
    SearchProvider,
    SearxngProvider,
    default_web_tool,
    format_results,
    web_tool,
)

API_KEY = "sk-test-9f8e7d6c5b4a"

GOOD = {
    "query": "gout",
    "results": [
        {"title": "Gout - overview", "url": "https://example.org/gout", "content": "Gout is an inflammatory arthritis."},
        {"title": "Hyperuricemia", "url": "https://example.org/urate", "content": "High serum urate."},
        {"title": 42, "url": None, "content": "malformed item is skipped"},
        {"title": "Third", "url": "https://example.org/3", "content": "third hit"},
    ],
}


# ---------------------------------------------------------------- offline encyclopedia (real data)


@pytest.fixture(scope="module")
def encyclopedia_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tcrag-cache")


@pytest.fixture(scope="module")
def encyclopedia(encyclopedia_dir):
    provider = EncyclopediaProvider(cache_dir=encyclopedia_dir)
    provider.search("warm up", 1)  # builds (and persists) the index once for this module
    return provider


def test_encyclopedia_finds_icd_code_by_description(encyclopedia):
    results = encyclopedia.search("type 2 diabetes mellitus without complications", 3)
    assert results[0].title == "E11.9 Type 2 diabetes mellitus without complications (ICD-10-CM)"
    assert results[0].url == "https://www.icd10data.com/search?s=E11.9"
    assert "Diabetes mellitus (E08-E13)" in results[0].snippet  # parent context is part of the entry
    assert len(results) == 3


def test_encyclopedia_finds_hpo_term_with_definition(encyclopedia):
    results = encyclopedia.search("Seizure HP:0001250", 2)
    assert results[0].title == "Seizure (HP:0001250)"  # the exact id comes first
    assert results[0].url == "https://hpo.jax.org/browse/term/HP:0001250"
    assert "neuronal activity" in results[0].snippet
    hits = encyclopedia.search("arachnodactyly long slender fingers", 5)
    assert any(r.url.startswith("https://hpo.jax.org/browse/term/HP:") for r in hits)
    assert any("Arachnodactyly" in r.title for r in hits)


def test_encyclopedia_exact_icd_code_lookup_and_stemming(encyclopedia):
    assert encyclopedia.search("what is i50.9", 1)[0].title.startswith("I50.9 Heart failure, unspecified")
    # "asthmatic" and "asthma" share a stem when PyStemmer is installed; the word itself matches anyway
    assert any("asthma" in r.title.lower() for r in encyclopedia.search("asthma", 3))


def test_encyclopedia_no_match_and_k(encyclopedia):
    assert encyclopedia.search("the of and", 5) == []
    assert encyclopedia.search("qwxzzy plorfnik", 5) == []
    assert len(encyclopedia.search("fracture", 7)) == 7


def test_encyclopedia_index_is_persisted_and_reloads_fast(encyclopedia, encyclopedia_dir, monkeypatch):
    import tcrag_langgraph.tools.web_search.encyclopedia as ws  # where EncyclopediaProvider looks it up

    assert (encyclopedia.index_dir() / "params.index.json").exists()
    assert encyclopedia.index_dir().parent == encyclopedia_dir

    def no_rebuild():
        raise AssertionError("the saved index should have been loaded, not rebuilt")

    monkeypatch.setattr(ws, "medical_entries", no_rebuild)
    start = time.monotonic()
    fresh = EncyclopediaProvider(cache_dir=encyclopedia_dir)
    first = fresh.search("chronic kidney disease stage 3 (moderate)", 2)
    assert time.monotonic() - start < 5.0
    assert first == encyclopedia.search("chronic kidney disease stage 3 (moderate)", 2)
    assert first[0].title.startswith("N18.3")


def test_damaged_cache_is_rebuilt(tmp_path):
    entries = [EncyclopediaEntry("G1", "Gout", "https://x/g", "Arthritis from urate crystals.", "demo")]
    provider = EncyclopediaProvider(entries, cache_dir=tmp_path)
    path = provider.index_dir()
    path.mkdir(parents=True)
    (path / "params.index.json").write_text("{not json")
    assert provider.search("urate", 1)[0].title == "Gout"


def test_custom_entries_rank_by_bm25():
    entries = [
        EncyclopediaEntry("A", "Anemia", "https://x/a", "Low hemoglobin concentration in blood.", "demo"),
        EncyclopediaEntry("B", "Polycythemia", "https://x/b", "High red cell mass and high hemoglobin.", "demo"),
        EncyclopediaEntry("C", "Gout", "https://x/c", "Urate crystal arthritis.", "demo"),
    ]
    provider = EncyclopediaProvider(entries, persist=False)
    titles = [r.title for r in provider.search("low hemoglobin", 3)]
    assert titles[0] == "Anemia" and "Gout" not in titles
    assert isinstance(provider, SearchProvider)


def test_default_tool_over_encyclopedia(encyclopedia):
    tool = web_tool(encyclopedia)
    assert tool.name == WEB_SEARCH_NAME == "WEB_SEARCH"
    out = tool.invoke("gout")
    assert out.startswith("[1] ") and "URL: https://" in out
    out2 = tool.invoke({"search": "gout", "k": 1})  # wrong key repaired
    assert out2.count("URL:") == 1
    assert tool.invoke("the of and") == "No results for 'the of and'."
    err = tool.invoke({"query": "gout", "k": 50})
    assert isinstance(err, ToolError) and err.kind == "bad_input" and "k" in err.message


def test_default_web_tool_factory_uses_encyclopedia(monkeypatch):
    monkeypatch.delenv("TCRAG_SEARXNG_URL", raising=False)
    tool = default_web_tool(max_output_tokens=64)
    assert tool.name == "WEB_SEARCH" and "ICD-10-CM" in tool.description
    assert tool.options.max_output_tokens == 64


def test_format_results_trims_long_snippets():
    text = format_results("q", [Result("T", "https://u", "x" * 1000)], snippet_chars=50)
    assert text.endswith("…") and len(text.splitlines()[-1]) == 50


# ---------------------------------------------------------------- SearxNG over a real loopback server


def searx_tool(url, **kw):
    provider = SearxngProvider(url, api_key=API_KEY, timeout_s=kw.pop("http_timeout_s", 2.0))
    kw.setdefault("backoff", 0.01)
    kw.setdefault("retries", 2)
    return web_tool(provider, **kw)


def test_searxng_good_results_and_request_shape(http_server):
    http_server.respond = lambda req, n: http_server.Reply(200, GOOD)
    out = searx_tool(http_server.url).invoke({"query": "gout", "k": 2})
    assert out == (
        "[1] Gout - overview\nURL: https://example.org/gout\nGout is an inflammatory arthritis.\n\n"
        "[2] Hyperuricemia\nURL: https://example.org/urate\nHigh serum urate."
    )
    req = http_server.requests[0]
    assert req.path == "/search" and req.query["q"] == ["gout"] and req.query["format"] == ["json"]
    assert req.headers["authorization"] == f"Bearer {API_KEY}"  # key sent in a header, not the URL
    assert API_KEY not in str(req.query)


def test_searxng_skips_malformed_items(http_server):
    http_server.respond = lambda req, n: http_server.Reply(200, GOOD)
    out = searx_tool(http_server.url).invoke({"query": "gout", "k": 10})
    assert out.count("URL:") == 3 and "malformed" not in out


def test_searxng_5xx_is_retried_then_unavailable(http_server, caplog):
    http_server.respond = lambda req, n: http_server.Reply(503, {"error": "overloaded"})
    with caplog.at_level("DEBUG"):
        err = searx_tool(http_server.url, retries=2).invoke("gout")
    assert isinstance(err, ToolError) and err.kind == "unavailable" and err.retryable
    assert "HTTP 503" in err.message
    assert len(http_server.requests) == 3  # 1 try + 2 retries
    assert API_KEY not in err.message and API_KEY not in caplog.text


def test_searxng_recovers_after_transient_5xx(http_server):
    http_server.respond = lambda req, n: http_server.Reply(502, "bad gateway") if n == 1 else http_server.Reply(200, GOOD)
    out = searx_tool(http_server.url).invoke("gout")
    assert out.startswith("[1] Gout - overview") and len(http_server.requests) == 2


@pytest.mark.parametrize(
    "reply, fragment",
    [
        ((200, "<html>not json</html>", "text/html"), "did not return JSON"),
        ((200, {"answers": []}, "application/json"), "no 'results' list"),
        ((200, b"\xff\xfe\x00garbage", "application/json"), "did not return JSON"),
    ],
)
def test_searxng_garbage_is_bad_response_without_retry(http_server, reply, fragment):
    status, body, ctype = reply
    http_server.respond = lambda req, n: http_server.Reply(status, body, content_type=ctype)
    err = searx_tool(http_server.url).invoke("gout")
    assert isinstance(err, ToolError) and err.kind == "bad_response" and fragment in err.message
    assert len(http_server.requests) == 1


def test_searxng_auth_failure_is_not_retried(http_server):
    http_server.respond = lambda req, n: http_server.Reply(401, {"error": f"bad key {API_KEY}"})
    err = searx_tool(http_server.url).invoke("gout")
    assert isinstance(err, ToolError) and err.kind == "unavailable" and not err.retryable
    assert "API key" in err.message and API_KEY not in err.message
    assert len(http_server.requests) == 1


def test_searxng_empty_results_is_an_observation(http_server):
    http_server.respond = lambda req, n: http_server.Reply(200, {"results": []})
    assert searx_tool(http_server.url).invoke("zzz") == "No results for 'zzz'."


def test_searxng_slow_server_times_out(http_server):
    http_server.respond = lambda req, n: http_server.Reply(200, GOOD, delay_s=1.5)
    start = time.monotonic()
    err = searx_tool(http_server.url, http_timeout_s=0.3, retries=1).invoke("gout")
    assert isinstance(err, ToolError) and err.kind == "timeout"
    assert len(http_server.requests) == 2  # the HTTP timeout is retried once
    assert time.monotonic() - start < 3.0
    # the layer's own limit also holds when the HTTP client would wait longer
    start = time.monotonic()
    err = searx_tool(http_server.url, http_timeout_s=5, retries=0, timeout_s=0.4).invoke("gout")
    assert isinstance(err, ToolError) and err.kind == "timeout" and time.monotonic() - start < 1.4


def test_searxng_server_down_is_unavailable(refused_url):
    err = searx_tool(refused_url, retries=1).invoke("gout")
    assert isinstance(err, ToolError) and err.kind == "unavailable" and err.retryable
    assert "cannot connect" in err.message and API_KEY not in str(err)


async def test_searxng_async_path(http_server):
    http_server.respond = lambda req, n: http_server.Reply(500, "oops") if n == 1 else http_server.Reply(200, GOOD)
    out = await searx_tool(http_server.url).ainvoke({"query": "gout", "k": 1})
    assert out == "[1] Gout - overview\nURL: https://example.org/gout\nGout is an inflammatory arthritis."
    assert len(http_server.requests) == 2


def test_searxng_results_are_cached(http_server):
    http_server.respond = lambda req, n: http_server.Reply(200, GOOD)
    tool = searx_tool(http_server.url, cache_size=4)
    assert tool.invoke("gout") == tool.invoke('"gout"') == tool.invoke({"query": "gout"})
    assert len(http_server.requests) == 1


def test_default_web_tool_from_environment(http_server, monkeypatch):
    http_server.respond = lambda req, n: http_server.Reply(200, GOOD)
    monkeypatch.setenv("TCRAG_SEARXNG_URL", http_server.url)
    monkeypatch.setenv("TCRAG_SEARCH_API_KEY", API_KEY)
    tool = default_web_tool(retries=0)
    assert tool.invoke("gout").startswith("[1] Gout - overview")
    assert http_server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in repr(tool) and API_KEY not in repr(tool.options)


def test_provider_validation():
    with pytest.raises(ValueError, match="http"):
        SearxngProvider("ftp://x")
    with pytest.raises(TypeError):
        web_tool(object())


# ---------------------------------------------------------------- the API key stays on its origin


def _keyed(url: str) -> SearxngProvider:
    return SearxngProvider(url, api_key=API_KEY, api_key_header="X-API-Key", api_key_prefix="", timeout_s=5.0)


def test_searxng_key_is_not_forwarded_on_a_cross_origin_redirect(http_server, second_http_server):
    second_http_server.respond = lambda req, n: second_http_server.Reply(200, GOOD)
    http_server.respond = lambda req, n: http_server.Reply(
        302, b"", headers={"Location": second_http_server.url + "/search?q=gout&format=json"}
    )
    results = _keyed(http_server.url).search("gout", 2)
    assert [r.title for r in results] == ["Gout - overview", "Hyperuricemia"]  # the redirect was followed
    assert http_server.requests[0].headers["x-api-key"] == API_KEY
    assert "x-api-key" not in second_http_server.requests[0].headers


def test_searxng_key_is_kept_on_a_same_origin_redirect(http_server):
    def respond(req, n):
        if req.path == "/search":
            return http_server.Reply(302, b"", headers={"Location": "/v2/search?q=gout&format=json"})
        return http_server.Reply(200, GOOD)

    http_server.respond = respond
    assert _keyed(http_server.url).search("gout", 1)[0].title == "Gout - overview"
    assert [r.headers.get("x-api-key") for r in http_server.requests] == [API_KEY, API_KEY]


async def test_searxng_async_key_is_not_forwarded_on_a_cross_origin_redirect(http_server, second_http_server):
    second_http_server.respond = lambda req, n: second_http_server.Reply(200, GOOD)
    http_server.respond = lambda req, n: http_server.Reply(302, b"", headers={"Location": second_http_server.url + "/search"})
    assert (await _keyed(http_server.url).asearch("gout", 1))[0].title == "Gout - overview"
    assert "x-api-key" not in second_http_server.requests[0].headers
