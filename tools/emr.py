"""EMR_SEARCH: electronic medical records in a real SQL database, with access control and redaction.

* A MIMIC-like schema (``patients``, ``admissions``, ``diagnoses`` + ``d_icd_diagnoses``,
  ``medications``, ``labs``) defined with SQLAlchemy Core; any SQLAlchemy URL works (SQLite by
  default, PostgreSQL too).
* :func:`generate_cohort` builds a deterministic synthetic cohort (seeded) from clinical profiles in
  ``tools/data/emr_profiles.json``: real ICD-10-CM codes and descriptions (``simple-icd-10-cm``),
  plausible comorbidity clusters, medications and lab values. All people are fictitious.
* Two operations: ``similar`` (patients matching diagnosis codes / a condition phrase, age range
  and sex, returned as de-identified case summaries plus cohort aggregates, with small cohorts
  withheld) and ``lookup`` (one patient's record; only for a caller whose
  ``allowed_patient_ids`` contains the patient, else ``ToolError(kind="forbidden")``).
* Every query uses bound parameters (SQLAlchemy Core); model text never becomes SQL.
* Names, MRNs, exact birth dates, addresses and phone numbers never leave the tool: they are not
  selected into summaries, and every observation is scrubbed of them (the free-text notes carry them).

Example:
    >>> from tcrag_langgraph.tools.identity import CALLER_KEY, CallerContext
    >>> tool = default_emr_tool(in_memory=True, n_patients=60)
    >>> print(tool.invoke("patients with E11.9")[:40])  # doctest: +SKIP
    Similar patients: 21 match (codes E11.9).
    >>> cfg = {"configurable": {CALLER_KEY: CallerContext(user_id="dr-a", allowed_patient_ids=("P00001",))}}
    >>> tool.invoke({"operation": "lookup", "patient_id": "P00001"}, config=cfg).startswith("Patient P00001")
    True
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import tempfile
import threading
from collections import Counter
from datetime import date, datetime, timedelta
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Literal, Optional, Sequence

from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import (
    Column,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    case,
    create_engine,
    distinct,
    func,
    insert,
    literal,
    or_,
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from .identity import caller_from_config

from .layer import LayeredTool, ToolFailure, make_tool

__all__ = [
    "EMR_SEARCH_NAME",
    "EMR_SEARCH_DESCRIPTION",
    "metadata",
    "patients",
    "admissions",
    "diagnoses",
    "d_icd_diagnoses",
    "medications",
    "labs",
    "load_profiles",
    "generate_cohort",
    "EMRDatabase",
    "EMRInput",
    "parse_emr_text",
    "Redactor",
    "emr_tool",
    "default_emr_tool",
    "default_emr_path",
]

logger = logging.getLogger(__name__)

EMR_SEARCH_NAME = "EMR_SEARCH"
EMR_SEARCH_DESCRIPTION = (
    "Search electronic medical records. Two operations: "
    '(1) similar patients: {"operation": "similar", "codes": ["E11.9"], "condition": "heart failure", '
    '"sex": "F", "age_min": 60, "age_max": 80, "limit": 3} (codes are ICD-10-CM; give codes and/or a condition '
    "phrase; returns de-identified case summaries and cohort statistics); "
    '(2) one patient\'s record: {"operation": "lookup", "patient_id": "P00042"} (only patients you are '
    'allowed to see). Plain text also works, e.g. "patients with E11.9, female, aged 60-80" or "record of P00042".'
)

SCHEMA_VERSION = 1

# --------------------------------------------------------------------------- schema

metadata = MetaData()

patients = Table(
    "patients",
    metadata,
    Column("patient_id", String(16), primary_key=True),
    Column("mrn", String(16), nullable=False, unique=True),
    Column("first_name", String(64), nullable=False),
    Column("last_name", String(64), nullable=False),
    Column("sex", String(1), nullable=False),
    Column("birth_date", Date, nullable=False),
    Column("address", String(200), nullable=False),
    Column("phone", String(32), nullable=False),
)

admissions = Table(
    "admissions",
    metadata,
    Column("admission_id", Integer, primary_key=True, autoincrement=False),
    Column("patient_id", String(16), ForeignKey("patients.patient_id"), nullable=False, index=True),
    Column("admit_time", DateTime, nullable=False),
    Column("discharge_time", DateTime, nullable=False),
    Column("age_at_admit", Integer, nullable=False),
    Column("admission_type", String(32), nullable=False),
    Column("disposition", String(64), nullable=False),
    Column("note", Text, nullable=False),
)

d_icd_diagnoses = Table(
    "d_icd_diagnoses",
    metadata,
    Column("icd_code", String(10), primary_key=True),
    Column("long_title", String(300), nullable=False),
)

diagnoses = Table(
    "diagnoses",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("admission_id", Integer, ForeignKey("admissions.admission_id"), nullable=False, index=True),
    Column("patient_id", String(16), ForeignKey("patients.patient_id"), nullable=False, index=True),
    Column("seq_num", Integer, nullable=False),
    Column("icd_code", String(10), ForeignKey("d_icd_diagnoses.icd_code"), nullable=False),
    Index("ix_diagnoses_icd_code", "icd_code"),
)

medications = Table(
    "medications",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("admission_id", Integer, ForeignKey("admissions.admission_id"), nullable=False, index=True),
    Column("patient_id", String(16), ForeignKey("patients.patient_id"), nullable=False, index=True),
    Column("drug", String(100), nullable=False),
    Column("dose", String(50), nullable=False),
    Column("route", String(16), nullable=False),
    Column("start_time", DateTime, nullable=False),
)

labs = Table(
    "labs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("admission_id", Integer, ForeignKey("admissions.admission_id"), nullable=False, index=True),
    Column("patient_id", String(16), ForeignKey("patients.patient_id"), nullable=False, index=True),
    Column("label", String(64), nullable=False),
    Column("value", Float, nullable=False),
    Column("unit", String(32), nullable=False),
    Column("ref_low", Float, nullable=False),
    Column("ref_high", Float, nullable=False),
    Column("flag", String(8), nullable=True),  # "H", "L" or NULL
    Column("chart_time", DateTime, nullable=False),
)

emr_meta = Table(
    "emr_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

# --------------------------------------------------------------------------- synthetic cohort


@lru_cache(maxsize=1)
def load_profiles() -> dict[str, Any]:
    """The packaged clinical profiles (``tools/data/emr_profiles.json``)."""
    text = resources.files("tcrag_langgraph.tools").joinpath("data/emr_profiles.json").read_text(encoding="utf-8")
    return json.loads(text)


def _icd_descriptions(codes: Iterable[str]) -> dict[str, str]:
    """Real ICD-10-CM descriptions; a code the installed release lacks is a data bug, so fail loudly."""
    import simple_icd_10_cm as cm

    out = {}
    for code in sorted(set(codes)):
        if not cm.is_valid_item(code) or not cm.is_leaf(code):
            raise ValueError(f"emr_profiles.json uses {code!r}, which is not a billable ICD-10-CM code")
        out[code] = cm.get_description(code)
    return out


def _weighted(rng: random.Random, pairs: Sequence[Sequence[Any]]) -> Any:
    return rng.choices([p[0] for p in pairs], weights=[p[1] for p in pairs], k=1)[0]


def generate_cohort(n_patients: int = 300, seed: int = 7) -> dict[str, list[dict[str, Any]]]:
    """Rows for every table, fully determined by ``(n_patients, seed)``.

    Each patient gets a primary condition fitting their age, comorbidities drawn from the
    profile's co-occurrence probabilities, 1-3 admissions, the matching medications and lab
    values inside the condition's typical range (otherwise the normal range).

    Example:
        >>> a, b = generate_cohort(20, seed=1), generate_cohort(20, seed=1)
        >>> a == b, len(a["patients"])
        (True, 20)
    """
    if not 1 <= n_patients <= 100_000:
        raise ValueError("n_patients must be between 1 and 100000")
    prof = load_profiles()
    conditions: dict[str, dict[str, Any]] = prof["conditions"]
    lab_defs: dict[str, dict[str, Any]] = prof["labs"]
    rng = random.Random(seed)
    descriptions = _icd_descriptions(c for cond in conditions.values() for c in cond["codes"])
    rows: dict[str, list[dict[str, Any]]] = {
        "d_icd_diagnoses": [{"icd_code": c, "long_title": d} for c, d in descriptions.items()],
        "patients": [],
        "admissions": [],
        "diagnoses": [],
        "medications": [],
        "labs": [],
    }
    used_mrns: set[str] = set()
    admission_id = 100_000
    start = datetime(2018, 1, 1, 8, 0)

    def lab_value(label: str, active: list[str]) -> float:
        spec = lab_defs[label]
        lo, hi = spec["normal"]
        for key in active:  # the admission's reason first: it drives the abnormal values
            if label in conditions[key]["labs"]:
                lo, hi = conditions[key]["labs"][label]
                break
        return round(rng.uniform(lo, hi), spec["decimals"])

    for n in range(1, n_patients + 1):
        pid = f"P{n:05d}"
        sex = rng.choice("FM")
        age0 = int(min(95, max(18, rng.triangular(18, 96, 68))))
        eligible = [(k, c["weight"]) for k, c in conditions.items() if c["age"][0] <= age0 <= c["age"][1]]
        primary = _weighted(rng, eligible)
        chronic = [primary] if conditions[primary]["chronic"] else []
        for key, prob in conditions[primary]["comorbid"].items():
            if key not in chronic and rng.random() < prob and conditions[key]["chronic"]:
                chronic.append(key)
        # one code per condition per patient, so repeat admissions stay consistent
        code_of = {k: rng.choice(c["codes"]) for k, c in conditions.items()}
        mrn = f"{rng.randrange(10**7, 10**8)}"
        while mrn in used_mrns:
            mrn = f"{rng.randrange(10**7, 10**8)}"
        used_mrns.add(mrn)
        first = rng.choice(prof["first_names"][sex])
        last = rng.choice(prof["last_names"])
        first_admit = start + timedelta(days=rng.randrange(0, 5 * 365), hours=rng.randrange(0, 14))
        birth = (first_admit - timedelta(days=int(age0 * 365.25) + rng.randrange(0, 365))).date()
        address = f"{rng.randrange(10, 9999)} {rng.choice(prof['streets'])}, {rng.choice(prof['cities'])}"
        phone = f"555-{rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
        rows["patients"].append(
            dict(patient_id=pid, mrn=mrn, first_name=first, last_name=last, sex=sex,
                 birth_date=birth, address=address, phone=phone)
        )
        n_adm = 1 + (rng.random() < 0.4) + (rng.random() < 0.15)
        admit = first_admit
        for i in range(n_adm):
            age = admit.year - birth.year - ((admit.month, admit.day) < (birth.month, birth.day))
            if i == 0:
                reason = primary
            else:
                acute = [(k, c["weight"]) for k, c in conditions.items()
                         if not c["chronic"] and c["age"][0] <= age <= c["age"][1]]
                reason = _weighted(rng, acute) if acute and rng.random() < 0.6 else primary
            active = [reason] + [k for k in chronic if k != reason]
            if reason != primary and not conditions[reason]["chronic"]:
                for key, prob in conditions[reason]["comorbid"].items():
                    if key not in active and not conditions[key]["chronic"] and rng.random() < prob / 2:
                        active.insert(1, key)
            los = max(1, int(rng.gammavariate(2.0, 2.2)))
            discharge = admit + timedelta(days=los, hours=rng.randrange(0, 10))
            disposition = _weighted(rng, prof["dispositions"])
            adm_type = "ELECTIVE" if reason in ("hld", "obesity", "gerd") else _weighted(rng, prof["admission_types"])
            reason_text = descriptions[code_of[reason]]
            title = "Ms." if sex == "F" else "Mr."
            # Notes quote identifiers, as real notes do: the redactor must remove them.
            note = (
                f"{title} {first} {last} (MRN {mrn}, DOB {birth:%m/%d/%Y}) presented with "
                f"{reason_text.lower()}. Lives at {address}; contact {phone}. "
                f"Hospital course {los} day(s); discharged to {disposition.lower()}."
            )
            rows["admissions"].append(
                dict(admission_id=admission_id, patient_id=pid, admit_time=admit, discharge_time=discharge,
                     age_at_admit=age, admission_type=adm_type, disposition=disposition, note=note)
            )
            for seq, key in enumerate(active, 1):
                rows["diagnoses"].append(
                    dict(admission_id=admission_id, patient_id=pid, seq_num=seq, icd_code=code_of[key])
                )
            seen_drugs: set[str] = set()
            for key in active:
                meds = conditions[key]["medications"]
                for drug, dose, route in rng.sample(meds, k=min(len(meds), rng.randint(1, 2))) if meds else []:
                    if drug in seen_drugs:
                        continue
                    seen_drugs.add(drug)
                    rows["medications"].append(
                        dict(admission_id=admission_id, patient_id=pid, drug=drug, dose=dose, route=route,
                             start_time=admit + timedelta(hours=rng.randrange(1, 12)))
                    )
            wanted = list(prof["base_labs"])
            for key in active:
                wanted += [lab for lab in conditions[key]["labs"] if lab not in wanted]
            for label in wanted:
                spec = lab_defs[label]
                value = lab_value(label, active)
                flag = "H" if value > spec["high"] else "L" if value < spec["low"] else None
                rows["labs"].append(
                    dict(admission_id=admission_id, patient_id=pid, label=label, value=value, unit=spec["unit"],
                         ref_low=spec["low"], ref_high=spec["high"], flag=flag,
                         chart_time=admit + timedelta(hours=rng.randrange(1, 24)))
                )
            admission_id += 1
            if disposition == "DIED":
                break
            admit = discharge + timedelta(days=rng.randrange(20, 700))
    return rows


# --------------------------------------------------------------------------- redaction


class Redactor:
    """Removes the direct identifiers of given patients (and anything shaped like a phone/MRN) from text.

    Example:
        >>> r = Redactor([{"first_name": "Ann", "last_name": "Lee", "mrn": "12345678",
        ...     "birth_date": date(1950, 2, 3), "address": "1 Oak St, Madison", "phone": "555-123-4567"}])
        >>> r("Ms. Ann Lee (MRN 12345678, DOB 02/03/1950) of 1 Oak St, Madison, 555-123-4567")
        'Ms. [NAME] [NAME] (MRN [MRN], DOB [DOB]) of [ADDRESS], [PHONE]'
    """

    _PHONE = re.compile(r"(?:\+?1[-. ]?)?(?:\(\d{3}\)\s?|\b\d{3}[-. ])\d{3}[-. ]\d{4}\b")
    _MRN = re.compile(r"\b(MRN[:#]?\s*)\d{6,10}\b", re.IGNORECASE)

    def __init__(self, people: Iterable[dict[str, Any]]) -> None:
        literal: dict[str, str] = {}
        names: set[str] = set()
        for p in people:
            for key, tag in (("mrn", "[MRN]"), ("address", "[ADDRESS]"), ("phone", "[PHONE]")):
                if p.get(key):
                    literal[str(p[key])] = tag
            birth = p.get("birth_date")
            if isinstance(birth, date):
                for fmt in ("%m/%d/%Y", "%Y-%m-%d", "%d/%m/%Y", "%d.%m.%Y", "%B %d, %Y", "%b %d, %Y"):
                    literal[birth.strftime(fmt)] = "[DOB]"
            for key in ("first_name", "last_name"):
                if p.get(key):
                    names.add(str(p[key]))
        # longest first, so "1 Oak St, Madison" goes before any shorter overlap
        self._literal = sorted(literal.items(), key=lambda kv: -len(kv[0]))
        self._names = (
            re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
            if names
            else None
        )

    def __call__(self, text: str) -> str:
        for value, tag in self._literal:
            text = text.replace(value, tag)
        if self._names is not None:
            text = self._names.sub("[NAME]", text)
        text = self._MRN.sub(lambda m: m.group(1) + "[MRN]", text)
        return self._PHONE.sub("[PHONE]", text)


# --------------------------------------------------------------------------- database


def default_emr_path(seed: int = 7, n_patients: int = 300) -> Path:
    """Where the default synthetic SQLite database lives (``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``)."""
    env = os.environ.get("TCRAG_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "tcrag_langgraph"
    return base / f"emr-synthetic-v{SCHEMA_VERSION}-p{load_profiles()['version']}-s{seed}-n{n_patients}.sqlite"


def _age_band(age: int) -> str:
    if age >= 90:  # HIPAA Safe Harbor: ages over 89 are aggregated
        return "90+"
    lo = age // 5 * 5
    return f"{lo}-{lo + 4}"


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


_STOPWORDS = {"and", "the", "with", "without", "for", "not", "other", "unspecified", "from", "due"}


def _fmt_value(value: float) -> str:
    return f"{value:g}"


class EMRDatabase:
    """The EMR store: schema, synthetic population, and the two parameterised queries.

    ``url`` is any SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://...``); ``None``
    means an in-memory SQLite database. ``populate=True`` fills an empty database with
    :func:`generate_cohort` (``n_patients``, ``seed``).

    Example:
        >>> db = EMRDatabase(None, n_patients=40, seed=3)
        >>> db.count_patients()
        40
    """

    def __init__(self, url: Optional[str] = None, *, n_patients: int = 300, seed: int = 7, populate: bool = True,
                 min_cohort_size: int = 3) -> None:
        if min_cohort_size < 1:
            raise ValueError("min_cohort_size must be at least 1")
        self.min_cohort_size = min_cohort_size
        self._lock = threading.RLock() if url is None else None
        if url is None:
            # one shared connection, or each thread would see its own empty in-memory database
            self.engine: Engine = create_engine(
                "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}, hide_parameters=True
            )
        else:
            kwargs: dict[str, Any] = {"hide_parameters": True, "pool_pre_ping": True}
            if make_url(url).get_backend_name() == "sqlite":
                kwargs["connect_args"] = {"check_same_thread": False}
            self.engine = create_engine(url, **kwargs)
        password = make_url(url).password if url else None
        self.secrets: tuple[str, ...] = (str(password),) if password else ()
        metadata.create_all(self.engine)
        if populate and self.count_patients() == 0:
            self.populate(generate_cohort(n_patients, seed), seed=seed)

    def __repr__(self) -> str:
        return f"EMRDatabase({self.engine.url.render_as_string(hide_password=True)!r})"

    def _conn(self):
        return self.engine.begin()

    def _locked(self):
        return self._lock if self._lock is not None else _NullLock()

    def populate(self, rows: dict[str, list[dict[str, Any]]], *, seed: Optional[int] = None) -> None:
        """Insert generated rows in one transaction (executemany with bound parameters)."""
        with self._locked(), self._conn() as conn:
            for table in (d_icd_diagnoses, patients, admissions, diagnoses, medications, labs):
                if rows.get(table.name):
                    conn.execute(insert(table), rows[table.name])
            conn.execute(
                insert(emr_meta),
                [{"key": "schema_version", "value": str(SCHEMA_VERSION)},
                 {"key": "seed", "value": str(seed)},
                 {"key": "n_patients", "value": str(len(rows.get("patients", [])))}],
            )

    def count_patients(self) -> int:
        with self._locked(), self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(patients)).scalar_one())

    # -- similar-patient search

    def similar(
        self,
        *,
        codes: Sequence[str] = (),
        condition: Optional[str] = None,
        sex: Optional[str] = None,
        age_min: Optional[int] = None,
        age_max: Optional[int] = None,
        limit: int = 5,
    ) -> str:
        """De-identified summaries of patients matching any criterion (best matches first) plus cohort statistics."""
        criteria = []
        labels = []
        for code in codes:
            # "E11" or "E11.6" also match their subcodes; codes are validated to [A-Z0-9.] already
            criteria.append(or_(diagnoses.c.icd_code == code, diagnoses.c.icd_code.like(_like_escape(code) + "%", escape="\\")))
            labels.append(code)
        if condition:
            words = [w for w in re.findall(r"[a-z0-9]+", condition.lower()) if len(w) > 2 and w not in _STOPWORDS][:6]
            if words:
                # each word must start a word of the title ("diabet" finds "diabetes", "or" finds nothing)
                title = literal(" ") + func.lower(d_icd_diagnoses.c.long_title)
                titles = select(d_icd_diagnoses.c.icd_code).where(
                    and_(*[or_(*[title.like(f"%{sep}{_like_escape(w)}%", escape="\\") for sep in (" ", "(", "-", "[")])
                           for w in words])
                )
                criteria.append(diagnoses.c.icd_code.in_(titles))
                labels.append(f'"{condition}"')
        if not criteria:
            if condition:
                raise ToolFailure("bad_input", f"the condition {condition!r} has no searchable words; "
                                  "use words of a diagnosis (e.g. 'heart failure') or ICD-10-CM codes")
            raise ToolFailure("bad_input", "give at least one ICD-10-CM code or a condition phrase")
        filters = [or_(*criteria)]
        if sex:
            filters.append(patients.c.sex == sex)
        if age_min is not None:
            filters.append(admissions.c.age_at_admit >= age_min)
        if age_max is not None:
            filters.append(admissions.c.age_at_admit <= age_max)
        joined = diagnoses.join(admissions, diagnoses.c.admission_id == admissions.c.admission_id).join(
            patients, diagnoses.c.patient_id == patients.c.patient_id
        )
        score = sum(func.max(case((crit, 1), else_=0)) for crit in criteria)
        matched = (
            select(diagnoses.c.patient_id.label("patient_id"), score.label("score"),
                   func.max(admissions.c.age_at_admit).label("age"))
            .select_from(joined)
            .where(*filters)
            .group_by(diagnoses.c.patient_id)
        ).subquery("matched")
        matched_ids = select(matched.c.patient_id)

        with self._locked(), self.engine.connect() as conn:
            total = int(conn.execute(select(func.count()).select_from(matched)).scalar_one())
            described = ", ".join(labels)
            demo = [f"sex {sex}"] if sex else []
            if age_min is not None or age_max is not None:
                demo.append(f"age {age_min if age_min is not None else 0}-{age_max if age_max is not None else 'any'}")
            header = f"Similar patients for {described}" + (f" ({', '.join(demo)})" if demo else "")
            if total == 0:
                return f"{header}: no matching patients."
            if total < self.min_cohort_size:
                return (f"{header}: fewer than {self.min_cohort_size} matching patients; details are withheld "
                        "to protect privacy. Widen the criteria (e.g. a broader code or age range).")
            top = conn.execute(
                select(matched.c.patient_id, matched.c.score, matched.c.age)
                .order_by(matched.c.score.desc(), matched.c.patient_id)
                .limit(limit)
            ).all()
            sexes = dict(conn.execute(
                select(patients.c.sex, func.count()).where(patients.c.patient_id.in_(matched_ids)).group_by(patients.c.sex)
            ).all())
            ages = conn.execute(select(func.min(matched.c.age), func.max(matched.c.age), func.avg(matched.c.age))).one()
            top_dx = conn.execute(
                select(diagnoses.c.icd_code, d_icd_diagnoses.c.long_title, func.count(distinct(diagnoses.c.patient_id)).label("n"))
                .join(d_icd_diagnoses, diagnoses.c.icd_code == d_icd_diagnoses.c.icd_code)
                .where(diagnoses.c.patient_id.in_(matched_ids))
                .group_by(diagnoses.c.icd_code, d_icd_diagnoses.c.long_title)
                .order_by(func.count(distinct(diagnoses.c.patient_id)).desc(), diagnoses.c.icd_code)
                .limit(6)
            ).all()
            top_rx = conn.execute(
                select(medications.c.drug, func.count(distinct(medications.c.patient_id)).label("n"))
                .where(medications.c.patient_id.in_(matched_ids))
                .group_by(medications.c.drug)
                .order_by(func.count(distinct(medications.c.patient_id)).desc(), medications.c.drug)
                .limit(6)
            ).all()
            ids = [r.patient_id for r in top]
            cases = self._case_details(conn, ids)

        lines = [f"{header}: {total} matching patients."]
        lines.append(
            f"Cohort: {sexes.get('F', 0)} female, {sexes.get('M', 0)} male; ages from {_age_band(int(ages[0]))} "
            f"to {_age_band(int(ages[1]))} (mean {float(ages[2]):.0f})."
        )
        lines.append("Most common diagnoses: " + "; ".join(f"{c} {t} ({n})" for c, t, n in top_dx) + ".")
        if top_rx:
            lines.append("Most common medications: " + "; ".join(f"{d} ({n})" for d, n in top_rx) + ".")
        for i, row in enumerate(top, 1):
            c = cases[row.patient_id]
            lines.append(
                f"Case {i} (matches {row.score}/{len(criteria)}): {c['sex']}, age {_age_band(row.age)}, "
                f"{c['n_adm']} admission(s), mean stay {c['los']:.0f} day(s), last discharge {c['disposition']}. "
                f"Diagnoses: {c['dx']}. Medications: {c['rx'] or 'none recorded'}. Abnormal labs: {c['labs'] or 'none'}."
            )
        return "\n".join(lines)

    def _case_details(self, conn: Any, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Clinical content only: no identifier column is selected here."""
        out: dict[str, dict[str, Any]] = {
            pid: {"dx": [], "rx": [], "labs": {}, "n_adm": 0, "los": 0.0, "disposition": "", "sex": ""} for pid in ids
        }
        if not ids:
            return out
        for pid, sex in conn.execute(select(patients.c.patient_id, patients.c.sex).where(patients.c.patient_id.in_(ids))):
            out[pid]["sex"] = {"F": "female", "M": "male"}.get(sex, sex)
        stays: dict[str, list[Any]] = {pid: [] for pid in ids}
        for row in conn.execute(
            select(admissions.c.patient_id, admissions.c.admit_time, admissions.c.discharge_time, admissions.c.disposition)
            .where(admissions.c.patient_id.in_(ids)).order_by(admissions.c.admit_time)
        ):
            stays[row.patient_id].append(row)
        for pid, rows in stays.items():
            out[pid]["n_adm"] = len(rows)
            out[pid]["los"] = sum((r.discharge_time - r.admit_time).total_seconds() for r in rows) / 86400 / max(1, len(rows))
            out[pid]["disposition"] = rows[-1].disposition if rows else "unknown"
        for pid, code, title in conn.execute(
            select(diagnoses.c.patient_id, diagnoses.c.icd_code, d_icd_diagnoses.c.long_title)
            .join(d_icd_diagnoses, diagnoses.c.icd_code == d_icd_diagnoses.c.icd_code)
            .where(diagnoses.c.patient_id.in_(ids)).order_by(diagnoses.c.admission_id, diagnoses.c.seq_num)
        ):
            item = f"{code} {title}"
            if item not in out[pid]["dx"]:
                out[pid]["dx"].append(item)
        for pid, drug in conn.execute(
            select(medications.c.patient_id, medications.c.drug).where(medications.c.patient_id.in_(ids)).order_by(medications.c.id)
        ):
            if drug not in out[pid]["rx"]:
                out[pid]["rx"].append(drug)
        # labs.c.id breaks chart_time ties: without it SQLite and PostgreSQL order (and so pick) labs differently
        for pid, label, value, unit, flag in conn.execute(
            select(labs.c.patient_id, labs.c.label, labs.c.value, labs.c.unit, labs.c.flag)
            .where(labs.c.patient_id.in_(ids), labs.c.flag.is_not(None)).order_by(labs.c.chart_time, labs.c.id)
        ):
            out[pid]["labs"][label] = f"{label} {_fmt_value(value)} {unit} ({flag})".replace("  ", " ")  # latest wins
        for c in out.values():
            c["dx"] = "; ".join(c["dx"][:6])
            c["rx"] = ", ".join(c["rx"][:6])
            c["labs"] = ", ".join(list(c["labs"].values())[:4])
        return out

    # -- record look-up

    def lookup(self, patient_id: str) -> str:
        """One patient's record, most recent admission first, with identifiers redacted. Call only after the access check."""
        with self._locked(), self.engine.connect() as conn:
            person = conn.execute(select(patients).where(patients.c.patient_id == patient_id)).mappings().first()
            if person is None:
                raise ToolFailure("not_found", f"no record for patient {patient_id}")
            adms = conn.execute(
                select(admissions).where(admissions.c.patient_id == patient_id).order_by(admissions.c.admit_time.desc())
            ).mappings().all()
            dx = conn.execute(
                select(diagnoses.c.admission_id, diagnoses.c.icd_code, d_icd_diagnoses.c.long_title)
                .join(d_icd_diagnoses, diagnoses.c.icd_code == d_icd_diagnoses.c.icd_code)
                .where(diagnoses.c.patient_id == patient_id).order_by(diagnoses.c.seq_num)
            ).all()
            rx = conn.execute(
                select(medications.c.admission_id, medications.c.drug, medications.c.dose, medications.c.route)
                .where(medications.c.patient_id == patient_id).order_by(medications.c.id)
            ).all()
            lab_rows = conn.execute(
                select(labs.c.admission_id, labs.c.label, labs.c.value, labs.c.unit, labs.c.flag)
                .where(labs.c.patient_id == patient_id).order_by(labs.c.id)
            ).all()
        redact = Redactor([dict(person)])
        sex = {"F": "female", "M": "male"}.get(person["sex"], person["sex"])
        last_age = adms[0]["age_at_admit"] if adms else None
        lines = [
            f"Patient {patient_id}: {sex}, age {last_age if last_age is not None and last_age < 90 else '90+'} "
            f"at last admission; {len(adms)} admission(s). (Name, MRN, birth date, address and phone withheld.)"
        ]
        for adm in adms:
            aid = adm["admission_id"]
            stay = (adm["discharge_time"] - adm["admit_time"]).days
            abnormal = [f"{l} {_fmt_value(v)} {u} ({f})".replace("  ", " ") for a, l, v, u, f in lab_rows if a == aid and f]
            normal = sum(1 for a, *_rest, f in lab_rows if a == aid and not f)
            lines.append(
                f"Admission {adm['admit_time']:%Y-%m-%d} ({adm['admission_type'].lower()}, {stay} day(s), "
                f"discharged to {adm['disposition'].lower()}). "
                f"Diagnoses: {'; '.join(f'{c} {t}' for a, c, t in dx if a == aid)}. "
                f"Medications: {', '.join(f'{d} {s} {r}' for a, d, s, r in rx if a == aid) or 'none'}. "
                f"Labs: {', '.join(abnormal) or 'no abnormal results'}"
                f"{f'; {normal} other result(s) normal' if normal else ''}. "
                f"Note: {adm['note']}"
            )
        return redact("\n".join(lines))


class _NullLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


# --------------------------------------------------------------------------- tool input

_ICD_CODE = re.compile(r"^[A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]{1,4})?$")
_ICD_IN_TEXT = re.compile(r"\b([A-TV-Z][0-9][0-9AB](?:\.[0-9A-Z]{1,4})?)\b", re.IGNORECASE)
_PID_IN_TEXT = re.compile(r"\b(P\d{1,6})\b", re.IGNORECASE)
_OPERATIONS = {
    "similar": "similar", "similar_patients": "similar", "similarpatients": "similar", "search": "similar",
    "cohort": "similar", "find": "similar", "match": "similar",
    "lookup": "lookup", "look_up": "lookup", "record": "lookup", "get": "lookup", "get_record": "lookup",
    "patient": "lookup", "fetch": "lookup", "read": "lookup",
}


def _normalise_code(code: str) -> str:
    code = str(code).strip().strip(".,;").upper().replace(" ", "")
    if len(code) > 3 and "." not in code:
        code = f"{code[:3]}.{code[3:]}"
    if not _ICD_CODE.match(code):
        raise ValueError(f"{code!r} is not an ICD-10-CM code (e.g. E11.9 or I50)")
    return code


def _normalise_pid(value: str) -> str:
    value = str(value).strip().upper()
    if value.isdigit():
        value = f"P{int(value):05d}"
    match = re.fullmatch(r"P(\d{1,6})", value)
    if not match:
        raise ValueError(f"{value!r} is not a patient id (e.g. P00042)")
    return f"P{int(match.group(1)):05d}"


class EMRInput(BaseModel):
    """Arguments of EMR_SEARCH. ``operation`` is inferred when omitted (patient_id -> lookup)."""

    model_config = ConfigDict(extra="forbid")

    operation: Optional[Literal["similar", "lookup"]] = Field(default=None, description="'similar' or 'lookup'.")
    codes: list[str] = Field(default_factory=list, max_length=10, description="ICD-10-CM codes, e.g. ['E11.9'].")
    condition: Optional[str] = Field(default=None, max_length=200, description="Words of a diagnosis, e.g. 'heart failure'.")
    sex: Optional[Literal["F", "M"]] = None
    age_min: Optional[int] = Field(default=None, ge=0, le=120)
    age_max: Optional[int] = Field(default=None, ge=0, le=120)
    patient_id: Optional[str] = Field(default=None, description="For lookup, e.g. 'P00042'.")
    limit: int = Field(default=3, ge=1, le=20, description="Case summaries to show (similar).")

    @field_validator("operation", mode="before")
    @classmethod
    def _operation(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = re.sub(r"[\s-]+", "_", value.strip().lower())
            if key not in _OPERATIONS:
                raise ValueError("operation must be 'similar' or 'lookup'")
            return _OPERATIONS[key]
        return value

    @field_validator("codes", mode="before")
    @classmethod
    def _codes(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            value = [v for v in re.split(r"[,;\s]+", value) if v]
        if not isinstance(value, (list, tuple)):
            raise ValueError("codes must be a list of ICD-10-CM codes")
        return list(dict.fromkeys(_normalise_code(v) for v in value))

    @field_validator("sex", mode="before")
    @classmethod
    def _sex(cls, value: Any) -> Any:
        if isinstance(value, str):
            v = value.strip().lower()
            if v in ("f", "female", "woman", "women"):
                return "F"
            if v in ("m", "male", "man", "men"):
                return "M"
            if v in ("", "any", "all", "either"):
                return None
        return value

    @field_validator("patient_id", mode="before")
    @classmethod
    def _pid(cls, value: Any) -> Any:
        return None if value in (None, "") else _normalise_pid(value)

    @field_validator("condition", mode="before")
    @classmethod
    def _condition(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            return value or None
        return value

    @model_validator(mode="after")
    def _operation_needs(self) -> "EMRInput":
        if self.operation is None:
            self.operation = "lookup" if self.patient_id and not (self.codes or self.condition) else "similar"
        if self.operation == "lookup" and not self.patient_id:
            raise ValueError("lookup needs patient_id, e.g. {\"operation\": \"lookup\", \"patient_id\": \"P00042\"}")
        if self.operation == "similar" and not (self.codes or self.condition):
            raise ValueError("similar needs codes (ICD-10-CM) or a condition phrase")
        if self.age_min is not None and self.age_max is not None and self.age_min > self.age_max:
            raise ValueError("age_min must not exceed age_max")
        return self


_FILLER = {
    "patient", "patients", "with", "similar", "find", "search", "show", "list", "get", "who", "have", "has", "had",
    "and", "or", "aged", "age", "ages", "years", "year", "old", "yo", "of", "the", "a", "an", "diagnosed",
    "diagnosis", "diagnoses", "code", "codes", "icd", "icd-10", "icd-10-cm", "cases", "case", "records", "record",
    "me", "for", "all", "any", "between", "to", "in", "on", "look", "up", "lookup", "please", "emr", "like", "that",
    "are", "is", "female", "females", "male", "males", "women", "woman", "men", "man", "over", "under", "older",
    "younger", "than", "above", "below", "from", "id",
}


def parse_emr_text(text: str) -> dict[str, Any]:
    """Read plain text a model wrote into EMR_SEARCH arguments.

    Example:
        >>> parse_emr_text("female patients with E11.9 and heart failure aged 60-80")
        {'codes': ['E11.9'], 'sex': 'F', 'age_min': 60, 'age_max': 80, 'condition': 'heart failure'}
        >>> parse_emr_text("record of P00042")
        {'operation': 'lookup', 'patient_id': 'P00042'}
    """
    out: dict[str, Any] = {}
    rest = text
    for pid in _PID_IN_TEXT.finditer(rest):
        if not _ICD_IN_TEXT.fullmatch(pid.group(1)):  # "P07" is an ICD-10-CM category, "P00042" a patient
            return {"operation": "lookup", "patient_id": pid.group(1)}
    codes = [m.group(1) for m in _ICD_IN_TEXT.finditer(rest)]
    if codes:
        out["codes"] = codes
        rest = _ICD_IN_TEXT.sub(" ", rest)
    low = rest.lower()
    if re.search(r"\b(female|females|women|woman|girls?)\b", low):
        out["sex"] = "F"
    elif re.search(r"\b(male|males|men|man|boys?)\b", low):
        out["sex"] = "M"
    rng = re.search(r"\b(\d{1,3})\s*(?:-|–|to|and)\s*(\d{1,3})\b", low)
    if rng:
        out["age_min"], out["age_max"] = int(rng.group(1)), int(rng.group(2))
        low = low.replace(rng.group(0), " ")
    else:
        lo = re.search(r"(?:over|older than|above|>=?)\s*(\d{1,3})", low)
        hi = re.search(r"(?:under|younger than|below|<=?)\s*(\d{1,3})", low)
        if lo:
            out["age_min"] = int(lo.group(1))
            low = low.replace(lo.group(0), " ")
        if hi:
            out["age_max"] = int(hi.group(1))
            low = low.replace(hi.group(0), " ")
    words = [w for w in re.findall(r"[a-z][a-z0-9'-]*", low) if w not in _FILLER]
    if words:
        out["condition"] = " ".join(words)
    if not out.get("codes") and not out.get("condition"):
        raise ValueError('name ICD-10-CM codes or a condition (e.g. "patients with E11.9") or a patient id (e.g. "P00042")')
    return out


# --------------------------------------------------------------------------- the tool


def emr_tool(
    db: EMRDatabase,
    *,
    name: str = EMR_SEARCH_NAME,
    description: str = EMR_SEARCH_DESCRIPTION,
    timeout_s: float = 15.0,
    retries: int = 1,
    backoff: float = 0.2,
    max_output_tokens: int = 800,
    cache_size: int = 0,
) -> LayeredTool:
    """EMR_SEARCH over ``db``, wrapped by the shared layer, with access control from the RunnableConfig.

    ``cache_size`` is 0 by default (records change); when set, cached results are keyed per caller.

    Example:
        >>> tool = emr_tool(EMRDatabase(None, n_patients=40, seed=3))
        >>> tool.invoke({"operation": "lookup", "patient_id": "P00001"}).kind  # no caller
        'forbidden'
    """

    def run(args: EMRInput, config: RunnableConfig) -> str:
        try:
            if args.operation == "lookup":
                caller = caller_from_config(config)
                # Refuse before touching the database, so the answer never reveals whether the patient exists.
                if caller is None:
                    raise ToolFailure("forbidden", "record look-up needs an authenticated caller")
                if not caller.may_see(args.patient_id):
                    raise ToolFailure("forbidden", f"caller {caller.user_id!r} may not see patient {args.patient_id}")
                return db.lookup(args.patient_id)
            return db.similar(codes=args.codes, condition=args.condition, sex=args.sex,
                              age_min=args.age_min, age_max=args.age_max, limit=args.limit)
        except OperationalError as exc:
            # connection-level problem: worth a retry; details (SQL, parameters) stay in the debug log
            logger.debug("EMR database error: %s", type(exc).__name__)
            raise ToolFailure("unavailable", f"EMR database unavailable ({type(exc).__name__})", retryable=True) from None
        except (DBAPIError, SQLAlchemyError) as exc:
            raise ToolFailure("internal", f"EMR database error ({type(exc).__name__})") from None

    return make_tool(
        name,
        description,
        run,
        args_schema=EMRInput,
        timeout_s=timeout_s,
        retries=retries,
        backoff=backoff,
        max_output_tokens=max_output_tokens,
        cache_size=cache_size,
        transient=(),
        text_parser=parse_emr_text,
        secrets=db.secrets,
    )


_DEFAULT_DBS: dict[tuple[Any, ...], EMRDatabase] = {}
_DEFAULT_LOCK = threading.Lock()


def _build_sqlite_file(path: Path, n_patients: int, seed: int) -> None:
    """Create the database beside ``path`` and rename it in place, so no reader sees a half-built file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        db = EMRDatabase(f"sqlite:///{tmp}", n_patients=n_patients, seed=seed)
        db.engine.dispose()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def default_emr_tool(
    *,
    url: Optional[str] = None,
    in_memory: bool = False,
    n_patients: int = 300,
    seed: int = 7,
    min_cohort_size: int = 3,
    **options: Any,
) -> LayeredTool:
    """The EMR_SEARCH tool over ``url``, or the embedded synthetic SQLite database.

    Without ``url`` the database file is created on first use in ``$TCRAG_CACHE_DIR`` (or
    ``~/.cache/tcrag_langgraph``) and reused; ``in_memory=True`` keeps it in this process only.
    ``url`` may also come from ``$TCRAG_EMR_URL``. ``options`` go to :func:`emr_tool`.

    Example:
        >>> default_emr_tool(in_memory=True, n_patients=30).name
        'EMR_SEARCH'
    """
    url = url or os.environ.get("TCRAG_EMR_URL")
    with _DEFAULT_LOCK:
        if url:
            key: tuple[Any, ...] = ("url", url, min_cohort_size)
            if key not in _DEFAULT_DBS:
                _DEFAULT_DBS[key] = EMRDatabase(url, n_patients=n_patients, seed=seed, min_cohort_size=min_cohort_size)
        elif in_memory:
            key = ("memory", n_patients, seed, min_cohort_size)
            if key not in _DEFAULT_DBS:
                _DEFAULT_DBS[key] = EMRDatabase(None, n_patients=n_patients, seed=seed, min_cohort_size=min_cohort_size)
        else:
            path = default_emr_path(seed, n_patients)
            key = ("file", str(path), min_cohort_size)
            if key not in _DEFAULT_DBS:
                if not path.exists():
                    _build_sqlite_file(path, n_patients, seed)
                _DEFAULT_DBS[key] = EMRDatabase(f"sqlite:///{path}", populate=False, min_cohort_size=min_cohort_size)
        db = _DEFAULT_DBS[key]
    return emr_tool(db, **options)
