"""Fixtures shared by the evaluation command tests: the `tcrag` eval commands on their own app, and
a small yes/no JSONL data set."""

from __future__ import annotations

import json

import pytest
import typer


@pytest.fixture
def app():
    """A typer app holding only the commands `tcrag_langgraph.eval.cli` registers."""
    from tcrag_langgraph.eval.cli import register

    app = typer.Typer()

    @app.callback()
    def _group() -> None:
        """test group"""

    register(app)
    return app


@pytest.fixture
def data(tmp_path):
    """Six yes/no questions in a JSONL file."""
    rows = [{"id": f"q{i}", "question": f"Is drug {i} safe?", "answer": "yes" if i % 2 == 0 else "no"} for i in range(6)]
    path = tmp_path / "yn.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
