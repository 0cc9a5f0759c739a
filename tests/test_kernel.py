"""The run kernel's model call against a real (loopback) OpenAI-compatible server."""

from __future__ import annotations

import pytest

from tcrag_langgraph import TCRAGConfig, build_graph
from tcrag_langgraph.core.kernel import MAX_PROVIDER_STOPS
from tcrag_langgraph.methods.tcrag.graph import STOP_SEQUENCES
from tcrag_langgraph.models.resolve import resolve_chat_model

from .helpers_servers import uvicorn_thread


def strict_openai_server(replies: list[str], seen: list[dict]):
    """A chat-completions server that, like OpenAI's API, refuses more than 4 stop sequences, and that
    takes neither a grammar nor a JSON schema (it refuses both fields, as servers refuse what they do not
    know), so the run is not constrained (models/constrained.py probes it once and finds nothing)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat_completions(request: Request) -> JSONResponse:
        body = await request.json()
        for field in ("grammar", "response_format"):
            if field in body:
                return JSONResponse({"error": {"message": f"Unrecognized request argument supplied: {field}",
                                               "type": "invalid_request_error"}}, status_code=400)
        seen.append(body)
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if len(stop) > 4:
            return JSONResponse({"error": {"message": "'stop': array too long, at most 4", "type": "invalid_request_error"}},
                                status_code=400)
        text = replies[min(len(seen), len(replies)) - 1]
        return JSONResponse({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        })

    return Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])


def test_a_provider_gets_at_most_four_stops_and_the_rest_apply_here():
    pytest.importorskip("langchain_openai")
    assert len(STOP_SEQUENCES) > MAX_PROVIDER_STOPS == 4
    seen: list[dict] = []
    # The second reply runs on past a stop sequence the server was not sent ("\n\nPlan:"): the kernel cuts it.
    replies = ["Thought: check the guideline first.\n\nPlan: invent a whole run", "Conclusion: metformin"]
    with uvicorn_thread(strict_openai_server(replies, seen)) as base:
        chat = resolve_chat_model("openai:served-qwen", base_url=f"{base}/v1", api_key="sk-loopback", max_retries=0,
                                  timeout=10)
        graph = build_graph(model=chat, config=TCRAGConfig(enable_state_monitor=False, max_steps=4))
        out = graph.invoke({"question": "First-line drug for type 2 diabetes?"})
    assert [len(body["stop"]) for body in seen] == [MAX_PROVIDER_STOPS, MAX_PROVIDER_STOPS]
    assert seen[0]["stop"] == STOP_SEQUENCES[:MAX_PROVIDER_STOPS]
    assert out["halt_reason"] == "conclusion_unmonitored" and out["answer"] == "metformin"
    thought = out["stack"][1]
    assert thought.action.value == "Thought" and thought.content == "check the guideline first."
    assert "invent" not in " ".join(f.content for f in out["stack"])


def test_the_strict_server_really_refuses_five_stops():
    """The check above could fail: sent all eleven, the same server answers 400."""
    pytest.importorskip("langchain_openai")
    from openai import BadRequestError

    seen: list[dict] = []
    with uvicorn_thread(strict_openai_server(["x"], seen)) as base:
        chat = resolve_chat_model("openai:served-qwen", base_url=f"{base}/v1", api_key="sk-loopback", max_retries=0,
                                  timeout=10)
        with pytest.raises(BadRequestError, match="at most 4"):
            chat.invoke("hi", stop=STOP_SEQUENCES)
