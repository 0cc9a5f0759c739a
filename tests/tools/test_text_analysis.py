"""The shared medical analyzer (tools/text_analysis.py) and the near-miss table on every lexical index.

Each row of :data:`NEAR_MISSES` is a query, the entry it means, and a near miss that differs only
in a digit, a letter, a code or a unit. On the embedded store, the offline encyclopedia, the KG
entity linker and the Elasticsearch backend (a real noida-db server), the exact entry must rank
strictly above the near miss (or the near miss must not be returned). Ids are chosen so that the
near miss sorts FIRST under the tie rule: a tie would put the near miss on top and fail the test,
so no row can pass by tie luck.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from rdflib import RDFS, Graph, Literal, URIRef

from tcrag_langgraph.tools.chunking import Chunk
from tcrag_langgraph.tools.documents import EmbeddedStore
from tcrag_langgraph.tools.knowledge_graph import KnowledgeGraph
from tcrag_langgraph.tools.text_analysis import (
    ANALYZER_VERSION,
    ELASTICSEARCH_ANALYZER,
    STOPWORDS,
    analyze,
    compound_tokens,
    elasticsearch_analysis,
    fold,
    top_k,
    word_spans,
)
from tcrag_langgraph.tools.web_search import EncyclopediaEntry, EncyclopediaProvider

# (query, exact entry, near miss)
NEAR_MISSES: list[tuple[str, str, str]] = [
    ("type 2 diabetes mellitus", "Type 2 diabetes mellitus without complications", "Type 1 diabetes mellitus without complications"),
    ("type 1 diabetes", "Type 1 diabetes mellitus with ketoacidosis", "Type 2 diabetes mellitus with ketoacidosis"),
    ("vitamin B12 deficiency", "Vitamin B12 deficiency anemia", "Vitamin B6 deficiency anemia"),
    ("vitamin B6 toxicity", "Vitamin B6 toxicity and neuropathy", "Vitamin B12 toxicity and neuropathy"),
    ("what does E11.9 mean", "E11.9 diabetes mellitus code", "E11.0 diabetes mellitus code"),
    ("code E11.0", "E11.0 hyperosmolarity diabetes code", "E11.9 hyperosmolarity diabetes code"),
    ("HER2 positive breast cancer", "HER2-positive breast cancer therapy", "HER3-positive breast cancer therapy"),
    ("chronic kidney disease stage 2", "Chronic kidney disease, stage 2 (mild)", "Chronic kidney disease, stage 3 (mild)"),
    ("stage 3 chronic kidney disease", "Chronic kidney disease stage 3 management", "Chronic kidney disease stage 4 management"),
    ("COVID-19 pneumonia", "COVID-19 pneumonia in adults", "Pneumonia in COVID-negative adults"),
    ("CD4+ count below 200", "CD4+ T-cell count below 200 cells", "CD8+ T-cell count below 200 cells"),
    ("HbA1c target 7%", "HbA1c target below 7% in adults", "HbA1c target below 8% in adults"),
    ("metformin 500 mg", "Metformin 500 mg tablets twice daily", "Metformin 850 mg tablets twice daily"),
    ("prednisone 5 mg", "Prednisone 5 mg daily maintenance", "Prednisone 50 mg daily maintenance"),
    ("grade 4 glioma", "WHO grade 4 glioma prognosis", "WHO grade 1 glioma prognosis"),
    ("HP:0001250", "HP:0001250 Seizure phenotype", "HP:0001251 Seizure phenotype"),
    ("vitamin D3 supplementation", "Vitamin D3 supplementation in the elderly", "Vitamin D2 supplementation in the elderly"),
    ("chronic hepatitis B", "Chronic hepatitis B infection", "Chronic hepatitis C infection"),
    ("BRCA1 mutation carriers", "BRCA1 mutation carriers screening", "BRCA2 mutation carriers screening"),
    ("IL-6 receptor inhibitor", "IL-6 receptor inhibitor therapy", "IL-1 receptor inhibitor therapy"),
    ("factor V Leiden thrombophilia", "Factor V Leiden thrombophilia", "Factor VIII Leiden thrombophilia"),
    ("T2 weighted MRI", "T2 weighted MRI of the brain", "T1 weighted MRI of the brain"),
    ("NYHA class II heart failure", "NYHA class II heart failure", "NYHA class III heart failure"),
    ("E10.9", "E10.9 Type 1 diabetes mellitus without complications", "E11.9 Type 2 diabetes mellitus without complications"),
]

ROW_IDS = [f"{i:02d}-{q}" for i, (q, _, _) in enumerate(NEAR_MISSES)]


def near_id(row: int) -> str:
    return f"r{row:02d}-a-near"  # sorts before the exact id: a tie would rank the near miss first


def exact_id(row: int) -> str:
    return f"r{row:02d}-z-exact"


def corpus() -> list[tuple[str, str]]:
    """(id, text) of every entry of the table, near misses first (insertion order must not help)."""
    rows = []
    for i, (_, exact, near) in enumerate(NEAR_MISSES):
        rows.append((near_id(i), near))
        rows.append((exact_id(i), exact))
    return rows


def assert_exact_first(ranked_ids: list[str], row: int) -> None:
    query = NEAR_MISSES[row][0]
    assert exact_id(row) in ranked_ids, f"{query!r}: exact entry not found in {ranked_ids}"
    if near_id(row) in ranked_ids:
        assert ranked_ids.index(exact_id(row)) < ranked_ids.index(near_id(row)), f"{query!r}: {ranked_ids}"


def test_table_has_at_least_20_pairs():
    assert len(NEAR_MISSES) >= 20
    assert len({q for q, _, _ in NEAR_MISSES}) == len(NEAR_MISSES)


# ----------------------------------------------------------------------------- the analyzer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("E11.9", ["e11.9", "e11", "9"]),
        ("HP:0001250", ["hp:0001250", "hp", "0001250"]),
        ("COVID-19", ["covid-19", "covid", "19"]),
        ("HbA1c", ["hba1c"]),
        ("CD4+", ["cd4+", "cd4"]),
        ("HER2", ["her2"]),
        ("7%", ["7%", "7"]),
        ("7 %", ["7%", "7"]),
        ("500 mg", ["500mg", "500", "mg"]),
        ("type 1", ["type", "1"]),
        ("vitamin A", ["vitamin", "a"]),
        ("Parkinson's disease", ["parkinson", "diseas"]),
        ("2 gastric ulcers", ["2", "gastric", "ulcer"]),  # "g" only joins a number when it is the whole word
    ],
)
def test_analyzer_keeps_codes_digits_letters_and_units(text, expected):
    assert analyze(text) == expected


def test_codes_and_numbers_are_never_stemmed_words_are():
    assert analyze("HbA1c E11.9 diabetes diabetic", stem=True) == ["hba1c", "e11.9", "e11", "9", "diabet", "diabet"]
    assert analyze("diabetes", stem=False) == ["diabetes"]


def test_negations_and_single_letters_are_not_stopwords_articles_are():
    assert {"no", "not", "with", "without", "nor", "a"}.isdisjoint(STOPWORDS)
    assert "the" in STOPWORDS
    assert analyze("without the complications") == ["without", "complic"]


def test_folding_and_word_spans_share_the_splitting():
    assert fold("Ménière") == "meniere"
    assert compound_tokens("126 mg/dL, CD4+") == ["126mg/dl", "cd4+"]
    text = "Type 2 DM (E11.9), Ménière's"
    spans = list(word_spans(text))
    assert [w for w, _, _ in spans] == ["type", "2", "dm", "e11", "9", "meniere"]
    assert [text[s:e] for _, s, e in spans] == ["Type", "2", "DM", "E11", "9", "Ménière"]


def test_analyzer_is_deterministic_and_versioned():
    text = "HER2-positive stage 3 cancer, CD4+ 350 cells/mm3, HbA1c 7.5%"
    assert analyze(text) == analyze(text) == analyze(str(text))
    assert isinstance(ANALYZER_VERSION, int) and ANALYZER_VERSION >= 1


def test_top_k_breaks_ties_by_id_then_drops_non_finite():
    scores = np.array([1.0, 3.0, 3.0, -np.inf, 3.0])
    assert top_k(scores, 2, ["e", "d", "b", "a", "c"]) == [2, 4]
    assert top_k(scores, 10, ["e", "d", "b", "a", "c"]) == [2, 4, 1, 0]
    assert top_k(np.array([-np.inf]), 3, ["x"]) == [] and top_k(scores, 0, list("abcde")) == []


def test_elasticsearch_analysis_reuses_the_stopwords():
    analysis = elasticsearch_analysis()
    assert analysis["filter"]["tcrag_stop"]["stopwords"] == sorted(STOPWORDS)
    assert analysis["analyzer"][ELASTICSEARCH_ANALYZER]["tokenizer"] in analysis["tokenizer"]


# ----------------------------------------------------------------------------- the near-miss table


class _NoDense:
    """Embedder stand-in for BM25-only stores: only its dimension is read, no model is loaded."""

    model_name = "none"
    dim = 4

    def encode(self, texts):
        return np.ones((len(texts), self.dim), dtype=np.float32)


@pytest.fixture(scope="module")
def embedded_store():
    store = EmbeddedStore(embeddings=_NoDense())
    rows = corpus()
    store.add([Chunk(cid, cid, text) for cid, text in rows], vectors=np.ones((len(rows), 4), dtype=np.float32))
    return store


@pytest.mark.parametrize("row", range(len(NEAR_MISSES)), ids=ROW_IDS)
def test_near_miss_embedded_store(embedded_store, row):
    hits = embedded_store.search(NEAR_MISSES[row][0], k=10, mode="bm25")
    assert_exact_first([h.chunk.chunk_id for h in hits], row)


@pytest.fixture(scope="module")
def encyclopedia():
    entries = [EncyclopediaEntry(key, text, f"https://example.org/{key}", text, "table") for key, text in corpus()]
    return EncyclopediaProvider(entries, persist=False)


@pytest.mark.parametrize("row", range(len(NEAR_MISSES)), ids=ROW_IDS)
def test_near_miss_encyclopedia(encyclopedia, row):
    results = encyclopedia.search(NEAR_MISSES[row][0], 10)
    assert_exact_first([r.url.rsplit("/", 1)[1] for r in results], row)


@pytest.fixture(scope="module")
def knowledge_graph():
    graph = Graph()
    for key, text in corpus():
        graph.add((URIRef(f"http://example.org/{key}"), RDFS.label, Literal(text)))
    return KnowledgeGraph(graph)


@pytest.mark.parametrize("row", range(len(NEAR_MISSES)), ids=ROW_IDS)
def test_near_miss_kg_linker(knowledge_graph, row):
    # the linker finds whole labels in text: the mention is the exact label, written in a sentence
    text = f"Assessment: {NEAR_MISSES[row][1].lower()}."
    linked = knowledge_graph.link(text, limit=10)
    ids = [entity.iri.rsplit("/", 1)[1] for entity in linked]
    assert ids and ids[0] == exact_id(row), (text, linked)
    assert_exact_first(ids, row)


@pytest.fixture(scope="module")
def es_store(elasticsearch_url):
    from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore

    store = ElasticsearchStore(elasticsearch_url, index=f"test-nearmiss-{uuid.uuid4().hex[:8]}", embeddings=_NoDense())
    rows = corpus()
    store.add([Chunk(cid, cid, text) for cid, text in rows], vectors=np.ones((len(rows), 4), dtype=np.float32) / 2)
    yield store
    store.delete_index()
    store.close()


def test_elasticsearch_server_analyzes_like_the_embedded_analyzer(es_store):
    """The same terms (as multisets) on the real noida-db server as in Python, for every table entry."""
    for _, text in corpus():
        answer = es_store.client.indices.analyze(index=es_store.index, analyzer=ELASTICSEARCH_ANALYZER, text=text)
        assert sorted(t["token"] for t in answer["tokens"]) == sorted(analyze(text)), text


@pytest.mark.parametrize("row", range(len(NEAR_MISSES)), ids=ROW_IDS)
def test_near_miss_elasticsearch(es_store, row):
    hits = es_store.search(NEAR_MISSES[row][0], k=10, mode="bm25")
    assert_exact_first([h.chunk.chunk_id for h in hits], row)


def test_equal_scores_rank_by_chunk_id_on_both_stores(elasticsearch_url):
    """Identical texts tie; both backends put the smaller chunk id first, whatever the insertion order."""
    from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore

    chunks = [Chunk(cid, cid, "Warfarin dose 5 mg") for cid in ("t-c", "t-a", "t-b")] + [Chunk("t-x", "t-x", "Heparin")]
    vectors = np.ones((len(chunks), 4), dtype=np.float32) / 2
    embedded = EmbeddedStore(embeddings=_NoDense())
    embedded.add(chunks, vectors=vectors)
    remote = ElasticsearchStore(elasticsearch_url, index=f"test-ties-{uuid.uuid4().hex[:8]}", embeddings=_NoDense())
    try:
        remote.add(chunks, vectors=vectors)
        for store in (embedded, remote):
            hits = store.search("warfarin 5 mg", k=2, mode="bm25")
            assert [h.chunk.chunk_id for h in hits] == ["t-a", "t-b"], type(store).__name__
            assert hits[0].score == hits[1].score
    finally:
        remote.delete_index()
        remote.close()
