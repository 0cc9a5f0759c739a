"""Calibration tests on constructed state values."""

from __future__ import annotations

import numpy as np
import pytest

from tcrag_langgraph.eval.calibration import calibrate, propose_sigma, state_value_auroc


def test_auroc_extremes_and_hand_computed():
    assert state_value_auroc([1, 2, 8, 9], [True, True, False, False]) == 1.0
    assert state_value_auroc([8, 9, 1, 2], [True, True, False, False]) == 0.0
    assert state_value_auroc([5, 5, 5, 5], [True, False, True, False]) == 0.5
    # Pairs (correct, wrong): values correct {1, 4}, wrong {3, 6}. Lower is better:
    # (1,3) ok, (1,6) ok, (4,3) bad, (4,6) ok -> 3/4.
    assert state_value_auroc([1, 4, 3, 6], [True, True, False, False]) == pytest.approx(0.75)


def test_auroc_needs_both_classes_and_skips_missing():
    with pytest.raises(ValueError, match="both correct and wrong"):
        state_value_auroc([1, 2], [True, True])
    assert state_value_auroc([1, None, 9, float("nan")], [True, False, False, True]) == 1.0
    with pytest.raises(ValueError, match="labels"):
        state_value_auroc([1, 2], [True])


def test_youden_sigma_on_separable_values():
    p = propose_sigma([3.0, 4.0, 9.0, 12.0], [True, True, False, False])
    assert p.sigma == pytest.approx(6.5)  # midpoint of the gap
    assert (p.tpr, p.fpr, p.objective, p.decision_accuracy, p.accept_rate) == (1.0, 0.0, 1.0, 1.0, 0.5)


def test_accept_is_strictly_below_sigma_and_ties_take_smallest():
    # correct {1, 2}, wrong {2, 10}: sigma 1.5 -> TPR 1/2, FPR 0, J=0.5;
    # sigma 6 -> TPR 1, FPR 1/2, J=0.5 (a tie): the smaller sigma wins.
    p = propose_sigma([1.0, 2.0, 2.0, 10.0], [True, True, False, False])
    assert p.sigma == pytest.approx(1.5) and p.objective == pytest.approx(0.5)


def test_accuracy_rule_differs_from_youden_on_imbalanced_data():
    # 8 correct spread out, 2 wrong in the middle.
    values = [1, 2, 3, 4, 5, 6, 7, 8, 4.5, 4.6]
    labels = [True] * 8 + [False] * 2
    youden = propose_sigma(values, labels, rule="youden")
    acc = propose_sigma(values, labels, rule="accuracy")
    # Accept all: accuracy 8/10. Below 4.5: 4 right accepts + 2 right rejects = 6/10.
    assert acc.sigma > 8 and acc.objective == pytest.approx(0.8)
    # Youden: sigma between 4 and 4.5 gives J = 4/8 - 0 = 0.5; accept all gives 0; best is 0.5
    # unless a later cut does better: below 8.5 gives J = 1 - 1 = 0. So sigma = 4.25.
    assert youden.sigma == pytest.approx(4.25) and youden.objective == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown rule"):
        propose_sigma(values, labels, rule="f1")


def test_youden_matches_sklearn_roc_curve():
    from sklearn.metrics import roc_curve

    rng = np.random.default_rng(0)
    correct = rng.random(300) < 0.6
    values = np.where(correct, rng.normal(8, 3, 300), rng.normal(12, 3, 300)).round(2)
    fpr, tpr, _ = roc_curve(correct, -values, drop_intermediate=False)
    best_j = float(np.max(tpr - fpr))
    p = propose_sigma(values.tolist(), correct.tolist())
    assert p.objective == pytest.approx(best_j)
    accepted = values < p.sigma
    assert p.tpr == pytest.approx(accepted[correct].mean()) and p.fpr == pytest.approx(accepted[~correct].mean())


def test_calibrate_summary():
    r = calibrate([1.0, 2.0, None, 7.0, 9.0], [True, True, False, False, True])
    assert (r.n, r.n_correct, r.n_wrong, r.n_missing) == (4, 3, 1, 1)
    assert r.median_correct == 2.0 and r.median_wrong == 7.0
    assert r.auroc == pytest.approx(2 / 3)  # pairs vs wrong 7: 1 ok, 2 ok, 9 bad
    assert r.to_dict()["proposal"]["sigma"] == r.sigma
