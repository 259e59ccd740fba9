"""What the demo says about equal cost: the measured answer for its starting policy, shipped beside the checkpoint.

One seed of two arms cannot say whether step credit pays at equal cost; the regime study can. Its results for the
plateau checkpoint (the gradient instrument's equal-cost comparison and the 12-seed learning runs, gathered by
``python benchmarks/credit_at_grpo_price.py``, which writes ``equal_cost.json`` into the checkpoint's directory)
are printed at the end of the demo, and plotted as ``gradient_quality.png``: the per-batch gradient's cosine to the
true policy gradient against its cost, GRPO's budgets as a line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["EQUAL_COST_FILE", "equal_cost_lines", "load_equal_cost", "plot_equal_cost"]

#: In a shipped checkpoint's directory: the regime study's equal-cost results for that starting policy.
EQUAL_COST_FILE = "equal_cost.json"


def load_equal_cost(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """The shipped equal-cost results of a checkpoint, or None when it has none."""
    path = Path(checkpoint_dir) / EQUAL_COST_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def equal_cost_lines(summary: dict[str, Any]) -> list[str]:
    """The demo's closing statement: which arm, if any, is ahead of GRPO at equal cost in the learning runs, and
    the per-batch gradient comparison that explains it."""
    lines = []
    learning = summary.get("learning", [])
    ahead = [
        row
        for row in learning
        if (vs := row.get("final_accuracy_vs_grpo_matched")) and vs["ci95"][0] > 0 and vs["p"] < 0.05
    ]
    n = max((len(row["seeds"]) for row in learning), default=0)
    if learning:
        if ahead:
            lines.append(
                "Ahead of GRPO given the same sampled tokens (grpo_matched) in the learning runs: "
                + ", ".join(f"{row['arm']} ({_diff(row['final_accuracy_vs_grpo_matched'])})" for row in ahead)
                + f"; {n} seeds, paired t-test."
            )
        else:
            lines.append(
                f"No arm is ahead of GRPO given the same sampled tokens (grpo_matched) in the learning runs from this "
                f"starting policy ({n} seeds, paired t-test at 5%):"
            )
        for row in learning:
            if row.get("final_accuracy_vs_grpo_matched"):
                lines.append(
                    f"  {row['arm']:<18} final {row['final_accuracy']:.3f}, vs grpo_matched "
                    f"{_diff(row['final_accuracy_vs_grpo_matched'])}, sampled tokens "
                    f"{row.get('sampled_tokens_vs_grpo', float('nan')):.2f}x GRPO's"
                )
    lines.append(
        f"Per batch at equal cost (generated + {summary['cost_ratio']:.2f} x trained tokens), cosine of the batch "
        "gradient to the true one (the gradient instrument, 30 repeats):"
    )
    for row in summary.get("gradient", []):
        grpo = row["grpo_cosine_at_equal_cost_model"]
        lines.append(
            f"  {row['estimator']:<24} {row['gradient_cosine']:.3f} against GRPO at the same cost "
            + (
                "(outside GRPO's measured budgets)"
                if grpo is None
                else f"{grpo:.3f} ({row['gradient_cosine'] - grpo:+.3f})"
            )
        )
    return lines


def _diff(test: dict[str, Any]) -> str:
    return f"{test['mean']:+.3f} [{test['ci95'][0]:+.3f}, {test['ci95'][1]:+.3f}], p = {test['p']:.2f}"


def plot_equal_cost(summary: dict[str, Any], path: str | Path) -> Path:
    """Cosine to the true gradient against the cost model, GRPO's budgets as a line and every other estimator as a
    point with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    grpo = sorted(summary["grpo_budgets"], key=lambda g: g["cost_model"])
    ax.plot(
        [g["cost_model"] for g in grpo],
        [g["cosine"] for g in grpo],
        "o-",
        color="black",
        label="GRPO (4-32 prompts)",
    )
    for i, row in enumerate(summary.get("gradient", [])):
        lo, hi = row["gradient_cosine_ci"]
        ax.errorbar(
            row["cost_model"],
            row["gradient_cosine"],
            yerr=[[row["gradient_cosine"] - lo], [hi - row["gradient_cosine"]]],
            fmt="s",
            color=f"C{i}",
            capsize=3,
            label=row["estimator"],
        )
    ax.set_xscale("log")
    ax.set_xlabel(f"cost per batch: generated + {summary['cost_ratio']:.2f} x trained tokens")
    ax.set_ylabel("cosine to the true policy gradient")
    ax.set_title("Gradient quality per unit of cost (this demo's starting policy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
