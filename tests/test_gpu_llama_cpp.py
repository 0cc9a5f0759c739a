"""The llama.cpp backend with its layers on a GPU: ``device="cuda"`` offloads every layer, cppl/uct
agree with the CPU run of the same GGUF, prefix reuse equals plain generation, and ``n_gpu_layers``
offloads part of the model. Skipped without a llama-cpp-python built with GPU support and a GPU.

The checks run in a child pytest process that never imports torch (``test_in_a_process_without_torch``
starts it): on an H200 the CUDA build of llama.cpp crashed at model load in any process that had
imported torch (torch 2.11.0+cu130, llama.cpp built with nvcc 13.0; benchmarks/RESULTS.md section
12), and the rest of the suite imports torch. The package's llama.cpp path imports none.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest


def _llama_cpp_gpu() -> bool:
    """A GPU llama.cpp can offload to: a llama-cpp-python built with GPU support, and a GPU device."""
    try:
        import llama_cpp
    except Exception:  # noqa: BLE001
        return False
    return bool(llama_cpp.llama_supports_gpu_offload()) and (
        os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None or os.path.exists("/dev/kfd"))


pytestmark = pytest.mark.skipif(not _llama_cpp_gpu(), reason="needs llama-cpp-python built with GPU support and a GPU")
#: Set in the child process that runs the checks.
CHILD = os.environ.get("TCRAG_LLAMA_GPU_CHILD") == "1"
in_child = pytest.mark.skipif(not CHILD, reason="runs in the torch-free child process (test_in_a_process_without_torch)")

#: The GGUF under test: the packaged SmolLM2 (None), or one named by $TCRAG_GPU_TEST_MODEL.
MODEL = os.environ.get("TCRAG_GPU_TEST_MODEL") or None
QUERY = "What treats scurvy?"
TEXT = "Vitamin C treats scurvy."


@in_child
def test_llama_cpp_offloads_layers_and_scores_like_the_cpu():
    """device="cuda" offloads every layer (n_gpu_layers=-1); cppl/uct within 2 % of the CPU run of the
    same GGUF; generation with prefix reuse equals generation without."""
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel, load_llama_model
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


@in_child
def test_llama_cpp_partial_offload_option():
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    half = LlamaCppChatModel(model_path=MODEL, n_gpu_layers=8, max_new_tokens=8, temperature=0.0)
    assert half.invoke("Say hi").content


@in_child
def test_the_llama_cpp_gpu_path_imports_no_torch():
    import sys

    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    assert LlamaCppChatModel(model_path=MODEL, device="cuda", max_new_tokens=4, temperature=0.0).invoke("Hi").content
    assert "torch" not in sys.modules


@pytest.mark.skipif(CHILD, reason="this is the child")
def test_in_a_process_without_torch():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", __file__, "-v", "-p", "no:cacheprovider", "-o", "addopts="],
                         env={**os.environ, "TCRAG_LLAMA_GPU_CHILD": "1"}, capture_output=True, text=True, timeout=900)
    print(out.stdout[-6000:], out.stderr[-3000:])
    assert out.returncode == 0 and "3 passed" in out.stdout, (out.returncode, out.stdout[-3000:], out.stderr[-3000:])
