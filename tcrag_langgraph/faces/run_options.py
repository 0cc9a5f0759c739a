"""What the faces (``tcrag ask``, ``tcrag serve``, Studio) share to set a run up from a user's words:
the bounded budgets they default to, the generator (local or served, with ``--base-url`` and a key
read from ``--api-key-env``), the state monitor (``--scorer``), the tools (``--es-url`` selects the
Elasticsearch document store), the method (``--method``, the registry's names), and one-line
refusals for every user error (:class:`UserError`): never a traceback.

Nothing here loads a model: loading happens on the first call, after every check has passed.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

__all__ = ["FACE_DEFAULTS", "ES_URL_ENV", "ES_INDEX_ENV", "ES_API_KEY_ENV", "METHOD_ENV", "MODEL_ENV",
           "BASE_URL_ENV", "API_KEY_ENV_ENV", "SCORER_ENV", "SCORER_MODEL_ENV", "SCORER_START_ENV",
           "UserError", "one_line", "api_key_from_env", "make_generator", "make_scorer", "make_tools",
           "check_sigma", "check_method", "build_for_face", "monitor_refusal", "scripted_run"]

#: Where every face differs from TCRAGConfig's (paper) defaults, and why: the paper's 500 new tokens
#: and 12 steps are for a 32B model. A reply holds one action (generation stops at the next label)
#: and the packaged 135M model's unusable replies run to the limit; each step costs ~8 CPU seconds on
#: a 2-core machine, so 64 tokens and 6 steps (then the final Conclusion) keep an answer near a
#: minute (benchmarks/RESULTS.md, "main job"). ``tcrag ask``, ``tcrag serve`` and Studio all start
#: from these; their flags (or a run's context) set them back.
FACE_DEFAULTS: dict[str, Any] = {"max_new_tokens": 64, "max_steps": 6}

#: environment variables the faces read (the flag, where there is one, wins)
ES_URL_ENV = "TCRAG_ES_URL"
ES_INDEX_ENV = "TCRAG_ES_INDEX"
ES_API_KEY_ENV = "TCRAG_ES_API_KEY"
METHOD_ENV = "TCRAG_METHOD"
MODEL_ENV = "TCRAG_MODEL"
#: Studio (``langgraph dev``) has no command line: these name its model and monitor as
#: ``--base-url``, ``--api-key-env``, ``--scorer``, ``--scorer-model`` and ``--scorer-start-text`` do
BASE_URL_ENV = "TCRAG_BASE_URL"
API_KEY_ENV_ENV = "TCRAG_API_KEY_ENV"
SCORER_ENV = "TCRAG_SCORER"
SCORER_MODEL_ENV = "TCRAG_SCORER_MODEL"
SCORER_START_ENV = "TCRAG_SCORER_START_TEXT"

class UserError(Exception):
    """A problem with what the user gave: shown as ``<kind>: <message>`` on one line, exit status 2."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = one_line(message)


def one_line(text: Any, limit: int = 600) -> str:
    """``text`` on one line (whitespace collapsed), cut at ``limit`` characters.

    Example:
        >>> one_line("a\\n  b\\tc")
        'a b c'
    """
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _validation_line(exc: Any) -> str:
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
    None without a name.

    Example:
        >>> api_key_from_env(None) is None
        True
    """
    from ..models.credentials import MissingCredentialsError, key_from_env

    try:
        return key_from_env(name, flag=flag)
    except MissingCredentialsError as exc:
        raise UserError("Missing credentials", str(exc)) from None
    except ValueError as exc:
        raise UserError("Invalid option", str(exc)) from None


def _is_provider_name(model: Optional[str]) -> bool:
    if model is None:
        return False
    from ..models.resolve import looks_like_path

    return ":" in model and not looks_like_path(model)


def make_generator(model: Optional[str], *, base_url: Optional[str] = None, api_key: Optional[str] = None,
                   device: Optional[str] = None, dtype: Optional[str] = None, max_new_tokens: Optional[int] = None,
                   temperature: Optional[float] = None, seed: Optional[int] = None, backend: Optional[str] = None,
                   threads: Optional[int] = None) -> Any:
    """The chat model ``model`` names (see :func:`~tcrag_langgraph.models.resolve.resolve_chat_model`),
    every problem a :class:`UserError`; nothing is loaded."""
    from ..models.local import DTYPES, LocalChatModel, LocalModelError, device_syntax
    from ..models.resolve import resolve_chat_model

    if dtype is not None and dtype not in DTYPES:
        raise UserError("Invalid option", f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if device is not None:
        try:
            device = device_syntax(device)
        except ValueError as exc:
            raise UserError("Invalid option", f"--device: {exc}") from None
    served = {k: v for k, v in (("base_url", base_url), ("api_key", api_key)) if v is not None}
    if served and not _is_provider_name(model):
        raise UserError("Invalid option", "--base-url and --api-key-env apply to served models named "
                                          "'provider:model' (e.g. --model openai:NAME)")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise UserError("Invalid option", f"--base-url must be an http(s) address such as http://127.0.0.1:8000/v1, "
                                          f"not {base_url!r}")
    try:
        chat = resolve_chat_model(model, max_new_tokens=max_new_tokens, temperature=temperature, device=device,
                                  dtype=dtype, backend=backend, **served)
    except ValueError as exc:
        raise UserError("Invalid model", _validation_line(exc)) from None
    except Exception as exc:  # the provider's own client refused to start (e.g. no API key)
        text = one_line(exc)
        if "api_key" in text.lower() or "credential" in text.lower() or "api key" in text.lower():
            raise UserError("Missing credentials", f"{model}: {text} Give --api-key-env NAME, the environment "
                                                   "variable holding the key.") from None
        raise UserError("Model error", f"{model}: {type(exc).__name__}: {text}") from None
    if device is not None and device != "cpu" and isinstance(chat, LocalChatModel):
        try:
            chat.check_device()  # asked of the backend that will run it: torch, or the llama.cpp build
        except LocalModelError as exc:
            raise UserError("Invalid option", f"--device: {exc}") from None
    if isinstance(chat, LocalChatModel) and seed is not None:
        chat.seed = seed
    if threads is not None and hasattr(chat, "n_threads"):  # llama.cpp's threads (torch's are set by the caller)
        chat.n_threads = threads
    return chat


def make_scorer(spec: Optional[str], *, generator: Any, served_model: Optional[str] = None,
                api_key: Optional[str] = None, start_text: str = "") -> Any:
    """The state monitor ``--scorer`` names (:func:`~tcrag_langgraph.monitor.from_spec.scorer_from_spec`),
    None for the generator's own weights."""
    from ..monitor.from_spec import scorer_from_spec

    try:
        return scorer_from_spec(spec, generator=generator, served_model=served_model, api_key=api_key,
                                start_text=start_text)
    except ValueError as exc:
        raise UserError("Invalid option", f"--scorer: {exc}") from None


def make_tools(enabled: bool = True, *, es_url: Optional[str] = None, es_index: Optional[str] = None,
               es_api_key: Optional[str] = None) -> list[Any]:
    """The default tools; with ``es_url`` the document tool searches that Elasticsearch index
    (``tcrag index ... --es-url URL`` builds it) instead of the embedded store."""
    if not enabled:
        if es_url:
            raise UserError("Invalid option", "--es-url selects the document store of the tools; it needs --tools")
        return []
    from ..tools import default_tools

    if not es_url:
        return list(default_tools())
    from ..tools.documents import document_tool
    from ..tools.elasticsearch_store import ElasticsearchStore

    if not es_url.startswith(("http://", "https://")):
        raise UserError("Invalid option", f"--es-url must be an http(s) address such as http://127.0.0.1:9200, "
                                          f"not {es_url!r}")
    try:
        store = ElasticsearchStore(es_url, index=es_index or os.environ.get(ES_INDEX_ENV) or "tcrag-docs",
                                   api_key=es_api_key)
    except ValueError as exc:
        raise UserError("Invalid option", f"--es-url / --es-index: {exc}") from None
    return [document_tool(store), *default_tools(documents=False)]


def check_sigma(cfg: Any, generator: Any) -> None:
    """``sigma="auto"`` needs a stored calibration of this generator: checked before anything loads."""
    if cfg.sigma != "auto":
        return
    from ..models.local import chat_model_id
    from ..monitor.calibration import CalibrationNotFoundError, resolve_monitor

    try:
        resolve_monitor(cfg, chat_model_id(generator))  # what the graph build will resolve
    except CalibrationNotFoundError as exc:
        raise UserError("Not calibrated", f"--sigma auto: {exc}") from None
    except ValueError as exc:
        raise UserError("Not calibrated", f"--sigma auto: {exc}") from None


def monitor_refusal(exc: BaseException) -> UserError:
    """The refusal for a generator without a monitor, in the command line's words."""
    return UserError("No state monitor", "this model exposes no prompt log-probs the monitor can trust. Give "
                     "--scorer http://HOST:PORT/v1 (a vLLM or SGLang completions server of the same model; "
                     "--scorer-model NAME if it serves it under another name), --scorer PATH (a local copy of the "
                     "same weights), or turn the monitor off with --no-state-monitor.")


def check_method(method: str) -> None:
    """``method`` must be :data:`~tcrag_langgraph.methods.registry.DEFAULT_METHOD` or a registry name."""
    from ..methods.registry import DEFAULT_METHOD, METHOD_NAMES

    if method != DEFAULT_METHOD and method not in METHOD_NAMES:
        raise UserError("Invalid option", f"--method {method!r} is not a method; choose from "
                                          f"{', '.join((DEFAULT_METHOD, *METHOD_NAMES))}")


def scripted_run(script: str, **model_flags: Any) -> dict[str, Any]:
    """The components of a ``--scripted`` run (:func:`tcrag_langgraph.testing.scripted_components`).
    A script replaces the model and its monitor, so a model flag given beside it (``model_flags``:
    flag name without dashes -> value, ``None`` when not given) is refused rather than ignored."""
    given = [f"--{name.replace('_', '-')}" for name, value in model_flags.items() if value is not None]
    if given:
        raise UserError("Invalid option", "--scripted replaces the model and its monitor: do not combine it "
                                          f"with {', '.join(given)}")
    from ..testing import scripted_components

    try:
        return scripted_components(script)
    except (OSError, ValueError) as exc:
        raise UserError("Invalid script", one_line(exc)) from None


def build_for_face(method: str, *, model: Any, tools: list[Any], scorer: Any, config: Any,
                   **build_options: Any) -> Any:
    """The compiled graph of registry method ``method``, every refusal a :class:`UserError`."""
    from ..methods.registry import build_method
    from ..monitor.scoring import MonitorUnavailableError

    check_method(method)
    try:
        return build_method(method, model=model, tools=tools, scorer=scorer, config=config, **build_options)
    except MonitorUnavailableError as exc:
        raise monitor_refusal(exc) from None
    except FileNotFoundError as exc:  # a stored calibration (sigma auto) that is missing
        raise UserError("Not calibrated", str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise UserError("Cannot build the agent", _validation_line(exc)) from None


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
