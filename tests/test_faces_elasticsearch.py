"""``--es-url`` (or ``TCRAG_ES_URL``) selects the Elasticsearch document store on ``tcrag ask``,
``tcrag eval`` and ``tcrag serve``. A real Elasticsearch-API server (noida-db) holds the packaged
PubMedQA-L corpus (the same chunks and vectors as the embedded store); a scripted model (a test
double) searches DOC_RAG with each of 10 PubMedQA-L questions and concludes, once against the
embedded store and once against Elasticsearch: the same answers, and the same top passage."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from tcrag_langgraph.faces.cli import app

from .helpers_servers import free_port, python_cmd, script_file, server_process
from .tools.es_server import NoidaElasticsearch

runner = CliRunner()
INDEX = "pubmedqa-smoke"
SCRIPT = {"replies": ["Tool_Use: DOC_RAG\nTool_Input: {question}", "Conclusion: the passages above answer {question}"],
          "default_score": 1.0}


@pytest.fixture(scope="module")
def es_url():
    from tcrag_langgraph.tools.chunking import Chunk
    from tcrag_langgraph.tools.documents.embedded import packaged_data_dir
    from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore
    import gzip

    data = packaged_data_dir()
    with gzip.open(data / "docs_pubmedqa.jsonl.gz", "rt", encoding="utf-8") as fh:
        chunks = [Chunk.from_dict(json.loads(line)) for line in fh if line.strip()]
    vectors = np.load(data / "docs_pubmedqa.vectors.f16.npy").astype(np.float32)
    with NoidaElasticsearch() as url:
        store = ElasticsearchStore(url, index=INDEX, request_timeout=120.0)
        assert store.add(chunks, vectors=vectors) == len(chunks)
        store.close()
        yield url


@pytest.fixture(scope="module")
def questions():
    from tcrag_langgraph.eval.datasets import load_dataset, sample_records

    return [r.question for r in sample_records(load_dataset("pubmedqa", split="test", with_context=False),
                                               limit=10, seed=7)]


def _run(args: list[str], env: dict | None = None) -> dict:
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def _top_source(out: dict) -> str:
    (frame,) = [f for f in out["stack"] if f["action"] == "Tool_Use"]
    assert frame["tool_call"]["tool"] == "DOC_RAG" and not frame["tool_call"]["is_error"], frame
    return re.search(r"source: (\S+)", frame["tool_call"]["observation"]).group(1)


@pytest.mark.slow
def test_ask_es_url_gives_the_same_answers_as_the_embedded_store(es_url, questions, tmp_path):
    embedded = script_file(tmp_path / "embedded.json", {**SCRIPT, "real_tools": True})
    plain = script_file(tmp_path / "plain.json", SCRIPT)
    same_top = 0
    for question in questions:
        a = _run(["ask", question, "--scripted", str(embedded), "--json"])
        b = _run(["ask", question, "--scripted", str(plain), "--json"],
                 env={"TCRAG_ES_URL": es_url, "TCRAG_ES_INDEX": INDEX})  # the environment variables alone
        assert a["answer"] == b["answer"] and a["halt_reason"] == b["halt_reason"] == "validated"
        same_top += _top_source(a) == _top_source(b)
    assert same_top == len(questions), f"top passage agreed on {same_top} of {len(questions)}"


@pytest.mark.slow
def test_eval_and_serve_take_es_url(es_url, tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q0", "question": "Do mitochondria play a role in remodelling lace plant "
                                "leaves during programmed cell death?", "answer": "yes"}) + "\n")
    result = runner.invoke(app, ["eval", "--dataset", str(data), "--method", "sr-rag", "--model",
                                 "tests.eval.helpers:always_yes_model", "--tools", "docs", "--es-url", es_url,
                                 "--es-index", INDEX, "--out", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert row["retrievals"] == 1 and row["correct"]
    refused = runner.invoke(app, ["eval", "--dataset", str(data), "--method", "sr-rag", "--model",
                                  "tests.eval.helpers:always_yes_model", "--tools", "none", "--es-url", es_url,
                                  "--out", str(tmp_path / "run2"), "--no-progress"])
    assert refused.exit_code == 2 and "--es-url" in refused.output
    # serve: the scripted model drives DOC_RAG over Elasticsearch
    import httpx

    port = free_port()
    script = script_file(tmp_path / "s.json", SCRIPT)
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--scripted", str(script),
                     "--es-url", es_url, "--es-index", INDEX)
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp_path / "serve.log", timeout=90):
        r = httpx.post(f"http://127.0.0.1:{port}/tcrag/invoke", timeout=60,
                       json={"input": {"messages": [{"type": "human", "content": "lace plant programmed cell death"}]}})
        assert r.status_code == 200, r.text
        meta = r.json()["output"]["response_metadata"]
        assert meta["halt_reason"] == "validated"
        assert [s["tool"] for s in meta["sources"]] == ["DOC_RAG"]
