"""docs/methods.md's worked example runs as written, and adding it as a method takes one module plus
one registry row: the builder, ``build_method``, the generated ``build_<name>_graph`` and
``langgraph.json`` all follow from the row."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tcrag_langgraph.methods import registry
from tcrag_langgraph.testing import recording_model, scripted_tool

DOC = Path(__file__).resolve().parents[1] / "docs" / "methods.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def runnable_blocks() -> list[str]:
    """The example's module and its use (the blocks that import what they use)."""
    return [b for b in python_blocks() if b.startswith("from ")]


def test_the_worked_example_runs_as_written():
    blocks = runnable_blocks()
    assert len(blocks) == 2, "the example module and its use"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # its own asserts check the answer and counts
    graph = namespace["graph"]
    assert list(graph.get_graph().nodes) == ["__start__", "Start", "Look_Again", "Review_Unvalidated", "__end__"]
    bad = graph.invoke({"question": "   "})
    assert bad["halt_reason"] == "invalid_input" and bad["llm_calls"] == 0


@pytest.fixture
def second_look_module(tmp_path, monkeypatch):
    """The example's module saved as ``second_look.py`` and its registry row added, as the doc says."""
    (tmp_path / "second_look.py").write_text(runnable_blocks()[0], encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    row_block = next(b for b in python_blocks() if b.startswith("MethodSpec("))
    # the row exactly as the doc writes it (the module lies on sys.path here, not in the package)
    spec = eval(row_block.strip().rstrip(","), {"MethodSpec": registry.MethodSpec, "_M": ""})
    assert spec.kernel == "second_look:SecondLook"
    monkeypatch.setitem(registry.METHODS, spec.name, spec)
    yield spec
    sys.modules.pop("second_look", None)


def test_one_module_and_one_row_make_a_method(second_look_module):
    tools = [scripted_tool("DOC_RAG", "Metformin is the first-line drug.")]
    graph = registry.build_method("second-look", model=recording_model(["Insulin?", "Metformin."]), tools=tools)
    out = graph.invoke({"question": "What is the first-line drug for type 2 diabetes?"})
    assert (out["answer"], out["tool_calls"], out["first_answer"]) == ("Metformin.", 1, "Insulin?")
    generated = registry.build_second_look_graph(model=recording_model(["a", "b"]), tools=tools)
    assert generated.invoke({"question": "Is it?"})["answer"] == "b"
    graph_entry = registry.langgraph_config()["graphs"]["second-look"]  # what `tcrag studio-config` would write
    assert graph_entry == {"path": "./tcrag_langgraph/faces/studio.py:second_look_graph",
                           "description": second_look_module.studio}
    assert not second_look_module.takes_options and second_look_module.uses_tools
    with pytest.raises(TypeError, match="unexpected keyword"):
        registry.build_second_look_graph(model=recording_model(["a"]), documents=["x"])
