"""Identity only from a trusted source: caller_for_run, the users file, and the real `langgraph dev`
server with the repository's custom auth driving the real EMR_SEARCH tool."""

from __future__ import annotations

import json

import httpx
import pytest

from tcrag_langgraph.core.config import CallerContext
from tcrag_langgraph.core.identity import caller_for_run
from tcrag_langgraph.faces.auth import (
    AuthenticatedUser,
    UserDirectory,
    UserRecord,
    hash_token,
    token_from_headers,
)

from .helpers_servers import langgraph_dev, script_file, users_file

BASE = CallerContext(user_id="service", allowed_patient_ids=("P00009",))
CLIENT = CallerContext(user_id="client", allowed_patient_ids=("P00002",))


def run_config(user) -> dict:
    return {"configurable": {"langgraph_auth_user": user}}


def test_server_user_wins_and_maps_permissions_to_a_caller():
    user = AuthenticatedUser("dr-lee", ("role:clinician", "patient:P00002", "patient:P00003", "threads:read"))
    caller = caller_for_run(run_config(user), base=BASE, trust_client_identity=True, client_caller=CLIENT)
    assert caller == CallerContext(user_id="dr-lee", roles=("clinician",), allowed_patient_ids=("P00002", "P00003"))
    no_patients = caller_for_run(run_config(AuthenticatedUser("nurse", ("role:nurse",))), base=BASE)
    assert no_patients.allowed_patient_ids is None and not no_patients.may_see("P00009")  # never "all", never base


def test_client_values_are_never_an_identity():
    forged = {"identity": "mallory", "permissions": ["patient:P00002"]}  # what JSON can carry
    assert caller_for_run(run_config(forged), base=BASE) is None  # refused outright: not even the base
    assert caller_for_run({"configurable": {"caller": CLIENT.model_dump()}}, base=BASE) == BASE
    assert caller_for_run(None, base=BASE, client_caller=CLIENT) == BASE  # not trusted unless switched on
    assert caller_for_run(None, base=BASE, trust_client_identity=True, client_caller=CLIENT) == CLIENT
    assert caller_for_run({"configurable": {}}, base=None) is None
    assert caller_for_run(run_config(None), base=BASE) == BASE  # server: no user (auth off) -> build-time


def test_user_directory_compares_hashes_and_rejects_bad_files(tmp_path):
    path = users_file(tmp_path / "users.json", {"tok-a": {"identity": "a", "allowed_patient_ids": ["P1"]},
                                                "tok-b": {"identity": "b"}})
    directory = UserDirectory.from_file(path)
    assert directory.authenticate("tok-a").identity == "a" and directory.authenticate("tok-b").identity == "b"
    assert directory.authenticate("tok-") is None and directory.authenticate("") is None
    assert directory.authenticate(None) is None
    assert "tok-a" not in path.read_text()  # only hashes are stored
    with pytest.raises(ValueError, match="cannot read"):
        UserDirectory.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"users": [{"identity": "x", "token_sha256": "abc"}]}')
    with pytest.raises(ValueError, match="64 lower-case hex"):
        UserDirectory.from_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="duplicate"):
        UserDirectory([UserRecord(identity="x", token_sha256=hash_token("t")),
                       UserRecord(identity="y", token_sha256=hash_token("t"))])
    assert token_from_headers({"Authorization": "Bearer  abc "}) == "abc"
    assert token_from_headers({"x-api-key": "k"}) == "k" and token_from_headers({"authorization": "Basic x"}) is None


# ----- the real `langgraph dev` server, with langgraph.json's auth and the real EMR_SEARCH -----

DOCTOR_TOKEN = "doctor-token-7f3a9c"
OTHER_TOKEN = "other-token-2b8e41"
LOOKUP = 'Tool_Use: EMR_SEARCH\nTool_Input: {"operation": "lookup", "patient_id": "P00002"}'
EMR_SCRIPT = {"replies": [LOOKUP, "Conclusion: done with {question}"], "default_score": 1.0, "real_tools": True}
FORGED_CALLER = {"user_id": "anyone", "allowed_patient_ids": ["P00002"]}
FORGED_AUTH_USER = {"identity": "anyone", "permissions": ["patient:P00002"]}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auth-dev")
    users = users_file(tmp / "users.json", {
        DOCTOR_TOKEN: {"identity": "dr-lee", "roles": ["clinician"], "allowed_patient_ids": ["P00002"]},
        OTHER_TOKEN: {"identity": "dr-other", "roles": ["clinician"], "allowed_patient_ids": ["P00005"]},
    })
    with langgraph_dev(tmp, script=script_file(tmp / "script.json", EMR_SCRIPT), users=users) as base:
        yield base


def client(base: str, token: str | None):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=base, api_key=None, headers={"Authorization": f"Bearer {token}"} if token else {})


def lookup_observation(out: dict) -> dict:
    (frame,) = [f for f in out["stack"] if f["action"] == "Tool_Use"]
    return frame["tool_call"]


def wait_run(base: str, token: str | None, **payload) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"assistant_id": "tcrag", "input": {"question": "Summarise patient P00002"}, **payload}
    return httpx.post(f"{base}/runs/wait", json=body, headers=headers, timeout=120)


@pytest.mark.slow
def test_no_or_invalid_token_is_refused(dev):
    attempts = [None, "wrong-token", DOCTOR_TOKEN + "x", DOCTOR_TOKEN[:-1]]
    for token in attempts:
        assert wait_run(dev, token).status_code == 401, token
    assert httpx.post(f"{dev}/runs/wait", json={"assistant_id": "tcrag", "input": {"question": "q"}},
                      headers={"x-auth-scheme": "langsmith"}, timeout=30).status_code == 401  # no Studio bypass
    assert httpx.get(f"{dev}/threads/search", headers={"X-API-Key": "nope"}, timeout=30).status_code in (401, 405)


@pytest.mark.slow
def test_client_supplied_identity_gives_no_access(dev):
    """The issue's exploit: a client names itself a caller allowed P00002. It must not see the record."""
    held, outcomes = 0, []
    for token in (OTHER_TOKEN, None):
        for payload in ({"context": {"caller": FORGED_CALLER}},
                        {"config": {"configurable": {"caller": FORGED_CALLER}}},
                        {"context": {"langgraph_auth_user": FORGED_AUTH_USER}},
                        {"config": {"configurable": {"langgraph_auth_user": FORGED_AUTH_USER}}}):
            r = wait_run(dev, token, **payload)
            outcomes.append(r.status_code)
            if r.status_code == 200:
                call = lookup_observation(r.json())
                assert call["is_error"] and call["error_kind"] == "forbidden", call
                assert "P00002" not in call["observation"].replace("patient_id", "") or "forbidden" in call["observation"]
            else:
                assert 400 <= r.status_code < 500, r.text
            held += 1
    print(f"forged identities: {held} attempts held, statuses {outcomes}")
    assert held == 8


@pytest.mark.slow
def test_authenticated_user_allowed_p00002_gets_the_record(dev):
    r = wait_run(dev, DOCTOR_TOKEN)
    assert r.status_code == 200, r.text
    call = lookup_observation(r.json())
    assert not call["is_error"], call
    assert "P00002" in call["observation"]
    other = lookup_observation(wait_run(dev, OTHER_TOKEN).json())  # allowed P00005 only
    assert other["is_error"] and other["error_kind"] == "forbidden"


@pytest.mark.slow
def test_threads_belong_to_their_owner(dev):
    doctor, other = client(dev, DOCTOR_TOKEN), client(dev, OTHER_TOKEN)
    thread = doctor.threads.create()
    assert doctor.threads.get(thread["thread_id"])["thread_id"] == thread["thread_id"]
    r = httpx.get(f"{dev}/threads/{thread['thread_id']}", headers={"Authorization": f"Bearer {OTHER_TOKEN}"},
                  timeout=30)
    assert r.status_code == 404
    assert thread["thread_id"] not in json.dumps(other.threads.search())
