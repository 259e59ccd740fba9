"""The offline demo's crossover mode: train GRPO and the credit arm that wins on the map, side by side, and print both.

    bash scripts/demo.sh --where_credit_pays_untuned  # from a clone (sets up .venv first); about 2 minutes on 2 cores
    python benchmarks/where_credit_pays_demo.py       # the same, in an existing environment

The map of ``docs/where-credit-pays.md`` (issue 41) tests every credit arm against the best GRPO arm of each cell at
equal sampled tokens. A *crossover* is a credit arm that loses to GRPO at one end of the horizon range and pays at
the other (Holm, 12 paired seeds, both ends confirmed). This script finds it in the committed
``benchmarks/results/horizon_sweep.json`` by that rule (not by eye), retrains at both horizons, with the same seeds
and code as the study:

- the cell's best GRPO arm (the protocol's comparison),
- the winning credit arm,
- the oracle (exact turn advantages at no sampling cost: what per-turn credit could give),
- ``grpo_tree_tokens``, GRPO with smaller batches (more Adam steps at equal tokens; the study's batch-size check),

and prints each arm's exact success at the budget and its paired difference from the best GRPO arm with a 95%
interval. Every run is deterministic given its seed, so the demo also says how many runs equal the committed record
within tolerance (``benchmarks/_records.py``: exact counts, float64 results within relative 1e-9, since another CPU
moves them in the last bits) and the largest difference; a run outside tolerance is printed with both environments,
the record's and this machine's. Nothing is written to the study's records; the demo's own results go to ``--output``.
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
if (
    str(ROOT) not in sys.path
):  # `python benchmarks/where_credit_pays_demo.py` has only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import horizon_sweep  # noqa: E402  (beside this file)
from _machine import machine_info  # noqa: E402  (beside this file)
from _records import EXACT_TOY_RUN, Comparison  # noqa: E402  (beside this file)

from mcadvantage.evaluation.stats import paired_t_test  # noqa: E402

#: What the demo trains beside the best GRPO arm and the credit arm (see the module docstring).
REFERENCE_ARMS = ("oracle", "grpo_tree_tokens")


def records_by_key(summary: dict[str, Any]) -> dict[tuple[str, str, int, float, str], dict[str, Any]]:
    """The summary's per-arm records keyed by (parameterization, structure, horizon, start rate, arm)."""
    return {
        (r["parameterization"], r["structure"], r["horizon"], r["start_rate"], r["arm"]): r
        for r in summary["records"]
    }


def find_crossover(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The map's crossover: a practical credit arm whose verdict against the best GRPO arm is "loses" at one end of
    the horizon range and "pays" at the other, in the same (parameterization, structure, start rate). With several,
    the one with the largest paying gap. None when the map has none."""
    rows = records_by_key(summary)
    horizons = sorted({r["horizon"] for r in summary["records"]})
    lo, hi = horizons[0], horizons[-1]
    found = []
    for param, structure, horizon, rate, arm in rows:
        if (
            horizon != lo
            or arm not in horizon_sweep.PRACTICAL
            or (param, structure, hi, rate, arm) not in rows
        ):
            continue
        ends = {h: rows[(param, structure, h, rate, arm)]["vs_best_grpo"] or {} for h in (lo, hi)}
        verdicts = {h: v.get("verdict") for h, v in ends.items()}
        if sorted(verdicts.values(), key=str) != ["loses", "pays"]:
            continue
        pays_at = lo if verdicts[lo] == "pays" else hi
        found.append(
            {
                "parameterization": param,
                "structure": structure,
                "start_rate": rate,
                "arm": arm,
                "pays_at": pays_at,
                "loses_at": hi if pays_at == lo else lo,
                "gap_where_it_pays": ends[pays_at]["mean"],
            }
        )
    return max(found, key=lambda c: c["gap_where_it_pays"]) if found else None


def best_grpo_arm(summary: dict[str, Any], cell: horizon_sweep.Cell) -> str:
    """The protocol's best GRPO arm of ``cell``, as the committed summary chose it."""
    for c in summary["cells"]:
        if (c["parameterization"], c["structure"], c["horizon"], c["start_rate"]) == cell:
            return c["best_grpo"]
    raise KeyError(
        f"cell {cell} is not in the summary; run `python benchmarks/horizon_sweep.py report` first"
    )


def run_cell(
    cell: horizon_sweep.Cell, arms: Sequence[str], seeds: Sequence[int], budget: int, progress: Any = None
) -> dict[str, Any]:
    """Train every arm of ``arms`` (the first is the comparison) on ``cell`` for every seed; per arm: its success per
    seed, mean, sampled tokens and steps, the paired difference from the first arm, and how its runs compare with the
    committed records (``committed``: :meth:`_records.Comparison.as_dict`, found / within tolerance / largest
    difference / the runs outside)."""
    from dataclasses import asdict

    from testbed.agent_credit import train_arm

    param, structure, horizon, rate = cell
    out: dict[str, Any] = {"cell": list(cell), "arms": {}}
    for arm in arms:
        runs, committed = [], Comparison()
        for seed in seeds:
            run = train_arm(
                structure, horizon, rate, arm, seed, budget_episodes=budget, parameterization=param
            )
            runs.append(run)
            record = horizon_sweep.recorded(horizon_sweep.RUNS, cell, arm, seed, budget)
            committed.add(f"{arm} seed {seed} on {cell}", asdict(run), record, EXACT_TOY_RUN)
            if progress is not None:
                progress.update(1)
        out["arms"][arm] = {
            "success": [r.success_at_budget for r in runs],
            "mean_success": statistics.fmean(r.success_at_budget for r in runs),
            "sampled_tokens": statistics.fmean(r.sampled_tokens for r in runs),
            "steps": statistics.fmean(r.steps for r in runs),
            "committed": committed.as_dict(),
            "committed_summary": committed.summary(),
        }
        if not committed.ok:
            out.setdefault("outside_tolerance", []).append(committed.explain())
    base = out["arms"][arms[0]]["success"]
    for arm in arms[1:]:
        diffs = [a - b for a, b in zip(out["arms"][arm]["success"], base, strict=True)]
        out["arms"][arm]["vs_first"] = paired_t_test(diffs) if len(diffs) >= 2 else None
    return out


def _fmt_gap(test: dict[str, Any] | None) -> str:
    if not test:
        return "-"
    lo, hi = test["ci95"]
    return f"{test['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def report_lines(crossover: dict[str, Any], results: Sequence[dict[str, Any]], credit_arm: str) -> list[str]:
    """The table the demo prints: per horizon and arm, mean success, the gap to the best GRPO arm, tokens, steps."""
    c = crossover
    lines = [
        f"Crossover on the map: {credit_arm} on {c['parameterization']}/{c['structure']}, start success "
        f"{c['start_rate']:g}: loses to GRPO at H = {c['loses_at']}, pays at H = {c['pays_at']} "
        "(equal sampled tokens).",
        "",
        f"{'H':>3}  {'arm':<18} {'success':>8}  {'minus best GRPO [95% CI]':<28} {'tokens':>8} {'steps':>6}  committed",
    ]
    for res in results:
        horizon = res["cell"][2]
        for i, (arm, a) in enumerate(res["arms"].items()):
            gap = "(the comparison)" if i == 0 else _fmt_gap(a.get("vs_first"))
            same = a["committed_summary"]
            lines.append(
                f"{horizon:>3}  {arm:<18} {a['mean_success']:>8.3f}  {gap:<28} {a['sampled_tokens']:>8.0f} "
                f"{a['steps']:>6.1f}  {same}"
            )
        lines.append("")
        lines.extend(res.get("outside_tolerance", []))
    pays = next(r for r in results if r["cell"][2] == c["pays_at"])["arms"]
    small = pays.get("grpo_tree_tokens", {}).get("success")
    if small:
        diffs = [a - b for a, b in zip(pays[credit_arm]["success"], small, strict=True)]
        lines.append(
            f"At H = {c['pays_at']}, {credit_arm} minus grpo_tree_tokens (GRPO with smaller batches, more steps at equal "
            f"tokens): {_fmt_gap(paired_t_test(diffs))}. See docs/where-credit-pays.md for every cell."
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, default=12, help="seeds 0..N-1 per arm (the study's confirmed cells: 12)"
    )
    parser.add_argument(
        "--summary", type=Path, default=horizon_sweep.SUMMARY, help="the map's committed summary"
    )
    parser.add_argument("--output", type=Path, default=Path("demo_output") / "where_credit_pays.json")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error(f"--seeds {args.seeds}: a paired interval needs at least 2 seeds; use --seeds 2 or more")
    summary = json.loads(args.summary.read_text())
    budget = summary["budget_episode_equivalents"]
    crossover = find_crossover(summary)
    if crossover is None:
        print(
            "No crossover on the map: no credit arm loses at one end of the horizon range and pays at the other."
        )
        return 0
    credit_arm = crossover["arm"]
    cells = [
        (crossover["parameterization"], crossover["structure"], h, crossover["start_rate"])
        for h in sorted((crossover["loses_at"], crossover["pays_at"]))
    ]
    plans = [(cell, [best_grpo_arm(summary, cell), credit_arm, *REFERENCE_ARMS]) for cell in cells]
    seeds = list(range(args.seeds))
    from tqdm.auto import tqdm

    with tqdm(total=sum(len(arms) for _, arms in plans) * len(seeds), desc="training", unit="run") as bar:
        results = [run_cell(cell, arms, seeds, budget, bar) for cell, arms in plans]
    lines = report_lines(crossover, results, credit_arm)
    print("\n".join(lines))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {"crossover": crossover, "seeds": seeds, "results": results, "environment": machine_info()},
            indent=1,
        )
    )
    print(f"Wrote {args.output}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
