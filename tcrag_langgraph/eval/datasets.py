"""Evaluation datasets as typed records: PubMedQA-L, MedMCQA dev and any JSONL you bring.

Nothing is ever downloaded. Loaders take a path; without one they look in ``$TCRAG_DATA_DIR``,
then in ``../shared/data`` (relative to the working directory and to the repository).

Formats (checked against the files in ``shared/data``):

* **PubMedQA-L** (``pubmedqa/ori_pqal.json``): 1000 expert-labelled questions keyed by PubMed id,
  each with ``QUESTION``, ``CONTEXTS`` (list of abstract sections, labelled by ``LABELS``),
  ``LONG_ANSWER`` and ``final_decision`` in yes/no/maybe. ``test_ground_truth.json`` maps the 500
  test ids to their labels; the other 500 are the official train/dev pool (``split="trainval"``,
  use it for calibration so sigma is never tuned on the test split).
* **MedMCQA dev** (``medmcqa/dev.jsonl``): 4183 four-option questions ``opa..opd``. ``cop`` is
  **1-based** here (1 = ``opa`` ... 4 = ``opd``; values are 1..4 and the 1076 explanations that
  start with "Ans. a/b/c/d" all agree with ``cop``), unlike the 0-based Hugging Face copy.
  ``choice_type == "multi"`` is a question style, not a multi-answer question: every question
  has exactly one correct option. The explanation ``exp`` names the answer, so it is kept in
  metadata and never used as context.

Example:
    >>> rec = QARecord(id="q1", question="Which vessel leaves the left ventricle?", task="mcq",
    ...                answers=("B",), options={"A": "Vena cava", "B": "Aorta"})
    >>> print(format_question(rec))
    Which vessel leaves the left ventricle?
    Options:
    A. Vena cava
    B. Aorta
    Answer with the letter of the correct option.

Why one module of this size: the loaders of the supported datasets and the question formatting and
answer formats they share.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Optional, Sequence

from pydantic import BaseModel, Field, create_model

from ..core.answer_format import AnswerFormat
from .metrics import parse_gold_letters

__all__ = [
    "TaskType",
    "QARecord",
    "DatasetError",
    "default_data_dir",
    "load_pubmedqa",
    "load_medmcqa",
    "load_jsonl",
    "load_dataset",
    "sample_records",
    "format_question",
    "is_multi_answer",
    "answer_format_for",
    "structured_letters",
    "DATA_DIR_ENV",
]

TaskType = Literal["mcq", "yesno", "open"]
DATA_DIR_ENV = "TCRAG_DATA_DIR"
_LETTERS = "ABCDEFGHIJ"
_YNM = ("yes", "no", "maybe")


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class QARecord:
    """One evaluation question.

    ``answers`` holds gold option letters for ``mcq`` (several for multi-answer questions), one
    of yes/no/maybe for ``yesno``, or reference texts for ``open``. ``options`` maps letters to
    option texts in display order (empty unless ``mcq``).
    """

    id: str
    question: str
    task: TaskType
    answers: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)
    context: Optional[str] = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in ("mcq", "yesno", "open"):
            raise DatasetError(f"record {self.id}: unknown task {self.task!r}")
        if not self.answers:
            raise DatasetError(f"record {self.id}: no gold answer")
        if self.task == "mcq":
            if len(self.options) < 2:
                raise DatasetError(f"record {self.id}: a multiple-choice question needs >= 2 options")
            bad = [a for a in self.answers if a not in self.options]
            if bad:
                raise DatasetError(f"record {self.id}: answer letters {bad} are not options {list(self.options)}")
        if self.task == "yesno" and any(a not in _YNM for a in self.answers):
            raise DatasetError(f"record {self.id}: yes/no/maybe answer expected, got {self.answers}")

    @property
    def letters(self) -> str:
        """The option letters, e.g. ``"ABCD"``."""
        return "".join(self.options)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["answers"] = list(self.answers)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "QARecord":
        values = dict(data)
        values["answers"] = tuple(values.get("answers") or ())
        return cls(**values)


def format_question(record: QARecord, *, include_context: bool = True, language: Literal["en", "zh"] = "en") -> str:
    """The question text handed to every method (same wording for all, so results compare).

    Example:
        >>> r = QARecord(id="1", question="Is aspirin an NSAID?", task="yesno", answers=("yes",))
        >>> format_question(r).splitlines()[-1]
        'Answer with yes, no or maybe.'
    """
    zh = language == "zh"
    parts: list[str] = []
    if include_context and record.context:
        parts.append(("背景：" if zh else "Context: ") + record.context)
    parts.append(record.question)
    if record.task == "mcq":
        parts.append("选项：" if zh else "Options:")
        parts.extend(f"{k}. {v}" for k, v in record.options.items())
        multi = is_multi_answer(record)
        if zh:
            parts.append("请给出所有正确选项的字母。" if multi else "请给出正确选项的字母。")
        else:
            parts.append(
                "Answer with the letters of all correct options." if multi else "Answer with the letter of the correct option."
            )
    elif record.task == "yesno":
        parts.append("请回答：是(yes)、否(no)或可能(maybe)。" if zh else "Answer with yes, no or maybe.")
    return "\n".join(parts)


def is_multi_answer(record: QARecord) -> bool:
    """Whether a multiple-choice question asks for all correct options (the question text says so)."""
    return record.task == "mcq" and (len(record.answers) > 1 or record.metadata.get("multi_answer") is True)


@lru_cache(maxsize=None)
def _options_model(letters: str) -> type[BaseModel]:
    allowed = Literal[tuple(letters)]  # type: ignore[valid-type]
    return create_model("ChosenOptions", __doc__="The letters of all correct options.",
                        letters=(list[allowed], Field(min_length=1)))  # type: ignore[valid-type]


def answer_format_for(record: QARecord) -> Optional[AnswerFormat]:
    """The answer format every method is run with for ``record`` (``TCRAGConfig.answer_format``).

    yes/no questions: ``("yes", "no", "maybe")``; single-answer multiple choice: the option letters;
    multi-answer multiple choice (:func:`is_multi_answer`, which the question text also states): a
    Pydantic model ``{"letters": [...]}`` with one or more of the option letters, since a set of
    choices can name only one; open questions: ``None`` (free text).

    Example:
        >>> answer_format_for(QARecord("1", "q", "mcq", ("B",), options={"A": "x", "B": "y"}))
        ('A', 'B')
        >>> fmt = answer_format_for(QARecord("2", "q", "mcq", ("A", "B"), options={"A": "x", "B": "y", "C": "z"}))
        >>> sorted(structured_letters(fmt.model_validate({"letters": ["B", "A"]})))
        ['A', 'B']
    """
    if record.task == "yesno":
        return _YNM
    if record.task == "mcq":
        return _options_model(record.letters) if is_multi_answer(record) else tuple(record.options)
    return None


def structured_letters(value: Any) -> Optional[frozenset[str]]:
    """Option letters of a structured MCQ answer: a choice (``"B"``), a :func:`answer_format_for`
    model instance, or its JSON form (``{"letters": [...]}``); ``None`` for anything else."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, str) and value.strip():
        return frozenset({value.strip()})
    if isinstance(value, Mapping) and isinstance(value.get("letters"), list) and value["letters"]:
        return frozenset(str(v) for v in value["letters"])
    return None


# --------------------------------------------------------------------------------------------
# Locating data
# --------------------------------------------------------------------------------------------


def default_data_dir() -> Path:
    """``$TCRAG_DATA_DIR``, else the first existing ``../shared/data`` (from cwd, then repo).

    Raises :class:`DatasetError` naming the places tried.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DatasetError(f"${DATA_DIR_ENV}={env} is not a directory")
        return path
    repo = Path(__file__).resolve().parents[2]
    candidates = [Path.cwd() / ".." / "shared" / "data", repo / ".." / "shared" / "data", Path.cwd() / "shared" / "data"]
    for cand in candidates:
        if cand.is_dir():
            return cand.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise DatasetError(f"no data directory: set ${DATA_DIR_ENV} or pass a path (tried {tried})")


def _resolve(path: Optional[str | os.PathLike[str]], subdir: str, filename: str) -> Path:
    base = Path(path) if path is not None else default_data_dir() / subdir
    if base.is_dir():
        for cand in (base / filename, base / subdir / filename):
            if cand.is_file():
                return cand
        raise DatasetError(f"{base}: no {filename} in it (nor in {subdir}/); nothing is downloaded")
    if not base.is_file():
        raise DatasetError(f"{base}: file not found (expected {subdir}/{filename}); nothing is downloaded")
    return base


# --------------------------------------------------------------------------------------------
# PubMedQA-L
# --------------------------------------------------------------------------------------------


def load_pubmedqa(
    path: Optional[str | os.PathLike[str]] = None,
    *,
    split: Literal["test", "trainval", "all"] = "test",
    with_context: bool = True,
    answer_format: Literal["label", "long"] = "label",
) -> list[QARecord]:
    """PubMedQA-L questions, in file order.

    ``path`` is ``ori_pqal.json`` or its folder (``test_ground_truth.json`` must sit beside it
    unless ``split="all"``). ``with_context=False`` drops the abstract (the harder, closed-book
    setting). ``answer_format="long"`` makes an open-answer task whose reference is the
    abstract's conclusion (``LONG_ANSWER``), scored with BLEU/ROUGE.

    Example:
        >>> recs = load_pubmedqa(split="test")  # doctest: +SKIP
        >>> len(recs), recs[0].answers  # doctest: +SKIP
        (500, ('yes',))
    """
    if split not in ("test", "trainval", "all"):
        raise DatasetError(f"unknown PubMedQA split {split!r} (test, trainval, all)")
    file = _resolve(path, "pubmedqa", "ori_pqal.json")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{file}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise DatasetError(f"{file}: expected an object keyed by PubMed id")
    test_ids: Optional[dict[str, str]] = None
    if split != "all":
        gt_file = file.parent / "test_ground_truth.json"
        if not gt_file.is_file():
            raise DatasetError(f"{gt_file}: needed for split={split!r}")
        test_ids = json.loads(gt_file.read_text(encoding="utf-8"))
        missing = [k for k in test_ids if k not in data]
        if missing:
            raise DatasetError(f"{gt_file}: {len(missing)} test ids not in {file.name}, e.g. {missing[:3]}")
    records = []
    for pmid, item in data.items():
        in_test = test_ids is not None and pmid in test_ids
        if split == "test" and not in_test or split == "trainval" and in_test:
            continue
        try:
            label = str(test_ids[pmid] if in_test else item["final_decision"]).strip().lower()
            contexts, labels = item["CONTEXTS"], item.get("LABELS") or []
            question = item["QUESTION"]
        except KeyError as exc:
            raise DatasetError(f"{file}: entry {pmid} lacks field {exc}") from exc
        if label != str(item.get("final_decision", label)).strip().lower():
            raise DatasetError(f"{file}: entry {pmid}: label {item.get('final_decision')!r} disagrees with test ground truth {label!r}")
        context = "\n".join(
            f"{lab.title()}: {text}" if lab else text
            for lab, text in zip(list(labels) + [""] * (len(contexts) - len(labels)), contexts)
        )
        meta = {
            "source": "pubmedqa",
            "split": "test" if in_test else "trainval",
            "label": label,
            "year": item.get("YEAR"),
            "meshes": list(item.get("MESHES") or []),
        }
        if answer_format == "long":
            long_answer = (item.get("LONG_ANSWER") or "").strip()
            if not long_answer:
                raise DatasetError(f"{file}: entry {pmid} has no LONG_ANSWER")
            records.append(
                QARecord(pmid, question, "open", (long_answer,), context=context if with_context else None, metadata=meta)
            )
        else:
            meta["long_answer"] = item.get("LONG_ANSWER")
            records.append(
                QARecord(pmid, question, "yesno", (label,), context=context if with_context else None, metadata=meta)
            )
    return records


# --------------------------------------------------------------------------------------------
# MedMCQA
# --------------------------------------------------------------------------------------------


def load_medmcqa(path: Optional[str | os.PathLike[str]] = None) -> list[QARecord]:
    """MedMCQA questions from ``dev.jsonl`` (``cop`` 1-based: 1 -> A ... 4 -> D).

    Example:
        >>> recs = load_medmcqa()  # doctest: +SKIP
        >>> recs[0].answers, list(recs[0].options)  # doctest: +SKIP
        (('A',), ['A', 'B', 'C', 'D'])
    """
    file = _resolve(path, "medmcqa", "dev.jsonl")
    records = []
    for lineno, row in _read_jsonl(file):
        where = f"{file}:{lineno}"
        for key in ("question", "opa", "opb", "opc", "opd", "cop"):
            if key not in row:
                raise DatasetError(f"{where}: missing field {key!r}")
        cop = row["cop"]
        if isinstance(cop, bool) or not isinstance(cop, int) or not 1 <= cop <= 4:
            raise DatasetError(f"{where}: cop must be an integer 1..4 (1-based), got {cop!r}")
        options = {letter: str(row[key]) for letter, key in zip("ABCD", ("opa", "opb", "opc", "opd"))}
        meta = {
            "source": "medmcqa",
            "subject": row.get("subject_name"),
            "topic": row.get("topic_name"),
            "choice_type": row.get("choice_type"),
            "explanation": row.get("exp"),
        }
        rec_id = str(row.get("id") or f"medmcqa-{lineno}")
        records.append(QARecord(rec_id, str(row["question"]), "mcq", ("ABCD"[cop - 1],), options=options, metadata=meta))
    _check_unique(records, file)
    return records


# --------------------------------------------------------------------------------------------
# Generic JSONL
# --------------------------------------------------------------------------------------------


def _read_jsonl(file: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    with file.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{file}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{file}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def _check_unique(records: Sequence[QARecord], file: Path) -> None:
    seen: set[str] = set()
    for rec in records:
        if rec.id in seen:
            raise DatasetError(f"{file}: duplicate id {rec.id!r}")
        seen.add(rec.id)


def _norm_text(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", str(text).lower()).split())


def _mcq_answer(value: Any, options: Mapping[str, str], base: Optional[int], where: str) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    letters: set[str] = set()
    texts = {_norm_text(v): k for k, v in options.items()}
    for item in items:
        if isinstance(item, bool):
            raise DatasetError(f"{where}: boolean answer {item!r} for a multiple-choice question")
        if isinstance(item, int):
            if base not in (0, 1):
                raise DatasetError(f"{where}: integer answer {item} needs answer_index_base=0 or 1")
            index = item - base
            if not 0 <= index < len(options):
                raise DatasetError(f"{where}: answer index {item} out of range for {len(options)} options (base {base})")
            letters.add(list(options)[index])
            continue
        text = str(item).strip()
        try:
            letters.update(parse_gold_letters(text, letters="".join(options)))
            continue
        except ValueError:
            pass
        if _norm_text(text) in texts:
            letters.add(texts[_norm_text(text)])
            continue
        raise DatasetError(f"{where}: answer {item!r} is neither option letters {list(options)} nor an option text")
    return tuple(sorted(letters))


def load_jsonl(
    path: str | os.PathLike[str],
    *,
    fields: Optional[Mapping[str, str | Sequence[str]]] = None,
    task: Optional[TaskType] = None,
    answer_index_base: Optional[int] = None,
) -> list[QARecord]:
    """Load your own questions, one JSON object per line.

    Canonical fields: ``id``, ``question``, ``options``, ``answer``, ``context``; rename them
    with ``fields`` (e.g. ``{"question": "q", "answer": "cop", "options": ["opa", "opb"]}``).
    ``options`` may be a list (lettered A, B, ...), a ``{letter: text}`` object, or a list of
    field names. ``answer`` may be letters ("B", "AC", ["A", "C"]), an option text, an integer
    index (only with ``answer_index_base`` 0 or 1), yes/no/maybe, or reference text(s).
    ``task`` defaults per line: options -> ``mcq``; yes/no/maybe -> ``yesno``; else ``open``.
    Other keys go to ``metadata``. Errors name the file and line.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "q.jsonl"
        >>> _ = p.write_text('{"q": "2+2?", "choices": ["3", "4"], "gold": 1}\\n')
        >>> r = load_jsonl(p, fields={"question": "q", "options": "choices", "answer": "gold"},
        ...                answer_index_base=0)[0]
        >>> r.task, r.answers, r.options
        ('mcq', ('B',), {'A': '3', 'B': '4'})
    """
    file = Path(path)
    if not file.is_file():
        raise DatasetError(f"{file}: file not found")
    if task is not None and task not in ("mcq", "yesno", "open"):
        raise DatasetError(f"unknown task {task!r}")
    mapping: dict[str, Any] = {"id": "id", "question": "question", "options": "options", "answer": "answer", "context": "context"}
    unknown = set(fields or {}) - set(mapping)
    if unknown:
        raise DatasetError(f"unknown field names {sorted(unknown)}; use {sorted(mapping)}")
    mapping.update(fields or {})
    records = []
    for lineno, row in _read_jsonl(file):
        where = f"{file}:{lineno}"
        used: set[str] = set()

        def get(name: str) -> Any:
            key = mapping[name]
            if isinstance(key, (list, tuple)):
                used.update(key)
                return [row[k] for k in key if k in row and row[k] not in (None, "")] or None
            used.add(key)
            return row.get(key)

        question = get("question")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: missing or empty question field {mapping['question']!r}")
        raw_options = get("options")
        options: dict[str, str] = {}
        if isinstance(raw_options, Mapping):
            options = {str(k).strip().upper(): str(v) for k, v in raw_options.items()}
            if any(len(k) != 1 or k not in _LETTERS for k in options):
                raise DatasetError(f"{where}: option keys must be single letters A-J, got {list(options)}")
        elif isinstance(raw_options, (list, tuple)):
            if len(raw_options) > len(_LETTERS):
                raise DatasetError(f"{where}: at most {len(_LETTERS)} options")
            options = {_LETTERS[i]: str(v) for i, v in enumerate(raw_options)}
        elif raw_options is not None:
            raise DatasetError(f"{where}: options must be a list or an object, got {type(raw_options).__name__}")
        answer = get("answer")
        if answer is None or answer == "" or answer == []:
            raise DatasetError(f"{where}: missing answer field {mapping['answer']!r}")
        row_task = task
        if row_task is None:
            if options:
                row_task = "mcq"
            elif isinstance(answer, str) and answer.strip().lower() in _YNM:
                row_task = "yesno"
            else:
                row_task = "open"
        if row_task == "mcq":
            if not options:
                raise DatasetError(f"{where}: task mcq but no options")
            answers = _mcq_answer(answer, options, answer_index_base, where)
        elif row_task == "yesno":
            label = str(answer).strip().lower()
            if label not in _YNM:
                raise DatasetError(f"{where}: yes/no/maybe answer expected, got {answer!r}")
            answers = (label,)
        else:
            refs = answer if isinstance(answer, (list, tuple)) else [answer]
            if not all(isinstance(r, str) and r.strip() for r in refs):
                raise DatasetError(f"{where}: open answers must be non-empty strings, got {answer!r}")
            answers = tuple(r.strip() for r in refs)
        context = get("context")
        if context is not None and not isinstance(context, str):
            context = "\n".join(map(str, context)) if isinstance(context, (list, tuple)) else str(context)
        rec_id = get("id")
        rec_id = str(rec_id) if rec_id not in (None, "") else f"{file.stem}-{lineno}"
        meta = {k: v for k, v in row.items() if k not in used}
        meta["source"] = str(file)
        meta["line"] = lineno
        try:
            records.append(QARecord(rec_id, question.strip(), row_task, answers, options=options, context=context, metadata=meta))
        except DatasetError as exc:
            raise DatasetError(f"{where}: {exc}") from exc
    _check_unique(records, file)
    return records


# --------------------------------------------------------------------------------------------
# Dispatch and sampling
# --------------------------------------------------------------------------------------------


def in_calibration_split(record_id: str) -> bool:
    """Whether a MedMCQA dev question is in its calibration split: one eighth of dev, chosen by a hash
    of the question id (the same on every machine), so sigma and the state value are chosen on
    questions no evaluation of split ``dev`` (the other seven eighths) ever sees.

    Example:
        >>> in_calibration_split("e9ad821a-c438-4965-9f77-760819dfa155") in (True, False)
        True
    """
    import hashlib

    return hashlib.sha256(str(record_id).encode("utf-8")).digest()[0] < 32


def task_name(spec: str | os.PathLike[str]) -> str:
    """The task a dataset's calibration is stored under: ``pubmedqa`` / ``medmcqa`` for the named
    sets, else the JSONL file's name without its suffix.

    Example:
        >>> task_name("PubMedQA"), task_name("/data/my-questions.jsonl")
        ('pubmedqa', 'my-questions')
    """
    name = str(spec)
    if name.lower() in ("pubmedqa", "medmcqa"):
        return name.lower()
    return Path(name).stem


def load_dataset(
    spec: str | os.PathLike[str],
    *,
    data_dir: Optional[str | os.PathLike[str]] = None,
    split: Optional[str] = None,
    with_context: bool = True,
    answer_format: Literal["label", "long"] = "label",
    **jsonl_options: Any,
) -> list[QARecord]:
    """``"pubmedqa"``, ``"medmcqa"`` or a path to a JSONL file.

    ``data_dir`` replaces the default data folder for the named sets. ``split`` applies to
    PubMedQA (``test``, the default; ``trainval``; ``all``) and MedMCQA (``dev``, the default: the
    dev file without its calibration eighth; ``calibration``: that eighth,
    :func:`in_calibration_split`; ``all``); ``jsonl_options`` go to :func:`load_jsonl`.
    """
    name = str(spec)
    if name.lower() == "pubmedqa":
        base = Path(data_dir) / "pubmedqa" if data_dir else None
        return load_pubmedqa(base, split=split or "test", with_context=with_context, answer_format=answer_format)  # type: ignore[arg-type]
    if name.lower() == "medmcqa":
        if split not in (None, "dev", "calibration", "all"):
            raise DatasetError(f"unknown MedMCQA split {split!r} (dev, calibration, all)")
        records = load_medmcqa(Path(data_dir) / "medmcqa" if data_dir else None)
        if split == "all":
            return records
        wanted = split == "calibration"
        return [r for r in records if in_calibration_split(r.id) == wanted]
    path = Path(name)
    if not path.exists():
        raise DatasetError(f"{name}: not a known dataset (pubmedqa, medmcqa) and no such file")
    records = load_jsonl(path, **jsonl_options)
    if not with_context:
        records = [replace(r, context=None) for r in records]
    return records


def sample_records(records: Sequence[QARecord], *, limit: Optional[int] = None, seed: Optional[int] = None) -> list[QARecord]:
    """A deterministic subset: the first ``limit`` records, or with ``seed`` a seeded random
    sample of ``limit`` records kept in their original order.

    Example:
        >>> recs = [QARecord(str(i), "q", "yesno", ("yes",)) for i in range(10)]
        >>> [r.id for r in sample_records(recs, limit=3)]
        ['0', '1', '2']
        >>> sample_records(recs, limit=3, seed=1) == sample_records(recs, limit=3, seed=1)
        True
    """
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    if limit is None or limit >= len(records):
        return list(records)
    if seed is None:
        return list(records[:limit])
    chosen = sorted(random.Random(seed).sample(range(len(records)), limit))
    return [records[i] for i in chosen]
