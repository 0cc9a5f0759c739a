"""Models by file and by name: .gguf paths, "provider:model" strings, device and dtype options.

GPU loading is not exercised here (no GPU on the machines these tests were written on)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from tcrag_langgraph.models.local import LocalChatModel
from tcrag_langgraph.models.weights import (DTYPES, LocalModelError, default_model_source, device_syntax, load_local_model,
                                            validate_device)
from tcrag_langgraph.models.resolve import resolve_chat_model
from tcrag_langgraph.monitor.scoring import LocalLMScorer

from .helpers_servers import uvicorn_thread

QUERY = "What treats scurvy?"
TEXT = "Vitamin C treats scurvy."


def packaged_gguf() -> Path:
    folder, name = default_model_source()
    return folder / name


# --- resolve_chat_model ------------------------------------------------------------------------

def test_none_is_the_packaged_model_and_nothing_loads():
    chat = resolve_chat_model(None, max_new_tokens=7, temperature=0.0)
    assert isinstance(chat, LocalChatModel) and chat.model_path is None
    assert (chat.max_new_tokens, chat.temperature) == (7, 0.0)
    assert chat._lm is None
    assert chat.model_id == "SmolLM2-135M-Instruct"


def test_paths_become_local_chat_models(model_folder, tmp_path):
    gguf = packaged_gguf()
    by_file = resolve_chat_model(str(gguf), dtype="bfloat16")
    assert isinstance(by_file, LocalChatModel) and by_file.model_path == str(gguf) and by_file.dtype == "bfloat16"
    assert by_file.model_id == "SmolLM2-135M-Instruct.Q4_1"
    folder = model_folder
    by_folder = resolve_chat_model(folder)  # a PathLike too
    assert by_folder.model_path == str(folder) and by_folder.model_id == folder.name
    with pytest.raises(ValueError, match="does not exist"):
        resolve_chat_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="not a transformers model folder"):
        resolve_chat_model(str(tmp_path))


def test_a_chat_model_is_returned_as_is_and_bad_specs_are_clear():
    fake = FakeListChatModel(responses=["x"])
    assert resolve_chat_model(fake) is fake
    with pytest.raises(ValueError, match="already built"):
        resolve_chat_model(fake, temperature=0.0)
    for bad in ("gpt4", "", "openai:", ":model"):
        with pytest.raises(ValueError, match="provider:model|model must be"):
            resolve_chat_model(bad)
    with pytest.raises(ValueError, match="model must be"):
        resolve_chat_model(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device and dtype apply to local models only"):
        resolve_chat_model("openai:m", device="cpu")
    with pytest.raises(ValueError, match="could not be resolved|not installed"):
        resolve_chat_model("no_such_provider:m")


def test_openai_name_talks_to_a_real_chat_completions_server():
    pytest.importorskip("langchain_openai")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[dict] = []

    async def chat_completions(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("authorization")})
        last = body["messages"][-1]["content"]
        return JSONResponse({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"echo: {last[::-1]}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        })

    app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])
    with uvicorn_thread(app) as base:
        chat = resolve_chat_model("openai:served-qwen", base_url=f"{base}/v1", api_key="sk-loopback",
                                  max_new_tokens=12, temperature=0.0, max_retries=0, timeout=10)
        reply = chat.invoke("scurvy")
    assert reply.content == "echo: yvrucs"
    assert reply.usage_metadata["total_tokens"] == 5
    (call,) = seen
    assert call["body"]["model"] == "served-qwen"
    # langchain-openai sends the limit as max_completion_tokens (newer) or max_tokens (older).
    assert call["body"].get("max_completion_tokens", call["body"].get("max_tokens")) == 12
    assert call["body"]["temperature"] == 0.0 and call["auth"] == "Bearer sk-loopback"


# --- device and dtype --------------------------------------------------------------------------

def test_dtype_and_device_are_validated():
    assert DTYPES == ("float32", "bfloat16", "float16")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        load_local_model(dtype="int4")
    with pytest.raises(ValueError, match="unknown device"):
        load_local_model(device="gpu0")
    with pytest.raises(ValueError, match="unknown dtype"):
        LocalChatModel(dtype="fp32")
    with pytest.raises(ValueError, match="unknown device"):
        LocalChatModel(device="graphics-card")
    for bad in ("", "gpu", "cuda:", "cuda:x", "CPU0", "tpu", None):
        with pytest.raises(ValueError, match="unknown device"):
            device_syntax(bad)
    assert [device_syntax(d) for d in ("cpu", " cuda ", "cuda:1", "mps")] == ["cpu", "cuda", "cuda:1", "mps"]
    assert validate_device(" cpu ") == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(LocalModelError, match="no CUDA GPU"):
        load_local_model(device="cuda")


def test_bfloat16_on_cpu_generates_and_scores_close_to_float32(lm):
    half = load_local_model(device="cpu", dtype="bfloat16")
    assert half is not lm and half is load_local_model(dtype="bfloat16")  # cached per option set
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert next(lm.model.parameters()).dtype == torch.float32
    assert str(half.device) == "cpu"
    full_value = LocalLMScorer(lm).score(QUERY, TEXT, metric="cppl")
    half_value = LocalLMScorer(half).score(QUERY, TEXT, metric="cppl")
    assert math.isfinite(half_value) and half_value != full_value
    assert half_value == pytest.approx(full_value, rel=0.15)  # bf16 keeps ~3 significant digits per logit
    chat = LocalChatModel(dtype="bfloat16", max_new_tokens=8, temperature=0.0, kv_cache=True)
    assert chat.local_model is half
    first = chat.invoke("Name a vitamin.").content
    assert first and chat.invoke("Name a vitamin.").content == first  # greedy, second call from the KV cache
    assert chat.kv_cache_stats["reused_tokens"] > 0  # the bf16 KV cache was reused


# --- .gguf paths -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_gguf_path_is_converted_once_with_a_message_and_cached(tmp_path, lm):
    """In a fresh interpreter with an empty cache: the first load converts and says so on stderr,
    the second load (another process) reads the cached copy silently; logits equal the packaged model's."""
    gguf = packaged_gguf()
    script = (
        "import json, sys, torch\n"
        "from tcrag_langgraph.models.weights import gguf_cache_folder, load_local_model\n"
        f"lm = load_local_model({str(gguf)!r})\n"
        "ids = lm.tokenizer('What treats scurvy? Vitamin C.', return_tensors='pt')['input_ids']\n"
        "with torch.no_grad(): logits = lm.model(ids).logits[0, -1]\n"
        f"print(json.dumps({{'name': lm.name, 'folder': str(gguf_cache_folder({str(gguf)!r})), "
        "'top': logits.topk(5).indices.tolist(), 'max': float(logits.max())}))\n"
    )
    env = {**os.environ, "TCRAG_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=400)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "tcrag: converting" in first.stderr and "first use only" in first.stderr
    result = json.loads(first.stdout.strip().splitlines()[-1])
    folder = Path(result["folder"])
    assert folder.is_relative_to(tmp_path / "cache") and (folder / "config.json").is_file()
    assert result["name"] == "SmolLM2-135M-Instruct.Q4_1"
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=400)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "tcrag: converting" not in second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1]) == result
    # Same weights as the packaged default (converted from the same GGUF).
    ids = lm.tokenizer("What treats scurvy? Vitamin C.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = lm.model(ids).logits[0, -1]
    assert logits.topk(5).indices.tolist() == result["top"]
    assert float(logits.max()) == pytest.approx(result["max"], rel=1e-5)


def test_a_missing_gguf_is_a_clear_error(tmp_path):
    with pytest.raises(LocalModelError, match="GGUF file .* does not exist"):
        load_local_model(tmp_path / "nope.gguf")
    with pytest.raises(LocalModelError, match="transformers folder or a .gguf file"):
        load_local_model(tmp_path / "nope")
