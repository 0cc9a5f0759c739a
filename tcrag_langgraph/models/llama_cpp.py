"""Native quantized GGUF inference with llama.cpp (llama-cpp-python): chat model, exact scorer, drafts.

transformers runs a GGUF file by de-quantising it to float32 (a 0.5B model becomes 2.5 GB, a 1.5B
7.1 GB), and CPU decoding is bound by the bytes of weights read per token. llama.cpp runs the
quantized weights as they are (491 MB / 1.1 GB for the Qwen2.5-Coder GGUFs): 9-20x faster decoding
here (benchmarks/RESULTS.md, "local backend"). This module gives the same three things as the
transformers path, over the same file:

* :class:`LlamaCppChatModel`: a LangChain chat model with the per-call ``max_new_tokens``,
  ``temperature`` and ``stop`` of :class:`~tcrag_langgraph.models.local.LocalChatModel` (it is a
  subclass, so every place that passes budgets to the local model passes them here too). The prompt
  is the model's own chat template rendered by transformers' renderer (the function
  ``apply_chat_template`` uses), with the special-token strings from the GGUF, then tokenized by
  llama.cpp with special tokens parsed: the token ids of the transformers path.
* Stack-aligned prefix reuse: llama.cpp keeps the evaluated tokens of the last prompt (``n_past``);
  a new prompt keeps the longest common token prefix and cuts the rest with llama.cpp's own
  ``llama_memory_seq_rm``, so a push prefills only the new frame and a pop (Backtrack, Summary)
  costs a cut (``usage_metadata["input_token_details"]["cache_read"]`` counts the reused tokens).
* :class:`~tcrag_langgraph.monitor.llama_cpp.LlamaCppScorer` (in the monitor): cppl (eq. 2) and uct (eq. 3) from a teacher-forced pass over llama.cpp's
  own logits (a second context on the same loaded weights, logits requested for exactly the
  positions that predict the scored tokens), never from the ``echo``/``logprobs`` completion API,
  whose prompt log-probs are wrong (docs/models.md).
* Streaming: ``_stream`` yields the reply as it is decoded (stop sequences held back until they can
  no longer match), so ``stream_mode="messages"`` shows tokens.
* Speculative decoding (``draft_model_path=``, greedy only; :mod:`.speculative`): a small model with
  the same tokenizer proposes ``n_draft`` tokens, the model verifies them in one batch and keeps the
  longest prefix equal to its own greedy choices, so the output is its own greedy output.

Around it: :mod:`.gguf_files` (file checks, the float16 copy), :mod:`.llama_cpp_native` (threads,
batches with logits at chosen positions) and :mod:`.llama_cpp_states` (saved branches and prefixes).

A GGUF whose architecture llama.cpp cannot load falls back to transformers (one line on stderr); a
truncated or corrupt file is a :class:`~tcrag_langgraph.models.weights.LocalModelError` naming it.
"""

from __future__ import annotations

import math
import queue
import random
import sys
import threading
from typing import Any, ClassVar, Iterator, Optional, Sequence

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import Field, PrivateAttr, field_validator

from .kv_cache import CacheStats
from .llama_cpp_batch import BatchReply, greedy_batch
from .llama_cpp_model import ArchitectureUnsupported, LlamaCppModel, load_llama_model
from .llama_cpp_grammar import GreedyGrammar, checked_grammar
from .llama_cpp_native import logits_row, require_gpu_offload, return_freed_heap
from .llama_cpp_states import PrefixFiles, reusable_prefix
from .local import LocalChatModel, as_chunk, tools_asked
from .run_control import RunCancelled, RunControl, current_run, hold_model
from .speculative import SpeculativeStats, speculative_greedy
from .weights import LocalModelError, cache_dir

__all__ = ["LlamaCppChatModel", "WEIGHTS", "BACKENDS"]

#: What :class:`LlamaCppChatModel` generates with: ``auto`` (``float16`` for the packaged model,
#: ``file`` otherwise), ``file`` (the GGUF as it is) or ``float16`` (its float16 re-encoding,
#: :func:`f16_copy`: the same weight values, the very weights the exact state monitor scores with).
WEIGHTS = ("auto", "file", "float16")

#: llama.cpp's "pick a random seed" value (LLAMA_DEFAULT_SEED); a seed below it is used as it is.
_LLAMA_RANDOM_SEED = 0xFFFFFFFF

#: Backends of a local model: ``auto`` (llama.cpp for a .gguf on the CPU, transformers otherwise).
BACKENDS = ("auto", "llama_cpp", "transformers")

def _device_layers(device: Optional[str], n_gpu_layers: Optional[int]) -> int:
    """Layers to offload: ``n_gpu_layers`` if given, else all (-1) for a GPU device, none for the CPU."""
    if n_gpu_layers is not None:
        return int(n_gpu_layers)
    return 0 if device is None or device == "cpu" else -1  # the field's validator has normalised it


# ----- streaming text with stop sequences -----
def _held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a stop sequence."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                hold = max(hold, k)
                break
    return hold


def _first_stop(text: str, stops: list[str]) -> int:
    cut = -1
    for stop in stops:
        i = text.find(stop)
        if i != -1 and (cut == -1 or i < cut):
            cut = i
    return cut


class LlamaCppChatModel(LocalChatModel):
    """A LangChain chat model over a GGUF file run by llama.cpp (a user's file as it is; ``weights``).

    Takes the per-call options of :class:`LocalChatModel` (``max_new_tokens``, ``temperature``,
    ``stop``) and its fields ``max_new_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop`` and
    ``kv_cache`` (reuse the cached prompt prefix; ``False`` prefills every prompt from scratch).
    ``seed=None`` samples with a seed drawn from Python's ``random`` per reply (seed it, as ``tcrag
    eval`` does per question, and the sampled replies repeat). ``dtype`` does not apply (the file's own
    quantization runs, or its float16 copy: ``weights``).
    ``model_path=None`` is the packaged SmolLM2 GGUF.

    Example:
        >>> chat = LlamaCppChatModel(max_new_tokens=16, temperature=0.0)  # doctest: +SKIP
        >>> chat.invoke("Say hi").content  # doctest: +SKIP
    """

    n_ctx: int = Field(default=8192, ge=64, description="Context length (capped at the model's training context)")
    n_threads: Optional[int] = Field(default=None, ge=1, description="CPU threads; None = the cores this process may use")
    n_gpu_layers: Optional[int] = Field(
        default=None, description="Layers offloaded to a GPU (-1 = all); None = all for a GPU device, none for 'cpu'. "
        "Needs a llama-cpp-python built with GPU support (tests/test_gpu_llama_cpp.py)")
    weights: str = Field(
        default="auto", description="'file': generate with the GGUF's own (quantized) weights; 'float16': with its "
        "float16 re-encoding (the weights the exact monitor scores with, loaded once for both); 'auto': float16 for "
        "the packaged SmolLM2 (1.7x faster prefill than its Q4_1 file on CPU, the same decode; benchmarks/RESULTS.md section 13), "
        "the file for any other GGUF (a bigger model's float16 copy is ~3x its quantized bytes to read per token)")
    draft_model_path: Optional[str] = Field(
        default=None, description="A smaller GGUF with the same tokenizer for speculative decoding (greedy calls)")
    n_draft: int = Field(default=4, ge=1, le=32, description="Tokens the draft model proposes per verification pass")
    fallback_announce: bool = Field(default=True, description="Print the one line saying a GGUF fell back to transformers")
    prompt_files: bool = Field(
        default=True, description="Keep the key/value state of the prompt's fixed prefix (system prompt and "
        "demonstrations) in $TCRAG_CACHE_DIR/llama-states, so a new process does not prefill it again "
        "(with kv_cache only)")

    #: asked with ``logprobs=True`` (and ``top_logprobs=k``), a reply carries its tokens' log-probs in
    #: ``response_metadata["logprobs"]`` in OpenAI's shape (monitor.generation reads them)
    returns_logprobs: ClassVar[bool] = True
    #: asked with ``grammar=GBNF`` per call, the reply keeps to that grammar (llama.cpp's grammar sampler;
    #: :mod:`.constrained`). After a fallback to transformers the grammar is not applied (parse-and-repair)
    takes_grammar: ClassVar[bool] = True
    #: :meth:`greedy_replies` decodes several conversations together (:mod:`.llama_cpp_batch`)
    decodes_together: ClassVar[bool] = True

    _llama: Optional[LlamaCppModel] = PrivateAttr(default=None)
    _draft: Optional[LlamaCppModel] = PrivateAttr(default=None)
    _fallback: Optional[LocalChatModel] = PrivateAttr(default=None)
    _fallback_checked: bool = PrivateAttr(default=False)
    _spec_stats: SpeculativeStats = PrivateAttr(default_factory=SpeculativeStats)
    _load_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @field_validator("weights")
    @classmethod
    def _known_weights(cls, value: str) -> str:
        if value not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, not {value!r}")
        return value

    @property
    def generates_float16(self) -> bool:
        """Whether generation runs on the float16 re-encoding (``weights``, ``auto`` resolved)."""
        return self.weights == "float16" or (self.weights == "auto" and self.model_path is None)

    @property
    def _llm_type(self) -> str:
        return "tcrag-llama-cpp"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "backend": "llama_cpp", "n_ctx": self.n_ctx,
                "weights": "float16" if self.generates_float16 else "file",
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "draft_model_path": self.draft_model_path}

    # ----- loading -----
    def _ensure_loaded(self) -> None:
        if self._fallback_checked:
            return
        with self._load_lock:
            if self._fallback_checked:
                return
            layers = _device_layers(self.device, self.n_gpu_layers)
            try:
                self._llama = load_llama_model(self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads,
                                               n_gpu_layers=layers, float16=self.generates_float16)
            except ArchitectureUnsupported as exc:
                if self.fallback_announce:
                    print(f"tcrag: {exc}; running it with transformers instead", file=sys.stderr, flush=True)
                self._fallback = LocalChatModel(
                    model_path=self.model_path, device=self.device, dtype=self.dtype, max_new_tokens=self.max_new_tokens,
                    temperature=self.temperature, top_p=self.top_p, seed=self.seed, stop=self.stop,
                    kv_cache=self.kv_cache, kv_cache_slots=self.kv_cache_slots)
            if self._fallback is None and self.draft_model_path is not None:
                draft = load_llama_model(self.draft_model_path, n_ctx=self.n_ctx, n_threads=self.n_threads,
                                         n_gpu_layers=layers)
                if draft.n_vocab != self._llama.n_vocab:
                    raise LocalModelError(
                        f"draft model {self.draft_model_path} has {draft.n_vocab} tokens, the model {self._llama.n_vocab}: "
                        "speculative decoding needs one tokenizer")
                self._draft = draft
            self._fallback_checked = True

    @property
    def backend(self) -> str:
        """``"llama_cpp"``, or ``"transformers"`` after a fallback (loads the model)."""
        self._ensure_loaded()
        return "transformers" if self._fallback is not None else "llama_cpp"

    def check_device(self) -> None:
        """LocalModelError unless this llama-cpp-python build can offload what ``device`` /
        ``n_gpu_layers`` ask for; torch is never asked (nothing is loaded)."""
        if _device_layers(self.device, self.n_gpu_layers) != 0:
            require_gpu_offload()

    @property
    def fallback(self) -> Optional[LocalChatModel]:
        """The transformers chat model this one fell back to, if llama.cpp could not load the file."""
        self._ensure_loaded()
        return self._fallback

    @property
    def local_model(self):  # type: ignore[override]
        """The loaded model: a :class:`LlamaCppModel` (or the transformers model after a fallback)."""
        self._ensure_loaded()
        if self._fallback is not None:
            return self._fallback.local_model
        return self._llama

    @property
    def llama_model(self) -> LlamaCppModel:
        """The llama.cpp model (LocalModelError after a fallback to transformers)."""
        self._ensure_loaded()
        if self._llama is None:
            raise LocalModelError(f"{self.model_path} runs with transformers (llama.cpp could not load it)")
        return self._llama

    @property
    def kv_pool(self):  # type: ignore[override]
        raise AttributeError("the llama_cpp backend keeps its prompt cache inside llama.cpp; see kv_cache_stats")

    @property
    def kv_cache_stats(self) -> dict[str, int]:
        if self._fallback is not None:
            return self._fallback.kv_cache_stats
        return (self._llama.stats if self._llama is not None else CacheStats()).as_dict()

    @property
    def speculative_stats(self) -> SpeculativeStats:
        return self._spec_stats

    def greedy_replies(self, conversations: Sequence[Sequence[BaseMessage]], *, max_new_tokens: Optional[int] = None,
                       grammar: Optional[str] = None, sequences: int = 16) -> list[BatchReply]:
        """Greedy replies to ``conversations`` (each a list of messages), decoded ``sequences`` at a time
        (:mod:`.llama_cpp_batch`: the gain, and why a reply may differ from :meth:`invoke`'s at a near
        tie); the replies in the conversations' order. ``grammar`` (GBNF text): every reply keeps to
        it. No stop sequences, no tools, no callbacks: a plain batch of completions for a caller that
        extracts from many texts at once. A cancelled run (:mod:`.run_control`) stops it within a step
        (:class:`RunCancelled`). :class:`LocalModelError` after a fallback to transformers.

        Example:
            >>> chat = LlamaCppChatModel(temperature=0.0)  # doctest: +SKIP
            >>> [r.text for r in chat.greedy_replies([[HumanMessage("Say hi")], [HumanMessage("Say bye")]])]  # doctest: +SKIP
        """
        self._ensure_loaded()
        if self._fallback is not None:
            raise LocalModelError(f"{self.model_path} runs with transformers, which decodes one conversation at a time")
        lm = self._llama
        max_new = int(self.max_new_tokens if max_new_tokens is None else max_new_tokens)
        if grammar:
            checked_grammar(lm, grammar)  # a grammar llama.cpp cannot parse is a GrammarError, not a crash
        prompts = [lm.prompt_ids(list(messages)) for messages in conversations]
        if not prompts:
            return []
        with hold_model(lm.lock, timeout_s=self.busy_timeout_s, name=lm.name):
            return greedy_batch(lm, prompts, max_new_tokens=max_new, grammar=grammar, sequences=sequences,
                                run=current_run())

    # ----- LangChain interface -----
    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                  run_manager: Optional[CallbackManagerForLLMRun] = None, **kwargs: Any) -> ChatResult:
        self._ensure_loaded()
        if self._fallback is not None:
            return self._fallback._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        pieces = []
        usage: dict[str, Any] = {}
        tokens: Optional[list[dict[str, Any]]] = [] if kwargs.get("logprobs") else None
        outcome: dict[str, str] = {}
        for piece, done in self._pieces(messages, stop=stop, logprob_tokens=tokens, run=current_run(), outcome=outcome,
                                        **kwargs):
            if done is not None:
                usage = done
            else:
                pieces.append(piece)
        msg = self._reply_message("".join(pieces), kwargs, usage_metadata=usage,
                                  response_metadata=self._reply_metadata(tokens, outcome))
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _stream(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                run_manager: Optional[CallbackManagerForLLMRun] = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        self._ensure_loaded()
        if self._fallback is not None:
            yield from self._fallback._stream(messages, stop=stop, run_manager=run_manager, **kwargs)
            return
        if tools_asked(kwargs)[0] is not None:
            # with tools, one chunk: a call is read from the whole reply (its text is not the answer's)
            reply = self._generate(messages, stop=stop, **kwargs).generations[0].message
            chunk = ChatGenerationChunk(message=as_chunk(reply))
            if run_manager:
                run_manager.on_llm_new_token(str(reply.content), chunk=chunk)
            yield chunk
            return
        tokens: Optional[list[dict[str, Any]]] = [] if kwargs.get("logprobs") else None
        outcome: dict[str, str] = {}
        for piece, done in self._pieces_apart(messages, stop=stop, logprob_tokens=tokens, outcome=outcome, **kwargs):
            if done is not None:
                chunk = ChatGenerationChunk(message=AIMessageChunk(
                    content="", usage_metadata=done, response_metadata=self._reply_metadata(tokens, outcome)))
            else:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                if run_manager:
                    run_manager.on_llm_new_token(piece, chunk=chunk)
            yield chunk

    def _reply_metadata(self, tokens: Optional[list[dict[str, Any]]], outcome: dict[str, str]) -> dict[str, Any]:
        meta: dict[str, Any] = {"model_name": self._llama.name, "backend": "llama_cpp", **outcome}
        if tokens is not None:
            meta["logprobs"] = {"content": tokens}
        return meta

    # ----- generation -----
    def _pieces_apart(self, messages: list[BaseMessage], *, stop: Optional[list[str]], **kwargs: Any):
        """:meth:`_pieces` for a stream: generated in a worker thread that holds the model's lock, and
        handed over through a queue, so the lock is never held across a yield to the consumer. A
        consumer that stalls or walks away does not hold the model: the worker finishes the reply
        (bounded by max_new_tokens) or, once the stream is closed, stops at the next token; the lock is
        taken and released in that one thread, whatever thread or event loop reads the stream."""
        handed: queue.SimpleQueue = queue.SimpleQueue()
        cancel = threading.Event()
        run = current_run()  # read here: the worker thread does not inherit the caller's context

        def work() -> None:
            try:
                for item in self._pieces(messages, stop=stop, cancel=cancel, run=run, **kwargs):
                    handed.put((True, item))
            except BaseException as exc:  # re-raised in the consumer's thread
                handed.put((False, exc))
            else:
                handed.put((False, None))

        threading.Thread(target=work, name="llama-cpp-reply", daemon=True).start()
        try:
            while True:
                ok, item = handed.get()
                if not ok:
                    if item is not None:
                        raise item
                    return
                yield item
        finally:
            cancel.set()

    def _pieces(self, messages: list[BaseMessage], *, stop: Optional[list[str]],
                logprob_tokens: Optional[list[dict[str, Any]]] = None, cancel: Optional[threading.Event] = None,
                run: Optional[RunControl] = None, outcome: Optional[dict[str, str]] = None, **kwargs: Any):
        """Yield ``(text, None)`` pieces of the reply as they are decoded, then ``("", usage)``.

        The pieces join to exactly what ``invoke`` returns: the reply cut at the first stop sequence
        and stripped (text that may still become a stop sequence, and trailing whitespace, are held
        back until they cannot). ``logprob_tokens``, when a list, receives each generated token up to
        the stop (OpenAI's shape: ``token``, ``logprob``, ``top_logprobs``), the log-probs of the
        model's own distribution (before temperature) from the logits that chose it. ``outcome``, when a
        dict, receives ``finish_reason`` as OpenAI's servers say it: ``"length"`` when the reply ran out of
        ``max_new_tokens``, else ``"stop"`` (an end-of-generation token or a stop sequence).

        ``grammar`` (GBNF text, a keyword argument): the reply keeps to it; llama.cpp's grammar sampler
        masks the tokens it does not admit before choosing. The logits read for ``logprob_tokens`` are
        the context's, taken before any sampler (the grammar included) touches them: a token the grammar
        forced carries the probability the model itself gave it (tests/test_constrained.py).

        ``cancel`` (the consumer closed the stream) ends the reply at the next token; a cancelled ``run``
        (:class:`~.run_control.RunControl`) ends it there too and raises :class:`~.run_control.RunCancelled`:
        either way the model is released within a token."""
        lm = self._llama
        grammar = checked_grammar(lm, kwargs["grammar"]) if kwargs.get("grammar") else None
        stops = [s for s in (stop or self.stop or []) if s]
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        temperature = float(kwargs.get("temperature", self.temperature))
        if max_new < 1:
            raise ValueError("max_new_tokens must be at least 1")
        tools, reply_prefix = tools_asked(kwargs)
        prompt = lm.prompt_ids(messages, tools=tools, reply_prefix=reply_prefix)
        if len(prompt) + max_new > lm.n_ctx:
            raise ValueError(
                f"prompt of {len(prompt)} tokens + {max_new} new tokens exceeds the context of {lm.n_ctx} tokens "
                "(LlamaCppChatModel(n_ctx=...) sets it, up to the model's training context)")
        emitted = ""
        new_ids: list[int] = []
        if outcome is not None:
            outcome["finish_reason"] = "stop"
        with hold_model(lm.lock, timeout_s=self.busy_timeout_s, name=lm.name):
            llm = lm.llm
            if self.seed is not None:
                llm.set_seed(self.seed + self._calls)
            elif temperature > 0:  # (a greedy reply leaves Python's RNG as it was)
                # llama.cpp's default seed is a fresh random one per reply, so a sampled reply could not be
                # had again; drawn from Python's RNG instead (as the transformers path draws from torch's),
                # which `tcrag eval` seeds per question: a run, and a resumed run, give the same rows
                llm.set_seed(random.randrange(_LLAMA_RANDOM_SEED))
            self._calls += 1
            if not self.kv_cache:
                llm.reset()
                lm.exact_tokens = 0
            if llm.n_tokens > lm.exact_tokens:  # cut what speculative verification left in batched form
                llm._ctx.kv_cache_seq_rm(-1, lm.exact_tokens, -1)
                llm.n_tokens = lm.exact_tokens
            computed = 0  # prompt tokens prefilled here, before generation
            if self.kv_cache:
                cold = llm.n_tokens == 0
                lm.branches.before_prompt(llm, prompt)
                if cold and self.prompt_files:  # a new process: the fixed prefix from its file
                    before = int(llm.n_tokens)
                    if _prefix_files().ensure(llm, lm.path, lm.fixed_prefix(messages, prompt, tools=tools)) == "saved":
                        computed = int(llm.n_tokens) - before
                lm.exact_tokens = int(llm.n_tokens)
            reused = reusable_prefix(llm, prompt) - computed
            lm.stats.calls += 1
            lm.stats.prompt_tokens += len(prompt)
            lm.stats.reused_tokens += reused
            # the draft path verifies in batches and keeps no per-token logits row: log-probs need the plain
            # one; it takes its own argmax, which no grammar masks: a constrained call decodes plainly too
            use_draft = self._draft is not None and temperature == 0 and logprob_tokens is None and grammar is None
            top_k = max(0, min(int(kwargs.get("top_logprobs") or 0), 20))
            spelled = ""  # the reply's text so far, so each token's piece is the text it added
            tokens = (self._speculative_tokens(prompt) if use_draft
                      else self._plain_tokens(prompt, temperature, grammar))
            try:
                for token in tokens:
                    if run is not None and run.cancelled:
                        raise RunCancelled(run.reason or "the run was cancelled")
                    if lm.is_eog(token) or (cancel is not None and cancel.is_set()):
                        break
                    logits = logits_row(llm._ctx, -1, lm.n_vocab) if logprob_tokens is not None else None
                    new_ids.append(token)
                    text = lm.detokenize(new_ids)
                    if logits is not None and _first_stop(spelled, stops) == -1:
                        logprob_tokens.append(_token_logprobs(lm, logits, token, text[len(spelled):], top_k))
                    spelled = text
                    cut = _first_stop(text, stops)
                    final = cut != -1 or len(new_ids) >= max_new
                    if outcome is not None:
                        outcome["finish_reason"] = "length" if cut == -1 and len(new_ids) >= max_new else "stop"
                    visible = text[:cut] if cut != -1 else text
                    if not final:
                        visible = visible[: len(visible) - _held_back(visible, stops)]
                    visible = visible.lstrip().rstrip() if not final else visible.strip()
                    if visible.startswith(emitted) and len(visible) > len(emitted):
                        yield visible[len(emitted):], None
                        emitted = visible
                    if final:
                        break
            finally:
                close = getattr(tokens, "close", None)
                if close is not None:
                    close()
                if not use_draft:
                    lm.exact_tokens = int(llm.n_tokens)
                if grammar is not None:
                    return_freed_heap()  # the grammar sampler's freed blocks (why: llama_cpp_native)
            # The reply may end without a final check (end-of-generation token): emit what is held back.
            text = lm.detokenize(new_ids)
            cut = _first_stop(text, stops)
            final_text = (text[:cut] if cut != -1 else text).strip()
            if final_text.startswith(emitted) and len(final_text) > len(emitted):
                yield final_text[len(emitted):], None
        usage = {"input_tokens": len(prompt), "output_tokens": len(new_ids), "total_tokens": len(prompt) + len(new_ids),
                 "input_token_details": {"cache_read": int(reused)}}
        yield "", usage

    def _plain_tokens(self, prompt: list[int], temperature: float, grammar: Any = None) -> Iterator[int]:
        llm = self._llama.llm
        if grammar is not None and temperature == 0:
            return self._greedy_grammar_tokens(prompt, grammar)
        if temperature > 0:
            # top_p as the transformers path; llama.cpp's extra top_k / min_p filters off
            return llm.generate(prompt, temp=temperature, top_p=self.top_p, top_k=0, min_p=0.0,
                                repeat_penalty=1.0, reset=True, grammar=grammar)
        return llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True, grammar=grammar)

    def _greedy_grammar_tokens(self, prompt: list[int], grammar: Any) -> Iterator[int]:
        """Greedy decoding under ``grammar`` with :class:`~.llama_cpp_grammar.GreedyGrammar` as the sampler
        (llama-cpp-python builds its sampler in ``_init_sampler``, which is shadowed for this one call;
        the model's lock is held throughout, so no other call sees it)."""
        llm = self._llama.llm
        chooser = GreedyGrammar(self._llama, grammar._grammar)
        llm._init_sampler = lambda **_: chooser
        try:
            yield from llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True)
        finally:
            del llm._init_sampler
            llm._sampler = None
            chooser.close()

    def _speculative_tokens(self, prompt: list[int]) -> Iterator[int]:
        """Greedy decoding of the model, with drafts from the draft model verified in one pass each."""
        return speculative_greedy(self._llama, self._draft, prompt, n_draft=self.n_draft, stats=self._spec_stats)


def _prefix_files() -> PrefixFiles:
    return PrefixFiles(cache_dir() / "llama-states")  # read per call: $TCRAG_CACHE_DIR may change


def _token_logprobs(lm: LlamaCppModel, logits: Any, token: int, piece: str, top_k: int) -> dict[str, Any]:
    """One generated token in OpenAI's logprobs shape, from the logits row that chose it."""
    import numpy as np

    x = logits.astype(np.float64)
    logp = x - x.max()
    logp -= math.log(float(np.exp(logp).sum()))
    top = np.argpartition(-logp, top_k)[:top_k] if 0 < top_k < len(logp) else np.arange(0)
    alternatives = [{"token": lm.detokenize([int(i)]), "logprob": float(logp[i])}
                    for i in sorted(top.tolist(), key=lambda i: -logp[i])]
    return {"token": piece, "logprob": float(logp[token]), "top_logprobs": alternatives}
