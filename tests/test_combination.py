"""gen_combined (tcrag_langgraph.monitor.combination; issue 37 item 2c): the fit of the generation
values, its honest split-half measurement in tcrag calibrate, and TC-RAG judged by it with the
packaged GGUF's own log-probs."""

from __future__ import annotations

import random

import pytest

from tcrag_langgraph.monitor.calibration import Calibration, CalibrationNotFoundError, save_calibration
from tcrag_langgraph.monitor.combination import FEATURES, Combination, fit_combination, split_halves

Q = "Is aspirin a nonsteroidal anti-inflammatory drug? Answer yes or no."


def _sample(n: int, seed: int = 0) -> tuple[list[dict[str, float]], list[bool]]:
    """Answers whose rightness follows gen_answer_prob (and, more weakly, the entropy); cppl is noise."""
    rng = random.Random(seed)
    values, correct = [], []
    for _ in range(n):
        prob = rng.random()
        entropy = rng.random() * 2
        values.append({"gen_answer_prob": prob, "gen_cppl": 1 + rng.random() * 3, "gen_entropy": entropy})
        correct.append(rng.random() > 0.15 + 0.6 * prob + 0.1 * entropy)
    return values, correct


def test_the_fit_weighs_what_separates_and_reads_as_a_state_value():
    values, correct = _sample(400)
    fitted = fit_combination(values, correct)
    weights = dict(zip(fitted.features, fitted.coef))
    assert weights["gen_answer_prob"] < 0 and abs(weights["gen_answer_prob"]) > abs(weights["gen_cppl"])
    scores = [fitted.value(v) for v in values]
    assert all(0.0 < s < 1.0 for s in scores)
    # lower value = more likely right, as for every state value
    right = sum(s for s, c in zip(scores, correct) if c) / sum(correct)
    wrong = sum(s for s, c in zip(scores, correct) if not c) / (len(correct) - sum(correct))
    assert right < wrong
    assert Combination.from_dict(fitted.to_dict()) == fitted
    assert fitted.value({"gen_cppl": 2.0, "gen_entropy": 1.0}) is None  # no answer among the choices: no value


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="at least 10 answers"):
        fit_combination([{f: 0.5 for f in FEATURES}] * 9, [True, False] * 4 + [True])
    with pytest.raises(ValueError, match="at least 10 answers"):
        fit_combination([{f: 0.5 for f in FEATURES}] * 20, [True] * 20)  # nothing wrong to learn from
    with pytest.raises(ValueError, match="not a stored combination"):
        Combination.from_dict({"features": ["gen_cppl"]})
    with pytest.raises(ValueError, match="scales must be positive"):
        Combination(features=("gen_cppl",), mean=(0.0,), scale=(0.0,), coef=(1.0,), intercept=0.0, n=10)


def test_calibrate_measures_the_fit_only_on_answers_it_was_not_fitted_on():
    from tcrag_langgraph.eval.calibrate_command import _fit_combination_on_halves

    values, correct = _sample(120, seed=3)
    rows = [{"id": f"q{i}", "generation_values": v} for i, v in enumerate(values)]
    fitted, measured = _fit_combination_on_halves(rows, correct, seed=7)
    first, second = split_halves(len(rows), seed=7)
    assert set(measured) == {f"q{i}" for i in second}  # the stored fit judges only the other half
    assert fitted == fit_combination([values[i] for i in first], [correct[i] for i in first])
    assert all(measured[f"q{i}"] == pytest.approx(fitted.value(values[i])) for i in second)


@pytest.fixture(scope="module")
def packaged_chat():
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    return LlamaCppChatModel(max_new_tokens=12, temperature=0.0, seed=0)


def test_tcrag_is_judged_by_the_stored_fit_of_its_replys_values(packaged_chat, tmp_path, monkeypatch):
    from tcrag_langgraph import build_graph
    from tcrag_langgraph.models.local import chat_model_id

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path / "cache"))
    config = {"metric": "gen_combined", "answer_format": ["yes", "no"], "max_steps": 1, "max_new_tokens": 16,
              "temperature": 0.0}
    with pytest.raises(CalibrationNotFoundError, match="gen_combined"):  # refused when built, not mid-run
        build_graph(model=packaged_chat, tools=[], config=config)
    values, correct = _sample(200, seed=1)
    fitted = fit_combination(values, correct)
    save_calibration(Calibration(metric="gen_combined", sigma=0.5, auroc=0.8, model_id=chat_model_id(packaged_chat),
                                 dataset="unit", n=200, details={"combination": fitted.to_dict()}))
    out = build_graph(model=packaged_chat, tools=[], config=config).invoke({"question": Q})
    assert out["halt_reason"] not in ("scorer_error", "model_error"), out.get("error")
    recorded = out.get("answer_generation_values") or {}
    if "gen_answer_prob" in recorded:  # the run ended on a Conclusion among the choices: its value was judged
        value = recorded["gen_combined"]
        assert value == pytest.approx(fitted.value(recorded))
        conclusions = [h for h in out["state_history"] if h["action"] == "Conclusion"]
        assert conclusions[-1]["value"] == pytest.approx(value)
        assert out["answer_validated"] is (value < 0.5)
    else:
        assert out["halt_reason"] in ("max_steps", "format_error")
