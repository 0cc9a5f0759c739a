"""How knowledge-graph evidence reads: the text the ``KG_RAG`` tool returns."""

from __future__ import annotations

from typing import Protocol

from .evidence import KGTriple

__all__ = ["render_evidence", "render_chain", "NodeNames"]


class NodeNames(Protocol):
    """What rendering needs from a graph (a :class:`~.graph.KnowledgeGraph`): how nodes and
    relations are named."""

    def curie(self, iri: str) -> str: ...

    def display(self, iri: str) -> str: ...

    def relation_name(self, p: str) -> str: ...


def render_evidence(kg: NodeNames, chosen, descriptions, neighbours, chains, triples) -> str:
    """The evidence text of :meth:`KnowledgeGraph.retrieve`: linked entities, chains, facts, triples."""
    if not chosen:
        return ""
    lines = ["Linked entities: " + "; ".join(
        f"{kg.display(e.iri)} (\"{e.mention}\" -> {e.match} match, score {e.score:.2f})" for e in chosen
    )]
    if chains:
        lines.append("Reasoning chains:")
        for chain in chains:
            lines.append("- " + render_chain(kg, chain))
    for e, d in zip(chosen, descriptions):
        lines.append(f"== {kg.display(e.iri)}" + (f" ({', '.join(d.types)})" if d.types else ""))
        if d.definition:
            lines.append(f"Definition: {d.definition}")
        if d.synonyms:
            lines.append("Synonyms: " + "; ".join(d.synonyms))
        for direction, p, shown, total in neighbours[e.iri]:
            name = kg.relation_name(p)
            items = "; ".join(kg.display(t.o if direction == "out" else t.s) for t in shown)
            more = f" ({len(shown)} of {total} shown)" if total > len(shown) else ""
            if direction == "out":
                lines.append(f"{name}: {items}{more}")
            else:
                lines.append(f"{name} (incoming, from): {items}{more}")
    lines.append("Triples (subject, relation, object):")
    for t in triples:
        lines.append(f"({kg.curie(t.s)}, {kg.curie(t.p)}, {kg.curie(t.o)})")
    return "\n".join(lines)

def render_chain(kg: NodeNames, chain: list[KGTriple]) -> str:
    """One reasoning chain as ``A -relation-> B -relation-> C``."""
    parts = []
    for k, t in enumerate(chain):
        subject = kg.display(t.s)
        if k == 0 or chain[k - 1].o != t.s:
            parts.append(("; " if k else "") + subject)
        parts.append(f" -{kg.relation_name(t.p)}-> {kg.display(t.o)}")
    return "".join(parts)
