"""The ``tcrag`` command: ``ask`` here; ``index``, ``build-kg``, ``eval``, ``serve`` ... are registered
by the modules that own them (each exposes ``register(app)``).

``tcrag ask``'s run options are generated from :class:`~tcrag_langgraph.core.config.TCRAGConfig`'s fields
(:mod:`tcrag_langgraph.agent.flags`), and its agent is built by
:class:`~tcrag_langgraph.agent.spec.AgentSpec`, as every face's is. Only the options given on the
command line go into the run's config: every other value is the faces' default or TCRAGConfig's.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from ..agent.flags import FACE_FLAGS, MODEL_PANEL, face_spec
from ..agent.spec import UserError, one_line


class _OneLineErrors(TyperGroup):
    """The ``tcrag`` group: a usage error of any sub-command (a bad option value, a missing option, an
    unknown one) is one line on stderr with exit status 2, like a :class:`UserError`, not a boxed
    usage screen."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:  # typer >= 0.2x carries its own copy of click; older releases use click itself
            from typer._click import exceptions as click_errors
        except ImportError:  # pragma: no cover - depends on the installed typer
            from click import exceptions as click_errors

        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:  # `tcrag` alone: the help, as before
            exc.show()
            sys.exit(exc.exit_code)
        except click_errors.ClickException as exc:
            kind = "Invalid option" if isinstance(exc, click_errors.BadParameter) else "Usage"
            command = getattr(getattr(exc, "ctx", None), "command_path", None) or "tcrag"
            from rich.markup import escape

            Console(stderr=True).print(f"[red]{kind}:[/] {escape(one_line(exc.format_message()))} "
                                       f"(see {escape(command)} --help)", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        except UserError as exc:  # a sub-command's refusal (tcrag eval, calibrate): one line, as ask's
            from rich.markup import escape

            Console(stderr=True).print(f"[red]{escape(exc.kind)}:[/] {escape(exc.message)}", highlight=False,
                                       soft_wrap=True)
            sys.exit(2)
        except typer.Abort:  # public in every typer: the vendored click's has no Abort in `exceptions`
            Console(stderr=True).print("Aborted.")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="tcrag",
    help="TC-RAG: a retrieval-augmented agent with stack memory and a state monitor, on LangGraph.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a traceback must never print a key held in a local variable
)

# Modules that add their own sub-commands; a missing optional module is skipped.
_COMMAND_MODULES = (
    "tcrag_langgraph.tools.indexing",
    "tcrag_langgraph.tools.kg_build",
    "tcrag_langgraph.eval.cli",
    "tcrag_langgraph.faces.serve_command",
    "tcrag_langgraph.faces.studio",
    "tcrag_langgraph.faces.pull_command",
)

def quiet_library_progress() -> None:
    """Keep the libraries' progress bars and warnings out of the live view: transformers' weight-load
    bars and FutureWarnings, sentence-transformers' tqdm bars (the live view and the server's log have
    their own status lines); ask and serve both call it."""
    import logging
    import os
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|torch|sentence_transformers)\b")
    for name in ("transformers", "sentence_transformers", "huggingface_hub", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "transformers" in sys.modules:  # else TRANSFORMERS_VERBOSITY above holds when it loads
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


# ----- the live view -----
_STYLE = {"push": "green", "pop": "yellow", "pop+push": "cyan", "reject": "magenta", "halt": "bold",
          "format_error": "red", "noop": "dim"}


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


def _render_result(console: Console, result: Any) -> None:
    """The end of the live view: answer, status, the sources it used, the structured answer."""
    from rich.markup import escape

    if result.answer_validated:
        verdict = "[green]validated[/] (state value below sigma)"
    elif result.halt_reason == "monitor_cannot_judge":
        verdict = "[yellow]not validated: the monitor cannot judge this model[/]"
    elif result.halt_reason == "rejections_spent":
        verdict = "[yellow]not validated: the monitor rejected it and the run may not search again (max_rejections)[/]"
    elif result.halt_reason == "rewritten_conclusion":
        verdict = "[yellow]not validated: written after the monitor rejected a first Conclusion (outside the risk's calibration)[/]"
    else:
        verdict = f"[yellow]NOT validated[/] ({result.halt_reason})"
    console.print()
    console.print(f"[bold]Answer:[/] {escape(result.answer) if result.answer is not None else '(none)'}")
    if result.structured_answer is not None and result.structured_answer != result.answer:  # asked format
        structured = json.dumps(result.structured_answer, ensure_ascii=False, default=str)
        console.print(f"[bold]Structured answer:[/] {escape(structured)}")
    console.print(f"[bold]Status:[/] {verdict}")
    if result.confidence is not None:
        console.print(f"[bold]Confidence:[/] {result.confidence:.2f} (the calibrated probability that it is right)")
    if result.sources:
        console.print("[bold]Sources:[/]")
        for source in result.sources:
            shown = json.dumps(source.tool_input, ensure_ascii=False, default=str)
            console.print(f"  - step {source.step}: {source.tool} {escape(shown)}", highlight=False)
    else:
        console.print("[bold]Sources:[/] none (no tool result is on the final stack)")
    if result.error:
        console.print(f"[bold]Note:[/] {escape(result.error)}")


def _limit_threads(threads: int, chat: Any) -> None:
    """``--threads`` for every numeric library in the process: the BLAS/OpenMP pools already loaded
    (threadpoolctl; numpy's for the query embedding) and torch's, importing torch only when the
    generator runs on it (a llama.cpp or served run never loads torch)."""
    from threadpoolctl import threadpool_limits

    from ..models.llama_cpp import LlamaCppChatModel
    from ..models.local import LocalChatModel

    threadpool_limits(limits=threads)
    on_torch = isinstance(chat, LocalChatModel) and not isinstance(chat, LlamaCppChatModel)
    if "torch" in sys.modules or on_torch:
        import torch

        torch.set_num_threads(threads)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("tcrag-langgraph")
        except PackageNotFoundError:  # pragma: no cover - run from a source tree that is not installed
            found = "unknown (not installed)"
        typer.echo(f"tcrag {found}")
        raise typer.Exit()


@app.callback()
def _group(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Show the version and exit."),
) -> None:
    """TC-RAG command line (a group, so `tcrag ask ...` works even with one command)."""


def refuse(error: UserError) -> typer.Exit:
    """Print ``error`` on one line on stderr; the exit (status 2) to raise."""
    Console(stderr=True).print(f"[red]{error.kind}:[/] {error.message}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


# ----- tcrag ask -----
#: what `tcrag ask` without --model says on stderr before answering (the 135M model writes the action
#: format unreliably and knows little medicine: a user should learn that before judging the agent)
DEMO_MODEL_NOTICE = ("tcrag: answering with the packaged SmolLM2-135M, a demonstration model that answers poorly; "
                     "for real answers run `tcrag pull qwen2.5-coder-1.5b`, then add --model qwen2.5-coder-1.5b")


def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    *,
    seed: Optional[int] = typer.Option(0, help="Local models only: sampling seed (reproducible runs).",
                                       rich_help_panel=MODEL_PANEL),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads of the local model, torch or llama.cpp "
                                          "(1 is often faster on a busy machine).", rich_help_panel=MODEL_PANEL),
    as_json: bool = typer.Option(False, "--json", help="Print the run's result as JSON instead of the live view.",
                                 rich_help_panel=MODEL_PANEL),
    **options: Any,
) -> None:
    """Answer QUESTION, showing each action, push/pop and state value live."""
    method = options["method"]  # the agent's options (agent.flags.FACE_FLAGS) are named as AgentSpec's fields
    from ..core.events import EVENT_NAME
    from ..methods.registry import DEFAULT_METHOD, METHODS, tcrag_config_for
    from ..methods.tcrag.graph import monitor_config
    from ..core.result import RunResult
    from ..core.run_input import question_problem
    from ..models.local import LocalChatModel
    from ..models.weights import LocalModelError

    err = Console(stderr=True)
    quiet_library_progress()
    try:
        spec = face_spec({"seed": seed, **options})
        _, problem = question_problem(question, spec.config)
        if problem is not None:  # refuse before spending time on loading the model
            raise UserError("Invalid question", problem)
        parts = spec.assemble()
        graph = spec.build(parts)
    except UserError as exc:
        raise refuse(exc) from None
    if options.get("model") is None and options.get("scripted") is None:  # the packaged default: say once that it is only a demonstration
        err.print(DEMO_MODEL_NOTICE, highlight=False, soft_wrap=True, markup=False)
    chat, tool_list, cfg = parts.model, parts.tools, parts.config
    if METHODS[method].is_stack_machine:  # the state value the run will use: the variant's own, or consistency
        own = cfg if method == DEFAULT_METHOD else tcrag_config_for(method, config=cfg)  # for a model without log-probs
        cfg = monitor_config(own, chat, parts.scorer)
    if threads is not None:
        _limit_threads(threads, chat)
    out = Console()
    if isinstance(chat, LocalChatModel):
        try:
            with err.status("Loading the model (the first run converts the packaged model, ~30 s)..."):
                chat.local_model  # load now, so the live view is not interrupted by loading
        except LocalModelError as exc:
            raise refuse(UserError("Model error", str(exc))) from None
    if not as_json:
        names = ", ".join(t.name for t in tool_list) or "none"
        sigma = f"{cfg.effective_sigma:g}" if cfg.risk is None else f"certified for risk {cfg.risk:g}"
        label = "TC-RAG" if method == "tcrag" else f"method={method}"
        out.print(f"[bold]{label}[/] metric={cfg.metric} sigma={sigma} "
                  f"max_steps={cfg.max_steps} max_new_tokens={cfg.max_new_tokens} tools={names}", highlight=False)
    final: dict[str, Any] = {}
    # the reply as it is written, on an interactive terminal only: it is redrawn in place, so a terminal
    # that keeps colours but not cursor moves (TTY_INTERACTIVE=0, e.g. scripts/render_live_view.py) skips it
    writing = _LiveReply(out) if (not as_json and out.is_interactive) else None
    modes = ["custom", "values", "messages"] if writing is not None else ["custom", "values"]
    for mode, chunk in graph.stream({"question": question}, stream_mode=modes):
        if mode == "messages":
            writing.add(chunk[0])
            continue
        if writing is not None:
            writing.stop()
        if mode == "custom" and isinstance(chunk, dict) and chunk.get("type") == EVENT_NAME:
            if not as_json:
                _render_event(out, chunk)
        elif mode == "values":
            final = chunk
    result = RunResult.from_state(final)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json_dict(), ensure_ascii=False, indent=2) + "\n")
    else:
        _render_result(out, result)
    if result.halt_reason == "invalid_input":
        raise typer.Exit(2)
    if result.halt_reason in ("model_error", "scorer_error") and result.answer is None:
        what = "Model error" if result.halt_reason == "model_error" else "Monitor error"
        raise refuse(UserError(what, f"{result.error or 'the call failed'} (check --model, --base-url, "
                                     "--api-key-env and --scorer)"))
    if result.answer is None:
        raise typer.Exit(1)


class _LiveReply:
    """A transient line under the live view showing the model's reply token by token (terminals only);
    it disappears when the step's event is printed."""

    def __init__(self, console: Console) -> None:
        self.console, self.text, self.live = console, "", None

    def add(self, message: Any) -> None:
        from langchain_core.messages import AIMessageChunk
        from rich.live import Live
        from rich.text import Text

        piece = message.content if isinstance(message, AIMessageChunk) and isinstance(message.content, str) else ""
        if not piece:
            return
        self.text += piece
        if self.live is None:
            self.live = Live(console=self.console, transient=True, refresh_per_second=12)
            self.live.start()
        self.live.update(Text("     writing: " + self.text[-1500:], style="dim"))

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
        self.live, self.text = None, ""


ask.__signature__ = FACE_FLAGS.signature(ask)  # type: ignore[attr-defined]
app.command()(ask)


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
