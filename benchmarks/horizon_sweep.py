"""Where does turn credit pay? The map over horizon, structure and starting success rate on the agent credit toy, at
equal sampled tokens (issue 41; protocol: docs/where-credit-pays-protocol.md).

    python benchmarks/horizon_sweep.py run --stage scout      # seeds 0-2, every cell and arm (resumable)
    python benchmarks/horizon_sweep.py run --stage confirm    # seeds 3-11 where the protocol's rule says
    python benchmarks/horizon_sweep.py report                 # JSON, page and figure from the records
    python benchmarks/horizon_gradient.py                     # the gradient instrument at H = 2 and 16 (its records)

Each run trains one arm of :mod:`testbed.agent_credit` on one cell (parameterization, structure, horizon, start rate)
with one seed and writes one record, ``benchmarks/results/horizon_sweep_runs/<param>/<structure>_H<H>_r<rate>/
<arm>_seed<seed>.json``; a record that exists with the same settings is not run again, so an interrupted sweep
resumes where it stopped. ``report`` reads only the records: ``benchmarks/results/horizon_sweep.json`` (one record
per parameterization x structure x horizon x rate x arm), ``docs/where-credit-pays.md`` and its figure
``docs/figures/where_credit_pays.png``. The gradient instrument's records (:mod:`horizon_gradient`, under
``benchmarks/results/horizon_sweep_gradient/``) become the JSON's ``gradient`` key and a section of the page.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/horizon_sweep.py` has only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:  # the gradient stage's module lives beside this file
    sys.path.insert(0, str(ROOT / "benchmarks"))

import horizon_gradient  # noqa: E402  (beside this file)
from _machine import machine_info  # noqa: E402  (beside this file)
from _runs import append_run, load_runs, read_run  # noqa: E402  (beside this file)

from mcadvantage.evaluation.stats import holm_adjust, paired_t_test  # noqa: E402
from testbed.agent_credit import ARMS, GRPO_ARMS, PARAMETERIZATIONS, batch_tokens  # noqa: E402

RUNS = ROOT / "benchmarks" / "results" / "horizon_sweep_runs"
SUMMARY = ROOT / "benchmarks" / "results" / "horizon_sweep.json"
PAGE = ROOT / "docs" / "where-credit-pays.md"
FIGURE = ROOT / "docs" / "figures" / "where_credit_pays.png"
GRADIENT_RUNS = horizon_gradient.GRADIENT_RUNS

#: The protocol's grid and settings (docs/where-credit-pays-protocol.md).
STRUCTURES = ("delayed", "recovery")
HORIZONS = (2, 4, 8, 16)
RATES = (0.15, 0.5)
BUDGET_EPISODES = 240
SCOUT_SEEDS = (0, 1, 2)
CONFIRM_SEEDS = tuple(range(12))
CONFIRM_MIN = 12  # seeds a cell needs to be tested (Holm) rather than drawn as a scout
ALPHA = 0.05
#: Exploratory arms (protocol amendment): reported, never a "best GRPO" candidate nor in the Holm family.
EXPLORATORY = ("grpo_tree_tokens",)
#: Arms compared with ``grpo_tree_tokens`` beside the decision (the batch-size check of the amendment).
SMALL_BATCH_CHECK = ("grpo", "oracle", "critic_l1", "critic_l095", "tree")
PRACTICAL = tuple(a for a in ARMS if a not in GRPO_ARMS and a != "oracle" and a not in EXPLORATORY)

Cell = tuple[str, str, int, float]  # parameterization, structure, horizon, start rate


def record_key(cell: Cell, arm: str, seed: int) -> str:
    """The name of (cell, arm, seed)'s record in the run directory's archive (``benchmarks/_runs.py``)."""
    return f"{horizon_gradient.cell_name(cell)}/{arm}_seed{seed}.json"


def run_settings(cell: Cell, arm: str, seed: int, budget: int) -> dict[str, Any]:
    param, structure, horizon, rate = cell
    return {
        "parameterization": param,
        "structure": structure,
        "horizon": horizon,
        "start_rate": rate,
        "arm": arm,
        "seed": seed,
        "budget_episodes": budget,
    }


def recorded(root: Path, cell: Cell, arm: str, seed: int, budget: int) -> dict[str, Any] | None:
    """The record of (cell, arm, seed) made with these settings, or None (none, or other settings)."""
    record = read_run(root, record_key(cell, arm, seed), None)
    if not isinstance(record, dict) or record.get("settings") != run_settings(cell, arm, seed, budget):
        return None  # none, or a foreign one: the runner runs again and replaces it
    return record


def run_one(root: Path, cell: Cell, arm: str, seed: int, budget: int) -> bool:
    """Train one (cell, arm, seed) unless its record exists with these settings; True when it ran."""
    from testbed.agent_credit import train_arm

    if recorded(root, cell, arm, seed, budget) is not None:
        return False
    settings = run_settings(cell, arm, seed, budget)
    param, structure, horizon, rate = cell
    start = time.perf_counter()
    result = train_arm(structure, horizon, rate, arm, seed, budget_episodes=budget, parameterization=param)
    record = {
        "settings": settings,
        "seconds": round(time.perf_counter() - start, 3),
        **asdict(result),
        "environment": machine_info(),
    }
    append_run(root, record_key(cell, arm, seed), record)
    return True


def _why_no_longer_horizon(budget: int, horizon: int) -> str:
    total = budget * horizon
    return (
        f"- **Why the map stops at H = {horizon // 2}**: at H = {horizon} one batch of `vineppo` K = 1 (with or "
        f"without free samples) costs {batch_tokens('vineppo_k1', horizon):,} sampled tokens and one of "
        f"`grpo_prompts` {batch_tokens('grpo_prompts', horizon):,}, both over the run's budget of "
        f"{budget} x {horizon} = {total:,}: neither arm could make a single update. A larger budget at H = {horizon} "
        "only would break the map's one budget rule, so H = 32 (the issue's \"if affordable\") was not run."
    )


def all_cells(
    params: Iterable[str] = PARAMETERIZATIONS,
    structures: Iterable[str] = STRUCTURES,
    horizons: Iterable[int] = HORIZONS,
    rates: Iterable[float] = RATES,
) -> list[Cell]:
    return [(p, s, h, r) for p in params for s in structures for h in horizons for r in rates]


# ---------------------------------------------------------------------------------------------------------------
# Reading records
# ---------------------------------------------------------------------------------------------------------------


def load_records(
    root: Path, budget: int = BUDGET_EPISODES
) -> dict[Cell, dict[str, dict[int, dict[str, Any]]]]:
    """``cell -> arm -> seed -> record``, for the records made with ``budget``."""
    out: dict[Cell, dict[str, dict[int, dict[str, Any]]]] = {}
    for record in load_runs(root, "*/*/*_seed*.json").values():
        s = record["settings"]
        if s["budget_episodes"] != budget:
            continue
        cell = (s["parameterization"], s["structure"], int(s["horizon"]), float(s["start_rate"]))
        out.setdefault(cell, {}).setdefault(s["arm"], {})[int(s["seed"])] = record
    return out


def _mean(xs: Sequence[float]) -> float:
    finite = [x for x in xs if isinstance(x, int | float) and math.isfinite(x)]
    return statistics.fmean(finite) if finite else math.nan


def target_of(start: float) -> float:
    """Half the way from the start to 1 (the protocol's target)."""
    return start + 0.5 * (1.0 - start)


def tokens_to_target(record: dict[str, Any]) -> float:
    """Sampled tokens at which exact success first reaches the target; inf when it does not within the budget."""
    goal = target_of(record["start_success"])
    for tokens, success in record["curve"]:
        if success >= goal:
            return float(tokens)
    return math.inf


def best_grpo(arms: dict[str, dict[int, dict[str, Any]]]) -> str | None:
    """The GRPO arm with the highest mean success over its seeds (ties: the first of GRPO_ARMS)."""
    present = [a for a in GRPO_ARMS if arms.get(a)]
    if not present:
        return None
    return max(
        present,
        key=lambda a: (_mean([r["success_at_budget"] for r in arms[a].values()]), -GRPO_ARMS.index(a)),
    )


def confirm_cells(records: dict[Cell, dict[str, dict[int, dict[str, Any]]]]) -> list[Cell]:
    """The protocol's confirm rule: every cell at the smallest and largest horizon, and each interior cell where the
    scout's gap (best practical credit arm minus best GRPO arm, means over seeds 0-2) changes sign against an
    adjacent horizon."""
    horizons = sorted({c[2] for c in records})
    if not horizons:
        return []
    chosen = {c for c in records if c[2] in (horizons[0], horizons[-1])}
    lines: dict[tuple[str, str, float], dict[int, float]] = {}
    for cell, arms in records.items():
        base = best_grpo({a: {s: r for s, r in v.items() if s in SCOUT_SEEDS} for a, v in arms.items()})
        if base is None:
            continue
        base_mean = _mean([arms[base][s]["success_at_budget"] for s in SCOUT_SEEDS if s in arms[base]])
        credit = [
            _mean([arms[a][s]["success_at_budget"] for s in SCOUT_SEEDS if s in arms[a]])
            for a in PRACTICAL
            if arms.get(a)
        ]
        if credit:
            lines.setdefault((cell[0], cell[1], cell[3]), {})[cell[2]] = max(credit) - base_mean
    for (param, structure, rate), gaps in lines.items():
        hs = sorted(gaps)
        for lo, hi in zip(hs, hs[1:], strict=False):
            if (gaps[lo] > 0) != (gaps[hi] > 0):
                for h in (lo, hi):
                    if h not in (horizons[0], horizons[-1]):
                        chosen.add((param, structure, h, rate))
    return sorted(chosen)


# ---------------------------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------------------------


def _r(x: float, digits: int = 4) -> float | None:
    return round(x, digits) if isinstance(x, int | float) and math.isfinite(x) else None


def _seed_count(arms: dict[str, dict[int, dict[str, Any]]]) -> int:
    """Seeds every protocol arm of a cell has (exploratory arms do not decide a cell's stage)."""
    return min((len(v) for a, v in arms.items() if a not in EXPLORATORY), default=0)


def _paired(arms: dict[str, dict[int, dict[str, Any]]], arm: str, against: str) -> dict[str, Any] | None:
    """Paired t-test of ``arm`` minus ``against`` over their common seeds (None with fewer than 2)."""
    a, b = arms.get(arm, {}), arms.get(against, {})
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    test = paired_t_test([a[s]["success_at_budget"] - b[s]["success_at_budget"] for s in seeds])
    return {"n": test["n"], "mean": _r(test["mean"]), "ci95": [_r(test["ci95"][0]), _r(test["ci95"][1])],
            "p": _r(test["p"], 6)}  # fmt: skip


def summarize(
    records: dict[Cell, dict[str, dict[int, dict[str, Any]]]],
    budget: int = BUDGET_EPISODES,
    gradient_records: Sequence[dict[str, Any]] = (),
) -> dict:
    """One record per cell x arm, and per cell the best GRPO arm, the best arm and the tests; with
    ``gradient_records`` (:func:`horizon_gradient.load`), their summary under ``gradient``."""
    rows: list[dict[str, Any]] = []
    cells: list[dict[str, Any]] = []
    for cell in sorted(records):
        arms = records[cell]
        base = best_grpo(arms)
        base_runs = arms.get(base, {}) if base else {}
        cell_rows = []
        for arm in ARMS:
            runs = arms.get(arm)
            if not runs:
                continue
            seeds = sorted(runs)
            success = [runs[s]["success_at_budget"] for s in seeds]
            ttt = [tokens_to_target(runs[s]) for s in seeds]
            reached = [t for t in ttt if math.isfinite(t)]
            row: dict[str, Any] = {
                "parameterization": cell[0],
                "structure": cell[1],
                "horizon": cell[2],
                "start_rate": cell[3],
                "arm": arm,
                "seeds": seeds,
                "mean_success": _r(_mean(success)),
                "sd_success": _r(statistics.stdev(success)) if len(success) > 1 else None,
                "sampled_tokens": _r(_mean([runs[s]["sampled_tokens"] for s in seeds]), 1),
                "steps": _r(_mean([runs[s]["steps"] for s in seeds]), 2),
                "rollout_tokens_per_episode": _r(
                    _mean([runs[s]["rollout_tokens"] / max(runs[s]["episodes"], 1) for s in seeds]), 2
                ),
                "irrelevant_credit_share": _r(_mean([runs[s]["irrelevant_share"] for s in seeds])),
                "decisive_sign_accuracy": _r(_mean([runs[s]["decisive_sign_accuracy"] for s in seeds])),
                "reached_target_share": _r(len(reached) / len(seeds)),
                "median_tokens_to_target": _r(statistics.median(reached), 1) if reached else None,
                "vs_best_grpo": None,
            }
            paired = [s for s in seeds if s in base_runs]
            if base and arm != base and len(paired) >= 2:
                diffs = [runs[s]["success_at_budget"] - base_runs[s]["success_at_budget"] for s in paired]
                test = paired_t_test(diffs)
                row["vs_best_grpo"] = {
                    "against": base,
                    "n": test["n"],
                    "mean": _r(test["mean"]),
                    "ci95": [_r(test["ci95"][0]), _r(test["ci95"][1])],
                    "p": _r(test["p"], 6),
                    "p_holm": None,
                    "verdict": None,
                }
            cell_rows.append(row)
        confirmed = bool(base) and _seed_count(arms) >= CONFIRM_MIN
        tested = [r for r in cell_rows if r["arm"] not in GRPO_ARMS + EXPLORATORY and r["vs_best_grpo"]]
        if confirmed and tested:
            adjusted = holm_adjust([r["vs_best_grpo"]["p"] for r in tested])
            for r, p in zip(tested, adjusted, strict=True):
                v = r["vs_best_grpo"]
                v["p_holm"] = _r(p, 6)
                v["verdict"] = (
                    ("pays" if v["mean"] > 0 else "loses") if p is not None and p < ALPHA else "level"
                )
        rows.extend(cell_rows)
        practical = [r for r in cell_rows if r["arm"] in PRACTICAL]
        best_practical = max(practical, key=lambda r: r["mean_success"]) if practical else None
        best_any = max(cell_rows, key=lambda r: r["mean_success"])
        oracle = next((r for r in cell_rows if r["arm"] == "oracle"), None)
        cells.append(
            {
                "parameterization": cell[0],
                "structure": cell[1],
                "horizon": cell[2],
                "start_rate": cell[3],
                "stage": "confirmed" if confirmed else "scout",
                "seeds": _seed_count(arms),
                "best_grpo": base,
                "best_grpo_success": _r(_mean([r["success_at_budget"] for r in base_runs.values()])),
                "best_arm": best_any["arm"],
                "best_practical": best_practical["arm"] if best_practical else None,
                "practical_gap": best_practical["vs_best_grpo"] if best_practical else None,
                "oracle_gap": oracle["vs_best_grpo"] if oracle else None,
                "tree_vs_grpo_tree_tokens": _paired(arms, "tree", "grpo_tree_tokens"),
                "vs_grpo_tree_tokens": {
                    a: _paired(arms, a, "grpo_tree_tokens") for a in SMALL_BATCH_CHECK if arms.get(a)
                },
                "paying_arms": [r["arm"] for r in tested if r["vs_best_grpo"]["verdict"] == "pays"],
                "losing_arms": [r["arm"] for r in tested if r["vs_best_grpo"]["verdict"] == "loses"],
            }
        )
    return {
        "protocol": "docs/where-credit-pays-protocol.md",
        "command": "python benchmarks/horizon_sweep.py report",
        "budget_episode_equivalents": budget,
        "token_counting": "sampled tokens are policy tokens (one choice per turn); tool results and EOS are not counted",
        "cells": cells,
        "records": rows,
        "gradient": horizon_gradient.summarize(gradient_records) if gradient_records else None,
    }


# ---------------------------------------------------------------------------------------------------------------
# The page and the figure
# ---------------------------------------------------------------------------------------------------------------


def _fmt(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:+.{digits}f}" if isinstance(x, float) and x < 0 else f"{x:.{digits}f}"


def _gap(v: dict[str, Any] | None) -> str:
    if not v:
        return "n/a"
    return f"{v['mean']:+.3f} [{_fmt(v['ci95'][0])}, {_fmt(v['ci95'][1])}]"


def _count(cells: Sequence[dict[str, Any]], key: str, sign: int) -> int:
    """Cells whose ``key`` comparison's 95% interval lies wholly above 0 (``sign`` 1) or below it (-1)."""
    n = 0
    for c in cells:
        v = c.get(key)
        if v and v["ci95"][0] is not None:
            n += (v["ci95"][0] > 0) if sign > 0 else (v["ci95"][1] < 0)
    return n


def _count_arm(cells: Sequence[dict[str, Any]], arm: str, sign: int) -> int:
    """Cells where ``arm`` minus ``grpo_tree_tokens`` has its 95% interval wholly above (1) or below (-1) 0."""
    return _count([{"v": (c.get("vs_grpo_tree_tokens") or {}).get(arm)} for c in cells], "v", sign)


def _zero_rollout_notes(
    rows: Sequence[dict[str, Any]], arms: Sequence[str], horizons: Sequence[int]
) -> list[str]:
    """Say what a 0.0 in the rollout-token table means: an arm whose batch never fit the budget made no update (it
    ends where it started); one that updated without rollouts fell back to its outcome advantage (GRPO's)."""
    never, fallback = [], []
    for arm in arms:
        for h in horizons:
            sel = [r for r in rows if r["arm"] == arm and r["horizon"] == h]
            if not sel or any((r["rollout_tokens_per_episode"] or 0) > 0 for r in sel):
                continue
            (never if all((r["steps"] or 0) == 0 for r in sel) else fallback).append(f"`{arm}` at H = {h}")
    notes = []
    if never:
        notes.append(
            f"- **No update at all:** {', '.join(never)}. One batch costs more sampled tokens than the whole run's "
            "budget, so the run ends at the start policy; its losses in the map are this, not worse credit."
        )
    if fallback:
        notes.append(
            f"- **No rollout, so GRPO:** {', '.join(fallback)}. No response's predicted rollout tokens fit the arm's "
            "per-batch budget, so every group keeps GRPO's advantage, exactly (the estimator's rule at an unspent "
            "budget): the arm trains as `grpo` does."
        )
    return notes


def render_page(summary: dict[str, Any], figure: str = "figures/where_credit_pays.png") -> str:
    """The results page, every number read from ``summary``."""
    cells, rows = summary["cells"], summary["records"]
    confirmed = [c for c in cells if c["stage"] == "confirmed"]
    horizons = sorted({r["horizon"] for r in rows})
    lines = [
        *_lead(summary, figure),
        *_cell_rows(cells),
        *_small_batch_section(confirmed),
        *_rollout_tokens_section(rows, horizons),
        *_identification_section(rows, horizons),
        *horizon_gradient.render_section(summary.get("gradient")),
        *_every_arm_section(rows),
    ]
    return "\n".join(lines) + "\n"


def _lead(summary: dict[str, Any], figure: str) -> list[str]:
    """The page's lead, the answer, how to read it, and the per-cell table's header."""
    cells = summary["cells"]
    confirmed = [c for c in cells if c["stage"] == "confirmed"]
    pays = [
        f"{c['parameterization']}/{c['structure']} H={c['horizon']} r={c['start_rate']:g}: "
        + ", ".join(a for a in c["paying_arms"] if a in PRACTICAL)
        for c in confirmed
        if any(a in PRACTICAL for a in c["paying_arms"])
    ]
    oracle_pays = [c for c in confirmed if c["oracle_gap"] and (c["oracle_gap"].get("verdict") == "pays")]
    lines = [
        "# Where does turn credit pay? The map on the agent credit toy",
        "",
        "Generated by `python benchmarks/horizon_sweep.py report` from the committed run records "
        "(`benchmarks/results/horizon_sweep_runs/`) into `benchmarks/results/horizon_sweep.json`; do not edit by "
        "hand. Protocol, committed before the first run: [Where credit pays: protocol](where-credit-pays-protocol.md).",
        "",
        f"Every arm trains from the same exact start for {summary['budget_episode_equivalents']} episode-equivalents "
        "of sampled tokens (240 H policy tokens; tool results and EOS are not counted). The measure is the exact "
        "success probability at the budget, paired by seed against the best of the three GRPO arms of the cell.",
        "",
        "## The answer",
        "",
        f"- Confirmed cells (12 paired seeds, Holm over the 10 non-GRPO arms): {len(confirmed)} of {len(cells)}.",
        f"- Cells where a practical credit arm (the library's estimators or the tabular critic) beats the best GRPO "
        f"arm at equal sampled tokens: {len(pays)}" + (" (" + "; ".join(pays) + ")." if pays else "."),
        f"- Cells where the oracle (exact turn advantages, no sampling cost) beats it: {len(oracle_pays)}"
        + (
            " ("
            + "; ".join(
                f"{c['parameterization']}/{c['structure']} H={c['horizon']} r={c['start_rate']:g}"
                for c in oracle_pays
            )
            + ")."
            if oracle_pays
            else "."
        ),
        f"- Losses (Holm, practical credit arms and the oracle against the best GRPO arm): "
        f"{sum(len(c['losing_arms']) for c in confirmed)} arm-cell pairs in {len(confirmed)} confirmed cells "
        f"(the ties and the rest are level).",
        f"- `tree` against `grpo_tree_tokens` (confirmed cells, paired, 95% interval, no correction): ahead in "
        f"{_count(confirmed, 'tree_vs_grpo_tree_tokens', 1)}, behind in "
        f"{_count(confirmed, 'tree_vs_grpo_tree_tokens', -1)}, level in "
        f"{sum(1 for c in confirmed if c['tree_vs_grpo_tree_tokens']) - _count(confirmed, 'tree_vs_grpo_tree_tokens', 1) - _count(confirmed, 'tree_vs_grpo_tree_tokens', -1)}.",
        f"- Against `grpo_tree_tokens` (GRPO with a smaller batch, more steps at equal tokens; confirmed cells, "
        f"95% interval): `grpo` (the protocol's best GRPO arm in {sum(c['best_grpo'] == 'grpo' for c in confirmed)} "
        f"of them) is behind in {_count_arm(confirmed, 'grpo', -1)}; the oracle ahead in "
        f"{_count_arm(confirmed, 'oracle', 1)} and behind in {_count_arm(confirmed, 'oracle', -1)}; "
        f"`critic_l1` ahead in {_count_arm(confirmed, 'critic_l1', 1)}, `critic_l095` ahead in "
        f"{_count_arm(confirmed, 'critic_l095', 1)}.",
        "- To see it run: `bash scripts/demo.sh --where_credit_pays_untuned` finds the map's crossover (a credit arm that "
        "loses to GRPO at one end of the horizon range and pays at the other), retrains it at both ends beside GRPO, "
        "the oracle and `grpo_tree_tokens` with the study's seeds, and prints both (about a minute on 2 cores).",
        "",
        f"![The map]({figure})",
        "",
        "## How to read it",
        "",
        "- **The toy** (`testbed/agent_credit.py`): the agent testbed's environment (4 choices; decisive turn 0; in "
        "`recovery` the last turn can repair a wrong first choice; every other turn changes nothing), played by a "
        "softmax policy whose values, turn advantages and gradient are exact. `turn`: logits per (turn, state), so a "
        "turn that does not matter has parameters of its own. `shared`: logits per state, shared by every turn, as "
        "one network acts at every turn of an LLM agent; credit on turns that do not matter then lands on the "
        "decisive turn's parameters.",
        "- **The oracle** gets the exact turn advantages for free: where it does not beat GRPO, per-turn credit has "
        "nothing to give on this task. The practical arms pay for their credit in sampled tokens (Monte Carlo "
        "rollouts, a tree's shape, a critic's warm-up).",
        "- **`grpo_tree_tokens`** (exploratory, protocol amendment) is GRPO with the tree's sampled tokens per batch "
        "(3 prompts x 4): with Adam at a fixed learning rate, a cheaper batch means more steps at equal tokens, and "
        "the last column tells that apart from the tree's credit.",
        "- The critic arms use a *tabular* critic (exact state features, no generalisation error): the best case "
        'for PPO, not the library\'s LM critic (`advantage_estimator="gae"`).',
        _why_no_longer_horizon(summary["budget_episode_equivalents"], 2 * max(HORIZONS)),
        "",
        "## Per cell: best arm at equal tokens and the gaps",
        "",
        "Gap: mean paired difference in exact success against the best GRPO arm, with its 95% t interval "
        "(scout cells: 3 seeds, no test).",
        "",
        "| param | structure | H | start | stage | best GRPO (success) | best arm | best practical credit arm: gap "
        "| oracle gap | pays (Holm) | loses (Holm) | tree vs GRPO at the tree's tokens per batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    return lines


def _cell_rows(cells: list[dict[str, Any]]) -> list[str]:
    """The per-cell table's rows: best arm at equal tokens and the gaps."""
    lines: list[str] = []
    for c in cells:
        gap = c["practical_gap"]
        lines.append(
            f"| {c['parameterization']} | {c['structure']} | {c['horizon']} | {c['start_rate']:g} | "
            f"{c['stage']} ({c['seeds']}) | {c['best_grpo']} ({_fmt(c['best_grpo_success'])}) | {c['best_arm']} | "
            f"{c['best_practical']}: {_gap(gap)} | {_gap(c['oracle_gap'])} | "
            f"{', '.join(c['paying_arms']) or '-'} | {', '.join(c['losing_arms']) or '-'} | "
            f"{_gap(c['tree_vs_grpo_tree_tokens'])} |"
        )
    return lines


def _small_batch_section(confirmed: list[dict[str, Any]]) -> list[str]:
    """The exploratory comparison with GRPO at the tree's tokens per batch."""
    lines: list[str] = []
    lines += [
        "",
        "## Exploratory: against GRPO at the tree's tokens per batch",
        "",
        "`grpo_tree_tokens` is GRPO with 3 prompts x 4 responses per batch (12 episodes, the tree's tokens) instead "
        "of 4 x 4: at equal sampled tokens it takes a third more Adam steps. Paired differences (arm minus "
        "`grpo_tree_tokens`) with 95% t intervals, no multiplicity correction; confirmed cells (12 seeds).",
        "",
        "| param | structure | H | start | " + " | ".join(SMALL_BATCH_CHECK) + " |",
        "|---|---|---|---|" + "---|" * len(SMALL_BATCH_CHECK),
    ]
    for c in confirmed:
        checks = c.get("vs_grpo_tree_tokens") or {}
        lines.append(
            f"| {c['parameterization']} | {c['structure']} | {c['horizon']} | {c['start_rate']:g} | "
            + " | ".join(_gap(checks.get(a)) for a in SMALL_BATCH_CHECK)
            + " |"
        )
    return lines


def _rollout_tokens_section(rows: list[dict[str, Any]], horizons: list[int]) -> list[str]:
    """Monte Carlo rollout tokens per training episode, per arm and horizon, and the arms that sampled none."""
    lines: list[str] = []
    lines += [
        "",
        "## Monte Carlo rollout tokens per training episode, against H",
        "",
        "Mean over every cell and seed at that horizon (an episode itself is H sampled tokens).",
        "",
    ]
    mc_arms = [
        a for a in ARMS if any(r["arm"] == a and (r["rollout_tokens_per_episode"] or 0) > 0 for r in rows)
    ]
    lines.append("| arm | " + " | ".join(f"H={h}" for h in horizons) + " |")
    lines.append("|---|" + "---|" * len(horizons))
    for arm in mc_arms:
        vals = [
            _mean(
                [
                    r["rollout_tokens_per_episode"]
                    for r in rows
                    if r["arm"] == arm and r["horizon"] == h and r["rollout_tokens_per_episode"] is not None
                ]
            )
            for h in horizons
        ]
        lines.append(f"| {arm} | " + " | ".join(_fmt(_r(v, 1), 1) for v in vals) + " |")
    lines += ["", *_zero_rollout_notes(rows, mc_arms, horizons)]
    return lines


def _identification_section(rows: list[dict[str, Any]], horizons: list[int]) -> list[str]:
    """Credit identification per arm and horizon: the share on turns that do not matter, the decisive sign."""
    lines: list[str] = []
    lines += [
        "",
        "## Credit identification, against H",
        "",
        "Share of absolute raw credit on turns whose exact advantage is 0 / sign accuracy on the decisive turn; mean "
        "over cells and seeds at that horizon (the oracle's share is 0 by construction).",
        "",
        "| arm | " + " | ".join(f"H={h}" for h in horizons) + " |",
        "|---|" + "---|" * len(horizons),
    ]
    for arm in (a for a in ARMS if any(r["arm"] == a for r in rows)):  # arms with learning runs
        cellv = []
        for h in horizons:
            sel = [r for r in rows if r["arm"] == arm and r["horizon"] == h]
            share = _mean(
                [r["irrelevant_credit_share"] for r in sel if r["irrelevant_credit_share"] is not None]
            )
            sign = _mean(
                [r["decisive_sign_accuracy"] for r in sel if r["decisive_sign_accuracy"] is not None]
            )
            cellv.append(f"{_fmt(_r(share), 2)} / {_fmt(_r(sign), 2)}")
        lines.append(f"| {arm} | " + " | ".join(cellv) + " |")
    return lines


def _every_arm_section(rows: list[dict[str, Any]]) -> list[str]:
    """Every arm in every cell: success, steps, the share reaching the target, the gap to the best GRPO arm."""
    lines: list[str] = []
    lines += [
        "",
        "## Every arm, every cell",
        "",
        "Mean exact success at the budget (seeds), steps taken, and the share of seeds reaching half the way to 1.",
        "",
        "| param | structure | H | start | arm | seeds | success | steps | reached | gap vs best GRPO | Holm p |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = r["vs_best_grpo"]
        lines.append(
            f"| {r['parameterization']} | {r['structure']} | {r['horizon']} | {r['start_rate']:g} | {r['arm']} | "
            f"{len(r['seeds'])} | {_fmt(r['mean_success'])} | {_fmt(r['steps'], 1)} | "
            f"{_fmt(r['reached_target_share'], 2)} | {_gap(v)} | {_fmt(v['p_holm'], 4) if v and v['p_holm'] is not None else '-'} |"
        )
    return lines


def make_figure(summary: dict[str, Any], path: Path) -> None:
    """Per (parameterization, start rate, structure): the gap of the best practical credit arm and of the oracle
    against the best GRPO arm, with 95% intervals, against H; the best arm's name at each point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]
    params = sorted({c["parameterization"] for c in cells})
    rates = sorted({c["start_rate"] for c in cells})
    structures = sorted({c["structure"] for c in cells})
    panels = [(p, r) for p in params for r in rates]
    fig, axes = plt.subplots(
        len(panels), len(structures), figsize=(5.2 * len(structures), 2.8 * len(panels)), squeeze=False
    )
    for i, (param, rate) in enumerate(panels):
        for j, structure in enumerate(structures):
            ax = axes[i][j]
            sel = sorted(
                (
                    c
                    for c in cells
                    if (c["parameterization"], c["start_rate"], c["structure"]) == (param, rate, structure)
                ),
                key=lambda c: c["horizon"],
            )
            for key, label, color, dx in (
                ("practical_gap", "best practical credit arm", "C0", -0.04),
                ("oracle_gap", "oracle", "C3", 0.04),
            ):
                pts = [(c["horizon"], c[key]) for c in sel if c[key]]
                if not pts:
                    continue
                xs = [h * (1 + dx) for h, _ in pts]
                ys = [v["mean"] for _, v in pts]
                lo = [v["mean"] - (v["ci95"][0] if v["ci95"][0] is not None else v["mean"]) for _, v in pts]
                hi = [(v["ci95"][1] if v["ci95"][1] is not None else v["mean"]) - v["mean"] for _, v in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", color=color, capsize=3, label=label)
            for c in sel:
                gap = c["practical_gap"]
                if gap:
                    ax.annotate(
                        f"{c['best_practical']} (best: {c['best_arm']})"
                        f"{'' if c['stage'] == 'confirmed' else ', scout'}",
                        (c["horizon"], gap["mean"]),
                        textcoords="offset points",
                        xytext=(0, 8),
                        ha="center",
                        fontsize=6,
                    )
            ax.axhline(0.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({c["horizon"] for c in sel}) or [2])
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_title(f"{param} policy, {structure}, start {rate:g}", fontsize=9)
            ax.set_xlabel("horizon H (turns)", fontsize=8)
            ax.set_ylabel("success gap vs best GRPO", fontsize=8)
            ax.tick_params(labelsize=7)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(
        "Where turn credit pays at equal sampled tokens (label: best practical credit arm; best arm of the cell)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    root: Path,
    summary_path: Path,
    page: Path,
    figure: Path,
    budget: int = BUDGET_EPISODES,
    gradient_root: Path | None = None,
) -> dict:
    """The JSON, the page and the figure from the records under ``root`` (and the gradient instrument's under
    ``gradient_root``, when given)."""
    gradient = horizon_gradient.load(gradient_root) if gradient_root is not None else []
    summary = summarize(load_records(root, budget), budget, gradient)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    rel = os.path.relpath(figure, page.parent)
    page.parent.mkdir(parents=True, exist_ok=True)
    write_untuned(page, summary, figure=rel)
    make_figure(summary, figure)
    return summary


#: The line of docs/where-credit-pays.md above which the tuned map (benchmarks/credit_map_tuned.py) leads; this
#: report writes only what is below it.
UNTUNED_MARKER = "<!-- the untuned map below: generated by benchmarks/horizon_sweep.py report -->"
UNTUNED_TITLE = "## The untuned map: step count at one learning rate"


def untuned_section(summary: dict[str, Any], figure: str = "figures/where_credit_pays.png") -> str:
    """:func:`render_page` as a section of the tuned map's page: one heading level down, under a title that says
    what it measures (every arm at lr 0.1 and its own batch, so at equal tokens it ranks arms by step count)."""
    body = render_page(summary, figure=figure).split("\n", 1)[1]
    demoted = "\n".join("#" + line if line.startswith("#") else line for line in body.split("\n"))
    note = (
        "Below: the first map (issue 41), every arm at one learning rate (0.1) and its own batch shape, untuned. At "
        "equal sampled tokens it ranks arms mostly by how many Adam steps they get at that rate; the tuned map above "
        "supersedes its conclusions."
    )
    return f"{UNTUNED_TITLE}\n\n{note}\n{demoted}"


def write_untuned(page: Path, summary: dict[str, Any], figure: str = "figures/where_credit_pays.png") -> None:
    """Write the untuned map below the marker, keeping the tuned lead above it (if the page has one)."""
    text = page.read_text() if page.exists() else ""
    lead = text.split(UNTUNED_MARKER, 1)[0] if UNTUNED_MARKER in text else ""
    page.write_text(lead + UNTUNED_MARKER + "\n" + untuned_section(summary, figure))


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "report"))
    parser.add_argument("--stage", choices=("scout", "confirm"), default="scout")
    parser.add_argument("--root", type=Path, default=RUNS, help="where the run records live")
    parser.add_argument("--json", type=Path, default=SUMMARY)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument(
        "--gradient_root", type=Path, default=GRADIENT_RUNS, help="the gradient instrument's records"
    )
    parser.add_argument("--budget", type=int, default=BUDGET_EPISODES, help="episode-equivalents per run")
    parser.add_argument("--params", nargs="+", default=list(PARAMETERIZATIONS))
    parser.add_argument("--structures", nargs="+", default=list(STRUCTURES))
    parser.add_argument("--horizons", nargs="+", type=int, default=list(HORIZONS))
    parser.add_argument("--rates", nargs="+", type=float, default=list(RATES))
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="override the stage's seeds")
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms {unknown}: not arms of testbed.agent_credit.ARMS ({list(ARMS)}).")
    if args.command == "report":
        summary = report(args.root, args.json, args.page, args.figure, args.budget, args.gradient_root)
        print(
            f"{len(summary['records'])} records in {len(summary['cells'])} cells -> {args.json}, {args.page}"
        )
        return 0
    grid = all_cells(args.params, args.structures, args.horizons, args.rates)
    if args.stage == "scout":
        cells, seeds = grid, tuple(args.seeds) if args.seeds is not None else SCOUT_SEEDS
    else:
        records = load_records(args.root, args.budget)
        cells = [c for c in confirm_cells({c: v for c, v in records.items() if c in grid})]
        seeds = tuple(args.seeds) if args.seeds is not None else CONFIRM_SEEDS
        print(f"confirm: {len(cells)} cells: {cells}", flush=True)
    ran = 0
    for cell in cells:
        for arm in args.arms:
            for seed in seeds:
                if run_one(args.root, cell, arm, seed, args.budget):
                    ran += 1
        print(f"{cell}: done ({ran} runs so far)", flush=True)
    print(f"ran {ran} runs", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
