"""Issue 40 item 4: k-anonymity over time. The released table survives restarts and replicas, and a new
release never moves an answer by fewer than k patients.

The red team's attack: admit a patient (a copy of one, added to the SQLite file), restart, ask the same
questions again. When every process rebuilt its release from all patients, one admission moved the
partition, so answers changed by one or two patients (``{"codes": ["N39.0"], "sex": "F", "age_max": 39}``
lost "medications Ceftriaxone"). Here every answer of a fixed set of queries (every code of the cohort x
sex none/F/M x four age ranges) is compared before and after admitting 1, 2 and k patients to a copy of
the packaged database (300 patients, SQLite), through a process opened before the admissions and one
opened after. Each comparison also runs its control: the release rebuilt from scratch on the same
admitted database (what every process did before) moves some answer by 1 to k-1 patients, so the
checks below would catch it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select

from tcrag_langgraph.tools.emr import EMRDatabase
from tcrag_langgraph.tools.emr.schema import release_batches, released_groups, released_members

from emr_checks import admit_copy, released_selection  # tests/tools helper

N, SEED, K = 300, 7, 3
AGES = ((None, None), (None, 39), (40, 69), (70, None))
RED_TEAM = ("N39.0", "F", None, 39)  # the red team's query: codes N39.0, female, age_max 39
# P00131 belongs to the one released group that query shows (female, 20-39, N39.0, Ceftriaxone); one copy
# of it, rebuilt from scratch, changed that answer (the control below checks that it still would).
SOURCE = "P00131"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The packaged cohort as a SQLite file with its first release published (the state a server starts from)."""
    path = tmp_path_factory.mktemp("emr") / "base.sqlite"
    db = EMRDatabase(f"sqlite:///{path}", n_patients=N, seed=SEED)
    db.release()
    db.engine.dispose()
    return path


@pytest.fixture(scope="module")
def queries(base) -> list[tuple]:
    db = EMRDatabase(f"sqlite:///{base}", populate=False)
    codes = sorted({c for f in db.patient_facts().values() for c in f.diagnoses})
    db.engine.dispose()
    assert len(codes) >= 25
    return [(c, sex, lo, hi) for c in codes for sex in (None, "F", "M") for lo, hi in AGES]


@pytest.fixture(scope="module")
def before(base, queries):
    """Release and answers of the database before any admission."""
    db = EMRDatabase(f"sqlite:///{base}", populate=False)
    out = db.release(), answers(db, queries)
    db.engine.dispose()
    return out


def answers(db: EMRDatabase, queries) -> dict[tuple, str]:
    return {q: db.similar(codes=[q[0]], sex=q[1], age_min=q[2], age_max=q[3], limit=20) for q in queries}


def patients_behind(release, query) -> frozenset[str]:
    """The patients a query's answer is computed from (white-box: the released groups it selects)."""
    code, sex, lo, hi = query
    return frozenset(p for g in released_selection(release, [code], sex, lo, hi) for p in g.members)


def unpublished_copy(path: Path, dest: Path) -> Path:
    """A copy of the database at ``path`` with its release tables emptied (as if never published)."""
    shutil.copy(path, dest)
    db = EMRDatabase(f"sqlite:///{dest}", populate=False)
    with db.engine.begin() as conn:
        for table in (released_members, released_groups, release_batches):
            conn.execute(delete(table))
    db.engine.dispose()
    return dest


def from_scratch(path: Path, tmp_path: Path) -> list:
    """The release a process builds from all the patients of ``path`` when nothing is persisted (the old rule)."""
    return EMRDatabase(f"sqlite:///{unpublished_copy(path, tmp_path / 'from_scratch.sqlite')}", populate=False).release()


def admit(base: Path, tmp_path: Path, queries, sources) -> dict:
    """Admit copies of ``sources`` to a copy of ``base``; release and answers after, from a process opened
    before the admissions (it keeps serving) and one opened after (a restart or another replica)."""
    path = tmp_path / "admitted.sqlite"
    shutil.copy(base, path)
    serving = EMRDatabase(f"sqlite:///{path}", populate=False)
    serving.release()
    newcomers = {f"N{i:05d}" for i in range(len(sources))}
    for new_id, source in zip(sorted(newcomers), sources):
        admit_copy(serving, source, new_id)
    restarted = EMRDatabase(f"sqlite:///{path}", populate=False)
    after = answers(restarted, queries)
    assert answers(serving, queries) == after  # the process already running serves the same answers
    assert serving.release() == restarted.release()
    return {"path": path, "release": restarted.release(), "answers": after, "newcomers": newcomers}


def moved_by_fewer_than_k(old_release, new_release, queries) -> list[tuple]:
    """Queries whose answer is computed from patient sets differing by 1 to k-1 patients (either way)."""
    out = []
    for q in queries:
        old, new = patients_behind(old_release, q), patients_behind(new_release, q)
        if 0 < len(new - old) < K or 0 < len(old - new) < K:
            out.append(q)
    return out


def check_whole_groups(before, after, queries) -> int:
    """The guarantee, checked on every answer: published groups unchanged, new groups only of newcomers
    (at least k each), and an answer that changed is computed from a set larger by at least k newcomers.
    Returns the number of answers that changed."""
    old_release, old_answers = before
    new_release = after["release"]
    assert set(old_release) <= set(new_release), "a published group was changed or removed"
    for g in set(new_release) - set(old_release):
        assert g.size >= K and set(g.members) <= after["newcomers"], g
    changed = 0
    for q in queries:
        old, new = patients_behind(old_release, q), patients_behind(new_release, q)
        if old_answers[q] != after["answers"][q]:
            changed += 1
            assert old <= new and len(new - old) >= K, (q, sorted(new - old))
        else:
            assert new == old or len(new - old) >= K, q
    return changed


@pytest.mark.parametrize("n", [1, 2])
def test_fewer_than_k_admissions_change_no_answer(base, tmp_path, queries, before, n):
    after = admit(base, tmp_path, queries, [SOURCE] * n)
    assert after["release"] == before[0]  # the newcomers are not in it yet
    assert not after["newcomers"] & {p for g in after["release"] for p in g.members}
    assert after["answers"] == before[1]  # every one of the answers, word for word
    # control: rebuilt from scratch (the old rule), the same admissions move answers by 1 or 2 patients
    leaking = moved_by_fewer_than_k(before[0], from_scratch(after["path"], tmp_path), queries)
    assert RED_TEAM in leaking
    print(f"{n} admission(s): {len(queries)} answers unchanged; a from-scratch release moves {len(leaking)} "
          f"of them by fewer than {K} patients")


@pytest.mark.parametrize("sources, published", [
    pytest.param((SOURCE,) * K, True, id="k-copies-of-one-patient"),
    # three hypertension patients from three different released groups (other diagnoses, ages and sexes
    # differ): together they share I10, so they are published as one new group
    pytest.param(("P00004", "P00028", "P00046"), True, id="k-spread-sharing-one-diagnosis"),
    # three patients from three groups with no diagnosis in common: no group can show them; they wait
    pytest.param(("P00001", "P00019", "P00058"), False, id="k-spread-sharing-nothing"),
])
def test_k_admissions_change_answers_only_by_whole_groups_of_newcomers(base, tmp_path, queries, before,
                                                                       sources, published):
    after = admit(base, tmp_path, queries, list(sources))
    changed = check_whole_groups(before, after, queries)
    covered = after["newcomers"] & {p for g in after["release"] for p in g.members}
    assert (covered == after["newcomers"] and changed > 0) if published else (not covered and changed == 0)
    leaking = moved_by_fewer_than_k(before[0], from_scratch(after["path"], tmp_path), queries)
    # control: spread over several groups, the k newcomers move some answers by fewer than k under the old
    # rule (k copies of one patient form a class of their own even there)
    assert bool(leaking) == (len(set(sources)) > 1)
    print(f"{sources}: {changed} of {len(queries)} answers changed, each by a new group of >= {K} newcomers; "
          f"a from-scratch release moves {len(leaking)} by fewer than {K}")


def test_pending_patients_join_a_later_batch_and_old_groups_never_move(base, tmp_path, queries, before):
    """Three admissions that form no group, then k copies of one patient: the second batch holds the copies;
    the first three keep waiting, and the groups published before stay as they were."""
    after = admit(base, tmp_path, queries, ["P00001", "P00019", "P00058", SOURCE, SOURCE, SOURCE])
    assert check_whole_groups(before, after, queries) > 0
    new = [g for g in after["release"] if set(g.members) & after["newcomers"]]
    assert [g.members for g in new] == [("N00003", "N00004", "N00005")]
    db = EMRDatabase(f"sqlite:///{after['path']}", populate=False)
    with db.engine.connect() as conn:
        batches = conn.execute(select(release_batches.c.batch, release_batches.c.n_patients)
                               .order_by(release_batches.c.batch)).all()
    assert [tuple(b) for b in batches] == [(1, sum(g.size for g in before[0])), (2, K)]


def test_a_replica_that_publishes_between_our_count_and_our_read_is_served(base, tmp_path, queries, before):
    # the interleaving CI once hit by chance (one of the two threads above served an empty release): this
    # replica counts k pending patients, the other publishes them all, and this one then finds nothing to group
    fresh = unpublished_copy(base, tmp_path / "fresh.sqlite")
    ours, theirs = (EMRDatabase(f"sqlite:///{fresh}", populate=False) for _ in range(2))
    count = ours._count_pending

    def count_then_lose_the_race():
        pending = count()
        assert theirs.release() == before[0]
        return pending

    ours._count_pending = count_then_lose_the_race
    assert ours.release() == before[0]
    assert answers(ours, queries) == before[1]


def test_replicas_and_restarts_serve_one_release(base, tmp_path, queries, before):
    # two replicas opening an unpublished file at once: one publishes, the other's attempt is refused, both serve
    # the same rows, equal to those the base file was published with
    fresh = unpublished_copy(base, tmp_path / "fresh.sqlite")
    replicas = [EMRDatabase(f"sqlite:///{fresh}", populate=False) for _ in range(2)]
    start, got = threading.Barrier(2), [None, None]

    def serve(i):
        start.wait()
        got[i] = replicas[i].release()

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with replicas[0].engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(release_batches)).scalar_one() == 1
    assert got[0] == got[1] == before[0]
    assert answers(replicas[0], queries) == answers(replicas[1], queries) == before[1]

    # a new process with another hash seed builds the release of another unpublished copy: the same rows,
    # and the same answer to the red team's query (so replicas racing to publish agree on what they publish)
    script = (
        "import json, sys; from tcrag_langgraph.tools.emr import EMRDatabase\n"
        "db = EMRDatabase(sys.argv[1], populate=False)\n"
        "code, sex, lo, hi = json.loads(sys.argv[2])\n"
        "rows = [[g.members, g.sex, g.age_low, g.age_high, sorted(g.diagnoses), sorted(g.medications),\n"
        "         sorted(g.abnormal_labs), g.last_disposition] for g in db.release()]\n"
        "print(json.dumps([rows, db.similar(codes=[code], sex=sex, age_min=lo, age_max=hi, limit=20)]))\n"
    )
    other = unpublished_copy(base, tmp_path / "other.sqlite")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script, f"sqlite:///{other}", json.dumps(RED_TEAM)],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    rows, answer = json.loads(done.stdout)
    assert rows == [[list(g.members), g.sex, g.age_low, g.age_high, sorted(g.diagnoses), sorted(g.medications),
                     sorted(g.abnormal_labs), g.last_disposition] for g in before[0]]
    assert answer == before[1][RED_TEAM] and "medications Ceftriaxone" in answer
