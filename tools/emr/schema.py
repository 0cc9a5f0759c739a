"""The EMR schema: a MIMIC-like set of tables, defined with SQLAlchemy Core so any SQLAlchemy URL works."""

from __future__ import annotations

from sqlalchemy import (JSON, Column, Date, DateTime, Float, ForeignKey, ForeignKeyConstraint, Index, Integer, MetaData,
                        String, Table, Text)

__all__ = [
    "SCHEMA_VERSION",
    "metadata",
    "patients",
    "admissions",
    "diagnoses",
    "d_icd_diagnoses",
    "medications",
    "labs",
    "emr_meta",
    "release_batches",
    "released_groups",
    "released_members",
]

#: Part of the cached database file name: a schema change builds a new file instead of reading an old one.
SCHEMA_VERSION = 1

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

# ---- the released table of similar-patient search (tools/emr/anonymity.py), persisted so that every process
# and replica on this database serves the same rows and a release only ever grows by whole new groups.
# Each k (min_cohort_size) has a release of its own.

#: One row per published batch: batch 1 is the first release, each later one adds groups of patients
#: admitted since.
release_batches = Table(
    "emr_release_batches",
    metadata,
    Column("k", Integer, primary_key=True),
    Column("batch", Integer, primary_key=True),
    Column("n_patients", Integer, nullable=False),
)

#: One row per released group: what all its members share (the lists are sorted, so equal groups store
#: equal rows). ``seq`` numbers the groups of a batch.
released_groups = Table(
    "emr_released_groups",
    metadata,
    Column("k", Integer, primary_key=True),
    Column("batch", Integer, primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("sex", String(1), nullable=True),  # NULL: the group mixes sexes
    Column("age_low", Integer, nullable=False),
    Column("age_high", Integer, nullable=False),
    Column("diagnoses", JSON, nullable=False),
    Column("medications", JSON, nullable=False),
    Column("abnormal_labs", JSON, nullable=False),
    Column("last_disposition", String(64), nullable=True),  # NULL: it varies within the group
    ForeignKeyConstraint(["k", "batch"], ["emr_release_batches.k", "emr_release_batches.batch"]),
)

#: The patients the release covers, each in exactly one group (the primary key makes "at most one" a
#: constraint, so two replicas publishing at once cannot both cover a patient). No foreign key to
#: ``patients``: a released group is a published snapshot and stays as it was.
released_members = Table(
    "emr_released_members",
    metadata,
    Column("k", Integer, primary_key=True),
    Column("patient_id", String(16), primary_key=True),
    Column("batch", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    ForeignKeyConstraint(["k", "batch", "seq"],
                         ["emr_released_groups.k", "emr_released_groups.batch", "emr_released_groups.seq"]),
)
