"""tools/ and prompts/ live at the repository top level but install inside the package (wheel too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_editable_install_maps_tools_and_prompts():
    import tcrag_langgraph.tools as tools

    from tcrag_langgraph.methods.tcrag.prompting import load_prompt_file

    assert Path(tools.__file__).resolve().parent == ROOT / "tools"
    assert "$action_lines" in load_prompt_file("tcrag_en.txt")


@pytest.mark.slow
def test_wheel_carries_tools_prompts_and_data(tmp_path):
    # built from a copy without build/: setuptools reuses a source tree's build/lib, so a module deleted
    # since the last build there would still be packaged (a wheel that passes only on a clean clone)
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                                "runs", ".pytest_cache"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-v", "-w", str(tmp_path)], check=True, capture_output=True, text=True)
    # nothing in the project's own configuration makes setuptools warn (license table, data folders)
    assert "BuildBackendWarning" not in build.stdout + build.stderr, build.stdout[-3000:] + build.stderr[-3000:]
    assert "SetuptoolsDeprecationWarning" not in build.stdout + build.stderr
    (wheel,) = tmp_path.glob("tcrag_langgraph-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "tcrag_langgraph/monitor/shipped_calibrations.json" in names
    for expected in ("tcrag_langgraph/tools/layer/__init__.py", "tcrag_langgraph/tools/data/kg_medical.nt.gz",
                     "tcrag_langgraph/tools/data/docs_pubmedqa.jsonl.gz", "tcrag_langgraph/prompts/tcrag_en.txt",
                     "tcrag_langgraph/prompts/examples_zh.json", "tcrag_langgraph/methods/tcrag/graph.py",
                     "tcrag_langgraph/core/kernel.py"):
        assert expected in names
    # every module of the source tree is in the wheel (a subpackage missing from pyproject's list is not)
    sources = [f"tcrag_langgraph/{p.relative_to(ROOT / 'tcrag_langgraph').as_posix()}"
               for p in (ROOT / "tcrag_langgraph").rglob("*.py")]
    sources += [f"tcrag_langgraph/tools/{p.relative_to(ROOT / 'tools').as_posix()}" for p in (ROOT / "tools").rglob("*.py")]
    missing = sorted(name for name in sources if name not in names and "__pycache__" not in name)
    assert not missing, f"modules not packaged (add their package to pyproject's packages): {missing}"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    code = ("import tcrag_langgraph.tools.base as b, tcrag_langgraph.methods.tcrag.prompting as p; "
            "from tcrag_langgraph.eval.provenance import code_version; "
            "print(b.__file__); print(code_version()); print(len(p.load_prompt_file('actions_en.json')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert str(target) in out.stdout and int(out.stdout.split()[-1]) > 100
    # a run's rows say which code made them: the same files give the same version in either install
    from tcrag_langgraph.eval.provenance import code_version

    assert out.stdout.split()[-2] == code_version()
