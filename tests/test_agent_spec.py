"""One way to build an agent from options (tcrag_langgraph.agent): the spec every face and
``tcrag eval`` build from, its refusals, ``sigma="auto"`` resolved once per run, and the run
options every command makes from TCRAGConfig's fields."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tcrag_langgraph.agent.flags import EVAL_FLAGS, FACE_FLAGS
from tcrag_langgraph.agent.spec import FACE_DEFAULTS, AgentSpec, UserError
from tcrag_langgraph.core.config import TCRAGConfig
from tcrag_langgraph.faces.cli import app

H = "tests.eval.helpers"
runner = CliRunner()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private model and calibration cache (nothing of the machine's leaks in)."""
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _store_calibration(model_id: str, metric: str, sigma: float, auroc: float = 0.8) -> None:
    from tcrag_langgraph.monitor.calibration import Calibration, save_calibration

    save_calibration(Calibration(metric=metric, sigma=sigma, auroc=auroc, model_id=model_id, dataset="unit", n=40,
                                 details={"supported": True}))


def test_sigma_auto_is_resolved_once_per_run_and_the_graph_reads_the_number(cache, monkeypatch):
    import tcrag_langgraph.monitor.calibration as calibration

    _store_calibration("scripted-named", "uct", 3.25)
    calls = []
    real = calibration.resolve_monitor
    monkeypatch.setattr(calibration, "resolve_monitor", lambda *a, **k: calls.append(a) or real(*a, **k))
    spec = AgentSpec(model=f"{H}:named_yes_model", scorer=f"{H}:yes_low_scorer", tools="none",
                     config=TCRAGConfig(sigma="auto", max_steps=2))
    parts = spec.assemble()
    assert (parts.config.metric, parts.config.sigma) == ("uct", 3.25)  # the calibration chose both
    out = spec.build(parts).invoke({"question": "Is aspirin an NSAID?"})
    assert len(calls) == 1  # the build and the run read the number, not the file again
    assert (out["metric"], out["sigma"]) == ("uct", 3.25)


def test_sigma_auto_without_a_calibration_is_refused_before_anything_runs(cache):
    spec = AgentSpec(model=f"{H}:named_yes_model", scorer=f"{H}:yes_low_scorer", tools="none",
                     config=TCRAGConfig(sigma="auto"))
    with pytest.raises(UserError, match="tcrag calibrate") as refused:
        spec.assemble()
    assert refused.value.kind == "Not calibrated" and refused.value.flag == "--sigma"


def test_a_served_model_without_log_probs_is_refused_only_where_a_log_prob_value_is_asked_for(monkeypatch):
    monkeypatch.setenv("TCRAG_TEST_SPEC_KEY", "sk-test-not-sent")
    served = {"model": "openai:served", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "TCRAG_TEST_SPEC_KEY",
              "tools": "none"}
    for method, config in (("tcrag", TCRAGConfig(metric="cppl")), ("tcrag-cppl", TCRAGConfig()),
                           ("crp-rag", TCRAGConfig())):
        with pytest.raises(UserError, match="--scorer http://HOST:PORT/v1") as refused:
            AgentSpec(method=method, **served, config=config).build()
        assert refused.value.kind == "No state monitor" and "--metric consistency" in refused.value.message
    for method in ("react", "base", "wo-monitor"):  # nothing to score: the same model is fine
        parts = AgentSpec(method=method, **served).assemble()
        assert parts.scorer is None and type(parts.model).__name__ == "ChatOpenAI"
        AgentSpec(method=method, **served).build(parts)
    # TC-RAG with no state value set: monitored by the model's own resampled answers (no log-probs needed)
    graph = AgentSpec(method="tcrag", **served).build()
    assert graph.get_graph() is not None
    eval_parts = AgentSpec(method="tcrag", **served).assemble(["tcrag", "react"], share_monitor=True)
    assert eval_parts.scorer is None  # no shared log-prob monitor to make: each method decides


def test_the_spec_names_keys_and_never_holds_one(monkeypatch):
    monkeypatch.setenv("TCRAG_TEST_SPEC_KEY", "sk-live-secret-0123")
    spec = AgentSpec(model="openai:served", base_url="http://127.0.0.1:9/v1", api_key_env="TCRAG_TEST_SPEC_KEY",
                     scorer="http://127.0.0.1:9/v1", tools="none")
    assert "sk-live-secret-0123" not in spec.model_dump_json()
    parts = spec.assemble()
    assert parts.model.openai_api_key.get_secret_value() == "sk-live-secret-0123"  # read where it is used
    with pytest.raises(UserError, match="never the key itself"):
        AgentSpec(model="openai:served", api_key_env="sk-live-secret-0123").generator()


@pytest.mark.parametrize("tools,names", [
    ("none", []),
    ("docs", ["DOC_RAG"]),
    ("docs,web", ["DOC_RAG", "WEB_SEARCH"]),
    (f"{H}:doc_tools", ["DOC_RAG"]),
])
def test_tool_presets_and_factories(tools, names):
    assert [t.name for t in AgentSpec(tools=tools).tool_list()] == names


def test_the_default_tools_are_the_packaged_medical_tools():
    from tcrag_langgraph.tools import default_tools

    assert [t.name for t in AgentSpec().tool_list()] == [t.name for t in default_tools()]
    # the document search first (the worked examples' tool), the records last (tools/__init__.py says why)
    assert [t.name for t in default_tools()] == ["DOC_RAG", "WEB_SEARCH", "KG_RAG", "EMR_SEARCH"]


@pytest.mark.parametrize("tools", ["docs", "default"])
def test_held_out_documents_are_missing_from_the_document_tool_of_every_preset(tools):
    """``tcrag eval --exclude-eval-docs`` holds the evaluated questions' abstracts out of ``DOC_RAG``,
    in the default tool set as in ``docs`` (it once applied to ``docs`` only: a run with the default
    tools could retrieve the gold abstract it was told to hold out)."""
    query = "mitochondria lace plant programmed cell death"  # PubMed 21645374's own words
    found = {t.name: t for t in AgentSpec(tools=tools).tool_list()}["DOC_RAG"]
    assert "source: 21645374" in found.invoke(query)
    held_out = {t.name: t for t in AgentSpec(tools=tools, exclude_doc_ids=("21645374",)).tool_list()}["DOC_RAG"]
    assert "source: 21645374" not in held_out.invoke(query)


@pytest.mark.parametrize("values,flag,text", [
    ({"tools": "no-such-preset"}, "--tools", "not a preset"),
    ({"tools": "none", "es_url": "http://127.0.0.1:9200"}, "--es-url", "default or docs"),
    ({"tools": "docs", "es_url": "127.0.0.1:9200"}, "--es-url", "http(s) address"),
])
def test_tool_refusals_name_their_flag(values, flag, text):
    with pytest.raises(UserError, match=text.replace("(", r"\(").replace(")", r"\)")) as refused:
        AgentSpec(**values).tool_list()
    assert refused.value.flag == flag


def test_a_script_replaces_the_model_and_refuses_model_options_beside_it(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": ["Conclusion: yes"], "default_score": 1,
                                  "config": {"max_steps": 3, "temperature": 0.0}}), encoding="utf-8")
    with pytest.raises(UserError, match="--model, --scorer"):
        AgentSpec.create(script=str(script), model="local", scorer="local")
    # the script's own settings sit over the faces' budgets, and flags over both
    base = AgentSpec.base_config(str(script))
    assert (base.max_steps, base.max_new_tokens, base.temperature) == (3, FACE_DEFAULTS["max_new_tokens"], 0.0)
    cfg = FACE_FLAGS.config({"max_steps": 2}, base=base)
    parts = AgentSpec(script=str(script), tools="none", config=cfg).assemble()
    assert parts.config.max_steps == 2 and type(parts.model).__name__ == "ScriptedChatModel"


def test_ask_takes_a_script_s_settings_under_its_flags(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": ["Thought: still thinking"] * 20, "mode": "sequence", "default_score": 50,
                                  "config": {"max_steps": 3}}), encoding="utf-8")
    runs = {}
    for extra in ([], ["--max-steps", "2"]):
        result = runner.invoke(app, ["ask", "Is aspirin an NSAID?", "--scripted", str(script), "--json", *extra])
        runs[tuple(extra)] = json.loads(result.stdout)
    assert runs[()]["steps"] == 3 + 1 and runs[("--max-steps", "2")]["steps"] == 2 + 1  # then the final Conclusion


def test_every_config_field_is_an_eval_flag_or_set_otherwise_with_a_reason():
    flagged = {flag.field for flag in EVAL_FLAGS.flags()}
    assert flagged | set(EVAL_FLAGS.not_flags) == set(TCRAGConfig.model_fields)
    assert not flagged & set(EVAL_FLAGS.not_flags) and all(EVAL_FLAGS.not_flags.values())
    assert {"max_steps", "max_new_tokens", "temperature", "max_format_retries"} <= flagged
    assert EVAL_FLAGS.config({}) == TCRAGConfig()  # the paper's defaults, as TCRAGConfig declares them
    assert FACE_FLAGS.config({}) == TCRAGConfig(**FACE_DEFAULTS)
    result = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "300"})
    for flag in EVAL_FLAGS.flags():
        assert flag.parameter.default.param_decls[0].split("/")[0] in result.output


def test_an_eval_run_option_reaches_the_runs_and_a_bad_one_is_one_line(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text('{"id": "q0", "question": "Is aspirin an NSAID?", "answer": "yes"}\n', encoding="utf-8")
    out = tmp_path / "run"
    common = ["eval", "--dataset", str(data), "--method", "base", "--model", f"{H}:always_yes_model", "--no-progress"]
    result = runner.invoke(app, [*common, "--max-format-retries", "0", "--few-shot", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "run.json").read_text(encoding="utf-8"))["config"]
    assert saved["max_format_retries"] == 0 and saved["max_steps"] == TCRAGConfig().max_steps
    bad = runner.invoke(app, [*common, "--max-new-tokens", "0", "--out", str(tmp_path / "bad")],
                        env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "--max-new-tokens" in bad.stderr and "Traceback" not in bad.output
    assert not (tmp_path / "bad").exists()


def test_scorer_native_scores_with_the_weights_llama_cpp_generates_with():
    """One copy of the weights (issue 37 item 4): the monitor reads the quantized GGUF the generator
    runs, not its float16 re-encoding; only a llama.cpp generator has such weights."""
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
    from tcrag_langgraph.monitor.llama_cpp import LlamaCppScorer

    from tcrag_langgraph.models.weights import default_model_source
    from tcrag_langgraph.monitor.own_model import scorer_for_model

    spec = AgentSpec(scorer="native", tools="none")
    chat = spec.generator()
    assert isinstance(chat, LlamaCppChatModel)
    scorer = spec.monitor(chat)
    assert isinstance(scorer, LlamaCppScorer) and scorer.precision == "native"
    assert AgentSpec(scorer="f16").monitor(chat).precision == "f16"  # the float16 reference, on request
    # by default the monitor reads the weights the generator runs: the packaged model generates on its
    # float16 re-encoding, any other GGUF on the file as it is
    assert chat.generates_float16 and scorer_for_model(chat).precision == "f16"
    folder, name = default_model_source()
    as_file = AgentSpec(model=str(folder / name)).generator()
    assert not as_file.generates_float16 and scorer_for_model(as_file).precision == "native"
    with pytest.raises(UserError, match="llama.cpp backend") as refused:
        AgentSpec(scorer="native", backend="transformers").assemble()
    assert refused.value.flag == "--scorer"
