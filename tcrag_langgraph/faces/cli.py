"""The ``tcrag`` command: ``ask`` here; ``index``, ``build-kg``, ``eval``, ``serve`` ... are registered
by the modules that own them (each exposes ``register(app)``).

``tcrag ask``'s run options are generated from :class:`~tcrag_langgraph.core.config.TCRAGConfig`'s fields
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
from typer.core import TyperGroup

from ..core.config import TCRAGConfig
from .run_options import FACE_DEFAULTS, UserError, one_line


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
)

#: TCRAGConfig fields that are no flag of ``tcrag ask``, and why.
NOT_FLAGS: dict[str, str] = {
    "caller": "an identity comes from trusted configuration, never from a command-line flag",
    "require_review": "a run paused for review needs a resume step that this command does not have",
}

#: Where ``tcrag ask`` (and ``tcrag serve``, Studio) differ from TCRAGConfig's (paper) defaults, and
#: why: :data:`~tcrag_langgraph.faces.run_options.FACE_DEFAULTS`.
ASK_DEFAULTS: dict[str, Any] = FACE_DEFAULTS

#: help of the flags whose field description speaks to Python users, in a command-line user's words
FLAG_HELP: dict[str, str] = {
    "sigma": "Halting threshold: an answer is accepted when its state value is below it. A number, or 'auto' "
             "for the value 'tcrag calibrate' stored for this model; default: 10 for cppl, 20 for uct (the paper's).",
    "answer_format": "The allowed answers, comma-separated (e.g. yes,no,maybe or A,B,C,D); an answer that does "
                     "not fit is not accepted.",
    "initial_state_value": "The state value a run starts from (the paper's 'large value').",
}

_CONFIG_PANEL = "Run options"
_MODEL_PANEL = "Model, tools and output"


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
    option = typer.Option(None, *decls, help=FLAG_HELP.get(name, field.description or ""), metavar=metavar,
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
    from ..tools import default_tools

    return list(default_tools())


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
    else:
        verdict = f"[yellow]NOT validated[/] ({result.halt_reason})"
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


_SERVED_PANEL = "Served models and the state monitor"
_DOCS_PANEL = "Documents"


# ----- tcrag ask -----
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    *,
    method: str = typer.Option(
        "tcrag", "--method",
        help="The method that answers: tcrag (TC-RAG as configured), a TC-RAG variant (tcrag-cppl, tcrag-uct, "
        "react, wo-backtrack, wo-summary, wo-monitor), a baseline (base, cot, sr-rag) or another paper's "
        "method (crp-rag, kag-thinker, diffrag).", rich_help_panel=_MODEL_PANEL),
    model: Optional[str] = typer.Option(
        None, help="A model folder, a .gguf file or a served model as provider:name (e.g. openai:NAME for a vLLM "
        "server); default: the packaged SmolLM2-135M-Instruct.", rich_help_panel=_MODEL_PANEL),
    device: Optional[str] = typer.Option(None, help="Local models only: where to run it (cpu, cuda, cuda:N, mps).",
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
    tools: bool = typer.Option(True, "--tools/--no-tools", help="Give the agent the medical tools (documents, "
                               "knowledge graph, encyclopedia, medical records).", rich_help_panel=_MODEL_PANEL),
    as_json: bool = typer.Option(False, "--json", help="Print the run's result as JSON instead of the live view.",
                                 rich_help_panel=_MODEL_PANEL),
    scripted: Optional[str] = typer.Option(
        None, help="For tests and demos: replay a JSON script instead of a language model, monitor and tools.",
        rich_help_panel=_MODEL_PANEL),
    base_url: Optional[str] = typer.Option(
        None, help="Served models: the server's API address (e.g. http://127.0.0.1:8000/v1).",
        rich_help_panel=_SERVED_PANEL),
    api_key_env: Optional[str] = typer.Option(
        None, metavar="NAME", help="Served models: the environment variable holding the API key (the key itself "
        "never goes on the command line).", rich_help_panel=_SERVED_PANEL),
    scorer: Optional[str] = typer.Option(
        None, help="The state monitor: the address of a vLLM or SGLang completions server of the same model "
        "(e.g. http://127.0.0.1:8000/v1), or a local folder or .gguf file with the same weights; default: the "
        "model's own weights (local models).", rich_help_panel=_SERVED_PANEL),
    scorer_model: Optional[str] = typer.Option(
        None, metavar="NAME", help="The model name the monitor's server knows the model by; default: the name "
        "in --model.", rich_help_panel=_SERVED_PANEL),
    scorer_start_text: str = typer.Option(
        "", help="Text the monitor's server puts before what it scores: the model's start token, for models "
        "whose server adds none (e.g. '<|im_start|>').", rich_help_panel=_SERVED_PANEL),
    es_url: Optional[str] = typer.Option(
        None, envvar="TCRAG_ES_URL", help="Search documents in this Elasticsearch server (built with "
        "'tcrag index ... --es-url') instead of the embedded collection.", rich_help_panel=_DOCS_PANEL),
    es_index: str = typer.Option("tcrag-docs", envvar="TCRAG_ES_INDEX", help="The Elasticsearch index to search.",
                                 rich_help_panel=_DOCS_PANEL),
    es_api_key_env: Optional[str] = typer.Option(
        None, metavar="NAME", help="The environment variable holding the Elasticsearch API key.",
        rich_help_panel=_DOCS_PANEL),
    **config_values: Any,
) -> None:
    """Answer QUESTION, showing each action, push/pop and state value live."""
    from pydantic import ValidationError

    from ..core.events import EVENT_NAME
    from ..core.result import RunResult
    from ..core.run_input import question_problem
    from ..models.local import LocalChatModel, LocalModelError
    from .run_options import (api_key_from_env, build_for_face, check_method, check_sigma, make_generator,
                              make_scorer, make_tools, quiet_library_progress, scripted_run)

    err = Console(stderr=True)
    quiet_library_progress()
    components: dict[str, Any] = {}
    try:
        check_method(method)
        if scripted is not None:
            components = scripted_run(scripted, model=model, device=device, dtype=dtype, backend=backend,
                                      base_url=base_url, scorer=scorer)
        try:
            cfg = config_from_flags(config_values, base=components.get("config"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "--" + ".".join(str(part) for part in first["loc"]).replace("_", "-") if first["loc"] else "options"
            raise UserError("Invalid option", f"{where}: {first['msg']}") from None
        _, problem = question_problem(question, cfg)
        if problem is not None:  # refuse before spending time on loading the model
            raise UserError("Invalid question", problem)
        api_key = api_key_from_env(api_key_env)
        es_api_key = api_key_from_env(es_api_key_env, flag="--es-api-key-env")
        if components:
            chat, tool_list, state_scorer = components["model"], components["tools"], components["scorer"]
            if es_url:  # a scripted model driving the real Elasticsearch document tool
                es_tool = make_tools(True, es_url=es_url, es_index=es_index, es_api_key=es_api_key)[0]
                tool_list = [es_tool, *(t for t in tool_list if t.name != es_tool.name)]
        else:
            chat = make_generator(model, base_url=base_url, api_key=api_key, device=device, dtype=dtype,
                                  max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=seed,
                                  backend=backend, threads=threads)
            state_scorer = make_scorer(scorer, generator=chat, served_model=scorer_model, api_key=api_key,
                                       start_text=scorer_start_text)
            check_sigma(cfg, chat)  # a missing calibration is refused before the model loads
            tool_list = make_tools(tools, es_url=es_url, es_index=es_index, es_api_key=es_api_key)
        graph = build_for_face(method, model=chat, tools=tool_list, scorer=state_scorer, config=cfg)
    except UserError as exc:
        raise refuse(exc) from None
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
        sigma = "auto" if cfg.sigma == "auto" else f"{cfg.effective_sigma:g}"
        label = "TC-RAG" if method == "tcrag" else f"method={method}"
        out.print(f"[bold]{label}[/] metric={cfg.metric} sigma={sigma} "
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
