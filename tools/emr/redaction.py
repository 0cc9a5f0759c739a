"""Redaction of direct identifiers (names, MRNs, birth dates, addresses, phone numbers) from record text."""

from __future__ import annotations

import re
from datetime import date
from typing import Any, Iterable

__all__ = ["Redactor"]


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
