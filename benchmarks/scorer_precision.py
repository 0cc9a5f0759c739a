"""How far llama.cpp's state values are from the transformers float32 reference over the same GGUF,
per scoring precision (docs/models.md, "Exact state values with llama.cpp").

The 50 (query, text) pairs of tests/test_llama_cpp.py; cppl and uct from ``LocalLMScorer`` over the
GGUF loaded by transformers (the reference) and from ``LlamaCppScorer`` at each precision; prints the
largest relative difference and on how many pairs the validated/rejected decision agrees, at the
paper's sigma and at a sigma splitting the reference values in half. ``--scoring-gguf`` scores on
another encoding of the same weights (e.g. a Q8_0 re-encoding) with ``precision="native"``.

Example::

    .venv/bin/python benchmarks/scorer_precision.py                          # the packaged SmolLM2
    .venv/bin/python benchmarks/scorer_precision.py --gguf /work/models/qwen2.5-coder-0.5b-instruct.gguf
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=None, help="the GGUF (default: the packaged SmolLM2)")
    parser.add_argument("--scoring-gguf", default=None, help="score 'native' on this file instead of --gguf")
    parser.add_argument("--pairs", type=int, default=50)
    args = parser.parse_args()

    import torch

    from tcrag_langgraph.models.llama_cpp_model import load_llama_model
    from tcrag_langgraph.models.weights import load_local_model
    from tcrag_langgraph.monitor.llama_cpp import LlamaCppScorer
    from tcrag_langgraph.monitor.scoring import LocalLMScorer
    from tests.test_llama_cpp import scored_pairs

    torch.set_num_threads(1)
    pairs = scored_pairs(args.pairs)
    reference = LocalLMScorer(load_local_model(args.gguf))
    llama = load_llama_model(args.scoring_gguf or args.gguf, n_threads=1)
    print(f"scoring file type {llama.llm.metadata.get('general.file_type')} ({llama.path})")
    precisions = ("native",) if args.scoring_gguf else ("native", "f16")
    scorers = {p: LlamaCppScorer(model_loader=lambda: llama, precision=p) for p in precisions}
    for metric, paper_sigma in (("cppl", 10.0), ("uct", 20.0)):
        ref = [reference.score(q, t, metric=metric) for q, t in pairs]
        ranked = sorted(ref)
        split = math.sqrt(ranked[len(ref) // 2 - 1] * ranked[len(ref) // 2])
        for precision, scorer in scorers.items():
            ours = [scorer.score(q, t, metric=metric) for q, t in pairs]
            worst = max(abs(b - a) / abs(a) for a, b in zip(ref, ours))
            agree = [sum((a < s) == (b < s) for a, b in zip(ref, ours)) for s in (paper_sigma, split)]
            print(f"{metric} {precision}: max relative difference {worst:.2%}; decisions agree "
                  f"{agree[0]}/{len(ref)} at sigma {paper_sigma:g}, {agree[1]}/{len(ref)} at the median split")


if __name__ == "__main__":
    main()
