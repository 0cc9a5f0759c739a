"""Run methods over a dataset, score every answer, and summarise accuracy against cost.

Results are appended to ``results.jsonl`` as each (question, method) finishes, so an interrupted
run resumes where it stopped: rows already in the file are skipped (a half-written last line is
dropped). ``run.json`` keeps the settings; resuming with different settings is refused rather
than mixing two experiments in one table. Stored rows are re-scored from their answers when a run
resumes, so every row is scored by the same metric code. Each (seed, method, question) pair seeds Python's,
NumPy's and (when loaded) torch's RNG, so a resumed run gives the same rows as an uninterrupted
one. Each row records ``code_version`` (:mod:`.provenance`): a resumed run that spans an edit of
the code or the prompts shows a "Code Versions" column in its table instead of mixing them silently.

Example:
    >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
    >>> from tcrag_langgraph.eval.datasets import QARecord
    >>> from tcrag_langgraph.methods.registry import build_methods
    >>> recs = [QARecord("q1", "Is aspirin an NSAID?", "yesno", ("yes",))]
    >>> methods = build_methods(["base"], model=FakeListChatModel(responses=["Yes."]))
    >>> rows = run_evaluation(recs, methods, progress=False)
    >>> rows[0]["correct"], rows[0]["method"]
    (True, 'base')

The summaries of the rows (tables, paired tests, plots) are :mod:`.summary`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from filelock import FileLock, Timeout

from ..core.result import RunResult
from .datasets import QARecord, answer_format_for, format_question, structured_letters
from .efficiency import UsageMeter, question_cost
from .metrics import bleu, extract_choice_letters, extract_yes_no_maybe, rouge_l_recall, squad_exact_match, token_f1
from .provenance import code_version

__all__ = [
    "score_answer",
    "run_evaluation",
    "read_results",
    "read_run_settings",
    "repeated_executed_calls",
    "RESULTS_FILE",
    "SETTINGS_FILE",
    "merge_runs",
    "SettingsMismatch",
    "RunFolderBusy",
]

RESULTS_FILE = "results.jsonl"
SETTINGS_FILE = "run.json"
#: Held by the process writing a run folder (``filelock``; the OS drops it when that process ends).
LOCK_FILE = ".writing.lock"


class SettingsMismatch(RuntimeError):
    """The output folder holds a run with other settings."""


class RunFolderBusy(SettingsMismatch):
    """Another process is writing the output folder (a second writer would interleave its rows)."""


# --------------------------------------------------------------------------------------------
# Scoring one answer
# --------------------------------------------------------------------------------------------


def score_answer(record: QARecord, answer: Optional[str], structured: Any = None) -> dict[str, Any]:
    """Scores of one answer: ``parsed`` and ``correct`` for mcq / yesno (unparseable = wrong),
    EM / F1 / BLEU-1 / BLEU-4 / ROUGE-L recall for open questions.

    ``structured`` is the run's ``structured_answer`` (the answer in the asked
    :func:`~tcrag_langgraph.eval.datasets.answer_format_for`, JSON form accepted): when a method
    gives one it is what is scored; the answer text is parsed only when it gives none.

    Example:
        >>> r = QARecord("1", "q", "mcq", ("A", "C"), options={"A": "x", "B": "y", "C": "z"})
        >>> score_answer(r, "Answer: C, A")
        {'parsed': 'AC', 'correct': True}
        >>> score_answer(r, None)
        {'parsed': None, 'correct': False}
        >>> score_answer(r, "no letter here", structured={"letters": ["C", "A"]})
        {'parsed': 'AC', 'correct': True}
    """
    if record.task == "mcq":
        found = structured_letters(structured) if structured is not None else None
        if found is not None and not found <= set(record.letters):
            found = None  # not an answer to this question: parse the text instead
        if found is None:
            found = extract_choice_letters(answer, letters=record.letters, options=record.options)
        parsed = "".join(sorted(found)) if found else None
        return {"parsed": parsed, "correct": found is not None and found == frozenset(record.answers)}
    if record.task == "yesno":
        label = structured.casefold() if isinstance(structured, str) and structured.casefold() in ("yes", "no", "maybe") else None
        label = label or extract_yes_no_maybe(answer)
        return {"parsed": label, "correct": label is not None and label == record.answers[0]}
    refs = list(record.answers)
    return {
        "parsed": answer,
        "em": float(squad_exact_match(answer, refs)),
        "f1": token_f1(answer, refs),
        "bleu1": bleu(answer, refs, order=1),
        "bleu4": bleu(answer, refs, order=4),
        "rouge_l_recall": rouge_l_recall(answer, refs),
    }


# --------------------------------------------------------------------------------------------
# Results file
# --------------------------------------------------------------------------------------------


def read_results(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict[str, Any]]:
    """Rows of a ``results.jsonl``. A broken *last* line (an interrupted write) is dropped, and
    with ``repair=True`` cut from the file; a broken line elsewhere is an error."""
    file = Path(path)
    if not file.exists():
        return []
    data = file.read_bytes()
    lines = data.split(b"\n")
    rows: list[dict[str, Any]] = []
    offset = 0
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if raw.strip():
            try:
                rows.append(json.loads(raw.decode("utf-8")))
            except (json.JSONDecodeError, UnicodeDecodeError):
                if not last:
                    raise ValueError(f"{file}:{i + 1}: corrupt results line") from None
                if repair:
                    with file.open("r+b") as fh:
                        fh.truncate(offset)
                break
            if last and repair:  # complete row without its newline: finish the line
                with file.open("ab") as fh:
                    fh.write(b"\n")
        offset += len(raw) + 1
    return rows


def _check_settings(out_dir: Path, settings: Mapping[str, Any]) -> None:
    file = out_dir / SETTINGS_FILE
    wanted = json.loads(json.dumps(settings, sort_keys=True, default=str))
    if file.exists():
        saved = json.loads(file.read_text(encoding="utf-8"))
        if saved != wanted:
            diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
            raise SettingsMismatch(
                f"{out_dir} holds a run with other settings ({', '.join(diff)}); use another --out folder"
            )
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n", encoding="utf-8")


#: Settings that may differ between runs merged into one table: they apply to some methods only
#: (a reply cache replays a call with the same reply, so it changes times, not results).
MERGEABLE_SETTINGS = frozenset({"methods", "sigmas", "scorer", "method_options", "reply_cache"})
#: ... and the questions: runs of different sizes from the same draw (``--limit 100`` and ``200`` with
#: one seed) are compared on the questions both hold, as ``common`` compares a stopped run.
QUESTION_SETTINGS = frozenset({"ids", "limit"})


def read_run_settings(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings (``run.json``) of a ``tcrag eval`` run folder; a missing folder or run is a ``ValueError``."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"{path}: no such folder")
    if not (path / SETTINGS_FILE).exists():
        raise ValueError(f"{path} holds no run ({SETTINGS_FILE} missing)")
    return json.loads((path / SETTINGS_FILE).read_text(encoding="utf-8"))


def merge_runs(out_dirs: Sequence[str | os.PathLike[str]], *, common: bool = True) -> list[dict[str, Any]]:
    """The rows of several runs of the same questions and settings (different methods, e.g. one run
    started later with a calibrated sigma), for one table.

    ``common=True`` keeps only the questions every method finished, so a stopped or still-running
    run, or a run of fewer questions from the same draw, is compared on equal terms. Runs whose
    settings differ beyond :data:`MERGEABLE_SETTINGS` and :data:`QUESTION_SETTINGS` (the latter
    only with ``common``), or that both hold the same method, are refused with a ``ValueError``
    naming what differs.
    """
    if not out_dirs:
        raise ValueError("no run folders given")
    rows: list[dict[str, Any]] = []
    first: Optional[dict[str, Any]] = None
    seen_methods: dict[str, Path] = {}
    for raw in out_dirs:
        folder = Path(raw)
        settings = read_run_settings(folder)
        free = MERGEABLE_SETTINGS | (QUESTION_SETTINGS if common else frozenset())
        comparable = {k: v for k, v in settings.items() if k not in free}
        if first is None:
            first = comparable
        elif comparable != first:
            diff = sorted(k for k in set(first) | set(comparable) if first.get(k) != comparable.get(k))
            hint = " (other questions: compare them with common questions, without --all)" \
                if set(diff) <= QUESTION_SETTINGS else ""
            raise ValueError(f"{folder} was run with other settings ({', '.join(diff)}) than {out_dirs[0]}{hint}")
        folder_rows = read_results(folder / RESULTS_FILE)
        for method in {r["method"] for r in folder_rows}:
            if method in seen_methods:
                raise ValueError(f"method {method!r} is in both {seen_methods[method]} and {folder}")
            seen_methods[method] = folder
        rows.extend(folder_rows)
    if common:
        methods = {r["method"] for r in rows}
        done: dict[str, set[str]] = {}
        for r in rows:
            done.setdefault(r["id"], set()).add(r["method"])
        rows = [r for r in rows if done[r["id"]] == methods]
    return rows


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def _seed_everything(seed: int, method: str, record_id: str) -> int:
    value = zlib.crc32(f"{seed}:{method}:{record_id}".encode("utf-8"))
    random.seed(value)
    try:
        import numpy as np

        np.random.seed(value)
    except ImportError:  # numpy is optional here
        pass
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(value)
    return value


def _final_value(output: Mapping[str, Any]) -> Optional[float]:
    """The last state value the monitor really measured (``raw`` in ``state_history``).

    The graph's ``state_value`` can be the initial "large value" (never measured) or a Thought's
    value clamped to sigma, so neither is reported as a measurement.
    """
    for entry in reversed(output.get("state_history") or []):
        raw = entry.get("raw") if isinstance(entry, Mapping) else None
        if raw is not None:
            return float(raw)
    return None


def _json_ready(value: Any) -> Any:
    """A structured answer as stored in ``results.jsonl`` (a Pydantic model as its JSON object)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


#: Characters of a step's text and detail a result row keeps (the whole text is the run's trace).
TRACE_TEXT_CHARS = 160


def compact_trace(trace: Optional[Iterable[Any]]) -> list[dict[str, Any]]:
    """A run's trace events as short dicts for a result row: step, action, op, state value, the first
    :data:`TRACE_TEXT_CHARS` characters of the step's text, and its detail (:func:`_short_detail`;
    observations are in the row's ``evidence``)."""
    rows = []
    for event in trace or ():
        row: dict[str, Any] = {"step": event.step, "action": event.action, "op": event.op,
                               "content": (event.content or "")[:TRACE_TEXT_CHARS]}
        if event.state_value is not None:
            row["value"] = round(float(event.state_value), 4)
        if event.detail:
            row["detail"] = _short_detail(event.detail)
        rows.append(row)
    return rows


def _short_detail(detail: str) -> Any:
    """A step's detail for a result row: a JSON object (a tool call's) with each text value cut to
    :data:`TRACE_TEXT_CHARS` characters, so a long input never hides the ``error`` after it; any
    other text cut as a whole."""
    try:
        info = json.loads(detail)
    except (TypeError, ValueError):
        info = None
    if not isinstance(info, dict):
        return detail[:TRACE_TEXT_CHARS]
    return {k: v[:TRACE_TEXT_CHARS] if isinstance(v, str) else v for k, v in info.items()}


def repeated_executed_calls(trace: Optional[Iterable[Any]]) -> int:
    """Tool calls that were *run* although an identical call (same tool, normalised input) was run
    before in the same question, read from the trace's Tool_Use events (calls refused as repeated
    are not run and not counted here: the graph counts them in ``repeated_tool_calls``).

    Identity is the graph's own rule (:func:`tcrag_langgraph.methods.tcrag.transitions.repeated_call`), applied
    to every earlier call, including ones a Backtrack or Summary has since taken off the stack.
    """
    from ..core.state import Action, Frame, ToolCallRecord
    from ..methods.tcrag.transitions import repeated_call

    earlier: list[Frame] = []
    repeats = 0
    for event in trace or []:
        action = event.get("action") if isinstance(event, Mapping) else getattr(event, "action", None)
        detail = event.get("detail") if isinstance(event, Mapping) else getattr(event, "detail", None)
        if action != "Tool_Use" or not detail:
            continue
        try:
            info = json.loads(detail)
        except (TypeError, ValueError):
            continue
        if not isinstance(info, Mapping) or "tool" not in info or info.get("error") == "repeated_call":
            continue
        tool, tool_input = str(info["tool"]), info.get("input")
        if repeated_call(earlier, tool, tool_input) is not None:
            repeats += 1
        earlier.append(Frame(action=Action.TOOL_USE, tool_call=ToolCallRecord(tool=tool, tool_input=tool_input)))
    return repeats


def _run_one(
    method: str,
    graph: Any,
    record: QARecord,
    *,
    seed: int,
    include_context: bool,
    language: str,
    poison: Any,
) -> dict[str, Any]:
    question = format_question(record, include_context=include_context, language=language)  # type: ignore[arg-type]
    meter = UsageMeter()
    if poison is not None:
        poison.begin(record)
    _seed_everything(seed, method, record.id)
    error = None
    fmt = answer_format_for(record)
    start = time.perf_counter()
    try:
        # Every method gets the same answer format per question (the stack machine and the direct
        # methods read it from the run context; a method that does not know it ignores it).
        output = graph.invoke({"question": question}, config={"callbacks": [meter], "recursion_limit": 10_000},
                              context={"answer_format": fmt} if fmt is not None else None)
    except Exception as exc:  # one broken question must not end the whole evaluation
        output = {"answer": None, "halt_reason": "exception"}
        error = f"{type(exc).__name__}: {exc}"
    wall = time.perf_counter() - start
    cost = question_cost(output, meter, wall_time_s=wall)
    result = RunResult.from_state(output)  # every method's final state read the one way
    answer = result.answer
    structured = _json_ready(result.structured_answer)
    row: dict[str, Any] = {
        "method": method,
        "id": record.id,
        "task": record.task,
        "gold": list(record.answers),
        "answer": answer,
        "structured_answer": structured,
        **score_answer(record, answer, structured),
        "validated": result.answer_validated,
        "halt_reason": result.halt_reason,
        "state_value": _final_value(output),
        "metric": result.metric,
        "sigma": result.sigma,
        # what the answer stood on: tcrag calibrate measures the evidence-conditioned state values on it
        "evidence": result.evidence,
        # where the run's tokens went, by its own count (eval.token_split)
        "token_split": dict(result.token_usage),
        # the answer's values read off the reply that wrote it (gen_*; empty unless the run asked for them)
        **({"generation_values": result.answer_generation_values} if result.answer_generation_values else {}),
        "error": error or result.error,
        "seed": seed,
        "repeated_executed_calls": repeated_executed_calls(result.trace),
        # Conclusions the state monitor rejected, in order (what a rejection changed: eval.rejections)
        "rejected": [e.content for e in result.trace if e.action == "Conclusion" and e.op == "reject"],
        "repeated_refused_calls": result.repeated_tool_calls,
        # each step, in short: why a run took the steps it did, read after the run (eval.rejections)
        "trace": compact_trace(result.trace),
        **cost.to_dict(),
        # which code and prompts made the row (a resumed run may span an edit: eval.provenance)
        "code_version": code_version(),
    }
    if poison is not None:
        row["poisoned"] = bool(poison.poisoned)
        row["poison_first_call_failed"] = poison.first_call_failed
    return row


@contextlib.contextmanager
def _writer_lock(out_dir: Optional[str | os.PathLike[str]]) -> Iterator[None]:
    """Hold ``out_dir``'s lock file for the run (nothing without a folder); RunFolderBusy if another
    process holds it. The OS drops the lock when its holder ends, killed or not."""
    if out_dir is None:
        yield
        return
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunFolderBusy(f"{folder} is being written by another tcrag eval process; wait for it to end "
                            "or give another output folder") from None
    try:
        yield
    finally:
        lock.release()


def run_evaluation(
    records: Sequence[QARecord],
    methods: Mapping[str, Any],
    *,
    out_dir: Optional[str | os.PathLike[str]] = None,
    settings: Optional[Mapping[str, Any]] = None,
    seed: int = 0,
    include_context: bool = True,
    language: str = "en",
    poison: Any = None,
    progress: bool = True,
    on_row: Optional[Callable[[dict[str, Any]], None]] = None,
    concurrency: int = 1,
) -> list[dict[str, Any]]:
    """Run every method on every record (question-major) and return all result rows.

    With ``out_dir`` rows are appended to ``results.jsonl`` one by one and rows already there
    are reused (resume); ``settings`` is saved to / checked against ``run.json``.

    ``concurrency`` runs that many (question, method) runs at once in threads, for served models
    whose server batches them (a local model generates one call at a time: no gain, no harm). Rows
    are written in the same order as one at a time, so a run resumes the same way and greedy
    results are the same for any ``concurrency``; sampled ones are reproducible only at 1 (the
    per-question seeds are process-global). The noise attack holds per-question state: with
    ``poison`` it must be 1. A row's ``wall_time_s`` includes waiting for the other runs.

    One process at a time writes a folder: a second run on a folder another process is writing is
    refused with :class:`RunFolderBusy` (a lock file, released when the writer exits or dies).
    """
    # Bad arguments are refused before the lock, which creates the folder.
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
    if poison is not None and concurrency > 1:
        raise ValueError("the noise attack keeps per-question state: run it with concurrency 1")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError("record ids must be unique")
    with _writer_lock(out_dir):
        done: dict[tuple[str, str], dict[str, Any]] = {}
        results_file: Optional[Path] = None
        if out_dir is not None:
            out = Path(out_dir)
            _check_settings(out, {**(settings or {}), "methods": list(methods), "seed": seed, "ids": ids})
            results_file = out / RESULTS_FILE
            by_id = {r.id: r for r in records}
            for row in read_results(results_file, repair=True):
                # Scores are derived from the stored answer: recompute them so that a resumed run is
                # scored by the current metric code, like the rows it adds.
                if row.get("id") in by_id:
                    row.update(score_answer(by_id[row["id"]], row.get("answer"), row.get("structured_answer")))
                done[(row["method"], row["id"])] = row
        todo = [(r, m) for r in records for m in methods if (m, r.id) not in done]

        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not progress,
            transient=False,
        )
        new_rows: dict[tuple[str, str], dict[str, Any]] = {}
        with bar:
            task = bar.add_task("evaluating", total=len(records) * len(methods), completed=len(done))
            handle = results_file.open("a", encoding="utf-8") if results_file is not None else None

            def run(item: tuple[QARecord, str]) -> dict[str, Any]:
                record, method = item
                return _run_one(method, methods[method], record, seed=seed, include_context=include_context,
                                language=language, poison=poison)

            def keep(item: tuple[QARecord, str], row: dict[str, Any]) -> None:
                record, method = item
                if handle is not None:
                    handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                new_rows[(method, record.id)] = row
                if on_row is not None:
                    on_row(row)

            try:
                if concurrency == 1:
                    for item in todo:
                        bar.update(task, description=f"{item[1]} {item[0].id}")
                        keep(item, run(item))
                        bar.advance(task)
                else:
                    from concurrent.futures import ThreadPoolExecutor

                    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tcrag-eval") as pool:
                        futures = [pool.submit(run, item) for item in todo]
                        bar.update(task, description=f"{concurrency} runs at a time")
                        # kept in submission order: the file reads as a run one at a time would write it
                        for item, future in zip(todo, futures):
                            keep(item, future.result())
                            bar.advance(task)
            finally:
                if handle is not None:
                    handle.close()
        merged = {**done, **new_rows}
        return [merged[(m, r.id)] for r in records for m in methods if (m, r.id) in merged]
