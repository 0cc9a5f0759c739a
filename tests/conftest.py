"""Shared fixtures: a scripted chat model and a scripted state scorer for deterministic runs."""

from __future__ import annotations

import os
from typing import Iterable

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class ScriptedScorer:
    """Returns the value scripted for a text (else ``default``) and records every call."""

    def __init__(self, values: dict[str, float] | None = None, default: float = 50.0) -> None:
        self.values = dict(values or {})
        self.default = default
        self.calls: list[tuple[str, str, str]] = []

    def score(self, query: str, text: str, *, metric: str) -> float:
        self.calls.append((query, text, metric))
        return self.values.get(text, self.default)


class RecordingChatModel(FakeListChatModel):
    """A scripted chat model that also keeps the prompts it was sent."""

    seen: list = []

    def _call(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(list(messages))
        return super()._call(messages, stop=stop, run_manager=run_manager, **kwargs)


def scripted(responses: Iterable[str]) -> RecordingChatModel:
    return RecordingChatModel(responses=list(responses), seen=[])


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine two spinning threads run several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lm():
    """The packaged local model (loaded once per process). A missing model is an error, not a skip."""
    from tcrag_langgraph.models import load_local_model

    return load_local_model()


@pytest.fixture
def scorer() -> ScriptedScorer:
    return ScriptedScorer()
