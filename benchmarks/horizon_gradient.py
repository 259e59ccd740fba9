"""The gradient instrument on the agent credit toy at the smallest and largest horizon (issue 41, item 4; protocol:
docs/where-credit-pays-protocol.md, amendment of 2026-11-28).

    python benchmarks/horizon_gradient.py                 # every cell and arm (resumable; ~10 minutes of one core)
    python benchmarks/horizon_sweep.py report             # folds the records into the JSON's "gradient" key and the page

At the exact start policy of each cell (parameterization x structure x H in {2, 16} x start rate), each arm of
:data:`testbed.agent_credit.ARMS` draws ``repeats`` independent batch gradients exactly as its first training update
(:func:`testbed.agent_credit.arm_batch_gradients`), scored against the exact gradient with
:func:`mcadvantage.evaluation.gradient_instrument.gradient_metrics` (per batch) and, per unit of sampled tokens, by
:func:`equal_token_error`. One record per (cell, arm): ``benchmarks/results/horizon_sweep_gradient/<param>/
<structure>_H<H>_r<rate>/<arm>.json``; a record with the same settings is not measured again. Descriptive only: the
study's decision does not read it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/horizon_gradient.py` has only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:  # imported as a module, not run: its siblings
    sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import machine_info  # noqa: E402  (beside this file: commit, versions, CPU, threads)
from _runs import append_run, load_runs, read_run  # noqa: E402  (beside this file)

from testbed.agent_credit import (  # noqa: E402
    ARMS,
    BASE_GROUP,
    BASE_PROMPTS,
    GRPO_ARMS,
    PARAMETERIZATIONS,
    grpo_match_factor,
)

GRADIENT_RUNS = ROOT / "benchmarks" / "results" / "horizon_sweep_gradient"
#: The amendment's settings: the smallest and largest horizon of the map, 50 batches per arm and cell, seed 0.
HORIZONS = (2, 16)
STRUCTURES = ("delayed", "recovery")
RATES = (0.15, 0.5)
REPEATS = 50
SEED = 0
BOOTSTRAP = 1000

Cell = tuple[str, str, int, float]  # parameterization, structure, horizon, start rate


def equal_token_budget(horizon: int) -> int:
    """The common budget of sampled tokens: ``grpo_prompts``' batch (``vineppo`` K = 1's price per batch)."""
    return BASE_PROMPTS * grpo_match_factor(horizon) * BASE_GROUP * horizon


def _error_parts(stacked: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """``(bias, noise)`` of batch gradients against ``exact``, relative to ``||exact||^2`` after removing the
    estimator's overall scale (``mean <g_hat, g> / ||g||^2``): ``noise`` is one batch's variance (trace of the
    covariance of ``g_hat / scale``), ``bias`` the squared distance of the mean from ``exact`` less the mean's own
    noise (0 at least). The relative squared error of an average of ``k`` batches is then ``bias + noise / k``."""
    norm2 = float(exact @ exact)
    scale = float((stacked @ exact).mean()) / norm2
    if not scale > 0:
        return math.nan, math.nan
    errors = stacked / scale - exact
    repeats = stacked.shape[0]
    noise = float(errors.var(0, unbiased=True).sum()) / norm2
    bias = max(float(errors.mean(0) @ errors.mean(0)) / norm2 - noise / repeats, 0.0)
    return bias, noise


def equal_token_error(
    gradients: Sequence[torch.Tensor],
    exact: torch.Tensor,
    tokens: Sequence[int],
    budget: int,
    *,
    resamples: int = BOOTSTRAP,
    seed: int = 0,
) -> dict[str, Any]:
    """The relative squared error (scale removed) of an estimator at ``budget`` sampled tokens: ``bias + noise *
    c / budget`` with ``c`` its mean sampled tokens per batch (an average of ``budget / c`` independent batches:
    noise shrinks with the tokens spent, bias does not; an arm dearer than the budget gets its noise scaled up, as
    if a fraction of a batch could be drawn). Its SD over bootstrap resamples of the repeats, and the 95% interval
    ``estimate +- 1.96 SD`` (floored at 0; a percentile interval is pulled up by the bias part's floor at 0)."""
    if len(gradients) < 2 or len(gradients) != len(tokens):
        raise ValueError(
            f"equal_token_error: {len(gradients)} gradients and {len(tokens)} token counts; pass at least 2 of "
            "each, one count per gradient."
        )
    stacked = torch.stack([g.float() for g in gradients])
    cost = torch.tensor([float(t) for t in tokens])

    def at_budget(rows: list[int]) -> float:
        bias, noise = _error_parts(stacked[rows], exact.float())
        return bias + noise * float(cost[rows].mean()) / budget

    everything = list(range(len(gradients)))
    bias, noise = _error_parts(stacked, exact.float())
    rng = random.Random(seed)
    draws = [
        v
        for v in (at_budget(rng.choices(everything, k=len(everything))) for _ in range(resamples))
        if math.isfinite(v)
    ]
    finite = len(draws) >= 2
    mean = sum(draws) / len(draws) if finite else math.nan
    sd = math.sqrt(sum((d - mean) ** 2 for d in draws) / (len(draws) - 1)) if finite else math.nan
    point = bias + noise * float(cost.mean()) / budget
    return {
        "budget_tokens": budget,
        "bias": bias,
        "noise_per_batch": noise,
        "rel_sq_error": point,
        "rel_sq_error_ci": [max(point - 1.96 * sd, 0.0), point + 1.96 * sd],
        "rel_sq_error_sd": sd,
        "bootstrap_finite_share": len(draws) / resamples,
    }


def cell_name(cell: Cell) -> str:
    """The cell's part of its records' names in a run directory's archive (``benchmarks/_runs.py``)."""
    param, structure, horizon, rate = cell
    return f"{param}/{structure}_H{horizon}_r{rate:g}"


def settings_of(cell: Cell, arm: str, repeats: int, seed: int) -> dict[str, Any]:
    param, structure, horizon, rate = cell
    return {"parameterization": param, "structure": structure, "horizon": horizon, "start_rate": rate,
            "arm": arm, "repeats": repeats, "seed": seed}  # fmt: skip


def measure(cell: Cell, arm: str, repeats: int, seed: int) -> dict[str, Any]:
    """One record: ``arm``'s batch gradients at the start of ``cell`` against the exact gradient."""
    from mcadvantage.evaluation.gradient_instrument import gradient_metrics
    from testbed.agent_credit import arm_batch_gradients, batch_identification

    param, structure, horizon, rate = cell
    start = time.perf_counter()
    shares: list[float] = []
    signs: list[bool] = []

    def identify(policy: Any, batch: Any, raw: torch.Tensor) -> None:
        batch_shares, batch_signs = batch_identification(policy, batch, raw)
        shares.extend(batch_shares)
        signs.extend(batch_signs)

    exact, gradients, tokens = arm_batch_gradients(
        structure, horizon, rate, arm, seed, repeats, parameterization=param, on_batch=identify
    )
    # Coordinates whose exact gradient is 0 (a turn that changes nothing, a state never reached) come out of autograd
    # as round-off (~1e-17); set them to 0 so that sign agreement is scored only where the sign is defined.
    exact = torch.where(exact.abs() > 1e-9 * exact.abs().max(), exact, torch.zeros_like(exact))
    quality = gradient_metrics(gradients, exact, seed=seed)
    cosines = quality.pop("cosines")
    return {
        "settings": settings_of(cell, arm, repeats, seed),
        "seconds": round(time.perf_counter() - start, 3),
        "exact_gradient_norm": float(exact.norm()),
        "sampled_tokens_per_batch": sum(tokens) / len(tokens),
        "zero_gradient_share": sum(float(g.norm()) == 0.0 for g in gradients) / len(gradients),
        "per_batch": quality,
        "cosines": cosines,
        "equal_tokens": equal_token_error(gradients, exact, tokens, equal_token_budget(horizon), seed=seed),
        # Credit identification at the start policy, on the same batches (testbed.agent_credit.batch_identification)
        "identification": {
            "irrelevant_share": sum(shares) / len(shares) if shares else math.nan,
            "decisive_sign_accuracy": sum(signs) / len(signs) if signs else math.nan,
            "credited_episodes": len(shares),
            "signed_episodes": len(signs),
        },
    }


def run(root: Path, cells: Sequence[Cell], arms: Sequence[str], repeats: int, seed: int) -> int:
    """Measure every (cell, arm) whose record is missing or was made with other settings; returns how many ran."""
    ran = 0
    for cell in cells:
        for arm in arms:
            key = f"{cell_name(cell)}/{arm}.json"
            old = read_run(root, key, None)
            # a record from before the identification was measured is measured again (same batches); a foreign
            # one is replaced
            if isinstance(old, dict) and old.get("settings") == settings_of(cell, arm, repeats, seed):
                if "identification" in old:
                    continue
            append_run(root, key, measure(cell, arm, repeats, seed) | {"environment": machine_info()})
            ran += 1
        print(f"{cell}: done ({ran} measured so far)", flush=True)
    return ran


# ---------------------------------------------------------------------------------------------------------------
# The summary and the page section (read only the records)
# ---------------------------------------------------------------------------------------------------------------


def load(root: Path) -> list[dict[str, Any]]:
    """Every record under ``root`` (none when it does not exist)."""
    return list(load_runs(root, "*/*/*.json").values())


def _r(x: Any, digits: int = 4) -> float | None:
    return round(x, digits) if isinstance(x, int | float) and math.isfinite(x) else None


def _ratio(arm: dict[str, Any], base: dict[str, Any]) -> dict[str, Any] | None:
    """``arm``'s error at equal tokens over ``base``'s, with a 95% interval from the two (independent) bootstrap
    SDs on the log scale (delta method)."""
    a, b = arm["equal_tokens"], base["equal_tokens"]
    if not all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in
               (a["rel_sq_error"], b["rel_sq_error"], a["rel_sq_error_sd"], b["rel_sq_error_sd"])):  # fmt: skip
        return None
    log_ratio = math.log(a["rel_sq_error"] / b["rel_sq_error"])
    se = math.hypot(a["rel_sq_error_sd"] / a["rel_sq_error"], b["rel_sq_error_sd"] / b["rel_sq_error"])
    return {"ratio": _r(math.exp(log_ratio)), "ci95": [_r(math.exp(log_ratio - 1.96 * se)),
            _r(math.exp(log_ratio + 1.96 * se))]}  # fmt: skip


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The JSON's ``gradient`` key: one row per cell x arm, and per cell the arm with the lowest error at equal
    tokens and each arm's error over the best GRPO arm's (lowest of ``GRPO_ARMS``, chosen after the fact)."""
    by_cell: dict[Cell, dict[str, dict[str, Any]]] = {}
    for rec in records:
        s = rec["settings"]
        cell = (s["parameterization"], s["structure"], int(s["horizon"]), float(s["start_rate"]))
        by_cell.setdefault(cell, {})[s["arm"]] = rec
    rows, cells = [], []
    for cell in sorted(by_cell):
        arms = by_cell[cell]
        finite = {a: r for a, r in arms.items() if _r(r["equal_tokens"]["rel_sq_error"]) is not None}
        grpo = [a for a in GRPO_ARMS if a in finite]
        base = min(grpo, key=lambda a: finite[a]["equal_tokens"]["rel_sq_error"]) if grpo else None
        best = min(finite, key=lambda a: finite[a]["equal_tokens"]["rel_sq_error"]) if finite else None
        cell_rows: list[dict[str, Any]] = []
        for arm in (a for a in ARMS if a in arms):
            rec, q, eq = arms[arm], arms[arm]["per_batch"], arms[arm]["equal_tokens"]
            cell_rows.append({
                "parameterization": cell[0], "structure": cell[1], "horizon": cell[2], "start_rate": cell[3],
                "arm": arm, "repeats": q["repeats"],
                "sampled_tokens_per_batch": _r(rec["sampled_tokens_per_batch"], 1),
                "zero_gradient_share": _r(rec["zero_gradient_share"]),
                "cosine": _r(q["cosine"]), "cosine_ci": [_r(x) for x in q["cosine_ci"]],
                "sign_agreement": _r(q["sign_agreement"]),
                "sign_agreement_ci": [_r(x) for x in q["sign_agreement_ci"]],
                "rel_sq_error": _r(q["rel_sq_error"]), "mean_cosine": _r(q["mean_cosine"]),
                "bias_ratio": _r(q["bias_ratio"], 2),
                "equal_token_budget": eq["budget_tokens"],
                "equal_token_rel_sq_error": _r(eq["rel_sq_error"]),
                "equal_token_rel_sq_error_ci": [_r(x) for x in eq["rel_sq_error_ci"]],
                "bias_part": _r(eq["bias"]),
                "irrelevant_share_at_start": _r(rec.get("identification", {}).get("irrelevant_share")),
                "decisive_sign_accuracy_at_start": _r(rec.get("identification", {}).get("decisive_sign_accuracy")),
                "vs_best_grpo": _ratio(rec, finite[base]) if base and arm in finite and arm != base else None,
            })  # fmt: skip
        rows.extend(cell_rows)
        cells.append({
            "parameterization": cell[0], "structure": cell[1], "horizon": cell[2], "start_rate": cell[3],
            "best_grpo": base, "best_arm": best,
            "below_best_grpo": [r["arm"] for r in cell_rows if r["vs_best_grpo"]
                                and r["vs_best_grpo"]["ci95"][1] is not None and r["vs_best_grpo"]["ci95"][1] < 1],
            "above_best_grpo": [r["arm"] for r in cell_rows if r["vs_best_grpo"]
                                and r["vs_best_grpo"]["ci95"][0] is not None and r["vs_best_grpo"]["ci95"][0] > 1],
        })  # fmt: skip
    return {
        "protocol": "docs/where-credit-pays-protocol.md (amendment of 2026-11-28: descriptive, decides nothing)",
        "command": "python benchmarks/horizon_gradient.py; python benchmarks/horizon_sweep.py report",
        "equal_token_budget": "grpo_prompts' sampled tokens per batch (vineppo K = 1's price): 4 m x 4 x H",
        "cells": cells,
        "records": rows,
    }


def _f(x: Any, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _ci(v: Sequence[Any], digits: int = 3) -> str:
    return f"[{_f(v[0], digits)}, {_f(v[1], digits)}]"


def _ratios(rows: Sequence[dict[str, Any]], arm: str, **where: Any) -> list[float]:
    return [r["vs_best_grpo"]["ratio"] for r in rows if r["arm"] == arm and r["vs_best_grpo"]
            and all(r[k] == v for k, v in where.items())]  # fmt: skip


def _span(values: Sequence[float], digits: int = 2) -> str:
    if not values:
        return "n/a"
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def _what_it_shows(cells: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The reading of the numbers, every number computed here (the words were written after the first full run)."""
    horizons = sorted({r["horizon"] for r in rows})
    lo, hi = horizons[0], horizons[-1]
    oracle_best = sum(c["best_arm"] == "oracle" for c in cells)
    below = {
        a: sum(a in c["below_best_grpo"] for c in cells) for a in ("tree", "vineppo_k4", "vineppo_k4_reuse")
    }
    hybrid_hi = [r["sampled_tokens_per_batch"] for r in rows if r["arm"] == "hybrid" and r["horizon"] == hi]
    grpo_hi = [r["sampled_tokens_per_batch"] for r in rows if r["arm"] == "grpo" and r["horizon"] == hi]
    return [
        f"- **What it shows** (error at equal tokens over the best GRPO arm's; ranges over the cells): exact turn "
        f"credit makes the best gradient per token (the oracle is lowest in {oracle_best} of {len(cells)} cells; "
        f"ratio {_span(_ratios(rows, 'oracle', horizon=lo))} at H = {lo}, {_span(_ratios(rows, 'oracle', horizon=hi))}"
        f" at H = {hi}); the tabular critic after its warm-up is lower than GRPO too (`critic_l1` "
        f"{_span(_ratios(rows, 'critic_l1'))}). Monte Carlo turn values gain at the gradient only in `delayed`, where "
        f"every turn after the decisive one has a fixed value (`vineppo_k1_reuse` "
        f"{_span(_ratios(rows, 'vineppo_k1_reuse', structure='delayed'))}), and **lose** in `recovery`, where the "
        f"value of every turn in between waits on the repair, so Monte Carlo puts noise on each of them (`vineppo_k1_reuse` "
        f"{_span(_ratios(rows, 'vineppo_k1_reuse', structure='recovery', horizon=hi))} at H = {hi}, `vineppo_k1` "
        f"{_span(_ratios(rows, 'vineppo_k1', structure='recovery', horizon=hi))}). `tree` is below the best GRPO arm "
        f"in {below['tree']} cells, `vineppo_k4` in {below['vineppo_k4']}, `vineppo_k4_reuse` in "
        f"{below['vineppo_k4_reuse']}; `hybrid` samples {_span(hybrid_hi, 0)} tokens per batch at H = {hi} against "
        f"GRPO's {_span(grpo_hi, 0)} (no rollouts: it is GRPO there). Arms that give turns that do not matter exactly "
        "0 (the oracle, Monte Carlo in `delayed`) score the same under both parameterizations. A better gradient is "
        "not faster learning: the map above decides.",
        *_anchor_reading(cells, rows, lo, hi),
    ]


ANCHOR_ARMS = ("anchor", "anchor_pooled", "anchor_hist", "anchor_hist_pooled")


def _anchor_reading(
    cells: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], lo: int, hi: int
) -> list[str]:
    """The anchor arms (issue 49) in numbers: their error at equal tokens over the best GRPO arm's, per horizon, and
    the cells where the interval of that ratio lies below or above 1."""
    present = [a for a in ANCHOR_ARMS if any(r["arm"] == a for r in rows)]
    if not present:
        return []
    parts = []
    for arm in present:
        below = sum(arm in c["below_best_grpo"] for c in cells)
        above = sum(arm in c["above_best_grpo"] for c in cells)
        parts.append(
            f"`{arm}` {_span(_ratios(rows, arm, horizon=lo))} at H = {lo} and {_span(_ratios(rows, arm, horizon=hi))} "
            f"at H = {hi} (below the best GRPO arm in {below} of {len(cells)} cells, above it in {above})"
        )
    return [
        "- **Anchor-state credit** (issue 49; no extra samples: each arm's batch is `grpo`'s, so it is measured "
        "at GRPO's tokens), error at equal tokens over the best GRPO arm's: "
        + "; ".join(parts)
        + ". `anchor` / `anchor_pooled` key turns by the true state `(turn, state)`, `anchor_hist` / "
        "`anchor_hist_pooled` by the history before the turn (free-text observations: keys stop recurring once two "
        "episodes diverge)."
    ]


def _identification_at_start(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Credit identification at the start policy, from the instrument's own batches (every arm's raw credit on
    the same kind of batch, before any update): per arm and H, the mean over the cells at that H, shown only where
    every cell's record carries it (records measured before the identification was added do not)."""
    horizons = sorted({r["horizon"] for r in rows})

    def complete(arm: str, h: int) -> list[dict[str, Any]] | None:
        sel = [r for r in rows if r["arm"] == arm and r["horizon"] == h]
        return sel if sel and all(r.get("irrelevant_share_at_start") is not None for r in sel) else None

    shown = [a for a in ARMS if any(complete(a, h) for h in horizons)]
    if not shown:
        return []
    lines = [
        "",
        "Credit identification at the start policy, on the instrument's batches: share of absolute raw credit on "
        "turns whose exact advantage is 0 / sign accuracy on the decisive turn "
        "(`testbed.agent_credit.batch_identification`, the measure of the learning runs' table above, here before "
        "any update and on every batch); mean over the cells at that horizon. Arms whose records predate this "
        "measure are left out.",
        "",
        "| arm | " + " | ".join(f"H={h}" for h in horizons) + " |",
        "|---|" + "---|" * len(horizons),
    ]
    for arm in shown:
        cells = []
        for h in horizons:
            sel = complete(arm, h)
            if sel is None:
                cells.append("-")
                continue
            share = sum(r["irrelevant_share_at_start"] for r in sel) / len(sel)
            signs = [
                r["decisive_sign_accuracy_at_start"]
                for r in sel
                if r["decisive_sign_accuracy_at_start"] is not None
            ]
            cells.append(f"{_f(share, 2)} / {_f(sum(signs) / len(signs) if signs else None, 2)}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def render_section(gradient: dict[str, Any] | None) -> list[str]:
    """The page's section on the gradient instrument, every number read from ``gradient``."""
    if not gradient or not gradient["records"]:
        return []
    cells, rows = gradient["cells"], gradient["records"]
    practical = [a for a in ARMS if a not in GRPO_ARMS and a not in ("oracle", "grpo_tree_tokens")]
    wins = [c for c in cells if any(a in practical for a in c["below_best_grpo"])]
    oracle_wins = [c for c in cells if "oracle" in c["below_best_grpo"]]

    def where(cs: Sequence[dict[str, Any]]) -> str:
        return "; ".join(
            f"{c['parameterization']}/{c['structure']} H={c['horizon']} r={c['start_rate']:g}" for c in cs
        )

    lines = [
        "",
        "## The gradient instrument at H = 2 and H = 16 (descriptive)",
        "",
        "At the exact start policy of each cell, each arm's batch gradient (its first training update: its batch, its "
        "turn advantages on the policy tokens, its whitening) is drawn "
        f"{rows[0]['repeats']} times and compared with the exact gradient (`{gradient['command']}`; protocol "
        "amendment of 2026-11-28, which decides nothing). *Per batch*: cosine, and sign agreement on the coordinates "
        "where the exact gradient is not 0. *At equal sampled tokens*: the relative squared error after removing "
        "the arm's overall scale (whitening changes it), split into a bias part and one batch's noise, with the "
        "noise divided by the batches that fit the budget of `grpo_prompts`' batch (4 m x 4 x H tokens, `vineppo` "
        "K = 1's price); lower is better, 1 means noise as large as the signal. Intervals: 95% bootstrap over the "
        "batches (cosine: percentile; error: estimate +- 1.96 bootstrap SD); the ratio to the best GRPO arm (lowest of the three GRPO arms, chosen after the fact) has a "
        "delta-method interval. The oracle's batch costs its episodes only; the critic arms are measured after "
        "their 2-batch warm-up, whose tokens are not charged to the batch.",
        "",
        f"- Cells where a practical credit arm's error at equal tokens is below the best GRPO arm's (interval of the "
        f"ratio below 1): {len(wins)} of {len(cells)}" + (f" ({where(wins)})." if wins else "."),
        f"- Cells where the oracle's is: {len(oracle_wins)} of {len(cells)}"
        + (f" ({where(oracle_wins)})." if oracle_wins else "."),
        "- Arms above the best GRPO arm's error (ratio interval above 1), summed over cells: "
        + ", ".join(f"`{a}` {n}" for a in ARMS if (n := sum(a in c["above_best_grpo"] for c in cells)))
        + ".",
        *_what_it_shows(cells, rows),
        "",
        "| param | structure | H | start | best GRPO | lowest error at equal tokens | practical arms below best GRPO "
        "| arms above it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        lines.append(
            f"| {c['parameterization']} | {c['structure']} | {c['horizon']} | {c['start_rate']:g} | {c['best_grpo']} "
            f"| {c['best_arm']} | {', '.join(a for a in c['below_best_grpo'] if a in practical) or '-'} "
            f"| {', '.join(c['above_best_grpo']) or '-'} |"
        )
    lines += _identification_at_start(rows)
    lines += [
        "",
        "Every arm and cell: sampled tokens per batch, per-batch cosine and sign agreement, the relative squared "
        "error at equal tokens (its bias part) and its ratio to the best GRPO arm's.",
        "",
        "| param | structure | H | start | arm | tokens/batch | zero batches | cosine | sign agreement "
        "| error at equal tokens (bias) | vs best GRPO |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = r["vs_best_grpo"]
        lines.append(
            f"| {r['parameterization']} | {r['structure']} | {r['horizon']} | {r['start_rate']:g} | {r['arm']} "
            f"| {_f(r['sampled_tokens_per_batch'], 0)} | {_f(r['zero_gradient_share'], 2)} "
            f"| {_f(r['cosine'])} {_ci(r['cosine_ci'])} | {_f(r['sign_agreement'], 2)} "
            f"| {_f(r['equal_token_rel_sq_error'])} {_ci(r['equal_token_rel_sq_error_ci'])} ({_f(r['bias_part'])}) "
            f"| {_f(v['ratio'], 2) + ' ' + _ci(v['ci95'], 2) if v else '-'} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=GRADIENT_RUNS, help="where the records live")
    parser.add_argument("--params", nargs="+", default=list(PARAMETERIZATIONS))
    parser.add_argument("--structures", nargs="+", default=list(STRUCTURES))
    parser.add_argument("--horizons", nargs="+", type=int, default=list(HORIZONS))
    parser.add_argument("--rates", nargs="+", type=float, default=list(RATES))
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms {unknown}: not arms of testbed.agent_credit.ARMS ({list(ARMS)}).")
    if args.repeats < 2:
        parser.error(f"--repeats {args.repeats}: pass at least 2 (the intervals need two batches).")
    cells = [
        (p, s, h, r) for p in args.params for s in args.structures for h in args.horizons for r in args.rates
    ]
    print(f"measured {run(args.root, cells, args.arms, args.repeats, args.seed)} records", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
