"""Retrieval: indexing throughput and query latency of the document stores at 10k and 100k chunks.

Backends: the embedded store (``EmbeddedStore``: bm25s + a numpy matrix) and the Elasticsearch
store (``ElasticsearchStore``) against a real noida-db server on loopback (started and stopped
here, as in the test fixture). Corpora of N chunks are built from the packaged PubMedQA-L chunks:
chunk i joins the text of two packaged chunks (so every chunk is distinct and the vocabulary is
real medical prose) and its vector is the normalised sum of their MiniLM vectors (no embedding
at indexing time: we time the stores, not the embedder; dense query latency includes embedding
the query). Queries are packaged article titles (questions).

    python benchmarks/retrieval.py [--threads 1] [--sizes 10000,100000] [--no-es] [--queries 50]
"""

from __future__ import annotations

import gzip
import json
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))  # tests/tools/es_server.py: the noida-db helper
from _common import machine, parser, set_threads  # noqa: E402


def packaged():
    from tcrag_langgraph.tools.documents import PACKAGED_CORPUS, packaged_data_dir

    folder = packaged_data_dir()
    rows = []
    with gzip.open(folder / f"{PACKAGED_CORPUS}.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if "chunk_id" in row:
                rows.append(row)
    vectors = np.load(folder / f"{PACKAGED_CORPUS}.vectors.f16.npy").astype(np.float32)
    assert len(rows) == len(vectors), (len(rows), vectors.shape)
    return rows, vectors


def corpus(n: int, rows, vectors, *, seed: int = 0):
    from tcrag_langgraph.tools.chunking import Chunk

    rng = np.random.default_rng(seed)
    a = rng.integers(0, len(rows), n)
    b = rng.integers(0, len(rows), n)
    chunks = [Chunk(f"s{i}#0", f"s{i}", rows[x]["text"] + " " + rows[y]["text"], title=rows[x]["title"],
                    section=rows[x].get("section", "")) for i, (x, y) in enumerate(zip(a, b))]
    vec = vectors[a] + vectors[b]
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    return chunks, vec


def latency(store, queries, mode: str, k: int = 5) -> tuple[float, float]:
    times = []
    for q in queries:
        t0 = time.perf_counter()
        store.search(q, k=k, mode=mode)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1e3, times[int(0.95 * (len(times) - 1))] * 1e3


def bm25_breakdown(store, queries) -> str:
    """Where an embedded BM25 query spends its time (for the store's owner)."""
    retriever = store._retriever()
    parts = {"tokenize": [], "get_scores": [], "top-k": []}
    for q in queries:
        t0 = time.perf_counter()
        tokens = [t for t in store._analyze(q) if t in retriever.vocab_dict]
        t1 = time.perf_counter()
        scores = np.asarray(retriever.get_scores(tokens))
        t2 = time.perf_counter()
        store._top(scores, 5, frozenset(), positive_only=True)
        t3 = time.perf_counter()
        parts["tokenize"].append(t1 - t0)
        parts["get_scores"].append(t2 - t1)
        parts["top-k"].append(t3 - t2)
    return ", ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms" for k, v in parts.items())


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sizes", default="10000,100000")
    p.add_argument("--no-es", action="store_true", help="skip the Elasticsearch (noida-db) backend")
    p.add_argument("--queries", type=int, default=50)
    p.add_argument("--es-queries", type=int, default=10, help="BM25 on noida-db takes seconds: fewer queries")
    p.add_argument("--es-dense-queries", type=int, default=5, help="kNN on noida-db is slow: fewer queries")
    args = p.parse_args()
    set_threads(args.threads)
    # SIGTERM (timeout) unwinds the with-block, so the noida-db server we started is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from tcrag_langgraph.tools.documents import EmbeddedStore, default_embeddings

    rows, vectors = packaged()
    queries = list(dict.fromkeys(r["title"] for r in rows))[: args.queries]
    embeddings = default_embeddings()
    embeddings.embed_query("warm up")  # model load is not query latency
    print(f"machine: {machine()}")
    print(f"{len(queries)} queries (packaged titles), k=5; latency median / p95 in ms\n")
    for n in (int(s) for s in args.sizes.split(",")):
        chunks, vec = corpus(n, rows, vectors)
        store = EmbeddedStore(embeddings=embeddings)
        t0 = time.perf_counter(); store.add(chunks, vectors=vec); t1 = time.perf_counter()
        store._retriever(); t2 = time.perf_counter()  # BM25 index build (lazy: first search)
        print(f"[embedded] {n:,} chunks: add {n / (t1 - t0):,.0f} chunks/s, BM25 index build {t2 - t1:.1f} s "
              f"-> {n / (t2 - t0):,.0f} chunks/s end to end")
        for mode in ("bm25", "dense", "hybrid"):
            med, p95 = latency(store, queries, mode)
            print(f"[embedded] {n:,} chunks: {mode:<6} {med:8.2f} / {p95:8.2f} ms", flush=True)
        print(f"[embedded] {n:,} chunks: BM25 breakdown: {bm25_breakdown(store, queries)}")
        del store
        if args.no_es:
            continue
        from tests.tools.es_server import NoidaElasticsearch, find_noida
        from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore

        if find_noida() is None:
            print("[elasticsearch] noida-db not installed: skipped")
            continue
        with NoidaElasticsearch() as url:
            es = ElasticsearchStore(url, index="bench", embeddings=embeddings, request_timeout=120, bulk_chunk_size=500)
            es.create_index(dims=vec.shape[1])
            t0 = time.perf_counter(); es.add(chunks, vectors=vec); t1 = time.perf_counter()
            assert es.count() == n
            print(f"[noida-db] {n:,} chunks: bulk index {n / (t1 - t0):,.0f} chunks/s ({t1 - t0:.1f} s, 384-dim vectors)")
            for mode, qs in (("bm25", queries[: args.es_queries]), ("dense", queries[: args.es_dense_queries]),
                             ("hybrid", queries[: args.es_dense_queries])):
                es.search(qs[0], k=5, mode=mode)  # first query opens the index files
                med, p95 = latency(es, qs, mode)
                print(f"[noida-db] {n:,} chunks: {mode:<6} {med:8.2f} / {p95:8.2f} ms ({len(qs)} queries)", flush=True)
            es.close()
    print(f"\nload avg after: {machine().split('load avg ')[1].split(',')[0]}")


if __name__ == "__main__":
    main()
