"""A served model keeps its state monitor without a second server: llama-cpp-python's own
OpenAI-compatible server (``llama_cpp.server``) on 127.0.0.1 over the packaged GGUF, asked for chat
completions only. TC-RAG with no state value set is monitored by the log-probs of its own replies
(``gen_answer_prob``) where the server returns them, and through a proxy that drops them (as a server
without log-probs would) by ``consistency`` (the model's own resampled answers); on ``tcrag ask`` and
``build_graph``."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from typer.testing import CliRunner

from tcrag_langgraph.faces.cli import app

from .helpers_servers import free_port, python_cmd, server_process

KEY_ENV = "TCRAG_TEST_LLAMA_SERVER_KEY"
API_KEY = "sk-llama-server-test-0123456789"
Q = "Is vitamin C deficiency the cause of scurvy?"
runner = CliRunner()
pytestmark = pytest.mark.slow  # a real llama.cpp server with the packaged model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tcrag_langgraph.models.weights import default_model_source

    folder, name = default_model_source()
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    cmd = python_cmd("-m", "llama_cpp.server", "--model", str(folder / name), "--model_alias", "smollm2",
                     "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096", "--n_threads", "1",
                     "--n_threads_batch", "1")  # one thread: two spin-waiting threads beside another llama.cpp
    # process on 2 cores stalled this module for 11 minutes (a 1.5B evaluation running beside the suite)
    # the key reaches the server through its environment (its settings read API_KEY), never argv
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/v1/models", log=log, env={"API_KEY": API_KEY},
                        timeout=180):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def without_logprobs(served):
    """The same server behind a proxy on 127.0.0.1 that drops every log-prob from its answers."""
    upstream = served.removesuffix("/v1")

    class Proxy(BaseHTTPRequestHandler):
        def _forward(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
            # as patient as the client behind it (the OpenAI client waits 600 s): a loaded machine queues requests
            reply = httpx.request(method, upstream + self.path, content=body, headers=headers, timeout=600)
            data = reply.content
            if reply.headers.get("content-type", "").startswith("application/json"):
                payload = reply.json()
                for choice in payload.get("choices") or []:
                    choice.pop("logprobs", None)
                data = json.dumps(payload).encode()
            self.send_response(reply.status_code)
            self.send_header("Content-Type", reply.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._forward("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._forward("POST")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def ask_served(base_url: str) -> tuple[dict, str]:
    """``tcrag ask --json`` against the served model at ``base_url`` (no tools, yes/no, greedy): the run's
    result and everything printed; a run that could not call the model or its monitor fails here."""
    args = ["ask", Q, "--model", "openai:smollm2", "--base-url", base_url, "--api-key-env", KEY_ENV, "--no-tools",
            "--answer-format", "yes,no", "--max-steps", "2", "--max-new-tokens", "32", "--temperature", "0", "--json",
            "--no-constrain-replies"]  # the monitor is tested here; under the grammar the 135M model writes 32-token
    # lines and the run took 7x as long (constrained replies through this server: the last test of this file)
    result = runner.invoke(app, args, env={KEY_ENV: API_KEY})
    assert result.exit_code in (0, 1), result.output
    out = json.loads(result.stdout[result.stdout.index("{"):])
    assert out["halt_reason"] not in ("model_error", "scorer_error"), out.get("error")
    return out, result.output


def test_ask_with_a_served_model_is_monitored_by_its_replies_log_probs(served):
    out, printed = ask_served(served)
    assert out["metric"] == "gen_answer_prob" and out["sigma"] == 0.5
    scored = [e["state_value"] for e in out["trace"] if e["action"] == "Conclusion" and e["state_value"] is not None]
    assert scored and all(0.0 <= v <= 1.0 for v in scored), out["trace"]
    if out["answer_generation_values"]:  # ended on a Conclusion: the value judged is its reply's own
        assert out["answer_generation_values"]["gen_answer_prob"] == scored[-1]
        assert out["answer_validated"] is (scored[-1] < 0.5)
    assert API_KEY not in printed


def test_ask_with_a_served_model_without_log_probs_is_monitored_by_its_own_samples(without_logprobs):
    out, printed = ask_served(without_logprobs)
    assert out["metric"] == "consistency" and out["sigma"] == 0.5
    scored = [e["state_value"] for e in out["trace"] if e["action"] == "Conclusion" and e["state_value"] is not None]
    assert scored, out["trace"]
    assert all(v in {0.0, 0.2, 0.4, 0.6, 0.8, 1.0} for v in (round(v, 6) for v in scored))  # k = 5 samples
    assert out["answer_validated"] is (scored[-1] < 0.5) or out["halt_reason"] == "max_steps"
    assert API_KEY not in printed


def test_build_graph_over_a_served_model_reads_its_replies_or_samples_it(served, without_logprobs):
    from tcrag_langgraph import build_graph
    from tcrag_langgraph.monitor.consistency import SamplingConsistencyScorer

    config = {"max_steps": 1, "max_new_tokens": 32, "temperature": 0.0, "answer_format": ["yes", "no"],
              "constrain_replies": False}  # as in ask_served
    graph = build_graph(model="openai:smollm2", model_kwargs={"base_url": served, "api_key": API_KEY, "max_retries": 0},
                        config=config)
    out = graph.invoke({"question": Q})
    assert out["halt_reason"] not in ("model_error", "scorer_error"), out.get("error")
    assert out["metric"] == "gen_answer_prob" and out["state_history"]
    assert set(out["answer_generation_values"]) == {"gen_answer_prob", "gen_cppl", "gen_entropy"}

    served = without_logprobs
    graph = build_graph(model="openai:smollm2", model_kwargs={"base_url": served, "api_key": API_KEY, "max_retries": 0},
                        config=config)
    out = graph.invoke({"question": Q})
    assert out["llm_calls"] >= 1 and out["halt_reason"] not in ("model_error", "scorer_error"), out.get("error")
    assert out["metric"] == "consistency" and out["state_history"]
    # the samples are real completions of the served model, at the sampling temperature
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model="smollm2", base_url=served, api_key=API_KEY, max_retries=0)
    samples = SamplingConsistencyScorer(chat, k=4, max_new_tokens=8).samples("Question: " + Q, choices=("yes", "no"))
    assert len(samples) == 4 and all(isinstance(s, str) for s in samples)


# --- constrained generation through a server (models/constrained.py) ----------------------------

@pytest.fixture(scope="module")
def json_schema_only(served):
    """The same server behind a proxy on 127.0.0.1 that speaks OpenAI's structured output and no grammar:
    it drops a request's ``grammar`` and hands OpenAI's ``response_format`` (``json_schema``) to
    llama-cpp-python in its own spelling (``json_object`` with ``schema``), as vLLM or OpenAI would take it."""
    upstream = served.removesuffix("/v1")

    class Proxy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's names
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            body.pop("grammar", None)
            fmt = body.get("response_format") or {}
            if fmt.get("type") == "json_schema":
                body["response_format"] = {"type": "json_object", "schema": fmt["json_schema"]["schema"]}
            headers = {k: v for k, v in self.headers.items() if k.lower() == "authorization"}
            reply = httpx.post(upstream + self.path, json=body, headers=headers, timeout=600)
            self.send_response(reply.status_code)
            self.send_header("Content-Type", reply.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_served_model_gets_the_form_its_server_honours_and_the_parser_reads_the_reply(served, json_schema_only):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    from tcrag_langgraph.core.config import TCRAGConfig
    from tcrag_langgraph.core.kernel import RunKernel, fresh_run
    from tcrag_langgraph.methods.kag_thinker.reply_forms import answer_choice_form
    from tcrag_langgraph.models.constrained import ReplyForm, served_constraint

    def chat(url: str, max_tokens: int = 16) -> ChatOpenAI:
        return ChatOpenAI(model="smollm2", base_url=url, api_key=API_KEY, max_retries=0, temperature=0,
                          max_tokens=max_tokens)

    grammar_server, schema_server = chat(served), chat(json_schema_only)
    assert served_constraint(grammar_server) == "grammar"
    assert served_constraint(schema_server) == "json_schema"
    forced = ReplyForm("forced", 'root ::= "Zebra crossing"\n')
    kernel = RunKernel(grammar_server, [], None, TCRAGConfig())
    assert kernel.ask(fresh_run(), [HumanMessage(content="Say hi")], TCRAGConfig(), {}, form=forced) == "Zebra crossing"
    # a schema server answers in the form's JSON; the kernel hands the parser the form's own text
    prompt = [HumanMessage(content="Is vitamin C deficiency the cause of scurvy? Answer yes, no or maybe.")]
    # (room for the form's reasoning, at most 400 characters, before the answer)
    text = RunKernel(chat(json_schema_only, 160), [], None, TCRAGConfig()).ask(
        fresh_run(), prompt, TCRAGConfig(), {}, form=answer_choice_form(("yes", "no", "maybe")))
    assert re.fullmatch(r"[^<{]*<answer>(yes|no|maybe)</answer>", text), text
    # a form without a JSON schema is not sent to a schema server: parse and repair only
    assert RunKernel(schema_server, [], None, TCRAGConfig()).ask(fresh_run(), [HumanMessage(content="Say hi")],
                                                                 TCRAGConfig(), {}, form=forced) != "Zebra crossing"
