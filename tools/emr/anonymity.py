"""What similar-patient search may show: a released table of k-anonymous groups, and coarsened counts.

**What the EMR tool uses (issue 21)**: :func:`release_groups` partitions the patients into groups of
at least k = ``min_cohort_size`` that share at least one diagnosis; each group is published as one
row of what all its members share (sex or "any sex", an age span of whole 10-year bands at the latest
admission, diagnoses, medications, abnormal-lab directions, disposition). :func:`select_released`
answers a query from those rows only (a criterion matches a row through a shared diagnosis; an age
range is widened to whole bands; a filter keeps a row only if all its members satisfy it) and
:func:`render_released` writes the answer from the selected rows only. So the patient sets behind
any two answers differ by whole groups of at least k: no pair of queries (codes, condition, sex,
ages) can difference below k. The cost: a patient's diagnosis that the rest of their group lacks is
not searchable.

**Over time (issue 40)**: the release is kept in the database (``EMRDatabase.release``) and only
grows: admitted patients it does not cover wait until at least k of them can be published, and are
then partitioned among themselves into new rows; published rows never change. So two releases, like
two queries, differ by whole groups of at least k (newly admitted) patients in every answer.

The per-query rule below (:func:`select_case_groups`, :func:`render_similar`) is what the tool used
before; it is kept for reference and its tests, and is not used by EMR_SEARCH.

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
from typing import Callable, Iterable, Mapping, Optional, Sequence

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


# ------------------------------------------------------------------ the released table (issues 21, 40)
# Similar-patient answers are computed only from a released table: patients are partitioned into groups
# of at least k, and each group is one row of what all its members share. Any answer is then a function
# of whole rows, so two answers (any criteria, sex, ages) are computed from patient sets that differ by
# whole groups of at least k: no pair of queries can difference below k. The database keeps the rows and
# only adds new ones (EMRDatabase.release), so the same holds between answers given at different times.

#: Published age bands: ten years each, 90 and over one band (see :func:`age_band`).
AGE_BAND_STARTS = tuple(range(0, 100, 10))


def _band_span(age: int) -> tuple[int, int]:
    low = min(age // 10 * 10, 90)
    return (low, 200) if low == 90 else (low, low + 9)


def span_label(low: int, high: int) -> str:
    """``60-69``, ``60-79`` (a group over two bands) or ``90+``.

    Example:
        >>> span_label(60, 79), span_label(90, 200), span_label(80, 200)
        ('60-79', '90+', '80+')
    """
    return f"{low}+" if high >= 200 else f"{low}-{high}"


@dataclass(frozen=True)
class ReleasedGroup:
    """One row of the released table: at least k patients and what all of them share.

    ``members`` (patient ids) stay inside the tool: they are never shown, only counted.
    ``sex`` is ``None`` when the group mixes sexes; ``age_low``/``age_high`` span whole bands.
    """

    members: tuple[str, ...]
    sex: Optional[str]
    age_low: int
    age_high: int
    diagnoses: frozenset[str]
    medications: frozenset[str]
    abnormal_labs: frozenset[str]
    last_disposition: Optional[str]

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def age_label(self) -> str:
        return span_label(self.age_low, self.age_high)


class _Class:
    __slots__ = ("members", "sexes", "low", "high", "dx")

    def __init__(self, members: list[str], sexes: set[str], low: int, high: int, dx: frozenset[str]) -> None:
        self.members, self.sexes, self.low, self.high, self.dx = members, sexes, low, high, dx

    def key(self) -> tuple:
        return (len(self.members), sorted(self.sexes), self.low, sorted(self.dx), self.members[0])


def release_groups(patients: Mapping[str, tuple[int, PatientFacts]], *, k: int) -> list[ReleasedGroup]:
    """Partition ``patients`` (id -> (age, facts)) into groups of at least ``k`` that share at least one
    diagnosis; patients that cannot join such a group are left out (in the EMR database they stay
    pending for a later batch, ``EMRDatabase.release``).

    Start from classes of identical (sex, age band, diagnoses); while a class is smaller than ``k``,
    merge the smallest one into the class, among those it shares a diagnosis with, whose merge loses
    the fewest shown facts (patient-diagnosis pairs no longer shared, plus one per decade the age
    span widens and one if sex is generalised), preferring another small class, then a fixed order.
    A small class that shares no diagnosis with any other is left out rather than merged: a group
    that shares no diagnosis can never be selected (a query criterion matches a row only through a
    shared diagnosis), so the merge would only erase what its partner shares. The patients left out
    are partitioned again among themselves until a pass finds no group. Deterministic: the same
    patients give the same groups, in :func:`release_order`.

    Example:
        >>> f = lambda s, dx: PatientFacts(s, frozenset(dx), frozenset(), frozenset(), "HOME")
        >>> pts = {f"P{i}": (60 + i, f("F", ["I10"])) for i in range(3)} | {"P9": (30, f("M", ["J45.909"]))}
        >>> [(g.members, g.sex, g.age_label, sorted(g.diagnoses)) for g in release_groups(pts, k=3)]
        [(('P0', 'P1', 'P2'), 'F', '60-69', ['I10'])]
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    left = dict(patients)
    out: list[ReleasedGroup] = []
    while len(left) >= k:
        found = _partition(left, k)
        if not found:
            break
        out.extend(found)
        for g in found:
            for pid in g.members:
                del left[pid]
    return sorted(out, key=release_order)


def _partition(patients: Mapping[str, tuple[int, PatientFacts]], k: int) -> list[ReleasedGroup]:
    """One pass of :func:`release_groups`: the groups of at least ``k`` sharing a diagnosis."""
    start: dict[tuple, list[str]] = defaultdict(list)
    for pid in sorted(patients):
        age, facts = patients[pid]
        start[(facts.sex, _band_span(age), facts.diagnoses)].append(pid)
    classes = [_Class(list(m), {sex}, span[0], span[1], dx) for (sex, span, dx), m in start.items()]
    while True:
        small = [c for c in classes if len(c.members) < k]
        if not small:
            break
        this = min(small, key=_Class.key)
        rest = [c for c in classes if c is not this]
        partners = [c for c in rest if c.dx & this.dx]
        classes = rest
        if not partners:
            continue  # left out: see release_groups

        def score(c: _Class) -> tuple:
            # facts lost (patient-diagnosis pairs no longer shared, decades the span widens, a sex generalised),
            # then a small class before a full one, then a fixed order
            shared = len(this.dx & c.dx)
            lost = len(this.members) * (len(this.dx) - shared) + len(c.members) * (len(c.dx) - shared)
            widened = (max(c.high, this.high) - min(c.low, this.low)) - max(c.high - c.low, this.high - this.low)
            return (lost + widened // 10 + (c.sexes != this.sexes), len(c.members) >= k, *_Class.key(c))

        best = min(partners, key=score)
        best.members = sorted(best.members + this.members)
        best.sexes |= this.sexes
        best.low, best.high = min(best.low, this.low), max(best.high, this.high)
        best.dx = best.dx & this.dx
    groups = []
    for c in classes:
        if not c.dx:  # k or more patients without any diagnosis: nothing a query could find them by
            continue
        facts = [patients[pid][1] for pid in c.members]
        dispositions = {f.last_disposition for f in facts}
        groups.append(ReleasedGroup(
            members=tuple(c.members), sex=next(iter(c.sexes)) if len(c.sexes) == 1 else None,
            age_low=c.low, age_high=c.high, diagnoses=c.dx,
            medications=frozenset.intersection(*(f.medications for f in facts)),
            abnormal_labs=frozenset.intersection(*(f.abnormal_labs for f in facts)),
            last_disposition=dispositions.pop() if len(dispositions) == 1 else None))
    return groups


def release_order(group: ReleasedGroup) -> tuple:
    """The one order of a release's rows (sex, ages, diagnoses, members). Answers break ties in it, so
    an answer depends only on the set of rows it selects, not on when or where they were built or read."""
    return (group.sex or "~", group.age_low, group.age_high, sorted(group.diagnoses), group.members)


def widen_to_bands(age_min: Optional[int], age_max: Optional[int]) -> tuple[int, int]:
    """An asked age range widened to whole published bands (``age_max`` 48 reads as 49, 50 as 59).

    Example:
        >>> widen_to_bands(45, 48), widen_to_bands(None, 95), widen_to_bands(62, None)
        ((40, 49), (0, 200), (60, 200))
    """
    low = 0 if age_min is None else _band_span(max(0, age_min))[0]
    high = 200 if age_max is None else _band_span(max(0, age_max))[1]
    return low, high


def select_released(groups: Sequence[ReleasedGroup], criteria: Sequence[Callable[[str], bool]], *,
                    sex: Optional[str], age_min: Optional[int], age_max: Optional[int]
                    ) -> list[tuple[frozenset[int], ReleasedGroup]]:
    """The released groups a query selects, with the criteria (indices) each one matches.

    A group matches a criterion when one of the diagnoses all its members share satisfies it; a
    ``sex`` filter keeps groups of that sex only; an age range (widened to whole bands) keeps groups
    whose whole age span lies inside it. Only the rows are read: never a patient.
    """
    low, high = widen_to_bands(age_min, age_max)
    out = []
    for g in groups:
        if sex is not None and g.sex != sex:
            continue
        if g.age_low < low or g.age_high > high:
            continue
        hit = frozenset(i for i, matches in enumerate(criteria) if any(matches(code) for code in g.diagnoses))
        if hit:
            out.append((hit, g))
    return out


def render_released(header: str, labels: Sequence[str], selected: Sequence[tuple[frozenset[int], ReleasedGroup]],
                    *, k: int, limit: int, titles: Mapping[str, str]) -> str:
    """The observation for a similar-patient query, computed from the selected released rows only."""
    total = sum(g.size for _, g in selected)
    if total < k:  # no row matches (a row always holds at least k)
        return withheld_message(header, k)
    lines = [f"{header}: {count_bucket(total, k)} matching patients (counts are ranges)."]
    sexes: Counter = Counter()
    bands: Counter = Counter()
    dx: Counter = Counter()
    rx: Counter = Counter()
    for _, g in selected:
        if g.sex is not None:
            sexes[_SEX_WORD.get(g.sex, g.sex)] += g.size
        bands[g.age_label] += g.size
        for code in g.diagnoses:
            dx[code] += g.size
        for drug in g.medications:
            rx[drug] += g.size
    sex_cells = _cells(sexes, k, 2)
    band_cells = sorted(_cells(bands, k, 10), key=lambda cell: int(cell[0].split("-")[0].rstrip("+")))
    cohort = ", ".join(f"{s} {n}" for s, n in sex_cells) or "sex not shown (mixed groups)"
    lines.append(f"Cohort: {cohort}; age bands: " + (", ".join(f"{b} ({n})" for b, n in band_cells) or "not shown") + ".")
    top_dx = _cells(dx, k, 6)
    if top_dx:
        lines.append("Most common diagnoses: " + "; ".join(f"{_titled(c, titles)} ({n})" for c, n in top_dx) + ".")
    top_rx = _cells(rx, k, 6)
    if top_rx:
        lines.append("Most common medications: " + "; ".join(f"{d} ({n})" for d, n in top_rx) + ".")

    def rank(item: tuple[frozenset[int], ReleasedGroup]) -> tuple:
        hit, g = item
        low = int(count_bucket(g.size, k).split("-")[0])
        return (-len(hit), -low, sorted(hit), g.sex or "~", g.age_low, g.age_high, sorted(g.diagnoses))

    for i, (hit, g) in enumerate(sorted(selected, key=rank)[:limit], 1):
        matched_labels = ", ".join(labels[j] for j in sorted(hit))
        who = f"{_SEX_WORD.get(g.sex, g.sex) if g.sex else 'any sex'}, age {g.age_label}"
        diagnoses = "; ".join(_titled(c, titles) for c in sorted(g.diagnoses)[:6]) or "none shared"
        lines.append(
            f"Case group {i} ({count_bucket(g.size, k)} patients, matching {len(hit)}/{len(labels)}: "
            f"{matched_labels}): {who}. Shared by all: diagnoses {diagnoses}; "
            f"medications {', '.join(sorted(g.medications)[:6]) or 'none shared'}; "
            f"abnormal labs {', '.join(sorted(g.abnormal_labs)[:6]) or 'none shared'}; "
            f"last discharge {g.last_disposition or 'varies'}."
        )
    return "\n".join(lines)
