"""The paired t-test (:mod:`mcadvantage.evaluation.stats`) against textbook table values and a hand-computed case."""

from __future__ import annotations

import math

import pytest

from mcadvantage.evaluation.stats import paired_t_test, student_t_cdf, student_t_quantile


@pytest.mark.parametrize(
    "df, t975",
    [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (11, 2.201), (30, 2.042), (1000, 1.962)],
)
def test_quantiles_match_the_textbook_table(df, t975):
    assert student_t_quantile(0.975, df) == pytest.approx(t975, abs=1e-3)
    assert student_t_cdf(t975, df) == pytest.approx(0.975, abs=1e-4)
    assert student_t_cdf(-t975, df) == pytest.approx(0.025, abs=1e-4)


def test_cdf_is_symmetric_and_half_at_zero():
    assert student_t_cdf(0.0, 3) == pytest.approx(0.5, abs=1e-12)
    assert student_t_cdf(1.3, 7) + student_t_cdf(-1.3, 7) == pytest.approx(1.0, abs=1e-9)
    assert student_t_cdf(math.inf, 4) == 1.0


def test_paired_t_test_by_hand():
    # Differences 1, 2, 3, 4: mean 2.5, sd sqrt(5/3), se sqrt(5/3)/2 = 0.6455, t = 3.873 on 3 df; t_0.975(3) = 3.182.
    out = paired_t_test([1, 2, 3, 4])
    assert out["mean"] == 2.5 and out["n"] == 4
    assert out["se"] == pytest.approx(math.sqrt(5 / 3) / 2)
    assert out["t"] == pytest.approx(3.873, abs=1e-3)
    assert out["ci95"] == pytest.approx([2.5 - 3.182 * out["se"], 2.5 + 3.182 * out["se"]], abs=2e-3)
    assert 0.025 < out["p"] < 0.035  # two-sided p for t = 3.873 on 3 df is 0.0305
    assert paired_t_test([0.0, 0.0, 0.0])["p"] == 1.0
    assert math.isnan(paired_t_test([0.3])["p"])


def test_holm_adjust_by_hand():
    from mcadvantage.evaluation.stats import holm_adjust

    # m = 3: sorted 0.01, 0.02, 0.04 -> 0.03, max(0.03, 0.04) = 0.04, max(0.04, 0.04) = 0.04; order kept.
    assert holm_adjust([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    # Step-down stays monotone: 0.012 x 2 = 0.024, then 0.02 x 1 = 0.02 is raised to 0.024.
    assert holm_adjust([0.012, 0.02]) == pytest.approx([0.024, 0.024])
    assert holm_adjust([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    out = holm_adjust([0.01, math.nan])  # a task without a test is not counted
    assert out[0] == pytest.approx(0.01) and math.isnan(out[1])
    assert holm_adjust([0.03]) == [0.03]
