"""Checks shared by the EMR tests on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
from contextlib import contextmanager
from types import SimpleNamespace

from sqlalchemy import event, func, insert, select

from tcrag_langgraph.tools.emr import PatientFacts, admissions, diagnoses, labs, medications, patients
from tcrag_langgraph.tools.emr.anonymity import age_band


@contextmanager
def captured_sql(db):
    """Every (statement, parameters) the engine sends to the database."""
    seen: list[tuple[str, object]] = []

    def listen(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", listen)


def identifiers(rows):
    """Every direct identifier in the cohort, in the forms a leak would take."""
    out = set()
    for p in rows["patients"]:
        out |= {p["mrn"], p["phone"], p["address"], f"{p['first_name']} {p['last_name']}",
                p["birth_date"].isoformat(), p["birth_date"].strftime("%m/%d/%Y")}
    return out


# ---------------------------------------------------------------- the k-anonymity rule, checked independently
# These recompute from the generated rows (not from the database or the tool's code) who matches a
# query and what each patient's facts are, and count how many patients share what a case shows.


def facts_from_rows(rows):
    """patient id -> PatientFacts, computed in Python from the generated rows."""
    dx, rx, lab, last = {}, {}, {}, {}
    for d in rows["diagnoses"]:
        dx.setdefault(d["patient_id"], set()).add(d["icd_code"])
    for m in rows["medications"]:
        rx.setdefault(m["patient_id"], set()).add(m["drug"])
    for x in rows["labs"]:
        if x["flag"]:
            lab.setdefault(x["patient_id"], set()).add(f"{x['label']} {'high' if x['flag'] == 'H' else 'low'}")
    for a in sorted(rows["admissions"], key=lambda a: (a["admit_time"], a["admission_id"])):
        last[a["patient_id"]] = a["disposition"]
    return {
        p["patient_id"]: PatientFacts(
            sex=p["sex"], diagnoses=frozenset(dx.get(p["patient_id"], ())), medications=frozenset(rx.get(p["patient_id"], ())),
            abnormal_labs=frozenset(lab.get(p["patient_id"], ())), last_disposition=last[p["patient_id"]])
        for p in rows["patients"]
    }


class CodeMatcher:
    """Who matches a code-only query, and with which criteria and age, from the generated rows."""

    def __init__(self, rows):
        age_of = {a["admission_id"]: a["age_at_admit"] for a in rows["admissions"]}
        self.ages_by_code = {}  # code -> patient -> oldest age at an admission carrying the code
        for d in rows["diagnoses"]:
            ages = self.ages_by_code.setdefault(d["icd_code"], {})
            ages[d["patient_id"]] = max(ages.get(d["patient_id"], 0), age_of[d["admission_id"]])

    def __call__(self, query_codes):
        """patient id -> (indices of the query codes matched, age at the latest matching admission)."""
        out = {}
        for i, wanted in enumerate(query_codes):
            for code, ages in self.ages_by_code.items():
                if code.startswith(wanted):
                    for pid, age in ages.items():
                        hit, old = out.get(pid, (frozenset(), 0))
                        out[pid] = (hit | {i}, max(old, age))
        return out


def supporters(shown, matched, facts):
    """The matching patients who share every attribute ``shown`` (a CaseGroup, or one parsed from text)."""
    out = []
    for pid, (criteria, age) in matched.items():
        f = facts[pid]
        if criteria != shown.criteria or (shown.sex is not None and f.sex != shown.sex):
            continue
        if shown.age_band is not None and age_band(age) != shown.age_band:
            continue
        if not (set(shown.diagnoses) <= f.diagnoses and set(shown.medications) <= f.medications
                and set(shown.abnormal_labs) <= f.abnormal_labs):
            continue
        if shown.last_disposition is not None and f.last_disposition != shown.last_disposition:
            continue
        out.append(pid)
    return out


_CASE_LINE = re.compile(
    r"^Case group \d+ \((?P<count>[\d-]+) patients, matching (?P<n>\d+)/(?P<of>\d+): (?P<labels>.*?)\): (?P<who>.*?)\. "
    r"Shared by all: diagnoses (?P<dx>.*?); medications (?P<rx>.*?); abnormal labs (?P<labs>.*?); "
    r"last discharge (?P<disp>.*?)\.$",
    re.M,
)


def parse_case_groups(text, labels):
    """The case groups an observation shows, read back from its text (criteria as indices into ``labels``)."""
    out = []
    for m in _CASE_LINE.finditer(text):
        who = m["who"]
        sex = band = None
        if who != "any sex, any age":
            word, band = re.fullmatch(r"(female|male|any sex), age (\S+)", who).groups()
            sex = None if word == "any sex" else word[0].upper()
        names = m["labels"].split(", ")
        assert len(names) == int(m["n"]) and int(m["of"]) == len(labels), m.group(0)
        out.append(SimpleNamespace(
            low=int(m["count"].split("-")[0]),
            criteria=frozenset(labels.index(n) for n in names), sex=sex, age_band=band,
            diagnoses=() if m["dx"] == "none shared" else tuple(d.split(" ")[0] for d in m["dx"].split("; ")),
            medications=() if m["rx"] == "none shared" else tuple(m["rx"].split(", ")),
            abnormal_labs=() if m["labs"] == "none shared" else tuple(m["labs"].split(", ")),
            last_disposition=None if m["disp"] == "varies" else m["disp"],
        ))
    return out


# ---------------------------------------------------------------- the released table (issue 21), checked independently


def latest_ages(rows):
    """patient id -> age at the latest admission, from the generated rows."""
    ages = {}
    for a in rows["admissions"]:
        ages[a["patient_id"]] = max(ages.get(a["patient_id"], 0), a["age_at_admit"])
    return ages


def span_of(label):
    """'60-79' -> (60, 79); '90+' -> (90, 200)."""
    if label.endswith("+"):
        return int(label[:-1]), 200
    low, high = label.split("-")
    return int(low), int(high)


def verify_release(release, rows, k):
    """Every released group holds at least k patients, no patient is in two, and every attribute the
    row shows is true of every member (recomputed from the generated rows)."""
    facts, ages = facts_from_rows(rows), latest_ages(rows)
    seen = set()
    for g in release:
        assert g.size >= k, g
        assert not seen & set(g.members)
        seen |= set(g.members)
        for pid in g.members:
            f = facts[pid]
            assert g.sex is None or f.sex == g.sex
            assert g.age_low <= ages[pid] <= g.age_high or (g.age_high >= 200 and ages[pid] >= g.age_low)
            assert g.diagnoses <= f.diagnoses and g.medications <= f.medications and g.abnormal_labs <= f.abnormal_labs
            assert g.last_disposition is None or f.last_disposition == g.last_disposition
    return seen


def widened(age_min, age_max):
    low = 0 if age_min is None else min(age_min // 10 * 10, 90)
    high = 200 if age_max is None else (200 if age_max >= 90 else age_max // 10 * 10 + 9)
    return low, high


def released_selection(release, prefixes, sex=None, age_min=None, age_max=None):
    """The released groups a code query selects, recomputed here (not with the tool's function)."""
    low, high = widened(age_min, age_max)
    out = []
    for g in release:
        if (sex and g.sex != sex) or g.age_low < low or g.age_high > high:
            continue
        if any(c.startswith(p) for c in g.diagnoses for p in prefixes):
            out.append(g)
    return out


def shown_supporters(case, facts, ages):
    """Patients sharing every attribute a shown case states (sex, age span, diagnoses, medications,
    abnormal labs, disposition), from the generated rows."""
    low, high = span_of(case.age_band)
    out = []
    for pid, f in facts.items():
        if case.sex is not None and f.sex != case.sex:
            continue
        if not low <= ages[pid] <= high:
            continue
        if not (set(case.diagnoses) <= f.diagnoses and set(case.medications) <= f.medications
                and set(case.abnormal_labs) <= f.abnormal_labs):
            continue
        if case.last_disposition is not None and f.last_disposition != case.last_disposition:
            continue
        out.append(pid)
    return out


# ---------------------------------------------------------------- admissions after a release (issue 40 item 4)


def admit_copy(db, source_id, new_id):
    """Admit a new patient ``new_id`` to ``db``: a copy of ``source_id``'s rows (person, admissions,
    diagnoses, medications, labs) under fresh ids, written the way an admission would be."""
    with db.engine.begin() as conn:
        person = dict(conn.execute(select(patients).where(patients.c.patient_id == source_id)).mappings().one())
        first = conn.execute(select(func.max(admissions.c.admission_id))).scalar_one() + 1
        adms = conn.execute(select(admissions).where(admissions.c.patient_id == source_id)
                            .order_by(admissions.c.admission_id)).mappings().all()
        renumber = {a["admission_id"]: first + i for i, a in enumerate(adms)}
        conn.execute(insert(patients), [{**person, "patient_id": new_id, "mrn": f"MRN-{new_id}"}])
        conn.execute(insert(admissions), [{**a, "patient_id": new_id, "admission_id": renumber[a["admission_id"]]}
                                          for a in adms])
        for table in (diagnoses, medications, labs):
            copied = [{**{c: v for c, v in r.items() if c != "id"}, "patient_id": new_id,
                       "admission_id": renumber[r["admission_id"]]}
                      for r in conn.execute(select(table).where(table.c.patient_id == source_id)).mappings()]
            if copied:
                conn.execute(insert(table), copied)
