"""Process and port helpers for tests that run real servers on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import httpx

__all__ = ["free_port", "wait_http", "server_process", "uvicorn_thread", "script_file", "users_file", "langgraph_dev",
           "ServerFailed"]

REPO = Path(__file__).resolve().parents[1]


class ServerFailed(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, *, timeout: float, proc: Optional[subprocess.Popen] = None, log: Optional[Path] = None) -> None:
    """Poll ``url`` until it answers below 500; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerFailed(f"server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.25)
    raise ServerFailed(f"{url} did not answer within {timeout:.0f} s ({last}):\n{_tail(log)}")


def _tail(log: Optional[Path], n: int = 4000) -> str:
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-n:]


@contextlib.contextmanager
def server_process(cmd: Sequence[str], *, ready_url: str, log: Path, env: Optional[dict[str, str]] = None,
                   timeout: float = 60.0, cwd: Optional[Path] = None) -> Iterator[subprocess.Popen]:
    """Start ``cmd`` in its own process group, wait for ``ready_url``, and stop it (the whole group)
    afterwards: SIGTERM, then SIGKILL after 10 s."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                cwd=str(cwd or REPO), start_new_session=True)
    try:
        wait_http(ready_url, timeout=timeout, proc=proc, log=log)
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@contextlib.contextmanager
def uvicorn_thread(app, *, port: Optional[int] = None) -> Iterator[str]:
    """Serve ``app`` with a real uvicorn server on 127.0.0.1 in a thread; yields the base URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ServerFailed("uvicorn did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def script_file(path: Path, script: dict) -> Path:
    """Write a scripted-model JSON script (see ``tcrag_langgraph.testing``) and return its path."""
    import json

    path.write_text(json.dumps(script), encoding="utf-8")
    return path


def python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def users_file(path: Path, users: dict[str, dict]) -> Path:
    """Write a users file (see ``tcrag_langgraph.faces.auth``): ``{token: {"identity": ..., ...}}`` in,
    hashed tokens out. Returns its path."""
    import json

    from tcrag_langgraph.faces.auth import hash_token

    records = [{**record, "token_sha256": hash_token(token)} for token, record in users.items()]
    path.write_text(json.dumps({"users": records}), encoding="utf-8")
    return path


@contextlib.contextmanager
def langgraph_dev(tmp: Path, *, script: Path, users: Path, timeout: float = 180) -> Iterator[str]:
    """A real ``langgraph dev`` (the repository's langgraph.json, custom auth included) on
    127.0.0.1 serving the scripted graph; yields the base URL."""
    import shutil

    exe = shutil.which("langgraph", path=str(Path(sys.executable).parent)) or shutil.which("langgraph")
    if exe is None:
        raise ServerFailed("langgraph CLI (langgraph-cli[inmem]) is not installed")
    port = free_port()
    cmd = [exe, "dev", "--host", "127.0.0.1", "--port", str(port), "--no-browser", "--no-reload"]
    env = {"TCRAG_STUDIO_SCRIPTED": str(script), "TCRAG_AUTH_USERS": str(users), "LANGGRAPH_NO_ANALYTICS": "1",
           "LANGSMITH_TRACING": "false"}
    with server_process(cmd, ready_url=f"http://127.0.0.1:{port}/ok", log=tmp / "dev.log", env=env,
                        timeout=timeout, cwd=REPO):
        yield f"http://127.0.0.1:{port}"
