"""Dataset loader tests: the real shared files (when present) and constructed JSONL files."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from tcrag_langgraph.eval.datasets import (
    DatasetError,
    QARecord,
    default_data_dir,
    format_question,
    load_dataset,
    load_jsonl,
    load_medmcqa,
    load_pubmedqa,
    sample_records,
)


def _shared_data() -> Path | None:
    try:
        return default_data_dir()
    except DatasetError:
        return None


needs_data = pytest.mark.skipif(_shared_data() is None, reason="shared/data not present")


@needs_data
def test_pubmedqa_test_split_matches_ground_truth():
    root = _shared_data()
    truth = json.loads((root / "pubmedqa" / "test_ground_truth.json").read_text())
    recs = load_pubmedqa(split="test")
    assert len(recs) == 500
    assert {r.id: r.answers[0] for r in recs} == truth
    assert collections.Counter(r.answers[0] for r in recs) == {"yes": 276, "no": 169, "maybe": 55}
    assert all(r.task == "yesno" and r.context for r in recs)
    trainval = load_pubmedqa(split="trainval")
    assert len(trainval) == 500 and not {r.id for r in trainval} & set(truth)
    assert len(load_pubmedqa(split="all")) == 1000


@needs_data
def test_pubmedqa_without_context_and_long_answers():
    closed = load_pubmedqa(with_context=False)
    assert all(r.context is None for r in closed)
    assert "Context:" not in format_question(closed[0])
    assert format_question(load_pubmedqa()[0]).startswith("Context: ")
    long = load_pubmedqa(answer_format="long")
    assert long[0].task == "open" and len(long[0].answers[0]) > 50


@needs_data
def test_medmcqa_cop_is_one_based():
    recs = load_medmcqa()
    assert len(recs) == 4183
    first = recs[0]  # "not true for myelinated fibres": cop=1, the false statement is opa
    assert first.answers == ("A",) and first.options["A"].startswith("Impulse through myelinated")
    assert set(collections.Counter(r.answers[0] for r in recs)) == {"A", "B", "C", "D"}
    # The explanation never becomes context (it names the answer).
    assert all(r.context is None for r in recs)
    assert format_question(first).endswith("Answer with the letter of the correct option.")


def _write(tmp_path: Path, rows, name="q.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    return path


def test_medmcqa_rejects_zero_based_cop(tmp_path):
    row = {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": 0, "id": "x"}
    with pytest.raises(DatasetError, match=r"q\.jsonl:2: cop must be an integer 1\.\.4"):
        load_medmcqa(_write(tmp_path, [dict(row, cop=1), row]))


def test_jsonl_formats_and_task_inference(tmp_path):
    path = _write(
        tmp_path,
        [
            {"id": "m1", "question": "Pick two", "options": {"A": "x", "B": "y", "C": "z"}, "answer": "A, C"},
            {"id": "m2", "question": "By text", "options": ["Aspirin", "Heparin"], "answer": "heparin"},
            {"id": "y1", "question": "Is it?", "answer": "Yes", "extra": 7},
            {"id": "o1", "question": "Explain", "answer": ["ref one", "ref two"], "context": ["p1", "p2"]},
            "",
            {"question": "no id", "answer": "free text"},
        ],
    )
    recs = load_jsonl(path)
    assert [r.task for r in recs] == ["mcq", "mcq", "yesno", "open", "open"]
    assert recs[0].answers == ("A", "C") and "letters of all correct options" in format_question(recs[0])
    assert recs[1].answers == ("B",) and recs[1].options == {"A": "Aspirin", "B": "Heparin"}
    assert recs[2].answers == ("yes",) and recs[2].metadata["extra"] == 7
    assert recs[3].answers == ("ref one", "ref two") and recs[3].context == "p1\np2"
    assert recs[4].id == "q-6"  # file stem + line number (line 5 is blank)


def test_jsonl_field_mapping_and_integer_answers(tmp_path):
    rows = [{"q": "2+2?", "opa": "3", "opb": "4", "cop": 2}]
    path = _write(tmp_path, rows)
    fields = {"question": "q", "options": ["opa", "opb"], "answer": "cop"}
    with pytest.raises(DatasetError, match="answer_index_base"):
        load_jsonl(path, fields=fields)
    assert load_jsonl(path, fields=fields, answer_index_base=1)[0].answers == ("B",)
    with pytest.raises(DatasetError, match="out of range"):
        load_jsonl(path, fields=fields, answer_index_base=0)  # index 2 of two options


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "q", "answer": "a"', r"q\.jsonl:2: invalid JSON"),
        ('["not", "an", "object"]', r"q\.jsonl:2: expected a JSON object"),
        ('{"answer": "a"}', r"q\.jsonl:2: missing or empty question"),
        ('{"question": "q"}', r"q\.jsonl:2: missing answer"),
        ('{"question": "q", "options": ["a", "b"], "answer": "Z"}', r"q\.jsonl:2: answer 'Z' is neither"),
        ('{"question": "q", "options": "a b", "answer": "A"}', r"q\.jsonl:2: options must be a list"),
        ('{"id": "ok", "question": "q", "answer": "a"}', r"duplicate id 'ok'"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = _write(tmp_path, ['{"id": "ok", "question": "fine", "answer": "x"}', line])
    with pytest.raises(DatasetError, match=message):
        load_jsonl(path)


def test_jsonl_forced_task_checks_answers(tmp_path):
    path = _write(tmp_path, [{"question": "q", "answer": "perhaps"}])
    with pytest.raises(DatasetError, match="yes/no/maybe answer expected"):
        load_jsonl(path, task="yesno")
    with pytest.raises(DatasetError, match="unknown field names"):
        load_jsonl(path, fields={"questoin": "q"})


def test_data_dir_env_and_load_dataset_dispatch(tmp_path, monkeypatch):
    (tmp_path / "medmcqa").mkdir()
    row = {"id": "r1", "question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d", "cop": 4}
    _write(tmp_path / "medmcqa", [row], name="dev.jsonl")
    monkeypatch.setenv("TCRAG_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    assert load_dataset("medmcqa")[0].answers == ("D",)
    with pytest.raises(DatasetError, match="pubmedqa"):
        load_dataset("pubmedqa")  # not in this data dir: a clear error, never a download
    with pytest.raises(DatasetError, match="not a known dataset"):
        load_dataset("nope.jsonl")
    monkeypatch.setenv("TCRAG_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(DatasetError, match="not a directory"):
        default_data_dir()


def test_record_validation_and_roundtrip():
    with pytest.raises(DatasetError, match="not options"):
        QARecord("x", "q", "mcq", ("C",), options={"A": "a", "B": "b"})
    rec = QARecord("x", "q", "mcq", ("A", "B"), options={"A": "a", "B": "b", "C": "c"}, metadata={"k": 1})
    assert QARecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    assert rec.letters == "ABC"


def test_sample_records_is_deterministic_and_ordered():
    recs = [QARecord(str(i), "q", "yesno", ("yes",)) for i in range(50)]
    a = sample_records(recs, limit=10, seed=3)
    assert a == sample_records(recs, limit=10, seed=3)
    assert a != sample_records(recs, limit=10, seed=4)
    ids = [int(r.id) for r in a]
    assert ids == sorted(ids) and len(set(ids)) == 10
    assert sample_records(recs, limit=100) == recs
