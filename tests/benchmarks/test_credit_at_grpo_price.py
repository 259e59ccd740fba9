"""benchmarks/credit_at_grpo_price.py: equal-cost comparisons and paired learning differences from synthetic records."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "credit_at_grpo_price", ROOT / "benchmarks" / "credit_at_grpo_price.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(name, prompts, sampled, trained, cosines):
    return {"estimator": name, "prompts_per_batch": prompts, "sampled_tokens": sampled, "trained_tokens": trained,
            "cosine": sum(cosines) / len(cosines), "cosine_ci": [0.0, 1.0], "repeats": len(cosines),
            "cosines": cosines}  # fmt: skip


def test_gradient_rows_interpolate_grpo_and_pair_with_a_costlier_budget(bench):
    stored = {
        "records": [
            _record("grpo_p4", 4, 100.0, 100.0, [0.5, 0.5, 0.5]),
            _record("grpo_p8", 8, 200.0, 200.0, [0.6, 0.7, 0.8]),
            _record("tree_p8", 8, 150.0, 200.0, [0.7, 0.8, 0.9]),
        ]
    }
    [row] = bench.gradient_rows("t", stored, cost_ratio=1.0)
    assert row["tokens_per_trained_response_vs_grpo"] == 0.75
    # 150 sampled tokens lies halfway in log between 100 and 200 at log2(1.5) = 0.585 of the way.
    assert row["grpo_cosine_at_equal_sampled_tokens"] == pytest.approx(0.5 + math.log2(1.5) * 0.2)
    # Cost model: 150 + 200 = 350 between 200 and 400.
    assert row["grpo_cosine_at_equal_cost_model"] == pytest.approx(0.5 + math.log2(1.75) * 0.2)
    paired = row["paired_vs_costlier_grpo"]
    assert paired["grpo"] == "grpo_p8" and paired["mean_cosine_difference"] == pytest.approx(0.1)
    assert paired["ci95"][0] == pytest.approx(0.1) and paired["ci95"][1] == pytest.approx(0.1)


def test_learning_rows_pair_final_accuracies_by_seed(bench):
    records = []
    for seed, (grpo, matched, tree) in enumerate(
        [(0.90, 0.91, 0.93), (0.88, 0.90, 0.91), (0.92, 0.92, 0.95)]
    ):
        for arm, acc, tokens in (
            ("grpo", grpo, 100.0),
            ("grpo_matched", matched, 250.0),
            ("tree_d12", tree, 80.0),
        ):
            records += [{"arm": arm, "seed": seed, "step": 0, "accuracy": 0.5, "sampled_tokens": 0.0},
                        {"arm": arm, "seed": seed, "step": 40, "accuracy": acc, "sampled_tokens": tokens}]  # fmt: skip
    rows = {r["arm"]: r for r in bench.learning_rows({"records": records})}
    tree = rows["tree_d12"]
    assert tree["final_accuracy"] == pytest.approx(0.93)
    assert tree["final_accuracy_vs_grpo_matched"]["mean"] == pytest.approx((0.02 + 0.01 + 0.03) / 3)
    assert tree["final_accuracy_vs_grpo_matched"]["n"] == 3
    assert tree["sampled_tokens_vs_grpo"] == pytest.approx(0.8)
    assert tree["gradient_row"] == "tree_4x2_d0-12_p4"


def test_detectable_difference_by_hand(bench):
    # 12 pairs, SD 0.02: (t_0.975,11 = 2.201 + t_0.8,11 = 0.876) x 0.02 / sqrt(12) = 0.01777.
    assert bench.detectable_difference(0.02, 12) == pytest.approx(3.077 * 0.02 / math.sqrt(12), abs=2e-4)
    assert math.isnan(bench.detectable_difference(0.02, 1))


def test_holm_over_tasks_corrects_each_arm_and_base_across_tasks(bench):
    def row(arm, **ps):
        return {"arm": arm, **{f"final_accuracy_vs_{base}": {"p": p} for base, p in ps.items()}}

    learning = {
        "demo_plateau": [row("tree_d12", grpo_matched=0.04, grpo=0.5), row("grpo")],
        "slip_plateau": [row("tree_d12", grpo_matched=0.01, grpo=0.2), row("hybrid_b50", grpo_matched=0.03)],
    }
    bench.holm_over_tasks(learning)
    demo_tree, slip_tree = learning["demo_plateau"][0], learning["slip_plateau"][0]
    # Family of two (tree vs grpo_matched on both tasks): 0.01 x 2 = 0.02, then max(0.02, 0.04 x 1) = 0.04.
    assert slip_tree["final_accuracy_vs_grpo_matched"]["p_holm"] == pytest.approx(0.02)
    assert demo_tree["final_accuracy_vs_grpo_matched"]["p_holm"] == pytest.approx(0.04)
    assert demo_tree["final_accuracy_vs_grpo"]["p_holm"] == pytest.approx(0.5)  # 0.2 x 2 = 0.4, then 0.5
    assert slip_tree["final_accuracy_vs_grpo"]["p_holm"] == pytest.approx(0.4)
    # An arm that ran on one task only is a family of one: unchanged.
    hybrid = learning["slip_plateau"][1]["final_accuracy_vs_grpo_matched"]
    assert (hybrid["p_holm"], hybrid["holm_family"]) == (pytest.approx(0.03), 1)


def test_confirmation_rows_decide_by_the_protocols_rule(bench):
    """GRPO at 4 prompts (1,000 tokens, cosines around 0.4) and 8 (2,000 tokens, around 0.6). A contender at 1,414
    tokens (half-way in log tokens: GRPO 0.5 there) with cosines around 0.7 is ahead; one at 0.5 is level; a tree
    cheaper than GRPO's 4 prompts is paired with them repeat by repeat; Holm counts the three."""
    wiggle = [(-1) ** i * 0.05 * (i % 3) for i in range(60)]
    grpo4 = _record("grpo_p4", 4, 1000, 1000, [0.4 + w for w in wiggle])
    grpo8 = _record("grpo_p8", 8, 2000, 2000, [0.6 + w for w in wiggle])
    ahead = _record("hybrid_b0.5_k4_p4", 4, 1000 * math.sqrt(2), 1000, [0.7 + w for w in wiggle[::-1]])
    level = _record("vineppo_k1_reuse_p4", 4, 1000 * math.sqrt(2), 1000, [0.5 + w for w in wiggle[::-1]])
    tree = _record("tree_4x2_d0-12_p4", 4, 900, 1000, [0.45 + w for w in wiggle])  # +0.05 on every repeat
    for r in (grpo4, grpo8, ahead, level, tree):
        r["cost_model"] = r["sampled_tokens"]
    rows = {
        r["estimator"]: r
        for r in bench.confirmation_rows(
            "t", {"records": [grpo4, grpo8, ahead, level, tree]}, ("grpo_p4", "grpo_p8")
        )
    }
    hybrid = rows["hybrid_b0.5_k4_p4"]["vs_grpo_at_equal_sampled_tokens"]
    assert hybrid["mean"] == pytest.approx(0.2) and hybrid["ci95"][0] > 0.1 and hybrid["ahead"]
    assert hybrid["holm_family"] == 3 and hybrid["p_holm"] >= hybrid["p"]
    reuse = rows["vineppo_k1_reuse_p4"]["vs_grpo_at_equal_sampled_tokens"]
    assert reuse["mean"] == pytest.approx(0.0, abs=1e-9) and reuse["p"] > 0.5 and not reuse["ahead"]
    paired = rows["tree_4x2_d0-12_p4"]["vs_grpo_at_equal_sampled_tokens"]
    assert (
        paired["test"] == "paired t vs grpo_p4" and paired["mean"] == pytest.approx(0.05) and paired["ahead"]
    )
    assert (
        rows["tree_4x2_d0-12_p4"]["vs_grpo_at_equal_cost_model"] is None
    )  # below GRPO's budgets: no extrapolation
    assert rows["hybrid_b0.5_k4_p4"]["vs_grpo_at_equal_cost_model"] == pytest.approx(0.2)
