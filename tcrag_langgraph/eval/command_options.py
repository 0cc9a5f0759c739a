"""What ``tcrag eval`` and ``tcrag calibrate`` share, declared once: their own common options (the
model, monitor and run options are every command's: :mod:`tcrag_langgraph.agent.flags`) and the
helpers that read them (dataset records, method names and options, state-value names, served-model
settings)."""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

__all__ = ["console", "refusing_user_errors"]

console = Console(stderr=True)

# ----- options `tcrag eval` and `tcrag calibrate` share (declared once) -----
DatasetOpt = Annotated[str, typer.Option(help="pubmedqa, medmcqa, or a JSONL path")]
SeedOpt = Annotated[int, typer.Option(help="seed for sampling questions and for generation")]
ContextOpt = Annotated[bool, typer.Option("--context/--no-context", help="give the dataset's context passage")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="show a progress bar")]


def refusing_user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with a :class:`~tcrag_langgraph.agent.spec.UserError` (a model, monitor, tool or
    sigma the spec refused) turned into Typer's usage error for the flag it names, so these commands
    refuse in one line on any Typer app, not only under ``tcrag``."""
    from ..agent.spec import UserError

    @functools.wraps(command)
    def refusing(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            raise typer.BadParameter(f"{exc.kind}: {exc.message}", param_hint=exc.flag) from None

    return refusing


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


def _served_settings(agent: dict[str, Any]) -> dict[str, Any]:
    """The served-model and Elasticsearch choices a run records (only those made, so runs from before
    these options still resume; never a key, nor the name of a key's variable)."""
    given = {"base_url": agent.get("base_url"), "scorer_model": agent.get("scorer_model"), "es_url": agent.get("es_url"),
             "es_index": agent.get("es_index") if agent.get("es_url") else None}
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
