"""The ``KG_RAG`` LangChain tool over a :class:`~.graph.KnowledgeGraph`, built with the shared layer."""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rdflib import Graph

from ..base import ToolError
from ..layer import LayeredTool, ToolFailure, ToolOptions, make_tool
from .backends import KGQueryError
from .graph import KnowledgeGraph

__all__ = ["TOOL_NAME", "TOOL_DESCRIPTION", "DEFAULT_OPTIONS", "KGQuery", "knowledge_graph_tool", "default_knowledge_graph_tool"]

TOOL_NAME = "KG_RAG"
#: Layer options of ``KG_RAG`` unless the caller passes its own.
DEFAULT_OPTIONS = ToolOptions(timeout_s=30.0, retries=2, backoff=0.5, max_output_tokens=700, cache_size=128)


class KGQuery(BaseModel):
    """Arguments of ``KG_RAG``. Plain text input becomes ``query``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(default="", max_length=4000, description="Question or entity names, free text.")
    entities: list[str] = Field(default_factory=list, max_length=10, description="Entity names or ids to look up.")

    @field_validator("entities", mode="before")
    @classmethod
    def _one_entity(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in re.split(r"[;\n]", value) if v.strip()]
        return value

    @field_validator("entities")
    @classmethod
    def _short_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if len(name) > 300:
                raise ValueError("entity names must be at most 300 characters")
        return value


TOOL_DESCRIPTION = (
    "Medical knowledge graph (Human Phenotype Ontology phenotypes and rare-disease annotations, "
    "ICD-10-CM codes). Input: a question or entity names as text, or JSON "
    '{"query": "...", "entities": ["..."]}. Returns definitions, related entities and reasoning '
    "chains between the entities found, with the triples they come from."
)


def knowledge_graph_tool(
    kg: KnowledgeGraph | Graph | str | Callable[[], KnowledgeGraph],
    *,
    name: str = TOOL_NAME,
    max_entities: int = 3,
    per_relation: int = 5,
    max_chains: int = 6,
    options: Optional[ToolOptions] = None,
    **overrides: Any,
) -> LayeredTool:
    """The ``KG_RAG`` tool over ``kg``: a :class:`KnowledgeGraph`, an rdflib Graph, a SPARQL endpoint
    URL, or a zero-argument function returning a KnowledgeGraph (called at each tool call, so the
    graph can be loaded lazily).

    ``options``: the layer's :class:`~tcrag_langgraph.tools.layer.ToolOptions` (default
    :data:`DEFAULT_OPTIONS`: 30 s, 2 retries, 700 tokens, 128 cached results); ``overrides``:
    single ``ToolOptions`` fields replacing those (``retries=0``), as ``make_tool`` takes them.

    ``tool.invoke(text_or_dict)`` returns the evidence text, or a :class:`ToolError` (no entity
    found -> ``kind="not_found"``; endpoint down -> ``"unavailable"``; too slow -> ``"timeout"``).

    Example:
        >>> from rdflib import Graph, Literal, URIRef, RDFS
        >>> g = Graph(); _ = g.add((URIRef("http://ex.org/flu"), RDFS.label, Literal("Influenza")))
        >>> t = knowledge_graph_tool(g)
        >>> t.invoke("influenza").splitlines()[0]
        'Linked entities: Influenza [<http://ex.org/flu>] ("influenza" -> label match, score 1.00)'
        >>> t.invoke("zzzz").kind
        'not_found'
    """
    options = ToolOptions.model_validate({**dict(DEFAULT_OPTIONS if options is None else options), **overrides})
    if isinstance(kg, Graph):
        kg = KnowledgeGraph(kg)
    elif isinstance(kg, str):
        kg = KnowledgeGraph.from_endpoint(kg, timeout_s=min(options.timeout_s, 10.0))
    if isinstance(kg, KnowledgeGraph):
        fixed_graph = kg
        get_graph: Callable[[], KnowledgeGraph] = lambda: fixed_graph
    elif callable(kg) and not isinstance(kg, type):
        get_graph = kg
    else:
        raise TypeError(f"kg must be a KnowledgeGraph, an rdflib Graph, an endpoint URL or a factory, got {type(kg).__name__}")
    for label, value in (("max_entities", max_entities), ("per_relation", per_relation), ("max_chains", max_chains)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 50:
            raise ValueError(f"{label} must be an integer from 1 to 50, got {value!r}")
    def run(args: KGQuery) -> str | ToolError:
        if not args.query.strip() and not args.entities:
            return ToolError(name, "bad_input", "give a question or entity names to look up")
        try:
            graph = get_graph()
            if not isinstance(graph, KnowledgeGraph):
                raise KGQueryError("internal", f"graph factory returned {type(graph).__name__}, not a KnowledgeGraph")
            evidence = graph.retrieve(
                args.query, entities=args.entities, max_entities=max_entities, per_relation=per_relation, max_chains=max_chains
            )
        except KGQueryError as exc:
            raise ToolFailure(exc.kind, str(exc), retryable=exc.retryable) from None
        if not evidence.entities:
            asked = args.query or "; ".join(args.entities)
            return ToolError(name, "not_found", f"no entity of the knowledge graph matches {asked[:200]!r}; try other names or ids")
        return evidence.text

    return make_tool(
        name,
        TOOL_DESCRIPTION,
        run,
        args_schema=KGQuery,
        options=options,
        primary_field=overrides.get("primary_field", "query"),
        # a remote endpoint makes the tool outbound (layer.egress); a factory's graph is not known here
        sends_off_machine=options.sends_off_machine or (isinstance(kg, KnowledgeGraph) and kg.sends_off_machine),
        # a graph given up front hands its credentials to the layer's scrubber (a factory's are unknown here)
        secrets=(*options.secrets, *(kg.secrets if isinstance(kg, KnowledgeGraph) else ())),
    )


def default_knowledge_graph_tool(*, preload: bool = False, **tool_args: Any) -> LayeredTool:
    """``KG_RAG`` over the packaged medical graph, shared with :meth:`KnowledgeGraph.packaged`.

    The graph is parsed and indexed on the first call (about 3-7 s on 2 busy cores), or in a
    background thread started now when ``preload=True``. Other keyword options are those of
    :func:`knowledge_graph_tool`.

    Example:
        >>> tool = default_knowledge_graph_tool(max_entities=2)   # doctest: +SKIP
        >>> "Seizure" in tool.invoke("HP:0001250")                  # doctest: +SKIP
        True
    """
    tool = knowledge_graph_tool(KnowledgeGraph.packaged, **tool_args)
    if preload:
        threading.Thread(target=_preload_packaged, name="kg-preload", daemon=True).start()
    return tool


def _preload_packaged() -> None:
    try:
        KnowledgeGraph.packaged().index
    except Exception:  # the first tool call reports the problem as a ToolError
        pass
