"""An HTML page of sampled responses with every reasoning step coloured by its advantage: red for a negative
advantage, green for a positive one, with the values before and after the step in a tooltip.

Used by the demo (responses before and after each arm), by :mod:`mcadvantage.evaluation.diagnostics` (ground-truth
advantages) and by your own runs: build :class:`ScoredResponse` objects from any estimate (e.g.
``MCValueEstimator.estimate`` values and step advantages) and call :func:`render_responses_html`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ScoredResponse", "advantage_colour", "render_responses_html", "replace_between_markers"]


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


def _render_response(index: int, r: ScoredResponse) -> str:
    if not len(r.values) == len(r.steps) + 1 == len(r.advantages) + 1:
        raise ValueError(
            f"ScoredResponse #{index}: {len(r.steps)} steps need {len(r.steps) + 1} values and {len(r.steps)} "
            f"advantages, got {len(r.values)} values and {len(r.advantages)} advantages."
        )
    spans = []
    for j, (step, adv) in enumerate(zip(r.steps, r.advantages, strict=True)):
        tip = f"step {j + 1}: V(before)={r.values[j]:.2f}, V(after)={r.values[j + 1]:.2f}, A={adv:+.2f}"
        spans.append(
            f'<span class="step" style="background:{advantage_colour(adv)}" title="{html.escape(tip)}"'
            f' data-advantage="{adv:.4f}" data-value-before="{r.values[j]:.4f}">{html.escape(step)}</span>'
        )
    verdict = "correct" if r.reward > 0.5 else "wrong"
    return (
        f'<div class="response {verdict}"><div class="meta">#{index} &middot; gold {html.escape(r.gold)}'
        f" &middot; reward {r.reward:g} &middot; V(prompt)={r.values[0]:.2f}</div>"
        f'<pre class="prompt">{html.escape(r.prompt)}</pre><pre class="completion">{"".join(spans)}</pre></div>'
    )


def render_responses_html(
    responses: Sequence[ScoredResponse] | Mapping[str, Sequence[ScoredResponse]],
    *,
    title: str,
    summary: Mapping[str, str] | None = None,
) -> str:
    """A self-contained HTML page: per response, the prompt, then each step as a ``<span
    class="step">`` coloured by its advantage (:func:`advantage_colour`), with a tooltip giving ``V``
    before and after the step and the advantage ``A = V(after) - V(before)``.

    ``responses`` is one list, or a mapping from section heading to list (e.g. before and after
    training). ``summary`` items are listed under the title. Every text is HTML-escaped.
    """
    sections = responses.items() if isinstance(responses, Mapping) else [("", responses)]
    body = []
    for heading, items in sections:
        if heading:
            body.append(f"<h2>{html.escape(heading)}</h2>")
        body.extend(_render_response(i + 1, r) for i, r in enumerate(items))
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
A = V(after the step) - V(before the step), where V is the mean reward of continuations sampled by the
policy from that point (after the last step, V is the response's own reward):
<span style="background:{advantage_colour(-1)}">negative</span>
<span style="background:{advantage_colour(1)}">positive</span>. Hover a step for its values. The left border
is green for a correct final answer, red for a wrong one.</p>
{"".join(body)}
</body></html>
"""


def replace_between_markers(doc: str | Path, name: str, markdown: str) -> bool:
    """Replace the text between ``<!-- {name} results: start -->`` and ``<!-- {name} results: end -->`` in the
    Markdown file ``doc`` with ``markdown`` (how the benchmarks write their results into the docs). Returns False,
    leaving the file alone, when it lacks either marker."""
    path = Path(doc)
    start, end = f"<!-- {name} results: start -->", f"<!-- {name} results: end -->"
    text = path.read_text(encoding="utf-8")
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{markdown}\n{end}{tail}", encoding="utf-8")
    return True
