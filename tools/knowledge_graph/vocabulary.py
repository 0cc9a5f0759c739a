"""Namespaces, prefixes, predicates and the constant SPARQL templates of the knowledge graph.

Templates never contain model-written text: their variables are bound (see :mod:`.backends`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from rdflib import Namespace, URIRef
from rdflib.namespace import RDF, RDFS, SKOS

KG = Namespace("urn:tcrag:kg:")
HPO_BASE = "http://purl.obolibrary.org/obo/HP_"
ORPHA_BASE = "http://www.orpha.net/ORDO/Orphanet_"
OMIM_BASE = "https://omim.org/entry/"
DECIPHER_BASE = "https://www.deciphergenomics.org/syndrome/"
ICD10CM_BASE = "http://purl.bioontology.org/ontology/ICD10CM/"

#: The packaged medical graph (built by ``tcrag build-kg``; see :mod:`.kg_build`).
PACKAGED_GRAPH = Path(__file__).parent.parent / "data" / "kg_medical.nt.gz"

#: CURIE prefix -> IRI base, for reading ids in text (``HP:0001250``) and for compact output.
DEFAULT_PREFIXES: dict[str, str] = {
    "HP": HPO_BASE,
    "ORPHA": ORPHA_BASE,
    "OMIM": OMIM_BASE,
    "DECIPHER": DECIPHER_BASE,
    "ICD10CM": ICD10CM_BASE,
    "kg": str(KG),
    "rdfs": str(RDFS),
    "skos": str(SKOS),
    "rdf": str(RDF),
}

_OBO = "http://purl.obolibrary.org/obo/"
_OBOINOWL = "http://www.geneontology.org/formats/oboInOwl#"
LABEL_PREDICATES = (RDFS.label, SKOS.prefLabel)
SYNONYM_PREDICATES = (
    SKOS.altLabel,
    URIRef(_OBOINOWL + "hasExactSynonym"),
    URIRef(_OBOINOWL + "hasRelatedSynonym"),
    URIRef(_OBOINOWL + "hasBroadSynonym"),
    URIRef(_OBOINOWL + "hasNarrowSynonym"),
)
DEFINITION_PREDICATES = (SKOS.definition, URIRef(_OBO + "IAO_0000115"), RDFS.comment)
HIERARCHY_PREDICATES = (RDFS.subClassOf, SKOS.broader)
_META_CLASSES = (RDF.Property, RDFS.Class)


def _values(predicates: Iterable[URIRef]) -> str:
    # Constant IRIs defined above, never model text.
    return " ".join(p.n3() for p in predicates)


# --------------------------------------------------------------------------- query templates
# Every template is a constant. Variables named in a call's bindings are bound to rdflib terms;
# the line "#@VALUES" is a SPARQL comment where the remote backend inlines its VALUES block.

_Q_LABELS = f"""SELECT ?s ?p ?l WHERE {{
  VALUES ?p {{ {_values(LABEL_PREDICATES + SYNONYM_PREDICATES)} }}
  ?s ?p ?l . FILTER(isLiteral(?l) && !isBlank(?s))
}}"""

_Q_META = f"""SELECT DISTINCT ?s WHERE {{
  VALUES ?c {{ {_values(_META_CLASSES)} }}
  ?s {RDF.type.n3()} ?c .
}}"""

_Q_EXACT = f"""SELECT DISTINCT ?s WHERE {{
  #@VALUES
  VALUES ?p {{ {_values(LABEL_PREDICATES + SYNONYM_PREDICATES)} }}
  ?s ?p ?q .
}} ORDER BY ?s LIMIT 20"""

_Q_EXISTS = """SELECT ?p WHERE {
  #@VALUES
  { ?s ?p ?o } UNION { ?o2 ?p ?s }
} LIMIT 1"""

_Q_LITERALS = """SELECT ?p ?o WHERE {
  #@VALUES
  ?s ?p ?o . FILTER(isLiteral(?o))
} ORDER BY ?p ?o LIMIT 200"""

_Q_TYPES = f"""SELECT ?t ?tl WHERE {{
  #@VALUES
  ?s {RDF.type.n3()} ?t .
  OPTIONAL {{ ?t {RDFS.label.n3()} ?tl }}
}} ORDER BY ?t LIMIT 20"""

_Q_OUT_COUNTS = f"""SELECT ?p (COUNT(DISTINCT ?o) AS ?n) WHERE {{
  #@VALUES
  ?s ?p ?o . FILTER(isIRI(?o) && ?p != {RDF.type.n3()})
}} GROUP BY ?p ORDER BY ?p"""

_Q_IN_COUNTS = f"""SELECT ?p (COUNT(DISTINCT ?x) AS ?n) WHERE {{
  #@VALUES
  ?x ?p ?s . FILTER(isIRI(?x) && ?p != {RDF.type.n3()})
}} GROUP BY ?p ORDER BY ?p"""

_Q_OUT = f"""SELECT DISTINCT ?o WHERE {{
  #@VALUES
  ?s ?p ?o . FILTER(isIRI(?o))
}} ORDER BY ?o LIMIT 50"""

_Q_IN = f"""SELECT DISTINCT ?x WHERE {{
  #@VALUES
  ?x ?p ?s . FILTER(isIRI(?x))
}} ORDER BY ?x LIMIT 50"""

_Q_DIRECT = f"""SELECT ?d ?p WHERE {{
  #@VALUES
  {{ ?a ?p ?b . BIND("ab" AS ?d) }} UNION {{ ?b ?p ?a . BIND("ba" AS ?d) }}
  FILTER(?p != {RDF.type.n3()})
}} ORDER BY ?d ?p LIMIT 10"""

# Two-hop paths between ?a and ?b through an intermediate node ?x, in every direction.
_Q_TWO_HOP = f"""SELECT ?d ?p1 ?x ?p2 WHERE {{
  #@VALUES
  {{ ?a ?p1 ?x . ?x ?p2 ?b . BIND("a>x>b" AS ?d) }}
  UNION {{ ?b ?p1 ?x . ?x ?p2 ?a . BIND("b>x>a" AS ?d) }}
  UNION {{ ?a ?p1 ?x . ?b ?p2 ?x . BIND("a>x<b" AS ?d) }}
  UNION {{ ?x ?p1 ?a . ?x ?p2 ?b . BIND("a<x>b" AS ?d) }}
  FILTER(isIRI(?x) && ?x != ?a && ?x != ?b && ?p1 != {RDF.type.n3()} && ?p2 != {RDF.type.n3()})
}} ORDER BY ?d ?x ?p1 ?p2 LIMIT 40"""

# Hierarchy paths are walked in Python one edge at a time: rdflib evaluates property paths
# (p+ / p*) without using the bound endpoints, which takes seconds to minutes on a large graph.
_Q_FIRST_HOPS = f"""SELECT ?p ?x WHERE {{
  #@VALUES
  ?a ?p ?x . FILTER(isIRI(?x) && ?p != {RDF.type.n3()})
}} ORDER BY ?p ?x LIMIT 100"""

_Q_PARENTS = f"""SELECT ?h ?y WHERE {{
  #@VALUES
  VALUES ?h {{ {_values(HIERARCHY_PREDICATES)} }}
  ?x ?h ?y . FILTER(isIRI(?y))
}} ORDER BY ?y ?h LIMIT 50"""

_Q_LABEL_OF = f"""SELECT ?l WHERE {{
  #@VALUES
  VALUES ?p {{ {_values(LABEL_PREDICATES)} }}
  ?s ?p ?l . FILTER(isLiteral(?l))
}} ORDER BY ?p ?l LIMIT 1"""


# --------------------------------------------------------------------------- safe terms

# SPARQL 1.1 IRIREF: no controls, space, <>"{}|^`\ .  We also require an absolute IRI with a scheme.
