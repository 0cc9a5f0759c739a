"""``tcrag eval``, ``tcrag summarize`` and ``tcrag calibrate`` (added to the main ``tcrag`` app by
:func:`register`; calibrate's command is :mod:`.calibrate_command`, their shared options
:mod:`.command_options`).

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

from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError

from ..agent.flags import EVAL_FLAGS
from . import calibrate_command
from .command_options import (ContextOpt, DatasetOpt, ProgressOpt, SeedOpt, _load_records, _method_options,
                              _served_settings, _split_methods, console, refusing_user_errors)

__all__ = ["register"]


def _sigma_option(value: str, metric: str, model: Any, task: Optional[str] = None, hint: Optional[str] = None) -> float:
    """A sigma option (``--sigma-cppl``, ``--sigma-uct``, ``--sigma METRIC=VALUE``): a number, or
    ``auto`` for the sigma stored for this model (on ``task``) by ``tcrag calibrate`` (resolved once
    here, so every question and the saved settings use the number). Validated by
    :class:`TCRAGConfig`, the one home of what a sigma may be."""
    from ..agent.spec import resolve_auto_sigma
    from ..core.config import TCRAGConfig

    flag = hint or f"--sigma-{metric}"
    try:
        cfg = TCRAGConfig(metric=metric, sigma=value, calibration_task=task)
    except ValidationError as exc:  # the first problem, in pydantic's own words, without its dump
        raise typer.BadParameter(exc.errors()[0]["msg"].removeprefix("Value error, "), param_hint=flag) from None
    return float(resolve_auto_sigma(cfg, model, flag=flag).effective_sigma)


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


def _records_of_run(folder: Path) -> Optional[list[Any]]:
    """The questions a run folder was made from, loaded again from the settings in its run.json
    (None, with a line saying why, when the dataset cannot be loaded here)."""
    from .runner import read_run_settings

    settings = read_run_settings(folder)
    try:  # as tcrag eval loaded them (--fields is kept as the JSON text given)
        return _load_records(settings["dataset"], settings.get("split"), bool(settings.get("context")),
                             bool(settings.get("long_answers")), settings.get("fields"), settings.get("task"),
                             settings.get("answer_index_base"))
    except (typer.BadParameter, KeyError, OSError) as exc:
        why = exc.message if isinstance(exc, typer.BadParameter) else exc
        typer.echo(f"(rejections not counted: the run's dataset cannot be loaded here: {why})", err=True)
        return None


def _report(heading: str, table: str, out: Optional[Path], filename: str) -> None:
    """Print a table under its heading and, with ``out``, write it to ``out/filename``; nothing when empty."""
    if not table:
        return
    typer.echo(f"{heading}\n\n{table}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / filename).write_text(f"{heading}\n\n{table}", encoding="utf-8")


def _report_rejections(rows: list[dict[str, Any]], records: Optional[list[Any]], out: Optional[Path],
                       labels: dict[str, str]) -> None:
    """What the state monitor's rejections changed (eval.rejections): rejections.md; nothing when no
    method rejected anything."""
    from .rejections import rejection_effects, rejections_markdown

    if records is not None:
        _report("State-monitor rejections: the first rejected Conclusion against the final answer",
                rejections_markdown(rejection_effects(rows, records), labels), out, "rejections.md")


def _report_token_split(rows: list[dict[str, Any]], out: Optional[Path], labels: dict[str, str]) -> None:
    """Where each method's tokens went per question (eval.token_split): tokens.md."""
    from .token_split import token_split, token_split_markdown

    _report("Where the tokens go, per question (the package's token count)",
            token_split_markdown(token_split(rows), labels), out, "tokens.md")


def _report_risk_coverage(rows: list[dict[str, Any]], out: Optional[Path], labels: dict[str, str]) -> None:
    """How well each state value ranks each method's answers, and the validated answers' error rate
    (eval.risk_coverage): risk_coverage.md and risk_coverage.png."""
    from .risk_coverage import plot_risk_coverage, risk_coverage_markdown

    _report("Risk and coverage (lower AURC: a state value that ranks the answers better)",
            risk_coverage_markdown(rows, labels), out, "risk_coverage.md")
    if out is not None:
        plot_risk_coverage(rows, out / "risk_coverage.png", labels=labels)


def _warn_mixed_code(rows: list[dict[str, Any]]) -> None:
    """Say so when one method's rows came from different code (a run resumed after an edit)."""
    from .provenance import mixed_code_versions

    mixed = mixed_code_versions(rows)
    if mixed:
        shown = "; ".join(f"{m}: " + ", ".join(f"{n} rows by {v}" for v, n in counts.items())
                          for m, counts in mixed.items())
        typer.echo(f"warning: rows made by different versions of the code or prompts ({shown}); "
                   "rerun into a new --out folder for a table made by one", err=True)


def register(app: typer.Typer) -> None:
    """Add ``eval``, ``summarize`` and ``calibrate`` (:mod:`.calibrate_command`) to ``app``."""
    calibrate_command.register(app)

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
        exclude_eval_docs: bool = typer.Option(False, help="docs tool: drop the evaluated questions' own abstracts"),
        sigma_cppl: Optional[str] = typer.Option(None, help="sigma for cppl: a number, or auto (the model's "
                                                 "stored calibration, tcrag calibrate); default: paper's 10"),
        sigma_uct: Optional[str] = typer.Option(None, help="sigma for uct: a number or auto; default: paper's 20"),
        sigma: list[str] = typer.Option([], "--sigma", metavar="METRIC=VALUE", help="sigma of any state value "
                                        "(cppl_evidence, uct_evidence, answer_prob, ...): a number or auto; "
                                        "repeatable"),
        calibration_task: Optional[str] = typer.Option(None, help="the task whose stored calibration 'auto' "
                                                       "reads (default: the dataset: pubmedqa, medmcqa, or the "
                                                       "JSONL file's name)"),
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
        **options: Any,
    ) -> None:
        """Evaluate methods on a dataset: accuracy and cost per method (paper Tables 1, 2, 5)."""
        from ..agent.spec import AgentSpec
        from ..methods.registry import METHODS
        from .datasets import answer_format_for, sample_records, task_name
        from .noise import NoiseBank, PoisonController, poison_tools
        from .runner import SettingsMismatch, run_evaluation
        from .summary import summarize, summary_markdown, table_rows, write_summary

        names = _split_methods(method)
        own_options = _method_options(method_options, names)
        if attack is not None and attack not in ("structural", "partial"):
            raise typer.BadParameter("--attack must be structural or partial")
        if attack is not None and concurrency > 1:
            raise typer.BadParameter("--attack keeps per-question state: run it with --concurrency 1")
        if noise not in ("irrelevant", "relevant", "mixed"):
            raise typer.BadParameter("--noise must be irrelevant, relevant or mixed")
        run_options = EVAL_FLAGS.config(options)
        agent = EVAL_FLAGS.agent_values(options)  # model, tools, monitor: named as AgentSpec's fields
        if reply_cache and run_options.temperature > 0:
            raise typer.BadParameter("--reply-cache replays one reply per prompt: it needs greedy decoding "
                                     f"(--temperature 0), not {run_options.temperature}")
        all_records = _load_records(dataset, split, context, long_answers, fields, task, answer_index_base)
        records = sample_records(all_records, limit=limit, seed=seed if limit else None)
        ctask = calibration_task or task_name(dataset)
        # The runs' one answer format (every run still passes its own): a choice made when the graphs
        # are built, sigma="auto" picking answer_prob, must see the answers every run will declare.
        formats = {answer_format_for(r) for r in records}
        shared = next(iter(formats)) if len(formats) == 1 else None
        cfg = run_options.merged({"calibration_task": ctask, **({"answer_format": shared} if isinstance(shared, tuple)
                                                               else {})})
        sigma_given = {**_sigma_pairs(sigma), **{k: v for k, v in (("cppl", sigma_cppl), ("uct", sigma_uct)) if v}}
        spec = AgentSpec.create(method=names[0], config=cfg, **agent,
                                exclude_doc_ids=tuple(r.id for r in records) if exclude_eval_docs else ())
        parts = spec.assemble(names, share_monitor=True)
        if reply_cache:
            from .reply_cache import REPLY_CACHE_FILE, ReplyCache

            parts.model.cache = ReplyCache(out / REPLY_CACHE_FILE)
        controller = None
        if attack is not None:
            if not parts.tools:
                raise typer.BadParameter("--attack needs tools (the first retrieval is what gets poisoned)")
            bank = NoiseBank.from_records(records, pool=all_records)
            controller = PoisonController(bank, mode=attack, kind=noise, seed=seed,  # type: ignore[arg-type]
                                          max_tokens=cfg.max_observation_tokens)
            parts = parts._replace(tools=poison_tools(parts.tools, controller))
        sigmas = {k: _sigma_option(v, k, parts.model, ctask, hint="--sigma" if k not in ("cppl", "uct") else None)
                  for k, v in sigma_given.items()}
        documents = _indexed_documents(names, agent["tools"], records, exclude_eval_docs)
        graphs = {n: spec.build(parts, method=n, sigmas=sigmas, documents=documents, options=own_options.get(n))
                  for n in names}
        settings = {
            "dataset": dataset, "split": split, "context": context, "long_answers": long_answers, "limit": limit,
            "model": agent["model"], "tools": agent["tools"], "exclude_eval_docs": exclude_eval_docs,
            "scorer": agent["scorer"], **_served_settings(agent), "sigmas": sigmas,
            "config": cfg.model_dump(mode="json"), "attack": attack,
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
        _report_token_split(rows, out, labels={n: METHODS[n].label for n in names})
        _report_risk_coverage(rows, out, labels={n: METHODS[n].label for n in names})
        _warn_mixed_code(rows)
        console.print(f"results: {out / 'results.jsonl'}; summary: {paths['markdown']}, {paths['csv']}"
                      + (f"; plot: {paths['plot']}" if "plot" in paths else ""))

    command = refusing_user_errors(eval_command)
    command.__signature__ = EVAL_FLAGS.signature(eval_command)  # type: ignore[attr-defined]
    app.command("eval")(command)

    @app.command("summarize")
    def summarize_command(
        runs: list[Path] = typer.Argument(..., help="run folders of tcrag eval (same questions and settings)"),
        common: bool = typer.Option(True, "--common/--all", help="only the questions every method finished"),
        out: Optional[Path] = typer.Option(None, help="also write summary.md / summary.csv / the plot here"),
    ) -> None:
        """One table from one or more tcrag eval runs (e.g. a stopped run, or methods run apart)."""
        from ..methods.registry import METHODS
        from .runner import merge_runs
        from .summary import summarize, summary_markdown, table_rows, write_summary

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
        _report_token_split(rows, out, labels=labels)
        _report_risk_coverage(rows, out, labels=labels)
        _warn_mixed_code(rows)
        if out is not None:
            paths = write_summary(summary, out)
            console.print(f"summary: {paths['markdown']}, {paths['csv']}")

    @app.command("compare")
    def compare_command(
        before: Path = typer.Argument(..., help="run folder of tcrag eval: the settings before"),
        after: Path = typer.Argument(..., help="run folder of the same questions under other settings"),
    ) -> None:
        """Each method before and after a change of settings, paired on the questions both runs finished
        (McNemar's exact test, calls, tokens, refused repeats)."""
        from ..methods.registry import METHODS
        from .compare import compare_markdown, compare_runs

        try:
            changed, changes = compare_runs(before, after)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="BEFORE AFTER") from exc
        typer.echo(compare_markdown(changed, changes, labels={name: spec.label for name, spec in METHODS.items()}))
