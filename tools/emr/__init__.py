"""EMR_SEARCH: electronic medical records in a real SQL database, with access control, redaction and k-anonymity.

* :mod:`.schema`: a MIMIC-like schema (``patients``, ``admissions``, ``diagnoses`` +
  ``d_icd_diagnoses``, ``medications``, ``labs``) in SQLAlchemy Core; any SQLAlchemy URL works
  (SQLite by default, PostgreSQL too).
* :mod:`.cohort`: :func:`generate_cohort` builds a deterministic synthetic cohort (seeded) from
  clinical profiles in ``tools/data/emr_profiles.json``: real ICD-10-CM codes and descriptions,
  plausible comorbidity clusters, medications and lab values. All people are fictitious.
* :mod:`.database`: :class:`EMRDatabase`, the engine and the parameterised queries. Every query
  uses bound parameters; model text never becomes SQL.
* :mod:`.anonymity`: what similar-patient search may show. Patients are partitioned into a
  released table of groups of at least ``min_cohort_size``, each one row of what all its members
  share; answers are computed from those rows only (ages by whole 10-year bands), so no two
  queries differ by fewer than ``min_cohort_size`` patients; counts are ranges. The table is kept
  in the database and only grows by whole groups of newly admitted patients, so answers given
  at different times, by restarted processes or replicas, differ by whole groups too.
* :mod:`.redaction`: :class:`Redactor`. Names, MRNs, exact birth dates, addresses and phone numbers
  never leave the tool: they are not selected into summaries, and look-ups are scrubbed of them
  (the free-text notes carry them).
* :mod:`.parsing`: :class:`EMRInput` and :func:`parse_emr_text` (plain text a model wrote).
* :mod:`.tool`: :func:`emr_tool` / :func:`default_emr_tool`. Two operations: ``similar`` and
  ``lookup`` (one patient's record; only for a caller whose ``allowed_patient_ids`` contains the
  patient, else ``ToolError(kind="forbidden")``, decided before any query runs).

Example:
    >>> from tcrag_langgraph.tools.identity import CALLER_KEY, CallerContext
    >>> tool = default_emr_tool(in_memory=True, n_patients=60)
    >>> print(tool.invoke("patients with E11.9")[:40])  # doctest: +SKIP
    Similar patients for E11.9: 10-19 matchi
    >>> cfg = {"configurable": {CALLER_KEY: CallerContext(user_id="dr-a", allowed_patient_ids=("P00001",))}}
    >>> tool.invoke({"operation": "lookup", "patient_id": "P00001"}, config=cfg)[:15]
    'Patient P00001:'
"""

from __future__ import annotations

from .anonymity import CaseGroup, MatchedPatient, PatientFacts, count_bucket, select_case_groups
from .cohort import generate_cohort, load_profiles
from .database import EMRDatabase, default_emr_path
from .parsing import EMRInput, parse_emr_text
from .redaction import Redactor
from . import schema as _schema
from .schema import admissions, d_icd_diagnoses, diagnoses, labs, medications, metadata, patients  # noqa: F401
from .tool import (
    EMR_SEARCH_DESCRIPTION,
    EMR_SEARCH_NAME,
    EMR_TOOL_OPTIONS,
    default_emr_database,
    default_emr_tool,
    emr_tool,
)

# The package's names, listed by the imports above (the schema's tables as tcrag_langgraph.tools.emr.schema
# declares them).
__all__ = [
    "EMR_SEARCH_NAME", "EMR_SEARCH_DESCRIPTION", "EMR_TOOL_OPTIONS",
    *(name for name in _schema.__all__ if name in globals()),
    "load_profiles", "generate_cohort", "EMRDatabase", "EMRInput", "parse_emr_text", "Redactor", "PatientFacts",
    "MatchedPatient", "CaseGroup", "count_bucket", "select_case_groups", "emr_tool", "default_emr_tool",
    "default_emr_database", "default_emr_path",
]
