"""Checks shared by the EMR tests on SQLite and on PostgreSQL."""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import event


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
