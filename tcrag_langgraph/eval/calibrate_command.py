"""``tcrag calibrate``: run one method over a calibration split, measure how well each state value
separates right from wrong answers (AUROC with a bootstrap interval) and propose, store and report
sigma for ``sigma="auto"`` (:mod:`tcrag_langgraph.eval.calibration`).

Example::

    tcrag calibrate --dataset pubmedqa --split trainval --metric cppl --limit 50 --out runs/calib
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, Optional

import typer

from ..agent.flags import EVAL_FLAGS
from .command_options import (ContextOpt, DatasetOpt, ProgressOpt, SeedOpt, _load_records, _method_options,
                              _served_settings, _split_methods, _state_value_names, console, refusing_user_errors)

__all__ = ["register", "RISK_LEVELS", "RISK_DELTA"]

#: the risks ``tcrag calibrate`` reports (and stores) the certified sigma and coverage for; a run may
#: ask for any other (TCRAGConfig(risk=...) recomputes it from the stored answers)
RISK_LEVELS = (0.05, 0.1, 0.2, 0.3)
#: their confidence: the guarantee holds with probability 1 - RISK_DELTA (TCRAGConfig.risk_delta's default)
RISK_DELTA = 0.1


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to ``app``."""

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
        progress: ProgressOpt = True,
        save: bool = typer.Option(True, "--save/--no-save", help="store the sigma for sigma='auto' (ask/eval/serve/build_graph)"),
        calibration_file: Optional[Path] = typer.Option(
            None, help="where to store it (default: $TCRAG_CACHE_DIR/calibration/<model-id>.<task>.<metric>.json)"),
        model_id: Optional[str] = typer.Option(None, help="the id to store it under (default: the model's own name)"),
        save_unsupported: bool = typer.Option(False, help="store the sigma even when the value does not separate "
                                              "correct from wrong answers (AUROC <= 0.5)"),
        method_options: Optional[str] = typer.Option(None, help="own options of a papers' method as JSON, "
                                                     "as for tcrag eval"),
        **options: Any,
    ) -> None:
        """State values of correct vs wrong answers on a dev split: AUROC and a proposed sigma, stored
        for --sigma auto.

        With --method crp-rag the value is CRP-RAG's path score (the perplexity that decides
        knowledge sufficiency), measured in a run that never abstains, and what is stored is its
        sufficiency threshold for "auto"."""
        from rich.progress import track

        from ..agent.spec import AgentParts, AgentSpec
        from ..core import answer_format
        from ..models.local import chat_model_id
        from ..monitor.calibration import Calibration, save_calibration
        from ..monitor.consistency import SamplingConsistencyScorer
        from ..monitor.state_values import GENERATION_VALUES, SAMPLED_VALUES, measure, scorer_score
        from ..monitor.combination import COMBINED_VALUE
        from ..monitor.risk import risk_threshold
        from .calibration import auroc_bootstrap_interval, auroc_interval, calibrate, confidence_fit
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
        cfg = EVAL_FLAGS.config(options).merged({
            "metric": metrics[0], "calibration_task": ctask,
            # the generation values are read off the replies as the runs go (there is no afterwards)
            **({"record_generation_values": True} if set(metrics) & set(GENERATION_VALUES) else {})})
        agent = EVAL_FLAGS.agent_values(options)  # model, tools, monitor: named as AgentSpec's fields
        spec = AgentSpec.create(method=names[0], config=cfg, **agent)
        chat = spec.generator()
        stored_id: Optional[str] = model_id
        if save and stored_id is None:
            try:
                stored_id = chat_model_id(chat)
            except ValueError as exc:  # reported after the measurement, which stays useful
                console.print(f"[yellow]{exc}: the result will not be stored (pass --model-id)[/]")
        if sufficiency and stored_id:
            from ..methods.crp_rag.calibration import SUFFICIENCY_SUFFIX

            stored_id += SUFFICIENCY_SUFFIX
        # calibrate measures state values whatever the method reads: log-prob values with the model's own
        # weights (or --scorer), sampled ones (consistency) by resampling the model
        state_scorer = (spec.monitor(chat, own=True) if set(metrics) - set(SAMPLED_VALUES) - set(GENERATION_VALUES)
                        else spec.monitor(chat))
        sampler = SamplingConsistencyScorer(chat) if set(metrics) & set(SAMPLED_VALUES) else None
        graphs = {names[0]: spec.build(AgentParts(chat, spec.tool_list(), state_scorer, cfg),
                                       options=own_options.get(names[0]))}
        settings = {"dataset": dataset, "split": split, "context": context, "limit": limit, "model": agent["model"],
                    "tools": agent["tools"], "scorer": agent["scorer"], **_served_settings(agent),
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
        combined: dict[str, float] = {}  # gen_combined, measured only on the half it was not fitted on
        combination = None
        if COMBINED_VALUE in metrics:
            try:
                combination, combined = _fit_combination_on_halves(rows, labels, seed=seed)
            except ValueError as exc:
                console.print(f"[red]cannot fit gen_combined:[/] {exc}")
                if len(metrics) == 1:
                    raise typer.Exit(code=1) from exc

        def score_with(query: str, text: str, *, metric: str, **options: Any) -> float:
            return scorer_score(sampler if metric in SAMPLED_VALUES else state_scorer, query, text, metric=metric,
                                **options)

        def value_of(one: str, row: dict[str, Any], scorer: Any) -> Optional[float]:
            """The state value ``one`` of a finished run's answer: the rule the stack machine applies
            (:func:`measure`), on the question, the answer and the evidence the run stood on."""
            if one == COMBINED_VALUE:
                return combined.get(row["id"])
            if one in GENERATION_VALUES:  # read off the reply that wrote the answer, during the run
                return (row.get("generation_values") or {}).get(one)
            record = by_id[row["id"]]
            text, choices = row["answer"], None
            fmt = answer_format_for(record)
            if one == "answer_prob":
                if not isinstance(fmt, tuple):
                    return None  # no list of allowed answers to weigh (open or multi-answer questions)
                choices, text = fmt, answer_format.fit(fmt, text)
            elif one in SAMPLED_VALUES and isinstance(fmt, tuple):
                choices = fmt  # the samples are asked for one of the allowed answers
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
            boot = auroc_bootstrap_interval(values, labels, seed=seed)
            typer.echo(f"AUROC 95% interval: {low:.3f} - {high:.3f} (Hanley-McNeil), {boot[0]:.3f} - {boot[1]:.3f} "
                       f"(bootstrap) ({result.n_correct} correct, {result.n_wrong} wrong)")
            supported = not (low <= 0.5 or (rule == "youden" and p.objective <= 0))
            table.append((one, result, low, high, supported))
            # validation with a stated risk (TCRAGConfig(risk=...)) reads these answers back; the levels
            # below are what this sample certifies (coverage: the share of answers validated)
            pairs = {"values": [v for v in values if v is not None],
                     "correct": [c for v, c in zip(values, labels) if v is not None]}
            levels = []
            for risk in RISK_LEVELS:
                found = risk_threshold(pairs["values"], pairs["correct"], risk=risk, delta=RISK_DELTA)
                levels.append({"risk": risk, "delta": RISK_DELTA, "sigma": found and found.sigma,
                               "coverage": found and round(found.coverage, 4), "errors": found and found.errors,
                               "accepted": found and found.accepted})
                typer.echo(f"risk {risk:g} (confidence {1 - RISK_DELTA:g}): " + (
                    f"sigma {found.sigma:.4g}, validates {found.accepted} of {found.n} (coverage {found.coverage:.2f}), "
                    f"{found.errors} of them wrong, error bound {found.bound:.3f}" if found else
                    "no threshold certified on this sample (nothing would be validated)"))
            fit = confidence_fit(values, labels)
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
                                 "auroc_interval": [low, high],
                                 "auroc_bootstrap_interval": list(boot), "pairs": pairs, "risk_levels": levels,
                                 "confidence": fit,
                                 **({"combination": combination.to_dict()} if one == COMBINED_VALUE else {})},
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

    command = refusing_user_errors(calibrate_command)
    command.__signature__ = EVAL_FLAGS.signature(calibrate_command)  # type: ignore[attr-defined]
    app.command("calibrate")(command)


def _fit_combination_on_halves(rows: list[dict[str, Any]], labels: list[bool], *, seed: int) -> tuple[Any, dict[str, float]]:
    """gen_combined's fit on one half of the calibration answers and its values on the other (question
    id -> value), where it is a fixed function: what the AUROC, the risk threshold and the confidence
    map are measured on. The fit the other way round is reported too: two disjoint samples."""
    from ..monitor.combination import fit_combination, split_halves
    from .calibration import auroc_interval, calibrate

    gen = [row.get("generation_values") or {} for row in rows]
    first, second = split_halves(len(rows), seed=seed)
    for fit_on, measure_on, name in ((second, first, "fitted on the second half, measured on the first"),
                                     (first, second, "fitted on the first half, measured on the second (stored)")):
        fitted = fit_combination([gen[i] for i in fit_on], [labels[i] for i in fit_on])
        values = {rows[i]["id"]: fitted.value(gen[i]) for i in measure_on}
        found = [(values[rows[i]["id"]], labels[i]) for i in measure_on if values[rows[i]["id"]] is not None]
        try:
            result = calibrate([v for v, _ in found], [c for _, c in found])
            low, high = auroc_interval(result.auroc, result.n_correct, result.n_wrong)
            typer.echo(f"gen_combined {name}: AUROC {result.auroc:.3f} ({low:.3f} - {high:.3f}), n={result.n}; "
                       f"weights {dict(zip(fitted.features, (round(c, 3) for c in fitted.coef)))}")
        except ValueError as exc:
            typer.echo(f"gen_combined {name}: no AUROC ({exc})")
    return fitted, values


def _no_logprobs(context: str, text: str) -> list[float]:
    raise ValueError("this scorer gives no token log-probabilities: the evidence values and answer_prob need them")
