"""Knowledge graph (packaged HPO + ICD-10-CM graph): load, entity linking, 2-hop queries, retrieve.

* load: parse the packaged N-Triples into rdflib, then build the label index (first ``link``);
* ``link``: entity linking of clinical questions (exact, synonym, id, fuzzy matches);
* ``chains(a, b, hierarchy=False)``: the 2-hop SPARQL query between two entities, for pairs that
  really are two hops apart (a -> x -> b found by walking neighbours) and for unrelated pairs;
* ``chains(a, b)``: 2-hop plus hierarchy paths (the default);
* ``retrieve``: everything the KG_RAG tool does for one question.

    python benchmarks/knowledge_graph.py [--pairs 10]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, parser  # noqa: E402

QUESTIONS = [
    "Is arachnodactyly a feature of Marfan syndrome?",
    "Seizures in a child with marfans syndrom and type 2 diabetes (E11.9)",
    "Which phenotypes are seen in Ehlers-Danlos syndrome?",
    "Does cystic fibrosis cause bronchiectasis?",
    "Hypertrophic cardiomyopathy and sudden cardiac death",
    "What is the ICD-10 code for essential hypertension?",
    "Microcephaly and intellectual disability in Rett syndrome",
    "Is short stature part of Turner syndrome?",
    "Retinitis pigmentosa with hearing loss: Usher syndrome?",
    "Hepatosplenomegaly in Gaucher disease",
    "Ptosis and muscle weakness in myasthenia gravis",
    "Polydactyly in Bardet-Biedl syndrome",
]


def stats(times: list[float]) -> str:
    times = sorted(times)
    return (f"median {statistics.median(times) * 1e3:8.2f} ms, p95 {times[int(0.95 * (len(times) - 1))] * 1e3:8.2f} ms, "
            f"n={len(times)}")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--pairs", type=int, default=10)
    args = p.parse_args()
    from tcrag_langgraph.tools.knowledge_graph import KnowledgeGraph, load_packaged_graph

    t0 = time.perf_counter(); graph = load_packaged_graph(); t1 = time.perf_counter()
    kg = KnowledgeGraph(graph)
    kg.index  # noqa: B018 - builds the label index
    t2 = time.perf_counter()
    print(f"machine: {machine()}")
    print(f"packaged graph: {len(graph):,} triples; parse {t1 - t0:.1f} s, label index {t2 - t1:.1f} s\n")

    link_times, linked = [], []
    for q in QUESTIONS:
        s = time.perf_counter(); found = kg.link(q); link_times.append(time.perf_counter() - s)
        linked.extend(e.iri for e in found)
    print(f"link:                    {stats(link_times)} ({len(linked)} entities from {len(QUESTIONS)} questions)")

    # pairs two hops apart: a -> x -> b along out-edges of the neighbours
    pairs = []
    for a in dict.fromkeys(linked):
        for direction, _p, triples, _n in kg.neighbours(a, per_relation=3):
            for t in triples:
                x = t.o if direction == "out" else t.s
                for d2, _p2, t2s, _n2 in kg.neighbours(x, per_relation=2):
                    for t2_ in t2s:
                        b = t2_.o if d2 == "out" else t2_.s
                        if b not in (a, x):
                            pairs.append((a, b))
                            break
                    if pairs and pairs[-1][0] == a:
                        break
                if pairs and pairs[-1][0] == a:
                    break
            if pairs and pairs[-1][0] == a:
                break
        if len(pairs) >= args.pairs:
            break
    unrelated = list(zip(linked[::2], linked[1::2]))[: args.pairs]
    for name, group in (("2-hop pairs", pairs), ("other pairs", unrelated)):
        for hierarchy in (False, True):
            times, found = [], 0
            for a, b in group:
                s = time.perf_counter(); chains = kg.chains(a, b, hierarchy=hierarchy); times.append(time.perf_counter() - s)
                found += bool(chains)
            label = f"chains ({name}, {'2-hop + hierarchy' if hierarchy else '2-hop only'}):"
            print(f"{label:<48} {stats(times)}, {found}/{len(group)} with a path", flush=True)
    retrieve_times = []
    for q in QUESTIONS:
        s = time.perf_counter(); kg.retrieve(q); retrieve_times.append(time.perf_counter() - s)
    print(f"retrieve (link + describe + neighbours + chains): {stats(retrieve_times)}")
    print(f"\nload avg after: {machine().split('load avg ')[1].split(',')[0]}")


if __name__ == "__main__":
    main()
