"""The notebooks are executed with nbclient (a real Jupyter kernel on this interpreter) so they cannot rot."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, tmp_path: Path, monkeypatch) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    # A kernelspec pointing at this very interpreter (the venv's python), whatever else is installed.
    spec_dir = tmp_path / "kernels" / "tcrag-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tcrag test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        assert cell.get("outputs", []) == [] and cell.get("execution_count") is None, "store notebooks without outputs"
    client = NotebookClient(nb, timeout=300, kernel_name="tcrag-test",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    return nb


def texts(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_quickstart_notebook_runs_scripted(tmp_path, monkeypatch):
    monkeypatch.setenv("TCRAG_NOTEBOOK_SCRIPTED", "1")
    nb = execute("quickstart.ipynb", tmp_path, monkeypatch)
    out = texts(nb)
    assert "model: scripted (test double)" in out and f"python: {sys.executable}" in out
    assert "answer:    Vitamin C (ascorbic acid) deficiency." in out and "ok" in out
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1  # the state-value plot was drawn


def test_agent_as_node_notebook_runs(tmp_path, monkeypatch):
    nb = execute("agent_as_node.ipynb", tmp_path, monkeypatch)
    out = texts(nb)
    assert "tcrag   push     Tool_Use" in out and "[validated]" in out
    assert "Metformin is first-line" in out


@pytest.mark.slow
def test_quickstart_notebook_runs_with_the_real_packaged_model(tmp_path, monkeypatch):
    monkeypatch.delenv("TCRAG_NOTEBOOK_SCRIPTED", raising=False)
    nb = execute("quickstart.ipynb", tmp_path, monkeypatch)
    out = texts(nb)
    assert "model: SmolLM2-135M-Instruct (packaged)" in out and "halt reason:" in out and "ok" in out
