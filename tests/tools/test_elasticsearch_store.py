"""Elasticsearch backend specifics against a real Elasticsearch-API server (noida-db), and faults:
server down, timeout, HTTP 500 and garbage answers each give the DOC_RAG tool a ToolError."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from es_server import FaultServer

from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.chunking import Chunk, Document
from tcrag_langgraph.tools.documents import StoreError, default_embeddings, document_tool
from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore, index_mappings
from tcrag_langgraph.tools.indexing import build_index
from tcrag_langgraph.tools.layer import ToolOptions

SECRET = "TOPSECRET-api-key-9f8e7d"


def fresh_index() -> str:
    return f"test-es-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def live_store(elasticsearch_url, request):
    store = ElasticsearchStore(elasticsearch_url, index=fresh_index(), embeddings=default_embeddings())
    request.addfinalizer(lambda: (store.delete_index(), store.close()))
    return store


def quick_tool(store, *, mode="bm25", **layer_options):
    """A DOC_RAG tool that fails fast: BM25 (no model needed), no retry unless asked, 10 s limit."""
    layer_options.setdefault("retries", 0)
    layer_options.setdefault("timeout_s", 10.0)
    return document_tool(store, mode=mode, options=ToolOptions(**layer_options))


# ----------------------------------------------------------------------------- live server


def test_index_is_created_with_text_keyword_and_vector_mappings(live_store):
    assert live_store.create_index() is True
    assert live_store.create_index() is False  # already there
    mapping = live_store.client.indices.get_mapping(index=live_store.index)[live_store.index]["mappings"]["properties"]
    assert mapping["source_id"]["type"] == "keyword" and mapping["chunk_id"]["type"] == "keyword"
    assert mapping["search_text"]["type"] == "text" and mapping["search_text"]["analyzer"] == "tcrag_medical"
    # the server knows the custom analyzer and applies it: codes whole and in parts, single digits kept
    analyzed = live_store.client.indices.analyze(index=live_store.index, field="search_text", text="E11.9 type 2")
    assert [t["token"] for t in analyzed["tokens"]] == ["e11.9", "e11", "9", "type", "2"]
    assert mapping["vector"] == {**mapping["vector"], "type": "dense_vector", "dims": 384, "similarity": "cosine"}
    live_store.add([Chunk("a#0", "a", "Digoxin slows the heart rate.")])
    assert live_store.count() == 1
    assert live_store.create_index(recreate=True) is True and live_store.count() == 0


def test_bulk_rejections_are_reported_not_swallowed(live_store):
    live_store.create_index(dims=384)
    chunks = [Chunk(f"b#{i}", "b", f"text {i}") for i in range(3)]
    with pytest.raises(StoreError) as info:
        live_store.add(chunks, vectors=np.ones((3, 3), dtype=np.float32))  # wrong dimension for the mapping
    assert "3 of 3 chunks failed" in str(info.value) and "dimension" in str(info.value)
    assert live_store.count() == 0


def test_missing_index_is_an_error_for_the_tool(elasticsearch_url):
    store = ElasticsearchStore(elasticsearch_url, index=fresh_index())
    assert store.count() == 0
    result = quick_tool(store).invoke("anything")
    assert isinstance(result, ToolError) and result.kind == "unavailable" and "tcrag index" in result.message


def test_build_index_into_elasticsearch(elasticsearch_url, tmp_path):
    index = fresh_index()
    (tmp_path / "docs.jsonl").write_text(
        json.dumps({"id": "x1", "title": "Gout", "text": "Colchicine treats acute gout flares."}) + "\n"
        + json.dumps({"id": "x2", "text": "Methotrexate treats rheumatoid arthritis."}) + "\n"
    )
    report = build_index([tmp_path], es_url=elasticsearch_url, index=index, progress=False)
    store = ElasticsearchStore(elasticsearch_url, index=index)
    try:
        assert (report.documents, report.chunks, report.total_chunks) == (2, 2, 2)
        assert index in report.target
        hits = store.search("colchicine", k=2, mode="bm25")
        assert [h.chunk.source_id for h in hits] == ["x1"] and hits[0].chunk.title == "Gout"
    finally:
        store.delete_index()
        store.close()


def test_constructor_validation():
    with pytest.raises(ValueError):
        ElasticsearchStore("ftp://example", index="ok")
    with pytest.raises(ValueError):
        ElasticsearchStore("http://127.0.0.1:9200", index="Bad Index!")
    with pytest.raises(ValueError):
        ElasticsearchStore("http://127.0.0.1:9200", api_key="k", basic_auth=("u", "p"))
    with pytest.raises(ValueError):
        ElasticsearchStore("http://127.0.0.1:9200", request_timeout=0)
    with pytest.raises(ValueError):
        index_mappings(0)


# ----------------------------------------------------------------------------- faults


def test_server_down_gives_unavailable(refused_url):
    store = ElasticsearchStore(refused_url, index="docs")
    tool = quick_tool(store, retries=1)
    result = tool.invoke("heart failure")
    assert isinstance(result, ToolError)
    assert result.kind == "unavailable" and result.retryable and "cannot connect" in result.message
    with pytest.raises(StoreError) as info:  # the store itself raises a typed error
        store.search("heart failure", mode="bm25")
    assert info.value.kind == "unavailable"


def test_http_500_gives_unavailable_after_retries():
    with FaultServer("error500") as server:
        store = ElasticsearchStore(server.url, index="docs")
        result = quick_tool(store, retries=2).invoke({"query": "sepsis"})
        assert isinstance(result, ToolError) and result.kind == "unavailable" and "HTTP 500" in result.message
        assert server.requests == 3  # one call plus two retries by the tool layer


def test_garbage_answer_gives_bad_response_without_retry():
    with FaultServer("garbage") as server:
        store = ElasticsearchStore(server.url, index="docs")
        result = quick_tool(store, retries=2).invoke("sepsis")
        assert isinstance(result, ToolError) and result.kind == "bad_response"
        assert server.requests == 1


def test_hybrid_search_fault_is_still_an_error():
    with FaultServer("garbage") as server:
        result = quick_tool(ElasticsearchStore(server.url, index="docs"), mode="hybrid").invoke("sepsis")
        assert isinstance(result, ToolError) and result.kind == "bad_response"


def test_client_timeout_gives_timeout():
    with FaultServer("hang", hang_s=3) as server:
        store = ElasticsearchStore(server.url, index="docs", request_timeout=0.3)
        started = time.monotonic()
        result = quick_tool(store).invoke("sepsis")
        assert isinstance(result, ToolError) and result.kind == "timeout" and result.retryable
        assert time.monotonic() - started < 2.5


def test_tool_deadline_gives_timeout_even_when_the_client_waits_longer():
    with FaultServer("hang", hang_s=3) as server:
        store = ElasticsearchStore(server.url, index="docs", request_timeout=30)
        started = time.monotonic()
        result = quick_tool(store, timeout_s=0.5).invoke("sepsis")
        assert isinstance(result, ToolError) and result.kind == "timeout"
        assert time.monotonic() - started < 2.0


def test_credentials_are_sent_but_never_shown():
    with FaultServer("error500") as server:
        store = ElasticsearchStore(server.url, index="docs", api_key=SECRET)
        result = quick_tool(store).invoke("sepsis")
        assert server.headers[0]["authorization"] == f"ApiKey {SECRET}"
        assert isinstance(result, ToolError) and SECRET not in str(result)
        assert SECRET not in repr(store) and store.secrets == (SECRET,)
        host = server.url.split("//")[1]
        with_password = ElasticsearchStore(f"http://elastic:{SECRET}@{host}", index="docs")
        assert SECRET not in repr(with_password) and SECRET not in with_password.url
        result = quick_tool(with_password).invoke("sepsis")
        assert server.headers[-1]["authorization"].startswith("Basic ")
        assert isinstance(result, ToolError) and SECRET not in str(result)


def test_basic_auth_echoed_by_the_server_never_reaches_the_observation():
    """A server echoing the request headers puts ``Basic base64(user:password)`` into its error."""
    import base64

    token = base64.b64encode(f"elastic:{SECRET}".encode()).decode()
    with FaultServer("echo500") as server:
        store = ElasticsearchStore(server.url, index="docs", basic_auth=("elastic", SECRET))
        result = quick_tool(store).invoke("sepsis")
        assert server.headers[0]["authorization"] == f"Basic {token}"  # sent, and echoed in the 500 body
        assert isinstance(result, ToolError) and "request headers: authorization=Basic ***" in result.message
        assert SECRET not in str(result) and token not in str(result)
        host = server.url.split("//")[1]
        in_url = ElasticsearchStore(f"http://elastic:{SECRET}@{host}", index="docs")
        result = quick_tool(in_url).invoke("sepsis")
        assert isinstance(result, ToolError) and "request headers" in result.message
        assert SECRET not in str(result) and token not in str(result)
