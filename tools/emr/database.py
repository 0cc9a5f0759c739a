"""The EMR store: engine and connection handling, the synthetic population, and the parameterised queries.

Every query is SQLAlchemy Core with bound parameters; model text never becomes SQL. What a
similar-patient answer may show is decided in :mod:`.anonymity`; this module only fetches facts.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

from sqlalchemy import and_, create_engine, func, insert, literal, or_, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.pool import StaticPool

from ..layer import ToolFailure
from .anonymity import (PatientFacts, ReleasedGroup, release_groups, release_order, render_released,
                        select_released, span_label, widen_to_bands)
from .cohort import generate_cohort, load_profiles
from .redaction import Redactor
from .schema import (SCHEMA_VERSION, admissions, d_icd_diagnoses, diagnoses, emr_meta, labs, medications, metadata,
                     patients, release_batches, released_groups, released_members)

__all__ = ["EMRDatabase", "default_emr_path"]


def default_emr_path(seed: int = 7, n_patients: int = 300) -> Path:
    """Where the default synthetic SQLite database lives (``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``)."""
    env = os.environ.get("TCRAG_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "tcrag_langgraph"
    return base / f"emr-synthetic-v{SCHEMA_VERSION}-p{load_profiles()['version']}-s{seed}-n{n_patients}.sqlite"


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


_STOPWORDS = {"and", "the", "with", "without", "for", "not", "other", "unspecified", "from", "due"}
_FLAG_WORD = {"H": "high", "L": "low"}


def _fmt_value(value: float) -> str:
    return f"{value:g}"


class EMRDatabase:
    """The EMR store: schema, synthetic population, and the two parameterised queries.

    ``url`` is any SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://...``); ``None``
    means an in-memory SQLite database. ``populate=True`` fills an empty database with
    :func:`generate_cohort` (``n_patients``, ``seed``). ``min_cohort_size`` is the k of the
    similar-patient privacy rule (:mod:`.anonymity`).

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
        self._release: Optional[list[ReleasedGroup]] = None
        self._release_batch = 0  # the latest batch self._release holds
        self._release_seen: Optional[tuple] = None  # what _release_watch read when self._release was last settled
        self._release_lock = threading.Lock()
        # built once: it runs before every similar-patient answer, and building the statement would cost
        # several times what SQLite takes to run it
        self._release_watch = select(
            select(func.coalesce(func.max(release_batches.c.batch), 0))
            .where(release_batches.c.k == min_cohort_size).scalar_subquery(),
            select(func.count()).select_from(admissions).scalar_subquery(),
            select(func.max(admissions.c.admission_id)).scalar_subquery(),
        )
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

    def _locked(self):
        return self._lock if self._lock is not None else _NullLock()

    def populate(self, rows: dict[str, list[dict[str, Any]]], *, seed: Optional[int] = None) -> None:
        """Insert generated rows in one transaction (executemany with bound parameters)."""
        with self._locked(), self.engine.begin() as conn:
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
        """Bucketed cohort statistics and case groups, computed only from the released table
        (:meth:`release`): groups of at least ``min_cohort_size`` patients matching any criterion."""
        matchers, labels = self._matchers(codes, condition)
        selected = select_released(self.release(), matchers, sex=sex, age_min=age_min, age_max=age_max)
        demo = [f"sex {sex}"] if sex else []
        if age_min is not None or age_max is not None:
            low, high = widen_to_bands(age_min, age_max)
            demo.append(f"age {span_label(low, high)}, whole 10-year bands")
        header = f"Similar patients for {', '.join(labels)}" + (f" ({', '.join(demo)})" if demo else "")
        return render_released(header, labels, selected, k=self.min_cohort_size, limit=limit,
                               titles=self.diagnosis_titles())

    def release(self) -> list[ReleasedGroup]:
        """The released table similar-patient search reads, kept in the database itself.

        A release only grows, by batches: batch 1 partitions every admitted patient into groups of
        at least k = ``min_cohort_size`` that share a diagnosis (:func:`~.anonymity.release_groups`);
        a later batch is published only when at least k admitted patients are not covered yet
        ("pending"), and partitions those pending patients among themselves, never into a published
        group. Published groups are never changed or removed, and a pending patient who fits no group
        yet stays pending. So between any two releases every answer either is the same or is computed
        from a patient set larger by whole new groups of at least k newly covered patients: an answer
        never moves by fewer than k patients, however few are admitted and however they spread.

        Every call first asks the database, in one cheap query, for its latest batch and its number
        and highest id of admissions; only when these moved does it count the pending patients (and
        publish if there are k) or read newly published rows. So processes and replicas on one
        database serve the same rows, and a restart reads them instead of building new ones. A batch
        is derived deterministically from the pending patients, and the primary keys of the release
        tables let only one writer publish a batch (another replica's attempt fails and it reads the
        winner's rows).

        The rows are a snapshot: a covered patient's later admissions change nothing in the release,
        and deleting a patient does not remove them from their group.
        """
        with self._release_lock, self._locked():
            seen = self._watch()
            while seen != self._release_seen:
                self._release_seen = seen
                if self._release is None or seen[0] != self._release_batch:
                    self._release, self._release_batch = self._load_release(seen[0]), seen[0]
                if self._count_pending() >= self.min_cohort_size:
                    self._publish(seen[0] + 1)
                    # look again whatever came of it: a batch may have gone in (ours, or a replica's that won the
                    # race), and a replica that published between our count and our read left us nothing to
                    # group; an unchanged look ends the loop, a changed one covers at least k more patients
                    seen = self._watch()
            return self._release

    def _watch(self) -> tuple:
        """(latest published batch or 0, number of admissions, highest admission id): what moves when
        patients are admitted or another process publishes."""
        with self.engine.connect() as conn:
            return tuple(conn.execute(self._release_watch).one())

    def _pending(self) -> Any:
        """Admitted patients the release of this k does not cover yet (a WHERE clause on ``patients``)."""
        covered = select(released_members.c.patient_id).where(released_members.c.k == self.min_cohort_size)
        return and_(patients.c.patient_id.in_(select(admissions.c.patient_id)), patients.c.patient_id.not_in(covered))

    def _count_pending(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(patients).where(self._pending())).scalar_one())

    def _publish(self, batch: int) -> None:
        """Publish the pending patients' groups as ``batch``; nothing is written if they form none, or if a
        replica published that batch first."""
        k = self.min_cohort_size
        ids = select(patients.c.patient_id).where(self._pending())
        with self.engine.connect() as conn:
            ages = dict(conn.execute(
                select(admissions.c.patient_id, func.max(admissions.c.age_at_admit))
                .where(admissions.c.patient_id.in_(ids)).group_by(admissions.c.patient_id)
            ).all())
            facts = self._facts(conn, ids)
        groups = release_groups({pid: (int(ages[pid]), f) for pid, f in facts.items() if pid in ages}, k=k)
        if not groups:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(release_batches), [{"k": k, "batch": batch, "n_patients": sum(g.size for g in groups)}])
                conn.execute(insert(released_groups), [
                    {"k": k, "batch": batch, "seq": seq, "sex": g.sex, "age_low": g.age_low, "age_high": g.age_high,
                     "diagnoses": sorted(g.diagnoses), "medications": sorted(g.medications),
                     "abnormal_labs": sorted(g.abnormal_labs), "last_disposition": g.last_disposition}
                    for seq, g in enumerate(groups)])
                conn.execute(insert(released_members), [
                    {"k": k, "patient_id": pid, "batch": batch, "seq": seq}
                    for seq, g in enumerate(groups) for pid in g.members])
        except IntegrityError:
            # another process or replica published this batch (or covered one of these patients) first:
            # nothing of ours was written, and the caller reads what it published
            pass

    def _load_release(self, batch: int) -> list[ReleasedGroup]:
        """The published groups of batches 1..``batch`` (later ones, committed meanwhile, wait for the next call)."""
        k = self.min_cohort_size
        with self.engine.connect() as conn:
            rows = conn.execute(select(released_groups).where(released_groups.c.k == k, released_groups.c.batch <= batch)
                                ).mappings().all()
            members: dict[tuple[int, int], list[str]] = {}
            for b, seq, pid in conn.execute(
                select(released_members.c.batch, released_members.c.seq, released_members.c.patient_id)
                .where(released_members.c.k == k, released_members.c.batch <= batch)
            ):
                members.setdefault((b, seq), []).append(pid)
        return sorted((ReleasedGroup(
            members=tuple(sorted(members[(r["batch"], r["seq"])])), sex=r["sex"], age_low=r["age_low"],
            age_high=r["age_high"], diagnoses=frozenset(r["diagnoses"]), medications=frozenset(r["medications"]),
            abnormal_labs=frozenset(r["abnormal_labs"]), last_disposition=r["last_disposition"]) for r in rows),
            key=release_order)

    def _matchers(self, codes: Sequence[str], condition: Optional[str]) -> tuple[list[Any], list[str]]:
        """One test on a diagnosis code per query criterion, and how each is named in the answer."""
        matchers: list[Any] = []
        labels: list[str] = []
        for code in codes:  # "E11" or "E11.6" also match their subcodes
            matchers.append(lambda c, p=code: c.startswith(p))
            labels.append(code)
        if condition:
            words = [w for w in re.findall(r"[a-z0-9]+", condition.lower()) if len(w) > 2 and w not in _STOPWORDS][:6]
            if words:
                # each word must start a word of the title ("diabet" finds "diabetes", "or" finds nothing)
                title = literal(" ") + func.lower(d_icd_diagnoses.c.long_title)
                query = select(d_icd_diagnoses.c.icd_code).where(
                    and_(*[or_(*[title.like(f"%{sep}{_like_escape(w)}%", escape="\\") for sep in (" ", "(", "-", "[")])
                           for w in words]))
                with self._locked(), self.engine.connect() as conn:
                    found = frozenset(conn.execute(query).scalars())
                matchers.append(lambda c, s=found: c in s)
                labels.append(f'"{condition}"')
        if not matchers:
            if condition:
                raise ToolFailure("bad_input", f"the condition {condition!r} has no searchable words; "
                                  "use words of a diagnosis (e.g. 'heart failure') or ICD-10-CM codes")
            raise ToolFailure("bad_input", "give at least one ICD-10-CM code or a condition phrase")
        return matchers, labels

    def diagnosis_titles(self) -> dict[str, str]:
        """ICD-10-CM code -> description, for every code the database knows."""
        with self._locked(), self.engine.connect() as conn:
            return dict(conn.execute(select(d_icd_diagnoses.c.icd_code, d_icd_diagnoses.c.long_title)).all())

    def patient_facts(self) -> dict[str, PatientFacts]:
        """The shown-able facts of every patient, by id (for checks of the privacy rule; never shown with ids)."""
        with self._locked(), self.engine.connect() as conn:
            return self._facts(conn, select(patients.c.patient_id))

    @staticmethod
    def _facts(conn: Any, ids: Any) -> dict[str, PatientFacts]:
        """Clinical facts of the patients selected by ``ids`` (a SELECT of patient ids); no identifier column."""
        sexes = dict(conn.execute(select(patients.c.patient_id, patients.c.sex).where(patients.c.patient_id.in_(ids))).all())
        found: dict[str, dict[str, set[str]]] = {pid: {"dx": set(), "rx": set(), "labs": set()} for pid in sexes}
        for pid, code in conn.execute(select(diagnoses.c.patient_id, diagnoses.c.icd_code).where(diagnoses.c.patient_id.in_(ids))):
            found[pid]["dx"].add(code)
        for pid, drug in conn.execute(select(medications.c.patient_id, medications.c.drug).where(medications.c.patient_id.in_(ids))):
            found[pid]["rx"].add(drug)
        for pid, label, flag in conn.execute(
            select(labs.c.patient_id, labs.c.label, labs.c.flag).where(labs.c.patient_id.in_(ids), labs.c.flag.is_not(None))
        ):
            found[pid]["labs"].add(f"{label} {_FLAG_WORD.get(flag, flag)}")
        last: dict[str, str] = {}
        for pid, disposition in conn.execute(
            select(admissions.c.patient_id, admissions.c.disposition)
            .where(admissions.c.patient_id.in_(ids)).order_by(admissions.c.admit_time, admissions.c.admission_id)
        ):
            last[pid] = disposition  # the latest admission wins
        return {
            pid: PatientFacts(sex=sex, diagnoses=frozenset(found[pid]["dx"]), medications=frozenset(found[pid]["rx"]),
                              abnormal_labs=frozenset(found[pid]["labs"]), last_disposition=last.get(pid, "unknown"))
            for pid, sex in sexes.items()
        }

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
