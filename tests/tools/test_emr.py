"""EMR_SEARCH over a real SQLite database: cohort, similar-patient search, access control, redaction, injection."""

from __future__ import annotations

import doctest
import importlib
import re
from datetime import date
from itertools import combinations

import pytest
import simple_icd_10_cm as cm
from langchain_core.messages import ToolMessage
from sqlalchemy import func, select

from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.emr import (
    EMR_SEARCH_NAME,
    EMR_TOOL_OPTIONS,
    EMRDatabase,
    EMRInput,
    MatchedPatient,
    Redactor,
    count_bucket,
    default_emr_path,
    default_emr_tool,
    emr_tool,
    generate_cohort,
    parse_emr_text,
    patients,
    select_case_groups,
)
from tcrag_langgraph.tools.layer import ToolOptions

from emr_checks import (  # tests/tools helper (same checks on PostgreSQL)
    CodeMatcher,
    captured_sql,
    facts_from_rows,
    identifiers,
    latest_ages,
    parse_case_groups,
    released_selection,
    shown_supporters,
    supporters,
    verify_release,
)

N, SEED = 300, 7
K = 3  # the default min_cohort_size
WIDE = EMR_TOOL_OPTIONS.model_copy(update={"max_output_tokens": 50_000})


@pytest.fixture(scope="module")
def rows():
    return generate_cohort(N, SEED)


@pytest.fixture(scope="module")
def db():
    return EMRDatabase(None, n_patients=N, seed=SEED)


@pytest.fixture(scope="module")
def tool(db):
    return emr_tool(db)


def matching_patients(rows, prefixes, sex=None, age_min=None, age_max=None):
    """Expected similar-search matches, computed in Python from the generated rows (not via SQL)."""
    adm = {a["admission_id"]: a for a in rows["admissions"]}
    sex_of = {p["patient_id"]: p["sex"] for p in rows["patients"]}
    hits = set()
    for d in rows["diagnoses"]:
        a = adm[d["admission_id"]]
        if not any(d["icd_code"].startswith(p) for p in prefixes):
            continue
        if sex and sex_of[d["patient_id"]] != sex:
            continue
        if age_min is not None and a["age_at_admit"] < age_min:
            continue
        if age_max is not None and a["age_at_admit"] > age_max:
            continue
        hits.add(d["patient_id"])
    return hits


def bucket_of(text: str) -> str:
    return re.search(r": (\S+) matching patients \(counts are ranges\)\.", text).group(1)


def withheld_tail(text: str) -> str:
    """The answer after its header (the header only echoes the query)."""
    return text.split(": ", 1)[1]


def caller(config_factory, *allowed):
    return config_factory("dr-a", allowed=tuple(allowed) if allowed else None)


# ---------------------------------------------------------------- cohort


def test_cohort_is_deterministic_and_seeded(rows):
    assert generate_cohort(N, SEED) == rows
    other = generate_cohort(N, SEED + 1)
    assert other["patients"] != rows["patients"]
    assert len(rows["patients"]) == N
    assert len({p["mrn"] for p in rows["patients"]}) == N


def test_cohort_uses_real_icd10cm_codes_and_descriptions(rows):
    for d in rows["d_icd_diagnoses"]:
        assert cm.is_valid_item(d["icd_code"]) and cm.is_leaf(d["icd_code"])
        assert d["long_title"] == cm.get_description(d["icd_code"])
    used = {d["icd_code"] for d in rows["diagnoses"]}
    assert used <= {d["icd_code"] for d in rows["d_icd_diagnoses"]}
    assert len(used) >= 25  # a varied cohort, not one disease


def test_cohort_combinations_are_clinically_coherent(rows):
    dx_by_adm: dict[int, set[str]] = {}
    for d in rows["diagnoses"]:
        dx_by_adm.setdefault(d["admission_id"], set()).add(d["icd_code"])
    rx_by_adm: dict[int, set[str]] = {}
    for m in rows["medications"]:
        rx_by_adm.setdefault(m["admission_id"], set()).add(m["drug"])
    diabetic = [a for a, codes in dx_by_adm.items() if any(c.startswith("E11") for c in codes)]
    assert len(diabetic) > 20
    for a in diabetic:  # every diabetes admission carries a glucose-lowering drug
        assert rx_by_adm[a] & {"Metformin", "Insulin glargine", "Empagliflozin"}
    for lab in rows["labs"]:
        assert lab["flag"] == ("H" if lab["value"] > lab["ref_high"] else "L" if lab["value"] < lab["ref_low"] else None)
        if lab["label"] == "NT-proBNP":  # only heart-failure admissions measure it, and it is raised there
            assert lab["value"] >= 900 and any(c.startswith("I50") for c in dx_by_adm[lab["admission_id"]])
        if lab["label"] == "Hemoglobin A1c":
            assert any(c.startswith("E11") for c in dx_by_adm[lab["admission_id"]])
    ages = [a["age_at_admit"] for a in rows["admissions"]]
    assert 18 <= min(ages) and max(ages) <= 100
    for a in rows["admissions"]:
        assert a["discharge_time"] > a["admit_time"]


def test_database_holds_the_cohort(db, rows):
    assert db.count_patients() == N
    with db.engine.connect() as conn:
        stored = conn.execute(select(func.count()).select_from(patients).where(patients.c.sex == "F")).scalar_one()
    assert stored == sum(p["sex"] == "F" for p in rows["patients"])


# ---------------------------------------------------------------- similar-patient search


@pytest.mark.parametrize(
    "query, prefixes, filters",
    [
        ({"codes": ["E11.9"]}, ["E11.9"], {}),
        ({"codes": ["E11"]}, ["E11"], {}),  # a category matches its subcodes
        ({"codes": ["I50", "I48.91"], "limit": 2}, ["I50", "I48.91"], {}),
        ({"codes": ["I10"], "sex": "F", "age_min": 60, "age_max": 80}, ["I10"], {"sex": "F", "age_min": 60, "age_max": 80}),
        ({"codes": ["J18.9"], "sex": "male", "age_max": 70}, ["J18.9"], {"sex": "M", "age_max": 70}),
    ],
)
def test_similar_counts_match_the_data(tool, db, rows, query, prefixes, filters):
    """Counts come from the released table (groups of >= k, verified against the generated rows)."""
    verify_release(db.release(), rows, K)
    out = tool.invoke({"operation": "similar", **query})
    assert isinstance(out, str), out
    groups = released_selection(db.release(), prefixes, **filters)
    released = sum(g.size for g in groups)
    assert released <= len(matching_patients(rows, prefixes, **filters)) or filters  # never more than exist
    if released < K:
        assert withheld_tail(out).startswith("no group of at least 3 matching patients to show"), out
        return
    assert bucket_of(out) == count_bucket(released, K)  # a range, not the exact count
    shown = re.findall(r"^Case group \d+ \((\S+) patients", out, flags=re.M)
    assert 1 <= len(shown) <= query.get("limit", 3)
    assert all(int(b.split("-")[0]) >= K for b in shown)


def test_similar_ranks_groups_matching_more_criteria_first(tool, db):
    out = tool.invoke({"codes": ["I50", "I48"], "limit": 5})
    scores = [int(s) for s in re.findall(r"patients, matching (\d)/2: ", out)]
    assert scores and scores == sorted(scores, reverse=True)
    both = [g for g in db.release() if any(c.startswith("I50") for c in g.diagnoses)
            and any(c.startswith("I48") for c in g.diagnoses)]
    assert (scores[0] == 2) == bool(both)


def test_similar_by_condition_words(tool, db, rows):
    out = tool.invoke({"condition": "heart failure"})
    titles = {d["icd_code"]: d["long_title"].lower() for d in rows["d_icd_diagnoses"]}
    codes = [c for c, t in titles.items() if "heart" in t and "failure" in t]
    assert codes and all(c.startswith("I50") for c in codes)
    assert bucket_of(out) == count_bucket(sum(g.size for g in released_selection(db.release(), codes)), K)
    none = tool.invoke({"condition": "xenotransplant rejection"})
    assert withheld_tail(none).startswith("no group of at least 3 matching patients to show") and "Case" not in none


def test_similar_is_de_identified(db, rows):
    out = emr_tool(db, options=WIDE).invoke({"codes": ["I10"], "limit": 20})
    assert len(re.findall(r"^Case group \d+ ", out, flags=re.M)) >= 8
    for ident in identifiers(rows):
        assert ident not in out
    assert not re.search(r"\bP\d{5}\b", out)  # no patient ids in aggregate results
    assert not re.search(r"\b(19|20)\d\d-\d\d-\d\d\b", out)  # no dates at all
    assert re.search(r"age (\d+-\d+|90\+)", out)  # ages only as 10-year bands
    assert not re.search(r"(?<![\d-])\d+ (patients|female|male)\b", out)  # counts only as ranges


def test_small_cohorts_are_withheld(rows):
    db = EMRDatabase(None, n_patients=40, seed=3, min_cohort_size=1000)
    out = emr_tool(db).invoke("patients with I10")
    assert withheld_tail(out).startswith("no group of at least 1000 matching patients to show") and "Case" not in out


def test_count_buckets():
    assert [count_bucket(n, 3) for n in (3, 9, 10, 19, 44, 99, 100, 230, 1000, 4321)] == [
        "3-9", "3-9", "10-19", "10-19", "40-49", "90-99", "100-199", "200-299", "1000-1999", "4000-4999"]
    assert count_bucket(9, 9) == "9" and count_bucket(25, 20) == "20-29"
    with pytest.raises(ValueError):
        count_bucket(2, 3)


def test_every_case_for_every_code_pair_and_triple_is_backed_by_k_patients(rows):
    """The privacy rule over every combination of 2 and 3 codes present in the cohort.

    Who matches and each patient's facts are recomputed from the generated rows; for each case the
    selection would show (limit 20), the patients sharing every attribute it shows are counted.
    """
    facts, match = facts_from_rows(rows), CodeMatcher(rows)
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    combos = [c for r in (2, 3) for c in combinations(codes, r)]
    assert len(codes) >= 25 and len(combos) == len(list(combinations(codes, 2))) + len(list(combinations(codes, 3)))
    singled_out_before = shown_full_matches = cases = 0
    for combo in combos:
        matched = match(combo)
        full = sum(len(hit) == len(combo) for hit, _age in matched.values())
        if full == 1 and len(matched) >= K:  # the old ranking showed this one patient as Case 1
            singled_out_before += 1
        groups = select_case_groups(
            [MatchedPatient(criteria=hit, age=age, facts=facts[pid]) for pid, (hit, age) in matched.items()],
            k=K, limit=20)
        for group in groups:
            backing = supporters(group, matched, facts)
            assert len(backing) >= group.size >= K, (combo, group)
            cases += 1
            shown_full_matches += len(group.criteria) == len(combo)
    assert singled_out_before >= 50  # the enumeration does include the combinations that leaked before
    assert cases > len(combos)  # and it checked real output, not empty selections
    assert shown_full_matches > 0  # combinations shared by enough patients are still shown


def test_tool_output_for_rare_code_pairs_shows_only_groups_of_k(db, rows):
    """End to end (SQL, release, text) for every code pair that the old ranking singled out: every
    case shown and every cohort cell is backed by at least k patients sharing what it states."""
    facts, ages, match = facts_from_rows(rows), latest_ages(rows), CodeMatcher(rows)
    tool = emr_tool(db, options=WIDE)
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    by_pair = {pair: match(pair) for pair in combinations(codes, 2)}
    rare = [p for p, m in by_pair.items() if sum(len(hit) == 2 for hit, _a in m.values()) == 1 and len(m) >= K]
    assert ("A41.9", "E11.22") in rare and len(rare) >= 50
    cases = 0
    for pair in rare:
        out = tool.invoke({"operation": "similar", "codes": list(pair), "limit": 20})
        groups = released_selection(db.release(), pair)
        if sum(g.size for g in groups) < K:
            assert "Case group" not in out
            continue
        assert bucket_of(out) == count_bucket(sum(g.size for g in groups), K)
        shown = parse_case_groups(out, list(pair))
        assert len(shown) == len(re.findall(r"^Case group ", out, flags=re.M)) == min(20, len(groups))
        for case in shown:
            assert len(shown_supporters(case, facts, ages)) >= case.low >= K, (pair, case)
            cases += 1
        for kind, line in re.findall(r"^Most common (diagnoses|medications): (.*)\.$", out, flags=re.M):
            for item in line.split("; "):
                name, low = re.fullmatch(r"(.*) \((\d+)(?:-\d+)?\)", item).groups()
                key = name.split(" ")[0] if kind == "diagnoses" else name
                having = sum(key in getattr(facts[pid], kind) for pid in facts)
                assert having >= int(low) >= K, (pair, item)
    assert cases > len(rare)


def test_none_and_too_few_read_the_same(tool, rows):
    """A query matching 1 or 2 patients answers exactly like one matching nobody."""
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    queries = [{"codes": [c], "sex": sex, "age_min": lo, "age_max": lo + 9}
               for c in codes for sex in "FM" for lo in range(20, 100, 10)]
    sizes = [len(matching_patients(rows, q["codes"], q["sex"], q["age_min"], q["age_max"])) for q in queries]
    too_few = [q for q, n in zip(queries, sizes) if 0 < n < K]
    nobody = [q for q, n in zip(queries, sizes) if n == 0]
    assert len(too_few) >= 10 and len(nobody) >= 10
    answers = {withheld_tail(tool.invoke(q)) for q in too_few[:10] + nobody[:10]}
    assert len(answers) == 1 and answers.pop().startswith("no group of at least 3 matching patients to show")


# ---------------------------------------------------------------- record look-up and access control


def test_lookup_without_caller_is_forbidden_and_touches_no_table(tool, db):
    with captured_sql(db) as seen:
        err = tool.invoke({"operation": "lookup", "patient_id": "P00001"})
    assert isinstance(err, ToolError) and err.kind == "forbidden" and err.tool == EMR_SEARCH_NAME
    assert seen == []


def test_lookup_outside_allowed_ids_is_forbidden(tool, db, caller_config):
    with captured_sql(db) as seen:
        err = tool.invoke({"operation": "lookup", "patient_id": "P00002"}, config=caller(caller_config, "P00001"))
    assert isinstance(err, ToolError) and err.kind == "forbidden" and "P00002" in err.message
    assert seen == []
    # allowed_patient_ids=None means no records at all
    err = tool.invoke("record of P00001", config=caller(caller_config))
    assert isinstance(err, ToolError) and err.kind == "forbidden"


def test_lookup_for_allowed_caller_shows_the_record_redacted(tool, rows, caller_config):
    pid = "P00003"
    out = tool.invoke({"operation": "lookup", "patient_id": pid}, config=caller(caller_config, pid, "P00009"))
    assert isinstance(out, str) and out.startswith(f"Patient {pid}:")
    mine = [a for a in rows["admissions"] if a["patient_id"] == pid]
    assert f"{len(mine)} admission(s)" in out
    for d in rows["diagnoses"]:
        if d["patient_id"] == pid:
            assert d["icd_code"] in out
    person = next(p for p in rows["patients"] if p["patient_id"] == pid)
    for value in (person["mrn"], person["phone"], person["address"], person["last_name"], person["first_name"],
                  person["birth_date"].strftime("%m/%d/%Y"), person["birth_date"].isoformat()):
        assert value not in out
    assert "[NAME]" in out and "[MRN]" in out and "[PHONE]" in out  # the notes held them


def test_lookup_normalises_ids_and_reports_missing(tool, caller_config):
    cfg = caller(caller_config, "P00004", "P09999")
    assert tool.invoke("record of p4", config=cfg).startswith("Patient P00004:")
    assert tool.invoke({"patient_id": "4"}, config=cfg).startswith("Patient P00004:")
    err = tool.invoke({"operation": "lookup", "patient_id": "P09999"}, config=cfg)
    assert isinstance(err, ToolError) and err.kind == "not_found"


def test_cached_results_never_cross_callers(db, caller_config):
    cached = emr_tool(db, options=ToolOptions(cache_size=16))
    args = {"operation": "lookup", "patient_id": "P00005"}
    assert cached.invoke(args, config=caller(caller_config, "P00005")).startswith("Patient P00005")
    err = cached.invoke(args, config=caller_config("dr-b", allowed=("P00006",)))
    assert isinstance(err, ToolError) and err.kind == "forbidden"


async def test_ainvoke_and_tool_call_paths(tool, caller_config):
    out = await tool.ainvoke({"patient_id": "P00007"}, config=caller(caller_config, "P00007"))
    assert out.startswith("Patient P00007:")
    msg = tool.invoke({"type": "tool_call", "id": "c1", "name": "EMR_SEARCH", "args": {"patient_id": "P00008"}})
    assert isinstance(msg, ToolMessage) and msg.status == "error" and msg.artifact.kind == "forbidden"


# ---------------------------------------------------------------- injection and input handling


@pytest.mark.parametrize(
    "payload",
    [
        {"codes": ["E11.9' OR '1'='1"]},
        {"codes": ["E11.9; DROP TABLE patients"]},
        {"patient_id": "P00001' OR '1'='1"},
        {"patient_id": "1 OR 1=1"},
        {"operation": "lookup; DROP TABLE patients", "patient_id": "P00001"},
        {"sex": "F' OR 'x'='x", "codes": ["I10"]},
    ],
)
def test_injection_in_structured_fields_is_rejected(tool, db, payload, caller_config):
    with captured_sql(db) as seen:
        err = tool.invoke(payload, config=caller(caller_config, "P00001"))
    assert isinstance(err, ToolError) and err.kind == "bad_input"
    assert seen == []
    assert db.count_patients() == N


@pytest.mark.parametrize(
    "condition",
    ["'; DROP TABLE patients; --", "heart\" OR 1=1 --", "failure%' UNION SELECT mrn FROM patients --", "diabet_% 100%"],
)
def test_injection_in_free_text_only_ever_travels_as_bound_parameters(tool, db, rows, condition):
    with captured_sql(db) as seen:
        out = tool.invoke({"condition": condition})
    assert seen, "the search ran"
    for statement, _params in seen:
        assert "DROP" not in statement.upper() and "UNION" not in statement.upper()
        # the only quoted literal is our own LIKE escape character; model text is never spliced in
        assert "'" not in statement.replace("ESCAPE '\\'", "")
    assert db.count_patients() == N
    text = str(out)
    for ident in identifiers(rows):
        assert ident not in text


def test_plain_text_repair(tool, db):
    out = tool.invoke("patients with E11.9")
    assert bucket_of(out) == count_bucket(sum(g.size for g in released_selection(db.release(), ["E11.9"])), K)
    out = tool.invoke("female patients with I10 aged 60-80")
    expected = sum(g.size for g in released_selection(db.release(), ["I10"], sex="F", age_min=60, age_max=80))
    assert (bucket_of(out) == count_bucket(expected, K)) if expected >= K else "no group of at least" in out
    err = tool.invoke("find similar patients with")
    assert isinstance(err, ToolError) and err.kind == "bad_input" and "ICD-10-CM" in err.message


@pytest.mark.parametrize(
    "text, expected",
    [
        ("patients with E11.9", {"codes": ["E11.9"]}),
        ("similar patients: I50.22, I10; male over 70", {"codes": ["I50.22", "I10"], "sex": "M", "age_min": 70}),
        ("women under 50 with asthma", {"sex": "F", "age_max": 50, "condition": "asthma"}),
        ("look up patient P00042", {"operation": "lookup", "patient_id": "P00042"}),
        ("perinatal code P07.3 cases", {"codes": ["P07.3"], "condition": "perinatal"}),
    ],
)
def test_parse_emr_text(text, expected):
    assert parse_emr_text(text) == expected


def test_input_model_normalises_and_validates():
    args = EMRInput(codes="e119, I10", sex="female", operation="similar_patients")
    assert (args.codes, args.sex, args.operation) == (["E11.9", "I10"], "F", "similar")
    assert EMRInput(patient_id="p42").operation == "lookup"
    with pytest.raises(ValueError, match="age_min"):
        EMRInput(codes=["I10"], age_min=80, age_max=60)
    with pytest.raises(ValueError, match="lookup needs patient_id"):
        EMRInput(operation="lookup", codes=["I10"])


def test_redactor_removes_identifier_forms():
    person = {"first_name": "Ann", "last_name": "Lee", "mrn": "12345678", "birth_date": date(1950, 2, 3),
              "address": "1 Oak St, Madison", "phone": "555-123-4567"}
    text = Redactor([person])("Ann Lee, born 1950-02-03 (February 03, 1950), MRN: 12345678, call (555) 123-4567. Annual check.")
    assert text == "[NAME] [NAME], born [DOB] ([DOB]), MRN: [MRN], call [PHONE]. Annual check."


# ---------------------------------------------------------------- factories


def test_default_tool_creates_and_reuses_a_sqlite_file(tmp_path, monkeypatch, caller_config):
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCRAG_EMR_URL", raising=False)
    tool = default_emr_tool(n_patients=40, seed=11)
    path = default_emr_path(11, 40)
    assert tool.name == "EMR_SEARCH" and path.parent == tmp_path and path.exists()
    mtime = path.stat().st_mtime_ns
    assert tool.invoke("record of P00001", config=caller(caller_config, "P00001")).startswith("Patient P00001")
    again = default_emr_tool(n_patients=40, seed=11)
    assert again.invoke({"codes": ["I10"]}) == tool.invoke({"codes": ["I10"]})
    assert path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert not list(tmp_path.glob("*.tmp"))


def test_any_sqlalchemy_url_works(tmp_path):
    url = f"sqlite:///{tmp_path / 'emr.db'}"
    tool = default_emr_tool(url=url, n_patients=30, seed=5)
    assert isinstance(tool.invoke("patients with I10"), str)
    assert EMRDatabase(url, populate=False).count_patients() == 30
    assert "emr.db" in repr(EMRDatabase(url, populate=False))


@pytest.mark.parametrize("module", ["anonymity", "cohort", "database", "parsing", "redaction", "tool", "__init__"])
def test_docstring_examples_run(module):
    mod = importlib.import_module("tcrag_langgraph.tools.emr" + ("" if module == "__init__" else f".{module}"))
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
