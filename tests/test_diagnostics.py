"""Credit-assignment diagnostics, on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from mcadvantage.diagnostics import ranking_accuracy, sign_accuracy, value_errors


def test_value_errors_by_hand():
    out = value_errors([0.5, 0.5, 1.0], [0.0, 1.0, 1.0])
    # errors 0.5, -0.5, 0: MAE 1/3, RMSE sqrt(0.5/3); Var(truth) = 2/9, Var(errors) = 1/6 -> EV = 1 - 0.75
    assert out["mae"] == pytest.approx(1 / 3)
    assert out["rmse"] == pytest.approx(math.sqrt(0.5 / 3))
    assert out["explained_variance"] == pytest.approx(0.25)
    assert math.isnan(value_errors([0.3, 0.3], [0.5, 0.5])["explained_variance"])  # the truth does not vary
    assert value_errors([1.0, 2.0], [1.0, 2.0]) == {"mae": 0.0, "rmse": 0.0, "explained_variance": 1.0}


def test_sign_accuracy_by_hand():
    est = [0.2, -0.1, 0.0, 0.3, -0.4]
    tru = [0.5, 0.2, -0.1, 0.0, -0.3]
    # decided (|t| > 0): (0.2, 0.5) right, (-0.1, 0.2) wrong, (0.0, -0.1) wrong (zero ranks nothing), (-0.4, -0.3) right
    assert sign_accuracy(est, tru) == 0.5
    # with tolerance 0.25 only (0.2, 0.5) and (-0.4, -0.3) are decided
    assert sign_accuracy(est, tru, tolerance=0.25) == 1.0
    assert math.isnan(sign_accuracy([1.0], [0.0]))


def test_ranking_accuracy_by_hand():
    est = [[0.9, 0.1, 0.5], [0.2, 0.2], [0.4, 0.6]]
    tru = [[1.0, 0.0, 0.0], [1.0, 0.0], [0.5, 0.5]]
    out = ranking_accuracy(est, tru)
    # group 0: pairs (0,1) agree, (0,2) agree, (1,2) tied in truth -> skipped; group 1: one pair, estimate tied: 0.5;
    # group 2: truth tied -> no pair, no unique best.
    assert out["pairs"] == 3 and out["pairwise"] == pytest.approx(2.5 / 3)
    # top-1: group 0 picks alternative 0 (right); group 1 splits between the two (0.5); group 2 has no unique best
    assert out["groups"] == 2 and out["top1"] == pytest.approx(0.75)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="estimated has 2 values but truth has 1"):
        value_errors([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        sign_accuracy([float("nan")], [1.0])
    with pytest.raises(ValueError, match="2 estimated groups but 1 true groups"):
        ranking_accuracy([[1.0], [2.0]], [[1.0]])
