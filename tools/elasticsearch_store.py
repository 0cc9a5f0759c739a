"""Elasticsearch backend of :class:`~tcrag_langgraph.tools.documents.DocumentStore`.

Uses the official ``elasticsearch`` 9.x client directly: an index with ``text`` / ``keyword`` /
``dense_vector`` mappings whose text fields use the medical analyzer of :mod:`.text_analysis`
(:func:`~tcrag_langgraph.tools.text_analysis.elasticsearch_analysis`: the same terms as the
embedded store; where the two still differ is listed there), bulk indexing with ``helpers.streaming_bulk`` (429s retried with
backoff), BM25 by ``match`` (equal scores by ``chunk_id`` ascending, as in the embedded store), dense retrieval by top-level ``knn``, and hybrid by the shared
client-side reciprocal rank fusion (server-side RRF needs an Enterprise licence).

Credentials (``api_key`` or ``basic_auth``, or ``user:password@`` in the URL) are handed to the
client only; ``repr`` and error messages never contain them (plain, URL-encoded or base64 as in
an ``Authorization`` header a server may echo: :func:`~tcrag_langgraph.tools.secrets.scrub_secrets`),
and :attr:`ElasticsearchStore.secrets` lists them (with ``base64("user:password")``) so the tool
layer scrubs them from anything it reports.

Transport failures become :class:`~tcrag_langgraph.tools.documents.StoreError` with a kind:
connection refused -> ``unavailable``, timeout -> ``timeout``, HTTP 5xx -> ``unavailable``,
401/403 -> ``forbidden``, missing index -> ``unavailable``, unparseable or non-Elasticsearch
answers -> ``bad_response``.

Example (needs a server, e.g. ``noida-db start --only elasticsearch``):
    >>> from tcrag_langgraph.tools.elasticsearch_store import ElasticsearchStore
    >>> store = ElasticsearchStore("http://127.0.0.1:9200", index="medical-docs")  # doctest: +SKIP
    >>> store.add_documents(documents)                                             # doctest: +SKIP
    >>> store.search("warfarin bleeding", k=3, mode="hybrid")                       # doctest: +SKIP
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
from typing import Any, Callable, Iterator, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np

from .chunking import Chunk
from .documents import DocumentStore, SearchHit, StoreError, default_embeddings, embed_texts, embedding_model_name
from .secrets import scrub_secrets
from .text_analysis import ELASTICSEARCH_ANALYZER, elasticsearch_analysis

__all__ = ["ElasticsearchStore", "index_mappings", "index_settings"]

logger = logging.getLogger(__name__)

_INDEX_NAME = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,254}$")


def index_mappings(dims: int, *, analyzer: str = ELASTICSEARCH_ANALYZER, model: str | None = None) -> dict[str, Any]:
    """Mappings of a TC-RAG document index (``search_text`` is what BM25 matches).

    Example:
        >>> index_mappings(384)["properties"]["vector"]["similarity"]
        'cosine'
    """
    if dims < 1:
        raise ValueError("dims must be positive")
    return {
        "_meta": {"tcrag_format": 2, "embedding_model": model, "dims": dims, "analyzer": analyzer},
        "properties": {
            "chunk_id": {"type": "keyword"},
            "source_id": {"type": "keyword"},
            "title": {"type": "text", "analyzer": analyzer},
            "section": {"type": "keyword"},
            "position": {"type": "integer"},
            "text": {"type": "text", "analyzer": analyzer},
            "search_text": {"type": "text", "analyzer": analyzer},
            "metadata": {"type": "object", "enabled": False},
            "vector": {"type": "dense_vector", "dims": dims, "index": True, "similarity": "cosine"},
        },
    }


def index_settings() -> dict[str, Any]:
    """Settings of a TC-RAG document index: one shard and the medical analyzer of :mod:`.text_analysis`.

    Example:
        >>> sorted(index_settings()["analysis"]["analyzer"])
        ['tcrag_medical']
    """
    return {"number_of_shards": 1, "analysis": elasticsearch_analysis()}


def _basic_token(user: str, password: str) -> str:
    """``base64("user:password")``, what an ``Authorization`` header carries (and a server may echo).

    Listed as a secret instead of the user name, which alone is no secret and may be a common word.
    """
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class ElasticsearchStore(DocumentStore):
    """Document store on an Elasticsearch(-compatible) server.

    Args:
        url: server URL, ``http(s)://host:port``.
        index: index name (lower case).
        api_key: API key (``"base64"`` or ``(id, key)``); or ``basic_auth=(user, password)``.
        embeddings: embedder for dense search (default: the packaged MiniLM).
        request_timeout: seconds per HTTP request.
        max_retries: transport retries per request on connection errors / 502-504 (0 = let the
            caller retry, as the tool layer does).
        client: an existing ``Elasticsearch`` client (then url/auth options are not used).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:9200",
        *,
        index: str = "tcrag-docs",
        api_key: str | tuple[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        embeddings: Any = None,
        request_timeout: float = 10.0,
        max_retries: int = 0,
        verify_certs: bool = True,
        ca_certs: str | None = None,
        analyzer: str = ELASTICSEARCH_ANALYZER,
        bulk_chunk_size: int = 200,
        bulk_max_retries: int = 3,
        client: Any = None,
    ) -> None:
        if not isinstance(index, str) or not _INDEX_NAME.match(index):
            raise ValueError(f"invalid Elasticsearch index name {index!r} (lower case letters, digits, '._+-')")
        if request_timeout <= 0:
            raise ValueError("request_timeout must be positive")
        if max_retries < 0 or bulk_max_retries < 0:
            raise ValueError("retries must be >= 0")
        if bulk_chunk_size < 1:
            raise ValueError("bulk_chunk_size must be >= 1")
        if api_key is not None and basic_auth is not None:
            raise ValueError("give api_key or basic_auth, not both")
        self.index = index
        self.request_timeout = float(request_timeout)
        self._embeddings = embeddings
        self._analyzer = analyzer
        self._bulk_chunk_size = bulk_chunk_size
        self._bulk_max_retries = bulk_max_retries
        secrets: list[str] = []
        if isinstance(api_key, tuple):
            secrets.extend((str(api_key[1]), _basic_token(str(api_key[0]), str(api_key[1]))))
        elif api_key:
            secrets.append(str(api_key))
        if basic_auth is not None:
            if not (isinstance(basic_auth, tuple) and len(basic_auth) == 2):
                raise ValueError("basic_auth must be a (user, password) tuple")
            secrets.extend((str(basic_auth[1]), _basic_token(str(basic_auth[0]), str(basic_auth[1]))))
        if client is not None:
            self.url = "<client>"
            self._client = client
        else:
            parts = urlsplit(url or "")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"Elasticsearch URL must look like http(s)://host:port, got {_redact_url(url or '')!r}")
            if parts.password:
                password = unquote(parts.password)
                secrets.extend((password, _basic_token(unquote(parts.username or ""), password)))
            self.url = _redact_url(url)
            from elasticsearch import Elasticsearch

            self._client = Elasticsearch(
                url,
                api_key=api_key,
                basic_auth=basic_auth,
                request_timeout=self.request_timeout,
                max_retries=max_retries,
                retry_on_timeout=False,
                verify_certs=verify_certs,
                ca_certs=ca_certs,
            )
        self._secrets = tuple(s for s in secrets if s)
        self._index_ready = False

    def __repr__(self) -> str:
        return f"ElasticsearchStore(url={self.url!r}, index={self.index!r})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """Credential strings to scrub from messages (never printed by this class)."""
        return self._secrets

    @property
    def client(self):
        return self._client

    @property
    def embeddings(self) -> Any:
        if self._embeddings is None:
            self._embeddings = default_embeddings()
        return self._embeddings

    # -- errors
    def _scrub(self, text: str) -> str:
        return scrub_secrets(text, self._secrets)

    @staticmethod
    def _api_reason(exc: Any) -> str:
        """The error type and the server's ``reason`` (servers may echo request data there: scrub it)."""
        text = str(getattr(exc, "message", "") or exc)
        body = getattr(exc, "body", None)
        error = body.get("error") if isinstance(body, dict) else None
        reason = error.get("reason") if isinstance(error, dict) else None
        return f"{text}: {reason}" if isinstance(reason, str) and reason and reason not in text else text

    @contextlib.contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        """Translate client exceptions into :class:`StoreError` with a ToolError kind."""
        import elasticsearch as es

        where = f"Elasticsearch {operation} on {self.url} index {self.index!r}"
        try:
            yield
        except StoreError:
            raise
        except es.ConnectionTimeout as exc:
            raise StoreError(f"{where}: no answer within {self.request_timeout:g} s", kind="timeout", retryable=True) from exc
        except es.SerializationError as exc:
            raise StoreError(self._scrub(f"{where}: unreadable response ({exc})"), kind="bad_response", retryable=False) from exc
        except es.ConnectionError as exc:
            raise StoreError(self._scrub(f"{where}: cannot connect ({exc})"), kind="unavailable", retryable=True) from exc
        except es.UnsupportedProductError as exc:
            raise StoreError(
                f"{where}: the server did not answer as Elasticsearch (HTTP {exc.meta.status})", kind="bad_response"
            ) from exc
        except es.ApiError as exc:
            status = getattr(exc.meta, "status", None) or 0
            reason = self._scrub(self._api_reason(exc))[:300]
            if status in (401, 403):
                raise StoreError(f"{where}: access denied (HTTP {status})", kind="forbidden") from exc
            if status == 404:
                raise StoreError(f"{where}: not found (HTTP 404: {reason}); build it with `tcrag index`", kind="unavailable") from exc
            if status == 429 or status >= 500:
                raise StoreError(f"{where}: server error HTTP {status}: {reason}", kind="unavailable", retryable=True) from exc
            raise StoreError(f"{where}: request rejected HTTP {status}: {reason}", kind="bad_input") from exc
        except es.TransportError as exc:
            raise StoreError(self._scrub(f"{where}: transport error ({exc})"), kind="unavailable", retryable=True) from exc

    # -- index management
    def create_index(self, *, dims: int | None = None, recreate: bool = False) -> bool:
        """Create the index with :func:`index_mappings`; returns False if it already existed."""
        if dims is None:
            dims = int(getattr(self.embeddings, "dim", 0) or embed_texts(self.embeddings, ["dimension probe"]).shape[1])
        with self._errors("create index"):
            exists = bool(self._client.indices.exists(index=self.index))
            if exists and recreate:
                self._client.indices.delete(index=self.index)
                exists = False
            if not exists:
                mappings = index_mappings(dims, analyzer=self._analyzer, model=embedding_model_name(self.embeddings))
                self._client.indices.create(index=self.index, mappings=mappings, settings=index_settings())
        self._index_ready = True
        return not exists

    def delete_index(self) -> bool:
        """Delete the index; returns False if it did not exist."""
        import elasticsearch as es

        with self._errors("delete index"):
            try:
                self._client.indices.delete(index=self.index)
            except es.NotFoundError:
                return False
        self._index_ready = False
        return True

    def close(self) -> None:
        self._client.close()

    #: every query goes to the Elasticsearch server: DOC_RAG over it is an outbound tool (layer.egress)
    sends_off_machine = True

    # -- writing
    def _add(self, chunks: list[Chunk], vectors: np.ndarray | None, progress: Callable[[int], None] | None) -> int:
        from elasticsearch import helpers

        if not self._index_ready:
            self.create_index(dims=None if vectors is None else int(vectors.shape[1]))

        def actions() -> Iterator[dict[str, Any]]:
            size = self._bulk_chunk_size
            for start in range(0, len(chunks), size):
                batch = chunks[start : start + size]
                batch_vectors = (
                    vectors[start : start + size]
                    if vectors is not None
                    else embed_texts(self.embeddings, [c.search_text for c in batch])
                )
                for chunk, vector in zip(batch, batch_vectors):
                    yield {
                        "_op_type": "index",
                        "_index": self.index,
                        "_id": chunk.chunk_id,
                        **chunk.to_dict(),
                        "search_text": chunk.search_text,
                        "vector": [float(x) for x in vector],
                    }

        failures: list[str] = []
        done = 0
        with self._errors("bulk index"):
            for ok, item in helpers.streaming_bulk(
                self._client,
                actions(),
                chunk_size=self._bulk_chunk_size,
                max_retries=self._bulk_max_retries,
                initial_backoff=0.5,
                max_backoff=8.0,
                raise_on_error=False,
                raise_on_exception=True,
            ):
                if ok:
                    done += 1
                    if progress:
                        progress(1)
                else:
                    op = next(iter(item.values()), {})
                    failures.append(f"{op.get('_id')}: {op.get('status')} {op.get('error')}")
            self._client.indices.refresh(index=self.index)
        if failures:
            raise StoreError(
                f"Elasticsearch bulk index on {self.url}: {len(failures)} of {len(chunks)} chunks failed, e.g. "
                + "; ".join(failures[:3]),
                kind="bad_response",
            )
        return done

    # -- reading
    def count(self) -> int:
        import elasticsearch as es

        with self._errors("count"):
            try:
                return int(self._client.count(index=self.index)["count"])
            except es.NotFoundError:
                return 0

    @staticmethod
    def _exclusion(exclude: frozenset[str]) -> Optional[dict[str, Any]]:
        return {"bool": {"must_not": {"terms": {"source_id": sorted(exclude)}}}} if exclude else None

    def _hits(self, response: Any) -> list[SearchHit]:
        try:
            raw = response["hits"]["hits"]
            scored = [(float(hit.get("_score") or 0.0), Chunk.from_dict(hit["_source"])) for hit in raw]
            # the tie rule of every index (text_analysis.top_k): score descending, then chunk id
            scored.sort(key=lambda pair: (-pair[0], pair[1].chunk_id))
            return [SearchHit(chunk, score, rank) for rank, (score, chunk) in enumerate(scored, start=1)]
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(
                f"Elasticsearch search on {self.url}: unexpected response shape ({type(exc).__name__}: {exc})",
                kind="bad_response",
            ) from exc

    def _bm25(self, query: str, k: int, exclude: frozenset[str]) -> list[SearchHit]:
        must: dict[str, Any] = {"match": {"search_text": {"query": query}}}
        flt = self._exclusion(exclude)
        body = {"bool": {"must": must, **({"filter": flt} if flt else {})}}
        with self._errors("BM25 search"):
            response = self._client.search(
                index=self.index,
                query=body,
                size=k,
                source_excludes=["vector"],
                sort=[{"_score": "desc"}, {"chunk_id": "asc"}],  # ties at the cut-off by chunk id too
                track_scores=True,
            )
        return self._hits(response)

    def _dense(self, query: str, k: int, exclude: frozenset[str]) -> list[SearchHit]:
        vector = embed_texts(self.embeddings, [query])[0]
        knn: dict[str, Any] = {
            "field": "vector",
            "query_vector": [float(x) for x in vector],
            "k": k,
            "num_candidates": min(10_000, max(50, 10 * k)),
        }
        flt = self._exclusion(exclude)
        if flt:
            knn["filter"] = flt
        with self._errors("kNN search"):
            response = self._client.search(index=self.index, knn=knn, size=k, source_excludes=["vector"])
        return self._hits(response)
