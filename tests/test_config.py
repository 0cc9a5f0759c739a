"""TCRAGConfig validation and the override layers (build time < configurable < context)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tcrag_langgraph.core.config import (
    CallerContext,
    TCRAGConfig,
    caller_from_config,
    request_option_fields,
    resolve_config,
)


def test_paper_defaults():
    cfg = TCRAGConfig()
    assert (cfg.metric, cfg.effective_sigma, cfg.max_new_tokens, cfg.temperature) == ("cppl", 10.0, 500, 0.6)
    assert TCRAGConfig(metric="uct").effective_sigma == 20.0


@pytest.mark.parametrize("bad", [{"sigma": 0}, {"sigma": float("nan")}, {"metric": "ppl"}, {"max_steps": 0},
                                 {"temperature": -1}, {"unknown": 1}, {"sigma": True}])
def test_invalid_values_are_refused(bad):
    with pytest.raises(ValidationError):
        TCRAGConfig(**bad)


def test_only_explicit_fields_override():
    base = TCRAGConfig(max_steps=5, sigma=3.0)
    assert resolve_config(base, context=TCRAGConfig(metric="uct")).max_steps == 5
    assert resolve_config(base, context={"max_steps": 9}).max_steps == 9
    assert resolve_config(base, configurable={"sigma": 7}, context={"sigma": 8}).sigma == 8


def test_an_explicit_value_equal_to_the_class_default_still_overrides():
    base = TCRAGConfig(metric="uct", max_steps=5)
    assert resolve_config(base, configurable={"metric": "cppl"}).metric == "cppl"
    assert resolve_config(base, context=TCRAGConfig(metric="cppl")).metric == "cppl"
    assert resolve_config(base, context={"max_steps": 12}).max_steps == 12


def test_caller_never_comes_from_the_client_layers():
    trusted = CallerContext(user_id="dr-a", allowed_patient_ids=("P00001",))
    forged = {"user_id": "anyone", "allowed_patient_ids": ["P00002"]}
    base = TCRAGConfig(caller=trusted)
    assert resolve_config(base, context={"caller": forged}).caller == trusted
    assert resolve_config(base, configurable={"caller": forged}).caller == trusted
    assert resolve_config(TCRAGConfig(), context=TCRAGConfig(caller=forged)).caller is None
    opted_in = resolve_config(base, context={"caller": forged}, trust_client_identity=True)
    assert opted_in.caller.allowed_patient_ids == ("P00002",)


def test_request_options_are_generated_from_the_fields():
    options = request_option_fields()
    assert "caller" not in options and "require_review" not in options
    assert {"sigma", "metric", "max_steps", "temperature"} <= set(options)


def test_caller_from_config():
    caller = CallerContext(user_id="dr-a", allowed_patient_ids=("P1",))
    assert caller_from_config({"configurable": {"tcrag_caller": caller}}) is caller
    assert caller_from_config({"configurable": {"tcrag_caller": {"user_id": "x"}}}).may_see("P1") is False
    assert caller_from_config(None) is None
    assert caller.may_see("P1") and not caller.may_see("P2")
