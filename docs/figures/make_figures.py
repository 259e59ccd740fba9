"""Generate the documentation figures (plain SVG, no dependencies): ``python docs/figures/make_figures.py``.

``vineppo.svg``: one response cut into three steps; from each state S_0..S_2 the policy samples K=4
continuations ("vines"), whose mean reward is the state's value; each step's advantage is the change
in value it causes. The numbers are an illustration, not a measurement.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# Illustrative rollout rewards from each state (K = 4) and the response's own reward.
ROLLOUTS = [[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
STEPS = ["12-3=9", "9*2=16", "16+5=21  #### 21"]  # the second step is the mistake
FINAL_REWARD = 0.0


def vineppo_svg() -> str:
    width, height = 860, 330
    xs = [70, 300, 530, 760]  # x of states S_0..S_3
    y = 210
    values = [sum(r) / len(r) for r in ROLLOUTS] + [FINAL_REWARD]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="14">',
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="20" y="28" font-size="17" font-weight="bold">VinePPO: values from Monte Carlo rollouts, '
        "advantages per step</text>",
    ]
    # rollouts ("vines") from each non-final state
    for i, rewards in enumerate(ROLLOUTS):
        for k, r in enumerate(rewards):
            ty = 60 + k * 26
            colour = "#16a34a" if r else "#dc2626"
            parts.append(
                f'<path d="M{xs[i]},{y - 14} C{xs[i] + 20},{ty + 40} {xs[i] + 60},{ty} {xs[i] + 110},{ty}" '
                f'fill="none" stroke="#9ca3af" stroke-dasharray="4 3"/>'
            )
            parts.append(f'<text x="{xs[i] + 116}" y="{ty + 5}" fill="{colour}">R={r}</text>')
        parts.append(
            f'<text x="{xs[i] + 150}" y="{60 + 1.5 * 26 + 5}" font-size="13" fill="#374151">'
            f"mean = {values[i]:.2f}</text>"
        )
    # the response: states and steps
    for i in range(4):
        fill = "#1f2937" if i < 3 else "#6b7280"
        parts.append(f'<circle cx="{xs[i]}" cy="{y}" r="14" fill="{fill}"/>')
        parts.append(f'<text x="{xs[i] - 9}" y="{y + 5}" fill="white" font-size="12">S{i}</text>')
        label = f"V={values[i]:.2f}" if i < 3 else f"R={FINAL_REWARD:g}"
        parts.append(f'<text x="{xs[i] - 22}" y="{y + 36}" font-weight="bold">{label}</text>')
    for i, step in enumerate(STEPS):
        adv = values[i + 1] - values[i]
        colour = "#16a34a" if adv > 0 else "#dc2626" if adv < 0 else "#6b7280"
        x0, x1 = xs[i] + 14, xs[i + 1] - 14
        parts.append(f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="{colour}" stroke-width="6"/>')
        parts.append(f'<text x="{(x0 + x1) / 2 - 40}" y="{y - 10}" font-family="monospace">{step}</text>')
        parts.append(
            f'<text x="{(x0 + x1) / 2 - 42}" y="{y + 62}" fill="{colour}" font-weight="bold">'
            f"A{i + 1} = {adv:+.2f}</text>"
        )
    caption = [
        'Prompt: "Start with 12. Subtract 3, then double it, then add 5." (answer 23). The mistake in step 2',
        "drops the value from 0.75 to 0: every token of step i gets A_i = V(S_i) - V(S_(i-1)), the last R - V(S_(n-1)).",
    ]
    for j, line in enumerate(caption):
        parts.append(f'<text x="20" y="{height - 34 + 18 * j}" font-size="13" fill="#374151">{line}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    out = HERE / "vineppo.svg"
    out.write_text(vineppo_svg(), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
