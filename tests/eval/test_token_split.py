"""Where the tokens go (eval/token_split.py): a run of the stack machine splits its prompt tokens into
the fixed prefix, the stack and the re-prompts, and counts the completions it wasted; tcrag eval and
tcrag summarize print the means per method."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tcrag_langgraph.testing import scripted_graph
from tcrag_langgraph.tools.tokens import count_tokens

SCRIPT = {
    "mode": "sequence",
    "replies": ["Tool_Use: NO_SUCH_TOOL\nTool_Input: x",  # unusable: a re-prompt follows
                "Tool_Use: DOC_RAG\nTool_Input: metformin",
                "Tool_Use: DOC_RAG\nTool_Input: metformin",  # refused as a repeat
                "Conclusion: too early",  # rejected by the monitor (25 > sigma 10)
                "Conclusion: metformin"],
    "scores": {"too early": 25.0, "metformin": 3.0},
    "tools": {"DOC_RAG": "passage about {input}"},
}


def test_a_run_says_where_its_tokens_went():
    out = scripted_graph(SCRIPT).invoke({"question": "First-line drug for type 2 diabetes?"},
                                        config={"configurable": {"sigma": 10}})
    usage = out["token_usage"]
    assert out["answer"] == "metformin" and out["llm_calls"] == 5
    assert usage["prompt_prefix"] + usage["prompt_stack"] + usage["prompt_reprompt"] == usage["prompt"]
    assert usage["prompt_reprompt"] > 0  # the call after the unusable reply carried it and the correction
    assert usage["prompt_cacheable"] == usage["prompt_prefix"] * 4 // 5  # every call's prefix but the first
    assert usage["completion_unusable"] == count_tokens(SCRIPT["replies"][0])
    assert usage["completion_refused_repeat"] == count_tokens("Tool_Use: DOC_RAG\nTool_Input: metformin")
    assert usage["completion_rejected"] == count_tokens("too early")
    assert usage["completion"] >= sum(usage[k] for k in ("completion_unusable", "completion_rejected"))


def test_eval_and_summarize_print_the_split_per_method(tmp_path):
    from tcrag_langgraph.faces.cli import app

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Is drug {i} safe?", "answer": "yes"}) + "\n"
                            for i in range(2)))
    out = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "--dataset", str(data), "--method", "tcrag-cppl,base", "--model",
                                 "tests.eval.helpers:always_yes_model", "--scorer", "tests.eval.helpers:yes_low_scorer",
                                 "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "Where the tokens go" in result.output and (out / "tokens.md").is_file()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["token_split"]["prompt"] > 0 for r in rows)
    assert all(("prompt_prefix" in r["token_split"]) is (r["method"] == "tcrag-cppl") for r in rows)
    summary = runner.invoke(app, ["summarize", str(out)])
    assert summary.exit_code == 0 and "system + demos" in summary.output
    table = summary.output[summary.output.index("| method | prompt"):]
    base_row = next(line for line in table.splitlines() if line.startswith("| Base"))
    assert base_row.count("| - ") == 7  # a method that does not split its prompt shows only the totals
