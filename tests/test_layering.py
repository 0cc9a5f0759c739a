"""The package's layers import only downwards: tools < models < monitor < core < methods < testing
< agent < eval < faces. Every import statement is checked, lazy ones inside functions included, so an arrow
that runs back up (the core reading the evaluation, a method importing a face) fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tcrag_langgraph"

#: each part and the parts it may import (itself included)
LAYERS = ("tools", "models", "monitor", "core", "methods", "testing", "agent", "eval", "faces")
ALLOWED = {part: set(LAYERS[: i + 1]) for i, part in enumerate(LAYERS)}
ALLOWED["package"] = set(LAYERS)  # tcrag_langgraph/__init__.py re-exports the public names (lazily)
ALLOWED["prompts"] = {"prompts"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, as installed (tools/ and prompts/ install inside the package)."""
    found = {}
    for base, prefix in ((ROOT / PACKAGE, PACKAGE), (ROOT / "tools", f"{PACKAGE}.tools"),
                         (ROOT / "prompts", f"{PACKAGE}.prompts")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def part_of(module: str) -> str:
    rest = module.split(".")[1:]
    if not rest:
        return "package"
    return "testing" if rest[0] == "testing" else rest[0]


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of this package's modules in ``path``."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t == PACKAGE or t.startswith(PACKAGE + ".")]
    return found


MODULES = _modules()


def test_every_module_belongs_to_a_known_layer():
    assert {part_of(m) for m in MODULES} <= set(ALLOWED), {part_of(m) for m in MODULES} - set(ALLOWED)
    # the parts a newcomer looks for are where the layout says
    for module in ("core.kernel", "methods.tcrag.graph", "methods.tcrag.transitions", "methods.tcrag.state", "monitor.scoring", "monitor.calibration",
                   "agent.spec", "agent.flags", "models.local", "models.weights", "models.resolve", "models.llama_cpp", "models.llama_cpp_model", "models.speculative", "monitor.own_model",
                   "monitor.llama_cpp", "faces.cli", "faces.serve", "faces.studio", "methods.registry",
                   "methods.baselines", "methods.crp_rag", "methods.kag_thinker", "methods.diffrag", "tools.layer"):
        assert f"{PACKAGE}.{module}" in MODULES, module


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_only_downwards(module):
    allowed = ALLOWED[part_of(module)]
    wrong = [f"line {line}: {target}" for line, target in imports_of(module, MODULES[module])
             if part_of(target) not in allowed]
    assert not wrong, f"{module} ({part_of(module)}) may import only {sorted(allowed)}: {wrong}"


def test_the_checker_sees_an_arrow_that_runs_back_up(tmp_path):
    """The check itself can fail: a core module importing the evaluation is caught."""
    bad = tmp_path / "graph.py"
    bad.write_text("def f():\n    from ..eval.calibration import calibrate\n    import tcrag_langgraph.faces.cli\n")
    targets = [t for _, t in imports_of(f"{PACKAGE}.core.kernel", bad)]
    assert targets == [f"{PACKAGE}.eval.calibration", f"{PACKAGE}.faces.cli"]
    assert {part_of(t) for t in targets} - ALLOWED["core"] == {"eval", "faces"}


def import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """Groups of modules that import each other in a loop (every import, lazy and type-only ones
    included; a package's ``__init__``, which only hands names on, is left out as a node)."""
    inits = {m for m, p in modules.items() if p.name == "__init__.py"}

    def owner(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    arrows = {m: {owner(t) for _, t in imports_of(m, p)} - {m, ""} - inits
              for m, p in modules.items() if m not in inits}
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(arrows):
        if root in index:
            continue
        work = [(root, iter(sorted(arrows[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def test_no_modules_import_each_other_in_a_loop():
    """Session 12 removed four such loops (models.local <-> models.llama_cpp, monitor.scoring <->
    monitor.llama_cpp, documents.store <-> documents.embeddings, three knowledge-graph files)."""
    assert import_cycles(MODULES) == []


def test_the_cycle_check_sees_a_lazy_and_a_type_only_loop(tmp_path):
    files = {"a.py": "def f():\n    from .b import x\n",
             "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\nx = 1\n",
             "c.py": "from .a import f\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    modules = {f"{PACKAGE}.models.{n[:-3]}": tmp_path / n for n in files}
    assert import_cycles(modules) == [[f"{PACKAGE}.models.a", f"{PACKAGE}.models.b"]]


def method_of(module: str) -> str | None:
    """The method a module belongs to (``methods.<name>`` package or module), None outside methods/
    and for the registry, which knows every method by name."""
    rest = module.split(".")[1:]
    if len(rest) < 2 or rest[0] != "methods" or rest[1] in ("registry", "declaration"):
        return None
    return rest[1]


def foreign_method_imports(modules: dict[str, Path]) -> list[str]:
    """Imports from one method's modules into another method's (``methods.adaptive`` is the shared
    kernel of the retrieve-while-writing methods FL-RAG, FS-RAG, FLARE, DRAGIN and Self-RAG, and counts as theirs)."""
    family = {"fl_rag": "adaptive", "fs_rag": "adaptive", "flare": "adaptive", "dragin": "adaptive", "self_rag": "adaptive"}
    wrong = []
    for module, path in modules.items():
        own = method_of(module)
        if own is None:
            continue
        for line, target in imports_of(module, path):
            other = method_of(target)
            if other is not None and family.get(other, other) != family.get(own, own):
                wrong.append(f"{module} line {line}: {target}")
    return wrong


def test_no_method_imports_another_method():
    """What every method uses lives in core/; a method's own code stays in its package."""
    assert foreign_method_imports(MODULES) == []


def test_the_method_check_sees_a_method_importing_another(tmp_path):
    bad = tmp_path / "nodes.py"
    bad.write_text("from ..tcrag.actions import parse_action\nfrom ...core.state import Frame\n")
    modules = {f"{PACKAGE}.methods.crp_rag.nodes": bad}
    assert foreign_method_imports(modules) == [f"{PACKAGE}.methods.crp_rag.nodes line 1: {PACKAGE}.methods.tcrag.actions"]
