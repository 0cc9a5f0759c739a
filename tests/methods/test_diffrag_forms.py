"""TCM-DiffRAG's declared triple form (:mod:`tcrag_langgraph.methods.diffrag.reply_forms`) against
:func:`parse_triples`, decided by llama.cpp's own grammar engine, an extraction by the packaged model
under it, and the graph cache that keeps triples written under a grammar apart from the others."""

from __future__ import annotations

import pytest

from tcrag_langgraph.core.config import TCRAGConfig
from tcrag_langgraph.methods.diffrag import extract_triples, parse_triples
from tcrag_langgraph.methods.diffrag.building import _content_key
from tcrag_langgraph.methods.diffrag.options import DiffRAGOptions
from tcrag_langgraph.methods.diffrag.prompts import EXTRACT_SYSTEM
from tcrag_langgraph.methods.diffrag.reply_forms import triples_form
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_grammar import grammar_accepts


@pytest.fixture(scope="module")
def chat():
    return LlamaCppChatModel(n_threads=1, temperature=0.0)


@pytest.mark.parametrize("reply, admitted", [
    ("aspirin | lowers risk of | stroke", True),
    ("aspirin | lowers risk of | stroke\nlung cancer | has risk factor | ?", True),
    ("Here are the triples:\naspirin | lowers | stroke", False),  # a preamble
    ("a | b | c\nd | e | f\ng | h | i", False),  # more than n = 2 lines
    ("aspirin | stroke", False),  # two parts
])
def test_the_triple_form_admits_lines_the_parser_reads_and_nothing_around_them(chat, reply, admitted):
    assert grammar_accepts(chat.llama_model, triples_form(2).grammar, reply) is admitted
    if admitted:
        assert len(parse_triples(reply, max_triples=2, allow_unknown=True).triples) == reply.count("\n") + 1


def test_an_extraction_by_the_packaged_model_under_the_form_gives_a_triple(chat):
    """Unconstrained, the 135M model copies the sentence (no triple); under the form it must write the
    parts, and the part bound keeps it from writing digits to the end of its budget instead of a "|"."""
    text = "Text:\nMetformin lowers blood glucose in adults with type 2 diabetes.\n\nTriples:"
    free = extract_triples(chat, EXTRACT_SYSTEM, text, max_triples=1, max_retries=0, max_new_tokens=90,
                           constrain=False)
    triples = extract_triples(chat, EXTRACT_SYSTEM, text, max_triples=1, max_retries=0, max_new_tokens=90)
    assert free == () and len(triples) == 1


def test_a_graph_built_under_a_grammar_is_cached_apart_and_the_others_keep_their_key():
    options = DiffRAGOptions()
    plain = _content_key("m", [], [], options, 96)
    assert _content_key("m", [], [], options, 96, None) == plain
    assert _content_key("m", [], [], options, 96, "grammar") != plain
    assert TCRAGConfig().constrain_replies is True


def test_a_batched_build_extracts_every_passage_in_order_from_the_model_decoding_them_together(chat):
    """Five packaged passages, three decoded at a time by the packaged model (continuous batching): every
    passage is reported once, in the order of a one-at-a-time build, with a counted call, and each triple
    it reports is in the graph under its passage."""
    from tcrag_langgraph.methods.diffrag.building import build_macro_micro_graph, packaged_documents

    def build(sequences: int):
        seen = []
        knowledge = build_macro_micro_graph(
            packaged_documents(max_passages=5), model=chat, config=TCRAGConfig(max_new_tokens=40),
            options=DiffRAGOptions(max_passages=5, max_triples_per_passage=2, extract_sequences=sequences),
            on_passage=lambda chunk_id, triples, calls: seen.append((chunk_id, triples, calls)))
        return knowledge, seen

    knowledge, seen = build(3)
    _, plain = build(1)
    assert [c for c, _, _ in seen] == [c for c, _, _ in plain] and len(seen) == 5
    assert all(calls.llm_calls >= 1 and calls.prompt_tokens > 0 for _, _, calls in seen)
    stored = {t for t, _ in knowledge.triples("general")}
    assert {t for _, triples, _ in seen for t in triples} == stored and stored


def test_a_model_that_cannot_decode_together_builds_one_passage_at_a_time_and_keeps_its_cache_key():
    from tcrag_langgraph.methods.diffrag.building import build_macro_micro_graph, packaged_documents
    from tcrag_langgraph.testing import recording_model

    reply = "vaccines | are stored in | refrigerators"
    graphs = []
    for sequences in (1, 4):
        model = recording_model([reply] * 3)
        knowledge = build_macro_micro_graph(packaged_documents(max_passages=3), model=model,
                                            options=DiffRAGOptions(max_passages=3, extract_sequences=sequences))
        graphs.append(sorted(str(t) for t, _ in knowledge.triples("general")))
        assert len(model.seen) == 3
    assert graphs[0] == graphs[1]
    batched = DiffRAGOptions(extract_sequences=4)
    assert _content_key("m", [], [], batched, 96) == _content_key("m", [], [], DiffRAGOptions(), 96)
    assert _content_key("m", [], [], batched, 96, together=True) != _content_key("m", [], [], batched, 96)
