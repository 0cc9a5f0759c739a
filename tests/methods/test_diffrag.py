"""TCM-DiffRAG: macro-micro graph, case overlay, reasoning-path recall, the compiled graph.

Scripted chat models stand in for the LLM (replies in call order); the embedder is the real
packaged MiniLM and the graphs are real rdflib datasets.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from rdflib import Dataset, Graph, Literal, URIRef
from rdflib.namespace import RDFS
from tcrag_langgraph.tools.chunking import Document, Section, split_markdown_sections
from tcrag_langgraph.tools.documents import default_embeddings
from tcrag_langgraph.tools.knowledge_graph import KnowledgeGraph

from tcrag_langgraph.core.config import TCRAGConfig
from tcrag_langgraph.core.result import RunResult
from tcrag_langgraph.core.state import TraceEvent
from tcrag_langgraph.faces.integration import checkpoint_serde
from tcrag_langgraph.methods.diffrag import (
    BOOK_GRAPH,
    CASE_GRAPH,
    HALT_REASONS,
    SPARQL_QUERIES,
    DiffRAGKnowledge,
    DiffRAGOptions,
    SolvedCase,
    Triple,
    add_cases,
    build_macro_micro_graph,
    building,  # where default_knowledge reads its memo and cache dir
    extract_triples,
    packaged_documents,
    parse_triples,
    recall,
)
from tcrag_langgraph.methods.diffrag.prompts import EXTRACT_SYSTEM
from tcrag_langgraph.methods.registry import build_diffrag_graph
from tcrag_langgraph.testing import recording_model

Q = "What is the first-line drug for type 2 diabetes?"


@pytest.fixture(scope="module")
def minilm():
    return default_embeddings()


def _docs() -> list[Document]:
    title, sections = split_markdown_sections(
        "# Diabetes\n## Treatment\nMetformin is first-line therapy for type 2 diabetes.\n"
        "## Complications\nDiabetes damages the retina."
    )
    return [
        Document("diab", title=title, sections=sections),
        Document("asth", title="Asthma", sections=(Section("Acute care", "Salbutamol relieves acute asthma attacks."),)),
    ]


def _knowledge() -> DiffRAGKnowledge:
    model = recording_model([
        "metformin | is first-line therapy for | type 2 diabetes",
        "diabetes | damages | retina",
        "salbutamol | relieves | acute asthma attacks",
    ])
    return build_macro_micro_graph(_docs(), model=model, book="Handbook")


# ------------------------------------------------------------------ parsing


def test_parse_triples_reads_repairs_and_rejects():
    text = ("Triples:\n1. Aspirin | reduces | stroke risk\n- (insulin, lowers, blood glucose)\n"
            "aspirin | REDUCES | Stroke Risk\njust prose\na | b\n | x | y\n? | causes | fever")
    parsed = parse_triples(text, max_triples=10)
    assert [t.as_list() for t in parsed.triples] == [["Aspirin", "reduces", "stroke risk"],
                                                     ["insulin", "lowers", "blood glucose"]]
    assert list(parsed.problems) == [
        "line 5 'just prose': not 'subject | relation | object'", "line 6 'a | b': not 'subject | relation | object'",
        "line 7 '| x | y': not 'subject | relation | object'", "line 8 '? | causes | fever': '?' is not a fact"]
    json_form = parse_triples('[["a", "b", "c"], {"subject": "x", "relation": "y", "object": "z"}, [1, 2]]',
                              max_triples=5)
    assert [t.as_list() for t in json_form.triples] == [["a", "b", "c"], ["x", "y", "z"]]
    assert json_form.problems == ("item 3: not 'subject | relation | object'",)


def test_parse_triples_bounds_unknowns_and_bad_arguments():
    many = "\n".join(f"s{i} | r | o{i}" for i in range(6))
    parsed = parse_triples(many, max_triples=3)
    assert len(parsed.triples) == 3 and "more than 3" in parsed.problems[-1]
    path = parse_triples("? | is first-line drug for | type 2 diabetes", max_triples=3, allow_unknown=True)
    assert path.triples[0].subject == "?" and path.triples[0].text == "is first-line drug for type 2 diabetes"
    assert parse_triples("x | ? | y", max_triples=3, allow_unknown=True).triples == ()
    with pytest.raises(ValueError):
        parse_triples(None, max_triples=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        parse_triples("a | b | c", max_triples=0)
    with pytest.raises(ValueError):
        Triple(subject="a" * 201, relation="b", object="c")


def test_extract_triples_reprompts_then_gives_up_bounded():
    model = recording_model(["I think aspirin helps.", "aspirin | prevents | stroke"])
    got = extract_triples(model, EXTRACT_SYSTEM, "Aspirin prevents stroke.", max_triples=4,
                          max_retries=1, max_new_tokens=32)
    assert [t.as_list() for t in got] == [["aspirin", "prevents", "stroke"]]
    assert len(model.seen) == 2 and "no usable triple" in model.seen[1][-1].content
    junk = recording_model(["no triples here"])
    assert extract_triples(junk, EXTRACT_SYSTEM, "x", max_triples=4, max_retries=2, max_new_tokens=32) == ()
    assert len(junk.seen) == 3


# ------------------------------------------------------------------ macro-micro graph


def test_heading_tree_and_passages():
    k = _knowledge()
    assert k.heading_tree() == {"Handbook": {
        "Asthma": {"Acute care": ["asth#0"]},
        "Diabetes": {"Complications": ["diab#1"], "Treatment": ["diab#0"]},
    }}
    assert len(k.cases) == 0


def test_every_triple_links_to_the_passage_it_came_from():
    k = _knowledge()
    found = {tuple(t.as_list()): [p["id"] for p in k.passages_of(node)] for t, node in k.triples("general")}
    assert found == {
        ("metformin", "is first-line therapy for", "type 2 diabetes"): ["diab#0"],
        ("diabetes", "damages", "retina"): ["diab#1"],
        ("salbutamol", "relieves", "acute asthma attacks"): ["asth#0"],
    }
    (passage,) = k.passages_of(next(n for t, n in k.triples("general") if t.subject == "diabetes"))
    assert passage == {"id": "diab#1", "chapter": "Diabetes", "section": "Complications",
                       "text": "Diabetes damages the retina."}
    # the same fact from a second passage links to both
    again = recording_model(["Diabetes | damages | RETINA"])
    build_macro_micro_graph([Document("eye", title="Eyes", text="Diabetic retinopathy.")], model=again,
                            book="Handbook", knowledge=k)
    node = next(n for t, n in k.triples("general") if t.subject == "diabetes")
    assert [p["id"] for p in k.passages_of(node)] == ["diab#1", "eye#0"]


def test_max_passages_bounds_the_model_calls():
    model = recording_model(["a | b | c"])
    k = build_macro_micro_graph(_docs(), model=model, options=DiffRAGOptions(max_passages=2))
    assert len(model.seen) == 2
    assert sum(len(s) for ch in k.heading_tree()["documents"].values() for s in ch.values()) == 2


def test_packaged_documents_are_pubmedqa_abstracts_with_sections():
    docs = packaged_documents(max_passages=5)
    assert docs and all(d.sections for d in docs)
    assert sum(len(d.sections) for d in docs) >= 5
    assert docs[0].sections[0].name.isupper()  # PubMedQA labels: OBJECTIVE, METHODS, ...
    with pytest.raises(ValueError):
        packaged_documents(max_passages=0)


# ------------------------------------------------------------------ case overlay


def _case() -> SolvedCase:
    return SolvedCase(case_id="case-7", question="New diabetic, which drug first?",
                      reasoning="Guidelines start metformin.", answer="metformin")


def test_case_overlay_links_triples_to_cases_and_leaves_the_general_graph_alone():
    k = _knowledge()
    before = set(k.book)
    model = recording_model(["metformin | is first-line therapy for | type 2 diabetes\n"
                             "metformin | is avoided in | severe renal failure"])
    found = add_cases(k, [_case()], model=model)
    assert [t.as_list() for t in found["case-7"]][1] == ["metformin", "is avoided in", "severe renal failure"]
    assert set(k.book) == before
    personal = {tuple(t.as_list()): k.cases_of(n) for t, n in k.triples("personal")}
    assert [c["id"] for c in personal[("metformin", "is avoided in", "severe renal failure")]] == ["case-7"]
    assert personal[("metformin", "is avoided in", "severe renal failure")][0]["reasoning"] == "Guidelines start metformin."
    assert len(k.triples("general")) == 3  # the overlay did not add to the general layer
    with pytest.raises(ValueError):
        SolvedCase(case_id=" ", question="q", answer="a")
    with pytest.raises(ValueError):
        k.add_triple(Triple(subject="a", relation="b", object="c"))


def test_overlay_shadows_the_same_fact_and_extends_with_new_ones(minilm):
    k = _knowledge()
    add_cases(k, [_case()], model=recording_model([
        "Metformin | is first-line therapy for | Type 2 diabetes\nmetformin | is avoided in | severe renal failure"]))
    path = [Triple(subject="metformin", relation="is first-line therapy for", object="type 2 diabetes"),
            Triple(subject="metformin", relation="contraindicated in", object="renal failure")]
    got = recall(k, path, embeddings=minilm, options=DiffRAGOptions(top_k=1), general_kg=None)
    first, second = got
    assert first.layer == "personal" and first.path_index == 0
    assert [c["id"] for c in first.cases] == ["case-7"] and [p["id"] for p in first.passages] == ["diab#0"]
    assert second.triple == ["metformin", "is avoided in", "severe renal failure"] and second.layer == "personal"
    assert second.passages == [] and [c["id"] for c in second.cases] == ["case-7"]


# ------------------------------------------------------------------ semantic matching (real MiniLM)


@pytest.mark.parametrize("query,expected", [
    (("which medicine", "is the initial treatment for", "type II diabetes mellitus"), "metformin"),
    (("inhaler", "eases", "sudden asthma symptoms"), "salbutamol"),
    (("high blood sugar", "harms", "the eyes"), "diabetes"),
])
def test_paraphrased_path_triple_ranks_the_right_graph_triple_first(minilm, query, expected):
    k = _knowledge()
    path = [Triple(subject=query[0], relation=query[1], object=query[2])]
    got = recall(k, path, embeddings=minilm, options=DiffRAGOptions(top_k=3, min_similarity=-1.0), general_kg=None)
    assert len(got) == 3
    assert got[0].triple[0] == expected
    assert got[0].similarity > got[1].similarity


def test_general_kg_neighbours_are_recalled_with_their_iris(minilm):
    g = Graph()
    ex = "http://example.org/"
    marfan, arach = URIRef(ex + "marfan"), URIRef(ex + "arachnodactyly")
    g.add((marfan, RDFS.label, Literal("Marfan syndrome")))
    g.add((arach, RDFS.label, Literal("Arachnodactyly")))
    g.add((URIRef("urn:tcrag:kg:has_phenotype"), RDFS.label, Literal("has phenotype")))
    g.add((marfan, URIRef("urn:tcrag:kg:has_phenotype"), arach))
    kg = KnowledgeGraph(g)
    path = [Triple(subject="Marfan syndrome", relation="shows", object="long spider-like fingers")]
    got = recall(DiffRAGKnowledge(), path, embeddings=minilm, options=DiffRAGOptions(min_similarity=0.0), general_kg=kg)
    assert [(r.layer, r.triple) for r in got] == [("kg", ["Marfan syndrome", "has phenotype", "Arachnodactyly"])]
    assert got[0].kg == {"s": ex + "marfan", "p": "urn:tcrag:kg:has_phenotype", "o": ex + "arachnodactyly"}
    off = recall(DiffRAGKnowledge(), path, embeddings=minilm, options=DiffRAGOptions(use_general_kg=False), general_kg=kg)
    assert off == []


# ------------------------------------------------------------------ the compiled graph


def _graph(replies: list[str], **kwargs: Any):
    model = recording_model(replies)
    k = kwargs.pop("knowledge", None) or _knowledge()
    return build_diffrag_graph(model=model, knowledge=k, general_kg=None, **kwargs), model


def test_run_recalls_along_the_path_and_answers_from_evidence_with_sources():
    graph, model = _graph(["? | is first-line drug for | type 2 diabetes\nmetformin | treats | diabetes",
                           "Metformin, per passage diab#0.\nAnswer: metformin"])
    out = graph.invoke({"question": Q})
    assert out["halt_reason"] == "answered" and out["answer"] == "metformin"
    assert out["reasoning_path"] == [["?", "is first-line drug for", "type 2 diabetes"], ["metformin", "treats", "diabetes"]]
    top = out["evidence"][0]
    assert top["triple"] == ["metformin", "is first-line therapy for", "type 2 diabetes"]
    assert top["passages"][0]["id"] == "diab#0" and "Metformin is first-line" in top["passages"][0]["text"]
    answer_prompt = model.seen[1][-1].content
    assert "passage diab#0 (Diabetes > Treatment): Metformin is first-line therapy" in answer_prompt
    assert out["llm_calls"] == 2 and out["tool_calls"] == 0 and out["retrievals"] == 2 and out["steps"] == 3
    assert out["token_usage"]["prompt"] > 0 and out["token_usage"]["completion"] > 0
    assert [(type(m).__name__, m.content) for m in out["messages"]] == [("HumanMessage", Q), ("AIMessage", "metformin")]
    result = RunResult.from_state(out)
    assert result.answer == "metformin" and result.halt_reason == "answered" and result.llm_calls == 2
    # the evidence a row records is the text the answering model read, passages included
    assert len(result.evidence) == 1 and result.evidence[0] in answer_prompt and "diab#0" in result.evidence[0]


def test_the_graph_recall_counts_as_one_retrieval_in_the_eval_costs():
    from tcrag_langgraph.eval.efficiency import UsageMeter

    graph, _ = _graph(["? | is first-line drug for | type 2 diabetes", "Metformin.\nAnswer: metformin"])
    meter = UsageMeter()
    out = graph.invoke({"question": Q}, config={"callbacks": [meter]})
    assert out["answer"] == "metformin" and out["tool_calls"] == 0
    assert meter.retrievals == 1 and meter.llm_calls == 2 and meter.tool_names == []


def test_unparseable_path_falls_back_to_the_question_and_says_so():
    graph, model = _graph(["I am not sure.", "still prose", "Answer: metformin"])
    out = graph.invoke({"question": Q})
    assert out["path_source"] == "question" and out["reasoning_path"] == []
    assert [(e.action, e.op) for e in out["trace"]][:3] == [("User_Query", "push"), ("Reasoning_Path", "format_error"),
                                                            ("Reasoning_Path", "push")]
    assert out["evidence"] and out["evidence"][0]["triple"][0] == "metformin"
    assert out["llm_calls"] == 3  # one path call + one re-prompt (max_format_retries=1) + the answer


def test_events_stream_in_order_and_match_the_trace():
    graph, _ = _graph(["metformin | treats | type 2 diabetes", "Answer: metformin"])
    events = [c for mode, c in graph.stream({"question": Q}, stream_mode=["custom", "values"]) if mode == "custom"]
    assert [(e["action"], e["op"]) for e in events] == [
        ("User_Query", "push"), ("Reasoning_Path", "push"), ("Recall", "push"), ("Answer", "push"), ("Halt", "halt")]
    assert all(e["type"] == "tcrag" for e in events)
    recalled = json.loads(events[2]["detail"])["recalled"]
    assert recalled[0]["passages"] == ["diab#0"]


def test_checkpointed_run_restores_its_state():
    saver = InMemorySaver(serde=checkpoint_serde())
    graph, _ = _graph(["metformin | treats | type 2 diabetes", "Answer: metformin"], checkpointer=saver)
    cfg = {"configurable": {"thread_id": "t1"}}
    out = graph.invoke({"question": Q}, cfg)
    saved = graph.get_state(cfg).values
    assert saved["answer"] == out["answer"] == "metformin"
    assert saved["evidence"] == out["evidence"] and all(isinstance(e, TraceEvent) for e in saved["trace"])
    history = list(graph.get_state_history(cfg))
    assert {s.next for s in history} >= {("Recall",), ("Answer",)}


def test_per_run_options_through_context():
    graph, _ = _graph(["metformin | treats | type 2 diabetes\nsalbutamol | relieves | asthma", "Answer: x"])
    wide = graph.invoke({"question": Q}, context={"min_similarity": -1.0, "top_k": 3})
    graph2, _ = _graph(["metformin | treats | type 2 diabetes\nsalbutamol | relieves | asthma", "Answer: x"])
    narrow = graph2.invoke({"question": Q}, context={"min_similarity": -1.0, "top_k": 3, "max_evidence": 1})
    assert len(wide["evidence"]) == 3 and len(narrow["evidence"]) == 1


def test_answer_format_is_enforced_with_bounded_reprompts():
    graph, model = _graph(["metformin | treats | type 2 diabetes", "Answer: probably", "Answer: Yes."],
                          config=TCRAGConfig(answer_format=["yes", "no", "maybe"], max_format_retries=1))
    out = graph.invoke({"question": "Is metformin first-line for type 2 diabetes?"})
    assert out["halt_reason"] == "answered" and out["structured_answer"] == "yes"
    assert "exactly one of: yes, no, maybe" in model.seen[1][0].content
    assert "could not be used" in model.seen[2][-1].content and out["llm_calls"] == 3
    stubborn, _ = _graph(["metformin | treats | type 2 diabetes", "Answer: probably"])
    out = stubborn.invoke({"question": "Is metformin first-line?"},  # the eval runner's context shape
                          context={"answer_format": ["yes", "no"], "max_format_retries": 2})
    assert out["halt_reason"] == "format_error" and out["structured_answer"] is None
    assert out["llm_calls"] == 1 + 3 and "after 2 re-prompts" in out["error"]
    typed, _ = _graph(["metformin | treats | type 2 diabetes", "Answer: No."])
    out = typed.invoke({"question": "Is insulin first-line?"}, context=TCRAGConfig(answer_format=["yes", "no"]))
    assert out["halt_reason"] == "answered" and out["structured_answer"] == "no"


def test_context_of_the_wrong_type_is_refused():
    graph, _ = _graph(["metformin | treats | type 2 diabetes", "Answer: x"])
    with pytest.raises(ValueError, match="context must be"):
        graph.invoke({"question": Q}, context=["top_k", 1])


@pytest.mark.parametrize("question,why", [("", "empty"), ("   ?!  ", "no readable text"), (42, "must be text")])
def test_bad_input_halts_invalid_input_without_calling_the_model(question, why):
    graph, model = _graph(["a | b | c"])
    out = graph.invoke({"question": question})
    assert out["halt_reason"] == "invalid_input" and why in out["error"] and out["answer"] is None
    assert model.seen == [] and out["trace"][-1].op == "halt"


def test_question_from_messages_and_a_second_chat_turn():
    saver = InMemorySaver(serde=checkpoint_serde())
    graph, _ = _graph(["metformin | treats | type 2 diabetes", "Answer: metformin"], checkpointer=saver)
    cfg = {"configurable": {"thread_id": "chat"}}
    out = graph.invoke({"messages": [HumanMessage(content=Q)]}, cfg)
    assert out["question"] == Q and out["answer"] == "metformin" and len(out["messages"]) == 2
    follow_up = "Which drug relieves an acute asthma attack?"
    out = graph.invoke({"messages": [HumanMessage(content=follow_up)]}, cfg)  # newer than the stored question
    assert out["question"] == follow_up and len(out["messages"]) == 4
    assert [e.action for e in out["trace"]][0] == "User_Query" and out["trace"][0].content == follow_up


class _Broken(BaseChatModel):
    @property
    def _llm_type(self) -> str:
        return "broken"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        raise RuntimeError("backend down")


def test_model_error_halts_with_the_reason():
    out = build_diffrag_graph(model=_Broken(), knowledge=_knowledge(), general_kg=None).invoke({"question": Q})
    assert out["halt_reason"] == "model_error" and "backend down" in out["error"]
    assert out["halt_reason"] in HALT_REASONS


def test_bad_arguments_are_clear_errors():
    """TypeError for a wrong type, ValueError for a bad value (the same rule for every builder)."""
    model = recording_model(["x"])
    with pytest.raises(ValueError):
        build_diffrag_graph(model=model, options={"top_k": 0})
    with pytest.raises(TypeError):
        build_diffrag_graph(model=model, knowledge="graph.nq")
    with pytest.raises(ValueError):
        build_diffrag_graph(model=model, knowledge=_knowledge(), cases=[_case()])
    with pytest.raises(TypeError):
        build_diffrag_graph(model=model, tools=["DOC_RAG"])
    with pytest.raises(ValueError):
        build_diffrag_graph(model=model, general_kg="remote")
    with pytest.raises(ValueError):
        DiffRAGKnowledge(dataset=Graph())
    with pytest.raises(ValueError):
        _knowledge().triples("everything")  # type: ignore[arg-type]


# ------------------------------------------------------------------ SPARQL hygiene, persistence, lazy default


def test_only_constant_queries_with_bound_values(monkeypatch, minilm):
    k = DiffRAGKnowledge()
    evil = 'x" } ; DROP ALL ; INSERT DATA { <a> <b> "c'
    p = k.add_passage(book="B", chapter=evil, section="S", chunk_id="e#0", text=evil)
    k.add_triple(Triple(subject=evil, relation="is", object="text"), passage=p)
    seen: list[tuple[str, dict]] = []
    real = Dataset.query

    def spy(self, query, *args, **kwargs):
        seen.append((query, kwargs.get("initBindings")))
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(Dataset, "query", spy)
    got = recall(k, [Triple(subject=evil, relation="is", object="text")], embeddings=minilm,
                 options=DiffRAGOptions(), general_kg=None)
    assert got[0].triple[0] == evil and got[0].passages[0]["chapter"] == evil
    assert k.heading_tree() == {"B": {evil: {"S": ["e#0"]}}}
    assert seen and all(q in SPARQL_QUERIES and b for q, b in seen)
    assert len(k.dataset) == len(k.book) + len(k.cases)  # nothing was inserted or dropped
    with pytest.raises(ValueError):
        k._select("SELECT * WHERE { ?s ?p ?o }")


def test_save_and_load_round_trip(tmp_path):
    k = _knowledge()
    add_cases(k, [_case()], model=recording_model(["metformin | is avoided in | renal failure"]))
    path = k.save(tmp_path / "k.nq.gz")
    back = DiffRAGKnowledge.load(path)
    assert set(back.book) == set(k.book) and set(back.cases) == set(k.cases)
    assert back.heading_tree() == k.heading_tree()
    assert {g.identifier for g in back.dataset.graphs()} >= {BOOK_GRAPH, CASE_GRAPH}


def test_default_graph_builds_lazily_from_packaged_abstracts_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(building, "_DEFAULT_MEMO", {})
    reply = "vaccines | are stored in | refrigerators\nAnswer: yes"  # reads as a triple and as an answer
    model = recording_model([reply])
    options = DiffRAGOptions(max_passages=2, min_similarity=-1.0)
    graph = build_diffrag_graph(model=model, options=options, general_kg=None, model_id="scripted")
    assert model.seen == []  # nothing is built before the first run
    out = graph.invoke({"question": "Are vaccines stored in refrigerators?"})
    assert out["halt_reason"] == "answered"
    cached = list((tmp_path / "diffrag").glob("*.nq.gz"))
    assert len(cached) == 1
    assert out["evidence"][0]["passages"][0]["id"].startswith(packaged_documents(max_passages=1)[0].source_id)
    assert out["llm_calls"] == 2  # the run's own calls; the 2 extraction calls were the build
    assert len(model.seen) == 2 + 2
    assert any(e.action == "Knowledge_Graph" for e in out["trace"]) is False  # build events are live-only
    monkeypatch.setattr(building, "_DEFAULT_MEMO", {})
    again = recording_model([reply])
    build_diffrag_graph(model=again, options=options, general_kg=None, model_id="scripted").invoke(
        {"question": "Vaccine storage?"})
    assert len(again.seen) == 2  # loaded from disk: no extraction calls
    assert DiffRAGKnowledge.load(cached[0]).heading_tree()["PubMedQA-L abstracts"]
    # another model's name gets its own graph, and a model with no name is never cached on disk
    other = recording_model([reply])
    build_diffrag_graph(model=other, options=options, general_kg=None).invoke({"question": "Vaccine storage?"})
    assert len(other.seen) == 4 and len(list((tmp_path / "diffrag").glob("*.nq.gz"))) == 1


def test_registered_for_eval():
    from tcrag_langgraph.methods.registry import METHODS, build_method

    assert METHODS["diffrag"].builder == "tcrag_langgraph.methods.diffrag.graph:DiffRAG.build"
    graph = build_method("diffrag", model=recording_model(["a | b | c"]), tools=[], config=TCRAGConfig(max_new_tokens=32))
    assert set(graph.get_graph().nodes) >= {"Start", "Reasoning_Path", "Recall", "Answer"}


# ------------------------------------------------------------------ end to end, real model


@pytest.mark.slow
def test_end_to_end_with_the_packaged_model(tmp_path, monkeypatch, one_torch_thread):
    from tcrag_langgraph.models.local import LocalChatModel

    monkeypatch.setattr(building, "knowledge_cache_dir", lambda: tmp_path)  # the model's own cache stays shared
    monkeypatch.setattr(building, "_DEFAULT_MEMO", {})
    options = DiffRAGOptions(max_passages=3, max_triples_per_passage=4, max_path_triples=3, max_new_tokens=64)
    graph = build_diffrag_graph(model=LocalChatModel(), options=options, config=TCRAGConfig(temperature=0.0),
                                checkpointer=InMemorySaver(serde=checkpoint_serde()))
    events = []
    final = None
    for mode, chunk in graph.stream({"question": "Are vaccines stored correctly in general practice refrigerators?"},
                                    {"configurable": {"thread_id": "e2e"}}, stream_mode=["custom", "values"]):
        (events if mode == "custom" else [None]).append(chunk)
        final = chunk if mode == "values" else final
    assert final["halt_reason"] in HALT_REASONS
    assert final["llm_calls"] <= options.max_format_retries + 2
    assert final["trace"][0].action == "User_Query" and final["trace"][-1].op == "halt"
    run_events = [(e["action"], e["op"]) for e in events if e["action"] not in ("Extract_Triples", "Knowledge_Graph")]
    assert run_events == [(e.action, e.op) for e in final["trace"]]
    built = [e for e in events if e["action"] == "Extract_Triples"]
    assert len(built) == options.max_passages
    for e in final["evidence"]:  # every recalled fact names where it came from
        assert e["passages"] or e["cases"] or e["kg"]
    print(json.dumps({"answer": final["answer"], "path": final["reasoning_path"],
                      "evidence": [e["triple"] for e in final["evidence"]]}, indent=1))
