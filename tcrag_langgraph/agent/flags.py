"""Command-line flags made from :class:`~tcrag_langgraph.core.config.TCRAGConfig`'s fields, so a run
option is declared once (its type, bounds and help live on the field) and every command offers it
the same way: ``tcrag ask`` and ``tcrag serve`` with the faces' bounded budgets
(:data:`FACE_FLAGS`), ``tcrag eval`` and ``tcrag calibrate`` with the paper's (:data:`EVAL_FLAGS`).

A field becomes: bool -> ``--x/--no-x`` (``enable_x`` -> ``--x``), Literal -> choices, int/float ->
a number, a tuple of strings -> a comma-separated list, a number-or-word union (sigma) -> text that
TCRAGConfig parses. A flag not given is None, so only explicit choices are set.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Mapping, Optional

import typer

from ..core.config import TCRAGConfig
from .spec import FACE_DEFAULTS, AgentSpec, UserError

__all__ = ["ConfigFlag", "ConfigFlags", "FACE_FLAGS", "EVAL_FLAGS", "NOT_FLAGS", "FLAG_HELP", "config_flags",
           "config_from_flags", "face_spec"]

#: TCRAGConfig fields that are no flag of any command, and why
NOT_FLAGS: dict[str, str] = {
    "caller": "an identity comes from trusted configuration, never from a command-line flag",
    "require_review": "a run paused for review needs a resume step that the command line does not have",
    "review_unvalidated": "a run paused for review needs a resume step that tcrag ask does not have (tcrag serve "
                          "--review-unvalidated is the server's own switch, with its review route)",
}

#: fields ``tcrag eval`` / ``tcrag calibrate`` set otherwise, and why
_EVAL_SETS_ITSELF: dict[str, str] = {
    "metric": "each method fixes its state value (tcrag-cppl, tcrag-uct, ...)",
    "sigma": "--sigma METRIC=VALUE (and --sigma-cppl, --sigma-uct) set each state value's own",
    "answer_format": "the dataset declares its answers",
    "enable_backtrack": "the ablations are methods (wo-backtrack)",
    "enable_summary": "the ablations are methods (wo-summary)",
    "enable_state_monitor": "the ablations are methods (wo-monitor)",
    "calibration_task": "its own --calibration-task defaults to the dataset's name",
}

#: help of the flags whose field description speaks to Python users, in a command-line user's words
FLAG_HELP: dict[str, str] = {
    "sigma": "Halting threshold: an answer is accepted when its state value is below it. A number, or 'auto' "
             "for the value 'tcrag calibrate' stored for this model; default: 10 for cppl, 20 for uct (the paper's).",
    "answer_format": "The allowed answers, comma-separated (e.g. yes,no,maybe or A,B,C,D); an answer that does "
                     "not fit is not accepted.",
    "initial_state_value": "The state value a run starts from (the paper's 'large value').",
}

PANEL = "Run options"


@dataclass(frozen=True)
class ConfigFlag:
    """One flag made from a TCRAGConfig field."""

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


def _flag_for(name: str, field_info: Any, defaults: Mapping[str, Any] = FACE_DEFAULTS) -> ConfigFlag:
    """The flag for field ``name`` (see the module docstring), showing ``defaults``' value where it
    has one, else the field's."""
    members = _members(field_info.annotation)
    dashed = name.removeprefix("enable_").replace("_", "-")
    decls: tuple[str, ...] = (f"--{dashed}",)
    to_value: Callable[[Any], Any] = lambda raw: raw
    metavar = None
    default = defaults.get(name, field_info.get_default(call_default_factory=True))
    shown: Any = default if default is not None else False
    if members == [bool]:
        annotation: Any = bool
        decls = (f"--{dashed}/--no-{dashed}",)
        # None: the config decides per run (see the field's description)
        shown = "auto" if default is None else dashed if default else f"no-{dashed}"
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
        raise TypeError(f"TCRAGConfig.{name}: no command-line form for {field_info.annotation!r}; "
                        f"add one to agent.flags._flag_for or list the field in agent.flags.NOT_FLAGS")
    option = typer.Option(None, *decls, help=FLAG_HELP.get(name, field_info.description or ""), metavar=metavar,
                          show_default=str(shown) if shown is not False else False, rich_help_panel=PANEL)
    parameter = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                  annotation=Optional[annotation])
    return ConfigFlag(name, parameter, to_value)


@dataclass(frozen=True)
class ConfigFlags:
    """The flags of a kind of command: the config defaults it starts from, the fields it leaves out,
    and the options naming its agent (model, monitor, tools: :class:`AgentSpec`'s fields), which its
    commands take, with the config flags, as ``**options``."""

    defaults: Mapping[str, Any]
    not_flags: Mapping[str, str] = field(default_factory=lambda: dict(NOT_FLAGS))
    agent_options: tuple[inspect.Parameter, ...] = ()

    def flags(self) -> list[ConfigFlag]:
        """A flag for every TCRAGConfig field but those in :attr:`not_flags`."""
        return [_flag_for(name, info, self.defaults) for name, info in TCRAGConfig.model_fields.items()
                if name not in self.not_flags]

    def config(self, values: Mapping[str, Any], base: Optional[TCRAGConfig] = None) -> TCRAGConfig:
        """The run's config: ``base`` (default: TCRAGConfig with :attr:`defaults`) with the flags that
        were given applied; ``model_fields_set`` names the defaults and the flags given. A bad value
        is a :class:`UserError` naming the flag."""
        from pydantic import ValidationError

        given = {flag.field: flag.to_value(values[flag.field]) for flag in self.flags()
                 if values.get(flag.field) is not None}
        try:
            if base is None:
                return TCRAGConfig(**{**self.defaults, **given})
            return base.merged(given)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "--" + ".".join(str(part) for part in first["loc"]).replace("_", "-") if first["loc"] else "options"
            raise UserError("Invalid option", f"{where}: {first['msg']}", flag=where) from None

    def signature(self, command: Callable[..., Any]) -> inspect.Signature:
        """``command``'s own parameters, then :attr:`agent_options` and one keyword parameter per
        flag (Typer reads this); the command takes those as ``**options``."""
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
               if p.kind is not p.VAR_KEYWORD]
        return inspect.Signature([*own, *self.agent_options, *(flag.parameter for flag in self.flags())])

    def agent_values(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The values of :attr:`agent_options` among a command's ``options``."""
        return {p.name: options[p.name] for p in self.agent_options if p.name in options}


# ----- the options of AgentSpec's fields, declared once for every command -----
MODEL_PANEL = "Model, tools and output"
SERVED_PANEL = "Served models and the state monitor"
DOCS_PANEL = "Documents"

_Text = Optional[str]
MethodOpt = Annotated[str, typer.Option(
    help="The method that answers: tcrag (TC-RAG as configured), a TC-RAG variant (tcrag-cppl, tcrag-uct, "
    "react, wo-backtrack, wo-summary, wo-monitor), a baseline (base, cot, sr-rag) or another paper's "
    "method (crp-rag, kag-thinker, diffrag).", rich_help_panel=MODEL_PANEL)]
ModelOpt = Annotated[_Text, typer.Option(
    help="A model folder, a .gguf file, a pulled catalogue model (tcrag pull --list), a served model as provider:name (e.g. openai:NAME for a vLLM server) or a "
    "Python function returning a chat model (module:function); default: the packaged SmolLM2-135M-Instruct "
    "(also 'local').", rich_help_panel=MODEL_PANEL)]
DeviceOpt = Annotated[_Text, typer.Option(
    help="Local models only: where to run it (cpu, cuda, cuda:N, mps).", show_default="cpu",
    rich_help_panel=MODEL_PANEL)]
DtypeOpt = Annotated[_Text, typer.Option(
    help="Local models only: float32, bfloat16 or float16.", show_default="float32", rich_help_panel=MODEL_PANEL)]
BackendOpt = Annotated[_Text, typer.Option(
    help="Local models only: auto (llama.cpp for a .gguf on the CPU, transformers otherwise), llama_cpp or "
    "transformers.", show_default="auto", rich_help_panel=MODEL_PANEL)]
ScriptedOpt = Annotated[_Text, typer.Option(
    help="For tests and demos: replay a JSON script instead of a language model, monitor and tools.",
    rich_help_panel=MODEL_PANEL)]
BaseUrlOpt = Annotated[_Text, typer.Option(
    help="Served models: the server's API address (e.g. http://127.0.0.1:8000/v1).", rich_help_panel=SERVED_PANEL)]
ApiKeyEnvOpt = Annotated[_Text, typer.Option(
    metavar="NAME", help="Served models and --scorer servers: the environment variable holding the API key (the "
    "key itself never goes on the command line).", rich_help_panel=SERVED_PANEL)]
ScorerOpt = Annotated[_Text, typer.Option(
    help="The state monitor: the address of a vLLM or SGLang completions server of the same model (e.g. "
    "http://127.0.0.1:8000/v1), a local folder or .gguf file with the same weights, 'f16' (a .gguf's float16 "
    "re-encoding: the exact reference, a second copy of the weights), or a Python function returning a scorer "
    "(module:function); default: the weights the model generates with (local models; also 'local').",
    rich_help_panel=SERVED_PANEL)]
ScorerModelOpt = Annotated[_Text, typer.Option(
    metavar="NAME", help="The model name the monitor's server knows the model by; default: the name in --model.",
    rich_help_panel=SERVED_PANEL)]
ScorerStartOpt = Annotated[str, typer.Option(
    help="Text the monitor's server puts before what it scores: the model's start token, for models whose server "
    "adds none (e.g. '<|im_start|>').", rich_help_panel=SERVED_PANEL)]
EsUrlOpt = Annotated[_Text, typer.Option(
    envvar="TCRAG_ES_URL", help="Search documents in this Elasticsearch server (built with 'tcrag index ... "
    "--es-url') instead of the embedded collection.", rich_help_panel=DOCS_PANEL)]
EsIndexOpt = Annotated[str, typer.Option(
    envvar="TCRAG_ES_INDEX", help="The Elasticsearch index to search.", rich_help_panel=DOCS_PANEL)]
EsApiKeyEnvOpt = Annotated[_Text, typer.Option(
    metavar="NAME", help="The environment variable holding the Elasticsearch API key.", rich_help_panel=DOCS_PANEL)]
ToolsSwitchOpt = Annotated[bool, typer.Option(
    "--tools/--no-tools", help="Give the agent the medical tools (documents, knowledge graph, encyclopedia, "
    "medical records).", rich_help_panel=MODEL_PANEL)]
ToolsPresetOpt = Annotated[str, typer.Option(
    help="none, default, docs, web (comma-separated) or a Python function returning tools (module:function).",
    rich_help_panel=MODEL_PANEL)]


def _option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_SERVED_AND_MONITOR = (
    _option("base_url", BaseUrlOpt, None), _option("api_key_env", ApiKeyEnvOpt, None),
    _option("scorer_model", ScorerModelOpt, None), _option("scorer_start_text", ScorerStartOpt, ""),
    _option("es_url", EsUrlOpt, None), _option("es_index", EsIndexOpt, "tcrag-docs"),
    _option("es_api_key_env", EsApiKeyEnvOpt, None),
)

#: ``tcrag ask`` and ``tcrag serve``: one method, any model (default: the packaged one), the default
#: tools or none; every config field but :data:`NOT_FLAGS`, from the faces' bounded budgets
FACE_FLAGS = ConfigFlags(FACE_DEFAULTS, agent_options=(
    _option("method", MethodOpt, "tcrag"), _option("model", ModelOpt, None), _option("device", DeviceOpt, None),
    _option("dtype", DtypeOpt, None), _option("backend", BackendOpt, None), _option("tools", ToolsSwitchOpt, True),
    _option("scripted", ScriptedOpt, None), _option("scorer", ScorerOpt, None), *_SERVED_AND_MONITOR))
#: ``tcrag eval`` and ``tcrag calibrate``: models, tools and monitors as presets or ``module:function``
#: (their methods are options of their own); the run options every method shares, from the paper's defaults
EVAL_FLAGS = ConfigFlags({}, {**NOT_FLAGS, **_EVAL_SETS_ITSELF}, agent_options=(
    _option("model", ModelOpt, "local"), _option("tools", ToolsPresetOpt, "none"), _option("scorer", ScorerOpt, "local"),
    *_SERVED_AND_MONITOR))


def face_spec(flags: Mapping[str, Any]) -> AgentSpec:
    """The agent of ``tcrag ask`` / ``tcrag serve`` from their flags, which are named as
    :class:`AgentSpec`'s fields and TCRAGConfig's (``scripted`` is ``script``; ``--tools/--no-tools``
    the default tools or none; a script replaces the model, so ``seed`` goes with it). The run options
    apply over the faces' budgets and a script's own settings; other names (the command's own) are
    left out. Every problem is a :class:`UserError`."""
    script = flags.get("scripted")
    config = FACE_FLAGS.config({flag.field: flags.get(flag.field) for flag in FACE_FLAGS.flags()},
                               base=AgentSpec.base_config(script))
    own = {name: flags[name] for name in AgentSpec.model_fields
           if name in flags and name not in ("tools", "config", "script") and not (script and name == "seed")}
    return AgentSpec.create(script=script, tools="default" if flags.get("tools", True) else "none", config=config,
                            **own)


def config_flags(kind: ConfigFlags = FACE_FLAGS) -> list[ConfigFlag]:
    """The flags of ``kind`` (default: the faces')."""
    return kind.flags()


def config_from_flags(values: Mapping[str, Any], base: Optional[TCRAGConfig] = None,
                      kind: ConfigFlags = FACE_FLAGS) -> TCRAGConfig:
    """:meth:`ConfigFlags.config` of ``kind`` (default: the faces')."""
    return kind.config(values, base)
