"""The state monitor a user names on a command line or in a setting (``--scorer SPEC``).

* ``None`` or ``"local"``: no scorer here, so the builder scores with the generator's own weights
  (:func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`) and refuses a generator without any;
* ``"http://..."`` / ``"https://..."``: the API root of an OpenAI-compatible completions server that
  echoes prompt log-probs (vLLM, SGLang): :class:`~tcrag_langgraph.monitor.served.CompletionsLogprobScorer`
  for ``served_model`` (default: the generator's own model name, the usual case of one server for both);
* a transformers folder, a ``.gguf`` file or a pulled catalogue name (``tcrag pull``): :class:`~tcrag_langgraph.monitor.scoring.LocalLMScorer`
  over those weights (loaded on the first score).

Anything else is a ValueError saying what is accepted.

Example:
    >>> scorer_from_spec("local") is None
    True
    >>> scorer_from_spec("http://127.0.0.1:8000/v1", served_model="qwen")
    CompletionsLogprobScorer('http://127.0.0.1:8000/v1/completions', model='qwen')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

__all__ = ["scorer_from_spec", "SCORER_SPEC_HELP"]

#: what ``--scorer`` accepts, in a user's words (the faces' and the evaluation's help text)
SCORER_SPEC_HELP = ("The state monitor: 'local' (the model's own weights), the address of a vLLM or SGLang "
                    "completions server that returns prompt log-probs (e.g. http://127.0.0.1:8000/v1), "
                    "or a local model folder or .gguf file with the same weights.")


def scorer_from_spec(spec: Optional[str], *, generator: Any = None, served_model: Optional[str] = None,
                     api_key: Optional[str] = None, start_text: str = "") -> Any:
    """The scorer ``spec`` names (see the module docstring); ``None`` for ``"local"``."""
    if spec is None or spec.strip() in ("", "local"):
        return None
    spec = spec.strip()
    if spec.startswith(("http://", "https://")):
        from .served import CompletionsLogprobScorer

        name = served_model
        if not name:
            name = _served_name(generator)
        if not name:
            raise ValueError("a served scorer needs the served model's name: give --scorer-model NAME")
        return CompletionsLogprobScorer(spec, model=name, api_key=api_key, start_text=start_text)
    from ..models.catalogue import catalogue_model_path

    pulled = catalogue_model_path(spec)  # a catalogue name: its pulled file (a ValueError if not pulled)
    path = pulled if pulled is not None else Path(spec).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file() or (path / "config.json").is_file():
        from .scoring import LocalLMScorer

        return LocalLMScorer(model_path=str(path))
    raise ValueError(f"scorer {spec!r} is not 'local', an http(s):// completions server address, a transformers "
                     "model folder, a .gguf file or a pulled catalogue name")


def _served_name(generator: Any) -> Optional[str]:
    """The model name a served chat model sends (``model_name`` / ``model``), else None."""
    for attr in ("model_name", "model"):
        value = getattr(generator, attr, None)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None
