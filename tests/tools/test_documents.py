"""Document search: one suite run against both backends (embedded bm25s+MiniLM and a real
Elasticsearch-API server), the DOC_RAG tool, persistence, the packaged corpus and indexing."""

from __future__ import annotations

import doctest
import gzip
import hashlib
import json
import re
import uuid
from pathlib import Path

import numpy as np
import pytest

import tcrag_langgraph.tools.documents as documents
from tcrag_langgraph.tools.tokens import count_tokens
from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.chunking import Chunk, Document, Section
from tcrag_langgraph.tools.documents import (
    DocumentStore,
    EmbeddedStore,
    default_document_tool,
    default_embeddings,
    document_tool,
    load_packaged_store,
    packaged_data_dir,
    reciprocal_rank_fusion,
)
from tcrag_langgraph.tools.indexing import IndexingError, build_index, read_documents, register

DOCS = [
    Document("mi", title="Acute myocardial infarction", sections=(
        Section("BACKGROUND", "Myocardial infarction follows coronary artery occlusion that stops perfusion of the "
                              "cardiac muscle and causes necrosis of cardiomyocytes."),
        Section("TREATMENT", "Primary percutaneous coronary intervention restores perfusion; aspirin and heparin "
                             "are given early."),
    )),
    Document("asthma", title="Asthma management", sections=(
        Section("BACKGROUND", "Asthma is chronic airway inflammation with reversible bronchoconstriction and wheezing."),
        Section("TREATMENT", "Inhaled corticosteroids control symptoms; salbutamol relieves acute attacks."),
    )),
    Document("diabetes", title="Type 2 diabetes", text="Metformin is the first-line drug for type 2 diabetes mellitus; "
             "it lowers hepatic glucose production. HbA1c tracks glycaemic control."),
    Document("stroke", title="Ischaemic stroke", text="Thrombolysis with alteplase within 4.5 hours improves outcome "
             "after ischaemic stroke. Brain imaging excludes haemorrhage first."),
    Document("gout", title="Gout", text="Gout is caused by monosodium urate crystals in joints; allopurinol lowers "
             "serum uric acid and colchicine treats flares."),
    Document("tb", title="Tuberculosis", text="Mycobacterium tuberculosis infection is treated with isoniazid, "
             "rifampicin, pyrazinamide and ethambutol for six months."),
    Document("depression", title="Major depression", text="Selective serotonin reuptake inhibitors such as sertraline "
             "are first-line antidepressants; psychotherapy helps too."),
    Document("anemia", title="Iron deficiency anaemia", text="Iron deficiency causes microcytic anaemia with low "
             "ferritin; oral ferrous sulfate replenishes stores."),
]
N_CHUNKS = 10  # 2 + 2 sections, 6 single-paragraph documents


class HashingEmbeddings:
    """A real (if simple) embedder with the LangChain Embeddings API only: hashed bag of words."""

    model_name = "test-hashing-64"

    def _vec(self, text: str) -> list[float]:
        v = np.zeros(64)
        for word in re.findall(r"\w+", text.lower()):
            v[int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
        return v.tolist()

    def embed_documents(self, texts):
        return [self._vec(t) for t in texts]

    def embed_query(self, text):
        return self._vec(text)


def _make_store(kind: str, request) -> DocumentStore:
    if kind == "embedded":
        return EmbeddedStore(embeddings=default_embeddings())
    from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore

    url = request.getfixturevalue("elasticsearch_url")
    store = ElasticsearchStore(url, index=f"test-docs-{uuid.uuid4().hex[:10]}", embeddings=default_embeddings())
    request.addfinalizer(lambda: (store.delete_index(), store.close()))
    return store


@pytest.fixture(scope="module", params=["embedded", "elasticsearch"])
def store(request) -> DocumentStore:
    """A store of each backend holding DOCS (built once per module)."""
    s = _make_store(request.param, request)
    assert s.add_documents(DOCS) == N_CHUNKS
    return s


@pytest.fixture(params=["embedded", "elasticsearch"])
def empty_store(request) -> DocumentStore:
    return _make_store(request.param, request)


def ids(hits):
    return [h.chunk.source_id for h in hits]


# ----------------------------------------------------------------------------- shared store suite


def test_count_and_chunk_fields_survive_indexing(store):
    assert store.count() == len(store) == N_CHUNKS
    hit = store.search("salbutamol", k=1, mode="bm25")[0]
    assert hit.rank == 1 and hit.score > 0
    assert hit.chunk == Chunk("asthma#1", "asthma", "Inhaled corticosteroids control symptoms; salbutamol relieves acute attacks.",
                              title="Asthma management", section="TREATMENT", position=1)


@pytest.mark.parametrize("query,expected", [
    ("allopurinol", "gout"),
    ("urate crystal", "gout"),           # singular query, plural text: stemming on both backends
    ("isoniazid rifampicin", "tb"),
    ("ferritin", "anemia"),
])
def test_bm25_finds_the_document_with_the_terms(store, query, expected):
    hits = store.search(query, k=3, mode="bm25")
    assert ids(hits)[0] == expected
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_bm25_returns_nothing_when_no_term_matches(store):
    assert store.search("xylophone quasar", k=5, mode="bm25") == []


@pytest.mark.parametrize("query,expected", [
    ("heart attack caused by a blocked artery", "mi"),
    ("medication for someone who feels sad and hopeless", "depression"),
    ("lung infection caused by bacteria needing months of antibiotics", "tb"),
])
def test_dense_finds_paraphrases_without_shared_words(store, query, expected):
    hits = store.search(query, k=3, mode="dense")
    assert ids(hits)[0] == expected
    assert len(hits) == 3


def test_hybrid_is_rrf_of_bm25_and_dense(store):
    query = "wheezing treated with an inhaler"
    bm25 = store.search(query, k=20, mode="bm25")
    dense = store.search(query, k=20, mode="dense")
    fused = reciprocal_rank_fusion([[h.chunk.chunk_id for h in bm25], [h.chunk.chunk_id for h in dense]], k=60)
    hybrid = store.search(query, k=4, mode="hybrid")
    assert [h.chunk.chunk_id for h in hybrid] == [cid for cid, _ in fused[:4]]
    assert [h.score for h in hybrid] == pytest.approx([s for _, s in fused[:4]])
    assert ids(hybrid)[0] == "asthma"


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_excluded_sources_never_come_back(store, mode):
    query = "gout allopurinol uric acid urate crystals"
    assert "gout" in ids(store.search(query, k=3, mode=mode))
    hits = store.search(query, k=5, mode=mode, exclude_ids=["gout", "tb"])
    assert "gout" not in ids(hits) and "tb" not in ids(hits)
    if mode != "bm25":
        assert len(hits) == 5  # the next best documents fill the places


@pytest.mark.parametrize("bad", [dict(query=""), dict(query="  "), dict(query="x", k=0), dict(query="x", k=101),
                                 dict(query="x", mode="fuzzy")])
def test_invalid_search_arguments_raise(store, bad):
    with pytest.raises(ValueError):
        store.search(**bad)


def test_adding_an_existing_chunk_id_replaces_it(empty_store):
    first = Chunk("up#0", "up", "Zebrafish regenerate heart tissue.")
    assert empty_store.add([first, Chunk("other#0", "other", "Something about kidneys.")]) == 2
    assert empty_store.add([Chunk("up#0", "up", "Axolotls regenerate whole limbs.")]) == 1
    assert empty_store.count() == 2
    assert ids(empty_store.search("axolotls", k=2, mode="bm25")) == ["up"]
    assert empty_store.search("zebrafish", k=2, mode="bm25") == []
    assert empty_store.search("limbs regrowing", k=1, mode="dense")[0].chunk.text.startswith("Axolotls")


def test_empty_store_finds_nothing(empty_store):
    if hasattr(empty_store, "create_index"):  # Elasticsearch: an index that exists but holds nothing
        assert empty_store.create_index() is True
    for mode in ("bm25", "dense", "hybrid"):
        assert empty_store.search("anything at all", k=3, mode=mode) == []


# ----------------------------------------------------------------------------- the DOC_RAG tool


def test_tool_accepts_text_dict_and_json(store):
    tool = document_tool(store, k=2)
    assert tool.name == "DOC_RAG"
    out = tool.invoke("allopurinol for gout")
    assert isinstance(out, str)
    assert out.startswith("[1] source: gout | title: Gout\n")
    assert "[2] source:" in out and "[3]" not in out
    one = tool.invoke({"query": "salbutamol", "k": 1, "mode": "bm25"})
    assert one.startswith("[1] source: asthma | title: Asthma management | section: TREATMENT") and "[2]" not in one
    assert tool.invoke('```json\n{"query": "salbutamol", "k": 1, "mode": "BM25"}\n```') == one


def test_tool_trims_to_its_token_budget_keeping_whole_passages_first(store):
    tool = document_tool(store, k=5, max_tokens=60, mode="dense")
    out = tool.invoke("treatment of chronic disease")
    assert count_tokens(out) <= 60
    assert out.startswith("[1] source:")
    big = document_tool(store, k=5, max_tokens=2000, mode="dense").invoke("treatment of chronic disease")
    assert big.count("source:") == 5 and len(big) > len(out)


def test_tool_excludes_ids_and_reports_no_match_as_text(store):
    tool = document_tool(store, exclude_ids=["gout"], mode="bm25")
    assert tool.invoke("allopurinol") == "No passages found for: allopurinol"
    assert "source: gout" not in document_tool(store, exclude_ids=["gout"]).invoke("allopurinol uric acid")


@pytest.mark.parametrize("bad", ["", {"query": ""}, {"query": "x", "k": 0}, {"query": "x", "mode": "fuzzy"},
                                 {"query": "x", "k": 3, "colour": "red"}, "{not json"])
def test_tool_bad_input_is_a_tool_error(store, bad):
    result = document_tool(store).invoke(bad)
    assert isinstance(result, ToolError) and result.kind == "bad_input" and result.tool == "DOC_RAG"


def test_tool_factory_validates_options(store):
    with pytest.raises(TypeError):
        document_tool("not a store")
    with pytest.raises(ValueError):
        document_tool(store, k=0)
    with pytest.raises(ValueError):
        document_tool(store, mode="fuzzy")


# ----------------------------------------------------------------------------- embedded persistence


def test_save_load_round_trip_and_exclusion(tmp_path):
    store = EmbeddedStore(embeddings=default_embeddings())
    store.add_documents(DOCS)
    store.save(tmp_path, name="kb")
    loaded = EmbeddedStore.load(tmp_path, name="kb")
    assert loaded.count() == N_CHUNKS and loaded.chunks == store.chunks
    for mode in ("bm25", "dense", "hybrid"):
        assert ids(loaded.search("heparin aspirin", k=3, mode=mode)) == ids(store.search("heparin aspirin", k=3, mode=mode))
    partial = EmbeddedStore.load(tmp_path, name="kb", exclude_ids=["mi", "asthma"])
    assert partial.count() == N_CHUNKS - 4 and not {"mi", "asthma"} & partial.source_ids


def test_load_rejects_tampered_or_foreign_stores(tmp_path):
    store = EmbeddedStore(embeddings=HashingEmbeddings())
    store.add_documents(DOCS[:3])
    assert ids(store.search("metformin glucose", k=1, mode="dense")) == ["diabetes"]  # LangChain-style embedder works
    store.save(tmp_path, name="kb")
    with pytest.raises(ValueError, match="embedded with 'test-hashing-64'"):
        EmbeddedStore.load(tmp_path, name="kb")  # default MiniLM would not match the stored vectors
    assert EmbeddedStore.load(tmp_path, name="kb", embeddings=HashingEmbeddings()).count() == store.count()
    vectors = np.load(tmp_path / "kb.vectors.f16.npy")
    np.save(tmp_path / "kb.vectors.f16.npy", vectors[::-1].copy())
    with pytest.raises(ValueError, match="does not match its manifest"):
        EmbeddedStore.load(tmp_path, name="kb", embeddings=HashingEmbeddings())
    with pytest.raises(FileNotFoundError):
        EmbeddedStore.load(tmp_path, name="missing")


def test_rrf_matches_the_formula():
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["c", "a"]], k=10))
    assert fused["a"] == pytest.approx(1 / 11 + 1 / 12)
    assert fused["c"] == pytest.approx(1 / 13 + 1 / 11)
    assert fused["b"] == pytest.approx(1 / 12)
    assert [i for i, _ in reciprocal_rank_fusion([["x", "y"], ["y", "x"]])] == ["x", "y"]  # tie: first seen wins
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([["a"]], k=0)


# ----------------------------------------------------------------------------- packaged corpus


@pytest.fixture(scope="module")
def packaged_manifest() -> dict:
    return json.loads((packaged_data_dir() / "docs_pubmedqa.manifest.json").read_text())


def test_packaged_corpus_is_small_licensed_and_complete(packaged_manifest):
    data = packaged_data_dir()
    files = sorted(data.glob("docs_pubmedqa*"))
    assert sum(f.stat().st_size for f in files) < 6_000_000
    assert "MIT License" in (data / "docs_pubmedqa.LICENSE").read_text()
    store = load_packaged_store()
    assert store.count() == packaged_manifest["count"] > 3000
    assert len(store.source_ids) == packaged_manifest["documents"] == 1000
    assert {c.section for c in store.chunks} >= {"BACKGROUND", "METHODS", "RESULTS"}


def test_packaged_corpus_ships_contexts_but_never_answers():
    from tcrag_langgraph.eval.datasets import default_data_dir

    source = default_data_dir() / "pubmedqa" / "ori_pqal.json"  # ../shared/data beside the repository
    data = json.loads(source.read_text())
    with gzip.open(packaged_data_dir() / "docs_pubmedqa.jsonl.gz", "rt") as fh:
        shipped = " ".join(json.loads(line)["text"] for line in fh)
    for pmid in list(data)[:50]:
        answer = data[pmid]["LONG_ANSWER"].strip()
        assert answer[:80] not in shipped, f"long answer of {pmid} leaked into the corpus"
        assert data[pmid]["CONTEXTS"][0][:80] in shipped


def test_default_tool_finds_and_can_exclude_pubmedqa_abstracts():
    query = "storage of vaccines in the community cold chain refrigerator temperatures"
    tool = default_document_tool(mode="bm25", k=3)
    assert "source: 1571683" in tool.invoke(query).split("\n")[0]
    held_out = default_document_tool(mode="hybrid", k=3, exclude_ids=[1571683], preload=True)
    out = held_out.invoke(query)
    assert isinstance(out, str) and "1571683" not in out and out.startswith("[1] source:")


# ----------------------------------------------------------------------------- indexing


def _write_inputs(folder: Path) -> None:
    (folder / "a.jsonl").write_text(
        json.dumps({"id": "j1", "title": "Hypertension", "text": "ACE inhibitors lower blood pressure."}) + "\n"
        + "{this is not json\n"
        + json.dumps({"id": "j2", "sections": [{"name": "RESULTS", "text": "Statins reduce LDL cholesterol."}]}) + "\n"
        + json.dumps({"id": "j3", "title": "no text here"}) + "\n"
    )
    (folder / "b.json").write_text(json.dumps({
        "111": {"QUESTION": "Does zinc shorten colds?", "CONTEXTS": ["Zinc lozenges were tested.", "Colds were shorter."],
                "LABELS": ["METHODS", "RESULTS"], "YEAR": "2010"},
    }))
    (folder / "notes").mkdir()
    (folder / "notes" / "c.md").write_text("# Sepsis\nEarly antibiotics.\n## Fluids\nCrystalloids first.")


def test_read_documents_reports_file_and_line_and_keeps_going(tmp_path):
    _write_inputs(tmp_path)
    problems = []
    docs = {d.source_id: d for d in read_documents([tmp_path], problems=problems)}
    assert set(docs) == {"j1", "j2", "111", "c"}
    assert docs["111"].title == "Does zinc shorten colds?" and [s.name for s in docs["111"].sections] == ["METHODS", "RESULTS"]
    assert docs["c"].title == "Sepsis" and [s.name for s in docs["c"].sections] == ["", "Fluids"]
    assert [(Path(p.path).name, p.line) for p in problems] == [("a.jsonl", 2), ("a.jsonl", 4)]
    assert "invalid JSON" in problems[0].message and "no text" in problems[1].message
    with pytest.raises(IndexingError) as info:
        list(read_documents([tmp_path], on_error="stop"))
    assert info.value.problem.line == 2 and str(info.value).startswith(str(tmp_path / "a.jsonl") + ":2:")


def test_build_index_then_search_and_update(tmp_path):
    (tmp_path / "in").mkdir()
    _write_inputs(tmp_path / "in")
    report = build_index([tmp_path / "in"], out=tmp_path / "idx", progress=False, chunk_tokens=32, overlap=8)
    assert (report.files, report.documents, report.chunks, len(report.problems)) == (3, 4, 6, 2)
    store = EmbeddedStore.load(tmp_path / "idx")
    assert ids(store.search("zinc lozenges", k=1, mode="bm25")) == ["111"]
    (tmp_path / "more.jsonl").write_text(json.dumps({"id": "k1", "text": "Levothyroxine treats hypothyroidism."}) + "\n")
    again = build_index([tmp_path / "more.jsonl"], out=tmp_path / "idx", progress=False)
    assert again.total_chunks == 7
    assert ids(EmbeddedStore.load(tmp_path / "idx").search("levothyroxine", k=1, mode="bm25")) == ["k1"]
    with pytest.raises(ValueError):
        build_index([tmp_path / "in"], progress=False)  # neither out nor es_url


def test_cli_index_command(tmp_path):
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    register(app)

    @app.command()
    def version() -> None:  # a second command keeps typer in multi-command mode like `tcrag`
        pass

    _write_inputs(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["index", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "idx"), "--name", "kb"])
    assert result.exit_code == 0, result.output
    assert "a.jsonl:2" in result.output and "indexed 2 documents" in result.output
    assert EmbeddedStore.load(tmp_path / "idx", name="kb").count() == 2
    stop = runner.invoke(app, ["index", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "idx2"), "--stop-on-error"])
    assert stop.exit_code == 2 and "a.jsonl:2" in stop.output and not (tmp_path / "idx2").exists()
    bad = runner.invoke(app, ["index", str(tmp_path / "a.jsonl"), "--chunk-tokens", "20", "--overlap", "20"])
    assert bad.exit_code != 0


def test_docstring_examples():
    import tcrag_langgraph.tools.indexing as indexing

    for module in (documents, indexing):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
