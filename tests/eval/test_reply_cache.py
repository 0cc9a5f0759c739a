"""tcrag_langgraph.eval.reply_cache: one generation per prompt in a greedy evaluation, replayed with
the seconds it took; the eval's rows with and without it; the CLI's refusal of a sampled run."""

from __future__ import annotations

import json
import time

from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from tcrag_langgraph.eval.datasets import QARecord
from tcrag_langgraph.eval.efficiency import UsageMeter
from tcrag_langgraph.eval.reply_cache import HIT_KEY, SECONDS_KEY, ReplyCache
from tcrag_langgraph.eval.runner import read_results, run_evaluation
from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply

from .helpers import DrugScorer, drug_model

H = "tests.eval.helpers"
PROMPT = [HumanMessage(content="Begin!\nUser_Query: which drug?\n\nWrite your next action.")]


def slow_model(cache: ReplyCache) -> ScriptedChatModel:
    return ScriptedChatModel(replies=[ScriptedReply(reply="Conclusion: metformin", sleep_s=0.05)], cache=cache)


def test_a_prompt_is_generated_once_and_replayed_with_its_seconds(tmp_path):
    path = tmp_path / "run" / "replies.sqlite"
    cache = ReplyCache(path)
    assert not path.exists()  # opened on first use only
    model = slow_model(cache)
    meter = UsageMeter()
    first = model.invoke(PROMPT, config={"callbacks": [meter]})
    assert path.exists() and len(cache) == 1 and model.call_count == 1
    assert HIT_KEY not in first.response_metadata and meter.cached_calls == 0
    start = time.perf_counter()
    second = model.invoke(PROMPT, config={"callbacks": [meter]})
    assert time.perf_counter() - start < 0.05  # not generated again
    assert second.content == first.content and model.call_count == 1
    assert second.response_metadata[HIT_KEY] is True and second.response_metadata[SECONDS_KEY] >= 0.05
    assert meter.llm_calls == 2 and meter.cached_calls == 1 and meter.replayed_s >= 0.05
    # Other stop sequences or per-call options are another key: generated, not replayed.
    model.invoke(PROMPT, stop=["\nObservation:"])
    assert model.call_count == 2 and len(cache) == 2
    # The file outlives the process that wrote it: a resumed run replays from it.
    again = slow_model(ReplyCache(path))
    assert again.invoke(PROMPT).response_metadata[HIT_KEY] is True and again.call_count == 0


def test_an_evaluation_with_the_cache_gives_the_same_rows_and_counts_the_replayed_calls(tmp_path):
    """TC-RAG and its ablation without the monitor send the same prompts up to the judged Conclusion:
    with the cache the second method's calls are replayed, the answers, halts, call and token counts
    are those of the uncached run, and the time includes the replayed seconds."""
    records = [QARecord(f"q{i}", f"Is drug {i} first-line?", "yesno", ("yes" if i < 3 else "no",)) for i in range(4)]
    keys = ("method", "id", "answer", "halt_reason", "validated", "state_value", "llm_calls", "prompt_tokens",
            "completion_tokens")
    from tcrag_langgraph.methods.registry import build_methods

    rows = {}
    models = {}
    for cached in (False, True):
        model = drug_model()
        if cached:
            model.cache = ReplyCache(tmp_path / "cached" / "replies.sqlite")
        graphs = build_methods(["wo-monitor", "tcrag-cppl"], model=model, scorer=DrugScorer(), sigmas={"cppl": 5.0})
        rows[cached] = run_evaluation(records, graphs, out_dir=tmp_path / ("cached" if cached else "plain"),
                                      progress=False)
        models[cached] = model
    assert [tuple(r[k] for k in keys) for r in rows[True]] == [tuple(r[k] for k in keys) for r in rows[False]]
    assert all(r["cached_calls"] == 0 for r in rows[False])
    replayed = [r for r in rows[True] if r["method"] == "tcrag-cppl"]
    assert all(r["cached_calls"] >= 1 for r in replayed)
    assert all(r["wall_time_s"] >= r["replayed_s"] >= 0 for r in rows[True])
    assert len(models[True].seen) < len(models[False].seen)  # fewer generations
    stored = read_results(tmp_path / "cached" / "results.jsonl")
    assert [r["cached_calls"] for r in stored] == [r["cached_calls"] for r in rows[True]]


def test_the_cli_refuses_the_cache_for_a_sampled_run_and_records_it(app, data, tmp_path):
    base = ["eval", "--dataset", str(data), "--method", "wo-monitor,tcrag-cppl", "--model", f"{H}:always_yes_model",
            "--scorer", f"{H}:yes_low_scorer", "--no-progress", "--limit", "2", "--reply-cache"]
    refused = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a"), "--temperature", "0.6"])
    assert refused.exit_code != 0 and "--temperature 0" in refused.output
    assert not (tmp_path / "a" / "replies.sqlite").exists()
    ok = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "b"), "--temperature", "0"])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "b" / "run.json").read_text())["reply_cache"] is True
    assert (tmp_path / "b" / "replies.sqlite").exists() and "Avg. Replayed Calls" in ok.output
    # A folder keeps its choice: the same run without the cache is refused.
    other = CliRunner().invoke(app, [*base[:-1], "--out", str(tmp_path / "b"), "--temperature", "0"])
    assert other.exit_code != 0 and "other settings" in other.output


def test_an_async_call_is_replayed_with_its_own_seconds(tmp_path):
    import asyncio

    cache = ReplyCache(tmp_path / "replies.sqlite")
    model = slow_model(cache)

    async def twice():
        first = await model.ainvoke(PROMPT)
        return first, await model.ainvoke(PROMPT)

    first, second = asyncio.run(twice())
    assert second.content == first.content and model.call_count == 1
    assert second.response_metadata[HIT_KEY] is True and second.response_metadata[SECONDS_KEY] >= 0.05
