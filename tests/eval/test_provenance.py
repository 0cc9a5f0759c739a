"""eval/provenance.py: each row says which code made it; a table mixing versions says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tcrag_langgraph.eval.provenance import code_version, mixed_code_versions

H = "tests.eval.helpers"
ROOT = Path(__file__).resolve().parents[2]


def _version_of(site: Path) -> str:
    code = "from tcrag_langgraph.eval.provenance import code_version; print(code_version())"
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=site, env=env)
    return out.stdout.split()[-1]


def test_the_version_follows_the_prompt_and_code_files(tmp_path):
    """A copy laid out as a regular install has the editable install's version; editing one prompt
    file or one module changes it."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "tcrag_langgraph", site / "tcrag_langgraph", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "prompts", site / "tcrag_langgraph" / "prompts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tools", site / "tcrag_langgraph" / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    assert _version_of(site) == code_version()
    template = site / "tcrag_langgraph" / "prompts" / "tcrag_en.txt"
    template.write_text(template.read_text() + "Be brief.\n")
    edited = _version_of(site)
    assert edited != code_version() and len(edited) == 12
    module = site / "tcrag_langgraph" / "methods" / "flare.py"
    module.write_text(module.read_text() + "\n# an edit\n")
    assert _version_of(site) not in (edited, code_version())


def test_mixed_versions_are_counted_per_method():
    rows = [{"method": "react", "code_version": "a"}, {"method": "react", "code_version": "a"},
            {"method": "react", "code_version": "b"}, {"method": "base", "code_version": "a"},
            {"method": "base"}, {"method": "cot"}]
    assert mixed_code_versions(rows) == {"react": {"a": 2, "b": 1}}
    assert mixed_code_versions(rows[3:]) == {}


def test_rows_carry_the_version_and_a_resumed_run_across_an_edit_is_flagged(app, data, tmp_path):
    out = tmp_path / "run"
    args = ["eval", "--dataset", str(data), "--method", "base,cot", "--model", f"{H}:always_yes_model",
            "--out", str(out), "--no-progress", "--limit", "4", "--seed", "1"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "Code Versions" not in first.output and "different versions" not in first.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["code_version"] for r in rows} == {code_version()}
    # as if the run had stopped after two questions and resumed after an edit
    rows[5]["code_version"] = rows[7]["code_version"] = "0123456789ab"
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = CliRunner().invoke(app, ["summarize", str(out)])
    assert table.exit_code == 0, table.output
    assert "Code Versions" in table.output
    assert "warning: rows made by different versions" in table.output
    assert f"cot: 2 rows by {code_version()}, 2 rows by 0123456789ab" in table.output
    assert "base:" not in table.output.split("warning:")[1]
