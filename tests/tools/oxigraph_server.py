"""A real Oxigraph SPARQL 1.1 server on loopback for tests (PyPI ``oxigraph`` ships the CLI).

Example:
    >>> with OxigraphServer() as server:                         # doctest: +SKIP
    ...     server.replace_default_graph(b"<http://a> <http://b> <http://c> .\\n")
    ...     server.query_url
    'http://127.0.0.1:40123/query'
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

__all__ = ["OxigraphServer", "find_oxigraph", "free_port"]


def find_oxigraph() -> Optional[str]:
    """Path of the ``oxigraph`` executable: next to this Python first, then on PATH."""
    beside = Path(sys.executable).with_name("oxigraph")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("oxigraph")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class OxigraphServer:
    """``oxigraph serve`` (in-memory store) bound to ``host:port``; stopped on exit.

    Only this process is ever stopped (by its own handle), never anything found by name.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: Optional[int] = None, binary: Optional[str] = None, startup_timeout_s: float = 20.0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.binary = binary or find_oxigraph()
        if not self.binary:
            raise FileNotFoundError("the oxigraph CLI is not installed (pip install oxigraph)")
        self.startup_timeout_s = startup_timeout_s
        self._process: Optional[subprocess.Popen] = None
        self._log = tempfile.TemporaryFile()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def query_url(self) -> str:
        return self.base_url + "/query"

    def start(self) -> "OxigraphServer":
        self._process = subprocess.Popen(
            [self.binary, "serve", "--bind", f"{self.host}:{self.port}"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self.startup_timeout_s
        probe = self.query_url + "?" + urllib.parse.urlencode({"query": "ASK {}"})
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"oxigraph exited with {self._process.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(probe, timeout=1.0) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"oxigraph did not answer on {self.base_url} within {self.startup_timeout_s} s")

    def replace_default_graph(self, ntriples: bytes) -> None:
        """Replace the default graph with N-Triples data (SPARQL Graph Store protocol, PUT)."""
        request = urllib.request.Request(
            self.base_url + "/store?default",
            data=ntriples,
            method="PUT",
            headers={"Content-Type": "application/n-triples"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status not in (200, 201, 204):
                raise RuntimeError(f"oxigraph refused the data: HTTP {response.status}")

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-2000:]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def __enter__(self) -> "OxigraphServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()
