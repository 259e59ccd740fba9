"""Demo outputs: the learning-curve plot (matplotlib, Agg backend) and an HTML page that shows sampled
responses with every reasoning step coloured by its Monte Carlo advantage."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ScoredResponse", "advantage_colour", "render_responses_html", "plot_learning_curve"]


@dataclass
class ScoredResponse:
    """One response split into steps, with ``values = [V(S_0), ..., V(S_{n-1}), R]`` and
    ``advantages = [A_1, ..., A_n]`` (one per step)."""

    prompt: str
    steps: list[str]
    values: list[float]
    advantages: list[float]
    reward: float
    gold: str


def advantage_colour(advantage: float, scale: float = 1.0) -> str:
    """CSS background for an advantage: red for negative, green for positive, white for zero; the
    opacity grows with ``|advantage| / scale`` (capped at 1)."""
    strength = min(1.0, abs(advantage) / scale) if scale > 0 else 0.0
    alpha = round(0.1 + 0.75 * strength, 3) if advantage != 0 else 0.0
    rgb = "220, 38, 38" if advantage < 0 else "22, 163, 74"
    return f"rgba({rgb}, {alpha})"


def render_responses_html(
    responses: Sequence[ScoredResponse], *, title: str, summary: dict[str, str] | None = None
) -> str:
    """A self-contained HTML page: per response, the prompt, then each step as a ``<span
    class="step">`` coloured by its advantage, with a tooltip giving ``V`` before and after the
    step and the advantage ``A = V(after) - V(before)``."""
    rows = []
    for i, r in enumerate(responses):
        spans = []
        for j, (step, adv) in enumerate(zip(r.steps, r.advantages, strict=True)):
            tip = f"step {j + 1}: V(before)={r.values[j]:.2f}, V(after)={r.values[j + 1]:.2f}, A={adv:+.2f}"
            spans.append(
                f'<span class="step" style="background:{advantage_colour(adv)}" title="{html.escape(tip)}"'
                f' data-advantage="{adv:.4f}" data-value-before="{r.values[j]:.4f}">{html.escape(step)}</span>'
            )
        verdict = "correct" if r.reward > 0.5 else "wrong"
        rows.append(
            f'<div class="response {verdict}"><div class="meta">#{i + 1} &middot; gold {html.escape(r.gold)}'
            f" &middot; reward {r.reward:g} &middot; V(prompt)={r.values[0]:.2f}</div>"
            f'<pre class="prompt">{html.escape(r.prompt)}</pre><pre class="completion">{"".join(spans)}</pre></div>'
        )
    info = ""
    if summary:
        items = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in summary.items())
        info = f"<ul>{items}</ul>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 900px; margin: 2em auto; color: #222; }}
pre {{ margin: 0.2em 0; font-size: 15px; white-space: pre-wrap; }}
.prompt {{ color: #555; }}
.step {{ border-radius: 3px; padding: 1px 0; }}
.response {{ border-left: 4px solid #ccc; padding: 0.4em 0.8em; margin: 0.8em 0; }}
.response.correct {{ border-color: #16a34a; }}
.response.wrong {{ border-color: #dc2626; }}
.meta {{ font-size: 12px; color: #666; }}
.legend span {{ padding: 2px 6px; margin-right: 6px; border-radius: 3px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
{info}
<p class="legend">Each reasoning step is coloured by its Monte Carlo advantage
A = V(after the step) - V(before the step), where V is the mean reward of K continuations sampled by the
policy from that point: <span style="background:{advantage_colour(-1)}">negative</span>
<span style="background:{advantage_colour(1)}">positive</span>. Hover a step for its values.</p>
{"".join(rows)}
</body></html>
"""


def plot_learning_curve(
    path: str | Path,
    *,
    warmup: Sequence[tuple[float, float]],
    rl: Sequence[tuple[float, float]],
    rl_reward: Sequence[tuple[float, float]] = (),
    title: str = "Held-out greedy accuracy",
) -> Path:
    """Write a PNG: held-out accuracy against training step for the supervised warm-up and for
    VinePPO (``(step, accuracy)`` pairs; the RL steps are drawn after the warm-up's last step),
    plus the training reward per RL step when given."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    offset = warmup[-1][0] if warmup else 0.0
    fig, ax = plt.subplots(figsize=(7, 4))
    if warmup:
        ax.plot(
            [s for s, _ in warmup], [a for _, a in warmup], "o-", color="#2563eb", label="supervised warm-up"
        )
    if rl:
        ax.plot([offset + s for s, _ in rl], [a for _, a in rl], "o-", color="#16a34a", label="VinePPO")
    if rl_reward:
        ax.plot(
            [offset + s for s, _ in rl_reward],
            [r for _, r in rl_reward],
            "-",
            color="#16a34a",
            alpha=0.35,
            label="VinePPO training reward",
        )
    if warmup:
        ax.axvline(offset, color="#999", linestyle=":", linewidth=1)
    ax.set_xlabel("optimizer step (warm-up, then VinePPO)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
