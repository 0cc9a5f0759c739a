"""End to end with the real packaged SmolLM2-135M-Instruct as generator and state monitor.

A 135M model writes the format poorly and knows little medicine: these tests check that a real
run is bounded, honest about validation and never passes a tool error or invented text off as
evidence, not that the answer is right.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tcrag_langgraph import TCRAGConfig, build_graph
from tcrag_langgraph.core.state import Action
from tcrag_langgraph.methods.tcrag.graph import HALT_REASONS

pytestmark = pytest.mark.slow

Q = "What is the first-line drug for type 2 diabetes?"


def _check_run(out, cfg):
    assert out["halt_reason"] in HALT_REASONS
    # max_steps actions, then (budget spent) one final Conclusion
    assert out["steps"] <= cfg.max_steps + 1
    if out["steps"] == cfg.max_steps + 1:
        assert out["trace"][-2].action == "Conclusion"
    assert out["llm_calls"] <= (cfg.max_steps + 1) * (cfg.max_format_retries + 1)
    if out["answer_validated"]:
        assert out["halt_reason"] == "validated"
        assert out["state_value"] < out["sigma"]
        assert out["stack"][-1].action is Action.CONCLUSION and out["stack"][-1].content == out["answer"]
    else:
        assert out["halt_reason"] != "validated"
    # every scored Thought is clamped to sigma; accepted values are the only ones below it
    for frame in out["stack"][1:]:
        if frame.action is Action.THOUGHT and frame.state_after is not None:
            assert frame.state_after >= out["sigma"]
    # the answer is text the model wrote as a Conclusion, or (format trouble) its top-most own text
    if out["answer"] is not None and out["halt_reason"] in ("validated", "max_steps"):
        assert out["answer"] in [f.content for f in out["stack"][1:]]


def test_real_model_answers_within_the_budget():
    cfg = TCRAGConfig(max_steps=4, max_new_tokens=48, temperature=0.0)
    out = build_graph(config=cfg).invoke({"question": Q})
    _check_run(out, cfg)
    assert out["answer"], out  # validated, or flagged as unvalidated, but an answer
    assert out["messages"][-1].content == out["answer"]
    assert out["stack"][0].action is Action.USER_QUERY and out["stack"][0].content == Q


def test_real_model_with_the_default_tools_via_cli():
    result = CliRunner().invoke(
        __import__("tcrag_langgraph.faces.cli", fromlist=["app"]).app,
        ["ask", Q, "--json", "--max-steps", "3", "--max-new-tokens", "48", "--temperature", "0"],
    )
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert set(data) >= {"answer", "answer_validated", "trace", "halt_reason"}
    assert data["steps"] <= 3 + 1  # three actions and the final Conclusion
    assert data["trace"][0]["op"] == "push" and data["trace"][-1]["op"] == "halt"
    for frame in data["stack"]:
        if frame["action"] == "Tool_Use":  # a real call to one of the embedded tools
            assert frame["tool_call"]["tool"] in {"DOC_RAG", "KG_RAG", "WEB_SEARCH", "EMR_SEARCH"}
            assert frame["tool_call"]["observation"]


def test_langchain_huggingface_chat_model_works_as_the_generator():
    """Any LangChain chat model drives the graph; here langchain-huggingface over the packaged model."""
    from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline
    from transformers import pipeline

    from tcrag_langgraph.models.weights import load_local_model
    from tcrag_langgraph.monitor.scoring import LocalLMScorer

    lm = load_local_model()
    generator = pipeline("text-generation", model=lm.model, tokenizer=lm.tokenizer, max_new_tokens=32,
                         do_sample=False, return_full_text=False)
    chat = ChatHuggingFace(llm=HuggingFacePipeline(pipeline=generator), tokenizer=lm.tokenizer)
    cfg = TCRAGConfig(max_steps=2)
    out = build_graph(model=chat, scorer=LocalLMScorer(lm), config=cfg).invoke({"question": Q})
    _check_run(out, cfg)
    assert out["llm_calls"] >= 1 and out["halt_reason"] != "model_error", out.get("error")


def test_the_main_job_runs_without_torch():
    """`tcrag ask` with the packaged model (llama.cpp) and the default tools never imports torch:
    torch, transformers' models and sentence-transformers cost ~460 MB and seconds (RESULTS.md s. 13)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from tcrag_langgraph.faces.cli import app\n"
            f"sys.argv = ['tcrag', 'ask', {Q!r}, '--max-steps', '2', '--max-new-tokens', '24', '--temperature', '0',"
            " '--threads', '1']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "from tcrag_langgraph.tools.documents import default_embeddings\n"
            "default_embeddings().embed_query('metformin')  # the DOC_RAG query path, whatever the model chose\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Answer" in out.stdout and "TORCH False" in out.stdout, out.stdout[-2000:]


def _pulled_15b():
    """The catalogue's evaluation model where it is on this machine (pulled, or $TCRAG_QWEN_DIR), else None."""
    import os
    from pathlib import Path

    from tcrag_langgraph.models.weights import cache_dir

    for folder in (cache_dir() / "models", Path(os.environ.get("TCRAG_QWEN_DIR", "/work/models"))):
        path = folder / "qwen2.5-coder-1.5b-instruct.gguf"
        if path.is_file():
            return path
    return None


@pytest.mark.skipif(_pulled_15b() is None, reason="needs Qwen2.5-Coder-1.5B (tcrag pull qwen2.5-coder-1.5b)")
def test_the_main_job_with_the_pulled_evaluation_model_answers_and_does_not_overclaim():
    """make ask's model, greedy, with the default tools: a right answer to a question it knows, and
    not 'validated', because its own monitor does not separate right from wrong answers (the shipped
    calibration, benchmarks/RESULTS.md section 16)."""
    from tcrag_langgraph.faces.cli import app

    result = CliRunner().invoke(app, ["ask", "Which bacterium causes tuberculosis?", "--model", str(_pulled_15b()),
                                      "--temperature", "0", "--seed", "0", "--json"])
    assert result.exit_code in (0, 1), result.output
    out = json.loads(result.stdout[result.stdout.index("{"):])
    assert "mycobacterium" in (out["answer"] or "").lower(), out["answer"]
    assert out["halt_reason"] == "monitor_cannot_judge" and not out["answer_validated"]
    assert "AUROC" in out["error"]
