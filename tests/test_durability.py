"""Durable runs: SQLite checkpoints (SqliteSaver, AsyncSqliteSaver) survive a SIGKILL mid-run and a
new process resumes with no step lost or repeated; human review resumes across processes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from tcrag_langgraph.faces.integration import checkpoint_serde
from tcrag_langgraph.testing import scripted_graph

from .helpers_servers import REPO, script_file

RUNNER = textwrap.dedent('''
    import asyncio, json, sqlite3, sys
    from langgraph.types import Command
    from tcrag_langgraph.faces.integration import checkpoint_serde
    from tcrag_langgraph.testing import scripted_graph

    mode, script, db, thread, action, question = sys.argv[1:7]
    payload = {"start": {"question": question}, "resume": None, "approve": Command(resume="approve"),
               "reject": Command(resume={"approve": False, "feedback": "cite a guideline"})}[action]
    cfg = {"configurable": {"thread_id": thread}}

    def report(out):
        interrupts = [i.value for i in out.get("__interrupt__", [])]
        print("RESULT " + json.dumps({
            "pid": __import__("os").getpid(), "answer": out.get("answer"), "halt_reason": out.get("halt_reason"),
            "validated": out.get("answer_validated"), "interrupts": interrupts,
            "trace": [[e.step, e.action, e.op, e.content] for e in out.get("trace", [])],
            "stack": [[f.action.value, f.content] for f in out.get("stack", [])]}), flush=True)

    if mode == "sync":
        from langgraph.checkpoint.sqlite import SqliteSaver
        saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False), serde=checkpoint_serde())
        report(scripted_graph(script, checkpointer=saver).invoke(payload, cfg))
    else:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async def main():
            async with aiosqlite.connect(db) as conn:
                saver = AsyncSqliteSaver(conn, serde=checkpoint_serde())
                report(await scripted_graph(script, checkpointer=saver).ainvoke(payload, cfg))
        asyncio.run(main())
''')

REPLIES = ["Thought: thought-one about {question}", "Plan: plan-two-search-then-answer",
           "Tool_Use: DOC_RAG\nTool_Input: tool-input-three", "Thought: thought-four-after-evidence",
           "Conclusion: conclusion-five for {question}"]
QUESTION = "Which vitamin prevents scurvy?"


def script(tmp: Path, *, sleep_at: int | None, log: Path, **extra) -> Path:
    replies = [{"reply": r, **({"sleep_s": 120.0} if i == sleep_at else {})} for i, r in enumerate(REPLIES)]
    return script_file(tmp / f"script-{sleep_at}.json", {
        "replies": replies, "tools": {"DOC_RAG": "passage: vitamin C ({input})"}, "default_score": 1.0,
        "scores": {"thought-one about {question}": 40.0}, "calls_log": str(log), **extra})


def runner(tmp: Path) -> Path:
    path = tmp / "runner.py"
    path.write_text(RUNNER)
    return path


def run(tmp: Path, *args: str, timeout: float = 90) -> dict:
    proc = subprocess.run([sys.executable, str(runner(tmp)), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def log_entries(log: Path) -> list[dict]:
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_mid_run_then_resume_loses_and_repeats_nothing(mode, tmp_path):
    db, log = str(tmp_path / "ckpt.sqlite"), tmp_path / "calls.jsonl"
    sleepy = script(tmp_path, sleep_at=3, log=log)  # the 4th model call hangs
    proc = subprocess.Popen([sys.executable, str(runner(tmp_path)), mode, str(sleepy), db, "t-kill", "start", QUESTION],
                            cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not any(e["index"] == 3 for e in log_entries(log)):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the run never reached the 4th model call"
            time.sleep(0.1)
        time.sleep(0.3)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    # What survived on disk: three actions applied, the next Generate pending.
    probe = scripted_graph(sleepy, checkpointer=SqliteSaver(sqlite3.connect(db), serde=checkpoint_serde()))
    saved = probe.get_state({"configurable": {"thread_id": "t-kill"}})
    assert saved.next == ("Generate",) and saved.values["steps"] == 3
    assert [f.action.value for f in saved.values["stack"]] == ["User_Query", "Thought", "Plan", "Tool_Use"]

    # A new process, same thread, input None, a script that no longer hangs: it finishes the run.
    awake = script(tmp_path, sleep_at=None, log=log)
    out = run(tmp_path, mode, str(awake), db, "t-kill", "resume", "-")
    assert out["answer"] == f"conclusion-five for {QUESTION}" and out["halt_reason"] == "validated"
    steps = [t[0] for t in out["trace"]]
    assert steps == [0, 1, 2, 3, 4, 5, 5]  # 0..N contiguous (the halt shares the last step)
    contents = [t[3] for t in out["trace"][1:-1]]
    assert contents == [f"thought-one about {QUESTION}", "plan-two-search-then-answer",
                        f"passage: vitamin C (tool-input-three)", "thought-four-after-evidence",
                        f"conclusion-five for {QUESTION}"]  # each scripted action applied exactly once
    calls = log_entries(log)
    first = [c["index"] for c in calls if c["pid"] == proc.pid]
    second = [c["index"] for c in calls if c["pid"] == out["pid"]]
    assert first == [0, 1, 2, 3]  # killed during call 3
    assert second == [3, 4]  # only the interrupted step is redone; nothing before it re-runs


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_human_review_resumes_across_processes(mode, tmp_path):
    db, log = str(tmp_path / "review.sqlite"), tmp_path / "calls.jsonl"
    path = script_file(tmp_path / "review.json", {
        "replies": ["Conclusion: first-answer {question}", "Conclusion: second-answer {question}"],
        "default_score": 1.0, "config": {"require_review": True}, "calls_log": str(log)})
    paused = run(tmp_path, mode, str(path), db, "t-review", "start", QUESTION)
    assert paused["answer"] is None and paused["interrupts"][0]["answer"] == f"first-answer {QUESTION}"
    rejected = run(tmp_path, mode, str(path), db, "t-review", "reject", "-")
    assert rejected["interrupts"][0]["answer"] == f"second-answer {QUESTION}"
    assert rejected["stack"][1][0] == "Thought" and "cite a guideline" in rejected["stack"][1][1]
    done = run(tmp_path, mode, str(path), db, "t-review", "approve", "-")
    assert done["answer"] == f"second-answer {QUESTION}" and done["validated"] is True
    assert done["halt_reason"] == "validated"
    assert [c["index"] for c in log_entries(log)] == [0, 1]  # three processes, each model reply used once
    assert len({c["pid"] for c in log_entries(log)}) == 2
