"""The GGUF file as llama.cpp loads it (:class:`LlamaCppModel`): its tokenizer, special tokens and chat
template (the prompt rendered as transformers renders it, then tokenized by llama.cpp), loaded once
per process and option set (:func:`load_llama_model`), the quantized file or its float16
re-encoding. The chat model over it is :mod:`.llama_cpp`'s; the exact scorer over it,
:mod:`tcrag_langgraph.monitor.llama_cpp`'s."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from langchain_core.messages import BaseMessage

from .kv_cache import CacheStats
from .gguf_files import check_gguf_file, check_gguf_magic, f16_copy, gguf_architecture
from .llama_cpp_native import default_threads, import_llama_cpp, require_gpu_offload
from .llama_cpp_states import BranchStash, common_prefix
from .chat_turns import message_role, template_inputs
from .weights import LocalModelError, default_model_source

__all__ = ["LlamaCppModel", "ArchitectureUnsupported", "load_llama_model", "llama_cpp_available"]


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python can be imported (it is a dependency; a broken build says no)."""
    try:
        import_llama_cpp()
    except Exception:  # noqa: BLE001 - a missing shared library is an OSError, not an ImportError
        return False
    return True


class ArchitectureUnsupported(LocalModelError):
    """llama.cpp cannot run this (well-formed) GGUF; transformers may."""


@dataclass
class LlamaCppModel:
    """A loaded llama.cpp model (weights + a generation context) and what is needed around it.

    ``lock`` serialises every use of the model's contexts. The scorer's weights and contexts live in
    ``scoring`` (created on first score), so scoring never evicts the generator's cached prompt.
    """

    llm: Any
    name: str
    path: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    n_threads: int = 1
    #: per scoring precision ("f16", "native"): a _ScoreState (weights, context, batch, cached tokens)
    scoring: dict = field(default_factory=dict)
    stats: CacheStats = field(default_factory=CacheStats)
    #: leading tokens of the generation context's cache evaluated as plain decoding evaluates them (the
    #: prompt in batches, each generated token alone); speculative verification leaves batched results
    #: beyond it, which no later call may build on
    exact_tokens: int = 0
    #: sequences a prompt cut back, restored when a later prompt shares more of one (a pop, then the
    #: same push)
    branches: BranchStash = field(default_factory=BranchStash)
    #: GBNF text -> its llama_cpp.LlamaGrammar, checked by llama.cpp once (:mod:`.llama_cpp_grammar`)
    grammars: dict = field(default_factory=dict)

    # ----- tokens -----
    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text`` without a BOS; ``special=True`` reads special-token strings as those
        tokens, as transformers' tokenizers do."""
        if not text:
            return []
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=special))

    def detokenize(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens left out (``skip_special_tokens=True``)."""
        return self.llm.detokenize(list(ids), special=False).decode("utf-8", errors="ignore")

    def token_text(self, token_id: int) -> str:
        return self.llm._model.token_get_text(token_id)

    def is_eog(self, token_id: int) -> bool:
        llama_cpp = import_llama_cpp()

        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token_id))

    @property
    def bos_id(self) -> Optional[int]:
        value = int(self.llm.token_bos())
        return None if value < 0 else value

    @property
    def eos_id(self) -> Optional[int]:
        value = int(self.llm.token_eos())
        return None if value < 0 else value

    @property
    def n_ctx(self) -> int:
        # llama.cpp may pad the context; llama-cpp-python's token arrays keep the size asked for
        return min(int(self.llm.n_ctx()), len(self.llm.input_ids))

    @property
    def n_vocab(self) -> int:
        return int(self.llm.n_vocab())

    # ----- chat template -----
    @property
    def chat_template(self) -> str:
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise LocalModelError(f"{self.path} has no chat template (tokenizer.chat_template) to build a prompt with")
        return template

    def special_tokens_map(self) -> dict[str, str]:
        """The special-token strings a template may use, as transformers' ``special_tokens_map``."""
        out = {}
        for name, token_id in (("bos_token", self.bos_id), ("eos_token", self.eos_id)):
            if token_id is not None:
                out[name] = self.token_text(token_id)
        return out

    def prompt_ids(self, messages: list[BaseMessage], *, add_generation_prompt: bool = True,
                   tools: Optional[list[dict[str, Any]]] = None, reply_prefix: str = "") -> list[int]:
        """Token ids of the chat prompt, as ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``;
        with ``tools`` (function schemas) shown as :func:`~.chat_turns.template_inputs` says, and the
        reply begun with ``reply_prefix``."""
        from transformers.utils.chat_template_utils import render_jinja_template

        turns, shown = template_inputs(messages, tools, self.chat_template)
        rendered, _ = render_jinja_template(conversations=[turns], tools=shown, chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt, **self.special_tokens_map())
        return self.tokenize(rendered[0] + reply_prefix, special=True)

    def fixed_prefix(self, messages: list[BaseMessage], prompt: list[int], *,
                     tools: Optional[list[dict[str, Any]]] = None) -> list[int]:
        """The tokens of ``prompt`` before its last user turn (system prompt, tools, demonstrations):
        what every run of the same method and tools begins with."""
        if len(messages) < 2 or message_role(messages[-1]) != "user":
            return []
        head = self.prompt_ids(messages[:-1], add_generation_prompt=False, tools=tools)
        return prompt[:common_prefix(head, prompt)]


@lru_cache(maxsize=4)
def _load(path: str, n_ctx: int, n_threads: int, n_gpu_layers: int, name: Optional[str] = None) -> LlamaCppModel:
    llama_cpp = import_llama_cpp()

    file = Path(path)
    check_gguf_magic(file)  # the full check (a few seconds for a large vocabulary) only if llama.cpp fails
    if n_gpu_layers != 0:
        require_gpu_offload()
    try:
        # use_mmap=False: llama.cpp re-lays most quantized weights out for the CPU's kernels (its
        # "CPU_REPACK" buffer) and, from a mapped file, keeps the mapped originals resident too: for the
        # 1.5B, 1.06 GB mapped + 0.60 GB repacked. Read into memory, each weight is held once (peak
        # RSS 2.12 -> 1.53 GB after load and a 1,200-token prompt), with the same logits bit for bit
        # and the same speed (benchmarks/RESULTS.md section 20).
        llm = llama_cpp.Llama(model_path=str(file), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                              n_gpu_layers=n_gpu_layers, logits_all=False, use_mmap=False, verbose=False)
    except ValueError as exc:
        check_gguf_file(file)  # a damaged file is named as such
        # The file is well-formed: llama.cpp does not know its architecture or a part of it.
        arch = gguf_architecture(file) or "unknown"
        raise ArchitectureUnsupported(
            f"llama.cpp cannot load {file} (architecture {arch!r}): {exc}") from None
    return LlamaCppModel(llm=llm, name=name or file.stem, path=str(file), n_threads=n_threads)


def load_llama_model(path: "str | os.PathLike[str] | None" = None, *, n_ctx: int = 8192,
                     n_threads: Optional[int] = None, n_gpu_layers: int = 0, float16: bool = False) -> LlamaCppModel:
    """Load (once per process and option set) a GGUF file with llama.cpp; ``None`` = the packaged SmolLM2.

    ``n_ctx`` is capped at the model's training context. ``float16`` loads the file's float16
    re-encoding (:func:`f16_copy`, written on first use) instead of the file; the model keeps the
    file's name. A missing, truncated or corrupt file is a :class:`LocalModelError`; a well-formed file
    llama.cpp cannot run is :class:`ArchitectureUnsupported`.
    """
    if path is None:
        folder, name = default_model_source()
        file = folder / name
    else:
        file = Path(path).expanduser()
    if file.suffix.lower() != ".gguf":
        raise ValueError(f"{file}: the llama_cpp backend runs .gguf files only")
    if n_ctx < 64:
        raise ValueError("n_ctx must be at least 64")
    threads = n_threads if n_threads else default_threads()
    if float16:
        check_gguf_magic(file)  # a damaged file is named before llama.cpp is asked to re-encode it
        return _load(str(f16_copy(file)), int(n_ctx), int(threads), int(n_gpu_layers), name=file.stem)
    return _load(str(file.resolve()), int(n_ctx), int(threads), int(n_gpu_layers))
