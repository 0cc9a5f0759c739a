"""Issue 21 item 1: no pair of similar-patient queries can difference below k.

The attack of the issue, run exhaustively against the real EMR_SEARCH tool over the packaged
synthetic cohort (300 patients, SQLite): for every diagnosis code, every sex filter (none, F, M)
and every age from 18 to 100, the answers to ``age_max=a`` and ``age_max=a-1``, to ``age_min=a``
and ``age_min=a+1``, and to no sex filter and each sex, are compared. Whenever two answers differ,
the patient sets they were computed from (white-box: the released groups each selects) must differ
by at least k patients each way; and whenever two queries select the same groups, their answers
must be identical (an answer depends on nothing else). Before this design the same enumeration on
the raw data finds pairs differing by one or two patients (the issue's attack).
"""

from __future__ import annotations

from itertools import combinations

import pytest

from tcrag_langgraph.tools.emr import EMR_TOOL_OPTIONS, EMRDatabase, emr_tool, generate_cohort
from tcrag_langgraph.tools.emr.anonymity import select_released

from emr_checks import CodeMatcher, released_selection, verify_release  # tests/tools helper

N, SEED, K = 300, 7, 3
AGES = range(18, 101)


@pytest.fixture(scope="module")
def rows():
    return generate_cohort(N, SEED)


@pytest.fixture(scope="module")
def db():
    return EMRDatabase(None, n_patients=N, seed=SEED)


def body(answer: str) -> str:
    """The answer without its first line's header (which only echoes the query)."""
    first, _, rest = answer.partition("\n")
    return first.split(": ", 1)[1] + "\n" + rest


def members(groups) -> frozenset[str]:
    return frozenset(pid for g in groups for pid in g.members)


def test_the_released_table_is_k_anonymous_and_true(db, rows):
    covered = verify_release(db.release(), rows, K)
    sizes = sorted(g.size for g in db.release())
    assert sizes[0] >= K  # every patient is in at most one group, of at least k
    assert all(g.diagnoses for g in db.release())  # a group that shares no diagnosis is never published
    # utility: a patient is left out only when no group sharing a diagnosis takes them (measured: 1 of 300)
    assert len(covered) >= 0.99 * N
    shared = sum(g.size * len(g.diagnoses) for g in db.release())
    pairs = len({(d["patient_id"], d["icd_code"]) for d in rows["diagnoses"]})
    print(f"released: {len(sizes)} groups of {sizes[0]}-{sizes[-1]} patients, {len(covered)} patients; "
          f"{shared / pairs:.1%} of patient-diagnosis pairs shared by their group")


def test_differencing_attack_over_every_code_sex_and_age(db, rows):
    # untrimmed, so that two answers are compared whole (the header's length would move the trim)
    tool = emr_tool(db, options=EMR_TOOL_OPTIONS.model_copy(update={"max_output_tokens": 50_000}))
    release = db.release()
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    assert len(codes) >= 25
    answers: dict[tuple, str] = {}
    sets: dict[tuple, frozenset[str]] = {}

    def ask(code, sex, age_min, age_max):
        key = (code, sex, age_min, age_max)
        if key not in answers:
            out = tool.invoke({"operation": "similar", "codes": [code], "sex": sex, "age_min": age_min,
                               "age_max": age_max, "limit": 20})
            assert isinstance(out, str), out
            answers[key] = body(out)
            mine = members(g for _, g in select_released(release, [lambda c, p=code: c.startswith(p)], sex=sex,
                                                         age_min=age_min, age_max=age_max))
            assert mine == members(released_selection(release, [code], sex, age_min, age_max))  # independent
            sets[key] = mine
        return key

    pairs = []
    for code in codes:
        for sex in (None, "F", "M"):
            for a in AGES:
                pairs.append((ask(code, sex, None, a), ask(code, sex, None, a - 1)))
                pairs.append((ask(code, sex, a, None), ask(code, sex, a + 1, None)))
                if sex is not None:
                    pairs.append((ask(code, None, None, a), ask(code, sex, None, a)))
    differing = smallest = 0
    smallest = None
    for one, two in pairs:
        s1, s2 = sets[one], sets[two]
        if s1 == s2:
            assert answers[one] == answers[two], (one, two)  # the answer is a function of the groups alone
            continue
        differing += answers[one] != answers[two]
        for isolated in (s1 - s2, s2 - s1):
            assert len(isolated) == 0 or len(isolated) >= K, (one, two, sorted(isolated))
            if isolated:
                smallest = len(isolated) if smallest is None else min(smallest, len(isolated))
    print(f"{len(answers)} queries, {len(pairs)} pairs, {differing} pairs answered differently; "
          f"smallest set isolated by a pair: {smallest}")
    assert len(answers) > 5000 and differing > 0 and smallest is not None and smallest >= K


def test_any_two_queries_differ_by_whole_groups(db, rows):
    """Beyond adjacent ages: code pairs (OR queries) against their single codes, every sex and band."""
    release = db.release()
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    smallest, checked = None, 0
    for c1, c2 in combinations(codes, 2):
        for sex in (None, "F", "M"):
            both = members(released_selection(release, [c1, c2], sex))
            for single in (members(released_selection(release, [c1], sex)),
                           members(released_selection(release, [c2], sex))):
                isolated = both - single
                assert len(isolated) == 0 or len(isolated) >= K
                if isolated:
                    smallest = len(isolated) if smallest is None else min(smallest, len(isolated))
                checked += 1
    print(f"{checked} code-pair/single-code comparisons; smallest isolated set: {smallest}")
    assert smallest >= K


def test_the_same_enumeration_on_raw_data_finds_the_issues_leak(rows):
    """The attack the issue ran (age_max a vs a-1 on the raw matches, age at the latest matching
    admission): pairs isolating one or two patients exist, so the test above would catch them."""
    match = CodeMatcher(rows)
    sex_of = {p["patient_id"]: p["sex"] for p in rows["patients"]}
    codes = sorted({d["icd_code"] for d in rows["diagnoses"]})
    leaking = 0
    for code in codes:
        matched = match([code])
        for sex in (None, "F", "M"):
            for a in AGES:
                at = {p for p, (_h, age) in matched.items() if age <= a and (sex is None or sex_of[p] == sex)}
                below = {p for p, (_h, age) in matched.items() if age <= a - 1 and (sex is None or sex_of[p] == sex)}
                if 0 < len(at - below) < K and len(below) >= K:
                    leaking += 1
    print(f"raw data: {leaking} adjacent-age pairs isolate 1-{K - 1} patients")
    assert leaking > 100
