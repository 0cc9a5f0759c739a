"""The packaged all-MiniLM-L6-v2 run in numpy: the same weights and tokenizer as sentence-transformers,
without torch.

Why this exists: the embedded document store only embeds the *query* at run time (the corpus vectors
are saved with the index), and loading torch, transformers and sentence-transformers for that one
22M-parameter forward pass cost the main job ~460 MB of peak memory and several seconds of imports
(benchmarks/RESULTS.md section 13). The encoder is a plain BERT (6 layers, 384 wide, 12 heads,
exact-erf GELU, post-LayerNorm), mean-pooled over real tokens and unit-normalised, which is what the
packaged model's ``modules.json`` declares. Tokenisation is the model's own ``tokenizer.json`` through
Hugging Face ``tokenizers`` (Rust), truncated at the model's ``max_seq_length`` (256).
``tests/tools/test_numpy_encoder.py`` holds it to sentence-transformers' vectors on real text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["NumpyBertEncoder"]

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def _mapped_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read-only numpy views of a safetensors file's tensors, memory-mapped rather than copied (the
    word-embedding table is 47 MB of which a query touches a few rows). The format is an 8-byte
    little-endian header length, a JSON header of dtype, shape and byte offsets, then the data."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        out[name] = data[start:end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


class NumpyBertEncoder:
    """A sentence-transformers BERT folder (Transformer + mean Pooling + Normalize) evaluated in float32 numpy.

    Args:
        folder: the model folder (``model.safetensors``, ``tokenizer.json``, ``config.json``,
            ``sentence_bert_config.json``, ``1_Pooling/config.json``).
        batch_size: texts per forward pass (sorted by length, so a batch pads little).
    """

    def __init__(self, folder: str | Path, *, batch_size: int = 32) -> None:
        from tokenizers import Tokenizer

        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"{folder} is not a BERT encoder with exact GELU (config.json)")
        if not pooling.get("pooling_mode_mean_tokens") or any(
            pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
        ):
            raise ValueError(f"{folder} does not pool by the mean of its tokens (1_Pooling/config.json)")
        max_len = json.loads((folder / "sentence_bert_config.json").read_text()).get("max_seq_length", 512)
        self.batch_size = batch_size
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.dim = int(config["hidden_size"])
        self.weights = _mapped_safetensors(folder / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=int(max_len))
        self.tokenizer.no_padding()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors (float32, one row per text, in the order given)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.float32)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1.0
            out[rows] = self._pooled(ids, mask)
        return out

    # --- the forward pass -------------------------------------------------------------------------

    def _w(self, name: str) -> np.ndarray:
        return self.weights[name]

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        weight = self._w(f"{name}.weight")  # (out, in); its transpose is a BLAS operand as it stands
        flat = x.reshape(-1, x.shape[-1]) @ weight.T
        flat += self._w(f"{name}.bias")
        return flat.reshape(*x.shape[:-1], weight.shape[0])

    def _layer_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self._w(f"{name}.weight") + self._w(f"{name}.bias")

    def _pooled(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        from scipy.special import erf

        batch, width = ids.shape
        x = (self._w("embeddings.word_embeddings.weight")[ids]
             + self._w("embeddings.position_embeddings.weight")[:width]
             + self._w("embeddings.token_type_embeddings.weight")[0])
        x = self._layer_norm(x, "embeddings.LayerNorm")
        head = self.dim // self.heads
        # Padded keys get the most negative float32, as transformers does: exp() of it is exactly 0.
        key_bias = (1.0 - mask)[:, None, None, :] * np.finfo(np.float32).min

        def split(t: np.ndarray) -> np.ndarray:  # (batch, width, dim) -> (batch, heads, width, head)
            return np.ascontiguousarray(t.reshape(batch, width, self.heads, head).transpose(0, 2, 1, 3))

        for layer in range(self.layers):
            p = f"encoder.layer.{layer}"
            q = split(self._linear(x, f"{p}.attention.self.query"))
            k = split(self._linear(x, f"{p}.attention.self.key"))
            v = split(self._linear(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(head)) + key_bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = scores / scores.sum(-1, keepdims=True)
            context = (attn @ v).transpose(0, 2, 1, 3).reshape(batch, width, self.dim)
            x = self._layer_norm(self._linear(context, f"{p}.attention.output.dense") + x,
                                 f"{p}.attention.output.LayerNorm")
            hidden = self._linear(x, f"{p}.intermediate.dense")
            hidden = 0.5 * hidden * (1.0 + erf(hidden / np.float32(np.sqrt(2.0))))
            x = self._layer_norm(self._linear(hidden, f"{p}.output.dense") + x,
                                 f"{p}.output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return (pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)).astype(np.float32)
