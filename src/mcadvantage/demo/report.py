"""Demo outputs: the learning-curve plot (matplotlib, Agg backend) and an HTML page that shows sampled
responses with every reasoning step coloured by its Monte Carlo advantage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

# The page renderer lives in the library (mcadvantage.evaluation.report) so users get it for their own runs; re-exported here.
from mcadvantage.evaluation.report import ScoredResponse, advantage_colour, render_responses_html

__all__ = ["ScoredResponse", "advantage_colour", "render_responses_html", "plot_learning_curve"]


def plot_learning_curve(
    path: str | Path,
    *,
    warmup: Sequence[tuple[float, float]],
    arms: Mapping[str, Sequence[tuple[float, float]]],
    noise_problems: int | None = None,
    title: str = "Held-out greedy accuracy",
) -> Path:
    """Write a PNG with two panels sharing the accuracy axis: held-out accuracy against optimizer step
    for the supervised warm-up (left) and for each RL arm (right; ``arms`` maps a label to ``(step,
    accuracy)`` pairs, all from the same starting policy). With ``noise_problems`` (the number of
    problems behind each accuracy), each arm's curve carries a band of one binomial standard error,
    ``sqrt(p (1 - p) / n)``: differences inside the bands are measurement noise. Two panels because the
    warm-up takes many more (cheaper) steps than RL: on one axis the RL curves would be squeezed."""
    import math

    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4), sharey=True, gridspec_kw={"width_ratios": [1, 1]})
    if warmup:
        left.plot(
            [s for s, _ in warmup], [a for _, a in warmup], "o-", color="#2563eb", label="held-out accuracy"
        )
    left.set_title("supervised warm-up")
    left.set_xlabel("warm-up step")
    left.set_ylabel("accuracy")
    colours = ["#d97706", "#16a34a", "#7c3aed", "#db2777", "#0891b2"]
    for i, (label, curve) in enumerate(arms.items()):
        colour = colours[i % len(colours)]
        steps = [s for s, _ in curve]
        accs = [a for _, a in curve]
        right.plot(steps, accs, "o-", color=colour, label=label)
        if noise_problems:
            se = [math.sqrt(max(a * (1 - a), 0.0) / noise_problems) for a in accs]
            right.fill_between(
                steps,
                [a - e for a, e in zip(accs, se, strict=True)],
                [a + e for a, e in zip(accs, se, strict=True)],
                color=colour,
                alpha=0.15,
                label=f"{label} ± 1 binomial SE" if i == 0 else None,
            )
    right.set_title("RL from the same starting policy")
    right.set_xlabel("RL step")
    for ax in (left, right):
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
