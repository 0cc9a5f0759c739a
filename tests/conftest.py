"""Shared fixtures: a scripted chat model and a scripted state scorer (from tcrag_langgraph.testing)."""

from __future__ import annotations

import os
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest-xdist workers on CI's two cores: one thread each for llama.cpp and torch
    # (and the servers the tests start, which inherit this environment). Two workers spinning two threads
    # apiece on two cores run several times slower than one apiece. Set before torch is imported.
    os.environ.setdefault("TCRAG_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The test doubles live in the package (one home, documented); the tests import them from here.
from tcrag_langgraph.testing import RecordingChatModel, ScriptedScorer  # noqa: E402,F401
from tcrag_langgraph.testing import recording_model as scripted  # noqa: E402,F401


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
    from tcrag_langgraph.models.weights import load_local_model

    return load_local_model()


@pytest.fixture
def model_folder(lm, tmp_path):
    """A transformers model folder for the packaged model (its config and tokenizer: resolving a model reads
    no weights). Not ``lm``'s own folder: that sits in whichever test's cache loaded it first, and a
    passing test's tmp_path is gone at its teardown."""
    folder = tmp_path / "smollm2-135m-instruct"
    lm.model.config.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def scorer() -> ScriptedScorer:
    return ScriptedScorer()
