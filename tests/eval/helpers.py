"""Scripted models, scorers and tools for the evaluation tests (importable by ``module:callable``)."""

from __future__ import annotations

from langchain_core.tools import tool

from tcrag_langgraph.testing import RecordingChatModel as RecordingModel  # one home for the test doubles
from tcrag_langgraph.testing import ScriptedScorer, recording_model


def model(*responses: str) -> RecordingModel:
    return recording_model(responses)


class TextScorer(ScriptedScorer):
    """State value by substring: the first key found in the scored text wins, else ``default``."""

    def __init__(self, values: dict[str, float] | None = None, default: float = 50.0) -> None:
        super().__init__(values, default=default, match="substring")


def make_doc_tool(prefix: str = "passage about"):
    @tool("DOC_RAG")
    def doc_rag(query: str) -> str:
        """Search medical documents for a query."""
        return f"{prefix} {query}"

    return doc_rag


# ----- factories for the CLI tests (module:callable) -----


def yes_no_model() -> RecordingModel:
    """Alternates "Conclusion: yes" / "Conclusion: no" call by call."""
    return model("Conclusion: yes", "Conclusion: no")


def always_yes_model() -> RecordingModel:
    return model("Conclusion: yes")


def tool_then_yes_model() -> RecordingModel:
    return model("Tool_Use: DOC_RAG\nTool_Input: aspirin", "Conclusion: yes")


def yes_low_scorer() -> TextScorer:
    return TextScorer({"yes": 1.0}, default=9.0)


def doc_tools() -> list:
    return [make_doc_tool()]


class DrugModel(RecordingModel):
    """Answers "Conclusion: yes" for drugs 0-2 and "Conclusion: no" otherwise (reads the prompt)."""

    def _call(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(list(messages))
        text = messages[-1].content
        return "Conclusion: yes" if any(f"drug {i} " in text for i in (0, 1, 2)) else "Conclusion: no"


def drug_model() -> DrugModel:
    return DrugModel(responses=["unused"], seen=[])


class DrugScorer(TextScorer):
    """State value by the drug number named in the query."""

    VALUES = {0: 1.0, 1: 7.0, 2: 2.0, 3: 3.0, 4: 8.0, 5: 4.0}

    def score(self, query: str, text: str, *, metric: str) -> float:
        self.calls.append((query, text, metric))
        for i, v in self.VALUES.items():
            if f"drug {i} " in query:
                return v
        raise ValueError("no drug in query")


def drug_scorer() -> DrugScorer:
    return DrugScorer()


class ReversedDrugScorer(DrugScorer):
    """Correct answers get the *high* values: a monitor with the wrong sign."""

    VALUES = {0: 9.0, 1: 1.0, 2: 8.0, 3: 7.0, 4: 2.0, 5: 6.0}


def reversed_drug_scorer() -> ReversedDrugScorer:
    return ReversedDrugScorer()


class NamedModel(RecordingModel):
    """A scripted model with a name, so a calibration can be stored and found for it."""

    model_name: str = "scripted-named"


def named_yes_model() -> NamedModel:
    return NamedModel(responses=["Conclusion: yes"])


class CRPModel(NamedModel):
    """CRP-RAG's prompts for the drug questions: one final step that restates the question, a
    reasoning that names it (so :class:`DrugScorer`-like scorers can key on it), answer "yes"."""

    def _call(self, messages, stop=None, run_manager=None, **kwargs):
        import re

        self.seen.append(list(messages))
        text = messages[-1].content
        named = re.search(r"The question is: (.*)", text)
        if text.startswith("Please propose the next reasoning step"):
            return f"Next step: {named.group(1)}\nFinal: yes"
        if text.startswith("Please answer the question according to the relevant knowledge"):
            return f"Reasoning on {named.group(1)}"
        if "merge the relevant knowledge" in text:
            return "Common points: a passage."
        return "Answer: yes"


def crp_model() -> CRPModel:
    return CRPModel(responses=["unused"], seen=[])


class ReasoningDrugScorer(TextScorer):
    """Low perplexity for the reasoning on drugs 0, 2, 4 (gold yes), high for the others."""

    def __init__(self) -> None:
        super().__init__({"drug 0 ": 1.0, "drug 2 ": 2.0, "drug 4 ": 1.5}, default=8.0)


def reasoning_drug_scorer() -> ReasoningDrugScorer:
    return ReasoningDrugScorer()


class LookingDrugModel(RecordingModel):
    """Searches DOC_RAG for the drug first, then answers as :class:`DrugModel` (a run with evidence)."""

    def _call(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(list(messages))
        text = messages[-1].content
        if "Tool_Observation" not in text:
            drug = next(i for i in range(6) if f"drug {i} " in text)
            return f"Tool_Use: DOC_RAG\nTool_Input: drug {drug}"
        return "Conclusion: yes" if any(f"drug {i} " in text for i in (0, 1, 2)) else "Conclusion: no"


def looking_drug_model() -> LookingDrugModel:
    return LookingDrugModel(responses=["unused"], seen=[])


def packaged_scorer():
    """The real state monitor over the packaged SmolLM2 weights (real token log-probs)."""
    from tcrag_langgraph.monitor.scoring import LocalLMScorer

    return LocalLMScorer()


def yes_likely_token_scorer():
    """Token log-probs where "yes" is far likelier than "no" and "maybe" (answer_prob of yes ~0.07)."""
    from tcrag_langgraph.testing import ScriptedTokenScorer

    return ScriptedTokenScorer(logprobs={"yes": -0.05, "no": -3.0, "maybe": -4.0})
