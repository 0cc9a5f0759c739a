"""EMR_SEARCH on a real PostgreSQL server: same cohort and same answers as SQLite, access control,
redaction and injection resistance.

A throwaway cluster (``pg_server.py``) runs on a free 127.0.0.1 port for this module and is stopped
(``pg_ctl stop -m fast``) afterwards, also when tests fail. The module is skipped, saying what is
missing, when the server binaries, an unprivileged account (as root) or the ``psycopg`` driver are
not available.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from itertools import combinations
from pathlib import Path

import pytest

from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.emr import (
    EMR_TOOL_OPTIONS,
    EMRDatabase,
    count_bucket,
    emr_tool,
    generate_cohort,
    metadata,
    patients,
)
from tcrag_langgraph.tools.emr.schema import release_batches
from tcrag_langgraph.tools.identity import CALLER_KEY, CallerContext
from tcrag_langgraph.tools.layer import ToolOptions

_spec = importlib.util.spec_from_file_location("_tcrag_pg_server", Path(__file__).with_name("pg_server.py"))
pg_server = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(pg_server)  # registered first: its dataclasses look their module up

_missing = pg_server.why_unavailable()
if _missing:
    pytest.skip(_missing, allow_module_level=True)
pytest.importorskip("psycopg", reason='the PostgreSQL driver psycopg 3 is not installed (pip install "psycopg[binary]")')

from sqlalchemy import select, text  # noqa: E402
from emr_checks import (CodeMatcher, captured_sql, facts_from_rows, identifiers, latest_ages, parse_case_groups,
                        released_selection, shown_supporters, verify_release)

N, SEED = 300, 7
K = 3  # the default min_cohort_size
WIDE = EMR_TOOL_OPTIONS.model_copy(update={"max_output_tokens": 50_000})
TABLES = ("d_icd_diagnoses", "patients", "admissions", "diagnoses", "medications", "labs", "emr_meta",
          "emr_release_batches", "emr_released_groups", "emr_released_members")


@pytest.fixture(scope="module")
def pg():
    try:
        server = pg_server.PostgresServer()
        server.__enter__()
    except PermissionError as exc:  # e.g. TMPDIR under a private folder the server account cannot reach
        pytest.skip(f"cannot run PostgreSQL here: {exc}")
    try:
        yield server
    finally:
        server.__exit__(None, None, None)  # pg_ctl stop -m fast, then the temp folder goes


@pytest.fixture(scope="module")
def rows():
    return generate_cohort(N, SEED)


@pytest.fixture(scope="module")
def pg_url(pg):
    return pg.create_database("emr")


@pytest.fixture(scope="module")
def pg_db(pg_url):
    db = EMRDatabase(pg_url, n_patients=N, seed=SEED)
    try:
        yield db
    finally:
        db.engine.dispose()  # close pooled connections before the server stops


@pytest.fixture(scope="module")
def sqlite_db():
    return EMRDatabase(None, n_patients=N, seed=SEED)


@pytest.fixture(scope="module")
def pg_tool(pg_db):
    return emr_tool(pg_db, options=WIDE)


@pytest.fixture(scope="module")
def sqlite_tool(sqlite_db):
    return emr_tool(sqlite_db, options=WIDE)


def cfg(*allowed: str, user: str = "dr-a", none: bool = False) -> dict:
    caller = CallerContext(user_id=user, roles=("clinician",), allowed_patient_ids=None if none else tuple(allowed))
    return {"configurable": {CALLER_KEY: caller}}


def table_counts(db) -> dict[str, int]:
    with db.engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


# ---------------------------------------------------------------- the server and the stored cohort


def test_server_is_postgresql_on_loopback_with_local_trust_only(pg, pg_db):
    assert pg_db.engine.dialect.name == "postgresql" and pg_db.engine.dialect.driver == "psycopg"
    with pg_db.engine.connect() as conn:
        version = conn.execute(text("SELECT version()")).scalar_one()
        listen = conn.execute(text("SHOW listen_addresses")).scalar_one()
        server_addr = conn.execute(text("SELECT host(inet_server_addr())")).scalar_one()
        rules = conn.execute(text("SELECT type, address, auth_method FROM pg_hba_file_rules")).all()
    assert version.startswith("PostgreSQL ")
    assert listen == "127.0.0.1" and server_addr == "127.0.0.1"
    assert sorted(tuple(r) for r in rules) == [("host", "127.0.0.1", "trust"), ("local", None, "trust")]


def test_postgres_holds_the_same_cohort_as_sqlite(pg_db, sqlite_db, rows):
    assert pg_db.count_patients() == sqlite_db.count_patients() == N
    counts = table_counts(pg_db)
    assert counts == table_counts(sqlite_db)
    assert counts["labs"] == len(rows["labs"]) > 1000
    for table in metadata.sorted_tables:  # every value round-trips identically (dates, floats, NULL flags)
        query = select(table).order_by(*table.primary_key.columns)
        with pg_db.engine.connect() as a, sqlite_db.engine.connect() as b:
            assert a.execute(query).all() == b.execute(query).all(), table.name
    with pg_db.engine.connect() as conn:
        stored = [dict(r) for r in conn.execute(select(patients).order_by(patients.c.patient_id)).mappings()]
    assert stored == rows["patients"]


def test_populating_again_does_not_duplicate(pg_url, pg_db):
    again = EMRDatabase(pg_url, n_patients=N, seed=SEED)  # finds the cohort there and leaves it
    try:
        assert again.count_patients() == N
    finally:
        again.engine.dispose()


# ---------------------------------------------------------------- same answers as SQLite


SIMILAR_QUERIES = [
    {"codes": ["E11.9"]},
    {"codes": ["E11"], "limit": 20},
    {"codes": ["I50", "I48.91"], "limit": 20},
    {"codes": ["I50", "I48"], "limit": 20},
    {"codes": ["I10"], "sex": "F", "age_min": 60, "age_max": 80, "limit": 20},
    {"codes": ["J18.9"], "sex": "M", "age_max": 70, "limit": 10},
    {"condition": "heart failure", "limit": 20},
    {"condition": "Type 2 DIABETES", "codes": ["N18.32"], "limit": 20},
    {"condition": "pneumonia", "sex": "F", "limit": 20},
    {"condition": "diabet_% 100%"},
    {"condition": "xenotransplant rejection"},
    {"codes": ["I10"], "age_min": 90},
]


@pytest.mark.parametrize("query", SIMILAR_QUERIES, ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()))
def test_similar_gives_identical_results_on_postgres_and_sqlite(pg_tool, sqlite_tool, query):
    on_pg, on_sqlite = pg_tool.invoke(query), sqlite_tool.invoke(query)
    assert isinstance(on_pg, str), on_pg
    assert on_pg == on_sqlite
    assert on_pg.startswith("Similar patients for ")


def test_similar_results_are_substantial(pg_db):
    """The parity above compares real content: matches, statistics and case summaries."""
    out = pg_db.similar(codes=["I50", "I48"], limit=20)
    assert re.search(r": (\d+)-\d+ matching patients \(counts are ranges\)\.", out)
    groups = released_selection(pg_db.release(), ["I50", "I48"])
    assert len(re.findall(r"^Case group \d+ \(\d+-\d+ patients, matching [12]/2: ", out, flags=re.M)) == len(groups) >= 3
    assert "abnormal labs " in out
    assert "Most common medications: " in pg_db.similar(codes=["E11", "I10"], limit=20)
    assert "no group of at least 3 matching patients to show" in pg_db.similar(condition="xenotransplant rejection")


def test_small_cohorts_are_withheld_on_postgres(pg_url):
    strict = EMRDatabase(pg_url, populate=False, min_cohort_size=1000)
    try:
        out = emr_tool(strict).invoke("patients with I10")
    finally:
        strict.engine.dispose()
    assert "no group of at least 1000 matching patients to show" in out and "Case" not in out


def test_k_anonymity_holds_identically_on_postgres(pg_db, sqlite_db, pg_tool, sqlite_tool, rows):
    """Every code pair the old ranking singled out: the same release, the same answer, only groups of >= k."""
    facts, ages, match = facts_from_rows(rows), latest_ages(rows), CodeMatcher(rows)
    assert pg_db.release() == sqlite_db.release()
    verify_release(pg_db.release(), rows, K)
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    by_pair = {pair: match(pair) for pair in combinations(codes, 2)}
    rare = [p for p, m in by_pair.items() if sum(len(hit) == 2 for hit, _a in m.values()) == 1 and len(m) >= K]
    assert ("A41.9", "E11.22") in rare and len(rare) >= 50
    for pair in rare:
        query = {"operation": "similar", "codes": list(pair), "limit": 20}
        out = pg_tool.invoke(query)
        assert out == sqlite_tool.invoke(query)
        released = sum(g.size for g in released_selection(pg_db.release(), pair))
        if released < K:
            assert "Case group" not in out
            continue
        assert f": {count_bucket(released, K)} matching patients" in out
        for case in parse_case_groups(out, list(pair)):
            assert len(shown_supporters(case, facts, ages)) >= case.low >= K, (pair, case)
    assert pg_db.patient_facts() == sqlite_db.patient_facts() == facts


def test_the_release_is_persisted_on_postgres(pg_url, pg_db):
    """Another process on the same PostgreSQL database serves the rows the first one published, without
    publishing again (issue 40 item 4; the replica and admission tests run on SQLite)."""
    published = pg_db.release()
    other = EMRDatabase(pg_url, populate=False)
    try:
        assert other.release() == published
        with other.engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(select(release_batches.c.k, release_batches.c.batch))] == [(K, 1)]
    finally:
        other.engine.dispose()


def test_lookup_gives_identical_records_for_every_patient(pg_db, sqlite_db, rows):
    for p in rows["patients"]:
        on_pg = pg_db.lookup(p["patient_id"])
        assert on_pg == sqlite_db.lookup(p["patient_id"]), p["patient_id"]
        assert on_pg.startswith(f"Patient {p['patient_id']}:")


# ---------------------------------------------------------------- access control and redaction through the tool


def test_lookup_without_or_outside_permission_is_forbidden_before_any_sql(pg_db):
    tool = emr_tool(pg_db)
    args = {"operation": "lookup", "patient_id": "P00002"}
    with captured_sql(pg_db) as seen:
        anonymous = tool.invoke(args)
        outside = tool.invoke(args, config=cfg("P00001", "P00003"))
        nobody = tool.invoke("record of P00002", config=cfg(none=True))  # None means no records, not all
    for err in (anonymous, outside, nobody):
        assert isinstance(err, ToolError) and err.kind == "forbidden", err
    assert "P00002" in outside.message
    assert seen == []  # refused before the database was asked anything


def test_allowed_lookup_is_redacted_on_postgres(pg_db, sqlite_db, rows):
    pid = "P00003"
    out = emr_tool(pg_db).invoke({"operation": "lookup", "patient_id": pid}, config=cfg(pid, "P00009"))
    assert isinstance(out, str) and out.startswith(f"Patient {pid}:")
    assert out == emr_tool(sqlite_db).invoke({"operation": "lookup", "patient_id": pid}, config=cfg(pid))
    for d in rows["diagnoses"]:
        if d["patient_id"] == pid:
            assert d["icd_code"] in out
    person = next(p for p in rows["patients"] if p["patient_id"] == pid)
    for value in (person["mrn"], person["phone"], person["address"], person["first_name"], person["last_name"],
                  person["birth_date"].strftime("%m/%d/%Y"), person["birth_date"].isoformat()):
        assert value not in out
    assert "[NAME]" in out and "[MRN]" in out and "[PHONE]" in out  # the stored notes did carry them


def test_missing_patient_and_cross_caller_cache_on_postgres(pg_db):
    err = emr_tool(pg_db).invoke({"patient_id": "P09999"}, config=cfg("P09999"))
    assert isinstance(err, ToolError) and err.kind == "not_found"
    cached = emr_tool(pg_db, options=ToolOptions(cache_size=16))
    args = {"operation": "lookup", "patient_id": "P00005"}
    assert cached.invoke(args, config=cfg("P00005")).startswith("Patient P00005:")
    err = cached.invoke(args, config=cfg("P00006", user="dr-b"))
    assert isinstance(err, ToolError) and err.kind == "forbidden"


def test_similar_on_postgres_is_de_identified(pg_tool, rows):
    out = pg_tool.invoke({"codes": ["I10"], "limit": 20})
    assert len(re.findall(r"^Case group \d+ ", out, flags=re.M)) >= 8
    for ident in identifiers(rows):
        assert ident not in out
    assert not re.search(r"\bP\d{5}\b", out)
    assert not re.search(r"\b(19|20)\d\d-\d\d-\d\d\b", out)


def test_url_password_is_kept_out_of_repr_and_tool_output(pg):
    url = pg.url("emr").replace("tcrag@", "tcrag:s3cret-pw@")  # trust auth: the password is not checked
    db = EMRDatabase(url, n_patients=N, seed=SEED)
    try:
        assert db.count_patients() == N
        assert "s3cret-pw" not in repr(db) and db.secrets == ("s3cret-pw",)
        assert "s3cret-pw" not in emr_tool(db, options=WIDE).invoke({"codes": ["I10"], "limit": 20})
    finally:
        db.engine.dispose()


# ---------------------------------------------------------------- injection


@pytest.mark.parametrize(
    "payload",
    [
        {"codes": ["E11.9' OR '1'='1"]},
        {"codes": ["E11.9; DROP TABLE patients"]},
        {"patient_id": "P00001' OR '1'='1"},
        {"patient_id": "1; DELETE FROM patients"},
        {"operation": "lookup; DROP TABLE patients", "patient_id": "P00001"},
        {"sex": "F' OR 'x'='x", "codes": ["I10"]},
        {"codes": ["I10"], "limit": "3; SELECT pg_sleep(10)"},
    ],
)
def test_injection_in_structured_fields_never_reaches_postgres(pg_db, payload):
    with captured_sql(pg_db) as seen:
        err = emr_tool(pg_db).invoke(payload, config=cfg("P00001"))
    assert isinstance(err, ToolError) and err.kind == "bad_input", err
    assert seen == []


FREE_TEXT_ATTACKS = [
    "'; DROP TABLE patients; --",
    "heart\" OR 1=1 --",
    "failure%' UNION SELECT mrn FROM patients --",
    "x') OR pg_sleep(10) IS NULL; --",
    "$1; TRUNCATE labs CASCADE",
    "diabet_% 100% \\",
]


@pytest.mark.parametrize("condition", FREE_TEXT_ATTACKS)
def test_free_text_attacks_travel_only_as_bound_parameters(pg, pg_db, sqlite_db, rows, condition):
    before = table_counts(pg_db)
    with captured_sql(pg_db) as seen:
        out = emr_tool(pg_db, options=WIDE).invoke({"condition": condition})
    assert seen, "the search ran on PostgreSQL"
    for statement, _params in seen:
        upper = statement.upper()
        assert not any(word in upper for word in ("DROP", "UNION", "PG_SLEEP", "TRUNCATE", "DELETE"))
        # the only quoted literal is our own LIKE escape character; model text is never spliced in
        assert "'" not in re.sub(r"ESCAPE '\\{1,2}'", "", statement), statement
    words = [w for w in re.findall(r"[a-z0-9]+", condition.lower()) if len(w) > 2][:1]
    assert any(words[0] in str(params) for _s, params in seen)  # it went as a parameter value
    assert out == emr_tool(sqlite_db, options=WIDE).invoke({"condition": condition})
    assert table_counts(pg_db) == before
    for ident in identifiers(rows):
        assert ident not in str(out)


def test_plain_text_attack_through_the_text_parser(pg_db, sqlite_db):
    attack = "patients with E11.9'; DROP TABLE patients; -- aged 60-80"
    out = emr_tool(pg_db).invoke(attack)
    assert isinstance(out, str) and out == emr_tool(sqlite_db).invoke(attack)
    assert pg_db.count_patients() == N


def test_postgres_saw_no_failed_statement_and_kept_every_table(pg, pg_db):
    """Runs after the injection tests: the server log has no SQL error, every table is intact."""
    with pg_db.engine.connect() as conn:
        present = {t: conn.execute(text("SELECT to_regclass(:t)"), {"t": t}).scalar_one() for t in TABLES}
    assert all(present.values()), present
    assert pg_db.count_patients() == N
    log = pg.log_text()
    assert "database system is ready to accept connections" in log  # it is the real server's log
    assert not re.search(r"\b(ERROR|FATAL|PANIC):", log), log[-3000:]
