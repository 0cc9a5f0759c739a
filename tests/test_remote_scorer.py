"""The remote state monitor against a real loopback completions server (vLLM's response schema,
log-probs computed by transformers from the packaged SmolLM2 weights): it must agree with the
local scorer on the same weights, and every broken answer must give a clear error."""

from __future__ import annotations

import socket
import threading

import pytest

from tcrag_langgraph.monitor.served import CompletionsLogprobScorer, RemoteScorerError
from tcrag_langgraph.monitor.scoring import LocalLMScorer

from .helpers_servers import REPO, free_port, python_cmd, server_process

API_KEY = "sk-test-remote-scorer-0123456789"
PAIRS = [
    ("What is the first-line drug for type 2 diabetes?", "Metformin is usually the first-line drug."),
    ("What treats scurvy?", "Vitamin C treats scurvy."),
    ("Is aspirin an anticoagulant?\nAnswer yes or no.", "No, aspirin is an antiplatelet drug, not an anticoagulant."),
    ("Which organ produces insulin?", "The pancreas (beta cells of the islets of Langerhans) produces insulin."),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, lm):
    port = free_port()
    log = tmp_path_factory.mktemp("completions") / "server.log"
    cmd = python_cmd(str(REPO / "tests" / "completions_logprob_server.py"), "--port", str(port),
                     "--api-key-env", "TEST_COMPLETIONS_KEY")
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/health", log=log,
                        env={"TEST_COMPLETIONS_KEY": API_KEY}, timeout=180):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def remote(server, lm):
    # SmolLM2 adds no BOS itself; the local scorer starts from the tokenizer's BOS: send it as text.
    scorer = CompletionsLogprobScorer(server, model="smollm2", api_key=API_KEY, start_text=lm.tokenizer.bos_token)
    yield scorer
    scorer.close()


@pytest.mark.parametrize("query,text", PAIRS)
def test_remote_log_probs_agree_with_the_local_scorer(remote, lm, query, text):
    local = LocalLMScorer(lm, prefix_cache=0)
    mine = local.token_logprobs(query, text)
    theirs = remote.token_logprobs(query, text)
    assert len(theirs) == len(mine)
    assert theirs == pytest.approx(mine, abs=2e-3)
    for metric in ("cppl", "uct"):
        assert remote.score(query, text, metric=metric) == pytest.approx(local.score(query, text, metric=metric), rel=1e-3)


def test_remote_values_separate_like_the_local_ones(remote):
    query, text = PAIRS[0]
    assert remote.score(query, text, metric="cppl") < remote.score(query, "zebra quantum marmalade 7731", metric="cppl")


def test_uct_given_query_changes_the_context(server, remote, lm):
    query, text = PAIRS[1]
    with_query = CompletionsLogprobScorer(server, model="smollm2", api_key=API_KEY, start_text=lm.tokenizer.bos_token,
                                          uct_given_query=True)
    local = LocalLMScorer(lm, uct_given_query=True, prefix_cache=0)
    assert with_query.score(query, text, metric="uct") == pytest.approx(local.score(query, text, metric="uct"), rel=1e-3)
    assert with_query.score(query, text, metric="uct") != pytest.approx(remote.score(query, text, metric="uct"), rel=1e-4)


def test_no_start_token_means_no_first_log_prob_and_says_what_to_do(server):
    scorer = CompletionsLogprobScorer(server, model="smollm2", api_key=API_KEY)  # start_text=""
    with pytest.raises(RemoteScorerError, match="no log-prob for the first token.*start_text"):
        scorer.score("ignored for uct", "Vitamin C treats scurvy.", metric="uct")
    # cppl has the query in front of the text, so it needs no start token.
    assert scorer.score("What treats scurvy?", "Vitamin C treats scurvy.", metric="cppl") > 1.0


@pytest.mark.parametrize("model,message", [
    ("defect-no-logprobs", "logprobs is null"),
    ("defect-chat-schema", r"no choices\[0\]\.logprobs"),
    ("defect-offsets", "text_offset is not the running length"),
    ("not-served", "HTTP 404"),
])
def test_broken_answers_give_clear_errors(server, model, message):
    scorer = CompletionsLogprobScorer(server, model=model, api_key=API_KEY, start_text="<|im_start|>")
    with pytest.raises(RemoteScorerError, match=message):
        scorer.score("What treats scurvy?", "Vitamin C.", metric="cppl")


def test_wrong_api_key_is_refused_and_never_echoed(server):
    secret = "sk-wrong-secret-value-42"
    scorer = CompletionsLogprobScorer(server, model="smollm2", api_key=secret)
    with pytest.raises(RemoteScorerError, match="HTTP 401") as info:
        scorer.score("What treats scurvy?", "Vitamin C.", metric="cppl")
    assert secret not in str(info.value) and secret not in repr(scorer)


def test_server_down_is_a_clear_error():
    scorer = CompletionsLogprobScorer(f"http://127.0.0.1:{free_port()}/v1", model="m", timeout_s=5)
    with pytest.raises(RemoteScorerError, match="cannot reach http://127.0.0.1:.*/v1/completions"):
        scorer.score("q", "some text", metric="cppl")


def test_a_server_that_never_answers_times_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held: list[socket.socket] = []
    accepter = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
    accepter.start()
    try:
        scorer = CompletionsLogprobScorer(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", model="m", timeout_s=0.5)
        with pytest.raises(RemoteScorerError, match=r"did not answer within 0\.5 s"):
            scorer.score("q", "some text", metric="cppl")
    finally:
        for conn in held:
            conn.close()
        listener.close()


def test_constructor_and_argument_validation():
    with pytest.raises(ValueError, match="base_url"):
        CompletionsLogprobScorer("127.0.0.1:8000", model="m")
    with pytest.raises(ValueError, match="model"):
        CompletionsLogprobScorer("http://127.0.0.1:8000/v1", model=" ")
    with pytest.raises(ValueError, match="timeout_s"):
        CompletionsLogprobScorer("http://127.0.0.1:8000/v1", model="m", timeout_s=0)
    scorer = CompletionsLogprobScorer("http://127.0.0.1:8000/v1", model="m")
    with pytest.raises(ValueError, match="unknown metric"):
        scorer.score("q", "t", metric="bleu")
    with pytest.raises(ValueError, match="empty"):
        scorer.token_logprobs("q", "")
