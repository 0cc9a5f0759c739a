"""The package's public names: few, each what a user needs, each reachable, none importing torch."""

from __future__ import annotations

import subprocess
import sys

import tcrag_langgraph


def test_the_public_names_are_the_small_set_a_user_needs():
    assert set(tcrag_langgraph.__all__) == {
        "build_agent", "build_graph", "METHODS", "TCRAGConfig", "RunResult", "CallerContext", "agent_as_tool",
        "as_chat_runnable", "checkpoint_serde", "tools"}
    for name in tcrag_langgraph.__all__:
        assert getattr(tcrag_langgraph, name) is not None, name
    assert "crp-rag" in tcrag_langgraph.METHODS and "tcrag" in tcrag_langgraph.METHODS


def test_build_agent_builds_every_method_of_the_registry_by_name():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from tcrag_langgraph.testing import ScriptedScorer

    for method in ("tcrag", "react", "sr-rag", "fl-rag"):
        agent = tcrag_langgraph.build_agent(method, model=FakeListChatModel(responses=["Conclusion: yes"]),
                                            scorer=ScriptedScorer(default=1.0))
        result = tcrag_langgraph.RunResult.from_state(agent.invoke({"question": "Is it?"}))
        assert result.answer and result.halt_reason, method


def test_importing_the_package_and_its_tools_loads_no_graph_and_no_torch():
    code = ("import sys, tcrag_langgraph, tcrag_langgraph.tools; "
            "print(any(m in sys.modules for m in ('torch', 'langgraph', 'tcrag_langgraph.core.kernel')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
