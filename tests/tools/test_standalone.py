"""The tools stand alone: no tool module imports the agent, LangGraph's graph, torch or the model.

Each module under ``tcrag_langgraph.tools`` (found with pkgutil, so new packages are covered) is
imported in a fresh interpreter, which then reports what got imported along with it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import tcrag_langgraph.tools as tools_pkg

FORBIDDEN = ("tcrag_langgraph.methods.tcrag.graph", "tcrag_langgraph.models.local", "tcrag_langgraph.models.weights", "langgraph.graph", "torch", "transformers", "sentence_transformers")

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
agent = sorted(m for m in sys.modules if m.startswith("tcrag_langgraph.") and not m.startswith("tcrag_langgraph.tools"))
print(json.dumps({"forbidden": [m for m in json.loads(sys.argv[2]) if m in sys.modules], "agent": agent}))
"""


def _tool_modules() -> list[str]:
    names = [tools_pkg.__name__]
    for info in pkgutil.walk_packages(tools_pkg.__path__, prefix=tools_pkg.__name__ + "."):
        names.append(info.name)
    return names


TOOL_MODULES = _tool_modules()


def test_discovery_finds_the_known_modules():
    for name in ("layer", "layer.pipeline", "documents", "knowledge_graph", "web_search", "emr", "chunking", "indexing",
                 "kg_build", "elasticsearch_store", "identity", "tokens", "secrets", "base"):
        assert f"tcrag_langgraph.tools.{name}" in TOOL_MODULES


@pytest.mark.parametrize("module", TOOL_MODULES)
def test_importing_a_tool_module_imports_no_agent_graph_torch_or_model(module):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, json.dumps(FORBIDDEN)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"forbidden": [], "agent": []}, f"importing {module} pulled {report}"


def test_no_tool_source_imports_the_agent():
    root = Path(tools_pkg.__path__[0])
    offending = []
    for path in sorted(root.rglob("*.py")):
        parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
        module = ".".join([tools_pkg.__name__, *parts])
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module or ""]
            else:
                continue
            offending += [
                f"{path.relative_to(root)}:{node.lineno} imports {t}"
                for t in targets
                if (t == "tcrag_langgraph" or t.startswith("tcrag_langgraph.")) and not t.startswith("tcrag_langgraph.tools")
            ]
    assert offending == []
