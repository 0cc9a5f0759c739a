"""What ``tcrag eval`` and ``tcrag calibrate`` share, declared once: their common options and the
helpers that read them (dataset records, method names and options, state-value names, served-model
settings)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

__all__ = ["console"]

console = Console(stderr=True)

# ----- options `tcrag eval` and `tcrag calibrate` share (declared once) -----
DatasetOpt = Annotated[str, typer.Option(help="pubmedqa, medmcqa, or a JSONL path")]
SeedOpt = Annotated[int, typer.Option(help="seed for sampling questions and for generation")]
ContextOpt = Annotated[bool, typer.Option("--context/--no-context", help="give the dataset's context passage")]
ModelOpt = Annotated[str, typer.Option(help="local, a transformers folder, a .gguf file, a served model as "
                                       "provider:name (e.g. openai:NAME), or a Python function returning a chat "
                                       "model (module:function)")]
ToolsOpt = Annotated[str, typer.Option(help="none, default, docs, web (comma-separated) or a Python function "
                                       "returning tools (module:function)")]
ScorerOpt = Annotated[str, typer.Option(help="the state monitor: local (the model's own weights), a vLLM or SGLang "
                                        "completions server address, a local model folder or .gguf file, or a "
                                        "Python function returning a scorer (module:function)")]
BaseUrlOpt = Annotated[Optional[str], typer.Option(help="served models: the server's API address, e.g. "
                                                   "http://127.0.0.1:8000/v1")]
ApiKeyEnvOpt = Annotated[Optional[str], typer.Option(metavar="NAME", help="served models and --scorer servers: the "
                                                     "environment variable holding the API key")]
ScorerModelOpt = Annotated[Optional[str], typer.Option(metavar="NAME", help="the model name the --scorer server "
                                                       "knows the model by (default: the name in --model)")]
ScorerStartOpt = Annotated[str, typer.Option(help="text the --scorer server puts before what it scores (the model's "
                                             "start token, for servers that add none)")]
MaxStepsOpt = Annotated[int, typer.Option(min=1, help="actions before the final answer is asked for")]
MaxNewTokensOpt = Annotated[int, typer.Option(min=1, help="tokens the model may write per reply")]
TemperatureOpt = Annotated[float, typer.Option(min=0.0, help="sampling temperature (0 = greedy)")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="show a progress bar")]


def _key(name: Optional[str]) -> Optional[str]:
    """The API key in environment variable ``name`` (``--api-key-env``), never one from the command line."""
    from ..models.credentials import key_from_env

    try:
        return key_from_env(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--api-key-env") from None


def _load_records(dataset: str, split: Optional[str], context: bool, long_answers: bool, fields: Optional[str],
                  task: Optional[str], answer_index_base: Optional[int]):
    from .datasets import DatasetError, load_dataset

    options: dict[str, Any] = {}
    if fields:
        try:
            options["fields"] = json.loads(fields)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--fields must be a JSON object: {exc}") from exc
    if task:
        options["task"] = task
    if answer_index_base is not None:
        options["answer_index_base"] = answer_index_base
    try:
        return load_dataset(dataset, split=split, with_context=context,
                            answer_format="long" if long_answers else "label", **options)
    except DatasetError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dataset") from exc


def _method_options(value: Optional[str], names: list[str]) -> dict[str, dict[str, Any]]:
    """``--method-options``: a JSON object ``{method: {option: value}}`` for methods being run."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--method-options") from exc
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise typer.BadParameter('a JSON object of objects, e.g. {"crp-rag": {"fan_out": 2}}',
                                 param_hint="--method-options")
    from ..methods.registry import check_method_options

    try:  # before the model loads, so a typo costs nothing
        return check_method_options(names, parsed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--method-options") from exc


def _served_settings(base_url: Optional[str], scorer_model: Optional[str], es_url: Optional[str],
                     es_index: Optional[str]) -> dict[str, Any]:
    """The served-model and Elasticsearch choices a run records (only those made, so runs from before
    these options still resume; never a key)."""
    given = {"base_url": base_url, "scorer_model": scorer_model, "es_url": es_url,
             "es_index": es_index if es_url else None}
    return {k: v for k, v in given.items() if v}


def _split_methods(values: list[str]) -> list[str]:
    from ..methods.registry import METHOD_NAMES

    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if names == ["all"]:
        return list(METHOD_NAMES)
    bad = [n for n in names if n not in METHOD_NAMES]
    if bad:
        raise typer.BadParameter(f"unknown methods {bad}; choose from {', '.join(METHOD_NAMES)} or 'all'")
    return list(dict.fromkeys(names))


def _state_value_names(value: str) -> list[str]:
    """``--metric``: state values, comma-separated, or ``all``."""
    from ..monitor.state_values import STATE_VALUES

    names = list(dict.fromkeys(m.strip() for m in value.split(",") if m.strip()))
    if names == ["all"]:
        return list(STATE_VALUES)
    bad = [m for m in names if m not in STATE_VALUES]
    if not names or bad:
        raise typer.BadParameter(f"choose from {', '.join(STATE_VALUES)} (comma-separated) or all",
                                 param_hint="--metric")
    return names
