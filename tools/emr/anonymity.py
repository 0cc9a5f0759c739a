"""What similar-patient search may show: k-anonymous case groups and coarsened counts.

The rule, with k = ``min_cohort_size`` (3 by default):

1. The patients matching a query are split into equivalence classes by what a case says about who
   they are: the exact set of query criteria they match, their sex and their 10-year age band (age
   at the latest matching admission; 90 and over is one band).
2. A class of at least k patients is shown as one generalised case. The patients of smaller
   classes are pooled per criteria set, with sex and age generalised away; a pool of at least k is
   shown as one case ("any sex, any age"). Nothing else is shown about anyone.
3. A case shows only facts that every patient of its group shares: diagnoses, medications,
   abnormal-lab directions (never values) and the latest discharge disposition common to all of
   them. So behind every case there are at least k patients sharing every attribute shown for it.
4. Counts are never exact: they are buckets (``3-9``, ``10-19``, ... ``100-199``, ...); cohort
   cells (a diagnosis, a medication, a sex, an age band) with fewer than k patients are left out;
   and a query matching fewer than k patients gets the very same answer as one matching none, so
   the answer does not tell whether a rare combination exists.

This defends against singling out one patient by combining criteria (ranking by how many criteria
a patient matches used to put the only patient with a rare code pair first) and against learning
that a rare combination exists. It is k-anonymity plus small-cell suppression, not differential
privacy: an attacker who differences bucketed counts across queries learns at most bucket
boundaries, never a record; and, as with any k-anonymity, someone who already knows that a person
belongs to a shown group (matches its criteria, sex and age band) learns the facts the whole group
shares. Look-ups of one patient's record are a separate path with its own access control.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

__all__ = [
    "PatientFacts",
    "MatchedPatient",
    "CaseGroup",
    "age_band",
    "count_bucket",
    "select_case_groups",
    "render_similar",
    "withheld_message",
]

_SEX_WORD = {"F": "female", "M": "male"}


@dataclass(frozen=True)
class PatientFacts:
    """The clinical facts of one patient that a case may show (no identifier, no exact value or date)."""

    sex: str
    diagnoses: frozenset[str]
    medications: frozenset[str]
    abnormal_labs: frozenset[str]  # "Creatinine high", "Hemoglobin low"
    last_disposition: str


@dataclass(frozen=True)
class MatchedPatient:
    """A patient matching a query: which criteria (by index), age at the latest matching admission, facts."""

    criteria: frozenset[int]
    age: int
    facts: PatientFacts


@dataclass(frozen=True)
class CaseGroup:
    """One shown case: a group of ``size`` >= k patients and the attributes all of them share.

    ``sex``/``age_band`` are ``None`` where the group was generalised over them (a pool).
    """

    criteria: frozenset[int]
    sex: Optional[str]
    age_band: Optional[str]
    size: int
    diagnoses: tuple[str, ...]
    medications: tuple[str, ...]
    abnormal_labs: tuple[str, ...]
    last_disposition: Optional[str]


def age_band(age: int) -> str:
    """Ten-year band; ages over 89 are one band (HIPAA Safe Harbor aggregates them).

    Example:
        >>> age_band(67), age_band(93)
        ('60-69', '90+')
    """
    if age >= 90:
        return "90+"
    low = age // 10 * 10
    return f"{low}-{low + 9}"


def _band_order(band: Optional[str]) -> int:
    return 1000 if band is None else int(band.rstrip("+").split("-")[0])


def count_bucket(n: int, k: int) -> str:
    """A count of at least ``k`` as a range: below 10 ``k-9``, then by tens, hundreds, thousands.

    Example:
        >>> count_bucket(4, 3), count_bucket(44, 3), count_bucket(230, 3), count_bucket(25, 20)
        ('3-9', '40-49', '200-299', '20-29')
    """
    if n < k:
        raise ValueError(f"a count below min_cohort_size ({n} < {k}) must not be shown")
    step = 1 if n < 10 else 10 ** (len(str(n)) - 1)
    low = 1 if n < 10 else n // step * step
    high = 9 if n < 10 else low + step - 1
    low = max(low, k)
    return str(low) if low >= high else f"{low}-{high}"


def _generalise(members: Sequence[MatchedPatient], criteria: frozenset[int], sex: Optional[str],
                band: Optional[str]) -> CaseGroup:
    facts = [m.facts for m in members]
    dispositions = {f.last_disposition for f in facts}
    return CaseGroup(
        criteria=criteria,
        sex=sex,
        age_band=band,
        size=len(members),
        diagnoses=tuple(sorted(frozenset.intersection(*(f.diagnoses for f in facts)))),
        medications=tuple(sorted(frozenset.intersection(*(f.medications for f in facts)))),
        abnormal_labs=tuple(sorted(frozenset.intersection(*(f.abnormal_labs for f in facts)))),
        last_disposition=dispositions.pop() if len(dispositions) == 1 else None,
    )


def select_case_groups(matched: Iterable[MatchedPatient], *, k: int, limit: int) -> list[CaseGroup]:
    """The cases similar-patient search shows (rules 1-3 of the module docstring), best first.

    Groups matching more criteria come first, then larger ones (by bucket, so the order does not
    reveal exact sizes), then by criteria, sex and age band.
    """
    if k < 1 or limit < 1:
        raise ValueError("k and limit must be at least 1")
    classes: dict[tuple[frozenset[int], str, str], list[MatchedPatient]] = defaultdict(list)
    for patient in matched:
        classes[(patient.criteria, patient.facts.sex, age_band(patient.age))].append(patient)
    groups: list[CaseGroup] = []
    pools: dict[frozenset[int], list[MatchedPatient]] = defaultdict(list)
    for (criteria, sex, band), members in classes.items():
        if len(members) >= k:
            groups.append(_generalise(members, criteria, sex, band))
        else:
            pools[criteria].extend(members)
    for criteria, members in pools.items():
        if len(members) >= k:
            groups.append(_generalise(members, criteria, None, None))

    def rank(g: CaseGroup) -> tuple:
        low = int(count_bucket(g.size, k).split("-")[0])
        return (-len(g.criteria), -low, sorted(g.criteria), g.sex or "~", _band_order(g.age_band))

    return sorted(groups, key=rank)[:limit]


def withheld_message(header: str, k: int) -> str:
    """The one answer for "no match" and "fewer than k matches" (rule 4): it does not tell them apart."""
    return (f"{header}: no group of at least {k} matching patients to show (fewer than {k} or none match; "
            "smaller counts are never disclosed, to protect privacy). Widen the criteria (e.g. a broader code "
            "or age range).")


def _cells(counter: Counter, k: int, top: int) -> list[tuple[str, str]]:
    kept = sorted(((n, key) for key, n in counter.items() if n >= k), key=lambda t: (-t[0], t[1]))[:top]
    return [(key, count_bucket(n, k)) for n, key in kept]


def _titled(code: str, titles: Mapping[str, str]) -> str:
    return f"{code} {titles[code]}" if code in titles else code


def render_similar(
    header: str,
    labels: Sequence[str],
    matched: Sequence[MatchedPatient],
    *,
    k: int,
    limit: int,
    titles: Mapping[str, str],
) -> str:
    """The observation for a similar-patient query: bucketed cohort statistics and k-anonymous cases."""
    if len(matched) < k:
        return withheld_message(header, k)
    lines = [f"{header}: {count_bucket(len(matched), k)} matching patients (counts are ranges)."]
    sexes = _cells(Counter(_SEX_WORD.get(m.facts.sex, m.facts.sex) for m in matched), k, 2)
    bands = _cells(Counter(age_band(m.age) for m in matched), k, 10)
    bands.sort(key=lambda cell: _band_order(cell[0]))
    cohort = ", ".join(f"{s} {n}" for s, n in sexes) or "sex not shown (small groups)"
    lines.append(f"Cohort: {cohort}; age bands: " + (", ".join(f"{b} ({n})" for b, n in bands) or "not shown") + ".")
    dx = _cells(Counter(c for m in matched for c in m.facts.diagnoses), k, 6)
    if dx:
        lines.append("Most common diagnoses: " + "; ".join(f"{_titled(c, titles)} ({n})" for c, n in dx) + ".")
    rx = _cells(Counter(d for m in matched for d in m.facts.medications), k, 6)
    if rx:
        lines.append("Most common medications: " + "; ".join(f"{d} ({n})" for d, n in rx) + ".")
    groups = select_case_groups(matched, k=k, limit=limit)
    if not groups:
        lines.append(f"No case group of at least {k} patients sharing their criteria; cases withheld to protect privacy.")
    for i, g in enumerate(groups, 1):
        matched_labels = ", ".join(labels[j] for j in sorted(g.criteria))
        who = f"{_SEX_WORD.get(g.sex, g.sex)}, age {g.age_band}" if g.sex is not None else "any sex, any age"
        diagnoses = "; ".join(_titled(c, titles) for c in g.diagnoses[:6]) or "none shared"
        lines.append(
            f"Case group {i} ({count_bucket(g.size, k)} patients, matching {len(g.criteria)}/{len(labels)}: "
            f"{matched_labels}): {who}. Shared by all: diagnoses {diagnoses}; "
            f"medications {', '.join(g.medications[:6]) or 'none shared'}; "
            f"abnormal labs {', '.join(g.abnormal_labs[:6]) or 'none shared'}; "
            f"last discharge {g.last_disposition or 'varies'}."
        )
    return "\n".join(lines)
