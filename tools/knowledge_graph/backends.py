"""Where SPARQL runs: an in-memory rdflib graph or a remote SPARQL 1.1 endpoint, and safe term serialisation."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from typing import Any, Iterable, Mapping, Optional

from rdflib import BNode, Graph, Literal, URIRef
from rdflib.namespace import RDF

from .vocabulary import _META_CLASSES, _Q_LABELS, _Q_META, LABEL_PREDICATES, SYNONYM_PREDICATES

_IRI_OK = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\x00-\x20<>\"{}|^`\\\x7f]*")
_LANG_OK = re.compile(r"[A-Za-z]{1,8}(?:-[A-Za-z0-9]{1,8})*")
_ECHAR = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _escape_literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ECHAR:
            out.append(_ECHAR[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{ord(ch):04X}")  # UCHAR escapes are legal inside SPARQL strings
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def sparql_term(term: Any) -> str:
    """Serialise an rdflib IRI or literal as a SPARQL term that can only ever be one term.

    Raises ``ValueError`` for anything else (blank nodes, IRIs outside the ``IRIREF`` grammar).

    Example:
        >>> sparql_term(Literal('x" } UNION { ?s ?p ?o } #'))
        '"x\\\\" } UNION { ?s ?p ?o } #"'
        >>> sparql_term(URIRef("http://x.org/a> } DROP ALL #"))
        Traceback (most recent call last):
        ...
        ValueError: not a safe IRI: 'http://x.org/a> } DROP ALL #'
    """
    if isinstance(term, URIRef):
        if not _IRI_OK.fullmatch(str(term)):
            raise ValueError(f"not a safe IRI: {str(term)!r}")
        return f"<{term}>"
    if isinstance(term, Literal):
        body = _escape_literal(str(term))
        if term.language:
            if not _LANG_OK.fullmatch(term.language):
                raise ValueError(f"not a safe language tag: {term.language!r}")
            return f"{body}@{term.language}"
        if term.datatype is not None:
            return f"{body}^^{sparql_term(URIRef(term.datatype))}"
        return body
    raise ValueError(f"cannot bind {type(term).__name__} {term!r} in a SPARQL query")


class KGQueryError(Exception):
    """A graph query failed. ``kind`` is a :class:`ToolError` kind; ``retryable`` marks transient failures."""

    def __init__(self, kind: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


# --------------------------------------------------------------------------- backends


class _LocalBackend:
    """rdflib graph; values are passed with ``initBindings`` (never spliced into the text)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._lock = threading.Lock()  # rdflib's Memory store is not safe under concurrent writes/queries

    def select(self, query: str, bindings: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self._lock:
            result = self.graph.query(query, initBindings=dict(bindings))
            names = [str(v) for v in result.vars]
            return [{n: row[i] for i, n in enumerate(names) if row[i] is not None} for row in result]

    def label_rows(self) -> Iterable[tuple[Any, Any, Any]]:
        with self._lock:
            rows = []
            for p in LABEL_PREDICATES + SYNONYM_PREDICATES:
                rows.extend((s, p, o) for s, o in self.graph.subject_objects(p) if isinstance(o, Literal))
            return rows

    def meta_nodes(self) -> set[Any]:
        with self._lock:
            return {s for c in _META_CLASSES for s in self.graph.subjects(RDF.type, c)}

    def describe_source(self) -> str:
        return f"in-memory rdflib graph ({len(self.graph)} triples)"


class _RemoteBackend:
    """SPARQL 1.1 protocol over HTTP (POST, JSON results) with a real timeout, over ``httpx``.

    Bindings are inlined as one ``VALUES`` row at the template's ``#@VALUES`` marker, every term
    serialised by :func:`sparql_term`.

    Credentials (``user:password@`` in the endpoint URL, sent as HTTP basic auth, and every value
    of ``headers``) reach the endpoint's origin only: redirects to another origin are followed
    without them (:func:`~tcrag_langgraph.tools.secrets.guarded_httpx_client`). Error messages
    name the endpoint without its userinfo, quote at most 300 characters of an error body, cut
    after :func:`~tcrag_langgraph.tools.secrets.scrub_secrets` ran over it, and :attr:`secrets` lists the
    credentials for the tool layer's scrubber.
    """

    def __init__(self, endpoint: str, *, timeout_s: float, headers: Optional[Mapping[str, str]] = None, method: str = "POST") -> None:
        parsed = urllib.parse.urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"SPARQL endpoint must be an http(s) URL, got {endpoint!r}")
        if method not in ("GET", "POST"):
            raise ValueError(f"method must be GET or POST, got {method!r}")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        self.method = method
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        user = urllib.parse.unquote(parsed.username) if parsed.username else ""
        password = urllib.parse.unquote(parsed.password) if parsed.password else ""
        self._auth = (user, password) if user or password else None
        host = parsed.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parsed.port:
            netloc += f":{parsed.port}"
        #: the endpoint without userinfo: what requests go to and what messages show
        self.endpoint = urllib.parse.urlunparse(parsed._replace(netloc=netloc))
        self.secrets: tuple[str, ...] = tuple(v for v in (user, password, *self.headers.values()) if v)

    @staticmethod
    def render(query: str, bindings: Mapping[str, Any]) -> str:
        if not bindings:
            return query
        names = list(bindings)
        for name in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"bad variable name {name!r}")
        block = "VALUES ({}) {{ ({}) }}".format(
            " ".join("?" + n for n in names), " ".join(sparql_term(bindings[n]) for n in names)
        )
        if query.count("#@VALUES") != 1:
            raise ValueError("query template needs exactly one #@VALUES marker to take bindings")
        return query.replace("#@VALUES", block)

    def _post(self, query: str) -> dict[str, Any]:
        import httpx

        from ..secrets import guarded_httpx_client, scrub_secrets

        form = {"query": query}
        headers = {"Accept": "application/sparql-results+json", **self.headers}
        client = guarded_httpx_client(
            self.endpoint, extra_headers=self.headers, auth=self._auth, timeout=self.timeout_s, follow_redirects=True, max_redirects=5
        )
        try:
            with client:
                if self.method == "GET":
                    response = client.get(self.endpoint, params=form, headers=headers)
                else:
                    response = client.post(self.endpoint, data=form, headers=headers)
                body = response.content
        except httpx.TimeoutException:
            raise KGQueryError("timeout", f"SPARQL endpoint gave no answer within {self.timeout_s:g} s", retryable=True) from None
        except httpx.HTTPError as exc:
            reason = scrub_secrets(str(exc) or type(exc).__name__, self.secrets)
            raise KGQueryError("unavailable", f"SPARQL endpoint {self.endpoint} unreachable: {reason}", retryable=True) from None
        if response.status_code >= 400:
            # Scrub first, then cut: a credential straddling the cut would otherwise survive in part.
            # (Only the first 64 KiB are scrubbed and quoted from: far past the cut, so that bound cuts no shown secret.)
            detail = scrub_secrets(body[:65536].decode("utf-8", "replace"), self.secrets).strip()[:300]
            retry = response.status_code >= 500 or response.status_code == 429
            raise KGQueryError(
                "unavailable" if retry else "bad_response",
                f"SPARQL endpoint answered HTTP {response.status_code}: {detail}",
                retryable=retry,
            )
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KGQueryError("bad_response", f"SPARQL endpoint returned invalid JSON: {exc}") from None

    @staticmethod
    def _term(value: Mapping[str, Any]) -> Any:
        kind = value.get("type")
        text = value.get("value")
        if not isinstance(text, str):
            raise KGQueryError("bad_response", "SPARQL result term without a string value")
        if kind == "uri":
            return URIRef(text)
        if kind in ("literal", "typed-literal"):
            datatype = value.get("datatype")
            return Literal(text, lang=value.get("xml:lang"), datatype=URIRef(datatype) if datatype else None)
        if kind == "bnode":
            return BNode(text)
        raise KGQueryError("bad_response", f"unknown SPARQL result term type {kind!r}")

    def select(self, query: str, bindings: Mapping[str, Any]) -> list[dict[str, Any]]:
        data = self._post(self.render(query, bindings))
        try:
            rows = data["results"]["bindings"]
            if not isinstance(rows, list):
                raise TypeError
            return [{k: self._term(v) for k, v in row.items()} for row in rows]
        except (KeyError, TypeError, AttributeError):
            raise KGQueryError("bad_response", "SPARQL endpoint returned JSON that is not a SELECT result") from None

    def label_rows(self) -> Iterable[tuple[Any, Any, Any]]:
        return [(r["s"], r["p"], r["l"]) for r in self.select(_Q_LABELS, {}) if {"s", "p", "l"} <= r.keys()]

    def meta_nodes(self) -> set[Any]:
        return {r["s"] for r in self.select(_Q_META, {}) if "s" in r}

    def describe_source(self) -> str:
        return f"SPARQL endpoint {self.endpoint}"


# --------------------------------------------------------------------------- results


def _safe_iri(iri: Any) -> URIRef:
    text = str(iri)
    if not _IRI_OK.fullmatch(text):
        raise KGQueryError("bad_input", f"not a valid IRI: {text[:200]!r}")
    return URIRef(text)
