"""What the knowledge graph returns: linked entities, triples, descriptions and the evidence bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

@dataclass(frozen=True)
class LinkedEntity:
    """A graph node found in the text. ``via`` is the label/synonym/id that matched."""

    iri: str
    label: str
    mention: str
    via: str
    match: str  # "label", "synonym", "id", "word-order", "fuzzy"
    score: float


@dataclass(frozen=True)
class KGTriple:
    """One triple with display labels (``None`` when the node has no label)."""

    s: str
    p: str
    o: str
    s_label: Optional[str] = None
    p_label: Optional[str] = None
    o_label: Optional[str] = None

    def as_tuple(self) -> tuple[str, str, str]:
        return (self.s, self.p, self.o)


@dataclass
class EntityDescription:
    iri: str
    label: str
    types: list[str] = field(default_factory=list)
    definition: Optional[str] = None
    synonyms: list[str] = field(default_factory=list)


@dataclass
class KGEvidence:
    """What :meth:`KnowledgeGraph.retrieve` found: entities, descriptions, chains, triples, text."""

    entities: list[LinkedEntity]
    descriptions: list[EntityDescription]
    neighbours: dict[str, list[tuple[str, str, list[KGTriple], int]]]
    chains: list[list[KGTriple]]
    triples: list[KGTriple]
    text: str
