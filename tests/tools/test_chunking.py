"""Chunking: token windows with overlap, sections never straddled, ids/titles/positions kept."""

from __future__ import annotations

import doctest

import pytest

import tcrag_langgraph.tools.chunking as chunking
from tcrag_langgraph.tools.tokens import count_tokens
from tcrag_langgraph.tools.chunking import (
    Chunk,
    Document,
    Section,
    chunk_document,
    chunk_documents,
    split_markdown_sections,
    split_token_windows,
)

WORDS = ("insulin glucose kidney liver heart lung brain blood cell protein gene dose trial risk "
         "patient therapy cancer tumour infection virus").split()


def prose(n_words: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + offset) % len(WORDS)] + ("." if i % 11 == 10 else "") for i in range(n_words))


def _spans(text: str, windows: list[str]) -> list[tuple[int, int]]:
    spans, pos = [], 0
    for window in windows:
        at = text.find(window, pos)
        assert at >= 0, f"window not found in order: {window[:40]!r}"
        spans.append((at, at + len(window)))
        pos = at + 1
    return spans


@pytest.mark.parametrize("size,overlap", [(128, 50), (32, 8), (16, 0), (10, 9)])
def test_windows_respect_size_overlap_and_word_boundaries(size, overlap):
    text = prose(300)
    windows = split_token_windows(text, chunk_tokens=size, overlap=overlap)
    total = count_tokens(text)
    assert len(windows) >= total // size
    spans = _spans(text, windows)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)  # the whole text is covered ...
    vocabulary = set(WORDS)
    for window, (a, b), nxt in zip(windows, spans, spans[1:] + [None]):
        assert count_tokens(window) <= size
        assert (a == 0 or text[a - 1] == " ") and (b == len(text) or text[b] == " ")  # whole words only
        assert all(w.rstrip(".") in vocabulary for w in window.split())
        if nxt is not None:
            assert nxt[0] <= b + 1  # ... without gaps
            # shared tokens, counted as tokenized inside the text (with the leading space)
            shared = count_tokens(" " + text[nxt[0] : b]) if nxt[0] < b else 0
            assert shared <= overlap  # never more overlap than asked
            if overlap >= 8:
                assert shared >= overlap - 4  # and about as much as asked


def test_long_word_without_spaces_is_cut_at_tokens():
    word = "pneumonoultramicroscopicsilicovolcanoconiosis" * 4
    windows = split_token_windows(word, chunk_tokens=5, overlap=1)
    assert len(windows) > 3
    assert "".join(w for w in windows) .startswith(windows[0])
    assert all(w in word for w in windows)


def test_short_text_is_one_window_and_blank_text_none():
    assert split_token_windows("Aspirin inhibits COX-1.") == ["Aspirin inhibits COX-1."]
    assert split_token_windows("   \n ") == []


def test_multibyte_text_is_never_broken():
    text = "Patientin mit Übelkeit — 糖尿病患者的血糖控制 " * 40 + "naïve café"
    windows = split_token_windows(text, chunk_tokens=7, overlap=3)
    assert len(windows) > 10
    for window in windows:
        assert "\ufffd" not in window
        assert window in text


@pytest.mark.parametrize("size,overlap", [(0, 0), (10, 10), (10, 11), (5, -1)])
def test_invalid_sizes_are_rejected(size, overlap):
    with pytest.raises(ValueError):
        split_token_windows("text", chunk_tokens=size, overlap=overlap)


def test_sections_are_not_straddled_and_keep_metadata():
    sections = (Section("BACKGROUND", prose(150, 1)), Section("METHODS", prose(20, 2)), Section("RESULTS", prose(200, 3)))
    doc = Document("pmid-9", title="Does X help Y?", sections=sections, metadata={"year": "2001"})
    chunks = chunk_document(doc, chunk_tokens=40, overlap=10)
    assert [c.position for c in chunks] == list(range(len(chunks)))
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    by_section = {s.name: s.text for s in sections}
    seen = []
    for c in chunks:
        assert c.source_id == "pmid-9" and c.title == "Does X help Y?" and c.metadata["year"] == "2001"
        assert c.text in by_section[c.section], "a chunk must lie inside its own section"
        if not seen or seen[-1] != c.section:
            seen.append(c.section)
    assert seen == ["BACKGROUND", "METHODS", "RESULTS"]  # in order, each contiguous
    assert sum(1 for c in chunks if c.section == "METHODS") == 1


def test_plain_text_and_sections_together_and_empty_sections_skipped():
    doc = Document("d", text="Lead paragraph.", sections=(Section("A", "  "), Section("B", "Body.")))
    assert [(c.section, c.text) for c in chunk_document(doc)] == [("", "Lead paragraph."), ("B", "Body.")]


def test_chunk_documents_is_lazy_and_ordered():
    docs = (Document(f"d{i}", text=f"text number {i}") for i in range(3))
    it = chunk_documents(docs)
    assert next(it).source_id == "d0"
    assert [c.source_id for c in it] == ["d1", "d2"]


def test_chunk_round_trip_and_validation():
    c = Chunk("x#2", "x", "Body", title="T", section="S", position=2, metadata={"k": 1})
    assert Chunk.from_dict(c.to_dict()) == c
    assert c.search_text == "T\nS\nBody"
    with pytest.raises(ValueError):
        Chunk("x#0", "x", "   ")
    with pytest.raises(ValueError):
        Chunk("", "x", "t")
    with pytest.raises(ValueError):
        Chunk("x#0", "x", "t", position=-1)
    with pytest.raises(ValueError):
        Document(" ", text="t")
    with pytest.raises(TypeError):
        Document("d", sections=("not a section",))


def test_markdown_headings_become_sections():
    text = "# Heart failure\nOverview.\n\n## Diagnosis\nBNP test.\n```\n# not a heading\n```\n## Treatment ##\nDiuretics."
    title, sections = split_markdown_sections(text)
    assert title == "Heart failure"
    assert [s.name for s in sections] == ["", "Diagnosis", "Treatment"]
    assert "# not a heading" in sections[1].text
    assert sections[2].text == "Diuretics."
    assert split_markdown_sections("no headings here") == ("", (Section("", "no headings here"),))


def test_docstring_examples():
    result = doctest.testmod(chunking, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
