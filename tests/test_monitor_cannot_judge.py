"""A first answer that does not lie: when the calibration shipped for a model (measured with
``tcrag calibrate``) finds no sigma that separates its right from wrong answers, a run that its
own-weights monitor would validate ends ``monitor_cannot_judge``, not validated; the user's own
calibration of that model wins. Runs the packaged SmolLM2 for real (a few short runs)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tcrag_langgraph import build_graph
from tcrag_langgraph.faces.cli import app
from tcrag_langgraph.models.local import LocalChatModel
from tcrag_langgraph.monitor import calibration
from tcrag_langgraph.monitor.calibration import Calibration, save_calibration, shipped_calibration

Q = "Which vitamin deficiency causes scurvy?"
# sigma so large that any Conclusion is accepted: the run reaches the "validated" halt for sure
ACCEPT_ALL = {"sigma": 1e8, "max_steps": 1, "max_new_tokens": 24, "temperature": 0.0}


def _unsupported(model_id: str = "SmolLM2-135M-Instruct") -> dict:
    return Calibration(metric="cppl", sigma=3.0, auroc=0.45, model_id=model_id, dataset="pubmedqa:trainval", n=40,
                       details={"supported": False}).to_dict()


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    path = tmp_path / "shipped.json"
    path.write_text(json.dumps([_unsupported()]))
    monkeypatch.setattr(calibration, "SHIPPED_FILE", path)
    return path


def test_the_packaged_model_ships_a_calibration_measured_on_pubmedqa_trainval():
    found = shipped_calibration("SmolLM2-135M-Instruct", "cppl")
    assert found is not None and found.dataset == "pubmedqa:trainval" and found.n >= 30
    assert "supported" in found.details and found.details["method"] == "wo-monitor"
    note = calibration.monitor_cannot_judge("SmolLM2-135M-Instruct", "cppl")
    assert (note is not None) == (not found.details["supported"])


def test_the_catalogues_evaluation_model_ships_its_measured_calibration(tmp_path, monkeypatch):
    """Qwen2.5-Coder-1.5B (tcrag pull qwen2.5-coder-1.5b): its cppl and uct were measured on 40
    PubMedQA-L trainval answers and separate nothing, so 'validated' from either means nothing: the
    shipped file says so and a run of that model says the monitor cannot judge it."""
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path))  # no calibration of the user's own wins over it
    for metric in ("cppl", "uct"):
        found = shipped_calibration("qwen2.5-coder-1.5b-instruct", metric)
        assert found is not None and found.n == 40 and found.details["supported"] is False
        assert len(found.details["pairs"]["values"]) == 40 and "tcrag calibrate" in found.details["command"]
        assert "AUROC" in calibration.monitor_cannot_judge("qwen2.5-coder-1.5b-instruct", metric)


@pytest.mark.slow
def test_a_run_the_monitor_would_validate_ends_cannot_judge(shipped, lm, tmp_path, monkeypatch):
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "user-cache"))
    out = build_graph(model=LocalChatModel(max_new_tokens=24, temperature=0.0), config=ACCEPT_ALL).invoke({"question": Q})
    assert out["answer"] and out["answer_validated"] is False, out["halt_reason"]
    assert out["halt_reason"] == "monitor_cannot_judge" and "cannot judge this model" in out["error"]
    assert out["messages"][-1].response_metadata["answer_validated"] is False
    # the monitor off: the shipped verdict about the model's own weights as its monitor does not apply
    off = build_graph(model=LocalChatModel(max_new_tokens=24, temperature=0.0),
                      config={**ACCEPT_ALL, "enable_state_monitor": False}).invoke({"question": Q})
    assert off["halt_reason"] in ("conclusion_unmonitored", "max_steps") and off["answer"]
    # the user's own calibration of the model (tcrag calibrate) wins over the shipped one
    save_calibration(Calibration(metric="cppl", sigma=5.0, auroc=0.8, model_id="SmolLM2-135M-Instruct",
                                 dataset="mine", n=50, details={"supported": True}))
    mine = build_graph(model=LocalChatModel(max_new_tokens=24, temperature=0.0), config=ACCEPT_ALL).invoke({"question": Q})
    assert mine["halt_reason"] == "validated" and mine["answer_validated"] is True


@pytest.mark.slow
def test_the_live_view_says_the_monitor_cannot_judge(shipped, lm, tmp_path):
    result = CliRunner().invoke(app, ["ask", Q, "--no-tools", "--sigma", "1e8", "--max-steps", "1",
                                      "--max-new-tokens", "24", "--temperature", "0"],
                                env={"TCRAG_CACHE_DIR": str(tmp_path / "user-cache"), "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Status: not validated: the monitor cannot judge this model" in result.stdout


class ConcludingModel(LocalChatModel):
    """The packaged model's weights, which its own monitor scores with, writing a scripted reply (the
    135M itself copies the worked example's Thought until the budget)."""

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        from langchain_core.messages import AIMessage
        from langchain_core.outputs import ChatGeneration, ChatResult

        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="Conclusion: A lack of vitamin C."))])

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        from langchain_core.messages import AIMessageChunk
        from langchain_core.outputs import ChatGenerationChunk

        yield ChatGenerationChunk(message=AIMessageChunk(content="Conclusion: A lack of vitamin C."))


@pytest.mark.slow
def test_a_monitor_that_cannot_judge_rejects_nothing_unless_the_loop_is_asked_for(shipped, lm, tmp_path, monkeypatch):
    """A rejection by a monitor that cannot judge the model is noise: the first Conclusion ends the run,
    unvalidated, with the value the real monitor gave it; loop_when_unjudged keeps Algorithm 1's loop
    (here every Conclusion is rejected, and the same one written again halts repeated_conclusion)."""
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "user-cache"))
    reject_all = {"sigma": 1e-6, "max_steps": 4, "max_new_tokens": 24, "temperature": 0.0}
    out = build_graph(model=ConcludingModel(), config=reject_all).invoke({"question": Q})
    conclusions = [e for e in out["trace"] if e.action == "Conclusion"]
    assert out["halt_reason"] == "monitor_cannot_judge" and "cannot judge this model" in out["error"], out["halt_reason"]
    assert len(conclusions) == 1 and conclusions[0].op == "push" and conclusions[0].state_value > 1
    assert out["answer"] == "A lack of vitamin C." and out["answer_validated"] is False and out["llm_calls"] == 1
    looped = build_graph(model=ConcludingModel(), config={**reject_all, "loop_when_unjudged": True}).invoke({"question": Q})
    assert looped["halt_reason"] == "repeated_conclusion" and looped["answer_validated"] is False
    assert [e.op for e in looped["trace"] if e.action == "Conclusion"][0] == "reject"


@pytest.mark.slow
def test_an_evaluations_shared_scorer_over_the_same_weights_judges_as_the_face_does(shipped, lm, tmp_path, monkeypatch):
    """tcrag eval shares one scorer over the generator's own weights among its methods
    (AgentSpec.assemble(share_monitor=True)): what the shipped calibration says of that model holds
    for it too, so an evaluated TC-RAG run ends as `tcrag ask` ends it. A scorer over other weights
    (another model object) is the user's own monitor: no verdict of the shipped file applies."""
    from tcrag_langgraph.monitor.own_model import scorer_for_model

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "user-cache"))
    reject_all = {"sigma": 1e-6, "max_steps": 4, "max_new_tokens": 24, "temperature": 0.0}
    model = ConcludingModel()
    shared = build_graph(model=model, scorer=scorer_for_model(model), config=reject_all).invoke({"question": Q})
    assert shared["halt_reason"] == "monitor_cannot_judge" and shared["llm_calls"] == 1, shared["halt_reason"]
    other = build_graph(model=model, scorer=scorer_for_model(LocalChatModel()), config=reject_all).invoke({"question": Q})
    assert other["halt_reason"] == "repeated_conclusion", other["halt_reason"]
