"""benchmarks/mc_efficiency.py: its statistics (hand-computed cases) and a small run of the exact toy."""

from __future__ import annotations

import json
import math

import pytest
from _helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("mc_efficiency")


def test_spearman_hand_cases(bench):
    assert bench.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert bench.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties share their average rank: ranks (0.5, 0.5, 2) vs (0, 1, 2) -> Pearson 0.866.
    assert bench.spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(bench.spearman([1, 1, 1], [1, 2, 3]))


def test_interpolated_tokens_at_equal_error(bench):
    # MSE 1/K-like: (10, 0.1), (30, 0.0333); the target 0.05 sits at log-log fraction
    # log(0.5) / log(1/3) = 0.631 -> tokens 10 * 3 ** 0.631 = 20.0.
    points = [(10.0, 0.1), (30.0, 0.1 / 3)]
    assert bench._interpolate_tokens(points, 0.05) == pytest.approx(20.0, rel=1e-6)
    assert bench._interpolate_tokens(points, 0.2) == 10.0  # the cheapest point is already there
    assert bench._interpolate_tokens(points, 0.01) is None  # never reached


def test_score_against_exact_truth(bench):
    from types import SimpleNamespace

    # One response, states at 0 and 2, reward 1. Truth V(S_0) = 0.5, V(S_1) = 0.8; estimate 0.6, 0.7.
    est = SimpleNamespace(values=[[0.6, 0.7, 1.0]])
    traj = SimpleNamespace(reward=1.0)
    out = bench.score(est, [[0, 2, 5]], [traj], {(0, 0): 0.5, (0, 2): 0.8})
    assert out["value_mse"] == pytest.approx((0.01 + 0.01) / 2)
    # True advantages 0.3, 0.2 (both decided); estimated 0.1, 0.3: both signs right.
    assert out["sign_accuracy"] == 1.0 and out["states_per_response"] == 2


@pytest.mark.slow
def test_toy_run_writes_the_documented_schema(bench, tmp_path):
    out = tmp_path / "mc.json"
    assert (
        bench.main(
            [
                "--tasks",
                "toy",
                "--toy_groups",
                "40",
                "--repeats",
                "1",
                "--json",
                str(out),
                "--runs",
                str(tmp_path / "runs"),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    names = {o["name"] for o in data["options"]}
    assert {"fixed K=1", "fixed K=3", "fixed K=9", "reuse K=3", "variance K=3"} <= names
    for o in data["options"]:
        assert {
            "name",
            "tokens_per_response",
            "value_mse",
            "sign_accuracy",
            "tokens_ratio_vs_k9_at_equal_error",
        } <= set(o)
    fixed9 = next(o for o in data["options"] if o["name"] == "fixed K=9")
    assert fixed9["tokens_ratio_vs_k9_at_equal_error"] == pytest.approx(1.0)
    # Free samples: reuse at K=9 spends fewer tokens than fixed K=9 (the prompt states need no rollout).
    reuse9 = next(o for o in data["options"] if o["name"] == "reuse K=9")
    assert reuse9["tokens_per_response"] < fixed9["tokens_per_response"]
    assert out.with_suffix(".png").exists()
    # The expected fixed-K error (mean v (1 - v) from the exact values, kept in the meta file) and the ratio against it.
    assert data["value_variance"]["toy"] > 0 and "expected_value_mse" in fixed9
    assert "tokens_ratio_vs_expected_k9" in next(o for o in data["options"] if o["name"] == "variance K=3")
    # --families / --ks run only those points.
    assert bench.main(["--tasks", "toy", "--toy_groups", "40", "--repeats", "2", "--families", "fixed", "--ks", "1",
                       "--json", str(out), "--runs", str(tmp_path / "runs")]) == 0  # fmt: skip
    second = [
        json.loads(x)
        for x in (tmp_path / "runs" / "toy.jsonl").read_text().splitlines()
        if '"repeat": 1' in x
    ]
    assert [(r["family"], r["k"]) for r in second] == [("fixed", 1)]
    # A meta file written before value_variance existed is completed on --report, but only for its own settings.
    meta_path = tmp_path / "runs" / "toy.meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["value_variance"]
    meta_path.write_text(json.dumps(meta))
    report = ["--tasks", "toy", "--report", "--json", str(out), "--runs", str(tmp_path / "runs")]
    assert bench.main([*report, "--toy_groups", "41"]) == 0
    assert "value_variance" not in json.loads(meta_path.read_text())
    assert bench.main([*report, "--toy_groups", "40"]) == 0
    assert json.loads(meta_path.read_text())["value_variance"] == pytest.approx(data["value_variance"]["toy"])
    # Resumable: a second run finds every point done and only aggregates.
    assert (
        bench.main(["--tasks", "toy", "--repeats", "1", "--json", str(out), "--runs", str(tmp_path / "runs")])
        == 0
    )
    lines = (tmp_path / "runs" / "toy.jsonl").read_text().splitlines()
    assert len(lines) == sum(len(ks) for _, ks in bench.FAMILIES.values()) + 1
    # Runs of another configuration never mix into these.
    with pytest.raises(SystemExit, match="holds runs with settings"):
        bench.main(
            ["--tasks", "toy", "--toy_groups", "41", "--repeats", "2", "--runs", str(tmp_path / "runs")]
        )


def test_toy_value_by_dynamic_programming_equals_enumeration(bench):
    from mcadvantage.testing import StepTreeSampler

    toy = StepTreeSampler(
        step_token_ids=[10, 11, 12],
        step_probs=[0.5, 0.3, 0.2],
        depth=6,
        success_prob=lambda steps: bench.TOY_P[sum(steps) % 4],
        success_token_id=1,
        failure_token_id=2,
        eos_token_id=0,
    )
    for prefix in ([7], [7, 10], [7, 12, 11, 10], [7, 11, 11, 12, 10, 12, 12]):
        exact = toy.value(prefix)
        assert bench.toy_value(toy.steps_of(prefix), 6, [0.5, 0.3, 0.2]) == pytest.approx(exact, abs=1e-12)


def test_ratio_interval_brackets_the_ratio_and_narrows_with_repeats(bench):
    """Synthetic records: fixed K=9 costs 100 tokens at MSE 0.01; 'reuse' costs 25 tokens at 0.02 and 75 at 0.005, so
    log-log interpolation reaches 0.01 at 25 x sqrt(3) tokens: a true ratio of 0.433. The bootstrap interval holds
    the point estimate, 32 repeats' interval holds the true ratio and is narrower than 8 repeats'."""
    import random

    rng = random.Random(0)

    def records(n):
        out = []
        for rep in range(n):
            out.append(
                {
                    "family": "fixed",
                    "k": 9,
                    "repeat": rep,
                    "tokens_per_response": 100.0,
                    "value_mse": 0.01 * (1 + 0.1 * rng.gauss(0, 1)),
                }
            )
            for k, (tokens, mse) in {1: (25.0, 0.02), 3: (75.0, 0.005)}.items():
                out.append(
                    {
                        "family": "reuse",
                        "k": k,
                        "repeat": rep,
                        "tokens_per_response": tokens,
                        "value_mse": mse * (1 + 0.1 * rng.gauss(0, 1)),
                    }
                )
        return out  # fmt: skip

    few, many = records(8), records(32)
    options = bench.summarize("t", few)
    ratio = next(o for o in options if o["family"] == "reuse")["tokens_ratio_vs_k9_at_equal_error"]
    lo, hi = bench.ratio_interval(few, "reuse")
    assert lo < ratio < hi and 0.35 < ratio < 0.55
    lo4, hi4 = bench.ratio_interval(many, "reuse")
    assert lo4 < 25 * math.sqrt(3) / 100 < hi4
    assert hi4 - lo4 < 0.8 * (hi - lo)
    assert bench.ratio_interval(records(1), "reuse") is None  # one repeat: no interval


def test_expected_fixed_target_by_hand_and_a_ratio_against_it(bench):
    """Fixed runs at 24 tokens per rollout (K=1: 24, K=4: 96) give K=9 24 x 9 = 216 tokens; mean v (1 - v) = 0.09 and a
    ground-truth variance of 0.001 give an expected K=9 MSE of 0.01 + 0.001. A family at (54 tokens, 0.022) and
    (162, 0.0055) reaches 0.011 halfway in log space: 54 x sqrt(3) tokens, a ratio of 0.433 to 216."""
    fixed = [
        {"family": "fixed", "k": 1, "repeat": r, "tokens_per_response": 24.0, "value_mse": 0.5}
        for r in range(2)
    ] + [
        {"family": "fixed", "k": 4, "repeat": r, "tokens_per_response": 96.0, "value_mse": 0.5}
        for r in range(2)
    ]
    assert bench.expected_fixed_target(fixed, 0.09, 0.001) == pytest.approx((216.0, 0.011))
    reuse = [
        {"family": "reuse", "k": k, "repeat": r, "tokens_per_response": t, "value_mse": m}
        for r in range(3)
        for k, t, m in ((1, 54.0, 0.022), (3, 162.0, 0.0055))
    ]
    options = bench.summarize("t", fixed + reuse, value_variance=0.09, truth_variance=0.001)
    row = next(o for o in options if o["family"] == "reuse")
    assert row["tokens_ratio_vs_expected_k9"] == pytest.approx(54 * math.sqrt(3) / 216)
    # The target is held fixed, so identical repeats give a zero-width interval.
    assert row["tokens_ratio_vs_expected_k9_ci90"] == pytest.approx([54 * math.sqrt(3) / 216] * 2)
    k4 = next(o for o in options if o["family"] == "fixed" and o["k"] == 4)
    assert k4["expected_value_mse"] == pytest.approx(0.09 / 4 + 0.001)
    assert row["tokens_ratio_vs_k9_at_equal_error"] is None  # no simulated K=9 point in these records
    with pytest.raises(ValueError, match="no fixed-K records"):
        bench.expected_fixed_target(reuse, 0.09, 0.0)


def test_expected_fixed_mse_matches_simulated_fixed_runs_on_the_exact_toy(bench, tmp_path):
    """The check the expected target rests on, on the toy (exact values): the simulated fixed-K value MSE over 6
    repeats agrees with mean v (1 - v) / K within 4 standard errors at K = 1 and K = 4."""
    import statistics

    task = bench.toy_task(60, 0)
    for k in (1, 4):
        mses = [bench.run_point(task, "fixed", k, rep)["value_mse"] for rep in range(6)]
        se = statistics.stdev(mses) / math.sqrt(len(mses))
        assert abs(statistics.fmean(mses) - task["value_variance"] / k) < 4 * se + 1e-4
