"""Token-based, heading-aware chunking of documents for retrieval.

Documents are cut into windows of ``chunk_tokens`` cl100k tokens (tiktoken, offline) that
overlap by ``overlap`` tokens; the paper uses 128 tokens with 50 overlap. When a document has
sections (an abstract's BACKGROUND / METHODS / RESULTS, or markdown ``#`` headings) every
section is chunked on its own, so no chunk straddles two sections, and each chunk keeps its
source id, title, section name and position in the document.

Windows are cut at token boundaries but sliced out of the original string by character
offsets, so a chunk never contains a broken multi-byte character.

Example:
    >>> from tcrag_langgraph.tools.chunking import Document, Section, chunk_document
    >>> doc = Document("pmid-1", title="Aspirin and stroke", sections=(
    ...     Section("BACKGROUND", "Aspirin is an antiplatelet drug."),
    ...     Section("RESULTS", "Aspirin reduced recurrent stroke."),
    ... ))
    >>> [(c.chunk_id, c.section) for c in chunk_document(doc, chunk_tokens=128, overlap=50)]
    [('pmid-1#0', 'BACKGROUND'), ('pmid-1#1', 'RESULTS')]
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping

from .tokens import count_tokens, get_encoding

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_OVERLAP",
    "Chunk",
    "Document",
    "Section",
    "chunk_document",
    "chunk_documents",
    "split_token_windows",
    "split_markdown_sections",
]

#: Paper defaults (TC-RAG, section on retrieval): 128-token chunks overlapping by 50 tokens.
DEFAULT_CHUNK_TOKENS = 128
DEFAULT_OVERLAP = 50


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class Section:
    """A named part of a document (``name`` may be empty for untitled text)."""

    name: str
    text: str


@dataclass(frozen=True)
class Document:
    """A source document: plain ``text`` or a sequence of ``sections`` (or both; text comes first).

    Example:
        >>> Document("doc-7", text="Insulin lowers blood glucose.").source_id
        'doc-7'
    """

    source_id: str
    text: str = ""
    title: str = ""
    sections: tuple[Section, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.source_id, str) or not self.source_id.strip():
            raise ValueError("Document.source_id must be a non-empty string")
        if not isinstance(self.text, str) or not isinstance(self.title, str):
            raise TypeError("Document.text and Document.title must be strings")
        sections = tuple(self.sections)
        for section in sections:
            if not isinstance(section, Section):
                raise TypeError(f"Document.sections must hold Section objects, got {type(section).__name__}")
        object.__setattr__(self, "sections", sections)
        object.__setattr__(self, "metadata", _frozen_mapping(self.metadata))

    def parts(self) -> list[Section]:
        """The sections to chunk, in order: the free ``text`` (unnamed) then the named sections."""
        parts = [Section("", self.text)] if self.text.strip() else []
        parts.extend(s for s in self.sections if s.text.strip())
        return parts


@dataclass(frozen=True)
class Chunk:
    """One retrievable passage. ``position`` counts chunks from 0 within the source document.

    Example:
        >>> c = Chunk("d1#0", "d1", "Metformin is first-line therapy.", title="Diabetes", section="RESULTS")
        >>> c.search_text
        'Diabetes\\nRESULTS\\nMetformin is first-line therapy.'
        >>> Chunk.from_dict(c.to_dict()) == c
        True
    """

    chunk_id: str
    source_id: str
    text: str
    title: str = ""
    section: str = ""
    position: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("chunk_id", "source_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"Chunk.{name} must be a non-empty string")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError(f"Chunk {self.chunk_id!r} has empty text")
        if not isinstance(self.position, int) or self.position < 0:
            raise ValueError(f"Chunk.position must be a non-negative int, got {self.position!r}")
        object.__setattr__(self, "metadata", _frozen_mapping(self.metadata))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chunk):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.chunk_id)

    @property
    def search_text(self) -> str:
        """What the search backends index: title, section and text, one per line."""
        return "\n".join(part for part in (self.title, self.section, self.text) if part)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "source_id": self.source_id,
            "title": self.title,
            "section": self.section,
            "position": self.position,
            "text": self.text,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Chunk":
        return cls(
            chunk_id=str(data["chunk_id"]),
            source_id=str(data["source_id"]),
            text=data["text"],
            title=data.get("title") or "",
            section=data.get("section") or "",
            position=int(data.get("position") or 0),
            metadata=data.get("metadata") or {},
        )


def _validate(chunk_tokens: int, overlap: int) -> None:
    if not isinstance(chunk_tokens, int) or isinstance(chunk_tokens, bool) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or overlap < 0:
        raise ValueError(f"overlap must be a non-negative int, got {overlap!r}")
    if overlap >= chunk_tokens:
        raise ValueError(f"overlap ({overlap}) must be smaller than chunk_tokens ({chunk_tokens})")


def split_token_windows(
    text: str, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, overlap: int = DEFAULT_OVERLAP
) -> list[str]:
    """Cut ``text`` into windows of at most ``chunk_tokens`` tokens overlapping by up to ``overlap``.

    Windows end and start at word boundaries (whitespace) when the text has them, so no word is
    cut in half; a single word longer than the window, or text without spaces, is cut at token
    boundaries. Windows cut at word boundaries re-encode to at most ``chunk_tokens`` tokens.

    Example:
        >>> split_token_windows("one two three four five six", chunk_tokens=4, overlap=2)
        ['one two three four', 'three four five six']
    """
    _validate(chunk_tokens, overlap)
    if not text.strip():
        return []
    enc = get_encoding()
    ids = enc.encode(text, disallowed_special=())
    decoded, offsets = enc.decode_with_offsets(ids)
    source = text if decoded == text else decoded  # offsets index into the original only if it round-trips
    n = len(ids)
    bounds = offsets + [len(source)]

    def starts_word(i: int) -> bool:
        at = bounds[i]
        return i == n or (0 < at < len(source) and (source[at - 1].isspace() or source[at].isspace()))

    boundaries = [i for i in range(1, n + 1) if starts_word(i)]

    def piece(a: int, b: int) -> str:
        return source[bounds[a] : bounds[b]].strip()

    windows: list[str] = []
    start = 0
    while start < n:
        limit = min(start + chunk_tokens, n)
        # the word boundaries inside (start, limit], longest window first
        lo, hi = bisect_right(boundaries, start), bisect_right(boundaries, limit)
        candidates = boundaries[lo:hi][::-1]
        end, text_piece = None, ""
        for candidate in candidates:
            text_piece = piece(start, candidate)
            if count_tokens(text_piece) <= chunk_tokens:
                end = candidate
                break
        if end is None:  # no usable word boundary: cut at tokens
            end = limit
            text_piece = enc.decode(ids[start:end]).strip() if source is not text else piece(start, end)
        if text_piece:
            windows.append(text_piece)
        if end >= n:
            break
        # next window starts `overlap` tokens back, moved forward to the next word start
        wanted = max(end - overlap, start + 1)
        j = bisect_left(boundaries, wanted)
        start = boundaries[j] if j < len(boundaries) and boundaries[j] < end else max(wanted, end - overlap)
    return windows


def chunk_document(
    document: Document, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, overlap: int = DEFAULT_OVERLAP
) -> list[Chunk]:
    """Chunk one document section by section (chunks never straddle sections)."""
    _validate(chunk_tokens, overlap)
    chunks: list[Chunk] = []
    for part in document.parts():
        for window in split_token_windows(part.text, chunk_tokens=chunk_tokens, overlap=overlap):
            position = len(chunks)
            chunks.append(
                Chunk(
                    chunk_id=f"{document.source_id}#{position}",
                    source_id=document.source_id,
                    text=window,
                    title=document.title,
                    section=part.name,
                    position=position,
                    metadata=document.metadata,
                )
            )
    return chunks


def chunk_documents(
    documents: Iterable[Document], *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, overlap: int = DEFAULT_OVERLAP
) -> Iterator[Chunk]:
    """Chunk many documents lazily, in order."""
    _validate(chunk_tokens, overlap)
    for document in documents:
        yield from chunk_document(document, chunk_tokens=chunk_tokens, overlap=overlap)


_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def split_markdown_sections(text: str) -> tuple[str, tuple[Section, ...]]:
    """Split markdown-style text at ``#`` headings.

    Returns ``(title, sections)``: the first level-1 heading (if the text starts with one) is the
    title; text before any other heading becomes an unnamed section.

    Example:
        >>> title, sections = split_markdown_sections("# Asthma\\nIntro.\\n## Treatment\\nInhaled steroids.")
        >>> title, [(s.name, s.text) for s in sections]
        ('Asthma', [('', 'Intro.'), ('Treatment', 'Inhaled steroids.')])
    """
    title = ""
    sections: list[Section] = []
    name, lines = "", []
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match:
            body = "\n".join(lines).strip()
            if body:
                sections.append(Section(name, body))
            heading = match.group(2)
            if len(match.group(1)) == 1 and not title and not sections and not name:
                title, name = heading, ""
            else:
                name = heading
            lines = []
        else:
            lines.append(line)
    body = "\n".join(lines).strip()
    if body:
        sections.append(Section(name, body))
    return title, tuple(sections)
