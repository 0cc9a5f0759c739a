"""LangChain's own standard test suites (langchain-tests) on the project's parts: the two local chat models
(the packaged SmolLM2 on transformers and on llama.cpp, real generation) and each of the four tools (real
data, real calls).

Skips are only for capabilities a part truly lacks, declared through the suites' own flags: the local
models have no structured output, image/audio/PDF input or JSON mode (actions are parsed from text, see
README). They do call tools (``bind_tools``, models/chat_turns.py), which the unit suites check; the
integration suites' tool-calling tests check the arguments a model writes (``magic_function`` with
``input=3`` ...), which the packaged 135M model does not write reliably, so they are off there
(tests/test_chat_turns.py runs the model's tool calls, tests/methods/test_langchain_agent.py an agent).

``make test`` runs this module in a pytest process of its own, in random order (pytest-randomly; the
header prints the seed: rerun one order with ``python -m pytest -p randomly --randomly-seed=SEED
tests/test_standard_conformance.py``), so no test passes only because of what an earlier one left behind.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_tests")

# A hang becomes this test's failure, with the stack of every thread, and the run goes on (pytest-timeout's
# SIGALRM method; the slowest test here takes about 13 s on a busy 2-core machine, model loading included).
pytestmark = pytest.mark.timeout(120, method="signal")

from langchain_tests.integration_tests import ChatModelIntegrationTests, ToolsIntegrationTests  # noqa: E402
from langchain_tests.unit_tests import ChatModelUnitTests, ToolsUnitTests  # noqa: E402

from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel  # noqa: E402
from tcrag_langgraph.models.local import LocalChatModel  # noqa: E402


class _LocalChatModelSettings:
    @property
    def chat_model_class(self) -> type[LocalChatModel]:
        return LocalChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # greedy and short: the suites check the protocol, not the answers of a 135M model
        return {"max_new_tokens": 24, "temperature": 0.0}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return False


class TestLocalChatModelUnit(_LocalChatModelSettings, ChatModelUnitTests):
    pass


class _ToolCallsOfA135MModel:
    """The integration suites' tool-calling tests judge the model's arguments: off for the packaged 135M."""

    @property
    def has_tool_calling(self) -> bool:
        return False


@pytest.mark.slow
class TestLocalChatModelIntegration(_ToolCallsOfA135MModel, _LocalChatModelSettings, ChatModelIntegrationTests):
    pass


class _LlamaCppChatModelSettings(_LocalChatModelSettings):
    @property
    def chat_model_class(self) -> type[LlamaCppChatModel]:
        return LlamaCppChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # one thread: llama.cpp's spinning threads crawl on a busy 2-core machine
        return {"max_new_tokens": 24, "temperature": 0.0, "n_threads": 1}


class TestLlamaCppChatModelUnit(_LlamaCppChatModelSettings, ChatModelUnitTests):
    pass


@pytest.mark.slow
class TestLlamaCppChatModelIntegration(_ToolCallsOfA135MModel, _LlamaCppChatModelSettings, ChatModelIntegrationTests):
    pass


def _tool(name: str):
    from tcrag_langgraph.tools import default_tools

    return {t.name: t for t in default_tools()}[name]


EXAMPLES = {
    "DOC_RAG": {"query": "metformin first-line therapy for type 2 diabetes"},
    "KG_RAG": {"query": "Marfan syndrome"},
    "WEB_SEARCH": {"query": "type 2 diabetes mellitus"},
    "EMR_SEARCH": {"operation": "similar", "codes": ["E11.9"]},
}


def _tool_settings(name: str) -> type:
    class Settings:
        @property
        def tool_constructor(self):
            return _tool(name)

        @property
        def tool_invoke_params_example(self) -> dict[str, Any]:
            return dict(EXAMPLES[name])

    return Settings


class TestDocRagUnit(_tool_settings("DOC_RAG"), ToolsUnitTests):
    pass


class TestDocRagIntegration(_tool_settings("DOC_RAG"), ToolsIntegrationTests):
    pass


class TestKgRagUnit(_tool_settings("KG_RAG"), ToolsUnitTests):
    pass


class TestKgRagIntegration(_tool_settings("KG_RAG"), ToolsIntegrationTests):
    pass


class TestWebSearchUnit(_tool_settings("WEB_SEARCH"), ToolsUnitTests):
    pass


class TestWebSearchIntegration(_tool_settings("WEB_SEARCH"), ToolsIntegrationTests):
    pass


class TestEmrSearchUnit(_tool_settings("EMR_SEARCH"), ToolsUnitTests):
    pass


class TestEmrSearchIntegration(_tool_settings("EMR_SEARCH"), ToolsIntegrationTests):
    pass
