"""The llama.cpp backend with its layers on a GPU: ``device="cuda"`` offloads every layer, cppl/uct
agree with the CPU run of the same GGUF, prefix reuse equals plain generation, ``n_gpu_layers``
offloads part of the model, the model loads in a process that imported numpy and torch first, and
replies decoded together (greedy_replies) keep to a grammar and match clear one-at-a-time replies.
Skipped without a llama-cpp-python built with GPU support and a GPU.

On an H100 the CUDA build of llama.cpp crashed at model load in any process where libstdc++ had been
loaded before llama.cpp's libraries (by numpy, torch, or pytest's jaxtyping plugin);
``models/llama_cpp_native.share_cxx_runtime`` is the fix (benchmarks/RESULTS.md section 12). These
tests run in the ordinary pytest process, plugins and all, which is such a process.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest


def _llama_cpp_gpu() -> bool:
    """A GPU llama.cpp can offload to: a llama-cpp-python built with GPU support, and a GPU device."""
    from tcrag_langgraph.models.llama_cpp_native import import_llama_cpp

    try:
        llama_cpp = import_llama_cpp()
    except Exception:  # noqa: BLE001
        return False
    return bool(llama_cpp.llama_supports_gpu_offload()) and (
        os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None or os.path.exists("/dev/kfd"))


pytestmark = pytest.mark.skipif(not _llama_cpp_gpu(), reason="needs llama-cpp-python built with GPU support and a GPU")

#: The GGUF under test: the packaged SmolLM2 (None), or one named by $TCRAG_GPU_TEST_MODEL.
MODEL = os.environ.get("TCRAG_GPU_TEST_MODEL") or None
QUERY = "What treats scurvy?"
TEXT = "Vitamin C treats scurvy."


def test_llama_cpp_offloads_layers_and_scores_like_the_cpu():
    """device="cuda" offloads every layer (n_gpu_layers=-1); cppl/uct within 2 % of the CPU run of the
    same GGUF; generation with prefix reuse equals generation without."""
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
    from tcrag_langgraph.models.llama_cpp_model import load_llama_model
    from tcrag_langgraph.monitor.llama_cpp import LlamaCppScorer

    gpu_chat = LlamaCppChatModel(model_path=MODEL, device="cuda", max_new_tokens=12, temperature=0.0)
    cpu = load_llama_model(MODEL, n_gpu_layers=0)
    gpu = gpu_chat.llama_model
    assert gpu is not cpu
    for metric in ("cppl", "uct"):
        reference = LlamaCppScorer(model_loader=lambda: cpu).score(QUERY, TEXT, metric=metric)
        value = LlamaCppScorer(chat_model=gpu_chat).score(QUERY, TEXT, metric=metric)
        assert math.isfinite(value) and value == pytest.approx(reference, rel=0.02), metric
    plain = LlamaCppChatModel(model_path=MODEL, device="cuda", max_new_tokens=12, temperature=0.0, kv_cache=False)
    first = gpu_chat.invoke("Which vitamin prevents scurvy?")
    second = gpu_chat.invoke("Which vitamin prevents scurvy? Answer briefly.")
    assert second.usage_metadata["input_token_details"]["cache_read"] > 0
    assert second.content == plain.invoke("Which vitamin prevents scurvy? Answer briefly.").content
    assert first.content


def test_llama_cpp_partial_offload_option():
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    half = LlamaCppChatModel(model_path=MODEL, n_gpu_layers=8, max_new_tokens=8, temperature=0.0)
    assert half.invoke("Say hi").content


def _fresh_process(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TCRAG_GPU_TEST_MODEL": MODEL or ""})
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


def test_the_gpu_model_loads_after_numpy_and_torch():
    """The order that crashed: numpy and torch (where installed) imported before llama.cpp's libraries."""
    out = _fresh_process(
        "import os, numpy\n"
        "try:\n    import torch\nexcept ImportError:\n    torch = None\n"
        "from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel\n"
        "chat = LlamaCppChatModel(model_path=os.environ['TCRAG_GPU_TEST_MODEL'] or None, device='cuda', max_new_tokens=4, temperature=0.0)\n"
        "print('REPLY', repr(chat.invoke('Hi').content), 'TORCH', torch is not None)\n")
    assert "REPLY '" in out and "REPLY ''" not in out, out


def test_the_llama_cpp_gpu_path_imports_no_torch():
    out = _fresh_process(
        "import os, sys\n"
        "from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel\n"
        "chat = LlamaCppChatModel(model_path=os.environ['TCRAG_GPU_TEST_MODEL'] or None, device='cuda', max_new_tokens=4, temperature=0.0)\n"
        "assert chat.invoke('Hi').content\n"
        "print('TORCH', 'torch' in sys.modules)\n")
    assert "TORCH False" in out, out


def test_replies_decoded_together_on_the_gpu_keep_to_the_grammar_and_match_clear_greedy_replies():
    """greedy_replies with the layers on the GPU (tcrag_langgraph.models.llama_cpp_batch): every reply
    keeps to the grammar, in its prompt's place, and equals the one-at-a-time reply up to the first token
    whose lead is under 0.5 nats (batched kernels may break a nearer tie the other way)."""
    from langchain_core.messages import HumanMessage

    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    chat = LlamaCppChatModel(model_path=MODEL, device="cuda", max_new_tokens=12, temperature=0.0)
    questions = ["What treats scurvy?", "Name a yellow fruit.", "What colour is the sky?", "What do bees make?"]
    forced = chat.greedy_replies([[HumanMessage(q)] for q in questions], sequences=2,
                                 grammar='root ::= "Answer: " ( "yes" | "no" ) "."\n')
    assert all(r.text in ("Answer: yes.", "Answer: no.") for r in forced)
    together = chat.greedy_replies([[HumanMessage(q)] for q in questions], sequences=3)
    for question, batched in zip(questions, together):
        single = chat.invoke([HumanMessage(question)], logprobs=True, top_logprobs=2)
        clear = ""
        for token in single.response_metadata["logprobs"]["content"]:
            if token["top_logprobs"][0]["logprob"] - token["top_logprobs"][1]["logprob"] < 0.5:
                break
            clear += token["token"]
        assert batched.text.startswith(clear.strip()), (question, clear, batched.text)
