"""GGUF files: checks that name a damaged file before llama.cpp sees it, the architecture and file
type a file declares, and the float16 re-encoding the exact state monitor scores with."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from .cache_entries import has_record, prune_stale, record_source
from .llama_cpp_native import default_threads, import_llama_cpp, quiet_native
from .weights import LocalModelError, cache_dir

__all__ = ["GGUF_MAGIC", "check_gguf_file", "check_gguf_magic", "gguf_architecture", "gguf_file_type", "f16_copy"]

GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: Path) -> None:
    """A LocalModelError unless ``path`` is a readable GGUF file whose tensor data all lie inside it.

    Uses the ``gguf`` package's reader (metadata and tensor table, memory-mapped): a truncated file, a
    file that is not GGUF, or a damaged header is named here with what is wrong, before llama.cpp
    sees it.
    """
    check_gguf_magic(path)
    size = path.stat().st_size
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # noqa: BLE001 - the reader raises many types on a damaged file
        raise LocalModelError(f"{path} is truncated or corrupt (its GGUF header or tensor table cannot be read: "
                              f"{type(exc).__name__}: {exc})") from None
    if end > size:
        raise LocalModelError(f"{path} is truncated: its tensors need {end} bytes, the file has {size}")


def check_gguf_magic(path: Path) -> None:
    """Existence and the GGUF magic, without parsing the file."""
    if not path.is_file():
        raise LocalModelError(f"GGUF file {path} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise LocalModelError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")


def gguf_architecture(path: Path) -> Optional[str]:
    """``general.architecture`` of a GGUF file (None if it cannot be read)."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        fld = reader.fields.get("general.architecture")
        if fld is None:
            return None
        return bytes(fld.parts[fld.data[0]]).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        return None


def f16_copy(path: "str | os.PathLike[str]", file_type: Optional[int] = None) -> Path:
    """The float16 re-encoding of a GGUF used for exact scoring, written once by llama.cpp's own
    ``llama_model_quantize`` (every quantized weight de-quantized and stored as float16) under
    ``$TCRAG_CACHE_DIR/gguf-f16/`` (keyed like the transformers copy: path, size, mtime). A file that
    is already float16/float32 is returned as it is. Writing a copy removes the copies whose source
    file is gone or has changed since (each copy names its source in a ``.source.json`` beside it;
    a copy of the same name from before those records is removed too): a reinstalled package or a
    new virtual environment would otherwise leave a stale copy (270 MB for SmolLM2) each time."""
    import ctypes as _ct
    import hashlib
    import tempfile

    llama_cpp = import_llama_cpp()

    src = Path(path).expanduser().resolve()
    if (file_type if file_type is not None else gguf_file_type(src)) in (0, 1):  # ALL_F32, MOSTLY_F16
        return src
    stat = src.stat()
    key = hashlib.sha256(f"{src}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "gguf-f16" / f"{src.stem}-{key}.f16.gguf"
    if target.is_file():
        if not has_record(target):  # written before the records
            record_source(target, src, stat)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"tcrag: writing a float16 copy of {src.name} at {target} (first use only; "
          "~3 s for 135M parameters, ~10 s for 0.5B)", file=sys.stderr, flush=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    os.close(fd)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
        params.allow_requantize = True
        params.pure = True
        params.nthread = default_threads()
        with quiet_native():
            rc = llama_cpp.llama_model_quantize(str(src).encode(), tmp.encode(), _ct.byref(params))
        if rc != 0:
            os.unlink(tmp)
            raise LocalModelError(f"llama.cpp could not write a float16 copy of {src} (code {rc}){_disk_hint(src, target.parent)}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    record_source(target, src, stat)
    prune_stale(target.parent, "*.f16.gguf", keep=target, stem=src.stem)
    return target


def _disk_hint(src: Path, folder: Path) -> str:
    """Why a float16 copy most often fails: llama.cpp says only "code 1" when the disk fills up."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    # de-quantized to 16 bits a weight: ~3.5x a 4-bit file's bytes; 4x leaves room for the metadata
    need = 4 * src.stat().st_size
    if free >= need:
        return ""
    return (f"; the disk is the likely cause: {free // 2**20} MB free in {folder}, and the copy takes up to "
            f"~{need // 2**20} MB (set TCRAG_CACHE_DIR to a roomier disk, or free some space)")


def gguf_file_type(path: Path) -> Optional[int]:
    """``general.file_type`` of a GGUF. llama.cpp reads it with a vocabulary-only load in ~0.1 s; the
    gguf reader (only where llama.cpp cannot read the file) parses every field, 4 s for a 49k-token
    vocabulary."""
    llama_cpp = import_llama_cpp()
    import llama_cpp._internals as internals

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    try:
        with quiet_native():
            value = internals.LlamaModel(path_model=str(path), params=params, verbose=False).metadata().get("general.file_type")
        return int(value) if value is not None and str(value).isdigit() else None
    except Exception:  # noqa: BLE001 - not readable by llama.cpp: ask the gguf reader
        pass
    try:
        from gguf import GGUFReader

        fld = GGUFReader(str(path)).fields.get("general.file_type")
        return None if fld is None else int(fld.parts[-1][0])
    except Exception:  # noqa: BLE001
        return None
