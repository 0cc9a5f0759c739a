"""Metric tests: hand-computed values and cross-checks against nltk / rouge-score."""

from __future__ import annotations

import math

import pytest

from tcrag_langgraph.eval.metrics import (
    bleu,
    extract_choice_letters,
    extract_yes_no_maybe,
    label_accuracy,
    mcq_accuracy,
    mcq_exact_match,
    normalize_answer,
    open_answer_scores,
    overlap_tokens,
    parse_gold_letters,
    rouge_l_recall,
    squad_exact_match,
    token_f1,
)


def letters(text, **kw):
    found = extract_choice_letters(text, **kw)
    return None if found is None else "".join(sorted(found))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is (B)", "B"),
        ("B.", "B"),
        ("**C**", "C"),
        ("Answer: A, C", "AC"),
        ("答案：B", "B"),
        ("答案：AC", "AC"),
        ("答案是B选项", "B"),
        ("选项B正确", "B"),
        ("故选D", "D"),
        ("Answer: A, C, and D", "ACD"),
        ("**Answer:** D", "D"),
        ("I think A is wrong. Final answer: C", "C"),
        ("The answer is B, not A", "B"),
        ("B. Pulmonary atresia", "B"),
        ("Therefore **C** is correct.", "C"),
        ("the answer is (b).", "B"),
        ("d", "D"),
        ("Conclusion: the answer is C) Ebstein anomaly", "C"),
        ("Option A is wrong; option B is correct", "B"),
    ],
)
def test_extract_choice_letters(text, expected):
    assert letters(text, letters="ABCD") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        None,
        "A patient with fever should rest",  # article "A", not option A
        "E.g. the drug works",  # "E." followed by a letter is an abbreviation
        "The answer is Aspirin",
        "ACE inhibitors are best",  # E is not an option letter of a 4-option question
        "None of these",
        "answer is a tricky one",
        "A. Reduces confounding\nC. Ensures comparability of two groups",  # lists options, picks none
        "The least effect on prognosis is\nOptions:\nA. Suppuration\nB. Mobility",  # echoed question
        "选项：A. 阿司匹林 B. 肝素",
    ],
)
def test_unparseable_answers_are_none(text):
    assert extract_choice_letters(text, letters="ABCD") is None


def test_echoed_option_list_is_not_an_answer():
    opts = {"A": "Suppuration from the pocket", "B": "Furcation involvement", "C": "Mobility", "D": "Bone loss"}
    echo = "The least effect on prognosis is\nOptions:\nA. Suppuration from the pocket\nB. Furcat"
    assert extract_choice_letters(echo, letters="ABCD", options=opts) is None
    assert letters("A. Suppuration\nB. Furcation\nAnswer: B", letters="ABCD") == "B"  # a marker still counts


def test_option_text_fallback_is_unique_and_prefers_longer_option():
    opts = {"A": "Aspirin", "B": "Aspirin and heparin", "C": "Warfarin"}
    assert letters("I would give aspirin and heparin here", options=opts, letters="ABC") == "B"
    assert letters("I would give aspirin", options=opts, letters="ABC") == "A"
    # Two unrelated options named: ambiguous, so unparseable.
    assert extract_choice_letters("aspirin or warfarin", options=opts, letters="ABC") is None


def test_multi_answer_needs_equal_sets():
    assert mcq_exact_match("Answer: A, C", "AC")
    assert mcq_exact_match("答案：CA", ["A", "C"])
    assert not mcq_exact_match("Answer: A", "AC")  # subset is wrong
    assert not mcq_exact_match("Answer: A, B, C", "AC")  # superset is wrong
    assert not mcq_exact_match("Answer: A, B", "B")  # hedging on a single-answer question is wrong


def test_parse_gold_letters_rejects_garbage():
    assert parse_gold_letters("a, c") == frozenset("AC")
    with pytest.raises(ValueError):
        parse_gold_letters("Z")
    with pytest.raises(ValueError):
        parse_gold_letters("")


def test_mcq_accuracy_keeps_unparseable_in_denominator():
    preds = ["B", "I am not sure", "(C)", None, "Answer: A, D"]
    golds = ["B", "A", "D", "C", "AD"]
    result = mcq_accuracy(preds, golds, letters="ABCD")
    assert (result.correct, result.total, result.unparseable) == (2, 5, 2)
    assert result.accuracy == pytest.approx(0.4)  # the reference code would report 2/3
    with pytest.raises(ValueError):
        mcq_accuracy(["A"], ["A", "B"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Yes.", "yes"),
        ("no", "no"),
        ("Answer: Maybe.", "maybe"),
        ("**No**, because the trial was small", "no"),
        ("In conclusion, yes", "yes"),
        ("Mitochondria are involved. Final decision: no", "no"),
        ("There is no evidence either way", None),
        ("No idea", None),
        ("CONCLUSIONS: No significant difference was found.", None),
        ("Conclusion: no, the trial was negative", "no"),
        ("The answer is no.", "no"),
        ("Pituitary apoplexy: no, histological features do not matter.", "no"),
        ("Results: no significant change", None),
        ("Yes, no or maybe.\n\nThis is a validation study", None),  # the model echoed the instruction
        ("Yes, no", None),
        ("Answer: yes or no", None),
        ("No, no.", "no"),
        ("Yes, there is no evidence against it", "yes"),
        ("Yes, I can answer that. Yes.", "yes"),
        ("No evidence supports it", None),
        ("No - insulin is injected", "no"),
        ("Yes it is", "yes"),
        ("The answer is not clear", None),
        ("", None),
    ],
)
def test_yes_no_maybe(text, expected):
    assert extract_yes_no_maybe(text) == expected


def test_label_accuracy_counts_unparseable_as_wrong():
    r = label_accuracy(["Yes", "unclear", "Answer: no", "maybe"], ["yes", "no", "no", "yes"])
    assert (r.correct, r.total, r.unparseable) == (2, 4, 1)


def test_squad_em_and_f1_hand_computed():
    assert normalize_answer("The  Heart-Lung, machine!") == "heartlung machine"
    assert squad_exact_match("The Aorta.", ["aorta", "pulmonary artery"])
    assert not squad_exact_match("aortic arch", "aorta")
    # pred [left, ventricle], gold [left, ventricle, wall]: P=1, R=2/3, F1=0.8
    assert token_f1("the left ventricle", "left ventricle wall") == pytest.approx(0.8)
    # max over references; repeated tokens use multiset overlap:
    # pred [mg, mg, dose], gold [mg, dose, daily]: common 2, P=2/3, R=2/3
    assert token_f1("mg mg dose", ["unrelated", "mg dose daily"]) == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0
    assert token_f1("", "aorta") == 0.0


def test_chinese_tokens_are_characters():
    assert overlap_tokens("高血压，用ACE抑制剂") == ["高", "血", "压", "用", "ace", "抑", "制", "剂"]
    # pred 高血压 (3 chars), gold 高血压病 (4 chars): P=1, R=3/4 -> F1 = 6/7
    assert token_f1("高血压", "高血压病") == pytest.approx(6 / 7)


def test_bleu_hand_computed():
    hyp, ref = "the cat sat on the mat", "the cat is on the mat"
    # p1=5/6, p2=3/5, p3=1/4, p4=0/3; c=r=6 so BP=1
    assert bleu(hyp, ref, order=1) == pytest.approx(5 / 6)
    assert bleu(hyp, ref, order=2) == pytest.approx(math.sqrt(5 / 6 * 3 / 5))
    assert bleu(hyp, ref, order=4, smooth="none") == 0.0
    # exp smoothing replaces the zero 4-gram precision by 1/(2*3)
    assert bleu(hyp, ref, order=4) == pytest.approx((5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** 0.25)
    # brevity penalty: c=2, r=6 -> exp(1 - 6/2)
    assert bleu("the cat", "the cat sat on the mat", order=1) == pytest.approx(math.exp(-2))


def test_bleu_chinese_is_character_level():
    # hyp 6 chars, 5 of them in the 7-char reference: p1=5/6, BP=exp(1-7/6)
    assert bleu("高血压的治疗", "高血压治疗方法", order=1) == pytest.approx(5 / 6 * math.exp(1 - 7 / 6))


def test_bleu_matches_nltk():
    from nltk.translate.bleu_score import sentence_bleu

    hyp = "low dose aspirin irreversibly inhibits platelet cyclooxygenase for days"
    refs = [
        "low dose aspirin irreversibly inhibits cyclooxygenase in platelets for their lifetime",
        "aspirin at low dose irreversibly inhibits platelet cyclooxygenase",
    ]
    h, r = hyp.split(), [x.split() for x in refs]
    for order in (1, 2, 4):
        expected = sentence_bleu(r, h, weights=tuple([1 / order] * order))
        assert expected > 0
        assert bleu(hyp, refs, order=order, smooth="none") == pytest.approx(expected, rel=1e-9)


def test_bleu4_below_bleu1_on_paraphrases():
    pairs = [
        ("Metformin lowers hepatic glucose output.", "Metformin reduces glucose production in the liver."),
        ("Give oral rehydration salts and continue feeding.", "Continue feeding and give ORS for rehydration."),
        ("The patient likely has iron deficiency anaemia.", "Iron deficiency anaemia is the most likely diagnosis."),
        ("建议低盐饮食并规律服用降压药。", "应低盐饮食，规律服用降压药物。"),
    ]
    for hyp, ref in pairs:
        b1, b4 = bleu(hyp, ref, order=1), bleu(hyp, ref, order=4)
        assert 0 < b4 < b1 <= 1


def test_rouge_l_recall_hand_computed_and_matches_rouge_score():
    from rouge_score import rouge_scorer

    # LCS(aspirin inhibits) = 2 of the 4 reference tokens
    assert rouge_l_recall("aspirin inhibits platelets", "aspirin irreversibly inhibits cox") == pytest.approx(0.5)
    assert rouge_l_recall("x", ["aspirin inhibits cox", "x y"]) == pytest.approx(0.5)  # max over refs
    # Chinese: LCS of 高血压治疗 in 高血压的药物治疗 (8 chars) is 5
    assert rouge_l_recall("高血压治疗", "高血压的药物治疗方案") == pytest.approx(5 / 10)
    lib = rouge_scorer.RougeScorer(["rougeL"])
    hyp = "beta blockers reduce mortality after myocardial infarction in most patients"
    ref = "after myocardial infarction beta blockers reduce long term mortality"
    assert rouge_l_recall(hyp, ref) == pytest.approx(lib.score(ref, hyp)["rougeL"].recall)


def test_open_answer_scores_are_macro_averages():
    scores = open_answer_scores(["the aorta", "nothing"], [["aorta"], "left ventricle"])
    assert scores["n"] == 2
    assert scores["em"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(0.5)
    assert scores["rouge_l_recall"] == pytest.approx(0.5)
    assert 0 < scores["bleu4"] <= scores["bleu1"] <= 1
