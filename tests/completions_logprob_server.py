"""A loopback OpenAI-compatible ``/v1/completions`` server with prompt log-probs, for tests.

It answers the way vLLM documents it (``echo`` + ``logprobs`` -> ``choices[0].logprobs`` with
``tokens``, ``token_logprobs`` (first ``null``), ``top_logprobs`` and ``text_offset``; the prompt
tokenised with special tokens added, as vLLM does), with log-probs computed by transformers from
the packaged SmolLM2 weights (a teacher-forced forward pass over the whole prompt at once).
``/v1/chat/completions`` generates with the same weights (chat template, greedy), so one server is
both the generator and the state monitor of a served model, as a vLLM server is.

Served model names: ``smollm2`` answers correctly. The names below make it answer like a broken
or different server, so clients can be tested against real HTTP responses:

* ``defect-no-logprobs``: ``"logprobs": null`` (a server that ignores the parameter);
* ``defect-chat-schema``: a chat-completions body (``choices[0].message``);
* ``defect-offsets``: ``text_offset`` that is not the running length of the tokens;
* any other name: HTTP 404 as vLLM does for an unknown model.

Concurrent requests: the model work of a request (forward pass, generation) runs in a worker
thread, so the event loop keeps taking requests; ``--parallel K`` (default 1) lets up to K of them
compute at once, the others wait their turn. Every request is computed from its own token ids alone:
``generate`` starts a new key/value cache for each call and nothing is kept between requests, so an
answer cannot depend on which requests ran before it or beside it (greedy answers are the same for
any K and any interleaving; tests/eval/test_concurrency_served.py checks this through ``tcrag eval``).

Run: ``python tests/completions_logprob_server.py --port P [--api-key-env VAR] [--parallel K]``.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import anyio
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tcrag_langgraph.models.weights import load_local_model

MODEL_NAME = "smollm2"


def prompt_logprobs(lm, ids: list[int], k: int) -> tuple[list, list]:
    """log P(ids[i] | ids[:i]) for every position (None for the first) and the top-k at each."""
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    values: list = [None]
    tops: list = [None]
    for i in range(1, len(ids)):
        row = logp[i - 1]
        values.append(max(float(row[ids[i]]), -9999.0))  # vLLM clamps to -9999
        top = {lm.tokenizer.decode([ids[i]]): values[-1]}
        if k > 0:
            best = torch.topk(row, k)
            for lp, tid in zip(best.values.tolist(), best.indices.tolist()):
                top[lm.tokenizer.decode([tid])] = max(lp, -9999.0)
        tops.append(top)
    return values, tops


def make_app(api_key: str | None, parallel: int = 1) -> Starlette:
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    lm = load_local_model()
    slots = threading.BoundedSemaphore(parallel)
    # requests received and not yet answered (now and at most), so a client can see its own concurrency
    stats = {"requests": 0, "in_flight": 0, "peak_in_flight": 0}

    def counted(endpoint):
        async def wrapper(request: Request) -> JSONResponse:
            stats["requests"] += 1
            stats["in_flight"] += 1
            stats["peak_in_flight"] = max(stats["peak_in_flight"], stats["in_flight"])
            try:
                return await endpoint(request)
            finally:
                stats["in_flight"] -= 1
        return wrapper

    def _in_slot(fn, *args):
        with slots, torch.no_grad():
            return fn(*args)

    async def compute(fn, *args):
        """Run ``fn(*args)`` in a worker thread once one of the ``parallel`` slots is free."""
        return await anyio.to_thread.run_sync(_in_slot, fn, *args)

    def generate(ids: list[int], limit: int) -> list[int]:
        """Greedy continuation of ``ids``; a fresh key/value cache for this call only."""
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=limit, do_sample=False,
                                pad_token_id=lm.tokenizer.eos_token_id)
        return out[0, len(ids):].tolist()

    async def completions(request: Request) -> JSONResponse:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "invalid api key", "type": "auth"}}, status_code=401)
        body = await request.json()
        model = body.get("model")
        if model not in (MODEL_NAME, "defect-no-logprobs", "defect-chat-schema", "defect-offsets"):
            return JSONResponse({"object": "error", "message": f"The model `{model}` does not exist.",
                                 "type": "NotFoundError", "code": 404}, status_code=404)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return JSONResponse({"object": "error", "message": "prompt must be a string", "code": 400}, status_code=400)
        k = body.get("logprobs")
        echo = bool(body.get("echo", False))
        max_tokens = int(body.get("max_tokens", 16) or 0)
        ids = lm.tokenizer(prompt)["input_ids"]
        values, tops = await compute(prompt_logprobs, lm, ids, int(k or 0))
        tokens = [lm.tokenizer.decode([i]) for i in ids]
        generated = []
        if max_tokens > 0:
            generated = await compute(generate, ids, max_tokens)
        text = (prompt if echo else "") + lm.tokenizer.decode(generated)
        logprobs = None
        if k is not None:
            out_tokens, out_values, out_tops = (tokens, values, tops) if echo else ([], [], [])
            # Generated tokens are not scored here: clients of this server only read prompt tokens.
            out_tokens = out_tokens + [lm.tokenizer.decode([g]) for g in generated]
            out_values = out_values + [0.0] * len(generated)
            out_tops = out_tops + [{}] * len(generated)
            offsets, running = [], 0
            for token in out_tokens:
                offsets.append(running)
                running += len(token)
            if model == "defect-offsets":
                offsets = [2 * o for o in offsets]
            logprobs = {"text_offset": offsets, "token_logprobs": out_values, "tokens": out_tokens,
                        "top_logprobs": out_tops}
        if model == "defect-no-logprobs":
            logprobs = None
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length",
                  "stop_reason": None, "prompt_logprobs": None}
        if model == "defect-chat-schema":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return JSONResponse({
            "id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                      "total_tokens": len(ids) + len(generated)},
        })

    async def chat_completions(request: Request) -> JSONResponse:
        """``/v1/chat/completions`` the way vLLM answers it: the model's chat template, greedy
        generation by the same weights, ``max_tokens`` / ``max_completion_tokens`` and ``stop`` honoured."""
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "invalid api key", "type": "auth"}}, status_code=401)
        body = await request.json()
        model = body.get("model")
        if model != MODEL_NAME:
            return JSONResponse({"object": "error", "message": f"The model `{model}` does not exist.",
                                 "type": "NotFoundError", "code": 404}, status_code=404)
        messages = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
                     else "".join(part.get("text", "") for part in m["content"])} for m in body["messages"]]
        limit = int(body.get("max_completion_tokens") or body.get("max_tokens") or 64)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        ids = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        generated = await compute(generate, ids, limit)
        text = lm.tokenizer.decode(generated, skip_special_tokens=True)
        finish = "length" if len(generated) >= limit else "stop"
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        return JSONResponse({
            "id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": finish,
                                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(generated),
                      "total_tokens": len(ids) + len(generated)},
        })

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]})

    async def get_stats(request: Request) -> JSONResponse:
        """Counts of completions requests; ``POST`` resets the peak (between two client runs)."""
        if request.method == "POST":
            stats["requests"], stats["peak_in_flight"] = 0, stats["in_flight"]
        return JSONResponse({**stats, "parallel": parallel})

    return Starlette(routes=[
        Route("/v1/completions", counted(completions), methods=["POST"]),
        Route("/v1/chat/completions", counted(chat_completions), methods=["POST"]),
        Route("/stats", get_stats, methods=["GET", "POST"]),
        Route("/health", health),
        Route("/v1/models", models),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the required API key")
    parser.add_argument("--parallel", type=int, default=1, help="requests computed at once (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    uvicorn.run(make_app(api_key, args.parallel), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
