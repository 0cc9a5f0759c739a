"""The examples in the core modules' docstrings run as written."""

import doctest
import importlib

import pytest

MODULES = ["methods.tcrag.transitions", "core.answer_format", "core.result", "methods.tcrag.graph", "core.config",
           "core.state", "methods.tcrag.state", "methods.tcrag.actions", "core.names", "core.run_input", "core.events",
           "core.identity", "core.kernel", "methods.crp_rag", "methods.kag_thinker", "methods.diffrag", "monitor.calibration", "monitor.state_values", "monitor.scoring", "methods.registry", "methods.baselines",
           "methods.adaptive", "methods.langchain_agent", "core.usage", "models.chat_turns", "models.local", "methods.fl_rag", "methods.fs_rag", "methods.flare", "methods.dragin", "methods.self_rag",
           "testing",
           "eval.calibration", "eval.significance", "eval.runner", "eval.summary", "monitor.from_spec", "models.credentials", "models.catalogue", "agent.spec", "monitor.consistency", "monitor.own_model", "monitor.risk",
           "faces.agent_tool", "models.run_control", "faces.serve_guard", "faces.serve_gate", "monitor.combination",
           "monitor.generation", "eval.risk_coverage", "eval.token_split", "eval.compare"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"tcrag_langgraph.{name}")
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0
