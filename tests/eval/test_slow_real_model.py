"""End to end with the real packaged SmolLM2-135M (slow: a few short generations on CPU)."""

from __future__ import annotations

import math

import pytest

from tcrag_langgraph import TCRAGConfig
from tcrag_langgraph.eval.datasets import QARecord
from tcrag_langgraph.methods.registry import build_methods
from tcrag_langgraph.eval.runner import run_evaluation
from tcrag_langgraph.eval.summary import summarize

pytestmark = pytest.mark.slow


def test_real_model_rows_are_well_formed_and_seeded_runs_repeat():
    from tcrag_langgraph.models.local import LocalChatModel
    from tcrag_langgraph.monitor.scoring import LocalLMScorer

    chat = LocalChatModel(max_new_tokens=8, temperature=0.6)  # a missing packaged model fails the test
    record = QARecord("r1", "Is aspirin a nonsteroidal anti-inflammatory drug?", "yesno", ("yes",))
    cfg = TCRAGConfig(max_steps=2, max_new_tokens=8, temperature=0.6)
    scorer = LocalLMScorer(chat.local_model)
    graphs = build_methods(["base", "tcrag-cppl"], model=chat, scorer=scorer, config=cfg)
    rows = run_evaluation([record], graphs, seed=7, progress=False)
    base, tc = rows
    for row in rows:
        assert row["llm_calls"] >= 1 and row["completion_tokens"] >= 1 and row["prompt_tokens"] > row["completion_tokens"]
        assert row["wall_time_s"] > 0 and isinstance(row["correct"], bool)
    assert tc["halt_reason"] in ("validated", "max_steps", "format_error")
    if tc["state_value"] is not None:  # a real cppl from the local LM: finite and >= 1
        assert math.isfinite(tc["state_value"]) and tc["state_value"] >= 1.0
    # Sampling at temperature 0.6 is reproducible: each (seed, method, question) seeds torch.
    again = run_evaluation([record], {"base": graphs["base"]}, seed=7, progress=False)
    assert again[0]["answer"] == base["answer"]
    assert summarize(rows)[0]["n"] == 1
