"""One way to build an agent from a user's words: :class:`AgentSpec` names the method, the model
(local or served), the state monitor, the tools and the run's budgets (a :class:`TCRAGConfig`);
:meth:`AgentSpec.assemble` turns the words into objects, checking everything before anything loads,
and :meth:`AgentSpec.build` compiles the graph. ``tcrag ask``, ``tcrag serve``, Studio,
``tcrag eval`` and ``tcrag calibrate`` all build their agents here, so a model name, a ``--scorer``
or ``sigma="auto"`` means the same on every face and is resolved once per run.

Every problem with what the user gave is a :class:`UserError` (``kind: message`` on one line, the
flag it concerns in :attr:`UserError.flag`); the command line prints it without a traceback.

Example:
    >>> spec = AgentSpec(method="base", tools="none")
    >>> spec.config.max_steps  # the faces' bounded budgets (FACE_DEFAULTS)
    4
"""

from __future__ import annotations

import importlib
import os
from typing import Any, NamedTuple, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..core.config import TCRAGConfig

__all__ = ["AgentSpec", "AgentParts", "UserError", "FACE_DEFAULTS", "TOOL_PRESETS", "one_line", "api_key_from_env",
           "resolve_auto_sigma", "load_factory", "ENV"]

#: Where every face differs from TCRAGConfig's (paper) defaults, and why: the paper's 500 new tokens
#: and 12 steps are for a 32B model. A reply holds one action (generation stops at the next label)
#: and the packaged 135M model's unusable replies run to the limit, so 64 tokens. 4 steps (then the
#: final Conclusion): the 1.5B does not conclude an open question before the budget asks it to, so
#: the budget is the answer's latency; 4 instead of 6 took the main job's median from 14.9 s to
#: 10.1 s with 5 of 5 answers right (3 of 5 at 6), and 30 MedMCQA calibration questions with the
#: four tools from 10.5 to 8.4 s each, 11 right against 13 (+1/-3, McNemar p = 0.63)
#: (benchmarks/RESULTS.md section 25). ``tcrag ask``, ``tcrag serve`` and Studio start from these;
#: ``tcrag eval`` reproduces the paper and starts from TCRAGConfig's own.
FACE_DEFAULTS: dict[str, Any] = {"max_new_tokens": 64, "max_steps": 4}

#: the tool sets ``tools=`` names (comma-separated; or ``module:callable`` returning tools)
TOOL_PRESETS = ("none", "default", "docs", "web")

#: Studio (``langgraph dev``) has no command line: these environment variables name what the flags
#: of ``tcrag ask`` do (field of AgentSpec -> variable)
ENV: dict[str, str] = {
    "model": "TCRAG_MODEL", "base_url": "TCRAG_BASE_URL", "api_key_env": "TCRAG_API_KEY_ENV",
    "scorer": "TCRAG_SCORER", "scorer_model": "TCRAG_SCORER_MODEL", "scorer_start_text": "TCRAG_SCORER_START_TEXT",
    "es_url": "TCRAG_ES_URL", "es_index": "TCRAG_ES_INDEX", "method": "TCRAG_METHOD",
}


class UserError(Exception):
    """A problem with what the user gave: shown as ``<kind>: <message>`` on one line, exit status 2.
    ``flag`` is the option it concerns, where there is one."""

    def __init__(self, kind: str, message: str, *, flag: Optional[str] = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = one_line(message)
        self.flag = flag


def one_line(text: Any, limit: int = 600) -> str:
    """``text`` on one line (whitespace collapsed), cut at ``limit`` characters.

    Example:
        >>> one_line("a\\n  b\\tc")
        'a b c'
    """
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def validation_line(exc: Any) -> str:
    """The first message of a pydantic ValidationError, without pydantic's dump."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "value"
            return f"{where}: {str(first.get('msg', '')).removeprefix('Value error, ')}"
        except (IndexError, TypeError, AttributeError):
            pass
    return one_line(exc)


def api_key_from_env(name: Optional[str], *, flag: str = "--api-key-env") -> Optional[str]:
    """The key held by environment variable ``name`` (:func:`~tcrag_langgraph.models.credentials.key_from_env`);
    None without a name. A spec names the variable, never holds the key.

    Example:
        >>> api_key_from_env(None) is None
        True
    """
    from ..models.credentials import MissingCredentialsError, key_from_env

    try:
        return key_from_env(name, flag=flag)
    except MissingCredentialsError as exc:
        raise UserError("Missing credentials", str(exc), flag=flag) from None
    except ValueError as exc:
        raise UserError("Invalid option", str(exc), flag=flag) from None


def _factory(spec: str) -> Any:
    """The callable ``module:attr`` names, or ``None`` when it names none (then it may be a provider)."""
    module_name, _, attr = spec.partition(":")
    if not attr or not all(part.isidentifier() for part in module_name.split(".")):
        return None
    try:
        found = getattr(importlib.import_module(module_name), attr, None)
    except ImportError:
        return None
    return found if callable(found) else None


def load_factory(spec: str, *, flag: str) -> Any:
    """``"package.module:callable"`` -> the callable's result (a chat model, tools or a scorer).

    Example:
        >>> load_factory("builtins:list", flag="--tools")
        []
    """
    found = _factory(spec)
    if found is None:
        raise UserError("Invalid option", f"{flag} {spec!r} is not a preset and no module:callable that can be "
                                          "imported", flag=flag)
    return found()


def resolve_auto_sigma(config: TCRAGConfig, generator: Any, *, flag: str = "--sigma") -> TCRAGConfig:
    """``config`` with ``sigma="auto"`` replaced by the state value and sigma of the generator's stored
    calibration (:func:`~tcrag_langgraph.monitor.calibration.resolve_monitor`); other configs as they are.
    A missing calibration is a :class:`UserError`, before any model loads."""
    if config.sigma != "auto":
        return config
    from ..models.local import chat_model_id
    from ..monitor.calibration import resolve_monitor

    try:
        metric, sigma = resolve_monitor(config, chat_model_id(generator))
    except (ValueError, FileNotFoundError) as exc:  # a CalibrationNotFoundError, or a model without an id
        raise UserError("Not calibrated", f"{flag} auto: {exc}", flag=flag) from None
    return config.merged({"metric": metric, "sigma": sigma})


def monitor_refusal() -> UserError:
    """The refusal for a generator without a monitor, in the command line's words."""
    return UserError("No state monitor", "this model exposes no prompt log-probs the monitor can trust. Give "
                     "--scorer http://HOST:PORT/v1 (a vLLM or SGLang completions server of the same model; "
                     "--scorer-model NAME if it serves it under another name), --scorer PATH (a local copy of the "
                     "same weights), --scorer module:function, a state value read off the replies' own log-probs (--metric "
                     "gen_answer_prob or gen_cppl, for servers that return them), one that needs no log-probs (--metric "
                     "consistency: the model's own resampled answers), or turn the monitor off (--no-state-monitor, "
                     "or a method without it: wo-monitor, react, base, cot, sr-rag).", flag="--scorer")


class AgentParts(NamedTuple):
    """What a graph is built from, every check passed and nothing loaded yet."""

    model: Any
    tools: list[Any]
    scorer: Any
    config: TCRAGConfig


class AgentSpec(BaseModel):
    """An agent in a user's words (see the module docstring). Holds no secret: keys are named by the
    environment variables that hold them (``api_key_env``, ``es_api_key_env``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    method: str = Field(default="tcrag", description="a method of the registry (tcrag_langgraph.METHODS) or tcrag")
    model: Optional[str] = Field(default=None, description="None or 'local' (the packaged model), a model folder, "
                                 "a .gguf file, a pulled catalogue name (tcrag pull), 'provider:name', or "
                                 "'module:callable' returning a chat model")
    script: Optional[str] = Field(default=None, description="a script (JSON file or text) replacing the model, its "
                                  "monitor and its tools (tcrag_langgraph.testing): demos and tests")
    backend: Optional[str] = None
    device: Optional[str] = None
    dtype: Optional[str] = None
    threads: Optional[int] = Field(default=None, ge=1)
    seed: Optional[int] = None
    base_url: Optional[str] = Field(default=None, description="a served model's API address")
    api_key_env: Optional[str] = Field(default=None, description="the variable holding the served model's key")
    scorer: Optional[str] = Field(default=None, description="the state monitor: None or 'local' (the generator's own "
                                  "weights, the ones it generates with), 'f16' (a GGUF's float16 re-encoding: the "
                                  "reference, a second copy of the weights), 'native' (its quantized weights), a "
                                  "completions server address, a model folder or .gguf file, or 'module:callable' "
                                  "returning a scorer")
    scorer_model: Optional[str] = None
    scorer_start_text: str = ""
    tools: str = Field(default="default", description="comma-separated presets (none, default, docs, web) or "
                       "'module:callable' returning tools")
    exclude_doc_ids: tuple[str, ...] = Field(default=(), description="documents the docs tool must not return")
    es_url: Optional[str] = Field(default=None, description="search documents in this Elasticsearch server")
    es_index: str = "tcrag-docs"
    es_api_key_env: Optional[str] = None
    config: TCRAGConfig = Field(default_factory=lambda: TCRAGConfig(**FACE_DEFAULTS))

    @model_validator(mode="after")
    def _script_replaces_the_model(self) -> "AgentSpec":
        # a script replaces the model and its monitor: a model option beside it would be silently ignored
        if self.script is not None:
            given = [f"--{name.replace('_', '-')}" for name in ("model", "device", "dtype", "backend", "base_url",
                                                                  "scorer")
                     if getattr(self, name) is not None]
            if given:
                raise ValueError("--scripted replaces the model and its monitor: do not combine it with "
                                 + ", ".join(given))
        return self

    @classmethod
    def create(cls, **values: Any) -> "AgentSpec":
        """:class:`AgentSpec` with a bad value as a :class:`UserError` (the option named as a flag)."""
        from pydantic import ValidationError

        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = "--" + ".".join(str(p) for p in first["loc"]).replace("_", "-") if first["loc"] else "options"
            message = str(first["msg"]).removeprefix("Value error, ")
            raise UserError("Invalid option", message if message.startswith("--") else f"{where}: {message}",
                            flag=where) from None

    @classmethod
    def from_env(cls, *, method: str, tools: bool = True, environ: Optional[dict[str, str]] = None,
                 **values: Any) -> "AgentSpec":
        """The spec Studio serves: its model, monitor and document store named by :data:`ENV`."""
        env = os.environ if environ is None else environ
        given = {field: env[name] for field, name in ENV.items() if field != "method" and env.get(name)}
        return cls.create(method=method, tools="default" if tools else "none", **given, **values)

    # ----- the parts -----
    def generator(self) -> Any:
        """The chat model :attr:`model` names, with the config's generation settings; nothing is loaded."""
        from ..models.catalogue import ModelNotPulledError
        from ..models.local import LocalChatModel
        from ..models.weights import DTYPES, LocalModelError, device_syntax
        from ..models.resolve import looks_like_path, resolve_chat_model

        if self.dtype is not None and self.dtype not in DTYPES:
            raise UserError("Invalid option", f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}",
                            flag="--dtype")
        device = self.device
        if device is not None:
            try:
                device = device_syntax(device)
            except ValueError as exc:
                raise UserError("Invalid option", f"--device: {exc}", flag="--device") from None
        name = None if self.model in (None, "local") else self.model
        if name is not None and ":" in name and (factory := _factory(name)) is not None:
            return factory()
        api_key = api_key_from_env(self.api_key_env)
        served = {k: v for k, v in (("base_url", self.base_url), ("api_key", api_key)) if v is not None}
        if served and (name is None or ":" not in name or looks_like_path(name)):
            raise UserError("Invalid option", "--base-url and --api-key-env apply to served models named "
                                              "'provider:model' (e.g. --model openai:NAME)", flag="--base-url")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise UserError("Invalid option", "--base-url must be an http(s) address such as "
                                              f"http://127.0.0.1:8000/v1, not {self.base_url!r}", flag="--base-url")
        cfg = self.config
        try:
            chat = resolve_chat_model(name, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                      device=device, dtype=self.dtype, backend=self.backend, **served)
        except ModelNotPulledError as exc:  # a catalogue name: say how to get it (nothing downloads implicitly)
            raise UserError("Model not pulled", str(exc), flag="--model") from None
        except ValueError as exc:
            raise UserError("Invalid model", f"{one_line(validation_line(exc), 400)} (a model is a folder, a .gguf "
                                             "file, a catalogue name, provider:name or module:callable)",
                            flag="--model") from None
        except Exception as exc:  # the provider's own client refused to start (e.g. no API key)
            text = one_line(exc)
            if any(word in text.lower() for word in ("api_key", "credential", "api key")):
                raise UserError("Missing credentials", f"{name}: {text} Give --api-key-env NAME, the environment "
                                                       "variable holding the key.", flag="--api-key-env") from None
            raise UserError("Model error", f"{name}: {type(exc).__name__}: {text}", flag="--model") from None
        if device is not None and device != "cpu" and isinstance(chat, LocalChatModel):
            try:
                chat.check_device()  # asked of the backend that will run it: torch, or the llama.cpp build
            except LocalModelError as exc:
                raise UserError("Invalid option", f"--device: {exc}", flag="--device") from None
        if isinstance(chat, LocalChatModel) and self.seed is not None:
            chat.seed = self.seed
        if self.threads is not None and hasattr(chat, "n_threads"):  # llama.cpp's (torch's: set by the caller)
            chat.n_threads = self.threads
        return chat

    def monitor(self, generator: Any, *, own: bool = False) -> Any:
        """The scorer :attr:`scorer` names. For the generator's own weights: ``None`` (each method then
        scores with them, and says where the package's calibration finds they cannot judge), or with
        ``own`` the scorer over them (:func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`; it
        loads nothing), refused for a generator without trusted log-probs."""
        spec = (self.scorer or "").strip()
        if spec in ("", "local"):
            if not own:
                return None
            from ..monitor.own_model import scorer_for_model
            from ..monitor.scoring import MonitorUnavailableError

            try:
                return scorer_for_model(generator)
            except MonitorUnavailableError:
                raise monitor_refusal() from None
        if spec in ("native", "f16"):  # a GGUF's quantized weights as llama.cpp runs them, or its float16 copy
            from ..models.llama_cpp import LlamaCppChatModel
            from ..monitor.llama_cpp import LlamaCppScorer

            if not isinstance(generator, LlamaCppChatModel):
                raise UserError("Invalid option", f"--scorer {spec} scores with the GGUF llama.cpp runs: it needs a "
                                                  ".gguf model on the llama.cpp backend", flag="--scorer")
            return LlamaCppScorer(chat_model=generator, precision=spec)
        if not spec.startswith(("http://", "https://")) and ":" in spec and _factory(spec) is not None:
            return load_factory(spec, flag="--scorer")
        from ..monitor.from_spec import scorer_from_spec

        try:
            return scorer_from_spec(spec, generator=generator, served_model=self.scorer_model,
                                    api_key=api_key_from_env(self.api_key_env), start_text=self.scorer_start_text)
        except ValueError as exc:
            raise UserError("Invalid option", f"--scorer: {exc} (or module:callable returning a scorer)",
                            flag="--scorer") from None

    def tool_list(self, given: Optional[Sequence[Any]] = None) -> list[Any]:
        """The tools :attr:`tools` names (or ``given``, a script's); with :attr:`es_url` the document tool
        searches that Elasticsearch index (``tcrag index ... --es-url URL`` builds it)."""
        parts = [p.strip() for p in self.tools.split(",") if p.strip()]
        store = self._es_store(parts if given is None else ["default"])
        if given is not None:
            if store is None:
                return list(given)
            from ..tools.documents import document_tool

            es_tool = document_tool(store)  # a scripted model driving the real Elasticsearch document tool
            return [es_tool, *(t for t in given if t.name != es_tool.name)]
        exclude = list(self.exclude_doc_ids) or None
        tools: list[Any] = []
        for part in parts:
            if part == "none":
                continue
            if part == "default":
                from ..tools import default_tools
                from ..tools.documents import default_document_tool, document_tool

                # the held-out documents apply to the document tool of the default set as to "docs"
                documents = (document_tool(store, exclude_ids=exclude) if store is not None
                             else default_document_tool(exclude_ids=exclude))
                tools.extend([documents, *default_tools(documents=False)])
            elif part == "docs":
                from ..tools.documents import default_document_tool, document_tool

                tools.append(document_tool(store, exclude_ids=exclude, mode="bm25") if store is not None
                             else default_document_tool(exclude_ids=exclude, mode="bm25"))
            elif part == "web":
                from ..tools.web_search import default_web_tool

                tools.append(default_web_tool())
            else:
                made = load_factory(part, flag="--tools")
                tools.extend(made if isinstance(made, (list, tuple)) else [made])
        return tools

    def _es_store(self, parts: list[str]) -> Any:
        if not self.es_url:
            return None
        if not {"default", "docs"} & set(parts):
            raise UserError("Invalid option", "--es-url selects the document store of the tools: use it with the "
                                              "default or docs tools", flag="--es-url")
        if not self.es_url.startswith(("http://", "https://")):
            raise UserError("Invalid option", "--es-url must be an http(s) address such as http://127.0.0.1:9200, "
                                              f"not {self.es_url!r}", flag="--es-url")
        from ..tools.elasticsearch_store import ElasticsearchStore

        try:
            return ElasticsearchStore(self.es_url, index=self.es_index,
                                      api_key=api_key_from_env(self.es_api_key_env, flag="--es-api-key-env"))
        except ValueError as exc:
            raise UserError("Invalid option", f"--es-url / --es-index: {exc}", flag="--es-url") from None

    def assemble(self, methods: Optional[Sequence[str]] = None, *, share_monitor: bool = False) -> AgentParts:
        """The model, tools, monitor and config of a run of ``methods`` (default: :attr:`method`), every
        check passed and nothing loaded; ``sigma="auto"`` is resolved here, once. With ``share_monitor``
        the methods that read scores share one monitor made here (an evaluation compares them on one).
        A model without log-probs to trust is refused when a method that needs them is built (TC-RAG
        with no state value set falls back to ``consistency``, which needs none)."""
        names = list(methods) if methods is not None else [self.method]
        for name in names:
            check_method(name)
        if self.script is not None:
            return self._scripted()
        chat = self.generator()
        scorer = self.monitor(chat)
        if scorer is None and share_monitor and _reads_scores(names):
            try:
                scorer = self.monitor(chat, own=True)
            except UserError:  # no log-probs to trust: each method decides when it is built (a sampled
                scorer = None  # state value needs none; a log-prob one is refused there)
        config = resolve_auto_sigma(self.config, chat)  # refused before the tools open or write anything
        return AgentParts(chat, self.tool_list(), scorer, config)

    @staticmethod
    def base_config(script: Optional[str] = None) -> TCRAGConfig:
        """What a face's flags apply over: the faces' budgets (:data:`FACE_DEFAULTS`), with a script's
        own settings over them."""
        config = TCRAGConfig(**FACE_DEFAULTS)
        if script is None:
            return config
        own = _scripted_components(script)["config"]
        return config.merged({k: getattr(own, k) for k in own.model_fields_set})

    def _scripted(self) -> AgentParts:
        parts = _scripted_components(self.script)  # its settings are in self.config (base_config)
        return AgentParts(parts["model"], self.tool_list(given=parts["tools"]), parts["scorer"], self.config)

    def build(self, parts: Optional[AgentParts] = None, *, method: Optional[str] = None, **build_options: Any) -> Any:
        """The compiled graph of ``method`` (default: :attr:`method`) over ``parts`` (default:
        :meth:`assemble`'s); ``build_options`` go to :func:`~tcrag_langgraph.methods.registry.build_method`
        (``sigmas``, ``documents``, ``options``, ``checkpointer``, ...). Every refusal is a :class:`UserError`."""
        from ..methods.registry import build_method
        from ..monitor.scoring import MonitorUnavailableError

        name = method or self.method
        check_method(name)
        parts = parts if parts is not None else self.assemble([name])
        try:
            return build_method(name, model=parts.model, tools=parts.tools, scorer=parts.scorer, config=parts.config,
                                **build_options)
        except MonitorUnavailableError:
            raise monitor_refusal() from None
        except FileNotFoundError as exc:  # a stored calibration (sigma or a method's threshold "auto") that is missing
            raise UserError("Not calibrated", str(exc), flag="--method") from None
        except (ValueError, TypeError) as exc:
            raise UserError("Cannot build the agent", validation_line(exc), flag="--method-options") from None


def check_method(method: str) -> None:
    """``method`` must be ``tcrag`` or a registry name."""
    from ..methods.registry import DEFAULT_METHOD, METHOD_NAMES

    if method != DEFAULT_METHOD and method not in METHOD_NAMES:
        raise UserError("Invalid option", f"--method {method!r} is not a method; choose from "
                                          f"{', '.join((DEFAULT_METHOD, *METHOD_NAMES))}", flag="--method")


def _scripted_components(script: str) -> dict[str, Any]:
    from ..testing import scripted_components

    try:
        return scripted_components(script)
    except (OSError, ValueError) as exc:
        raise UserError("Invalid script", one_line(exc), flag="--scripted") from None


def _reads_scores(names: Sequence[str]) -> bool:
    from ..methods.registry import METHODS

    return any(METHODS[name].uses_scorer for name in names)
