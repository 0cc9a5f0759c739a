"""What every method's builder takes, checked and resolved once, the same way for every method.

:func:`build_arguments` turns the keywords of :meth:`~.kernel.RunKernel.build` (model, tools, scorer,
config, options, name, identity switch) into :class:`BuildArguments`, with the same exceptions for
every method: TypeError for a wrong type, ValueError for a bad value. :func:`default_scorer` is the
one rule for the state monitor's weights when no scorer is given: the generator's own, never
silently another model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict

from ..models.resolve import resolve_chat_model
from ..monitor.own_model import scorer_for_model
from ..monitor.scoring import MonitorUnavailableError
from .config import TCRAGConfig

__all__ = ["BuildArguments", "MethodOptions", "build_arguments", "default_scorer"]


class MethodOptions(BaseModel):
    """Base of a method's own options (CRP-RAG, KAG-Thinker, TCM-DiffRAG): validated, unknown fields
    refused, each overridable per run (``context=``); the shared settings stay in :class:`TCRAGConfig`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def merged(self, overrides: "MethodOptions | Mapping[str, Any] | None") -> "MethodOptions":
        """A copy with the explicitly set fields of ``overrides`` applied (validated)."""
        if overrides is None:
            return self
        if isinstance(overrides, type(self)):
            values = {name: getattr(overrides, name) for name in overrides.model_fields_set}
        elif isinstance(overrides, Mapping):
            values = dict(overrides)
        else:
            raise TypeError(f"{type(self).__name__} overrides must be {type(self).__name__} or a mapping, "
                            f"not {type(overrides).__name__}")
        return type(self).model_validate({**self.model_dump(), **values}) if values else self


@dataclass(frozen=True)
class BuildArguments:
    """What a builder works with after :func:`build_arguments` checked and resolved its arguments."""

    model: BaseChatModel
    tools: list[BaseTool]
    scorer: Any
    config: TCRAGConfig
    options: Any
    name: str
    trust_client_identity: bool


def build_arguments(
    *,
    model: Any,
    tools: Any,
    scorer: Any,
    config: Any,
    options: Any,
    name: Any,
    trust_client_identity: Any,
    options_type: Optional[type[MethodOptions]] = None,
    method: str = "this method",
    model_kwargs: Optional[Mapping[str, Any]] = None,
) -> BuildArguments:
    """Check and resolve the arguments every builder takes, the same way for every method.

    ``model``: a LangChain chat model, a local path / ``.gguf``, a ``"provider:model"`` name or None
    (the packaged default). ``tools``: LangChain tools with unique names. ``scorer``: None, an object
    with ``score`` or ``token_logprobs``, or a callable. ``config``: a :class:`TCRAGConfig` or a
    mapping of its fields. ``options``: the method's own options (or a mapping of them); a method
    without options takes none. ``model_kwargs``: what a ``"provider:model"`` name's chat model is made
    with (``init_chat_model``'s keywords, e.g. ``base_url``, ``api_key``); only with such a name. A
    wrong type is a TypeError, a bad value a ValueError.
    """
    if not (model is None or isinstance(model, (BaseChatModel, str, os.PathLike))):
        raise TypeError(f"model must be a LangChain chat model, a path or a 'provider:model' name, "
                        f"got {type(model).__name__}")
    if tools is None:
        tools = []
    if isinstance(tools, (str, bytes, BaseTool)) or not isinstance(tools, (Sequence, tuple, list)):
        raise TypeError(f"tools must be a sequence of LangChain tools, got {type(tools).__name__}")
    tools = list(tools)
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise TypeError(f"tools must be LangChain BaseTool instances, got {type(tool).__name__}")
    if len({tool.name for tool in tools}) != len(tools):
        raise ValueError("tool names must be unique")
    if scorer is not None and not (hasattr(scorer, "score") or hasattr(scorer, "token_logprobs") or callable(scorer)):
        raise TypeError(f"scorer must have score(query, text, *, metric), token_logprobs(context, text) or be "
                        f"callable, got {type(scorer).__name__}")
    if config is None:
        cfg = TCRAGConfig()
    elif isinstance(config, TCRAGConfig):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = TCRAGConfig.model_validate(dict(config))  # a bad value: pydantic's ValidationError, a ValueError
    else:
        raise TypeError(f"config must be a TCRAGConfig or a mapping of its fields, got {type(config).__name__}")
    if options_type is None:
        if options:
            raise ValueError(f"{method} takes no options (its settings are TCRAGConfig fields)")
        opts = None
    elif options is None:
        opts = options_type()
    elif isinstance(options, options_type):
        opts = options
    elif isinstance(options, Mapping):
        opts = options_type.model_validate(dict(options))
    else:
        raise TypeError(f"options must be {options_type.__name__} or a mapping of its fields, "
                        f"got {type(options).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if not name.strip():
        raise ValueError("name must not be empty")
    if not isinstance(trust_client_identity, bool):
        raise TypeError(f"trust_client_identity must be True or False, got {type(trust_client_identity).__name__}")
    if model_kwargs is not None and not isinstance(model_kwargs, Mapping):
        raise TypeError(f"model_kwargs must be a mapping of init_chat_model keywords, got {type(model_kwargs).__name__}")
    if not isinstance(model, BaseChatModel):  # the packaged default, a local path or a provider name
        model = resolve_chat_model(model, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                   **dict(model_kwargs or {}))
    elif model_kwargs:
        raise ValueError("model_kwargs apply to a model given by name; set them on the chat model you built")
    return BuildArguments(model=model, tools=tools, scorer=scorer, config=cfg, options=opts, name=name,
                          trust_client_identity=trust_client_identity)


def default_scorer(model: BaseChatModel, scorer: Any, *, needed: bool, why: str = "") -> Any:
    """``scorer``, or when none is given and the method needs one, the generator's own weights
    (:func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`): never silently another model. A model
    without trusted log-probs raises :class:`MonitorUnavailableError` (``why`` says what to do instead)."""
    if scorer is not None or not needed:
        return scorer
    try:
        return scorer_for_model(model)
    except MonitorUnavailableError as err:
        if not why:
            raise
        raise MonitorUnavailableError(f"{err} {why}") from None
