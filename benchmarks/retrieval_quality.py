"""Retrieval quality: PubMedQA-L question -> its own abstract, hit@1/5/10, bm25 / dense / hybrid.

All 1000 PubMedQA-L questions (``ori_pqal.json``), the question text only as the query. A hit at
k: the question's PubMed id is among the first k *distinct* source ids of the ranking (the store
ranks 128-token chunks; the top 50 chunks are read). Two lexical analyzers side by side:

* ``baseline`` -- what the stores used before issue 9: ``bm25s.tokenize`` defaults (the
  ``\\b\\w\\w+\\b`` pattern, which drops 1-character tokens and splits codes) with bm25s' English
  stopwords and the PyStemmer English stemmer;
* ``medical`` -- :func:`tcrag_langgraph.tools.text_analysis.analyze` (the current default).

Dense retrieval does not use an analyzer (the same numbers under both); hybrid fuses each BM25
ranking with the dense one. Two corpora:

* ``packaged`` -- the shipped store as is. Its chunks carry the PubMedQA question as their title
  and the title is indexed, so the query text is inside its gold document: an upper bound, not a
  measure of retrieval.
* ``abstract-only`` -- the same chunks without titles (only the abstract sections are indexed),
  re-embedded with the packaged MiniLM: the honest task.

    python benchmarks/retrieval_quality.py [--data ../shared/data/pubmedqa/ori_pqal.json] [--threads 2]
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from _common import machine, parser, set_threads  # noqa: E402

KS = (1, 5, 10)
DEPTH = 50


def baseline_analyzer():
    """The pre-issue-9 BM25 terms (bm25s defaults + English stopwords + PyStemmer), for comparison."""
    import bm25s
    import Stemmer

    stem = Stemmer.Stemmer("english").stemWords

    def analyze(text: str) -> list[str]:
        return bm25s.tokenize([text], stopwords="en", stemmer=stem, return_ids=False, show_progress=False)[0]

    return analyze


class CachedEmbeddings:
    """The packaged MiniLM with a per-text cache (hybrid and dense embed the same 1000 queries)."""

    def __init__(self, inner) -> None:
        self.inner, self.model_name, self.dim, self._cache = inner, inner.model_name, inner.dim, {}

    def encode(self, texts):
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            self._cache.update(zip(missing, self.inner.encode(missing)))
        return np.stack([self._cache[t] for t in texts])


def hits_at_k(store, questions, mode: str) -> dict[int, float]:
    found = {k: 0 for k in KS}
    for pmid, question in questions:
        sources = list(dict.fromkeys(h.chunk.source_id for h in store.search(question, k=DEPTH, mode=mode)))
        for k in KS:
            found[k] += pmid in sources[:k]
    return {k: found[k] / len(questions) for k in KS}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data", default=str(ROOT.parent.parent / "shared" / "data" / "pubmedqa" / "ori_pqal.json"))
    p.add_argument("--vectors-cache", default="/tmp/tcrag-abstract-only.vectors.npy",
                   help="where the abstract-only chunk vectors are kept between runs")
    args = p.parse_args()
    set_threads(args.threads)
    from tcrag_langgraph.tools.documents import EmbeddedStore, default_embeddings, load_packaged_store
    from tcrag_langgraph.tools.text_analysis import analyze

    data = json.loads(Path(args.data).read_text(encoding="utf-8"))
    questions = [(str(pmid), row["QUESTION"]) for pmid, row in data.items()]
    embeddings = CachedEmbeddings(default_embeddings())
    packaged = load_packaged_store(embeddings=embeddings)
    chunks = list(packaged.chunks)
    vectors = packaged._vectors
    bare = [dataclasses.replace(c, title="") for c in chunks]
    cache = Path(args.vectors_cache)
    if cache.is_file() and np.load(cache).shape[0] == len(bare):
        bare_vectors = np.load(cache)
    else:
        t0 = time.perf_counter()
        bare_vectors = embeddings.inner.encode([c.search_text for c in bare])
        np.save(cache, bare_vectors)
        print(f"embedded {len(bare)} abstract-only chunks in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"machine: {machine()}")
    print(f"{len(questions)} questions, {len(chunks)} chunks, hit@k over distinct sources of the top {DEPTH} chunks\n")
    print("| corpus | analyzer | mode | hit@1 | hit@5 | hit@10 |")
    print("|---|---|---|---|---|---|")
    for corpus, rows, vecs in (("abstract-only", bare, bare_vectors), ("packaged", chunks, vectors)):
        dense_done = None
        for name, analyzer in (("baseline", baseline_analyzer()), ("medical", analyze)):
            store = EmbeddedStore(embeddings=embeddings, analyzer=analyzer)
            store.add(rows, vectors=vecs)
            for mode in ("bm25", "dense", "hybrid"):
                if mode == "dense" and dense_done is not None:
                    scores = dense_done  # no analyzer involved: identical under both
                else:
                    scores = hits_at_k(store, questions, mode)
                    if mode == "dense":
                        dense_done = scores
                cells = " | ".join(f"{scores[k]:.3f}" for k in KS)
                print(f"| {corpus} | {name} | {mode} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
