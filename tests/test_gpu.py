"""The packaged model on a CUDA GPU: loading by ``device``/``dtype``, scoring against the CPU float32
reference, the stack-aligned KV cache against uncached generation, and a TC-RAG run whose monitor
scores on the GPU. Skipped where torch sees no CUDA GPU (this project's CI and its 2-core machine);
run them on a GPU machine with ``pytest tests/test_gpu.py``."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tcrag_langgraph.monitor.scoring import LocalLMScorer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU visible to torch")


#: The model under test: the packaged SmolLM2 (None), or a .gguf / transformers folder named by
#: $TCRAG_GPU_TEST_MODEL (e.g. a smaller GGUF where the packaged 98 MB file cannot be copied over).
MODEL = os.environ.get("TCRAG_GPU_TEST_MODEL") or None


@pytest.fixture(scope="module")
def reference():
    """The model under test on the CPU in float32: the reference the GPU results are compared with."""
    from tcrag_langgraph.models.weights import load_local_model

    return load_local_model(MODEL)


QUERY = "What treats scurvy?"
TEXT = "Vitamin C treats scurvy."


@pytest.mark.parametrize("dtype,rel", [("float32", 1e-3), ("bfloat16", 0.15), ("float16", 0.05)])
def test_scores_on_the_gpu_agree_with_the_cpu_reference(reference, dtype, rel):
    from tcrag_langgraph.models.weights import load_local_model

    gpu = load_local_model(MODEL, device="cuda", dtype=dtype)
    assert gpu.device.type == "cuda" and next(gpu.model.parameters()).dtype == getattr(torch, dtype)
    for metric in ("cppl", "uct"):
        expected = LocalLMScorer(reference).score(QUERY, TEXT, metric=metric)
        value = LocalLMScorer(gpu).score(QUERY, TEXT, metric=metric)
        assert math.isfinite(value) and value == pytest.approx(expected, rel=rel), metric


def test_cached_generation_on_the_gpu_equals_uncached_over_pushes_and_pops():
    from tcrag_langgraph.core.state import Action, Frame
    from tcrag_langgraph.models.local import LocalChatModel

    from .test_kv_cache import _ids, _messages, _script

    cached = LocalChatModel(model_path=MODEL, device="cuda", max_new_tokens=6, temperature=0.0)
    plain = LocalChatModel(model_path=MODEL, device="cuda", max_new_tokens=6, temperature=0.0, kv_cache=False)
    gpu = cached.local_model
    assert plain.local_model is gpu and gpu.device.type == "cuda"
    reads = []
    for stack in _script([Frame(action=Action.USER_QUERY, content="What treats type 2 diabetes?")]):
        messages = _messages(stack, few_shot=False)
        a, b = cached.invoke(messages), plain.invoke(messages)
        a_ids = gpu.tokenizer(a.content, add_special_tokens=False)["input_ids"]
        b_ids = gpu.tokenizer(b.content, add_special_tokens=False)["input_ids"]
        if a_ids != b_ids:  # allowed only where float noise of the split prefill flipped a near-tie
            k = next(i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y)
            with torch.no_grad():
                logits = gpu.model(torch.tensor([_ids(gpu, messages) + b_ids[:k]], device=gpu.device)).logits[0, -1]
            gap = float(logits[b_ids[k]] - logits[a_ids[k]])
            assert abs(gap) < 1e-3, f"outputs differ at token {k} with a logit gap of {gap}"
        reads.append(a.usage_metadata["input_token_details"]["cache_read"])
    assert reads[0] == 0 and all(r > 0 for r in reads[1:])
    assert cached.kv_cache_stats["prefill_tokens"] < cached.kv_cache_stats["prompt_tokens"] / 2


def test_a_tcrag_run_on_the_gpu_is_monitored_by_the_gpu_model():
    from tcrag_langgraph import TCRAGConfig, build_graph
    from tcrag_langgraph.methods.tcrag.graph import HALT_REASONS
    from tcrag_langgraph.models.local import LocalChatModel

    chat = LocalChatModel(model_path=MODEL, device="cuda", dtype="bfloat16", max_new_tokens=40, temperature=0.0)
    graph = build_graph(model=chat, tools=[], config=TCRAGConfig(max_steps=2, sigma=1e6))
    out = graph.invoke({"question": "Which vitamin deficiency causes scurvy?"})
    # Any way a monitored run may end, but not an error, and not "conclusion_unmonitored" (the monitor is on).
    # A fixed list went stale: monitor_cannot_judge (shipped calibration: the monitor cannot judge SmolLM2)
    # is how this run ends since that reason was added, on the CPU as on the GPU.
    allowed = set(HALT_REASONS) - {"model_error", "scorer_error", "invalid_input", "conclusion_unmonitored"}
    assert out["halt_reason"] in allowed, (out["halt_reason"], out.get("error"))
    assert out["answer"] and chat.local_model.device.type == "cuda"
    measured = [e["raw"] for e in out.get("state_history", []) if e.get("raw") is not None]
    assert measured and all(math.isfinite(v) for v in measured)  # scored by the same GPU weights
