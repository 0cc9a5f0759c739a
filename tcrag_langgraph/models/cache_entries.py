"""Cache entries made from a model file (its float16 copy, its saved prompt states): each names its
source in a record beside it, and writing a new entry removes those whose source is gone or changed.

Why: entries are keyed by the source's path, size and modification time, so every reinstalled
package or new virtual environment wrote a new one and left the old one behind (8 stale float16
copies of SmolLM2, 2.2 GB, on this project's machine).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Optional

__all__ = ["record_source", "has_record", "prune_stale"]


def _record_path(entry: Path) -> Path:
    return entry.with_name(entry.name + ".source.json")


def record_source(entry: Path, src: Path, stat: os.stat_result, *, extra: Optional[Mapping[str, Any]] = None) -> None:
    """Write ``entry``'s record: the source file as it was when the entry was made (and ``extra``
    facts the entry also depends on, e.g. the llama.cpp version)."""
    record = {"path": str(src), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, **(extra or {})}
    _record_path(entry).write_text(json.dumps(record))


def has_record(entry: Path) -> bool:
    return _record_path(entry).exists()


def prune_stale(folder: Path, pattern: str, *, keep: Path, stem: str,
                extra: Optional[Mapping[str, Any]] = None) -> None:
    """Delete the entries of ``folder`` matching ``pattern`` whose recorded source no longer exists as
    it was, or whose ``extra`` facts differ; an entry without a record is deleted when its name starts
    with ``stem`` (written before the records). A process still using a deleted file keeps its
    mapping; one about to use an entry writes it again."""
    for entry in folder.glob(pattern):
        if entry == keep or entry.name.endswith(".source.json"):
            continue
        record_file = _record_path(entry)
        if not record_file.exists():
            stale = entry.name.startswith(f"{stem}-")
        else:
            try:
                record = json.loads(record_file.read_text())
                source = Path(record["path"])
                stale = not source.exists() or (
                    (source.stat().st_size, source.stat().st_mtime_ns) != (record["size"], record["mtime_ns"])
                ) or any(record.get(k) != v for k, v in (extra or {}).items())
            except (OSError, ValueError, KeyError, TypeError):
                stale = False  # unreadable: leave it alone
        if stale:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            record_file.unlink(missing_ok=True)
