"""Saved key/value states of llama.cpp's generation context: branches cut back, and a prompt's fixed
prefix on disk.

Prefix reuse (:mod:`.llama_cpp`) keeps the longest common token prefix of the last prompt and the
next one; everything after it is cut. Two patterns of an agent run throw away work that comes back:

* **a pop, then the same push**: Backtrack drops a tool observation and the model calls the same
  tool again, or a re-prompt appends a turn that the next step drops. In the main job, `make ask` (the
  packaged SmolLM2, one thread) two such steps re-prefilled ~440 tokens each, 3.6 s apiece.
  :class:`BranchStash` keeps the last sequences that were cut back (their key/value bytes, from
  ``llama_state_seq_get_data``) and restores the one sharing the longest prefix with a new prompt.
* **a new process**: every run begins with the same system prompt and demonstrations (~900 tokens,
  6.4 s at one thread for the packaged model), and ``tcrag ask`` is one process per question.
  :class:`PrefixFiles` saves the key/value state of a prompt's fixed prefix (everything before its
  last user turn) to a file per model and prefix (``llama_state_seq_save_file``), and the next
  process loads it instead of prefilling.

A restored state is the bytes llama.cpp computed, so the logits after a restore are those after the
original prefill, bit for bit (tests/test_llama_cpp_states.py). The fixed prefix is always prefilled
on its own, file or no file, so a cold run and a warm one compute the same thing.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .cache_entries import prune_stale, record_source
from .llama_cpp_native import import_llama_cpp

__all__ = ["SavedSequence", "BranchStash", "PrefixFiles", "common_prefix", "reusable_prefix", "snapshot", "restore"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    Example:
        >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
        2
    """
    n = 0
    for x, y in zip(a, b):
        if int(x) != int(y):
            break
        n += 1
    return n


@dataclass(frozen=True)
class SavedSequence:
    """The key/value bytes of sequence 0 holding exactly ``tokens``."""

    tokens: tuple[int, ...]
    data: Any  # a ctypes byte array

    @property
    def nbytes(self) -> int:
        return len(self.data)


def snapshot(llm: Any, n: int) -> SavedSequence:
    """The state of ``llm``'s sequence 0, which must hold exactly its first ``n`` evaluated tokens."""
    llama_cpp = import_llama_cpp()

    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    data = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, data, size, 0)
    if written != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {written} of {size} bytes")
    return SavedSequence(tokens=tuple(int(t) for t in llm.input_ids[:n]), data=data)


def restore(llm: Any, saved: SavedSequence) -> None:
    """Make ``saved`` the content of ``llm``'s sequence 0 (and of llama-cpp-python's token record)."""
    llama_cpp = import_llama_cpp()

    llm._ctx.kv_cache_seq_rm(0, 0, -1)
    read = llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, saved.data, len(saved.data), 0)
    if read != len(saved.data):
        llm.n_tokens = 0
        raise RuntimeError("llama_state_seq_set_data could not restore a saved sequence")
    n = len(saved.tokens)
    llm.input_ids[:n] = saved.tokens
    llm.n_tokens = n
    llm._requires_eval = True  # llama-cpp-python's logits are not those of the restored last token


class BranchStash:
    """The last few sequences a new prompt cut back, to restore when a later prompt shares more of one.

    ``max_bytes`` bounds the memory (the packaged 135M model keeps ~23 KB per token, Qwen2.5-1.5B
    ~28 KB); ``min_tokens`` is the least gain worth a save or a restore.
    """

    def __init__(self, *, max_bytes: int = 48 << 20, min_tokens: int = 32) -> None:
        if max_bytes < 0 or min_tokens < 1:
            raise ValueError("max_bytes must be >= 0 and min_tokens >= 1")
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._saved: list[SavedSequence] = []  # most recent last

    def before_prompt(self, llm: Any, prompt: Sequence[int]) -> int:
        """Called with sequence 0 holding exactly ``llm.n_tokens`` exact tokens, before ``prompt`` is
        evaluated: keeps what the prompt would cut, restores a saved branch that shares at least
        ``min_tokens`` more of the prompt than the cache does. Returns the tokens gained."""
        n = int(llm.n_tokens)
        kept = common_prefix(llm.input_ids[:n], prompt)
        best, shared = None, kept
        for saved in self._saved:
            s = common_prefix(saved.tokens, prompt)
            if s > shared:
                best, shared = saved, s
        if n - kept >= self.min_tokens:  # the prompt leaves a branch behind: keep it
            self._keep(snapshot(llm, n))
        if best is None or shared - kept < self.min_tokens:
            return 0
        restore(llm, best)
        return shared - kept

    def _keep(self, saved: SavedSequence) -> None:
        if saved.nbytes > self.max_bytes:
            return
        # a branch the new one extends (or repeats) is redundant
        self._saved = [s for s in self._saved if common_prefix(s.tokens, saved.tokens) < len(s.tokens)]
        self._saved.append(saved)
        while sum(s.nbytes for s in self._saved) > self.max_bytes:
            self._saved.pop(0)


class PrefixFiles:
    """Key/value states of fixed prompt prefixes in files: ``<directory>/<model key>/<prefix hash>.kv``.

    The model key covers the GGUF file (path, size, modification time) and the llama.cpp build, so a
    changed file or library never loads an old state. At most ``max_files`` states are kept per model
    (the least recently used go); a file that does not load is deleted and rebuilt. Starting a model's
    folder removes the folders of models whose file is gone or changed or of another llama.cpp build
    (:mod:`.cache_entries`).
    """

    def __init__(self, directory: "str | os.PathLike[str]", *, min_tokens: int = 256, max_files: int = 8) -> None:
        if min_tokens < 1 or max_files < 1:
            raise ValueError("min_tokens and max_files must be >= 1")
        self.directory = Path(directory).expanduser()
        self.min_tokens = min_tokens
        self.max_files = max_files

    def path_for(self, model_path: str, prefix: Sequence[int]) -> Path:
        llama_cpp = import_llama_cpp()

        src = Path(model_path).resolve()
        stat = src.stat()
        model_key = hashlib.sha256(f"{src}|{stat.st_size}|{stat.st_mtime_ns}|{llama_cpp.__version__}".encode())
        digest = hashlib.sha256(",".join(str(int(t)) for t in prefix).encode()).hexdigest()[:24]
        return self.directory / f"{src.stem}-{model_key.hexdigest()[:12]}" / f"{digest}.kv"

    def ensure(self, llm: Any, model_path: str, prefix: Sequence[int]) -> Optional[str]:
        """Make sequence 0 hold ``prefix`` (it must hold a prefix of it, ``llm.n_tokens`` exact tokens):
        load its file, or prefill what is missing and write the file. Returns ``"loaded"``,
        ``"saved"`` or None (nothing done: too short, or already there)."""
        prefix = [int(t) for t in prefix]
        if len(prefix) < self.min_tokens or common_prefix(llm.input_ids[:llm.n_tokens], prefix) >= len(prefix):
            return None
        path = self.path_for(model_path, prefix)
        if path.is_file() and self._load(llm, path, prefix):
            os.utime(path)  # recently used
            return "loaded"
        llm.n_tokens = common_prefix(llm.input_ids[:llm.n_tokens], prefix)
        llm.eval(prefix[llm.n_tokens:])  # cuts the cache after n_tokens first
        self._save(llm, path, prefix, model_path)
        return "saved"

    def _load(self, llm: Any, path: Path, prefix: list[int]) -> bool:
        llama_cpp = import_llama_cpp()

        tokens = (llama_cpp.llama_token * len(prefix))()
        count = ctypes.c_size_t(0)
        llm._ctx.kv_cache_seq_rm(0, 0, -1)
        read = llama_cpp.llama_state_seq_load_file(llm._ctx.ctx, str(path).encode(), 0, tokens, len(prefix),
                                                   ctypes.byref(count))
        if read == 0 or count.value != len(prefix) or list(tokens) != prefix:
            llm._ctx.kv_cache_seq_rm(0, 0, -1)
            llm.n_tokens = 0
            path.unlink(missing_ok=True)  # damaged or not this prefix: rebuilt below
            return False
        llm.input_ids[:len(prefix)] = prefix
        llm.n_tokens = len(prefix)
        llm._requires_eval = True
        return True

    def _save(self, llm: Any, path: Path, prefix: list[int], model_path: str) -> None:
        llama_cpp = import_llama_cpp()

        if not path.parent.is_dir():  # this model's first state: name its source, drop stale folders
            path.parent.mkdir(parents=True, exist_ok=True)
            src = Path(model_path).resolve()
            build = {"llama_cpp": llama_cpp.__version__}
            record_source(path.parent, src, src.stat(), extra=build)
            prune_stale(path.parent.parent, "*", keep=path.parent, stem=src.stem, extra=build)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        os.close(fd)
        try:
            tokens = (llama_cpp.llama_token * len(prefix))(*prefix)
            written = llama_cpp.llama_state_seq_save_file(llm._ctx.ctx, tmp.encode(), 0, tokens, len(prefix))
            if written == 0:
                return  # a cache that cannot be written is only a slower next run
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        states = sorted(path.parent.glob("*.kv"), key=lambda p: p.stat().st_mtime)
        for old in states[:-self.max_files]:
            old.unlink(missing_ok=True)


def reusable_prefix(llm: Any, prompt: list[int]) -> int:
    """Prompt tokens llama-cpp-python's ``generate`` will take from the cache (its own rule: the longest
    common prefix with the evaluated tokens, one less when the whole prompt matches, so the last
    prompt token is evaluated again to give the next-token logits)."""
    k = common_prefix(llm.input_ids[:int(llm.n_tokens)], prompt)
    return k - 1 if k and k == len(prompt) else k
