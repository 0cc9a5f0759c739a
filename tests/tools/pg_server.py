"""A throwaway PostgreSQL cluster on loopback for tests.

``PostgresServer`` runs ``initdb`` into a fresh temporary folder, starts ``postgres`` with
``pg_ctl`` on a free 127.0.0.1 port (no other address, Unix socket inside the temporary folder),
trusts connections from loopback and the local socket only, and on exit stops the cluster with
``pg_ctl stop -m fast`` and deletes the folder.

PostgreSQL refuses to run as root. When the tests run as root the server runs as an existing
unprivileged account (``postgres``, else ``nobody``) through ``setpriv`` (or ``runuser``); no
account is ever created. :func:`why_unavailable` says exactly what is missing, for a skip reason.

Example:
    >>> with PostgresServer() as pg:                                 # doctest: +SKIP
    ...     url = pg.create_database("emr")
    >>> url                                                          # doctest: +SKIP
    'postgresql+psycopg://tcrag@127.0.0.1:41234/emr'
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = ["PgBinaries", "RunAs", "find_binaries", "find_run_as", "why_unavailable", "free_port", "PostgresServer"]

SUPERUSER = "tcrag"
_CANDIDATE_USERS = ("postgres", "nobody")


@dataclass(frozen=True)
class PgBinaries:
    bindir: str

    def __getattr__(self, name: str) -> str:  # .initdb, .pg_ctl, .postgres
        if name.startswith("_"):
            raise AttributeError(name)
        return os.path.join(self.bindir, name)


@dataclass(frozen=True)
class RunAs:
    """How to run a command as the server's account: ``prefix + argv``. Empty prefix: as ourselves."""

    user: str
    uid: int
    gid: int
    prefix: tuple[str, ...]


def _bindir_ok(bindir: str) -> bool:
    return all(os.access(os.path.join(bindir, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres"))


def find_binaries() -> Optional[PgBinaries]:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: from PATH first, then the newest
    ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which("initdb")
    if found:
        bindir = os.path.dirname(os.path.realpath(found))  # /usr/local/bin/initdb may be a symlink
        if _bindir_ok(bindir):
            return PgBinaries(bindir)

    def version(path: str) -> tuple[int, ...]:
        part = Path(path).parent.name
        return tuple(int(x) for x in part.split(".") if x.isdigit()) or (0,)

    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if _bindir_ok(bindir):
            return PgBinaries(bindir)
    return None


def find_run_as() -> Optional[RunAs]:
    """Ourselves when not root; as root, an existing unprivileged account and a tool to switch to it."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return RunAs(me.pw_name, me.pw_uid, os.getegid(), ())
    setpriv, runuser = shutil.which("setpriv"), shutil.which("runuser")
    if not (setpriv or runuser):
        return None
    for name in _CANDIDATE_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid == 0:
            continue
        if setpriv:
            prefix = (setpriv, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--")
        else:
            prefix = (runuser, "-u", name, "--")
        return RunAs(name, entry.pw_uid, entry.pw_gid, prefix)
    return None


def why_unavailable() -> Optional[str]:
    """None when a cluster can be started here, else what exactly is missing."""
    if find_binaries() is None:
        return ("PostgreSQL server binaries not found (initdb, pg_ctl and postgres neither on PATH nor in "
                "/usr/lib/postgresql/*/bin; e.g. apt-get install postgresql)")
    if find_run_as() is None:
        if not (shutil.which("setpriv") or shutil.which("runuser")):
            return "running as root and neither setpriv nor runuser is available to drop privileges for initdb/postgres"
        return (f"running as root (initdb refuses root) and no existing unprivileged account "
                f"({', '.join(_CANDIDATE_USERS)}) to run the server as")
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class PostgresServer:
    """``with PostgresServer() as pg:`` — a running PostgreSQL cluster on 127.0.0.1 for the block.

    ``pg.url(dbname)`` is a SQLAlchemy URL (``postgresql+psycopg``); ``pg.create_database(name)``
    creates a database and returns its URL; ``pg.log_text()`` is the server log.
    """

    def __init__(self, *, startup_timeout_s: float = 30.0, locale: str = "C.UTF-8") -> None:
        self.startup_timeout_s = startup_timeout_s
        self.locale = locale
        self.port = 0
        self.host = "127.0.0.1"
        self._tmp: Optional[str] = None
        self._running = False
        bins, run_as = find_binaries(), find_run_as()
        reason = why_unavailable()
        if reason or bins is None or run_as is None:
            raise FileNotFoundError(reason or "PostgreSQL unavailable")
        self.bins, self.run_as = bins, run_as

    # -- paths

    @property
    def root(self) -> Path:
        assert self._tmp is not None
        return Path(self._tmp)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@{self.host}:{self.port}/{dbname}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- running commands as the server account

    def _run(self, argv: list[str], *, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": self.locale, "LANG": self.locale,
               "HOME": str(self.root), "TZ": "UTC"}
        result = subprocess.run(
            [*self.run_as.prefix, *argv], cwd=str(self.root), env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, text=True,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{os.path.basename(argv[0])} failed ({result.returncode}):\n{result.stdout[-2000:]}")
        return result

    # -- lifecycle

    def __enter__(self) -> "PostgresServer":
        self._tmp = tempfile.mkdtemp(prefix="tcrag-pg-")
        try:
            os.chmod(self._tmp, 0o700)
            if self.run_as.prefix:
                os.chown(self._tmp, self.run_as.uid, self.run_as.gid)
                probe = self._run(["test", "-w", self._tmp], timeout=10, check=False)
                if probe.returncode != 0:
                    raise PermissionError(
                        f"user {self.run_as.user!r} cannot reach {self._tmp} (a parent folder is private?); "
                        "set TMPDIR to a world-traversable folder"
                    )
            self._run([self.bins.initdb, "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                       "--encoding=UTF8", f"--locale={self.locale}", "--no-sync", "--no-instructions"],
                      timeout=120)
            # trust, but only for the local socket and loopback (no replication, no other address)
            (self.data_dir / "pg_hba.conf").write_text(
                "local all all trust\nhost all all 127.0.0.1/32 trust\n", encoding="utf-8"
            )
            last = ""
            for _ in range(3):  # a free port can be taken between probing and binding; retry then
                self.port = free_port(self.host)
                options = " ".join([
                    f"-c listen_addresses={self.host}", f"-p {self.port}",
                    f"-c unix_socket_directories={self.root}", "-c fsync=off", "-c synchronous_commit=off",
                    "-c full_page_writes=off", "-c max_connections=20", "-c shared_buffers=32MB",
                    "-c log_min_messages=warning", "-c timezone=UTC",
                ])
                started = self._run([self.bins.pg_ctl, "-D", str(self.data_dir), "-l", str(self.log_path),
                                     "-w", "-t", str(int(self.startup_timeout_s)), "-o", options, "start"],
                                    timeout=self.startup_timeout_s + 30, check=False)
                if started.returncode == 0:
                    self._running = True
                    self._wait_accepting()
                    return self
                last = started.stdout[-1500:] + "\n" + self.log_text()[-1500:]
                self._stop()
                if "could not bind" not in last and "already in use" not in last:
                    break
            raise RuntimeError(f"PostgreSQL did not start:\n{last}")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _wait_accepting(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                with psycopg.connect(host=self.host, port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self, name: str) -> str:
        """``CREATE DATABASE name`` (a plain identifier) and return its SQLAlchemy URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(host=self.host, port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def _stop(self) -> None:
        if not self._tmp or not (self.data_dir / "postmaster.pid").exists():
            self._running = False
            return
        try:
            self._run([self.bins.pg_ctl, "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop"],
                      timeout=60, check=False)
        except subprocess.TimeoutExpired:
            pass
        pidfile = self.data_dir / "postmaster.pid"
        if pidfile.exists():  # pg_ctl could not stop it: end the postmaster we started, by its pid
            try:
                pid = int(pidfile.read_text().splitlines()[0])
                os.kill(pid, signal.SIGQUIT)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
        self._running = False

    def __exit__(self, *exc: Any) -> None:
        try:
            self._stop()
        finally:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None
