"""Low-level llama.cpp access shared by the chat model (:mod:`.llama_cpp`), the exact scorer
(:mod:`tcrag_langgraph.monitor.llama_cpp`) and speculative decoding (:mod:`.speculative`): importing
llama.cpp safely (:func:`import_llama_cpp`), threads, silencing llama.cpp's own prints, GPU offload, and
batches that ask for logits at chosen positions."""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
from typing import Any, Callable

from .weights import LocalModelError

__all__ = ["import_llama_cpp", "quiet_native", "default_threads", "require_gpu_offload", "decode_at", "decode_tokens", "logits_row", "log_softmax_at",
           "return_freed_heap"]


@functools.cache
def share_cxx_runtime() -> bool:
    """Put the C++ runtime (libstdc++) in the process's global symbol scope; True if it is there.

    Why: a CUDA build of llama.cpp crashed (SIGSEGV in ``std::regex``, compiling the tokenizer's
    pre-split pattern at model load) in any process where libstdc++ had been loaded *locally* before
    llama.cpp's libraries: by numpy, torch or jaxtyping, say (an H100, llama-cpp-python 0.3.36, nvcc
    13.0; benchmarks/RESULTS.md section 12, session 13). Loading libstdc++ with RTLD_GLOBAL first, or
    promoting the copy already loaded, made every one of those processes load and generate. It is the
    same file either way, so CPU-only processes lose nothing. Linux only; elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return False
    for flags in (os.RTLD_GLOBAL | os.RTLD_NOLOAD, os.RTLD_GLOBAL):  # promote the loaded copy, else load one
        try:
            ctypes.CDLL("libstdc++.so.6", mode=flags)
            return True
        except OSError:
            continue
    return False  # no libstdc++ here (a static or musl build): nothing to share


def import_llama_cpp():
    """The ``llama_cpp`` module, imported only after :func:`share_cxx_runtime`. Every use of llama.cpp
    in this package goes through here; a ``llama_cpp`` imported by the application before any model
    of ours was loaded is too late for the promotion (call this function first in such code)."""
    share_cxx_runtime()
    import llama_cpp

    return llama_cpp


class quiet_native:
    """Silence llama.cpp's own prints (C-level stdout/stderr) for a block."""

    def __enter__(self):
        import_llama_cpp()
        from llama_cpp._utils import suppress_stdout_stderr

        self._inner = suppress_stdout_stderr(disable=False)
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


def default_threads() -> int:
    """Threads for llama.cpp when none are given: ``$TCRAG_THREADS`` if set, else the cores this
    process may run on (on a busy shared machine 1 is often faster: llama.cpp's threads spin-wait)."""
    env = os.environ.get("TCRAG_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"TCRAG_THREADS must be a positive integer, not {env!r}")
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def require_gpu_offload() -> None:
    """LocalModelError unless this llama-cpp-python build can offload layers to a GPU."""
    llama_cpp = import_llama_cpp()

    if not llama_cpp.llama_supports_gpu_offload():
        raise LocalModelError(
            "a GPU was asked for (n_gpu_layers/device), but this llama-cpp-python build has no GPU offload; "
            "rebuild it with CMAKE_ARGS=\"-DGGML_CUDA=on\" (or use device='cpu')")


def decode_at(ctx: Any, batch: Any, ids: list[int], start_pos: int, want: Callable[[int], bool]) -> list[int]:
    """Decode ``ids`` at positions ``start_pos..`` in sequence 0, asking for logits where ``want(pos)``;
    returns the batch indices that have logits (for ``llama_get_logits_ith``)."""
    items = [(tok, start_pos + i, 0, bool(want(start_pos + i))) for i, tok in enumerate(ids)]
    decode_tokens(ctx.ctx, batch.batch, items)
    return [i for i, item in enumerate(items) if item[3]]


def decode_tokens(ctx: Any, batch: Any, items: list[tuple[int, int, int, bool]]) -> None:
    """One ``llama_decode`` of ``items`` (token, position, sequence id, whether its logits are wanted) through
    ``batch`` (a ``llama_batch`` with room for them) in ``ctx`` (a ``llama_context`` pointer);
    RuntimeError if llama.cpp refuses the batch."""
    llama_cpp = import_llama_cpp()

    batch.n_tokens = len(items)
    for i, (token, pos, seq, logits) in enumerate(items):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
        batch.seq_id[i][0] = seq
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} (a batch of {len(items)} tokens)")


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def return_freed_heap() -> None:
    """Hand the C heap's freed pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Why: llama.cpp's grammar sampler allocates and frees many small blocks per token, and glibc keeps
    the freed pages. A server's memory climbed ~10 MB per 20 constrained replies with nothing leaked
    (tracemalloc flat; one trim returned all of it: the 135M model, session 19), which made a server
    that runs for days look like it leaked. One trim after a constrained reply costs ~1 ms."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def logits_row(ctx: Any, i: int, n_vocab: int):
    import numpy as np
    llama_cpp = import_llama_cpp()

    ptr = llama_cpp.llama_get_logits_ith(ctx.ctx, i)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


def log_softmax_at(row, target: int) -> float:
    import numpy as np

    x = row.astype(np.float64)
    m = x.max()
    return float(x[target] - m - math.log(np.exp(x - m).sum()))
