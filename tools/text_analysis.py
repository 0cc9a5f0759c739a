"""The one medical-aware text analyzer of every lexical index TC-RAG builds, and its tie rule.

Used by the embedded document store (:class:`~tcrag_langgraph.tools.documents.EmbeddedStore`),
the offline encyclopedia (:mod:`~tcrag_langgraph.tools.web_search`) and the knowledge-graph
entity linker (:mod:`~tcrag_langgraph.tools.knowledge_graph`, which uses :func:`word_spans`);
the Elasticsearch backend gets the same pipeline as index settings (:func:`elasticsearch_analysis`).

Why not bm25s' default tokenizer: it drops every 1-character token and splits codes, so "type 1"
and "type 2" diabetes, ``E11.0`` and ``E11.9``, "stage 2" and "stage 3" became the same query.

The pipeline of :func:`analyze` (deterministic: no randomness, no locale, no external state):

1. **fold** -- Unicode NFKC, accents removed, case-folded (``Ménière`` -> ``meniere``, ``µ`` -> ``μ``).
2. **units** -- a number followed by a unit joins it (``500 mg`` -> ``500mg``, ``7 %`` -> ``7%``);
   the units are :data:`UNITS`.
3. **split** -- compound tokens: runs of letters/digits joined by ``. : - / +`` and an optional
   trailing ``+`` or ``%`` (``e11.9``, ``hp:0001250``, ``covid-19``, ``hba1c``, ``cd4+``, ``her2``,
   ``7%``, ``500mg``, ``mg/dl``). Single letters and digits are tokens.
4. **parts** -- every compound is kept whole *and* in its parts (the letter/digit runs between the
   joiners: ``e11.9`` -> ``e11.9 e11 9``; ``covid-19`` -> ``covid-19 covid 19``; ``cd4+`` ->
   ``cd4+ cd4``), and a number+unit also as number and unit (``500mg`` -> ``500mg 500 mg``;
   ``126mg/dl`` -> ``126mg/dl 126 mg/dl 126mg dl``, as Elasticsearch's ``pattern_capture`` does), so a
   query written ``E11`` or ``COVID 19`` still matches, while the exact compound scores higher.
   Letter/digit boundaries are *not* split (``her2`` never matches ``her3`` through ``her``).
5. **stopwords** -- :data:`STOPWORDS`: bm25s' English list without single characters and without
   negations (``no``, ``not``, ``with``, ``without``, ``nor``), which change a medical meaning.
6. **stem** -- Snowball English (PyStemmer) on purely alphabetic tokens only: codes, numbers and
   mixed tokens are never stemmed (``diabetes`` -> ``diabet``; ``hba1c``, ``e11.9`` unchanged).

Ranking ties (:func:`top_k`): score descending, then the document's id ascending (chunk id,
encyclopedia key, node IRI), so a result never depends on insertion order or sort stability luck.

Where the Elasticsearch analyzer differs (:func:`elasticsearch_analysis`, checked on the noida-db
0.2.3 server of the tests, which implements every piece used: ``pattern_replace`` char filters,
the ``pattern`` tokenizer, ``pattern_capture``, ``stop``, ``keyword_marker`` and ``snowball``):
it yields the same terms as :func:`analyze` for every text of the near-miss table
(tests/tools/test_text_analysis.py), but

* folding: Elasticsearch applies ``lowercase`` + ``asciifolding``, not NFKC + case-folding +
  mark removal, so rare characters can differ (ligatures such as ``ﬁ``, full-width digits, ``æ``
  -> ``ae`` there but ``æ`` here);
* scoring: bm25s and Lucene share the BM25 formula, but Lucene stores document lengths in one
  byte (lossy) and computes statistics per shard (we create one shard), so absolute scores differ
  slightly; Lucene also keeps token positions (phrase queries), bm25s has none;
* the Python analyzer removes a possessive ``'s`` only after a letter or digit; the char filter
  uses the same rule but Java/Rust ``\b`` word boundaries.

Example:
    >>> analyze("Type 2 diabetes (E11.9), HbA1c 7%, metformin 500 mg")
    ['type', '2', 'diabet', 'e11.9', 'e11', '9', 'hba1c', '7%', '7', 'metformin', '500mg', '500', 'mg']
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Callable, Iterator, Sequence

import numpy as np

__all__ = [
    "ANALYZER_VERSION",
    "UNITS",
    "STOPWORDS",
    "fold",
    "compound_tokens",
    "word_spans",
    "analyze",
    "analyzer_fingerprint",
    "top_k",
    "elasticsearch_analysis",
    "ELASTICSEARCH_ANALYZER",
]

#: Bumped whenever :func:`analyze` changes its output; persisted indexes carry it.
ANALYZER_VERSION = 1

#: Units a preceding number joins (after folding; ``μg`` is NFKC of ``µg``).
UNITS: tuple[str, ...] = (
    "%", "mg", "g", "kg", "mcg", "μg", "ug", "ng", "ml", "l", "dl", "mmol", "mol", "mmhg", "iu",
    "mm", "cm", "mg/dl", "mmol/l", "mg/kg", "ng/ml", "kcal", "bpm",
)

_NEGATIONS = frozenset({"no", "not", "with", "without", "nor"})


def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(w for w in STOPWORDS_EN if len(w) > 1 and w not in _NEGATIONS)


#: Words left out of lexical indexes (see the module docstring, step 5).
STOPWORDS: frozenset[str] = _stopwords()

_ALNUM = r"[^\W_]"  # a Unicode letter or digit
_UNIT_ALTERNATION = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
_NUMBER_UNIT_GAP = re.compile(rf"(\d)\s+({_UNIT_ALTERNATION})(?![^\W_])")
_COMPOUND = re.compile(rf"{_ALNUM}+(?:[.:/+\-]{_ALNUM}+)*[+%]?")
_PART = re.compile(rf"{_ALNUM}+")
_NUMBER_WITH_UNIT = re.compile(rf"(\d+(?:[.,]\d+)?)({_UNIT_ALTERNATION})")  # "%" is no word part
_POSSESSIVE = re.compile(r"(?<=[^\W_])['\u2019]s(?![^\W_])")  # Parkinson's -> Parkinson


def fold(text: str) -> str:
    """NFKC, accents removed, case-folded; the length of the text may change.

    Example:
        >>> fold("Ménière's DISEASE")
        "meniere's disease"
    """
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text))
    return unicodedata.normalize("NFC", "".join(ch for ch in text if not unicodedata.combining(ch))).casefold()


def compound_tokens(text: str) -> list[str]:
    """Folded compound tokens with numbers and units joined (steps 1-3), before parts and stopwords.

    Example:
        >>> compound_tokens("CD4+ count < 200 cells, HP:0001250, 126 mg/dL")
        ['cd4+', 'count', '200', 'cells', 'hp:0001250', '126mg/dl']
    """
    return _COMPOUND.findall(_NUMBER_UNIT_GAP.sub(r"\1\2", _POSSESSIVE.sub("", fold(text))))


def _expand(compound: str) -> list[str]:
    """The compound and its distinct parts, whole first."""
    out = [compound]
    number_unit = _NUMBER_WITH_UNIT.fullmatch(compound)
    # number and unit first, then the letter/digit runs (the order of Elasticsearch's pattern_capture)
    parts = [*(number_unit.groups() if number_unit and number_unit.group(2) != "%" else ()), *_PART.findall(compound)]
    for part in parts:
        if part not in out:
            out.append(part)
    return out


@functools.cache
def _stemmer() -> Callable[[str], str]:
    import Stemmer  # PyStemmer, a declared dependency

    return Stemmer.Stemmer("english").stemWord


def analyze(text: str, *, stem: bool = True) -> list[str]:
    """Index/query terms of ``text`` (the whole pipeline of the module docstring), in text order.

    Example:
        >>> analyze("HER2-positive stage 3 COVID-19")
        ['her2-positive', 'her2', 'posit', 'stage', '3', 'covid-19', 'covid', '19']
    """
    stemmer = _stemmer() if stem else None
    terms: list[str] = []
    for compound in compound_tokens(text):
        for token in _expand(compound):
            if token in STOPWORDS:
                continue
            terms.append(stemmer(token) if stemmer is not None and token.isalpha() else token)
    return terms


def analyzer_fingerprint() -> str:
    """Changes whenever the terms :func:`analyze` produces may change (for persisted indexes)."""
    import Stemmer

    return f"tcrag-medical-v{ANALYZER_VERSION};pystemmer={getattr(Stemmer, '__version__', '?')}"


def word_spans(text: str) -> Iterator[tuple[str, int, int]]:
    """The parts (letter/digit runs) of the folded text with their ``[start, end)`` in ``text``.

    For matchers that need word sequences with positions (the KG entity linker): the same folding
    and the same part boundaries as :func:`analyze`, without stopwords or stemming. Offsets point
    into the original ``text`` (folding that changes a character's length is mapped back).

    Example:
        >>> list(word_spans("E11.9 Ménière's"))
        [('e11', 0, 3), ('9', 4, 5), ('meniere', 6, 13)]
    """
    possessive = {m.end() for m in _POSSESSIVE.finditer(text)}
    for match in _PART.finditer(text):
        if match.end() in possessive:
            continue
        start = match.start()
        for piece in _PART.findall(fold(match.group(0))):
            # folding keeps a run a run (it only drops marks / changes case); report the run's span
            yield piece, start, match.end()


def top_k(scores: np.ndarray, k: int, ids: Sequence[str]) -> list[int]:
    """Indices of the ``k`` best finite scores: score descending, then ``ids[i]`` ascending.

    Example:
        >>> top_k(np.array([1.0, 2.0, 2.0, -np.inf]), 3, ["c", "b", "a", "d"])
        [2, 1, 0]
    """
    scores = np.asarray(scores, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(scores))
    if k <= 0 or finite.size == 0:
        return []
    if finite.size > k:
        # everything scoring at least the k-th best score, so ties at the cut are all considered
        cut = np.partition(scores[finite], finite.size - k)[finite.size - k]
        finite = finite[scores[finite] >= cut]
    order = sorted(finite.tolist(), key=lambda i: (-scores[i], ids[i]))
    return order[:k]


#: Name of the custom analyzer in :func:`elasticsearch_analysis`.
ELASTICSEARCH_ANALYZER = "tcrag_medical"


def elasticsearch_analysis() -> dict:
    """Index ``settings.analysis`` reproducing :func:`analyze` in Elasticsearch.

    ``pattern_replace`` char filter (number + unit join), ``pattern`` tokenizer with the compound
    regex (``group: 0``: matches are tokens), ``lowercase`` + ``asciifolding``, ``pattern_capture``
    (``preserve_original``) for the parts, the same stopword list, ``keyword_marker`` on every
    non-alphabetic token so that the Snowball English stemmer leaves codes and numbers alone.

    Example:
        >>> elasticsearch_analysis()["analyzer"]["tcrag_medical"]["tokenizer"]
        'tcrag_compound'
    """
    alnum = r"[\p{L}\p{N}]"
    units = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True) if u != "μg")
    word_units = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True) if u not in ("μg", "%"))
    return {
        "char_filter": {
            "tcrag_possessive": {"type": "pattern_replace", "pattern": r"([\p{L}\p{N}])['\u2019]s\b", "replacement": "$1"},
            "tcrag_number_unit": {
                "type": "pattern_replace",
                "pattern": rf"(?i)(\d)\s+({units}|µg|μg)\b",
                "replacement": "$1$2",
            }
        },
        "tokenizer": {
            "tcrag_compound": {"type": "pattern", "pattern": rf"{alnum}+(?:[.:/+\-]{alnum}+)*[+%]?", "group": 0}
        },
        "filter": {
            "tcrag_parts": {
                "type": "pattern_capture",
                "preserve_original": True,
                "patterns": [rf"^(\d+(?:[.,]\d+)?)({word_units}|µg|μg)$", rf"({alnum}+)"],
            },
            "tcrag_stop": {"type": "stop", "stopwords": sorted(STOPWORDS)},
            "tcrag_keep_codes": {"type": "keyword_marker", "keywords_pattern": r".*[^\p{L}].*"},
            "tcrag_stem": {"type": "snowball", "language": "English"},
        },
        "analyzer": {
            ELASTICSEARCH_ANALYZER: {
                "type": "custom",
                "char_filter": ["tcrag_possessive", "tcrag_number_unit"],
                "tokenizer": "tcrag_compound",
                "filter": ["lowercase", "asciifolding", "tcrag_parts", "tcrag_stop", "tcrag_keep_codes", "tcrag_stem"],
            }
        },
    }
