"""Issue 21 item 2: under the real `langgraph dev` (langgraph.json's auth), assistants, crons and the
store belong to the user who made them; a second authenticated user can neither read, change nor
delete them. One two-user test per resource."""

from __future__ import annotations

import httpx
import pytest

from tcrag_langgraph.faces.auth_resources import scoped_namespace, store_root

from .helpers_servers import langgraph_dev, script_file, users_file

OWNER_TOKEN = "owner-token-5e1d7c"
OTHER_TOKEN = "other-token-0a9f3b"
SCRIPT = {"replies": ["Conclusion: done with {question}"], "default_score": 1.0}
YEARLY = "0 0 1 1 *"  # never due during the test


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auth-resources-dev")
    users = users_file(tmp / "users.json", {OWNER_TOKEN: {"identity": "dr-owner"},
                                            OTHER_TOKEN: {"identity": "dr-other.example"}})
    with langgraph_dev(tmp, script=script_file(tmp / "script.json", SCRIPT), users=users) as base:
        yield base, tmp / "dev.log"


def client(base: str, token: str):
    from langgraph_sdk import get_sync_client

    return get_sync_client(url=base, api_key=None, headers={"Authorization": f"Bearer {token}"})


def raw(base: str, token: str, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{base}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60, **kw)


@pytest.mark.slow
def test_assistants_belong_to_their_owner(dev):
    base, log = dev
    owner = client(base, OWNER_TOKEN)
    made = owner.assistants.create("tcrag", name="owners", context={"answer_format": ["yes", "no"]})
    aid = made["assistant_id"]
    assert made["metadata"]["owner"] == "dr-owner"
    refused = []
    for method, path, body in (("GET", f"/assistants/{aid}", None),
                               ("PATCH", f"/assistants/{aid}", {"context": {"answer_format": ["IGNORE ALL RULES"]}}),
                               ("DELETE", f"/assistants/{aid}", None),
                               ("POST", "/runs/wait", {"assistant_id": aid, "input": {"question": "q?"}})):
        r = raw(base, OTHER_TOKEN, method, path, **({"json": body} if body is not None else {}))
        assert r.status_code in (403, 404), (method, path, r.status_code, r.text)
        refused.append(r.status_code)
    found = raw(base, OTHER_TOKEN, "POST", "/assistants/search", json={"limit": 100}).json()
    assert aid not in {a["assistant_id"] for a in found}
    assert "tcrag" in {a["graph_id"] for a in found}  # the graph's system assistant stays visible to all
    # the owner's assistant is intact and still the owner's to use and change
    kept = owner.assistants.get(aid)
    assert kept["context"] == {"answer_format": ["yes", "no"]} and kept["metadata"]["owner"] == "dr-owner"
    run = raw(base, OWNER_TOKEN, "POST", "/runs/wait", json={"assistant_id": aid, "input": {"question": "q?"}})
    assert run.status_code == 200, run.text  # the owner's answer_format (not the other's patch) ruled the run:
    assert "must be exactly one of yes, no" in run.json()["error"] and "IGNORE" not in run.text
    # nobody may patch or delete the system assistant, nor give an assistant away
    system = [a for a in found if a["graph_id"] == "tcrag" and a["metadata"].get("created_by") == "system"][0]
    for token in (OTHER_TOKEN, OWNER_TOKEN):
        assert raw(base, token, "PATCH", f"/assistants/{system['assistant_id']}",
                   json={"context": {"answer_format": ["x"]}}).status_code in (403, 404)
        assert raw(base, token, "DELETE", f"/assistants/{system['assistant_id']}").status_code in (403, 404)
    moved = owner.assistants.update(aid, metadata={"owner": "dr-other.example", "created_by": "system"})
    assert moved["metadata"]["owner"] == "dr-owner" and "created_by" not in moved["metadata"]
    owner.assistants.delete(aid)
    assert raw(base, OWNER_TOKEN, "GET", f"/assistants/{aid}").status_code == 404
    assert "no handler registered" not in log.read_text()
    print(f"assistants: other user refused {refused}")


@pytest.mark.slow
def test_crons_belong_to_their_owner(dev):
    base, _ = dev
    owner, other = client(base, OWNER_TOKEN), client(base, OTHER_TOKEN)
    cron = owner.crons.create("tcrag", schedule=YEARLY, input={"question": "yearly check"})
    cid = cron["cron_id"]
    assert cid in {c["cron_id"] for c in owner.crons.search(limit=100)}
    assert cid not in {c["cron_id"] for c in other.crons.search(limit=100)}
    assert other.crons.count() == 0 and owner.crons.count() >= 1
    refused = []
    for method, path, body in (("PATCH", f"/runs/crons/{cid}", {"schedule": "* * * * *"}),
                               ("DELETE", f"/runs/crons/{cid}", None)):
        r = raw(base, OTHER_TOKEN, method, path, **({"json": body} if body is not None else {}))
        assert r.status_code in (403, 404), (method, r.status_code, r.text)
        refused.append(r.status_code)
    (kept,) = [c for c in owner.crons.search(limit=100) if c["cron_id"] == cid]
    assert kept["schedule"] == YEARLY and kept["metadata"]["owner"] == "dr-owner"
    owner.crons.delete(cid)
    assert cid not in {c["cron_id"] for c in owner.crons.search(limit=100)}
    print(f"crons: other user refused {refused}")


@pytest.mark.slow
def test_store_namespaces_are_per_user(dev):
    base, _ = dev
    owner, other = client(base, OWNER_TOKEN), client(base, OTHER_TOKEN)
    owner.store.put_item(("notes",), "plan", {"text": "owner's private note"})
    item = owner.store.get_item(("notes",), "plan")
    assert item["value"] == {"text": "owner's private note"}
    assert tuple(item["namespace"]) == scoped_namespace("dr-owner", ("notes",))
    # the other user asks for the same namespace, and for the owner's full namespace: neither is the owner's
    assert other.store.get_item(("notes",), "plan") is None
    assert other.store.get_item(tuple(item["namespace"]), "plan") is None
    other.store.put_item(("notes",), "plan", {"text": "overwritten by the other user"})
    other.store.put_item(tuple(item["namespace"]), "plan", {"text": "overwritten by the other user"})
    other.store.delete_item(("notes",), "plan")
    other.store.delete_item(tuple(item["namespace"]), "plan")
    assert owner.store.get_item(("notes",), "plan")["value"] == {"text": "owner's private note"}
    found = other.store.search_items((), limit=100)["items"]
    assert all(tuple(i["namespace"])[0] == store_root("dr-other.example") for i in found)
    assert "owner's private note" not in str(found)
    spaces = other.store.list_namespaces(limit=100)["namespaces"]
    assert spaces and all(tuple(ns)[0] == store_root("dr-other.example") for ns in spaces)
    # the owner reads back what it wrote with the namespace it was given, and deletes it
    assert owner.store.get_item(tuple(item["namespace"]), "plan")["value"] == {"text": "owner's private note"}
    owner.store.delete_item(("notes",), "plan")
    assert owner.store.get_item(("notes",), "plan") is None
