"""Issue 21 item 5: a SPARQL endpoint's error body is scrubbed first, then cut to 300 characters.

A careless endpoint (a real HTTP server on 127.0.0.1) echoes the request's credentials in its error
page, padded so that each credential straddles the 300th character at every possible offset. No
fragment of a credential (4 characters or more) may reach the error message or the tool's error.
"""

from __future__ import annotations

import base64

from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.knowledge_graph import KGQueryError, KnowledgeGraph, knowledge_graph_tool

PASSWORD = "kg-pass-7c1e9a0d4b"
API_KEY = "kg-key-55d2b0f1e3"
BASIC = base64.b64encode(f"reader:{PASSWORD}".encode()).decode()
CUT = 300


def _fragments(secret: str, n: int = 4) -> set[str]:
    return {secret[i:i + n] for i in range(len(secret) - n + 1)}


def _leaks(text: str) -> list[str]:
    return sorted(f for secret in (PASSWORD, API_KEY, BASIC) for f in _fragments(secret) if f in text)


def test_a_credential_straddling_the_cut_never_survives_in_part(http_server):
    probes: list[tuple[str, int]] = []
    for name, secret in (("password", PASSWORD), ("basic", BASIC), ("key", API_KEY)):
        probes += [(name, offset) for offset in range(1, len(secret))]  # secret starts `offset` chars before the cut
    current: dict[str, object] = {}

    def echo(req, n):
        name, offset = current["probe"]
        sent = {"password": PASSWORD, "basic": req.headers.get("authorization", "").removeprefix("Basic "),
                "key": req.headers.get("x-api-key", "")}[name]
        assert sent, "the client did not send the credential to its own origin"
        body = "." * (CUT - offset) + sent + " (echoed by a careless server)"
        return http_server.Reply(500, body, content_type="text/plain")

    http_server.respond = echo
    url = http_server.url.replace("http://", f"http://reader:{PASSWORD}@") + "/query"
    kg = KnowledgeGraph.from_endpoint(url, method="GET", headers={"X-API-Key": API_KEY})
    tool = knowledge_graph_tool(kg, retries=0, cache_size=0)
    leaked: list[tuple[str, int, list[str]]] = []
    for probe in probes:
        current["probe"] = probe
        try:
            kg.lookup("Marfan syndrome")
        except KGQueryError as exc:
            message = str(exc)
        else:
            raise AssertionError("the endpoint's HTTP 500 was not an error")
        assert "HTTP 500: ...." in message and len(message.split("HTTP 500: ", 1)[1]) <= CUT
        result = tool.invoke({"query": "", "entities": ["Marfan syndrome"]})
        assert isinstance(result, ToolError) and result.kind == "unavailable"
        found = _leaks(message) + _leaks(str(result))
        if found:
            leaked.append((*probe, found))
    print(f"{len(probes)} probes, {len(leaked)} leaked a fragment")
    assert len(probes) == len(PASSWORD) + len(BASIC) + len(API_KEY) - 3 and not leaked, leaked[:5]
