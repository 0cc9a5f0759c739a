"""The form of TCM-DiffRAG's triple replies (:class:`~tcrag_langgraph.models.constrained.ReplyForm`):
at most ``n`` lines ``subject | relation | object``, each part a short phrase with a letter or digit in
it (``?`` also, where a reasoning path marks an unknown), and nothing else. :func:`.parsing.parse_triples`
still reads every reply (a part's length, its cleaning)."""

from __future__ import annotations

import functools

from ...models.constrained import ReplyForm

__all__ = ["triples_form"]

#: Longest part the grammar lets a model write (characters): a model that wants to stop mid-part cannot
#: (the grammar admits no end there), and the packaged 135M model then wrote digits for the rest of its
#: budget; a bound forces the next "|" instead. Below the parser's MAX_PART_CHARS (200).
MAX_FORM_PART = 100


@functools.lru_cache(maxsize=32)
def triples_form(n: int) -> ReplyForm:
    """At most ``n`` triple lines, each part at most :data:`MAX_FORM_PART` characters."""
    if n < 1:
        raise ValueError("n must be at least 1")
    more = "".join(' ( "\\n" triple' for _ in range(n - 1)) + " )?" * (n - 1)
    grammar = f'root ::= triple{more}\ntriple ::= part "|" part "|" part\npart ::= [^|\\n]{{1,{MAX_FORM_PART}}}\n'
    item = {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "string"}}
    schema = {"type": "object", "additionalProperties": False, "required": ["triples"],
              "properties": {"triples": {"type": "array", "minItems": 1, "maxItems": n, "items": item}}}
    return ReplyForm("diffrag_triples", grammar, schema=schema,
                     from_json=lambda v: "\n".join(" | ".join(t) for t in v["triples"]))
