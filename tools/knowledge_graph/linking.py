"""Entity linking: free text -> graph nodes, by ids, labels and synonyms (:func:`link_entities`).

Text is folded and split by the shared analyzer (:func:`..text_analysis.word_spans`, so digits,
single letters and code parts stay words), singularised, then matched as token n-grams against a
label index, with word-order variants and small typo repair (rapidfuzz) and a whole-text fuzzy
fallback for short inputs.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Optional, Protocol, Sequence

from rapidfuzz import fuzz, process
from rapidfuzz.distance import Levenshtein
from rdflib import URIRef
from rdflib.namespace import RDFS

from ..text_analysis import word_spans
from .backends import _IRI_OK
from .evidence import LinkedEntity
from .vocabulary import HPO_BASE, LABEL_PREDICATES

# --------------------------------------------------------------------------- text normalisation

_STOPWORDS = frozenset(
    """a an and are as at be by can cause causes caused could did do does for from had has have how
    i if in into is it its may might of on or other patient patients should such than that the
    their them then there these they this those to was were what when where which who why
    will with without would you your not no yes all any some""".split()
)
_KEEP_S = ("ss", "us", "is", "os", "xis", "ys")
_ID_IN_TEXT = re.compile(r"\b([A-Za-z][A-Za-z0-9]{0,15}):\s?([A-Za-z0-9][A-Za-z0-9._-]{0,30})")
_IRI_IN_TEXT = re.compile(r"<?(https?://[^\s<>\"{}|^`\\]+)>?")
_TRAILING_PAREN = re.compile(r"\s*\([^()]*\)\s*$")
_ICD_CODE = re.compile(r"\b([A-TV-Z][0-9][0-9AB](?:\.[0-9A-Z]{1,4})?)\b")


def _singular(token: str) -> str:
    if len(token) <= 3 or not token.isalpha():
        return token
    if token.endswith("ies") and len(token) > 4:
        return token[:-3] + "y"
    if token.endswith(("ches", "shes", "xes", "sses")):
        return token[:-2]
    if token.endswith("s") and not token.endswith(_KEEP_S):
        return token[:-1]
    return token


def _tokens_with_spans(text: str) -> list[tuple[str, int, int]]:
    """Words of ``text`` as the shared analyzer folds and splits them (:func:`.text_analysis.word_spans`),
    singularised; digits and single letters are kept, so "type 1" and "type 2" stay different."""
    return [(_singular(word), start, end) for word, start, end in word_spans(text)]


def _norm_tokens(text: str) -> list[str]:
    return [t for t, _, _ in _tokens_with_spans(text)]


def _content(tokens: Sequence[str]) -> list[str]:
    return [t for t in tokens if t not in _STOPWORDS]


# --------------------------------------------------------------------------- label index


class _LabelIndex:
    """Normalised label/synonym keys -> nodes, a token vocabulary for typo repair."""

    def __init__(self, rows: Iterable[tuple[Any, Any, Any]], *, exclude: set[Any]) -> None:
        self.exact: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # key -> (iri, text, kind)
        self.bag: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
        self.labels: dict[str, str] = {}
        vocab: Counter[str] = Counter()
        label_preds = set(LABEL_PREDICATES)
        for s, p, literal in rows:
            if not isinstance(s, URIRef) or s in exclude:
                continue
            text = str(literal).strip()
            if not text or len(text) > 300:
                continue
            iri = str(s)
            kind = "label" if p in label_preds else "synonym"
            if kind == "label" and (iri not in self.labels or p == RDFS.label):
                self.labels[iri] = text
            entry = (iri, text, kind)
            # "Diabetes mellitus (E08-E13)" is also found as "Diabetes mellitus"
            bare = _TRAILING_PAREN.sub("", text)
            for variant in {text, bare} if bare else {text}:
                tokens = _norm_tokens(variant)
                if not tokens:
                    continue
                if entry not in self.exact[" ".join(tokens)]:
                    self.exact[" ".join(tokens)].append(entry)
                content = _content(tokens)
                if len(content) >= 2 and entry not in self.bag[" ".join(sorted(content))]:
                    self.bag[" ".join(sorted(content))].append(entry)
                vocab.update(set(tokens))
        for table in (self.exact, self.bag):
            for key, entries in table.items():
                entries.sort(key=lambda e: (e[2] != "label", e[0]))
        self.nodes = set(self.labels) | {e[0] for entries in self.exact.values() for e in entries}
        # most frequent first: on equal edit distance rapidfuzz keeps the first choice
        self.vocab = [t for t, _ in sorted(vocab.items(), key=lambda kv: (-kv[1], kv[0]))]
        self.vocab_set = set(self.vocab)
        self.vocab_count = dict(vocab)
        self.exact_keys = list(self.exact)
        self.max_tokens = min(12, max((k.count(" ") + 1 for k in self.exact_keys), default=1))

    def correct(self, token: str) -> tuple[str, int]:
        """Closest vocabulary token within a small edit distance (1 up to 7 letters, else 2)."""
        if token in self.vocab_set or len(token) < 5 or not token.isalpha():
            return token, 0
        limit = 1 if len(token) <= 7 else 2
        best = process.extractOne(token, self.vocab, scorer=Levenshtein.distance, score_cutoff=limit)
        if best is None:
            return token, 0
        return best[0], int(best[1])

    def common_neighbour(self, token: str) -> tuple[str, int]:
        """For a rare vocabulary token (a typo inside some label, e.g. "syndrom"), a far more
        frequent token one edit away ("syndrome"); else the token itself."""
        count = self.vocab_count.get(token, 0)
        if not count or count >= 3 or len(token) < 5 or not token.isalpha():
            return token, 0
        options = process.extract(token, self.vocab, scorer=Levenshtein.distance, score_cutoff=1, limit=8)
        best = [(self.vocab_count[t], t, int(d)) for t, d, _ in options if t != token and self.vocab_count[t] >= 10 * count]
        if not best:
            return token, 0
        _, alt, distance = max(best, key=lambda item: (item[0], item[1]))
        return alt, distance


def _overlaps(span: tuple[int, int], taken: Sequence[tuple[int, int]]) -> bool:
    return any(span[0] < e and s < span[1] for s, e in taken)


class LinkableGraph(Protocol):
    """What entity linking needs from a graph (a :class:`~.graph.KnowledgeGraph`)."""

    prefixes: dict[str, str]

    @property
    def index(self) -> _LabelIndex: ...

    def curie(self, iri: str) -> str: ...

    def expand(self, curie: str) -> Optional[str]: ...

    def label(self, iri: str) -> Optional[str]: ...

    def exists(self, iri: str) -> bool: ...


def link_entities(kg: "LinkableGraph", text: str, *, limit: int = 5, min_score: float = 0.8, fuzzy: bool = True) -> list[LinkedEntity]:
    """Rank graph nodes mentioned in ``text``.

    Matches ids (``HP:0001250``, ICD-10-CM codes like ``E11.9``, full IRIs), then labels and
    synonyms on normalised tokens (case, punctuation, accents, plurals), with word-order
    variants and small typos repaired against the label vocabulary; a short text that matched
    nothing is compared whole with every label (``fuzzy``). Longer, exact, preferred-label
    matches rank first; overlapping mentions keep the best one.

    Example:
        >>> from rdflib import Graph, Literal, URIRef, RDFS
        >>> g = Graph(); _ = g.add((URIRef("http://ex.org/m"), RDFS.label, Literal("Marfan syndrome")))
        >>> from tcrag_langgraph.tools.knowledge_graph import KnowledgeGraph
        >>> KnowledgeGraph(g).link("syndrome, Marfan")[0].match
        'word-order'
    """
    if not isinstance(text, str):
        raise TypeError("text must be a string")
    index = kg.index
    found: dict[str, LinkedEntity] = {}
    spans_taken: list[tuple[int, int]] = []

    def add(entity: LinkedEntity) -> None:
        old = found.get(entity.iri)
        if old is None or entity.score > old.score:
            found[entity.iri] = entity

    # 1. explicit identifiers
    for match in _IRI_IN_TEXT.finditer(text):
        iri = match.group(1).rstrip(".,;)")
        if _IRI_OK.fullmatch(iri) and (iri in index.nodes or kg.exists(iri)):
            add(LinkedEntity(iri, kg.label(iri) or iri, match.group(0), iri, "id", 1.0))
            spans_taken.append(match.span())
    for match in _ID_IN_TEXT.finditer(text):
        if match.group(1).lower() in ("http", "https") or _overlaps(match.span(), spans_taken):
            continue
        iri = kg.expand(f"{match.group(1)}:{match.group(2)}".rstrip("."))
        if iri is None:
            continue
        if match.group(1).upper() == "HP" and match.group(2).isdigit():
            iri = HPO_BASE + f"{int(match.group(2)):07d}" if kg.prefixes.get("HP") == HPO_BASE else iri
        if _IRI_OK.fullmatch(iri) and (iri in index.nodes or kg.exists(iri)):
            add(LinkedEntity(iri, kg.label(iri) or iri, match.group(0), kg.curie(iri), "id", 1.0))
            spans_taken.append(match.span())
    icd_base = kg.prefixes.get("ICD10CM")
    if icd_base:
        for match in _ICD_CODE.finditer(text):
            if _overlaps(match.span(), spans_taken):
                continue
            code = match.group(1)
            # a code missing from a curated graph falls back to its nearest listed ancestor
            # (E11.65 -> E11.6 -> E11), scored a little lower
            for cut in range(len(code), 2, -1):
                iri = icd_base + code[:cut].rstrip(".")
                if iri in index.nodes:
                    exact = cut == len(code)
                    add(LinkedEntity(iri, kg.label(iri) or iri, code, kg.curie(iri), "id" if exact else "id-ancestor", 1.0 if exact else 0.95))
                    spans_taken.append(match.span())
                    break

    # 2. labels and synonyms on token n-grams
    raw_tokens = [(t, s, e) for t, s, e in _tokens_with_spans(text) if not _overlaps((s, e), spans_taken)]
    fixed = [index.correct(t) for t, _, _ in raw_tokens]
    readings = [fixed]
    also = [index.common_neighbour(t) if e == 0 else (t, e) for t, e in fixed]
    if also != fixed:
        readings.append(also)  # a second reading with rare tokens replaced by common ones
    candidates: list[tuple[float, int, int, int, list[tuple[str, str, str]], str]] = []
    n_tok = len(raw_tokens)
    windows = [(f, n, i) for f in readings for n in range(min(index.max_tokens, n_tok), 0, -1) for i in range(n_tok - n + 1)]
    for reading, n, i in windows:
        window = [reading[j][0] for j in range(i, i + n)]
        if window[0] in _STOPWORDS or window[-1] in _STOPWORDS:
            continue
        if n == 1 and (len(window[0]) < 3 or window[0].isdigit()):
            continue
        edits = sum(reading[j][1] for j in range(i, i + n))
        penalty = 0.06 * edits
        entries = index.exact.get(" ".join(window))
        how = "exact"
        if entries is None and n >= 2:
            content = _content(window)
            if len(content) >= 2:
                entries = index.bag.get(" ".join(sorted(content)))
                how = "word-order"
        if not entries:
            continue
        base = 1.0 if how == "exact" else 0.9
        score = round(base - penalty, 4)
        if score >= min_score:
            candidates.append((score, n, i, edits, entries, how))
    candidates.sort(key=lambda c: (-c[1], -c[0], c[2]))  # longest mention first
    used: set[int] = set()
    for score, n, i, edits, entries, how in candidates:
        positions = set(range(i, i + n))
        if positions & used:
            continue
        used |= positions
        mention = text[raw_tokens[i][1] : raw_tokens[i + n - 1][2]]
        for iri, via, kind in entries:
            match_kind = how if how != "exact" else kind
            if edits:
                match_kind = "fuzzy"
            entity_score = score - (0.02 if kind == "synonym" else 0.0)
            add(LinkedEntity(iri, index.labels.get(iri, via), mention, via, match_kind, round(entity_score, 4)))

    # 3. whole-text fuzzy match for short inputs (an entity name with a typo, missing words...)
    if fuzzy and not found:
        query = " ".join(_norm_tokens(text))
        if 0 < len(query) <= 80 and len(_content(query.split())) >= 1:
            for key, ratio, _ in process.extract(
                query, index.exact_keys, scorer=fuzz.token_sort_ratio, limit=limit, score_cutoff=88
            ):
                for iri, via, kind in index.exact[key]:
                    score = round(ratio / 100.0 - 0.1, 4)
                    if score >= min_score - 0.05:
                        add(LinkedEntity(iri, index.labels.get(iri, via), text.strip(), via, "fuzzy", score))

    ranked = sorted(found.values(), key=lambda e: (-e.score, -len(e.mention), e.match != "label", e.iri))
    return ranked[: max(0, limit)]
