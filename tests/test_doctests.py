"""The examples in the core modules' docstrings run as written."""

import doctest
import importlib

import pytest

MODULES = ["transitions", "answer_format", "result", "graph", "config", "state", "actions", "run_input", "events"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"tcrag_langgraph.{name}")
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0
