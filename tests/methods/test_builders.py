"""Every method's builder has one signature, rejects the same bad arguments the same way, and every
method ends its run with the same result metadata on its final message (the run kernel's halt)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool

from tcrag_langgraph.core.result import RunResult
from tcrag_langgraph.methods.registry import METHODS, method_builder

COMMON = ["model", "tools", "scorer", "config", "options", "checkpointer", "store", "name", "trust_client_identity"]
BUILDERS = sorted({spec.builder: name for name, spec in METHODS.items()}.items())  # (builder, one method using it)


class BrokenModel(BaseChatModel):
    """A chat model whose server is down: every call raises."""

    @property
    def _llm_type(self) -> str:
        return "broken"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        raise RuntimeError("connection refused")

    def bind_tools(self, tools, **kwargs: Any) -> "BrokenModel":
        """It would call tools if its server were up (the LangChain agent refuses a model without tool calling)."""
        return self


class Scorer:
    """Scores and token log-probs for every method that reads them."""

    def score(self, query: str, text: str, *, metric: str) -> float:
        return 1.0

    def token_logprobs(self, context: str, text: str) -> list[float]:
        return [-0.1]


@tool
def DOC_RAG(query: str) -> str:
    """Search documents."""
    return "nothing"


def build(builder: str, **kwargs: Any):
    method = {b: n for b, n in BUILDERS}[builder]
    extra = {"embeddings": object()} if METHODS[method].name == "crp-rag" else {}
    kwargs.setdefault("model", BrokenModel())
    kwargs.setdefault("scorer", Scorer())
    return method_builder(method)(**{**extra, **kwargs})


@pytest.mark.parametrize("builder", [b for b, _ in BUILDERS])
def test_every_builder_has_the_common_keyword_only_signature(builder):
    params = list(inspect.signature(method_builder({b: n for b, n in BUILDERS}[builder])).parameters.values())
    assert [p.name for p in params[: len(COMMON)]] == COMMON
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)


BAD = [
    ({"model": 42}, TypeError, "model must be"),
    ({"tools": "DOC_RAG"}, TypeError, "tools must be"),
    ({"tools": [object()]}, TypeError, "BaseTool"),
    ({"tools": [DOC_RAG, DOC_RAG]}, ValueError, "unique"),
    ({"scorer": 5}, TypeError, "scorer must"),
    ({"config": 5}, TypeError, "config must be"),
    ({"config": {"max_steps": 0}}, ValueError, "max_steps"),
    ({"config": {"no_such_field": 1}}, ValueError, "no_such_field"),
    ({"options": 5}, (TypeError, ValueError), "options"),
    ({"name": 3}, TypeError, "name must be"),
    ({"name": " "}, ValueError, "name must not be empty"),
    ({"trust_client_identity": "yes"}, TypeError, "trust_client_identity"),
    ({"model": "no-such-model-anywhere"}, ValueError, "not a model folder"),
]


@pytest.mark.parametrize("builder", [b for b, _ in BUILDERS])
@pytest.mark.parametrize("bad,error,words", BAD, ids=[str(sorted(b)) + str(i) for i, (b, _, _) in enumerate(BAD)])
def test_every_builder_rejects_the_same_bad_arguments_the_same_way(builder, bad, error, words):
    method = {b: n for b, n in BUILDERS}[builder]
    if "options" in bad:  # a method with options: a wrong type; without: it takes none
        error = TypeError if METHODS[method].takes_options else ValueError
    with pytest.raises(error, match=words):
        build(builder, **bad)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_ends_with_the_same_result_metadata(method):
    """A model failure and a bad question halt every method the same way: reason, error, final message."""
    spec = METHODS[method]
    graph = build(spec.builder, tools=[DOC_RAG] if spec.uses_tools else [],
                  options={"knowledge_boundary": False} if method == "kag-thinker" else None)
    keys = set(RunResult().metadata())
    for question, reason, words in (("Is metformin first-line?", "model_error", "RuntimeError: connection refused"),
                                    ("   ", "invalid_input", "empty")):
        out = graph.invoke({"question": question})
        final = out["messages"][-1]
        assert isinstance(final, AIMessage)
        assert out["halt_reason"] == reason and words in out["error"], (method, out.get("error"))
        assert set(final.response_metadata) >= keys
        assert final.response_metadata["halt_reason"] == reason
        assert final.response_metadata["answer_validated"] is False
        assert final.content == f"No answer: {out['error']}"
        assert out["trace"][-1].action == "Halt" and out["trace"][-1].detail.startswith(reason)
