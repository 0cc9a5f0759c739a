"""Test helpers: a real Elasticsearch-API server (noida-db) and a misbehaving HTTP server, on loopback.

``NoidaElasticsearch`` starts ``noida-db start --only elasticsearch`` on a free 127.0.0.1 port with
its own data folder, waits until ``/_cluster/health`` answers, and on exit stops the process
group it started (:func:`stop_process_group`: the wrapper and the server binary, waiting for both)
before removing the folder. ``FaultServer`` answers every request with HTTP 500, non-JSON junk, or not at
all (to provoke a client timeout).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

__all__ = ["find_noida", "free_port", "stop_process_group", "NoidaElasticsearch", "FaultServer"]


def find_noida() -> Optional[str]:
    """Path of the ``noida-db`` executable (next to this Python first), or None."""
    beside = Path(sys.executable).with_name("noida-db")
    if beside.exists():
        return str(beside)
    return shutil.which("noida-db")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies do not count: they write nothing, and
    an orphan's zombie may wait long for its reaper (PID 1 of some sandboxes reaps late)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: any member, zombie or not
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_process_group(process: subprocess.Popen, *, timeout: float = 10.0) -> None:
    """Stop ``process`` and every process of its group (it was started with ``start_new_session``),
    and return only when none is left: SIGTERM, then SIGKILL after ``timeout``.

    Waiting for the started process alone is not enough: ``noida-db`` is a Python wrapper that dies
    at once on SIGTERM while the server binary it runs (same group) shuts down for a while longer,
    writing into its data folder; removing that folder then fails with "Directory not empty".
    """
    pgid = process.pid  # the leader of its own session and group
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for sig in (None, signal.SIGKILL):
        if sig is not None and _group_alive(pgid):
            os.killpg(pgid, sig)
            deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None and not _group_alive(pgid):
                return
            time.sleep(0.05)
    process.poll()
    if _group_alive(pgid):
        raise RuntimeError(f"process group {pgid} is still alive after SIGKILL")


class NoidaElasticsearch:
    """``with NoidaElasticsearch() as url:`` — a running Elasticsearch-API server for the block."""

    def __init__(self, *, startup_timeout: float = 60.0) -> None:
        self.startup_timeout = startup_timeout
        self.url = ""
        self._process: Optional[subprocess.Popen] = None
        self._tmp: Optional[tempfile.TemporaryDirectory] = None

    def __enter__(self) -> str:
        binary = find_noida()
        if binary is None:
            raise FileNotFoundError("noida-db is not installed (pip install noida-db==0.2.3)")
        self._tmp = tempfile.TemporaryDirectory(prefix="tcrag-noida-")
        data_dir = Path(self._tmp.name)
        last_error = ""
        for _ in range(3):  # a free port can be taken between probing and binding; retry then
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            log = open(data_dir / "server.log", "ab")
            self._process = subprocess.Popen(
                [binary, "start", "--host", "127.0.0.1", "--only", "elasticsearch",
                 "--elasticsearch-port", str(port), "--data-dir", str(data_dir / "data")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
            log.close()
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline and self._process.poll() is None:
                try:
                    with urllib.request.urlopen(f"{self.url}/_cluster/health", timeout=2) as resp:
                        if resp.status == 200 and json.load(resp).get("status") in ("green", "yellow"):
                            return self.url
                except (urllib.error.URLError, OSError, ValueError) as exc:
                    last_error = str(exc)
                time.sleep(0.1)
            self._stop()
        log_text = (data_dir / "server.log").read_text(errors="replace")[-2000:]
        self.__exit__(None, None, None)
        raise RuntimeError(f"noida-db did not become healthy ({last_error}); log:\n{log_text}")

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            stop_process_group(process)

    def __exit__(self, *exc: Any) -> None:
        self._stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


class FaultServer:
    """A loopback HTTP server that misbehaves for every method and path.

    ``mode``: ``"error500"`` (HTTP 500 with an Elasticsearch-style error), ``"echo500"`` (the same,
    its ``reason`` echoing every request header, as a careless proxy does), ``"garbage"`` (HTTP 200
    claiming JSON, body is not JSON), ``"hang"`` (reads the request, never answers before
    ``hang_s``). ``requests`` counts what arrived, ``headers`` keeps each request's headers.
    """

    def __init__(self, mode: str, *, hang_s: float = 5.0) -> None:
        if mode not in ("error500", "echo500", "garbage", "hang"):
            raise ValueError(f"unknown fault mode {mode!r}")
        self.mode = mode
        self.hang_s = hang_s
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server.requests += 1
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                if server.mode == "hang":
                    server._stop.wait(server.hang_s)
                    return
                if server.mode in ("error500", "echo500"):
                    reason = "boom" if server.mode == "error500" else (
                        f"boom; request headers: authorization={self.headers.get('Authorization')} "
                        f"{dict(self.headers.items())}"
                    )
                    status, body = 500, json.dumps(
                        {"error": {"type": "internal_server_error", "reason": reason}, "status": 500}
                    ).encode()
                else:
                    status, body = 200, b"<html>definitely not json"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("X-Elastic-Product", "Elasticsearch")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> "FaultServer":
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
