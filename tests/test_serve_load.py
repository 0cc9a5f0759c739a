"""Issue 40 items 1 and 5, the server half, through the real `tcrag serve` on 127.0.0.1.

With the packaged model (slow): twenty clients in a row that leave mid-run (closed invokes, streams
read for one chunk and closed) each stop their run within two steps; a client that reads one chunk
of /stream_events and stalls has its run paused, then cancelled after --stream-stall-s, while eight
invokes queued behind it are all answered, first come first served, none mixed up; the server's
memory stays flat. With the scripted model (fast): beyond --max-queue, and after --max-queue-wait-s,
a request gets 503 with Retry-After; a client that leaves the queue frees its place.

Every wait is for an event the server reports (a stored thread, the run counts of /healthz), with
deadlines far beyond what the events take; nothing asserts how fast the machine is.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import psutil
import pytest

from .helpers_servers import free_port, python_cmd, script_file, server_process

WAIT_S = 240  # deadline of every wait for an event: far beyond a run of these budgets, even on a busy machine


def chat(question: str, history: str = "") -> dict:
    earlier = [{"type": "human", "content": "earlier"}, {"type": "ai", "content": history}] if history else []
    return {"messages": [*earlier, {"type": "human", "content": question}]}


def run_body(question: str, history: str = "", **configurable) -> dict:
    return {"input": chat(question, history), "config": {"configurable": configurable}}


def raw_post(port: int, path: str, body: dict) -> socket.socket:
    """A POST on a plain socket, so that the test decides when (and whether) the answer is read."""
    payload = json.dumps(body).encode("utf-8")
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % (path.encode(), len(payload)) + payload)
    return sock


def runs(base: str) -> dict:
    return httpx.get(f"{base}/healthz", timeout=30).json()["runs"]


def stored(base: str, thread_id: str):
    r = httpx.get(f"{base}/tcrag/threads/{thread_id}", timeout=30)
    return r.json() if r.status_code == 200 else None


def wait_until(check, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout:.0f} s for {what}")


def arrivals(base: str) -> int:
    """Requests the gate has taken in (run, waiting or done), refusals apart."""
    r = runs(base)
    return r["running"] + r["waiting"] + r["finished"] + r["cancelled"] + r["failed"]


# ----- the packaged model -----
CLIENTS = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-load")
    port = free_port()
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools", "--log-level",
                     "warning", "--max-steps", "2", "--max-new-tokens", "16", "--temperature", "0",
                     "--max-concurrent-runs", "1", "--max-queue", "8", "--max-queue-wait-s", "600",
                     "--stream-stall-s", "2", "--max-body-bytes", "3000000")
    # constrained generation stays on (the default). Session 18 read +28.8 MB here as a leak of its cancel
    # path; it was the one full run measured with the cancelled ones (it fills the model's bounded caches:
    # the branch stash keeps up to 48 MB). Measured apart, 40 cancelled runs grew the server by ~2 MB.
    # one llama.cpp thread: on a shared 2-core machine two spinning threads run several times slower
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp / "server.log",
                        env={"TCRAG_THREADS": "1"}, timeout=180) as proc:
        base = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{base}/tcrag/invoke", json=run_body("warm up?"), timeout=WAIT_S).status_code == 200
        yield base, port, psutil.Process(proc.pid)


@pytest.mark.slow
def test_twenty_clients_that_leave_mid_run_stop_their_runs(served):
    base, port, server = served
    seen, freed, rss = {}, [], {}
    for i in range(CLIENTS):
        rss[i] = server.memory_info().rss
        thread_id, route = f"gone-{i}", ("invoke", "stream_events")[i % 2]
        sock = raw_post(port, f"/tcrag/{route}", run_body(f"Question {i}: which vitamin deficiency causes scurvy?",
                                                          thread_id=thread_id, max_steps=20, max_new_tokens=32))
        if route == "stream_events":
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # one chunk read
        seen[thread_id] = wait_until(lambda: stored(base, thread_id), f"run {i} to start")["steps"]
        sock.close()  # the client leaves mid-run
        left = time.monotonic()
        wait_until(lambda: runs(base)["running"] == 0, f"run {i} to leave the model")
        freed.append(time.monotonic() - left)
    rss[CLIENTS] = server.memory_info().rss  # before the full run below, which fills bounded caches
    after = {thread_id: stored(base, thread_id) for thread_id in seen}
    # each run stopped within two steps of its client leaving (it went on to 20 before: no one cancelled it)
    went_on = {t: (seen[t], a["steps"], a["halt_reason"]) for t, a in after.items() if a["steps"] > seen[t] + 2}
    assert not went_on, went_on
    r = httpx.post(f"{base}/tcrag/invoke", json=run_body("Is aspirin an NSAID?", thread_id="after-gone"),
                   timeout=WAIT_S)
    assert r.status_code == 200 and stored(base, "after-gone")["question"] == "Is aspirin an NSAID?", r.text
    counts = runs(base)
    assert counts["cancelled"] >= sum(a["halt_reason"] is None for a in after.values()) > 0, (counts, after)
    half = CLIENTS // 2
    first, last = (rss[half] - rss[0]) / 2**20, (rss[CLIENTS] - rss[half]) / 2**20
    print(f"{CLIENTS} clients left: freed after {max(freed):.2f} s at most (median {sorted(freed)[half]:.2f} s); "
          f"steps at the leave -> at the end: {[(seen[t], a['steps']) for t, a in after.items()]}; "
          f"runs {counts}; RSS over the first {half} {first:+.1f} MB, the last {half} {last:+.1f} MB")
    assert last < 15, last  # flat: the first uses warm the stream route up, the rest cost nothing more


@pytest.mark.slow
def test_a_stalled_stream_is_cancelled_while_eight_queued_invokes_are_answered_in_order(served):
    base, port, server = served
    history = "x" * 1_500_000  # in every event of the run: a client that stops reading is behind at once
    stalled = [raw_post(port, "/tcrag/stream_events", run_body("What causes scurvy?", history,
                                                               thread_id="stalled-0", max_steps=20))]
    assert stalled[0].recv(1024).startswith(b"HTTP/1.1 200")  # one chunk read, then nothing more
    cancelled = runs(base)["cancelled"]
    # eight invokes behind it, each sent once the gate has the one before, so their order is known
    answers, finished = {}, []

    def ask(i: int) -> None:
        question = f"Question {i}: is drug number {i} an antibiotic?"
        r = httpx.post(f"{base}/tcrag/invoke", json=run_body(question, thread_id=f"queued-{i}", max_steps=1),
                       timeout=WAIT_S * 2)
        finished.append(i)
        answers[i] = (question, r)

    clients = []
    for i in range(8):
        before = arrivals(base)
        clients.append(threading.Thread(target=ask, args=(i,), daemon=True))
        clients[-1].start()
        wait_until(lambda: arrivals(base) > before, f"invoke {i} to reach the gate")
    for client in clients:
        client.join(WAIT_S * 2)
    assert sorted(answers) == list(range(8)), sorted(answers)
    for i, (question, r) in answers.items():
        assert r.status_code == 200, (i, r.text)
        thread = stored(base, f"queued-{i}")
        assert thread["question"] == question and thread["messages"][-1]["content"] == r.json()["output"]["content"]
    assert finished == list(range(8))  # first come, first served
    # the stalled run was cancelled where it stood, before its end (it ran on to its halt before)
    wait_until(lambda: runs(base)["cancelled"] > cancelled, "the stalled stream to be cancelled")
    # paused at its next step once its client was behind (its events are too big to be ahead for long),
    # then cancelled there: no halt, at most one step done (before, it ran on to its halt)
    first_stalled = stored(base, "stalled-0")
    assert first_stalled["halt_reason"] is None and first_stalled["steps"] <= 1, first_stalled["steps"]
    # flat: more stalled streams (kept open) cost no more memory than the first one did
    rss_first = server.memory_info().rss
    for k in (1, 2):
        cancelled = runs(base)["cancelled"]
        stalled.append(raw_post(port, "/tcrag/stream_events", run_body("What causes scurvy?", history,
                                                                         thread_id=f"stalled-{k}", max_steps=20)))
        assert stalled[-1].recv(1024).startswith(b"HTTP/1.1 200")
        wait_until(lambda: runs(base)["cancelled"] > cancelled, f"stalled stream {k} to be cancelled")
        assert stored(base, f"stalled-{k}")["steps"] <= 1
    growth = (server.memory_info().rss - rss_first) / 2**20
    tail = b""  # what the first stalled client gets if it reads again: what was buffered, then the closed end
    stalled[0].settimeout(WAIT_S)
    while chunk := stalled[0].recv(1 << 20):
        tail = (tail + chunk)[-4096:]
    for sock in stalled:
        sock.close()
    print(f"queued invokes finished in order {finished}; 2 more stalled streams: RSS {growth:+.1f} MB; "
          f"runs {runs(base)}")
    assert b"event: end" not in tail  # the stream was closed, not finished
    assert growth < 40, growth  # each stalled stream piled up its whole run (~1.5 MB an event) before


# ----- the scripted model: queue bounds -----
SLOW_SCRIPT = {"replies": [{"reply": "Conclusion: answer to {question}", "sleep_s": 4.0}], "default_score": 1.0}


def test_beyond_the_queue_and_after_the_longest_wait_a_request_gets_503_with_retry_after(tmp_path):
    port = free_port()
    cmd = python_cmd("-m", "tcrag_langgraph.faces.cli", "serve", "--port", str(port), "--no-tools", "--scripted",
                     str(script_file(tmp_path / "slow.json", SLOW_SCRIPT)), "--max-concurrent-runs", "1",
                     "--max-queue", "1", "--max-queue-wait-s", "2", "--log-level", "warning")
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log=tmp_path / "server.log", timeout=90):
        base = f"http://127.0.0.1:{port}"
        results = {}

        def ask(name: str) -> None:
            results[name] = httpx.post(f"{base}/tcrag/invoke", json=run_body(f"{name}?"), timeout=WAIT_S)

        first = threading.Thread(target=ask, args=("first",))
        first.start()
        wait_until(lambda: runs(base)["running"] == 1, "the first run")
        # a client that leaves the queue frees its place
        leaving = raw_post(port, "/tcrag/invoke", run_body("leaving?"))
        wait_until(lambda: runs(base)["waiting"] == 1, "a request to wait")
        leaving.close()
        wait_until(lambda: runs(base)["waiting"] == 0, "the request that left to leave the queue")
        second = threading.Thread(target=ask, args=("second",))
        second.start()
        wait_until(lambda: runs(base)["waiting"] == 1, "the second request to wait")
        full = httpx.post(f"{base}/tcrag/invoke", json=run_body("third?"), timeout=WAIT_S)  # the queue is full
        second.join(WAIT_S)
        first.join(WAIT_S)
    assert full.status_code == 503 and "max_queue 1" in full.json()["detail"], full.text
    waited = results["second"]  # the first run (4 s) outlasts the longest wait (2 s)
    assert waited.status_code == 503 and "waited 2 s in the queue" in waited.json()["detail"], waited.text
    for refused in (full, waited):
        assert int(refused.headers["retry-after"]) >= 1
    assert results["first"].status_code == 200
    assert results["first"].json()["output"]["content"] == "answer to first?"
