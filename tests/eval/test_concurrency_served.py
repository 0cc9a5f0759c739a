"""``tcrag eval --concurrency N`` against a served model (issue 24 item 1): a real loopback
OpenAI-compatible server (tests/completions_logprob_server.py) generates with the packaged SmolLM2
weights and gives the TC-RAG monitor its prompt log-probs; the runs are built the way ``tcrag eval``
builds them (one AgentSpec, its parts shared by the methods) and run by
``run_evaluation``. One at a time and four at a time must give the same greedy rows, field for field
(answers, halts, steps, retrievals, evidence, rejected Conclusions, state values, tokens), in the
same order in ``results.jsonl``; the server's own counters show the four really overlapped.

The server computes two requests at once (``--parallel 2``), so requests of different questions
also interleave inside it: each must still come out as if it ran alone.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tcrag_langgraph.agent.spec import AgentSpec
from tcrag_langgraph.core.config import TCRAGConfig
from tcrag_langgraph.eval.datasets import load_dataset, sample_records
from tcrag_langgraph.eval.runner import read_results, run_evaluation

from ..helpers_servers import REPO, free_port, python_cmd, server_process

pytestmark = pytest.mark.slow  # the real packaged model behind a real server

#: the whole row but the wall time (which includes waiting for the other runs)
VARIES = {"wall_time_s"}
METHODS = ["tcrag-cppl", "base"]
#: the variable naming the loopback server's key, as --api-key-env does (a spec never holds a key)
KEY_ENV = "TCRAG_TEST_LOOPBACK_KEY"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("served") / "server.log"
    cmd = python_cmd(str(REPO / "tests" / "completions_logprob_server.py"), "--port", str(port), "--parallel", "2")
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/health", log=log, timeout=180), \
            pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, "sk-loopback-unchecked")
        yield f"http://127.0.0.1:{port}"


def _graphs(url: str, records):
    """What ``tcrag eval --model openai:smollm2 --base-url URL/v1 --scorer URL/v1 --tools docs
    --method tcrag-cppl,base --max-steps 1 --max-new-tokens 24 --temperature 0`` builds, with no
    format re-prompts and observations cut to 96 tokens (fewer, shorter prompts: a CPU server)."""
    cfg = TCRAGConfig(max_steps=1, max_new_tokens=24, temperature=0.0, max_format_retries=0,
                      max_observation_tokens=96)
    spec = AgentSpec(model="openai:smollm2", base_url=f"{url}/v1", api_key_env=KEY_ENV, scorer=f"{url}/v1",
                     tools="docs", config=cfg)
    parts = spec.assemble(METHODS, share_monitor=True)
    return {name: spec.build(parts, method=name) for name in METHODS}


def test_four_runs_in_flight_give_the_rows_of_one_at_a_time(served, tmp_path):
    records = sample_records(load_dataset("pubmedqa", split="trainval", with_context=False), limit=2, seed=0)
    rows, files, stats = {}, {}, {}
    for n in (1, 4):
        httpx.post(f"{served}/stats").raise_for_status()  # reset the server's peak
        out = tmp_path / f"n{n}"
        rows[n] = run_evaluation(records, _graphs(served, records), out_dir=out, include_context=False,
                                 progress=False, concurrency=n)
        files[n] = read_results(out / "results.jsonl")
        stats[n] = httpx.get(f"{served}/stats").json()
        # the file holds what was returned, in the same order
        assert files[n] == [json.loads(json.dumps(r, ensure_ascii=False, default=str)) for r in rows[n]]

    def strip(row):
        return {k: v for k, v in row.items() if k not in VARIES}

    order = [(r.id, m) for r in records for m in METHODS]
    assert [(r["id"], r["method"]) for r in files[4]] == order  # submission order, not finishing order
    assert [strip(r) for r in files[4]] == [strip(r) for r in files[1]]
    # Not a trivial sameness: the runs did real, different work (the server generated, the docs
    # tool was called, the monitor scored), and no run failed.
    assert all(r["halt_reason"] != "exception" for r in files[1]), [r["error"] for r in files[1]]
    assert len({(r["answer"], r["completion_tokens"]) for r in files[1]}) == len(order)
    assert sum(r["retrievals"] for r in files[1]) > 0
    assert any(r["state_value"] is not None for r in files[1] if r["method"] == "tcrag-cppl")
    # The same requests, made one at a time and then several at once.
    assert stats[1]["requests"] == stats[4]["requests"] > len(order)
    assert stats[1]["peak_in_flight"] == 1 and stats[4]["peak_in_flight"] > 1
    print(json.dumps({n: stats[n] for n in stats}))
