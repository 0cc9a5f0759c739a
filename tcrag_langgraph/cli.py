"""The ``tcrag`` command: ``ask`` here; ``index``, ``build-kg``, ``eval``, ``serve`` ... are registered
by the modules that own them (each exposes ``register(app)``).
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console

from .config import TCRAGConfig

app = typer.Typer(
    name="tcrag",
    help="TC-RAG: a retrieval-augmented agent with stack memory and a state monitor, on LangGraph.",
    no_args_is_help=True,
    add_completion=False,
)

# Modules that add their own sub-commands; a missing optional module is skipped.
_COMMAND_MODULES = (
    "tcrag_langgraph.tools.indexing",
    "tcrag_langgraph.tools.kg_build",
    "tcrag_langgraph.eval.cli",
    "tcrag_langgraph.serve",
)

@app.callback()
def _group() -> None:
    """TC-RAG command line (a group, so `tcrag ask ...` works even with one command)."""


_STYLE = {"push": "green", "pop": "yellow", "pop+push": "cyan", "reject": "magenta", "halt": "bold",
          "format_error": "red", "noop": "dim"}


def _default_tools(enabled: bool) -> list[Any]:
    if not enabled:
        return []
    from . import tools as tools_pkg

    factory = getattr(tools_pkg, "default_tools", None)
    return list(factory()) if factory is not None else []


def _render_event(console: Console, event: dict[str, Any]) -> None:
    op = event.get("op", "")
    value = event.get("state_value")
    value_text = "" if value is None else f" s={value:.4g}" if value < 1e6 else " s=large"
    content = " ".join(str(event.get("content") or "").split())
    if len(content) > 160:
        content = content[:157] + "..."
    detail = f" ({event['detail']})" if event.get("detail") else ""
    console.print(
        f"[dim]#{event.get('step', 0):>2}[/] [{_STYLE.get(op, 'white')}]{op:<12}[/] "
        f"{event.get('action', ''):<12} depth={event.get('stack_depth', 0)}{value_text}{detail}\n"
        f"     {content}",
        highlight=False,
        markup=True,
    )


def _quiet_library_progress() -> None:
    """transformers prints a progress bar per weight load; the live view has its own status line."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


def result_dict(state: dict[str, Any]) -> dict[str, Any]:
    """The machine-readable result of a run (what ``tcrag ask --json`` prints)."""
    from .result import RunResult

    return RunResult.from_state(state).to_json_dict()


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    metric: str = typer.Option("cppl", help="State value: cppl (conditional perplexity) or uct (uncertainty)."),
    sigma: Optional[float] = typer.Option(None, help="Halting threshold (default: 10 for cppl, 20 for uct)."),
    max_steps: int = typer.Option(TCRAGConfig().max_steps, help="Actions before the run halts unvalidated."),
    max_new_tokens: int = typer.Option(TCRAGConfig().max_new_tokens, help="Tokens per model reply."),
    temperature: float = typer.Option(TCRAGConfig().temperature, help="Sampling temperature (0 = greedy)."),
    seed: Optional[int] = typer.Option(0, help="Sampling seed for the local model (reproducible runs)."),
    model_path: Optional[str] = typer.Option(None, help="A transformers model folder instead of the packaged SmolLM2."),
    tools: bool = typer.Option(True, "--tools/--no-tools", help="Use the embedded default tools."),
    backtrack: bool = typer.Option(True, "--backtrack/--no-backtrack", help="Ablation: offer Backtrack."),
    summary: bool = typer.Option(True, "--summary/--no-summary", help="Ablation: offer Summary."),
    state_monitor: bool = typer.Option(True, "--state-monitor/--no-state-monitor", help="Ablation: the state monitor."),
    language: str = typer.Option("en", help="Prompt language: en or zh."),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable result instead of the live view."),
    threads: Optional[int] = typer.Option(None, min=1, help="torch CPU threads (1 is often faster on a busy machine)."),
) -> None:
    """Answer QUESTION with TC-RAG, showing each action, push/pop and state value live."""
    from pydantic import ValidationError

    from .graph import EVENT_NAME, build_graph, question_problem
    from .models import LocalChatModel, LocalModelError

    err = Console(stderr=True)
    _quiet_library_progress()
    try:
        cfg = TCRAGConfig(metric=metric, sigma=sigma, max_steps=max_steps, max_new_tokens=max_new_tokens,
                          temperature=temperature, enable_backtrack=backtrack, enable_summary=summary,
                          enable_state_monitor=state_monitor, language=language)
    except ValidationError as exc:
        err.print(f"[red]Invalid option:[/] {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
        raise typer.Exit(2)
    _, problem = question_problem(question, cfg)
    if problem is not None:  # refuse before spending time on loading the model
        err.print(f"[red]Invalid question:[/] {problem}")
        raise typer.Exit(2)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    out = Console()
    try:
        with err.status("Loading the local model and tools (the first run converts the packaged model, ~30 s)..."):
            model = LocalChatModel(model_path=model_path, max_new_tokens=cfg.max_new_tokens,
                                   temperature=cfg.temperature, seed=seed)
            model.local_model  # load now, so the live view is not interrupted by loading
            tool_list = _default_tools(tools)
    except LocalModelError as exc:
        err.print(f"[red]Model error:[/] {exc}")
        raise typer.Exit(1)
    graph = build_graph(model=model, tools=tool_list, config=cfg)
    if not as_json:
        names = ", ".join(t.name for t in tool_list) or "none"
        out.print(f"[bold]TC-RAG[/] metric={cfg.metric} sigma={cfg.effective_sigma:g} "
                  f"max_steps={cfg.max_steps} tools={names}")
    final: dict[str, Any] = {}
    for mode, chunk in graph.stream({"question": question}, stream_mode=["custom", "values"]):
        if mode == "custom" and isinstance(chunk, dict) and chunk.get("type") == EVENT_NAME:
            if not as_json:
                _render_event(out, chunk)
        elif mode == "values":
            final = chunk
    result = result_dict(final)
    if as_json:
        sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
    else:
        verdict = ("[green]validated[/] (state value below sigma)" if result["answer_validated"]
                   else f"[yellow]NOT validated[/] ({result['halt_reason']})")
        out.print()
        out.print(f"[bold]Answer:[/] {result['answer'] if result['answer'] is not None else '(none)'}")
        out.print(f"[bold]Status:[/] {verdict}")
        if result["error"]:
            out.print(f"[bold]Note:[/] {result['error']}")
    if result["halt_reason"] == "invalid_input":
        raise typer.Exit(2)
    if result["answer"] is None:
        raise typer.Exit(1)


def _warn_broken(name: str, exc: BaseException) -> None:
    Console(stderr=True).print(f"[yellow]warning:[/] commands of {name} unavailable: {type(exc).__name__}: {exc}")


def _register_commands() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # that optional module is not installed
            _warn_broken(name, exc)
            continue
        except Exception as exc:  # one broken sub-command must not take `tcrag ask` down with it
            _warn_broken(name, exc)
            continue
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
