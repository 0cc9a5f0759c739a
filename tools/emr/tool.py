"""The EMR_SEARCH LangChain tool: access control on look-ups, the shared layer, and the default database."""

from __future__ import annotations

import logging
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Optional

from langchain_core.runnables import RunnableConfig
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from ..identity import caller_from_config
from ..base import WRITTEN_INPUT_SCHEMA
from ..layer import LayeredTool, ToolFailure, ToolOptions, make_tool
from .database import EMRDatabase, default_emr_path
from .parsing import EMRInput, parse_emr_text, written_input_schema

__all__ = [
    "EMR_SEARCH_NAME",
    "EMR_SEARCH_DESCRIPTION",
    "EMR_TOOL_OPTIONS",
    "emr_tool",
    "default_emr_database",
    "default_emr_tool",
]

logger = logging.getLogger(__name__)

EMR_SEARCH_NAME = "EMR_SEARCH"
EMR_SEARCH_DESCRIPTION = (
    "Search electronic medical records. Two operations: "
    '(1) similar patients: {"operation": "similar", "codes": ["E11.9"], "condition": "heart failure", '
    '"sex": "F", "age_min": 60, "age_max": 80, "limit": 3} (codes are ICD-10-CM; give codes and/or a condition '
    "phrase; ages are matched by whole 10-year bands; returns cohort statistics as count ranges and de-identified "
    "case groups of at least a few patients each, showing what all of them share); "
    '(2) one patient\'s record: {"operation": "lookup", "patient_id": "P00042"} (only patients you are '
    'allowed to see). Plain text also works, e.g. "patients with E11.9, female, aged 60-80" or "record of P00042".'
)

#: The layer options EMR_SEARCH uses when none are given: a local database answers fast, and only a
#: connection-level database error (raised as a retryable ToolFailure) is worth one more attempt.
EMR_TOOL_OPTIONS = ToolOptions(timeout_s=15.0, retries=1, backoff=0.2, max_output_tokens=800, cache_size=0,
                               transient=(), holds_records=True)


def emr_tool(
    db: EMRDatabase,
    *,
    name: str = EMR_SEARCH_NAME,
    description: str = EMR_SEARCH_DESCRIPTION,
    options: Optional[ToolOptions] = None,
) -> LayeredTool:
    """EMR_SEARCH over ``db``, wrapped by the shared layer, with access control from the RunnableConfig.

    ``options`` are the layer options (default :data:`EMR_TOOL_OPTIONS`; ``cache_size`` 0 because
    records change; when set, cached results are keyed per caller). The database password is always
    added to ``options.secrets``.

    Example:
        >>> tool = emr_tool(EMRDatabase(None, n_patients=40, seed=3))
        >>> tool.invoke({"operation": "lookup", "patient_id": "P00001"}).kind  # no caller
        'forbidden'
    """
    options = EMR_TOOL_OPTIONS if options is None else options
    if not isinstance(options, ToolOptions):
        raise TypeError(f"options must be a ToolOptions, got {type(options).__name__}")

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

    # holds_records always: its output is patient-record text, whatever options were given (layer.egress)
    return make_tool(name, description, run, args_schema=EMRInput, options=options, text_parser=parse_emr_text,
                     secrets=options.secrets + db.secrets, holds_records=True,
                     metadata={WRITTEN_INPUT_SCHEMA: written_input_schema()})


def _build_sqlite_file(path: Path, n_patients: int, seed: int, min_cohort_size: int) -> None:
    """Create the database beside ``path`` and rename it in place, so no reader sees a half-built file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        db = EMRDatabase(f"sqlite:///{tmp}", n_patients=n_patients, seed=seed, min_cohort_size=min_cohort_size)
        db.release()  # the file appears with its first release in it: its first readers do not race to publish one
        db.engine.dispose()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _open_database(url: Optional[str], *, in_memory: bool, n_patients: int, seed: int,
                   min_cohort_size: int) -> EMRDatabase:
    if url:
        return EMRDatabase(url, n_patients=n_patients, seed=seed, min_cohort_size=min_cohort_size)
    if in_memory:
        return EMRDatabase(None, n_patients=n_patients, seed=seed, min_cohort_size=min_cohort_size)
    path = default_emr_path(seed, n_patients)
    if not path.exists():
        _build_sqlite_file(path, n_patients, seed, min_cohort_size)
    return EMRDatabase(f"sqlite:///{path}", populate=False, min_cohort_size=min_cohort_size)


@cache
def default_emr_database() -> EMRDatabase:
    """The process-wide default EMR database, opened once per process.

    ``$TCRAG_EMR_URL`` if set, else the synthetic SQLite file (300 patients, seed 7) in
    ``$TCRAG_CACHE_DIR`` (or ``~/.cache/tcrag_langgraph``), built on first use; ``min_cohort_size`` 3.
    """
    return _open_database(os.environ.get("TCRAG_EMR_URL"), in_memory=False, n_patients=300, seed=7, min_cohort_size=3)


def default_emr_tool(
    *,
    url: Optional[str] = None,
    in_memory: bool = False,
    n_patients: int = 300,
    seed: int = 7,
    min_cohort_size: int = 3,
    options: Optional[ToolOptions] = None,
) -> LayeredTool:
    """The EMR_SEARCH tool over ``url``, or the embedded synthetic SQLite database.

    Without arguments it uses :func:`default_emr_database` (shared by the process). Otherwise a
    database of its own is opened: ``url`` (or ``$TCRAG_EMR_URL``), else the SQLite file for
    ``(seed, n_patients)`` in the cache folder, created on first use and reused; ``in_memory=True``
    keeps it in this process only. ``options`` go to :func:`emr_tool`.

    Example:
        >>> default_emr_tool(in_memory=True, n_patients=30).name
        'EMR_SEARCH'
    """
    if url is None and not in_memory and (n_patients, seed, min_cohort_size) == (300, 7, 3):
        db = default_emr_database()
    else:
        db = _open_database(url or os.environ.get("TCRAG_EMR_URL"), in_memory=in_memory, n_patients=n_patients,
                            seed=seed, min_cohort_size=min_cohort_size)
    return emr_tool(db, options=options)
