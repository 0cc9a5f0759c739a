"""The ``tcrag`` command: ``ask`` here; ``index``, ``build-kg``, ``eval``, ``serve`` ... are registered
by the modules that own them (each exposes ``register(app)``).

``tcrag ask``'s run options are generated from :class:`~tcrag_langgraph.machine.config.TCRAGConfig`'s fields
(name, type, default, description), so a new option needs no second declaration here. Only the
options given on the command line go into the run's config: every other value is TCRAGConfig's.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

import typer
from rich.console import Console

from ..machine.config import TCRAGConfig

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
    "tcrag_langgraph.faces.serve",
)

#: TCRAGConfig fields that are no flag of ``tcrag ask``, and why.
NOT_FLAGS: dict[str, str] = {
    "caller": "an identity comes from trusted configuration, never from a command-line flag",
    "require_review": "a run paused for review needs a resume step that this command does not have",
}

#: Where ``tcrag ask`` differs from TCRAGConfig's (paper) defaults, and why: the paper's 500 new
#: tokens and 12 steps are for a 32B model. A reply holds one action (generation stops at the next
#: label) and the packaged 135M model's unusable replies run to the limit; each step costs ~8 CPU
#: seconds on this 2-core machine, so 64 tokens and 6 steps (then the final Conclusion) keep the
#: main job near a minute (benchmarks/RESULTS.md, "main job"). The flags set them back.
ASK_DEFAULTS: dict[str, Any] = {"max_new_tokens": 64, "max_steps": 6}

_CONFIG_PANEL = "Run options (TCRAGConfig)"
_MODEL_PANEL = "Model, tools and output"


@app.callback()
def _group() -> None:
    """TC-RAG command line (a group, so `tcrag ask ...` works even with one command)."""


# ----- flags generated from TCRAGConfig -----
@dataclass(frozen=True)
class ConfigFlag:
    """One ``tcrag ask`` flag made from a TCRAGConfig field."""

    field: str
    parameter: inspect.Parameter
    to_value: Callable[[Any], Any] = lambda raw: raw


def _members(annotation: Any) -> list[Any]:
    """The types a field accepts, Unions and ``Annotated`` unwrapped, without None and classes
    (``type[...]``: a Pydantic model class cannot be written on a command line)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    if annotation is type(None) or origin is type:
        return []
    return [annotation]


def _comma_list(raw: Optional[str]) -> Optional[list[str]]:
    return None if raw is None else [part.strip() for part in raw.split(",")]


def _flag_for(name: str, field: Any) -> ConfigFlag:
    """The flag for field ``name``: bool -> ``--x/--no-x`` (``enable_x`` -> ``--x``), Literal ->
    choices, int/float -> numbers, a tuple of strings -> a comma-separated list, a number-or-word
    union (sigma) -> text that TCRAGConfig parses."""
    members = _members(field.annotation)
    dashed = name.removeprefix("enable_").replace("_", "-")
    decls: tuple[str, ...] = (f"--{dashed}",)
    to_value: Callable[[Any], Any] = lambda raw: raw
    metavar = None
    default = ASK_DEFAULTS.get(name, field.get_default(call_default_factory=True))
    shown: Any = default if default is not None else False
    if members == [bool]:
        annotation: Any = bool
        decls = (f"--{dashed}/--no-{dashed}",)
        shown = dashed if default else f"no-{dashed}"
    elif members and all(typing.get_origin(m) is Literal for m in members):
        annotation = Literal[tuple(v for m in members for v in typing.get_args(m))]  # type: ignore[misc]
    elif members in ([int], [float], [str]):
        annotation = members[0]
    elif len(members) == 1 and typing.get_origin(members[0]) is tuple:
        annotation, metavar, to_value = str, "A,B,...", _comma_list
    elif members and all(m in (int, float) or typing.get_origin(m) is Literal for m in members):
        words = [str(v) for m in members if typing.get_origin(m) is Literal for v in typing.get_args(m)]
        annotation, metavar = str, "|".join(["NUMBER", *words])
    else:
        raise TypeError(f"TCRAGConfig.{name}: no command-line form for {field.annotation!r}; "
                        f"add one to cli._flag_for or list the field in cli.NOT_FLAGS")
    option = typer.Option(None, *decls, help=field.description or "", metavar=metavar,
                          show_default=str(shown) if shown is not False else False,
                          rich_help_panel=_CONFIG_PANEL)
    parameter = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                  annotation=Optional[annotation])
    return ConfigFlag(name, parameter, to_value)


def config_flags() -> list[ConfigFlag]:
    """A flag for every TCRAGConfig field but those in :data:`NOT_FLAGS`."""
    return [_flag_for(name, field) for name, field in TCRAGConfig.model_fields.items() if name not in NOT_FLAGS]


def config_from_flags(values: dict[str, Any], base: Optional[TCRAGConfig] = None) -> TCRAGConfig:
    """The run's config: ``base`` (default: TCRAGConfig with :data:`ASK_DEFAULTS`) with the flags
    that were given applied.

    A flag that was not given is None here, so only explicit choices override; ``model_fields_set``
    of the result names exactly those. Bad values raise pydantic's ValidationError.
    """
    given = {flag.field: flag.to_value(values[flag.field]) for flag in config_flags()
             if values.get(flag.field) is not None}
    if base is None:
        return TCRAGConfig(**{**ASK_DEFAULTS, **given})
    return base.merged(given)


# ----- the live view -----
_STYLE = {"push": "green", "pop": "yellow", "pop+push": "cyan", "reject": "magenta", "halt": "bold",
          "format_error": "red", "noop": "dim"}


def _default_tools(enabled: bool) -> list[Any]:
    if not enabled:
        return []
    from .. import tools as tools_pkg

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


def _render_result(console: Console, result: Any) -> None:
    """The end of the live view: answer, status, the sources it used, the structured answer."""
    from rich.markup import escape

    verdict = ("[green]validated[/] (state value below sigma)" if result.answer_validated
               else f"[yellow]NOT validated[/] ({result.halt_reason})")
    console.print()
    console.print(f"[bold]Answer:[/] {escape(result.answer) if result.answer is not None else '(none)'}")
    if result.structured_answer is not None and result.structured_answer != result.answer:  # asked format
        structured = json.dumps(result.structured_answer, ensure_ascii=False, default=str)
        console.print(f"[bold]Structured answer:[/] {escape(structured)}")
    console.print(f"[bold]Status:[/] {verdict}")
    if result.sources:
        console.print("[bold]Sources:[/]")
        for source in result.sources:
            shown = json.dumps(source.tool_input, ensure_ascii=False, default=str)
            console.print(f"  - step {source.step}: {source.tool} {escape(shown)}", highlight=False)
    else:
        console.print("[bold]Sources:[/] none (no tool result is on the final stack)")
    if result.error:
        console.print(f"[bold]Note:[/] {escape(result.error)}")


def _quiet_library_progress() -> None:
    """transformers prints a progress bar per weight load; the live view has its own status line."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass


# ----- tcrag ask -----
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    *,
    model: Optional[str] = typer.Option(
        None, help="A transformers folder, a .gguf file or a LangChain 'provider:model' name "
        "(e.g. openai:NAME for a vLLM server); default: the packaged SmolLM2-135M-Instruct.",
        rich_help_panel=_MODEL_PANEL),
    device: Optional[str] = typer.Option(None, help="Local models only: torch device (cpu, cuda, cuda:N, mps).",
                                         show_default="cpu", rich_help_panel=_MODEL_PANEL),
    dtype: Optional[str] = typer.Option(None, help="Local models only: float32, bfloat16 or float16.",
                                        show_default="float32", rich_help_panel=_MODEL_PANEL),
    backend: Optional[str] = typer.Option(
        None, help="Local models only: auto (llama.cpp for a .gguf on the CPU, transformers otherwise), "
        "llama_cpp or transformers.", show_default="auto", rich_help_panel=_MODEL_PANEL),
    seed: Optional[int] = typer.Option(0, help="Local models only: sampling seed (reproducible runs).",
                                       rich_help_panel=_MODEL_PANEL),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads of the local model, torch or llama.cpp "
                                          "(1 is often faster on a busy machine).",
                                          rich_help_panel=_MODEL_PANEL),
    tools: bool = typer.Option(True, "--tools/--no-tools", help="Use the embedded default tools.",
                               rich_help_panel=_MODEL_PANEL),
    as_json: bool = typer.Option(False, "--json", help="Print the run's result as JSON instead of the live view.",
                                 rich_help_panel=_MODEL_PANEL),
    scripted: Optional[str] = typer.Option(
        None, help="TESTING/DEMO: replay a JSON script instead of a language model, scorer and tools "
        "(see tcrag_langgraph.testing).", rich_help_panel=_MODEL_PANEL),
    **config_values: Any,
) -> None:
    """Answer QUESTION with TC-RAG, showing each action, push/pop and state value live."""
    from pydantic import ValidationError

    from ..machine.graph import EVENT_NAME, build_graph, question_problem
    from ..models.local import LocalChatModel, LocalModelError, resolve_chat_model
    from ..machine.result import RunResult
    from ..monitor.scoring import MonitorUnavailableError

    err = Console(stderr=True)

    def refuse(kind: str, message: str) -> typer.Exit:
        err.print(f"[red]{kind}:[/] {message}", highlight=False)
        return typer.Exit(2)

    _quiet_library_progress()
    components: dict[str, Any] = {}
    if scripted is not None:
        if any(v is not None for v in (model, device, dtype, backend)):
            raise refuse("Invalid option", "--scripted replaces the model: do not combine it with "
                         "--model/--device/--dtype/--backend")
        from ..testing import scripted_components

        try:
            components = scripted_components(scripted)
        except (OSError, ValueError) as exc:
            raise refuse("Invalid script", str(exc)) from None
    try:
        cfg = config_from_flags(config_values, base=components.get("config"))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "options"
        raise refuse("Invalid option", f"{where}: {first['msg']}") from None
    _, problem = question_problem(question, cfg)
    if problem is not None:  # refuse before spending time on loading the model
        raise refuse("Invalid question", problem)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    out = Console()
    if components:
        chat, tool_list, scorer = components["model"], components["tools"], components["scorer"]
    else:
        try:
            chat = resolve_chat_model(model, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                      device=device, dtype=dtype, backend=backend)
        except ValueError as exc:
            raise refuse("Invalid model", str(exc)) from None
        if isinstance(chat, LocalChatModel):
            chat.seed = seed
            if threads is not None and hasattr(chat, "n_threads"):  # llama.cpp threads
                chat.n_threads = threads
        scorer = None
        try:
            with err.status("Loading the model and tools (the first run converts the packaged model, ~30 s)..."):
                if isinstance(chat, LocalChatModel):
                    chat.local_model  # load now, so the live view is not interrupted by loading
                tool_list = _default_tools(tools)
        except LocalModelError as exc:
            err.print(f"[red]Model error:[/] {exc}", highlight=False)
            raise typer.Exit(1) from None
    try:
        graph = build_graph(model=chat, tools=tool_list, scorer=scorer, config=cfg)
    except (ValueError, MonitorUnavailableError) as exc:  # e.g. no monitor for a served model, no calibration
        raise refuse("Cannot build the agent", str(exc)) from None
    if not as_json:
        names = ", ".join(t.name for t in tool_list) or "none"
        sigma = "auto" if cfg.sigma == "auto" else f"{cfg.effective_sigma:g}"
        out.print(f"[bold]TC-RAG[/] metric={cfg.metric} sigma={sigma} "
                  f"max_steps={cfg.max_steps} max_new_tokens={cfg.max_new_tokens} tools={names}", highlight=False)
    final: dict[str, Any] = {}
    writing = _LiveReply(out) if (not as_json and out.is_terminal) else None  # the reply as it is written
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


def _ask_signature() -> inspect.Signature:
    """ask's own parameters, then one keyword parameter per generated config flag (Typer reads this)."""
    own = [p for p in inspect.signature(ask, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    return inspect.Signature([*own, *(flag.parameter for flag in config_flags())])


ask.__signature__ = _ask_signature()  # type: ignore[attr-defined]
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
