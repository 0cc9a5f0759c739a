"""Which chat model a user means: nothing (the packaged model), a model folder, a ``.gguf`` file, a
LangChain ``"provider:model"`` name, or a model object; and, for a local file, which backend runs it
(llama.cpp for a GGUF on the CPU, transformers otherwise). Its own module because it chooses between
:mod:`.local` (transformers) and :mod:`.llama_cpp`, which builds on it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from langchain_core.language_models import BaseChatModel

from .catalogue import catalogue_model_path
from .local import LocalChatModel

__all__ = ["resolve_chat_model", "looks_like_path"]


def looks_like_path(spec: str) -> bool:
    """Whether a model spec names a file or folder rather than a ``provider:model`` name."""
    return spec.lower().endswith(".gguf") or spec.startswith((".", "/", "~")) or os.sep in spec or Path(spec).exists()


def resolve_chat_model(
    spec: "BaseChatModel | str | os.PathLike[str] | None" = None,
    *,
    max_new_tokens: Optional[int] = None,
    temperature: Optional[float] = None,
    device: Optional[str] = None,
    dtype: Optional[str] = None,
    backend: Optional[str] = None,
    **provider_kwargs: Any,
) -> BaseChatModel:
    """A chat model from what a user gave: nothing, a path, a LangChain model name, or a model.

    * ``None``: the packaged SmolLM2-135M-Instruct (:class:`LocalChatModel`, loaded on first use);
    * a path to a transformers folder or a ``.gguf`` file: :class:`LocalChatModel` over it (a GGUF
      is converted once and cached);
    * a catalogue name (``"qwen2.5-coder-1.5b"``, :mod:`.catalogue`): its file, once ``tcrag pull NAME``
      fetched it; before that a :class:`~.catalogue.ModelNotPulledError` (a ValueError) says so. A
      catalogue name wins over a same-named folder in the working directory (write ``./NAME`` for that);
    * ``"provider:model"`` (e.g. ``"openai:gpt-4o-mini"``, ``"ollama:qwen2.5"``): LangChain's
      ``init_chat_model`` (the provider's integration package must be installed; ``base_url=`` and
      ``api_key=`` go through ``provider_kwargs``, so a vLLM server is
      ``resolve_chat_model("openai:NAME", base_url="http://127.0.0.1:8000/v1", api_key="...")``);
    * a ``BaseChatModel``: itself (no option may be given then).

    ``max_new_tokens`` and ``temperature`` apply to every kind (``max_new_tokens`` is passed to a
    provider as ``max_tokens``); ``device`` and ``dtype`` only to local models (ValueError
    otherwise). ``provider_kwargs`` only to ``"provider:model"``. Anything else is a ValueError.

    ``backend`` (local models): ``"auto"``/``None`` runs a ``.gguf`` file (and the packaged default,
    a GGUF too) with llama.cpp (:class:`~tcrag_langgraph.models.llama_cpp.LlamaCppChatModel`) on the
    CPU, and a transformers folder, or any model given a GPU ``device`` or a ``dtype``, with
    transformers; ``"llama_cpp"`` or ``"transformers"`` chooses.
    A path that does not exist is a ValueError too (nothing is loaded here: loading happens on the
    first call).

    Example:
        >>> resolve_chat_model(None).model_path is None
        True
        >>> resolve_chat_model("no-such-thing")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: model 'no-such-thing' is not a model folder, a .gguf file, a catalogue name or a "provider:model" name ...
    """
    if isinstance(spec, str) and (pulled := catalogue_model_path(spec)) is not None:
        spec = str(pulled)  # a catalogue name is its pulled file (ModelNotPulledError, a ValueError, if not)
    local_opts = {k: v for k, v in (("max_new_tokens", max_new_tokens), ("temperature", temperature),
                                     ("device", device), ("dtype", dtype)) if v is not None}
    if backend is not None and backend not in ("auto", "llama_cpp", "transformers"):
        raise ValueError(f"unknown backend {backend!r}; use 'auto', 'llama_cpp' or 'transformers'")
    if backend not in (None, "auto") and (isinstance(spec, BaseChatModel) or (
            isinstance(spec, str) and not looks_like_path(spec.strip()))):
        raise ValueError("backend applies to local models only (a model folder, a .gguf file or the packaged default)")
    if isinstance(spec, BaseChatModel):
        given = [k for k, v in {**local_opts, **provider_kwargs}.items() if v is not None]
        if given:
            raise ValueError(f"options {given} cannot be applied to an already built chat model; set them on it")
        return spec
    if spec is None or isinstance(spec, os.PathLike):
        if provider_kwargs:
            raise ValueError(f"options {sorted(provider_kwargs)} only apply to 'provider:model' names")
        if spec is not None:
            _check_model_path(Path(spec))
        return _local_chat(None if spec is None else str(spec), backend, local_opts)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"model must be None, a path, a 'provider:model' string or a chat model, not {spec!r}")
    spec = spec.strip()
    if looks_like_path(spec):
        if provider_kwargs:
            raise ValueError(f"options {sorted(provider_kwargs)} only apply to 'provider:model' names")
        _check_model_path(Path(spec))
        return _local_chat(spec, backend, local_opts)
    provider, sep, name = spec.partition(":")
    if not sep or not provider or not name:
        raise ValueError(
            f"model {spec!r} is not a model folder, a .gguf file, a catalogue name or a \"provider:model\" name "
            "(e.g. 'openai:gpt-4o-mini', 'ollama:qwen2.5'; catalogue: tcrag pull --list)"
        )
    if device is not None or dtype is not None:
        raise ValueError("device and dtype apply to local models only; a served model runs where its server runs")
    kwargs = dict(provider_kwargs)
    if temperature is not None:
        kwargs["temperature"] = temperature
    if max_new_tokens is not None:
        kwargs["max_tokens"] = max_new_tokens
    try:
        return _init_chat_model(spec, **kwargs)
    except ImportError as exc:
        raise ValueError(f"model {spec!r}: the LangChain integration for {provider!r} is not installed ({exc})") from exc
    except ValueError as exc:
        raise ValueError(f"model {spec!r} could not be resolved by init_chat_model: {exc}") from exc


def _local_chat(path: Optional[str], backend: Optional[str], opts: dict[str, Any]) -> LocalChatModel:
    """The local chat model for ``path`` (None = packaged GGUF) on the chosen backend (see resolve_chat_model)."""
    is_gguf = path is None or path.lower().endswith(".gguf")
    if backend == "llama_cpp":
        if not is_gguf:
            raise ValueError(f"the llama_cpp backend runs .gguf files; {path} is a transformers folder")
        if "dtype" in opts:
            raise ValueError("dtype does not apply to the llama_cpp backend (the GGUF's own quantization runs)")
    use_llama = backend == "llama_cpp" or (
        backend in (None, "auto") and is_gguf and opts.get("device", "cpu") == "cpu" and "dtype" not in opts)
    if use_llama:
        from .llama_cpp import LlamaCppChatModel  # only when a GGUF runs: startup time
        from .llama_cpp_model import llama_cpp_available

        if llama_cpp_available():
            return LlamaCppChatModel(model_path=path, **opts)
        if backend == "llama_cpp":
            raise ValueError("the llama_cpp backend needs llama-cpp-python, which cannot be imported here")
        print("tcrag: llama-cpp-python cannot be imported; running the GGUF with transformers", file=sys.stderr)
    return LocalChatModel(model_path=path, **opts)


def _init_chat_model(spec: str, **kwargs: Any) -> BaseChatModel:
    try:
        from langchain.chat_models import init_chat_model
    except ImportError:
        # langchain 1.x is not a dependency; langchain-classic (pulled in by langchain-community)
        # keeps the same function, marked deprecated there only because it moved.
        import warnings

        from langchain_classic.chat_models import init_chat_model

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*init_chat_model.*", category=DeprecationWarning)
            return init_chat_model(spec, **kwargs)
    return init_chat_model(spec, **kwargs)


def _check_model_path(path: Path) -> None:
    path = path.expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file {path} does not exist")
    elif not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a transformers model folder (no config.json) and not a .gguf file")
