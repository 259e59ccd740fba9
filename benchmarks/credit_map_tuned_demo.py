"""The offline demo's credit-map mode: what survives tuning, retrained beside the best tuned GRPO.

    bash scripts/demo.sh --where_credit_pays           # from a clone (sets up .venv first); about a minute
    python benchmarks/credit_map_tuned_demo.py         # the same, in an existing environment

The tuned map (``docs/where-credit-pays.md``, issue 51) gives every arm the same tuning grid on held-out seeds and
tests it against the best tuned GRPO at 1/4, 1/2 and 1x of the budget. This script reads the committed
``benchmarks/results/credit_map_tuned.json``, takes the (setting, budget) where the oracle's tuned gain over the best
tuned GRPO is largest (among the families every arm finished; a partial map is said so), and retrains there, each at
its tuned learning rate and batch, with the study's evaluation seeds:

- the best tuned GRPO (the comparison),
- the oracle (exact turn advantages at no sampling cost: what per-turn credit could give),
- the practical arms that need no extra samples and could stand in for a language model's credit: anchor-state
  credit keyed by the observation history (both variants), the history-feature critic, and the practical arm with
  the largest tuned gain there.

Then it prints the language-model study's answer from its committed summary (``benchmarks/lm_agent_map.py``; not
retrained: one of its runs takes minutes). It prints each arm's exact success at the budget, its paired difference from the best tuned GRPO with a 95% interval,
its collapses, and how many runs agree with the committed records within :data:`TOLERANCE` (exact success, absolute).
Nothing is written to the study's records; the demo's own results go to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import credit_map_tuned as cmt  # noqa: E402  (beside this file)

from mcadvantage.evaluation.stats import paired_t_test  # noqa: E402

#: Re-runs agree with the committed records when their exact success differs by at most this (absolute): the same
#: code on another CPU or library build may round differently, and a run's later updates amplify rounding.
TOLERANCE = 1e-6
#: Practical arms the demo always shows (no extra samples; keyed or fed by what a language model sees).
SHOWN = ("anchor_norm_history", "anchor_pool_history", "critic_history")


def pick_family(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The (setting, budget) with the oracle's largest tuned gain over the best tuned GRPO: among tested families
    first; with none tested, among those whose GRPO and oracle records are complete (then ``tested`` is False)."""
    best = None
    for tested_only in (True, False):
        for setting in summary["settings"]:
            for f in summary["budget_fractions"]:
                if tested_only and not setting["tested"].get(f"{f:g}"):
                    continue
                group = [
                    r
                    for r in summary["records"]
                    if r["setting"] == setting["name"] and r["budget_fraction"] == f
                ]
                oracle = next((r for r in group if r["arm"] == "oracle"), None)
                v = (oracle or {}).get("vs_best_grpo")
                if v and (best is None or v["mean"] > best["gain"]):
                    best = {"setting": setting, "fraction": f, "gain": v["mean"], "group": group,
                            "tested": tested_only}  # fmt: skip
        if best is not None:
            return best
    return None


def demo_arms(group: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """GRPO, the oracle, :data:`SHOWN`, and the practical arm with the largest gain, each with its tuned point."""
    by_arm = {r["arm"]: r for r in group if r["chosen"] is not None and r["status"] == "complete"}
    practical = [r for a, r in by_arm.items() if a not in ("grpo", "oracle") and r.get("vs_best_grpo")]
    top = max(practical, key=lambda r: r["vs_best_grpo"]["mean"], default=None)
    names = ["grpo", "oracle", *SHOWN, *([top["arm"]] if top else [])]
    return [by_arm[a] for a in dict.fromkeys(names) if a in by_arm]


def retrain(setting: dict[str, Any], fraction: float, record: dict[str, Any], seeds: Sequence[int], bar: Any):
    """The arm at its tuned point on ``seeds``, at the budget fraction (a run stopped at that budget is the same
    run's prefix); per seed the exact success and whether it agrees with the committed record."""
    cell = {**setting, "budget_episodes": round(setting["budget_episodes"] * fraction)}
    committed = dict(zip(record["seeds"], record["success"], strict=True))
    out = []
    for seed in seeds:
        rec = cmt.train(cell, record["arm"], record["chosen"]["lr"], record["chosen"]["prompts"], seed)
        success = rec["budgets"]["1"]["success"]
        out.append({"seed": seed, "success": success, "start": rec["start"],
                    "agrees": seed in committed and abs(success - committed[seed]) <= TOLERANCE})  # fmt: skip
        bar.update(1)
    return out


def report_lines(family: dict[str, Any], results: dict[str, list[dict[str, Any]]], chosen: dict) -> list[str]:
    label = cmt._label(family["setting"])
    lines = [
        f"Where the oracle's tuned gain is largest: {label}, budget {family['fraction']:g}x "
        f"(committed gain {family['gain']:+.3f}{'' if family['tested'] else '; PARTIAL map: not every arm finished'}).",
        "",
        f"{'arm':<22} {'lr x batch':<12} {'success':>8}  {'minus tuned GRPO [95% CI]':<28} {'collapsed':>9}  committed",
    ]
    base = [r["success"] for r in results["grpo"]]
    for arm, runs in results.items():
        success = [r["success"] for r in runs]
        gap = "(the comparison)"
        if arm != "grpo":
            t = paired_t_test([a - b for a, b in zip(success, base, strict=True)])
            gap = f"{t['mean']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}]"
        c = chosen[arm]
        collapsed = sum(r["success"] < r["start"] - 1e-9 for r in runs)
        agree = sum(r["agrees"] for r in runs)
        point = f"{c['lr']:g} x {c['prompts']}x{c['group']}"
        lines.append(f"{arm:<22} {point:<12} {statistics.fmean(success):>8.3f}  "
                     f"{gap:<28} {collapsed:>5}/{len(runs):<3}  {agree}/{len(runs)} agree")  # fmt: skip
    lines.append("See docs/where-credit-pays.md for every setting, budget and arm.")
    return lines


def lm_lines(path: Path | None = None) -> list[str]:
    """The language-model study's answer (``benchmarks/lm_agent_map.py``), read from its committed summary, not
    retrained (one of its runs takes minutes): the page's "does the toy's answer carry over?" bullets."""
    import lm_agent_map as lm  # noqa: PLC0415  (beside this file)

    path = path or lm.SUMMARY
    if not path.exists():
        return []
    return [
        f"On a language model through VinePPOTrainer (from the committed records {path.name}, not retrained):",
        *lm.carry_lines(json.loads(path.read_text())),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, default=12, help="evaluation seeds 0..N-1 per arm (the study: 24)"
    )
    parser.add_argument("--summary", type=Path, default=cmt.SUMMARY, help="the tuned map's committed summary")
    parser.add_argument("--output", type=Path, default=Path("demo_output") / "where_credit_pays.json")
    args = parser.parse_args(argv)
    if not 2 <= args.seeds <= len(cmt.EVAL_SEEDS):
        parser.error(f"--seeds {args.seeds}: use 2 to {len(cmt.EVAL_SEEDS)} (a paired interval needs 2)")
    summary = json.loads(args.summary.read_text())
    family = pick_family(summary)
    if family is None:
        print("The tuned map has no family with GRPO and the oracle complete yet: nothing to show.")
        return 0
    arms = demo_arms(family["group"])
    seeds = list(cmt.EVAL_SEEDS[: args.seeds])
    from tqdm.auto import tqdm

    with tqdm(total=len(arms) * len(seeds), desc="training", unit="run") as bar:
        results = {r["arm"]: retrain(family["setting"], family["fraction"], r, seeds, bar) for r in arms}
    lines = report_lines(family, results, {r["arm"]: r["chosen"] for r in arms})
    print("\n".join(lines + ["", *lm_lines()]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    out = {"setting": family["setting"]["name"], "budget_fraction": family["fraction"], "seeds": seeds,
           "tested": family["tested"], "results": results}  # fmt: skip
    args.output.write_text(json.dumps(out, indent=1))
    print(f"Wrote {args.output}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
