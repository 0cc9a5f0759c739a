"""``tcrag eval`` and ``tcrag calibrate`` (added to the main ``tcrag`` app by :func:`register`).

Examples::

    tcrag eval --dataset pubmedqa --method base --method tcrag-cppl --limit 20 --seed 0 --out runs/pqa
    tcrag eval --dataset medmcqa --method react,tcrag-cppl --tools docs --attack partial --noise relevant --out runs/noise
    tcrag calibrate --dataset pubmedqa --split trainval --metric cppl --limit 50 --out runs/calib

``tcrag calibrate`` also stores the result for ``sigma="auto"`` (see
:func:`tcrag_langgraph.eval.calibration.default_calibration_path`).

``--model``, ``--tools`` and ``--scorer`` take a preset or ``module:callable`` (a factory returning
a chat model, a list of tools, or a scorer), so any LangChain model or tool set can be evaluated.
"""

from __future__ import annotations

import functools
import importlib
import json
import types
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console

__all__ = ["register", "load_factory", "resolve_model", "resolve_tools", "resolve_scorer"]

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


def _sigma_option(value: str, metric: str, model: Any, task: Optional[str] = None, hint: Optional[str] = None) -> float:
    """A sigma option (``--sigma-cppl``, ``--sigma-uct``, ``--sigma METRIC=VALUE``): a number, or
    ``auto`` for the sigma stored for this model (on ``task``) by ``tcrag calibrate`` (resolved once
    here, so every question and the saved settings use the number). Validated by
    :class:`TCRAGConfig`, the one home of what a sigma may be."""
    from ..core.config import TCRAGConfig
    from ..models.local import chat_model_id
    from ..monitor.calibration import CalibrationNotFoundError, resolve_sigma

    try:
        cfg = TCRAGConfig(metric=metric, sigma=value, calibration_task=task)
        return float(resolve_sigma(cfg, chat_model_id(model) if cfg.sigma == "auto" else ""))
    except ValidationError as exc:  # the first problem, in pydantic's own words, without its dump
        raise typer.BadParameter(exc.errors()[0]["msg"].removeprefix("Value error, "),
                                 param_hint=hint or f"--sigma-{metric}") from None
    except (ValueError, CalibrationNotFoundError) as exc:
        raise typer.BadParameter(str(exc), param_hint=hint or f"--sigma-{metric}") from exc


def _sigma_pairs(values: list[str]) -> dict[str, str]:
    """``--sigma METRIC=VALUE`` (repeatable) as ``{metric: value}``."""
    from ..monitor.state_values import STATE_VALUES

    pairs: dict[str, str] = {}
    for item in values:
        metric, sep, value = item.partition("=")
        metric = metric.strip()
        if not sep or metric not in STATE_VALUES or not value.strip():
            raise typer.BadParameter(f"{item!r}: write METRIC=VALUE with METRIC one of {', '.join(STATE_VALUES)} "
                                     "and VALUE a number or auto", param_hint="--sigma")
        pairs[metric] = value.strip()
    return pairs


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


def _indexed_documents(names: list[str], tools: str, records: list[Any], exclude_eval_docs: bool) -> Optional[list[Any]]:
    """What a method that indexes documents itself (DiffRAG) reads, matching what ``--tools docs``
    gives the other methods: the evaluated questions' own abstracts (their gold evidence; a smaller
    haystack than the tool's whole corpus, since every passage costs one LLM call to index), or,
    with ``--exclude-eval-docs``, as many other packaged abstracts. ``None`` (its default) without
    the docs tool or without such a method."""
    from ..methods.registry import METHODS

    if not any(METHODS[n].indexes_documents for n in names):
        return None
    if "docs" not in [p.strip() for p in tools.split(",")]:
        return None
    from ..methods.diffrag import packaged_documents

    ids = [r.id for r in records]
    passages = 8 * max(1, len(ids))  # an abstract has 3-5 sections
    if exclude_eval_docs:
        return packaged_documents(max_passages=passages, exclude_ids=ids)[: len(ids)]
    return packaged_documents(max_passages=passages, ids=ids)


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


def _split_methods(values: list[str]) -> list[str]:
    from ..methods.registry import METHOD_NAMES

    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if names == ["all"]:
        return list(METHOD_NAMES)
    bad = [n for n in names if n not in METHOD_NAMES]
    if bad:
        raise typer.BadParameter(f"unknown methods {bad}; choose from {', '.join(METHOD_NAMES)} or 'all'")
    return list(dict.fromkeys(names))


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


def _key(name: Optional[str]) -> Optional[str]:
    """The API key in environment variable ``name`` (``--api-key-env``), never one from the command line."""
    from ..models.credentials import key_from_env

    try:
        return key_from_env(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--api-key-env") from None


def _records_of_run(folder: Path) -> Optional[list[Any]]:
    """The questions a run folder was made from, loaded again from the settings in its run.json
    (None, with a line saying why, when the dataset cannot be loaded here)."""
    from .runner import SETTINGS_FILE

    settings = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
    try:  # as tcrag eval loaded them (--fields is kept as the JSON text given)
        return _load_records(settings["dataset"], settings.get("split"), bool(settings.get("context")),
                             bool(settings.get("long_answers")), settings.get("fields"), settings.get("task"),
                             settings.get("answer_index_base"))
    except (typer.BadParameter, KeyError, OSError) as exc:
        why = exc.message if isinstance(exc, typer.BadParameter) else exc
        typer.echo(f"(rejections not counted: the run's dataset cannot be loaded here: {why})", err=True)
        return None


def _report_rejections(rows: list[dict[str, Any]], records: Optional[list[Any]], out: Optional[Path],
                       labels: dict[str, str]) -> None:
    """What the state monitor's rejections changed (eval.rejections), printed and, with ``out``,
    written to rejections.md; nothing when no method rejected anything."""
    from .rejections import rejection_effects, rejections_markdown

    if records is None:
        return
    table = rejections_markdown(rejection_effects(rows, records), labels)
    if table:
        heading = "State-monitor rejections: the first rejected Conclusion against the final answer"
        typer.echo(f"{heading}\n\n{table}")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "rejections.md").write_text(f"{heading}\n\n{table}", encoding="utf-8")


def _warn_mixed_code(rows: list[dict[str, Any]]) -> None:
    """Say so when one method's rows came from different code (a run resumed after an edit)."""
    from .provenance import mixed_code_versions

    mixed = mixed_code_versions(rows)
    if mixed:
        shown = "; ".join(f"{m}: " + ", ".join(f"{n} rows by {v}" for v, n in counts.items())
                          for m, counts in mixed.items())
        typer.echo(f"warning: rows made by different versions of the code or prompts ({shown}); "
                   "rerun into a new --out folder for a table made by one", err=True)


def _served_settings(base_url: Optional[str], scorer_model: Optional[str], es_url: Optional[str],
                     es_index: Optional[str]) -> dict[str, Any]:
    """The served-model and Elasticsearch choices a run records (only those made, so runs from before
    these options still resume; never a key)."""
    given = {"base_url": base_url, "scorer_model": scorer_model, "es_url": es_url,
             "es_index": es_index if es_url else None}
    return {k: v for k, v in given.items() if v}


def register(app: typer.Typer) -> None:
    """Add ``eval`` and ``calibrate`` to ``app``."""

    @app.command("eval")
    def eval_command(
        dataset: DatasetOpt = ...,
        method: list[str] = typer.Option(["base", "tcrag-cppl"], help="method name(s), repeat or comma-separate; 'all'"),
        limit: Optional[int] = typer.Option(None, min=1, help="evaluate this many questions"),
        seed: SeedOpt = 0,
        out: Path = typer.Option(..., help="output folder (results.jsonl, summary.md/.csv, plot); reruns resume"),
        split: Optional[str] = typer.Option(None, help="PubMedQA: test (default), trainval, all"),
        context: ContextOpt = True,
        long_answers: bool = typer.Option(False, help="PubMedQA: score the long answer (BLEU/ROUGE) instead of yes/no/maybe"),
        fields: Optional[str] = typer.Option(None, help='JSONL field mapping as JSON, e.g. {"question": "q"}'),
        task: Optional[str] = typer.Option(None, help="JSONL: force mcq, yesno or open"),
        answer_index_base: Optional[int] = typer.Option(None, help="JSONL: integer answers are 0- or 1-based"),
        model: ModelOpt = "local",
        tools: ToolsOpt = "none",
        exclude_eval_docs: bool = typer.Option(False, help="docs tool: drop the evaluated questions' own abstracts"),
        scorer: ScorerOpt = "local",
        base_url: BaseUrlOpt = None,
        api_key_env: ApiKeyEnvOpt = None,
        scorer_model: ScorerModelOpt = None,
        scorer_start_text: ScorerStartOpt = "",
        es_url: Optional[str] = typer.Option(None, envvar="TCRAG_ES_URL", help="search documents in this "
                                             "Elasticsearch server (tcrag index --es-url) instead of the embedded "
                                             "collection"),
        es_index: str = typer.Option("tcrag-docs", envvar="TCRAG_ES_INDEX", help="the Elasticsearch index to search"),
        sigma_cppl: Optional[str] = typer.Option(None, help="sigma for cppl: a number, or auto (the model's "
                                                 "stored calibration, tcrag calibrate); default: paper's 10"),
        sigma_uct: Optional[str] = typer.Option(None, help="sigma for uct: a number or auto; default: paper's 20"),
        sigma: list[str] = typer.Option([], "--sigma", metavar="METRIC=VALUE", help="sigma of any state value "
                                        "(cppl_evidence, uct_evidence, answer_prob, ...): a number or auto; "
                                        "repeatable"),
        calibration_task: Optional[str] = typer.Option(None, help="the task whose stored calibration 'auto' "
                                                       "reads (default: the dataset: pubmedqa, medmcqa, or the "
                                                       "JSONL file's name)"),
        max_steps: MaxStepsOpt = 12,
        max_new_tokens: MaxNewTokensOpt = 500,
        temperature: TemperatureOpt = 0.6,
        attack: Optional[str] = typer.Option(None, help="noise attack on the first retrieval: structural or partial"),
        noise: str = typer.Option("irrelevant", help="irrelevant, relevant or mixed"),
        method_options: Optional[str] = typer.Option(
            None, help='own options of the papers\' methods as JSON, e.g. {"crp-rag": {"fan_out": 2, "max_depth": 2}} '
            "(recorded with the run)"),
        progress: ProgressOpt = True,
        concurrency: int = typer.Option(1, min=1, help="questions in flight at once (for a served model whose "
                                        "server batches them; greedy results are the same for any value)"),
        reply_cache: bool = typer.Option(
            False, "--reply-cache", help="greedy runs only: keep the model's replies in the run folder "
            "(replies.sqlite), so a prompt two methods send alike is generated once; time still counts each "
            "replayed reply at the seconds its generation took"),
    ) -> None:
        """Evaluate methods on a dataset: accuracy and cost per method (paper Tables 1, 2, 5)."""
        from ..core.config import TCRAGConfig
        from ..methods.registry import METHODS, build_methods
        from ..monitor.calibration import CalibrationNotFoundError
        from .datasets import answer_format_for, sample_records, task_name
        from .noise import NoiseBank, PoisonController, poison_tools
        from .runner import SettingsMismatch, run_evaluation, summarize, summary_markdown, table_rows, write_summary

        names = _split_methods(method)
        own_options = _method_options(method_options, names)
        if attack is not None and attack not in ("structural", "partial"):
            raise typer.BadParameter("--attack must be structural or partial")
        if attack is not None and concurrency > 1:
            raise typer.BadParameter("--attack keeps per-question state: run it with --concurrency 1")
        if noise not in ("irrelevant", "relevant", "mixed"):
            raise typer.BadParameter("--noise must be irrelevant, relevant or mixed")
        if reply_cache and temperature > 0:
            raise typer.BadParameter("--reply-cache replays one reply per prompt: it needs greedy decoding "
                                     f"(--temperature 0), not {temperature}")
        all_records = _load_records(dataset, split, context, long_answers, fields, task, answer_index_base)
        records = sample_records(all_records, limit=limit, seed=seed if limit else None)
        ctask = calibration_task or task_name(dataset)
        # The runs' one answer format (every run still passes its own): a choice made when the graphs
        # are built, sigma="auto" picking answer_prob, must see the answers every run will declare.
        formats = {answer_format_for(r) for r in records}
        shared = next(iter(formats)) if len(formats) == 1 else None
        cfg = TCRAGConfig(max_steps=max_steps, max_new_tokens=max_new_tokens, temperature=temperature,
                          calibration_task=ctask, **({"answer_format": shared} if isinstance(shared, tuple) else {}))
        sigma_given = {**_sigma_pairs(sigma), **{k: v for k, v in (("cppl", sigma_cppl), ("uct", sigma_uct)) if v}}
        api_key = _key(api_key_env)
        chat = resolve_model(model, max_new_tokens=max_new_tokens, temperature=temperature, base_url=base_url,
                             api_key=api_key)
        if reply_cache:
            from .reply_cache import REPLY_CACHE_FILE, ReplyCache

            chat.cache = ReplyCache(out / REPLY_CACHE_FILE)
        tool_list = resolve_tools(tools, exclude_ids=[r.id for r in records] if exclude_eval_docs else None,
                                  es_url=es_url, es_index=es_index)
        controller = None
        if attack is not None:
            if not tool_list:
                raise typer.BadParameter("--attack needs tools (the first retrieval is what gets poisoned)")
            bank = NoiseBank.from_records(records, pool=all_records)
            controller = PoisonController(bank, mode=attack, kind=noise, seed=seed,  # type: ignore[arg-type]
                                          max_tokens=cfg.max_observation_tokens)
            tool_list = poison_tools(tool_list, controller)
        needs_scorer = any(METHODS[n].uses_scorer for n in names)
        state_scorer = resolve_scorer(scorer, chat, served_model=scorer_model, api_key=api_key,
                                      start_text=scorer_start_text) if needs_scorer else None
        sigmas = {k: _sigma_option(v, k, chat, ctask, hint="--sigma" if k not in ("cppl", "uct") else None)
                  for k, v in sigma_given.items()}
        documents = _indexed_documents(names, tools, records, exclude_eval_docs)
        try:
            graphs = build_methods(names, model=chat, tools=tool_list, scorer=state_scorer, config=cfg, sigmas=sigmas,
                                   documents=documents, method_options=own_options)
        except ValidationError as exc:  # a method's own options model refused a value
            raise typer.BadParameter(str(exc), param_hint="--method-options") from exc
        except CalibrationNotFoundError as exc:  # tcrag-auto, before any question runs
            raise typer.BadParameter(str(exc), param_hint="--method") from exc
        settings = {
            "dataset": dataset, "split": split, "context": context, "long_answers": long_answers, "limit": limit,
            "model": model, "tools": tools, "exclude_eval_docs": exclude_eval_docs, "scorer": scorer,
            **_served_settings(base_url, scorer_model, es_url, es_index), "sigmas": sigmas, "config": cfg.model_dump(mode="json"), "attack": attack,
            "noise": noise if attack else None, "fields": fields, "task": task,
        }
        if own_options:  # absent otherwise, so runs from before this option still resume
            settings["method_options"] = own_options
        if reply_cache:  # likewise; a run folder keeps one choice
            settings["reply_cache"] = True
        if answer_index_base is not None:  # likewise; summarize reloads the questions with it
            settings["answer_index_base"] = answer_index_base
        try:
            rows = run_evaluation(records, graphs, out_dir=out, settings=settings, seed=seed, include_context=context,
                                  poison=controller, progress=progress, concurrency=concurrency)
        except SettingsMismatch as exc:
            raise typer.BadParameter(str(exc), param_hint="--out") from exc
        summary = summarize(table_rows(rows), labels={n: METHODS[n].label for n in names})
        paths = write_summary(summary, out)
        typer.echo(summary_markdown(summary))
        _report_rejections(rows, records, out, labels={n: METHODS[n].label for n in names})
        _warn_mixed_code(rows)
        console.print(f"results: {out / 'results.jsonl'}; summary: {paths['markdown']}, {paths['csv']}"
                      + (f"; plot: {paths['plot']}" if "plot" in paths else ""))

    @app.command("summarize")
    def summarize_command(
        runs: list[Path] = typer.Argument(..., help="run folders of tcrag eval (same questions and settings)"),
        common: bool = typer.Option(True, "--common/--all", help="only the questions every method finished"),
        out: Optional[Path] = typer.Option(None, help="also write summary.md / summary.csv / the plot here"),
    ) -> None:
        """One table from one or more tcrag eval runs (e.g. a stopped run, or methods run apart)."""
        from ..methods.registry import METHODS
        from .runner import merge_runs, summarize, summary_markdown, table_rows, write_summary

        try:
            rows = merge_runs(runs, common=common)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="RUNS") from exc
        if not rows:
            raise typer.BadParameter("no question was finished by every method (try --all)", param_hint="RUNS")
        labels = {name: spec.label for name, spec in METHODS.items()}
        summary = summarize(table_rows(rows), labels=labels)
        typer.echo(f"{len({r['id'] for r in rows})} questions, {len({r['method'] for r in rows})} methods")
        typer.echo(summary_markdown(summary))
        # the questions are reloaded (to read each rejected Conclusion) only when there is one
        rejected = any(r.get("rejected") for r in rows)
        _report_rejections(rows, _records_of_run(runs[0]) if rejected else None, out, labels=labels)
        _warn_mixed_code(rows)
        if out is not None:
            paths = write_summary(summary, out)
            console.print(f"summary: {paths['markdown']}, {paths['csv']}")

    @app.command("calibrate")
    def calibrate_command(
        dataset: DatasetOpt = ...,
        split: Optional[str] = typer.Option(None, help="PubMedQA: use trainval (the default here) to keep test clean"),
        metric: str = typer.Option("cppl", help="state values, comma-separated, or all: cppl, uct (the paper's), "
                                   "cppl_evidence, uct_evidence, answer_prob (one run of the method, each value "
                                   "measured on its answers and evidence; files then get a .<metric> suffix)"),
        calibration_task: Optional[str] = typer.Option(None, help="the task to store it under (default: the "
                                                       "dataset: pubmedqa, medmcqa, or the JSONL file's name)"),
        method: str = typer.Option("wo-monitor", help="method producing the answers (its monitor is not used)"),
        rule: str = typer.Option("youden", help="youden or accuracy"),
        limit: Optional[int] = typer.Option(None, min=1, help="use this many questions (a sample; default: all)"),
        seed: SeedOpt = 0,
        out: Path = typer.Option(..., help="output folder (results.jsonl, calibration.json); reruns resume"),
        context: ContextOpt = True,
        model: ModelOpt = "local",
        tools: ToolsOpt = "none",
        scorer: ScorerOpt = "local",
        base_url: BaseUrlOpt = None,
        api_key_env: ApiKeyEnvOpt = None,
        scorer_model: ScorerModelOpt = None,
        scorer_start_text: ScorerStartOpt = "",
        max_steps: MaxStepsOpt = 12,
        max_new_tokens: MaxNewTokensOpt = 500,
        temperature: TemperatureOpt = 0.6,
        progress: ProgressOpt = True,
        save: bool = typer.Option(True, "--save/--no-save", help="store the sigma for sigma='auto' (ask/eval/serve/build_graph)"),
        calibration_file: Optional[Path] = typer.Option(
            None, help="where to store it (default: $TCRAG_CACHE_DIR/calibration/<model-id>.<task>.<metric>.json)"),
        model_id: Optional[str] = typer.Option(None, help="the id to store it under (default: the model's own name)"),
        save_unsupported: bool = typer.Option(False, help="store the sigma even when the value does not separate "
                                              "correct from wrong answers (AUROC <= 0.5)"),
        method_options: Optional[str] = typer.Option(None, help="own options of a papers' method as JSON, "
                                                     "as for tcrag eval"),
    ) -> None:
        """State values of correct vs wrong answers on a dev split: AUROC and a proposed sigma, stored
        for --sigma auto.

        With --method crp-rag the value is CRP-RAG's path score (the perplexity that decides
        knowledge sufficiency), measured in a run that never abstains, and what is stored is its
        sufficiency threshold for "auto"."""
        from rich.progress import track

        from ..core import answer_format
        from ..core.config import TCRAGConfig
        from ..methods.registry import build_methods
        from ..models.local import chat_model_id
        from ..monitor.calibration import Calibration, save_calibration
        from ..monitor.state_values import measure, scorer_score
        from .calibration import auroc_interval, calibrate
        from .datasets import answer_format_for, format_question, sample_records, task_name
        from .runner import SettingsMismatch, run_evaluation

        metrics = _state_value_names(metric)
        if calibration_file is not None and len(metrics) > 1:
            raise typer.BadParameter("--calibration-file takes one metric", param_hint="--calibration-file")
        if rule not in ("youden", "accuracy"):
            raise typer.BadParameter("--rule must be youden or accuracy")
        names = _split_methods([method])
        if len(names) != 1:
            raise typer.BadParameter("calibrate takes one method")
        own_options = _method_options(method_options, names)
        # CRP-RAG: calibrate its sufficiency threshold on the path scores of a run that answers every
        # question (a threshold no score reaches), the same decision sigma makes for TC-RAG.
        sufficiency = names[0] == "crp-rag"
        if sufficiency:
            if metrics != ["cppl"]:
                raise typer.BadParameter("CRP-RAG's sufficiency is measured in cppl", param_hint="--metric")
            from ..methods.crp_rag.calibration import NEVER_ABSTAIN

            own_options = {"crp-rag": {**own_options.get("crp-rag", {}), "sufficiency_threshold": NEVER_ABSTAIN}}
        if split is None and dataset.lower() == "pubmedqa":
            split = "trainval"
        all_records = _load_records(dataset, split, context, False, None, None, None)
        records = [r for r in sample_records(all_records, limit=limit, seed=seed if limit else None) if r.task != "open"]
        if not records:
            raise typer.BadParameter("calibration needs multiple-choice or yes/no questions (correct vs wrong)")
        ctask = calibration_task or task_name(dataset)
        cfg = TCRAGConfig(metric=metrics[0], max_steps=max_steps, max_new_tokens=max_new_tokens, temperature=temperature,
                          calibration_task=ctask)
        api_key = _key(api_key_env)
        chat = resolve_model(model, max_new_tokens=max_new_tokens, temperature=temperature, base_url=base_url,
                             api_key=api_key)
        stored_id: Optional[str] = model_id
        if save and stored_id is None:
            try:
                stored_id = chat_model_id(chat)
            except ValueError as exc:  # reported after the measurement, which stays useful
                console.print(f"[yellow]{exc}: the result will not be stored (pass --model-id)[/]")
        if sufficiency and stored_id:
            from ..methods.crp_rag.calibration import SUFFICIENCY_SUFFIX

            stored_id += SUFFICIENCY_SUFFIX
        state_scorer = resolve_scorer(scorer, chat, served_model=scorer_model, api_key=api_key,
                                      start_text=scorer_start_text)
        try:
            graphs = build_methods(names, model=chat, tools=resolve_tools(tools), scorer=state_scorer, config=cfg,
                                   method_options=own_options)
        except ValidationError as exc:
            raise typer.BadParameter(str(exc), param_hint="--method-options") from exc
        settings = {"dataset": dataset, "split": split, "context": context, "limit": limit, "model": model,
                    "tools": tools, "scorer": scorer, **_served_settings(base_url, scorer_model, None, None),
                    "config": cfg.model_dump(mode="json"), "purpose": "calibrate"}
        if own_options:
            settings["method_options"] = own_options
        try:
            rows = run_evaluation(records, graphs, out_dir=out, settings=settings, seed=seed,
                                  include_context=context, progress=progress)
        except SettingsMismatch as exc:
            raise typer.BadParameter(str(exc), param_hint="--out") from exc
        by_id = {r.id: r for r in records}
        labels = [bool(row.get("correct")) for row in rows]
        if len(set(labels)) < 2:
            console.print(f"[red]cannot calibrate:[/] needs both correct and wrong answers "
                          f"({sum(labels)} correct of {len(labels)})")
            raise typer.Exit(code=1)

        score_with = functools.partial(scorer_score, state_scorer)

        def value_of(one: str, row: dict[str, Any], scorer: Any) -> Optional[float]:
            """The state value ``one`` of a finished run's answer: the rule the stack machine applies
            (:func:`measure`), on the question, the answer and the evidence the run stood on."""
            record = by_id[row["id"]]
            text, choices = row["answer"], None
            if one == "answer_prob":
                fmt = answer_format_for(record)
                if not isinstance(fmt, tuple):
                    return None  # no list of allowed answers to weigh (open or multi-answer questions)
                choices, text = fmt, answer_format.fit(fmt, text)
            return float(measure(one, format_question(record, include_context=context), text, score=scorer.score,
                                 token_logprobs=getattr(scorer, "token_logprobs", None) or _no_logprobs,
                                 evidence=row.get("evidence") or [], choices=choices))

        # Question by question, every value of it at once: the evidence values and answer_prob share
        # one context, which the scorer's prefix cache then evaluates once (and identical log-prob
        # requests, cppl_evidence's and uct_evidence's, are asked once).
        measured: dict[tuple[str, int], Optional[float]] = {}
        if not sufficiency:
            raw_logprobs = getattr(state_scorer, "token_logprobs", None)
            if callable(raw_logprobs):
                asked: dict[tuple[str, str], list[float]] = {}

                def once(context: str, text: str, _raw=raw_logprobs) -> list[float]:
                    if (context, text) not in asked:
                        asked.clear()  # one question's requests at a time
                        asked[(context, text)] = list(_raw(context, text))
                    return asked[(context, text)]

                memo_scorer = types.SimpleNamespace(score=score_with, token_logprobs=once)
            else:
                memo_scorer = types.SimpleNamespace(score=score_with)
            todo = [(i, row) for i, row in enumerate(rows) if row.get("answer")]
            steps = track(todo, description=f"state values ({', '.join(metrics)})", console=console) \
                if progress else todo
            for i, row in steps:
                for one in metrics:
                    try:
                        measured[(one, i)] = value_of(one, row, memo_scorer)
                    except Exception as exc:  # an unscorable answer is missing, not a value
                        console.print(f"[yellow]could not score {row['id']} ({one}): {exc}[/]")
        table: list[tuple[str, Any, float, float, bool]] = []
        for one in metrics:
            suffix = "" if len(metrics) == 1 else f".{one}"
            values: list[Optional[float]] = []
            scored = []
            for i, row in enumerate(rows):
                answer = row.get("answer")
                # CRP-RAG: the path score the run measured (None where nothing was retrieved)
                value = row.get("state_value") if sufficiency else measured.get((one, i))
                values.append(value)
                scored.append({"id": row["id"], "value": value, "correct": bool(row.get("correct")), "answer": answer})
            (out / f"state_values{suffix}.jsonl").write_text(
                "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in scored), encoding="utf-8")
            try:
                result = calibrate(values, labels, rule=rule)  # type: ignore[arg-type]
            except ValueError as exc:
                console.print(f"[red]cannot calibrate {one}:[/] {exc} ({sum(labels)} correct of {len(labels)})")
                if len(metrics) == 1:
                    raise typer.Exit(code=1) from exc
                continue  # the other values may still be measured
            report = {"metric": one, "method": names[0], **result.to_dict()}
            (out / f"calibration{suffix}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            p = result.proposal
            typer.echo(
                f"{one}: n={result.n} (correct {result.n_correct}, wrong {result.n_wrong}, missing {result.n_missing})\n"
                f"median value: correct {result.median_correct:.4g}, wrong {result.median_wrong:.4g}\n"
                f"AUROC (lower value = correct): {result.auroc:.3f}\n"
                f"proposed sigma ({rule}): {p.sigma:.4g}  TPR {p.tpr:.2f}  FPR {p.fpr:.2f}  "
                f"decision accuracy {p.decision_accuracy:.2f}  accept rate {p.accept_rate:.2f}"
            )
            low, high = auroc_interval(result.auroc, result.n_correct, result.n_wrong)
            typer.echo(f"AUROC 95% interval: {low:.3f} - {high:.3f} ({result.n_correct} correct, {result.n_wrong} wrong)")
            supported = not (low <= 0.5 or (rule == "youden" and p.objective <= 0))
            table.append((one, result, low, high, supported))
            if not supported:
                typer.echo(
                    "warning: the state value does not separate correct from wrong answers on this data "
                    "(the AUROC's 95% interval reaches 0.5, or no positive Youden J); the proposed sigma is not "
                    "supported by it."
                )
            if save and stored_id and (supported or save_unsupported):
                try:
                    stored = Calibration(
                        metric=one, sigma=p.sigma, auroc=result.auroc, model_id=stored_id, task=ctask,
                        dataset=dataset if split is None else f"{dataset}:{split}", n=result.n,
                        details={"rule": rule, "method": names[0], "tpr": p.tpr, "fpr": p.fpr,
                                 "n_correct": result.n_correct, "n_wrong": result.n_wrong,
                                 "n_missing": result.n_missing, "limit": limit, "seed": seed, "supported": supported,
                                 "auroc_interval": [low, high]},
                    )
                except ValueError as exc:
                    console.print(f"[red]not stored:[/] {exc}")
                    raise typer.Exit(code=1) from exc
                where = save_calibration(stored, calibration_file)
                target = "sufficiency_threshold" if sufficiency else "sigma"
                typer.echo(f"stored for {target}='auto' (model {stored_id!r}): {where}")
            elif save and stored_id:
                typer.echo(f"{one}: not stored for sigma='auto' (pass --save-unsupported to store it anyway)")
        if len(table) > 1:
            typer.echo(f"\nstate values on {dataset}{':' + split if split else ''} (task {ctask!r}), best AUROC first:")
            typer.echo(f"{'metric':<14} {'AUROC':>6} {'95% interval':>15} {'sigma':>10}  separates")
            for one, result, low, high, supported in sorted(table, key=lambda t: -t[1].auroc):
                typer.echo(f"{one:<14} {result.auroc:6.3f} {low:7.3f} - {high:5.3f} {result.sigma:10.4g}  "
                           f"{'yes' if supported else 'no'}")
            usable = [t for t in table if t[4]]
            if usable:
                best = max(usable, key=lambda t: t[1].auroc)
                typer.echo(f"sigma='auto' with no metric set picks {best[0]} (sigma {best[1].sigma:.4g}) for this model "
                           f"and task" + ("" if save and stored_id else " once stored"))
            else:
                typer.echo("no state value separates right from wrong answers here: sigma='auto' has nothing to pick")


def _no_logprobs(context: str, text: str) -> list[float]:
    raise ValueError("this scorer gives no token log-probabilities: the evidence values and answer_prob need them")
