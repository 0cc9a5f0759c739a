"""Issue 21 items 4 and 7 through the real `tcrag serve` (a subprocess on 127.0.0.1, scripted model).

4. Six well-formed requests that gave HTTP 500 (and reset the keep-alive connection) now get a 4xx
   with a clear body, on one connection that stays usable; the config's limits are the tool layer's;
   runs end by the graph's own halt, never by LangServe's recursion limit.
7. The operator's caps (command-line options, never the request) bound the cost options a request sets.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tcrag_langgraph import TCRAGConfig, build_graph
from tcrag_langgraph.faces.serve_guard import ServeCaps, caps_problem, input_problem
from tcrag_langgraph.tools.layer import ToolOptions, invoke_tool, make_tool

from .conftest import ScriptedScorer, scripted
from .helpers_servers import free_port, python_cmd, script_file, server_process

# A model that never concludes: 60 different Thoughts (stack mode: each run starts at the first).
NEVER_CONCLUDES = {"replies": [f"Thought: thought {i} about {{question}}" for i in range(60)], "default_score": 50.0}
CAPS = ["--cap-max-steps", "20", "--cap-max-new-tokens", "256", "--cap-max-question-chars", "1000",
        "--cap-answer-format-items", "3", "--cap-max-format-retries", "3", "--cap-tool-timeout-s", "30",
        "--cap-max-observation-tokens", "2000", "--cap-batch-inputs", "2"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-residuals")
    port = free_port()
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools",
                     "--scripted", str(script_file(tmp / "script.json", NEVER_CONCLUDES)), *CAPS,
                     "--max-steps", "12")  # the paper's budget: a run long enough to pass LangServe's recursion limit
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp / "server.log", timeout=90):
        yield f"http://127.0.0.1:{port}"


def chat(question: str = "Is aspirin an NSAID?") -> dict:
    return {"messages": [{"type": "human", "content": question}]}


def with_options(**options) -> dict:
    return {"input": chat(), "config": {"configurable": options}}


SIX_SHAPES = [
    ("a message with no type", "invoke", {"input": {"messages": [{"content": "hi"}]}}, "has no 'type'"),
    ("a text part whose text is an object", "invoke",
     {"input": {"messages": [{"type": "human", "content": [{"type": "text", "text": {"a": 1}}]}]}},
     "content[0].text must be text, not an object"),
    ("max_observation_tokens above 100000", "invoke", with_options(max_observation_tokens=100_001),
     "max_observation_tokens: Input should be less than or equal to 100000"),
    ("max_question_chars 1e20", "invoke", with_options(max_question_chars=1e20), "max_question_chars"),
    ("/batch with inputs: [5]", "batch", {"inputs": [5]}, "inputs[0] must be {\"messages\": [...]}, not a number"),
    ("the same shapes on /stream", "stream", {"input": {"messages": [{"content": "hi"}]}}, "has no 'type'"),
]


def test_six_former_500s_are_4xx_with_a_clear_body_and_the_connection_stays_usable(served):
    addresses, outcomes = set(), []
    with httpx.Client(timeout=60) as client:
        for name, route, body, reason in SIX_SHAPES + [("integer 10**20", "invoke",
                                                         with_options(max_question_chars=10 ** 20), "over the cap")]:
            r = client.post(f"{served}/tcrag/{route}", json=body)
            addresses.add(r.extensions["network_stream"].get_extra_info("client_addr"))
            outcomes.append(r.status_code)
            assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
            assert reason in r.json()["detail"], (name, r.text)
        # the sixth shape of the issue: a run long enough to pass LangServe's recursion_limit (25)
        r = client.post(f"{served}/tcrag/invoke", json={"input": chat()})
        addresses.add(r.extensions["network_stream"].get_extra_info("client_addr"))
        assert r.status_code == 200, r.text
        meta = r.json()["output"]["response_metadata"]
        assert meta["halt_reason"] == "max_steps" and meta["steps"] == 13 and not meta["answer_validated"]
    assert len(addresses) == 1, addresses  # every answer came back over the same keep-alive connection
    print(f"shapes: {outcomes}, then 200 on the same connection")


@pytest.mark.parametrize("route", ["invoke", "stream", "batch"])
def test_runs_end_by_the_graphs_own_halt_at_the_largest_allowed_budget(served, route):
    """max_steps at the server's cap (20): 2 super-steps an action is far past 25; the run must still
    end by its own max_steps halt (LangServe raised GraphRecursionError, a 500, before)."""
    body = with_options(max_steps=20)
    if route == "batch":
        body = {"inputs": [chat(), chat("second?")], "config": [{"configurable": {"max_steps": 20}}] * 2}
    r = httpx.post(f"{served}/tcrag/{route}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if route == "stream":
        assert "event: error" not in r.text and '"halt_reason":"max_steps"' in r.text.replace(" ", ""), r.text[-500:]
        return
    outputs = r.json()["output"] if route == "batch" else [r.json()["output"]]
    for out in outputs:
        meta = out["response_metadata"]
        assert meta["halt_reason"] == "max_steps" and meta["steps"] == 21


def test_config_limits_are_the_tool_layers():
    for config_field, layer_field in (("max_observation_tokens", "max_output_tokens"), ("tool_timeout_s", "timeout_s")):
        config_le = [m.le for m in TCRAGConfig.model_fields[config_field].metadata if hasattr(m, "le")]
        layer_le = [m.le for m in ToolOptions.model_fields[layer_field].metadata if hasattr(m, "le")]
        assert config_le == layer_le and config_le, (config_field, config_le, layer_le)
    # the largest value the config accepts runs through the real tool pipeline (it raised before)
    cfg = TCRAGConfig(max_observation_tokens=100_000, tool_timeout_s=3600)
    from pydantic import BaseModel

    class Q(BaseModel):
        query: str

    echo = make_tool("ECHO", "Repeat.", lambda a: a.query, args_schema=Q)
    assert invoke_tool(echo, "x", timeout_s=cfg.tool_timeout_s, max_output_tokens=cfg.max_observation_tokens) == "x"
    graph = build_graph(model=scripted(["Tool_Use: ECHO\nTool_Input: hello", "Conclusion: done"]), tools=[echo],
                        scorer=ScriptedScorer(default=1.0), config=cfg)
    out = graph.invoke({"question": "q?"})
    assert out["stack"][1].tool_call.observation == "hello" and out["answer"] == "done"
    with pytest.raises(ValueError):
        TCRAGConfig(max_observation_tokens=100_001)


OVER_CAPS = [
    ({"max_steps": 21}, "max_steps 21 is over the cap of this server (20"),
    ({"max_steps": 1000}, "max_steps 1000 is over the cap"),
    ({"max_new_tokens": 8192}, "max_new_tokens 8192 is over the cap of this server (256"),
    ({"max_question_chars": 10 ** 9}, "max_question_chars 1000000000 is over the cap of this server (1000"),
    ({"answer_format": [f"a{i}" for i in range(5000)]}, "answer_format has 5000 answers; this server allows at most 3"),
    ({"answer_format": ["x" * 5000]}, "answer_format's answers hold 5000 characters"),
    ({"max_format_retries": 20}, "max_format_retries 20 is over the cap of this server (3"),
    ({"tool_timeout_s": 3600}, "tool_timeout_s 3600 is over the cap of this server (30"),
    ({"max_observation_tokens": 100_000}, "max_observation_tokens 100000 is over the cap of this server (2000"),
]


def test_a_batch_is_capped_by_the_operator(served):
    r = httpx.post(f"{served}/tcrag/batch", json={"inputs": [chat(), chat(), chat()]}, timeout=60)
    assert r.status_code == 422 and "at most 2 per /batch" in r.json()["detail"], r.text
    r = httpx.post(f"{served}/tcrag/batch", json={"inputs": [chat("a?"), chat("b?")],
                                                  "config": {"configurable": {"max_steps": 1}}}, timeout=120)
    assert r.status_code == 200 and len(r.json()["output"]) == 2, r.text


def test_operator_caps_bound_what_a_request_may_set(served):
    refused = 0
    for options, reason in OVER_CAPS:
        started = time.monotonic()
        r = httpx.post(f"{served}/tcrag/invoke", json=with_options(**options), timeout=60)
        assert r.status_code == 422 and reason in r.json()["detail"], (options, r.text)
        assert time.monotonic() - started < 5  # refused before any run
        refused += 1
    # a request cannot lift a cap: the caps are no request option
    r = httpx.post(f"{served}/tcrag/invoke", json=with_options(caps={"max_steps": 1000}), timeout=60)
    assert r.status_code == 422 and "unsupported configurable option(s): caps" in r.text
    # at the caps a request is served
    at = with_options(max_steps=20, max_new_tokens=256, max_question_chars=1000, answer_format=["yes", "no", "maybe"])
    r = httpx.post(f"{served}/tcrag/invoke", json=at, timeout=120)
    assert r.status_code == 200, r.text
    print(f"over the caps: {refused} refused (422)")


def test_input_problem_and_caps_units():
    assert input_problem("invoke", {"input": {"messages": [{"type": "human", "content": "hi"}]}}) is None
    assert input_problem("invoke", {"input": {"messages": [{"type": "robot", "content": "hi"}]}}).endswith(
        "is not a message type (one of human, ai, system, tool)")
    assert input_problem("invoke", {"input": {"messages": [{"type": "human"}]}}) == "input.messages[0] has no 'content'"
    assert input_problem("invoke", {"input": {"messages": [{"type": "human", "content": [5]}]}}) == (
        "input.messages[0].content[0] must be text or an object, not a number")
    assert input_problem("batch", {"inputs": "x"}) == "'inputs' must be a list of inputs"
    assert input_problem("invoke", {"input": "just text"}).startswith("input must be")
    assert input_problem("playground", {"anything": 1}) is None
    caps = ServeCaps(max_steps=5)
    assert caps_problem({"max_steps": 5}, caps) is None and "over the cap" in caps_problem({"max_steps": 6}, caps)
    with pytest.raises(ValueError):
        ServeCaps(max_steps=0)


def test_a_client_recursion_limit_is_replaced_by_the_servers(served):
    body = {"input": chat(), "config": {"recursion_limit": 3, "configurable": {"max_steps": 4}}}
    r = httpx.post(f"{served}/tcrag/invoke", json=body, timeout=60)
    assert r.status_code == 200, r.text
    meta = r.json()["output"]["response_metadata"]
    assert meta["halt_reason"] == "max_steps" and meta["steps"] == 5


THREE_SHAPES = [
    ("sigma 'auto' for a model with no stored calibration", with_options(sigma="auto"), "sigma 'auto'"),
    ("a tool message without tool_call_id",
     {"input": {"messages": [{"type": "human", "content": "hi"}, {"type": "tool", "content": "x"}]}},
     "needs 'tool_call_id'"),
    ("an ai message with malformed tool_calls",
     {"input": {"messages": [{"type": "human", "content": "hi"},
                             {"type": "ai", "content": "", "tool_calls": [{"name": 1}]}]}},
     "tool_calls[0] must be an object"),
]


def test_three_more_former_500s_are_422s_naming_the_field_on_one_connection(served):
    addresses = set()
    with httpx.Client(timeout=60) as client:
        for name, body, reason in THREE_SHAPES:
            r = client.post(f"{served}/tcrag/invoke", json=body)
            addresses.add(r.extensions["network_stream"].get_extra_info("client_addr"))
            assert r.status_code == 422, (name, r.status_code, r.text)
            assert reason in r.json()["detail"], (name, r.text)
        r = client.post(f"{served}/tcrag/invoke", json={"input": chat()})
        addresses.add(r.extensions["network_stream"].get_extra_info("client_addr"))
        assert r.status_code == 200, r.text
    assert len(addresses) == 1, addresses  # the connection stayed usable after each refusal
