"""Which code made an evaluation row.

A run folder resumes across processes, days and commits (``tcrag eval`` reuses the rows it holds).
Each row records ``code_version``, a fingerprint of the package's source and prompt files, so a
table whose rows came from more than one version of the code (a prompt edited between two sessions
of a long run) says so instead of mixing them silently. It is a content hash, not a git commit: an
installed package has no repository.

Example:
    >>> rows = [{"method": "react", "code_version": "a"}, {"method": "react", "code_version": "b"},
    ...         {"method": "base", "code_version": "a"}, {"method": "base"}]
    >>> mixed_code_versions(rows)
    {'react': {'a': 1, 'b': 1}}
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["code_version", "mixed_code_versions"]

#: the file kinds that decide what a method does: code, prompt templates and worked examples
_SUFFIXES = (".py", ".txt", ".json")
#: prompts/ and tools/ live at the repository top level and install inside the package
_PACKAGES = ("tcrag_langgraph", "tcrag_langgraph.prompts", "tcrag_langgraph.tools")


@lru_cache(maxsize=1)
def code_version() -> str:
    """12 hex digits of a SHA-256 over every source and prompt file of the package (path and bytes),
    the same for an editable and a regular install of the same files."""
    digest = hashlib.sha256()
    for package in _PACKAGES:
        # a regular install nests prompts/ and tools/ in the package: count them once, under their own name
        skip = ("prompts", "tools") if package == "tcrag_langgraph" else ()
        for path, data in sorted(_files(resources.files(package), package, skip)):
            digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:12]


def _files(folder: Any, prefix: str, skip: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
    for entry in folder.iterdir():
        if entry.is_dir():
            if entry.name != "__pycache__" and entry.name not in skip:
                yield from _files(entry, f"{prefix}/{entry.name}")
        elif entry.name.endswith(_SUFFIXES):
            yield f"{prefix}/{entry.name}", entry.read_bytes()


def mixed_code_versions(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per method whose rows carry more than one ``code_version``: how many rows each has (rows
    without one, written before it was recorded, are not counted)."""
    seen: dict[str, dict[str, int]] = {}
    for row in rows:
        version = row.get("code_version")
        if version:
            counts = seen.setdefault(str(row["method"]), {})
            counts[version] = counts.get(version, 0) + 1
    return {method: counts for method, counts in seen.items() if len(counts) > 1}
