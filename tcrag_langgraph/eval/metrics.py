"""Answer extraction and scoring: multiple-choice EM, yes/no/maybe, SQuAD EM/F1, BLEU, ROUGE-L.

Every score is a fraction in ``[0, 1]`` (tables multiply by 100). Design rules, each one a fix of
a defect in the paper's reference code:

* An answer whose letters cannot be parsed is **wrong**, never dropped from the denominator
  (:func:`mcq_accuracy` reports how many were unparseable next to the accuracy).
* A multi-answer question is correct only when the predicted letter *set* equals the gold set.
* BLEU-N is the real geometric mean of the clipped 1..N-gram precisions times the brevity
  penalty (computed by ``sacrebleu``), so BLEU-4 <= BLEU-1 on ordinary paraphrases. Chinese is
  tokenised per character.
* ROUGE-R (paper appendix 8.7.5) is reported as ROUGE-L recall (``rouge-score``) with a tokenizer
  that keeps Chinese characters (the library's default tokenizer deletes them).

Example:
    >>> sorted(extract_choice_letters("Answer: A, C"))
    ['A', 'C']
    >>> mcq_exact_match("The answer is (B)", "B")
    True
    >>> extract_yes_no_maybe("Answer: Maybe.")
    'maybe'
    >>> round(token_f1("the cat sat", ["a cat sat down"]), 3)
    0.8

Why one module of this size: every metric of the paper's tables, each small and tested against a
reference library; one file keeps one table's definitions side by side.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Literal, Mapping, Optional, Sequence

__all__ = [
    "extract_choice_letters",
    "parse_gold_letters",
    "mcq_exact_match",
    "mcq_accuracy",
    "AccuracyResult",
    "extract_yes_no_maybe",
    "label_accuracy",
    "normalize_answer",
    "squad_exact_match",
    "token_f1",
    "overlap_tokens",
    "contains_cjk",
    "bleu",
    "rouge_l_recall",
    "open_answer_scores",
    "mean",
]

Tokenize = Literal["auto", "13a", "zh", "none"]

# --------------------------------------------------------------------------------------------
# Multiple-choice letters
# --------------------------------------------------------------------------------------------

_DEFAULT_LETTERS = "ABCDE"

# Words that announce the answer. Longer alternatives first so "final answer" wins over "answer".
# Plural "Options:" / "Choices:" and "选项：" head an echoed option list, so they are not markers.
_MARKER = (
    r"(?:final\s+answer|correct\s+answers?|correct\s+options?|best\s+answer|answers?|"
    r"option|choice|正确答案|最终答案|答案|选项(?![:：])|故选|应选|选择|选)"
)
# What may sit between the marker and the letters: "is", ":", "**", "(", "为", ...
_GLUE = r"(?:[\s\*_:：=\-—>\(\[（【]|is|are|was|would\s+be|should\s+be|must\s+be|为|是|應為|应为)*"
# Separators inside a list of letters: "A, C", "A and C", "A、C", "A/C", "A & C".
_SEP = (
    r"(?:\s*(?:,|，|、|/|&|\+|;|；)\s*(?:(?:and|or)\s+)?"
    r"|\s+(?:and|or)\s+|\s*(?:和|及|与)\s*|\s+)"
)


def _letter_list_regex(letters: str) -> re.Pattern[str]:
    cls = "[" + re.escape(letters.upper()) + "]"
    lcls = "[" + re.escape(letters.lower()) + "]"
    # One item: a capital letter, or a bracketed lower-case letter "(b)", optionally bolded.
    # A run of capitals "ACD" (Chinese exams write multi-answers this way) is one item too.
    item = rf"(?:\*\*)?[\(\[（]?(?:{cls}+|{lcls}(?=[\)\]）]))[\)\]）]?(?:\*\*)?"
    return re.compile(rf"(?P<list>{item}(?:{_SEP}{item})*)(?![A-Za-z0-9])")


@lru_cache(maxsize=16)
def _patterns(letters: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    letter_list = _letter_list_regex(letters).pattern
    # The marker and glue are case-insensitive but the letters are not: rebuild with a scoped flag.
    marked = re.compile(rf"(?i:{_MARKER}{_GLUE}){letter_list}")
    whole = re.compile(rf"^[\s\*_\(\[（]*{letter_list}[\s\*_\.\)\]）。!！]*$")
    cls = "[" + re.escape(letters.upper()) + "]"
    leading = re.compile(rf"^[\s\*_]*[\(\[（]?(?P<l>{cls})(?:\*\*)?[\)\]）\.:：、](?![A-Za-z\d])")
    emphasised = re.compile(rf"(?:\*\*\(?(?P<a>{cls})\)?\*\*|[\(（](?P<b>{cls})[\)）])")
    return marked, whole, leading, emphasised


@lru_cache(maxsize=16)
def _item_regex(letters: str) -> re.Pattern[str]:
    cls = "[" + re.escape(letters.upper()) + "]"
    lcls = "[" + re.escape(letters.lower()) + "]"
    return re.compile(rf"(?P<up>{cls}+)|(?<![A-Za-z])(?P<low>{lcls})(?=[\)\]）])")


def _letters_in(span: str, letters: str) -> Optional[frozenset[str]]:
    # Only the list items count: capitals, or a bracketed lower-case letter. Separator words
    # such as "and" must not contribute their letters.
    found: set[str] = set()
    for m in _item_regex(letters).finditer(span):
        found.update((m.group("up") or m.group("low")).upper())
    return frozenset(found) if found else None


def extract_choice_letters(
    text: Optional[str],
    *,
    letters: str = _DEFAULT_LETTERS,
    options: Optional[Mapping[str, str]] = None,
) -> Optional[frozenset[str]]:
    """The set of option letters an answer picks, or ``None`` when it cannot be parsed.

    Rules, first match wins:

    1. The last explicit marker: "The answer is (B)", "Answer: A, C", "**Answer:** D",
       "答案：B", "故选AC", "Option C".
    2. The whole reply is a list of letters: "B.", "**C**", "A, C", "AC" (or one lower-case
       letter alone, "b").
    3. The reply starts with an option label: "B. Pulmonary atresia", "(C) ...".
    4. Exactly one distinct emphasised letter "**C**" or bracketed letter "(C)".
    5. If ``options`` is given: exactly one option's text occurs in the reply.

    Without a marker, a reply whose lines start with two or more different option labels (an
    echoed option list) is unparseable.

    Letters outside ``letters`` (pass the question's option letters) are ignored, so "ACE
    inhibitors" is not read as A, C, E on a four-option question.

    Example:
        >>> sorted(extract_choice_letters("答案：B"))
        ['B']
        >>> extract_choice_letters("A patient should rest") is None
        True
        >>> sorted(extract_choice_letters("it is aspirin", options={"A": "Aspirin", "B": "Heparin"}))
        ['A']
    """
    if text is None:
        return None
    text = unicodedata.normalize("NFKC", str(text)).strip()
    if not text:
        return None
    letters = "".join(sorted({c.upper() for c in letters}))
    marked, whole, leading, emphasised = _patterns(letters)

    hits = [m for m in marked.finditer(text)]
    for match in reversed(hits):
        found = _letters_in(match.group("list"), letters)
        if found:
            return found
    m = whole.match(text)
    if m:
        found = _letters_in(m.group("list"), letters)
        if found:
            return found
    bare = re.sub(r"[\s\*_\.\(\)\[\]（）。:：]", "", text)
    if len(bare) == 1 and bare.upper() in letters:
        return frozenset({bare.upper()})
    # "A. x\nC. y": a reply listing several options line by line (often the question echoed)
    # chooses none of them, whether by its first label or by the option texts it contains.
    listed = {ln.group("l").upper() for ln in (leading.match(line) for line in text.splitlines()) if ln}
    if len(listed) > 1:
        return None
    m = leading.match(text)
    if m:
        return frozenset({m.group("l").upper()})
    emph = {(m.group("a") or m.group("b")).upper() for m in emphasised.finditer(text)}
    if len(emph) == 1:
        return frozenset(emph)
    if options:
        reply = f" {_squash(text)} "
        texts = {k.upper(): _squash(v) for k, v in options.items() if v and _squash(v)}
        matched = {k for k, v in texts.items() if f" {v} " in reply}
        # Drop an option whose text is contained in another matched option ("Aspirin" vs
        # "Aspirin and heparin"): the longer one is what the reply names.
        matched = {k for k in matched if not any(k != o and f" {texts[k]} " in f" {texts[o]} " for o in matched)}
        if len(matched) == 1:
            return frozenset(matched)
    return None


def _squash(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def parse_gold_letters(answer: str | Sequence[str], *, letters: str = _DEFAULT_LETTERS) -> frozenset[str]:
    """Gold letters from "B", "AC", "A, C" or ["A", "C"]; raises ``ValueError`` on anything else.

    Example:
        >>> sorted(parse_gold_letters("A,C"))
        ['A', 'C']
    """
    items = [answer] if isinstance(answer, str) else list(answer)
    valid = {c.upper() for c in letters}
    out: set[str] = set()
    for item in items:
        cleaned = re.sub(r"[\s,，、;/&]+", "", str(item)).upper()
        if not cleaned or any(ch not in valid for ch in cleaned):
            raise ValueError(f"gold answer {answer!r} is not a set of option letters from {sorted(valid)}")
        out.update(cleaned)
    return frozenset(out)


def mcq_exact_match(
    prediction: Optional[str],
    gold: str | Sequence[str],
    *,
    letters: str = _DEFAULT_LETTERS,
    options: Optional[Mapping[str, str]] = None,
) -> bool:
    """True when the predicted letter set equals the gold set (unparseable is False).

    Example:
        >>> mcq_exact_match("Answer: A, C", "AC"), mcq_exact_match("Answer: A", "AC")
        (True, False)
    """
    predicted = extract_choice_letters(prediction, letters=letters, options=options)
    return predicted is not None and predicted == parse_gold_letters(gold, letters=letters)


@dataclass(frozen=True)
class AccuracyResult:
    """Accuracy over *all* questions; ``unparseable`` answers are counted as wrong."""

    correct: int
    total: int
    unparseable: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def mcq_accuracy(
    predictions: Sequence[Optional[str]],
    golds: Sequence[str | Sequence[str]],
    *,
    letters: str = _DEFAULT_LETTERS,
    options: Optional[Sequence[Optional[Mapping[str, str]]]] = None,
) -> AccuracyResult:
    """EM accuracy of multiple-choice answers; the denominator is every question.

    Example:
        >>> r = mcq_accuracy(["B", "no idea", "(C)"], ["B", "A", "D"])
        >>> (r.correct, r.total, r.unparseable, round(r.accuracy, 3))
        (1, 3, 1, 0.333)
    """
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} gold answers")
    if options is not None and len(options) != len(golds):
        raise ValueError("options must have one entry per question")
    correct = unparseable = 0
    for i, (pred, gold) in enumerate(zip(predictions, golds)):
        opts = options[i] if options is not None else None
        found = extract_choice_letters(pred, letters=letters, options=opts)
        if found is None:
            unparseable += 1
        elif found == parse_gold_letters(gold, letters=letters):
            correct += 1
    return AccuracyResult(correct=correct, total=len(golds), unparseable=unparseable)


# --------------------------------------------------------------------------------------------
# Yes / no / maybe (PubMedQA)
# --------------------------------------------------------------------------------------------

# "no" is also a determiner ("No significant difference", "no idea"): as a label it must be
# followed by punctuation or the end of the text.
_NO_END = r"(?=\s*(?:[.,;:!?)\]\*\"'\-—]|$))"
_YNM = rf"(?:(?P<label>yes|maybe)\b|(?P<no>no){_NO_END})"
_YNM_MARKED = re.compile(
    rf"(?:final\s+answer|final\s+decision|answer|decision|conclusion|verdict)"
    rf"(?:[\s\*_:：=\-—\(\[,]|is|would\s+be|should\s+be)*{_YNM}",
    re.IGNORECASE,
)
_YNM_LEADING = re.compile(rf"^[\s\*_\(\[\"']*{_YNM}", re.IGNORECASE)
# "Pituitary apoplexy: no, ..." -- a label right after a colon and before punctuation / the end.
_YNM_AFTER_COLON = re.compile(
    rf"[:：]\s*(?:\*\*)?(?:(?P<label>yes|maybe)|(?P<no>no))(?=\s*(?:[.,;:!?)\]\*\"'\-—]|$))", re.IGNORECASE
)


# For the ambiguity check: every label in a sentence, "no" also before "or" ("yes, no or maybe").
_YNM_ANY = re.compile(
    r"\b(yes|maybe)\b|\b(no)(?=\s*(?:[.,;:!?)\]\*\"'\-—/]|$|or\b))", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"[.!?。！？\n]")


def _sentence_labels(text: str, start: int) -> set[str]:
    end = _SENTENCE_END.search(text, start)
    segment = text[start: end.start() if end else len(text)]
    return {(a or b).lower() for a, b in _YNM_ANY.findall(segment)}


def extract_yes_no_maybe(text: Optional[str]) -> Optional[str]:
    """``"yes"``, ``"no"`` or ``"maybe"`` from a reply, or ``None``.

    Three places count, in this order: the last explicit marker ("Answer: no", "the final
    decision is maybe"), the first word of the reply ("Yes, because ..."), and the last label
    standing alone after a colon ("Pituitary apoplexy: no, histology does not matter"). A "no" somewhere in the middle
    of a sentence ("there is no evidence") is *not* read as the label, and "no" counts only when
    punctuation or the end follows ("No." or "Answer: no, ..." but not "No idea" or
    "Conclusion: No significant difference"). A reply naming several labels in the same sentence
    ("Yes, no or maybe", "Answer: yes or no") is unparseable.

    Example:
        >>> extract_yes_no_maybe("**Yes.** Mitochondria play a role.")
        'yes'
        >>> extract_yes_no_maybe("There is no evidence either way") is None
        True
    """
    if text is None:
        return None
    text = unicodedata.normalize("NFKC", str(text)).strip()
    for pattern in (_YNM_MARKED, _YNM_LEADING, _YNM_AFTER_COLON):
        hits = list(pattern.finditer(text))
        if not hits:
            continue
        hit = hits[-1]
        label = (hit.group("label") or hit.group("no")).lower()
        # "Yes, no or maybe" / "Answer: yes or no" name several labels: that is no answer.
        start = hit.start("label") if hit.group("label") else hit.start("no")
        if _sentence_labels(text, start) - {label}:
            return None
        return label
    return None


def label_accuracy(predictions: Sequence[Optional[str]], golds: Sequence[str]) -> AccuracyResult:
    """Accuracy of yes/no/maybe replies against gold labels (unparseable = wrong).

    Example:
        >>> label_accuracy(["Yes.", "hmm", "Answer: maybe"], ["yes", "no", "no"]).accuracy
        0.3333333333333333
    """
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} gold labels")
    correct = unparseable = 0
    for pred, gold in zip(predictions, golds):
        label = extract_yes_no_maybe(pred)
        if label is None:
            unparseable += 1
        elif label == gold.strip().lower():
            correct += 1
    return AccuracyResult(correct=correct, total=len(golds), unparseable=unparseable)


# --------------------------------------------------------------------------------------------
# SQuAD-style EM and token F1 (with per-character tokens for Chinese)
# --------------------------------------------------------------------------------------------

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef\u3040-\u30ff\uac00-\ud7af]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {
    ch for ch in "，。、；：？！“”‘’（）【】《》—…·「」『』"
}


def contains_cjk(text: str) -> bool:
    """True if ``text`` has any Chinese/Japanese/Korean character."""
    return bool(_CJK.search(text or ""))


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and English articles, squeeze spaces.

    Example:
        >>> normalize_answer("The  Heart-Lung, machine!")
        'heartlung machine'
    """
    text = unicodedata.normalize("NFKC", text or "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def overlap_tokens(text: str) -> list[str]:
    """Tokens for EM/F1: SQuAD-normalised words, with every CJK character its own token.

    Example:
        >>> overlap_tokens("The 高血压 drug")
        ['高', '血', '压', 'drug']
    """
    norm = normalize_answer(text)
    out: list[str] = []
    for word in norm.split():
        if contains_cjk(word):
            buf = ""
            for ch in word:
                if _CJK.match(ch):
                    if buf:
                        out.append(buf)
                        buf = ""
                    out.append(ch)
                else:
                    buf += ch
            if buf:
                out.append(buf)
        else:
            out.append(word)
    return out


def _as_list(references: str | Sequence[str]) -> list[str]:
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("at least one reference answer is needed")
    return refs


def squad_exact_match(prediction: Optional[str], references: str | Sequence[str]) -> bool:
    """Normalised exact match against any reference.

    Example:
        >>> squad_exact_match("The Aorta.", ["aorta"])
        True
    """
    pred = overlap_tokens(prediction or "")
    return any(pred == overlap_tokens(ref) for ref in _as_list(references))


def token_f1(prediction: Optional[str], references: str | Sequence[str]) -> float:
    """SQuAD token F1, the maximum over references (multiset overlap of normalised tokens).

    Example:
        >>> token_f1("left ventricle", "the left ventricle wall")
        0.8
    """
    pred = overlap_tokens(prediction or "")
    best = 0.0
    for ref in _as_list(references):
        gold = overlap_tokens(ref)
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred), common / len(gold)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


# --------------------------------------------------------------------------------------------
# BLEU (sacrebleu) and ROUGE-L recall (rouge-score)
# --------------------------------------------------------------------------------------------


def _pick_tokenizer(tokenize: Tokenize, texts: Iterable[str]) -> str:
    if tokenize != "auto":
        return tokenize
    return "zh" if any(contains_cjk(t) for t in texts) else "13a"


@lru_cache(maxsize=32)
def _bleu_metric(order: int, tokenize: str, lowercase: bool, smooth: str):
    from sacrebleu.metrics import BLEU

    return BLEU(
        max_ngram_order=order,
        tokenize=tokenize,
        lowercase=lowercase,
        smooth_method=smooth,
        effective_order=True,
    )


def bleu(
    prediction: Optional[str],
    references: str | Sequence[str],
    *,
    order: int = 4,
    tokenize: Tokenize = "auto",
    lowercase: bool = True,
    smooth: Literal["exp", "none", "floor", "add-k"] = "exp",
) -> float:
    """Sentence BLEU-``order`` in ``[0, 1]``: ``BP * exp(mean(log p_1..p_order))``.

    Computed by sacrebleu (clipped n-gram counts, closest-reference brevity penalty, effective
    order for hypotheses shorter than ``order``). ``tokenize="auto"`` uses sacrebleu's ``zh``
    tokenizer (one token per Chinese character, 13a for the rest) when any text contains CJK,
    else ``13a``. ``smooth="exp"`` is sacrebleu's sentence-level default (NIST geometric
    smoothing of zero-match orders); ``"none"`` gives 0 whenever some order has no match.

    Example:
        >>> round(bleu("the cat sat on the mat", "the cat sat on the mat"), 3)
        1.0
        >>> bleu("aspirin", "heparin", order=1)
        0.0
    """
    if order < 1:
        raise ValueError("order must be >= 1")
    refs = _as_list(references)
    hyp = prediction or ""
    tok = _pick_tokenizer(tokenize, [hyp, *refs])
    metric = _bleu_metric(order, tok, lowercase, smooth)
    return metric.sentence_score(hyp, refs).score / 100.0


class _MixedTokenizer:
    """rouge-score tokenizer: lower-cased words, one token per CJK character, punctuation dropped."""

    def tokenize(self, text: str) -> list[str]:
        return overlap_tokens(text)


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False, tokenizer=_MixedTokenizer())


def rouge_l_recall(prediction: Optional[str], references: str | Sequence[str]) -> float:
    """ROUGE-L recall (LCS length / reference length), the maximum over references.

    This is the paper's ROUGE-R: how much of the reference the answer covers, in order.
    English articles and punctuation are dropped (SQuAD normalisation) and every CJK character is
    one token.

    Example:
        >>> rouge_l_recall("aspirin inhibits platelets", "aspirin irreversibly inhibits cox")
        0.5
    """
    scorer = _rouge_scorer()
    return max(scorer.score(ref, prediction or "")["rougeL"].recall for ref in _as_list(references))


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean (0.0 for no values)."""
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0


def open_answer_scores(
    predictions: Sequence[Optional[str]],
    references: Sequence[str | Sequence[str]],
    *,
    tokenize: Tokenize = "auto",
) -> dict[str, float]:
    """Macro averages over questions of EM, F1, BLEU-1, BLEU-4 and ROUGE-L recall.

    Example:
        >>> s = open_answer_scores(["the aorta"], [["aorta"]])
        >>> s["em"], s["f1"], s["n"]
        (1.0, 1.0, 1)
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    rows = list(zip(predictions, references))
    return {
        "n": len(rows),
        "em": mean(float(squad_exact_match(p, r)) for p, r in rows),
        "f1": mean(token_f1(p, r) for p, r in rows),
        "bleu1": mean(bleu(p, r, order=1, tokenize=tokenize) for p, r in rows),
        "bleu4": mean(bleu(p, r, order=4, tokenize=tokenize) for p, r in rows),
        "rouge_l_recall": mean(rouge_l_recall(p, r) for p, r in rows),
    }
