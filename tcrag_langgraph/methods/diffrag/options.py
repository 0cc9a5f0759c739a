"""TCM-DiffRAG's options: :class:`DiffRAGOptions` (bounds and switches, per-run overridable) and the
one rule for how many tokens a generation may write."""

from __future__ import annotations

from typing import Optional

from pydantic import ConfigDict, Field

from ...core.arguments import MethodOptions
from ...core.config import TCRAGConfig
from ...models.llama_cpp_batch import MAX_SEQUENCES


class DiffRAGOptions(MethodOptions):
    """Bounds and switches of TCM-DiffRAG (keyword-only; per-run override through ``context=``).

    Example:
        >>> DiffRAGOptions(top_k=2).max_passages
        8
        >>> DiffRAGOptions(top_k=0)
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for DiffRAGOptions
        ...
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_passages: int = Field(default=8, ge=1, le=5000, description="Passages read into the macro-micro graph.")
    chunk_tokens: int = Field(default=128, ge=16, le=2048, description="Passage size in tokens.")
    chunk_overlap: int = Field(default=32, ge=0, le=1024, description="Tokens shared by consecutive passages.")
    max_triples_per_passage: int = Field(default=8, ge=1, le=50, description="Triples kept per passage or case.")
    max_path_triples: int = Field(default=5, ge=1, le=20, description="Triples in the question's reasoning path.")
    max_format_retries: int = Field(default=1, ge=0, le=5, description="Re-prompts after output with no triple.")
    top_k: int = Field(default=3, ge=1, le=20, description="Graph triples recalled per reasoning-path triple.")
    min_similarity: float = Field(default=0.35, ge=-1.0, le=1.0, description="Cosine similarity a recall needs.")
    max_evidence: int = Field(default=8, ge=1, le=50, description="Recalled triples shown to the answering model.")
    max_evidence_tokens: int = Field(default=1200, ge=64, le=16000, description="Token budget of the evidence text.")
    use_general_kg: bool = Field(default=True, description="Also match triples of the packaged HPO graph around linked entities.")
    kg_entities_per_triple: int = Field(default=2, ge=0, le=10, description="Packaged-graph entities linked per path triple.")
    kg_triples_per_relation: int = Field(default=5, ge=1, le=50, description="Packaged-graph neighbours per relation.")
    max_new_tokens: Optional[int] = Field(default=None, ge=1, le=8192, description="None: the TCRAGConfig value.")
    extract_sequences: int = Field(
        default=1, ge=1, le=MAX_SEQUENCES, description="Passages whose triples a llama.cpp model decodes together in the graph "
        "build (continuous batching); 1: one at a time. Other triples where batched kernels break a near tie; the "
        "gain is the hardware's (docs/diffrag.md, 'Build time').")


def max_new_tokens_for(options: DiffRAGOptions, config: TCRAGConfig) -> int:
    """Tokens one generation may write: ``options.max_new_tokens``, else the TCRAGConfig value."""
    return options.max_new_tokens or config.max_new_tokens
