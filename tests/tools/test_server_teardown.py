"""Issue 21 item 8: test servers are stopped whole before their folder is removed.

``test_searxng_async_key_is_not_forwarded_on_a_cross_origin_redirect`` (the last test of the
session under tests/tools) errored at teardown with ``OSError: Directory not empty: 'data'``: the
session's Elasticsearch-API server (noida-db) was stopped by waiting for its Python wrapper only,
while the server binary it runs kept writing into its data folder during its own shutdown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from es_server import NoidaElasticsearch, _group_alive, find_noida, stop_process_group  # tests/tools helper

# A wrapper that dies at once on SIGTERM, running a "server" that takes a while to shut down and
# writes into its data folder meanwhile: the shape of noida-db's Python entry point and binary.
_SERVER = """
import pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
def stop(*_):
    time.sleep(float(sys.argv[2]))
    (folder / "data" / "flushed-on-shutdown").write_text("late write")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
(folder / "data").mkdir()
(folder / "ready").write_text("1")
while True:
    time.sleep(0.05)
"""
_WRAPPER = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1], *sys.argv[2:]]))"


def _start(folder: Path, shutdown_s: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", _WRAPPER, _SERVER, str(folder), str(shutdown_s)],
                               start_new_session=True)
    deadline = time.monotonic() + 30
    while not (folder / "ready").exists():
        assert time.monotonic() < deadline and process.poll() is None, "the fake server did not start"
        time.sleep(0.05)
    return process


def test_waiting_for_the_wrapper_alone_returns_while_the_server_still_writes(tmp_path):
    """The race, reproduced: the old stop returned before the server's last write."""
    process = _start(tmp_path, shutdown_s=2.0)
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=10)
    assert not (tmp_path / "data" / "flushed-on-shutdown").exists()  # the server is still shutting down
    stop_process_group(process)  # clean up the rest of the group
    assert (tmp_path / "data" / "flushed-on-shutdown").exists()


def test_stop_process_group_returns_only_when_the_whole_group_is_gone():
    for _ in range(3):
        with tempfile.TemporaryDirectory() as folder:  # removal raises if anything still writes
            process = _start(Path(folder), shutdown_s=0.5)
            stop_process_group(process)
            assert (Path(folder) / "data" / "flushed-on-shutdown").read_text() == "late write"
            assert not _group_alive(process.pid)


def test_stop_process_group_kills_a_server_that_ignores_sigterm(tmp_path):
    process = _start(tmp_path, shutdown_s=60.0)  # would take a minute: SIGKILL after the timeout
    started = time.monotonic()
    stop_process_group(process, timeout=1.0)
    assert time.monotonic() - started < 10
    assert not _group_alive(process.pid)


@pytest.mark.skipif(find_noida() is None, reason="noida-db not installed")
def test_real_noida_server_is_stopped_whole_and_its_folder_removed():
    server = NoidaElasticsearch()
    url = server.__enter__()
    folder, pgid = Path(server._tmp.name), server._process.pid
    body = json.dumps({"text": "written just before shutdown"}).encode()
    for i in range(20):  # give it data to flush
        request = urllib.request.Request(f"{url}/teardown-{i % 3}/_doc/{i}", data=body, method="PUT",
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()
    server.__exit__(None, None, None)  # raised "Directory not empty" when the binary outlived the wrapper
    assert not folder.exists()
    assert not _group_alive(pgid)
