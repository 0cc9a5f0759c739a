"""Retrieval along a reasoning path: the candidate triples (general, personal overlay, packaged graph),
the top-k recall by embedding similarity (:func:`recall`, giving :class:`RecalledTriple`) and the
evidence text the answering model reads (:func:`evidence_text`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field
from rdflib import URIRef

from ...tools.tokens import trim_to_tokens
from .knowledge import DiffRAGKnowledge
from .options import DiffRAGOptions
from .parsing import UNKNOWN, Triple


class RecalledTriple(BaseModel):
    """A graph triple recalled for one reasoning-path triple, with its evidence."""

    model_config = ConfigDict(extra="forbid")

    triple: list[str]
    layer: Literal["personal", "general", "kg"]
    similarity: float
    path_index: int
    passages: list[dict[str, str]] = Field(default_factory=list)
    cases: list[dict[str, str]] = Field(default_factory=list)
    kg: Optional[dict[str, str]] = None


@dataclass
class _Candidate:
    triple: Triple
    layer: str
    general_nodes: list[URIRef] = field(default_factory=list)
    case_nodes: list[URIRef] = field(default_factory=list)
    kg: Optional[dict[str, str]] = None


def _candidates(knowledge: DiffRAGKnowledge, path: Sequence[Triple], general_kg: Any,
                options: DiffRAGOptions) -> list[_Candidate]:
    """General and personal triples merged by fact (personal shadows general), plus packaged-graph
    neighbours of the entities the path names."""
    by_key: dict[str, _Candidate] = {}
    for triple, node in knowledge.triples("general"):
        by_key.setdefault(triple.key, _Candidate(triple, "general")).general_nodes.append(node)
    for triple, node in knowledge.triples("personal"):
        found = by_key.get(triple.key)
        if found is None:
            found = by_key[triple.key] = _Candidate(triple, "personal")
        found.layer = "personal"  # the overlay shadows the general fact; its passages stay as evidence
        found.case_nodes.append(node)
    if general_kg is not None and options.use_general_kg and options.kg_entities_per_triple:
        names = list(dict.fromkeys(p for t in path for p in (t.subject, t.object) if p != UNKNOWN))
        for name in names:
            for entity in general_kg.link(name, limit=options.kg_entities_per_triple):
                for _direction, _p, shown, _total in general_kg.neighbours(entity.iri, per_relation=options.kg_triples_per_relation):
                    for kt in shown:
                        try:
                            triple = Triple(subject=kt.s_label or general_kg.display(kt.s),
                                            relation=kt.p_label or general_kg.relation_name(kt.p),
                                            object=kt.o_label or general_kg.display(kt.o))
                        except ValueError:
                            continue
                        if triple.key not in by_key:
                            by_key[triple.key] = _Candidate(triple, "kg", kg={"s": kt.s, "p": kt.p, "o": kt.o})
    return [by_key[k] for k in sorted(by_key)]


def recall(
    knowledge: DiffRAGKnowledge,
    path: Sequence[Triple],
    *,
    embeddings: Any,
    options: DiffRAGOptions,
    general_kg: Any = None,
) -> list[RecalledTriple]:
    """Top-k graph triples per path triple by cosine similarity of MiniLM embeddings (ties by fact),
    at most ``max_evidence`` distinct facts overall, each with its passages and cases."""
    candidates = _candidates(knowledge, path, general_kg, options)
    if not path or not candidates:
        return []
    matrix = knowledge.vectors([c.triple.text for c in candidates], embeddings)
    queries = knowledge.vectors([t.text for t in path], embeddings)
    sims = queries @ matrix.T
    chosen: dict[str, RecalledTriple] = {}
    rounds = [
        sorted(((float(sims[i, j]), c.triple.key, j) for j, c in enumerate(candidates)), key=lambda x: (-x[0], x[1]))
        for i in range(len(path))
    ]
    for rank in range(options.top_k):  # round-robin over path triples so every hop gets evidence
        for i, ranked in enumerate(rounds):
            if rank >= len(ranked) or len(chosen) >= options.max_evidence:
                continue
            sim, key, j = ranked[rank]
            if sim < options.min_similarity or key in chosen:
                continue
            c = candidates[j]
            chosen[key] = RecalledTriple(
                triple=c.triple.as_list(), layer=c.layer, similarity=round(sim, 4), path_index=i,
                passages=[p for n in c.general_nodes for p in knowledge.passages_of(n)],
                cases=[x for n in c.case_nodes for x in knowledge.cases_of(n)],
                kg=c.kg,
            )
    return list(chosen.values())


def evidence_text(recalled: Sequence[RecalledTriple], *, max_tokens: int) -> str:
    """The evidence the answering model reads: each triple, then its cases and passages."""
    blocks = []
    for n, r in enumerate(recalled, start=1):
        lines = [f"[{n}] {' | '.join(r.triple)}  ({r.layer}, similarity {r.similarity:.2f})"]
        for c in r.cases:
            lines.append(f"  case {c['id']}: Q: {c['question']} Reasoning: {c['reasoning']} A: {c['answer']}")
        for p in r.passages:
            lines.append(f"  passage {p['id']} ({p['chapter']} > {p['section']}): {p['text']}")
        if r.kg:
            lines.append(f"  packaged graph: <{r.kg['s']}> <{r.kg['p']}> <{r.kg['o']}>")
        blocks.append("\n".join(lines))
    return trim_to_tokens("\n".join(blocks), max_tokens) if blocks else "(nothing was recalled)"
