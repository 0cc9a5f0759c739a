"""Which state scorer a generator gets when none is given: one over the generator's OWN weights
(:func:`scorer_for_model`), never a different model silently. Its own module because it chooses
between :mod:`.scoring` (transformers) and :mod:`.llama_cpp`, which builds on it."""

from __future__ import annotations

import threading
from typing import Any

from ..models.local import LocalChatModel
from ..models.weights import LocalModel
from .scoring import LocalLMScorer, MonitorUnavailableError, StateScorer

__all__ = ["scorer_for_model", "has_own_monitor", "scores_own_weights"]


def _hf_pipeline_of(model: Any) -> Any:
    """The ``transformers`` pipeline behind a langchain-huggingface ``HuggingFacePipeline`` or a
    ``ChatHuggingFace`` over one; ``None`` for anything else (or without langchain-huggingface)."""
    try:
        from langchain_huggingface import ChatHuggingFace, HuggingFacePipeline
    except ImportError:  # pragma: no cover - langchain-huggingface is a dependency
        return None
    llm = model.llm if isinstance(model, ChatHuggingFace) else model
    if isinstance(llm, HuggingFacePipeline) and getattr(llm, "pipeline", None) is not None:
        return llm.pipeline
    return None


def scorer_for_model(model: Any, **scorer_options: Any) -> StateScorer:
    """The state monitor for a generator: a scorer over the generator's OWN weights.

    * :class:`~tcrag_langgraph.models.llama_cpp.LlamaCppChatModel` (a GGUF run by llama.cpp):
      :class:`~tcrag_langgraph.monitor.llama_cpp.LlamaCppScorer` over the same loaded weights
      (llama.cpp's own logits; the transformers scorer if the model fell back to transformers);
    * :class:`~tcrag_langgraph.models.local.LocalChatModel`: :class:`LocalLMScorer` over its local model,
      loaded lazily on the first score (building a graph loads nothing);
    * langchain-huggingface ``HuggingFacePipeline``, or ``ChatHuggingFace`` over one:
      :class:`LocalLMScorer` over the pipeline's own ``model`` and ``tokenizer`` (same objects);
    * anything else (a served model such as ``ChatOpenAI``, ``ChatOllama``, a scripted model):
      :class:`MonitorUnavailableError`. An endpoint's prompt log-probs are not trusted by default
      (llama-cpp-python returns wrong ones, see docs/models.md); pass ``scorer=`` explicitly, e.g.
      ``CompletionsLogprobScorer(base_url, model=...)`` for a vLLM/SGLang server or a
      ``LocalLMScorer(model_path=...)`` over the same weights, or turn the monitor off.

    ``scorer_options`` go to :class:`LocalLMScorer` (``uct_given_query``, ``max_tokens``,
    ``prefix_cache``).

    Example:
        >>> from tcrag_langgraph.models.local import LocalChatModel
        >>> isinstance(scorer_for_model(LocalChatModel()), LocalLMScorer)
        True
    """
    # imported here, not at the top: the llama.cpp modules load only when a graph is built
    from ..models.llama_cpp import LlamaCppChatModel  # (a LocalChatModel subclass: checked first)
    from .llama_cpp import LlamaCppScorer

    scorer: StateScorer
    if isinstance(model, LlamaCppChatModel):  # llama.cpp's own logits over the very weights it generates with
        # one copy of the weights: the float16 re-encoding where generation runs on it (the packaged
        # model), else the quantized file (as good at telling right from wrong answers on the 1.5B,
        # benchmarks/RESULTS.md section 15, at 2.2 GB instead of 5.6); --scorer f16 keeps the reference
        options = {"precision": "f16" if model.generates_float16 else "native", **scorer_options}
        scorer = LlamaCppScorer(chat_model=model, **options)
    elif isinstance(model, LocalChatModel):
        scorer = LocalLMScorer(model_loader=lambda: model.local_model, **scorer_options)
    elif (pipe := _hf_pipeline_of(model)) is not None:
        name = str(getattr(pipe.model, "name_or_path", "") or type(pipe.model).__name__)
        shared = LocalModel(model=pipe.model, tokenizer=pipe.tokenizer, name=name, lock=threading.RLock())
        scorer = LocalLMScorer(shared, **scorer_options)
    else:
        raise MonitorUnavailableError(
            f"the state monitor cannot score with the generator's own model: {type(model).__name__} exposes "
            "no prompt log-probs that this package can trust. Options: pass scorer= "
            "(e.g. CompletionsLogprobScorer(base_url, model=...) for a vLLM or SGLang server of the same "
            "model, or LocalLMScorer(model_path=...) over the same weights), a state value that needs no log-probs "
            "(TCRAGConfig(metric='consistency'): the model's own resampled answers), or turn the monitor off with "
            "TCRAGConfig(enable_state_monitor=False)."
        )
    # what the package's calibrations measured: the generator as its own monitor (scores_own_weights)
    scorer.own_generator = model  # type: ignore[attr-defined]
    return scorer


def has_own_monitor(model: Any) -> bool:
    """Whether :func:`scorer_for_model` can score with ``model``'s own weights (nothing is loaded).

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> has_own_monitor(FakeListChatModel(responses=["x"]))
        False
    """
    try:
        scorer_for_model(model)
    except MonitorUnavailableError:
        return False
    return True


def scores_own_weights(scorer: Any, model: Any) -> bool:
    """Whether ``scorer`` is :func:`scorer_for_model`'s scorer over ``model``'s own weights (as an
    evaluation shares one among its methods): the case the shipped calibrations measured, so what they
    say of ``model`` (e.g. that its monitor cannot judge it) holds for this scorer too.

    Example:
        >>> from tcrag_langgraph.models.local import LocalChatModel
        >>> model = LocalChatModel()
        >>> scores_own_weights(scorer_for_model(model), model), scores_own_weights(scorer_for_model(model), LocalChatModel())
        (True, False)
    """
    return scorer is not None and getattr(scorer, "own_generator", None) is model
