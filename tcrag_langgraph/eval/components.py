"""What an evaluation run is made of, from the words of ``tcrag eval`` / ``tcrag calibrate``: the chat
model (:func:`resolve_model`), the tools (:func:`resolve_tools`) and the state monitor's scorer
(:func:`resolve_scorer`), each a preset or a ``module:callable`` factory (:func:`load_factory`), so any
LangChain model or tool set can be evaluated."""

from __future__ import annotations

import importlib
from typing import Any, Optional

import typer

__all__ = ["load_factory", "resolve_model", "resolve_tools", "resolve_scorer"]


def load_factory(spec: str) -> Any:
    """``"package.module:callable"`` -> the callable's result.

    Example:
        >>> load_factory("builtins:list")
        []
    """
    if ":" not in spec:
        raise typer.BadParameter(f"{spec!r} is not a preset and not of the form module:callable")
    module_name, attr = spec.split(":", 1)
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise typer.BadParameter(f"cannot load {spec!r}: {exc}") from exc
    return factory()


def resolve_model(spec: str, *, max_new_tokens: int, temperature: float, base_url: Optional[str] = None,
                  api_key: Optional[str] = None) -> Any:
    """The chat model ``--model`` names, with these generation settings.

    ``local`` (the packaged SmolLM2-135M-Instruct), a transformers folder, a ``.gguf`` file, a
    LangChain ``"provider:model"`` name (all through :func:`tcrag_langgraph.models.resolve.resolve_chat_model`),
    or ``module:callable`` returning a chat model. A ``name:value`` is a factory when ``name`` is an
    importable module with a callable ``value``; otherwise it is a provider name.

    Example:
        >>> resolve_model("local", max_new_tokens=64, temperature=0.0).max_new_tokens
        64
    """
    from ..models.resolve import resolve_chat_model

    if spec == "local":
        if base_url or api_key:
            raise typer.BadParameter("--base-url and --api-key-env apply to served models (provider:model)",
                                     param_hint="--model")
        return resolve_chat_model(None, max_new_tokens=max_new_tokens, temperature=temperature)
    if ":" in spec and _factory(spec) is not None:
        return load_factory(spec)
    served = {k: v for k, v in (("base_url", base_url), ("api_key", api_key)) if v is not None}
    try:
        return resolve_chat_model(spec, max_new_tokens=max_new_tokens, temperature=temperature, **served)
    except (ValueError, ImportError) as exc:
        raise typer.BadParameter(f"{exc} (or module:callable returning a chat model)", param_hint="--model") from exc
    except Exception as exc:  # the provider's client refused to start, e.g. without an API key
        raise typer.BadParameter(f"{type(exc).__name__}: {' '.join(str(exc).split())} (a served model's key: "
                                 "--api-key-env NAME)", param_hint="--model") from None


def _factory(spec: str) -> Any:
    """The callable ``module:attr`` names, or ``None`` when it names none (then it may be a provider)."""
    module_name, _, attr = spec.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")):
        return None
    try:
        found = getattr(importlib.import_module(module_name), attr, None)
    except ImportError:
        return None
    return found if callable(found) else None


def resolve_tools(spec: str, *, exclude_ids: Optional[list[str]] = None, es_url: Optional[str] = None,
                  es_index: str = "tcrag-docs", es_api_key: Optional[str] = None) -> list[Any]:
    """Comma-separated presets (``none``, ``default``, ``docs``, ``web``) or ``module:callable``.
    With ``es_url`` the document tool of ``default`` and ``docs`` searches that Elasticsearch index
    instead of the embedded store."""
    tools: list[Any] = []
    if es_url:
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if not {"default", "docs"} & set(parts):
            raise typer.BadParameter("--es-url selects the document store: use it with --tools default or docs",
                                     param_hint="--es-url")
        from ..tools.documents import document_tool
        from ..tools.elasticsearch_store import ElasticsearchStore

        try:
            store = ElasticsearchStore(es_url, index=es_index, api_key=es_api_key)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--es-url") from None
        for part in parts:
            if part == "docs":
                tools.append(document_tool(store, exclude_ids=exclude_ids, mode="bm25"))
            elif part == "default":
                from .. import tools as tools_pkg

                tools.extend([document_tool(store), *tools_pkg.default_tools(documents=False)])
            else:
                tools.extend(resolve_tools(part, exclude_ids=exclude_ids))
        return tools
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "none":
            continue
        if part == "default":
            from .. import tools as tools_pkg

            factory = getattr(tools_pkg, "default_tools", None)
            if factory is None:
                raise typer.BadParameter("tcrag_langgraph.tools has no default_tools() yet; name the tools instead")
            tools.extend(factory())
        elif part == "docs":
            from ..tools.documents import default_document_tool

            tools.append(default_document_tool(exclude_ids=exclude_ids, mode="bm25"))
        elif part == "web":
            from ..tools.web_search import default_web_tool

            tools.append(default_web_tool())
        else:
            made = load_factory(part)
            tools.extend(made if isinstance(made, (list, tuple)) else [made])
    return tools


def resolve_scorer(spec: str, model: Any, *, served_model: Optional[str] = None, api_key: Optional[str] = None,
                   start_text: str = "") -> Any:
    """``local`` (state values from the generator's own weights, see
    :func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`; a generator without a trusted log-prob source
    is refused rather than scored by another model), the address of a completions server that echoes
    prompt log-probs, a local model folder / ``.gguf`` (:func:`~tcrag_langgraph.monitor.from_spec.scorer_from_spec`),
    or ``module:callable``."""
    if spec.startswith(("http://", "https://")) or (spec != "local" and _factory(spec) is None):
        from ..monitor.from_spec import scorer_from_spec

        try:
            return scorer_from_spec(spec, generator=model, served_model=served_model, api_key=api_key,
                                    start_text=start_text)
        except ValueError as exc:
            raise typer.BadParameter(f"{exc} (or module:callable returning a scorer)", param_hint="--scorer") from None
    if spec == "local":
        from ..monitor.own_model import scorer_for_model
        from ..monitor.scoring import MonitorUnavailableError

        try:
            return scorer_for_model(model)
        except MonitorUnavailableError as exc:
            raise typer.BadParameter("this model exposes no prompt log-probs the monitor can trust: give --scorer "
                                     "http://HOST:PORT/v1 (a vLLM or SGLang completions server of the same model, "
                                     "--scorer-model NAME), --scorer PATH (a local copy of the same weights) or "
                                     "--scorer module:function, or run methods without the monitor (--method "
                                     "wo-monitor, react, base, cot, sr-rag)", param_hint="--scorer") from exc
    return load_factory(spec)
