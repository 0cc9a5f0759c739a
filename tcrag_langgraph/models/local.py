"""A LangChain chat model over a local transformers causal LM (:class:`LocalChatModel`), and the
small helpers both local backends and the run kernel use (stops, chat turns, a model's stable id).
Both backends call tools the same way (``bind_tools``; :mod:`.chat_turns` renders the tools and reads
the calls back).

Where the weights come from and how they load (the packaged GGUF, conversion, the cache, devices
and dtypes) is :mod:`.weights`'s; which model a user's spec means, and which backend runs a local
one, is :mod:`.resolve`'s (:func:`~tcrag_langgraph.models.resolve.resolve_chat_model`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.runnables import Runnable
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from ..tools.layer.outcome import content_text
from .chat_turns import (chat_turns, message_role, parse_reply, reply_prefix, template_inputs, tool_choice_of,
                         tool_schemas)
from .kv_cache import CacheStats, PromptKVPool, cache_keyword
from .run_control import RunCancelled, current_run, hold_model
from .weights import LocalModel, device_syntax, load_local_model, validate_device, validate_dtype

__all__ = ["LocalChatModel", "chat_model_id", "takes_generation_settings", "cut_at_stop", "chat_turns",
           "message_role"]


class LocalChatModel(BaseChatModel):
    """A LangChain chat model over a local transformers causal LM (default: packaged SmolLM2).

    Unlike ``ChatHuggingFace`` over a pipeline, this honours ``stop`` sequences, returns only the
    continuation, and runs under ``ainvoke`` (in a worker thread, off the event loop).

    With ``kv_cache=True`` (default) the key/value states of earlier prompts are kept
    (:class:`~tcrag_langgraph.models.kv_cache.PromptKVPool`): each call prefills only the tokens after the
    longest common token prefix with a cached prompt. The TC-RAG prompt renders the stack bottom
    first before a fixed suffix, so a push costs the new frame and a pop costs nothing but a crop.
    ``usage_metadata["input_token_details"]["cache_read"]`` reports the reused tokens.

    Example:
        >>> chat = LocalChatModel(max_new_tokens=16, temperature=0.0)  # doctest: +SKIP
        >>> chat.invoke("Say hi").content  # doctest: +SKIP
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model_path: Optional[str] = Field(default=None, description="transformers folder or .gguf file; None = packaged SmolLM2")
    device: str = Field(default="cpu", description="torch device: cpu, cuda, cuda:N, mps (CUDA checks: tests/test_gpu.py)")
    dtype: str = Field(default="float32", description="float32, bfloat16 or float16")
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
    busy_timeout_s: Optional[float] = Field(
        default=None, gt=0, description="Longest wait for the model while another call holds it; then the call "
        "raises ModelBusy naming the wait (None: wait as long as it takes)")

    _lm: Optional[LocalModel] = PrivateAttr(default=None)
    _calls: int = PrivateAttr(default=0)
    _pool: Optional[PromptKVPool] = PrivateAttr(default=None)
    _pool_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        return validate_dtype(value)

    @field_validator("device")
    @classmethod
    def _device_syntax(cls, value: str) -> str:
        return device_syntax(value)  # no torch here: LlamaCppChatModel shares this field

    @property
    def _llm_type(self) -> str:
        return "tcrag-local-hf"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "device": self.device, "dtype": self.dtype,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature}

    def _get_ls_params(self, stop: Optional[list[str]] = None, **kwargs: Any) -> Any:
        """LangSmith tracing metadata: which model, with which budget, temperature and stops."""
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(ls_provider="tcrag_langgraph", ls_model_name=str(kwargs.get("model") or self.model_id),
                      ls_model_type="chat",
                      ls_temperature=float(kwargs.get("temperature", self.temperature)),
                      ls_max_tokens=int(kwargs.get("max_new_tokens", self.max_new_tokens)))
        if stop or self.stop:
            params["ls_stop"] = list(stop or self.stop or [])
        return params

    def check_device(self) -> None:
        """LocalModelError unless this machine's torch has ``device`` (nothing is loaded)."""
        validate_device(self.device)

    @property
    def local_model(self) -> LocalModel:
        """The loaded weights (loaded on first use, shared by every chat model with the same options)."""
        if self._lm is None:
            self._lm = load_local_model(self.model_path, device=self.device, dtype=self.dtype)
        return self._lm

    @property
    def model_id(self) -> str:
        """A name for this model that does not need loading it (used to find its calibration)."""
        if self.model_path is None:
            return "SmolLM2-135M-Instruct"
        return Path(self.model_path).expanduser().name.removesuffix(".gguf").removesuffix(".GGUF")

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

    # ----- tools -----
    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable | Any], *, tool_choice: Any = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """This model with ``tools`` it may call: the prompt shows them through the model's chat template
        (or, for a template without a tools section, in the system turn) and each ``<tool_call>`` block
        of the reply comes back in ``tool_calls`` with an id (:mod:`.chat_turns`). ``tool_choice``:
        None / ``"auto"`` (the model decides), ``"none"``, ``"any"`` / ``"required"`` or a tool's name (the
        reply is started as such a call; the arguments are the model's). ``kwargs`` are bound too (e.g.
        ``max_new_tokens``). An unknown ``tool_choice`` is a ValueError.

        Example:
            >>> def lookup(query: str) -> str:
            ...     \"\"\"Search the documents.\"\"\"
            ...     return query
            >>> bound = LocalChatModel().bind_tools([lookup], tool_choice="lookup")
            >>> bound.kwargs["tools"][0]["function"]["name"], bound.kwargs["tool_choice"]
            ('lookup', 'lookup')
        """
        schemas = tool_schemas(tools)
        return self.bind(tools=schemas, tool_choice=tool_choice_of(tool_choice, schemas), **kwargs)

    def _reply_message(self, text: str, kwargs: dict[str, Any], **fields: Any) -> AIMessage:
        """The reply as an AIMessage: with tools asked for, its calls read into ``tool_calls``."""
        tools, prefix = tools_asked(kwargs)
        if tools is None:
            return AIMessage(content=text, **fields)
        content, calls, invalid = parse_reply(prefix + text, [t["function"]["name"] for t in tools])
        return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid, **fields)

    def _prompt_ids(self, messages: list[BaseMessage], tools: Optional[list[dict[str, Any]]] = None,
                    prefix: str = ""):
        tok = self.local_model.tokenizer
        if tools is None and not prefix:
            ids = tok.apply_chat_template(chat_turns(messages), add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            return ids["input_ids"]
        turns, shown = template_inputs(messages, tools, tok.chat_template)
        text = tok.apply_chat_template(turns, tools=shown, add_generation_prompt=True, tokenize=False) + prefix
        # as apply_chat_template tokenizes its own rendering: the template holds the special tokens
        return tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        text, usage, finish = self._complete(messages, stop=stop, **kwargs)
        msg = self._reply_message(text, kwargs, usage_metadata=usage,
                                  response_metadata={"model_name": self.local_model.name, "finish_reason": finish})
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: Optional[list[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # One chunk: generation is short per action and stop trimming needs the whole text.
        reply = self._generate(messages, stop=stop, **kwargs).generations[0].message
        chunk = ChatGenerationChunk(message=as_chunk(reply))
        if run_manager:
            run_manager.on_llm_new_token(content_text(reply.content), chunk=chunk)
        yield chunk

    def _complete(self, messages: list[BaseMessage], *, stop: Optional[list[str]], **kwargs: Any):
        import torch

        lm = self.local_model
        stops = [s for s in (stop or self.stop or []) if s]
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        temperature = float(kwargs.get("temperature", self.temperature))
        input_ids = self._prompt_ids(messages, *tools_asked(kwargs)).to(lm.device)
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new,
            pad_token_id=lm.tokenizer.pad_token_id,
            attention_mask=torch.ones_like(input_ids),
        )
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature, top_p=self.top_p)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        run = current_run()
        criteria = ([*_generated_text_stops(lm.tokenizer, stops, int(input_ids.shape[1]))] if stops else []) + (
            [_cancelled_stops(run)] if run is not None else [])
        if criteria:
            from transformers import StoppingCriteriaList

            gen_kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
        with hold_model(lm.lock, timeout_s=self.busy_timeout_s, name=lm.name), torch.no_grad():
            if self.seed is not None:
                # A different but reproducible seed per call, so a re-prompt is not a replay.
                torch.manual_seed(self.seed + self._calls)
            self._calls += 1
            lease = self.kv_pool.acquire(input_ids[0].tolist()) if self.kv_cache else None
            held = None
            try:
                if lease is not None:
                    # generate() runs the model over input_ids[lease.reused:] only, then decodes.
                    gen_kwargs[cache_keyword(lm.model)] = lease.cache
                out = lm.model.generate(input_ids, **gen_kwargs)
                # Keep the generated tokens too: a format re-prompt replays this output as an
                # assistant turn right after this prompt, so they are usually a prefix match.
                held = out[0].tolist()
            finally:
                if lease is not None:
                    self.kv_pool.release(lease, held)
        if run is not None and run.cancelled:  # stopped early by the criterion below: no reply to hand on
            raise RunCancelled(run.reason or "the run was cancelled")
        new_ids = out[0, input_ids.shape[1]:]
        full = lm.tokenizer.decode(new_ids, skip_special_tokens=True)
        text = cut_at_stop(full, stops)
        # OpenAI's finish_reason: "length" when the budget, not an end token or a stop sequence, ended it
        ended = new_ids.shape[0] > 0 and int(new_ids[-1]) in _end_ids(lm.model)
        finish = "length" if new_ids.shape[0] >= max_new and not ended and text == full else "stop"
        usage: dict[str, Any] = {
            "input_tokens": int(input_ids.shape[1]),
            "output_tokens": int(new_ids.shape[0]),
            "total_tokens": int(input_ids.shape[1] + new_ids.shape[0]),
        }
        if lease is not None:
            usage["input_token_details"] = {"cache_read": int(lease.reused)}
        return text.strip(), usage, finish


def _generated_text_stops(tokenizer: Any, stops: list[str], prompt_len: int):
    """Stopping criteria that look at the GENERATED text only.

    transformers' ``StopStringCriteria`` matches the tail of the whole sequence, prompt included: a
    stop such as ``"\nThought:"`` then fires on the first token when the prompt ends with a newline
    and the reply starts with ``Thought:``. Decoding the few new tokens each step costs far less than
    a forward pass, and needs no scan of the vocabulary.
    """
    from transformers import StoppingCriteria, StoppingCriteriaList

    longest = max(len(s) for s in stops)

    class _Stops(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):  # noqa: ANN001 - transformers' signature
            import torch

            done = []
            for row in input_ids:
                # the tail of the reply is enough: a stop string spans at most `longest` characters
                tail = tokenizer.decode(row[prompt_len:][-(longest + 8):], skip_special_tokens=True)
                done.append(any(stop in tail for stop in stops))
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_Stops()])


def _cancelled_stops(run: Any):
    """A stopping criterion that ends generation at the next token once ``run`` (a
    :class:`~.run_control.RunControl`) is cancelled: a cancelled run leaves the model within a token."""
    from transformers import StoppingCriteria

    class _Cancelled(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):  # noqa: ANN001 - transformers' signature
            import torch

            return torch.full((input_ids.shape[0],), run.cancelled, dtype=torch.bool, device=input_ids.device)

    return _Cancelled()


def tools_asked(kwargs: dict[str, Any]) -> tuple[Optional[list[dict[str, Any]]], str]:
    """What a call's keywords (``bind_tools``'s) ask of a local model: the tool schemas to show (None:
    no tools, also with ``tool_choice="none"``) and the text the reply starts with (:func:`reply_prefix`)."""
    tools, choice = kwargs.get("tools") or None, kwargs.get("tool_choice")
    if tools is None or choice == "none":
        return None, ""
    return list(tools), reply_prefix(choice)


def as_chunk(message: AIMessage) -> AIMessageChunk:
    """A whole reply as one stream chunk (content, tool calls, usage and metadata)."""
    return AIMessageChunk(content=message.content, tool_calls=message.tool_calls,
                          invalid_tool_calls=message.invalid_tool_calls, usage_metadata=message.usage_metadata,
                          response_metadata=message.response_metadata)


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any of ``stops`` (what a server applying them returns)."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def takes_generation_settings(model: Any) -> bool:
    """Whether ``model`` takes ``max_new_tokens`` and ``temperature`` per call (this package's local
    models: transformers and llama.cpp, ``LlamaCppChatModel`` being a ``LocalChatModel``); a provider
    model keeps the settings it was built with."""
    return isinstance(model, LocalChatModel)


def chat_model_id(model: Any) -> str:
    """A stable name for a chat model, without loading it: the key its calibration is stored under.

    LocalChatModel: the packaged model's name, or the folder / GGUF file name; a served model: its
    ``model_name`` / ``model`` / ``model_id`` attribute; ``None``: the packaged default.

    Example:
        >>> chat_model_id(None)
        'SmolLM2-135M-Instruct'
    """
    if model is None:
        return "SmolLM2-135M-Instruct"
    if isinstance(model, LocalChatModel):
        return model.model_id
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value.strip():
            return value.strip()
    llm = getattr(model, "llm", None)  # ChatHuggingFace -> HuggingFacePipeline
    if llm is not None and llm is not model:
        return chat_model_id(llm)
    raise ValueError(f"cannot tell which model {type(model).__name__} is; give the model id explicitly")


def _end_ids(model: Any) -> set[int]:
    """The token ids that end a reply of a transformers model (its generation config's, else its config's EOS)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids.update([value] if isinstance(value, int) else [int(v) for v in value])
    return ids
