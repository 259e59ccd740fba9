"""Credit at GRPO's price: the cheaper credit estimators (hybrid, tree, cheaper Monte Carlo) against GRPO at equal
cost, gathered from the measurements that produce each number.

    python benchmarks/credit_at_grpo_price.py          # reads the result files below, writes the summary

Runs nothing itself; every number comes from a result file written by its own benchmark (whose command is given in
docs/benchmarks.md):

- ``gradient_quality.json`` (``benchmarks/gradient_quality.py``): per task and estimator, the cosine of the batch
  gradient to the reference, its 95% interval, the sampled and trained tokens per batch. At equal cost the estimator
  is compared with GRPO's budgets interpolated in log cost (sampled tokens, and the cost model with the measured
  ``r``); where a GRPO budget was measured on the same prompts and costs at least as much (``grpo_p8`` for a tree of
  8 prompts), the per-repeat paired difference and its 95% t interval are given too.
- ``regime/learning_<task>.json`` (``benchmarks/learning_efficiency.py --task <task>``, for each regime task in
  ``LEARNING_FILES`` that has run): final held-out accuracy per seed; the paired difference to ``grpo_matched`` (and
  ``grpo``, ``grpo_matched_cost``) with its 95% interval, the two-sided paired t-test's p-value, and that p-value
  Holm-corrected over the tasks (the protocol's rule, docs/regime-protocol.md).
- ``credit_diagnostics.json`` and the regime policies' ``regime/credit_diagnostics_*.json``
  (``benchmarks/credit_diagnostics.py``, ``RANKING_FILES``): the paper's ranking test, pairwise accuracy.
- ``mc_efficiency.json`` (``benchmarks/mc_efficiency.py``): Monte Carlo tokens to reach fixed K=9's value error,
  with its 90% bootstrap interval, against the simulated K=9 point and against K=9's expected error.

Writes ``benchmarks/results/credit_at_grpo_price.json``, prints a table, and writes the plateau policy's part
(``demo_plateau``: gradient rows, GRPO's budgets, learning rows) to the shipped checkpoint's ``equal_cost.json``,
which the demo prints and plots (:mod:`mcadvantage.demo.equal_cost`).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "credit_at_grpo_price.json"
DEMO_SUMMARY = ROOT / "src" / "mcadvantage" / "demo" / "warmup_plateau" / "equal_cost.json"

#: The regime study's tasks with learning runs: their summary under benchmarks/results/.
LEARNING_FILES = {
    "demo_plateau": "regime/learning_demo_plateau.json",
    "slip_plateau": "regime/learning_slip_plateau.json",
    "long_plateau": "regime/learning_long_plateau.json",
    "sign_plateau": "regime/learning_sign_plateau.json",
}
#: Gradient task -> the ranking test (benchmarks/credit_diagnostics.py) on the same policy and prompts.
RANKING_FILES = {
    "demo": "credit_diagnostics.json",
    "demo_plateau": "regime/credit_diagnostics_plateau.json",
    "demo_plateau_hard": "regime/credit_diagnostics_plateau_hard.json",
    "long_plateau": "regime/credit_diagnostics_long_plateau.json",
    "sign_plateau": "regime/credit_diagnostics_sign_plateau.json",
}
BASES = ("grpo", "grpo_matched", "grpo_matched_cost")  # what every arm is paired with
#: Confirmation runs of the gradient measurement (docs/regime-protocol.md, amendments): task -> GRPO's two budgets
#: that bracket the contenders' costs; every other estimator of the task is a contender.
CONFIRMATION_BUDGETS = {"long_plateau_followup": ("grpo_p4", "grpo_p8")}
#: Learning arm -> the gradient-instrument row with the same estimator and settings (4 prompts per step).
ARM_TO_GRADIENT = {
    "vineppo_k4": "vineppo_k4_p4",
    "hybrid_b50": "hybrid_b0.5_k4_p4",
    "tree_d12": "tree_4x2_d0-12_p4",
}
#: What the ranking test measures for each estimator family (the diagnostics' rows): Monte Carlo at K rollouts. A
#: 4 x 2 tree ranks its 4 first-level branches by the mean of the 2 leaves below each, which is the ranking test's
#: Monte Carlo estimate at K = 2 (its second level, K = 1).
RANKING_PROXY = {
    "tree_4x2": ("vineppo_k2", "first-level branches: mean of 2 leaves each = Monte Carlo at K=2")
}


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def gradient_rows(task: str, stored: dict[str, Any], cost_ratio: float) -> list[dict[str, Any]]:
    """Every non-GRPO estimator of one task: its cosine, its cost relative to GRPO and GRPO's cosine at its cost."""
    from mcadvantage.evaluation.cost_model import cost_model_tokens
    from mcadvantage.evaluation.gradient_quality import at_equal_cost
    from mcadvantage.evaluation.stats import paired_t_test

    # The cost model at this summary's r (the records carry the r they were measured with).
    records = [
        {**r, "cost_model": cost_model_tokens(r["sampled_tokens"], r["trained_tokens"], cost_ratio)}
        for r in stored["records"]
    ]
    grpo = [r for r in records if r["estimator"].startswith("grpo_p")]
    at_tokens_by = {
        e["estimator"]: e["baseline_cosine_at_cost"]
        for e in at_equal_cost(records, cost_key="sampled_tokens")
    }
    at_cost_by = {e["estimator"]: e["baseline_cosine_at_cost"] for e in at_equal_cost(records)}
    rows = []
    for r in records:
        if r["estimator"].startswith("grpo_p"):
            continue
        cost, at_tokens, at_cost = r["cost_model"], at_tokens_by[r["estimator"]], at_cost_by[r["estimator"]]
        row = {
            "task": task,
            "estimator": r["estimator"],
            "cost_model": cost,
            "tokens_per_trained_response_vs_grpo": r["sampled_tokens"] / r["trained_tokens"],
            "gradient_cosine": r["cosine"],
            "gradient_cosine_ci": r["cosine_ci"],
            "grpo_cosine_at_equal_sampled_tokens": at_tokens,
            "grpo_cosine_at_equal_cost_model": at_cost,
            "cost_ratio_r": cost_ratio,
            "repeats": r["repeats"],
        }
        # A GRPO budget on the same prompts (same prompts per batch) that costs at least as much: a paired test.
        same = next(
            (g for g in grpo if g["prompts_per_batch"] == r["prompts_per_batch"] and "cosines" in g), None
        )
        if same is not None and "cosines" in r and same["sampled_tokens"] >= r["sampled_tokens"]:
            test = paired_t_test([a - b for a, b in zip(r["cosines"], same["cosines"], strict=True)])
            row["paired_vs_costlier_grpo"] = {
                "grpo": same["estimator"],
                "grpo_sampled_tokens": same["sampled_tokens"],
                "mean_cosine_difference": test["mean"],
                "ci95": test["ci95"],
                "p": test["p"],
            }
        rows.append(row)
    return rows


def equal_cost_bootstrap(
    contender: dict[str, Any],
    low: dict[str, Any],
    high: dict[str, Any],
    *,
    cost_key: str = "sampled_tokens",
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """The contender's mean cosine minus GRPO's at the contender's cost (``low`` and ``high``, two GRPO budgets around
    it, interpolated in log cost), with a 95% percentile interval and a two-sided p from resampling each estimator's
    per-repeat cosines independently (its batches are independent draws). The costs are taken as measured."""
    import random

    from mcadvantage.evaluation.gradient_quality import log_cost_interpolate

    rng = random.Random(seed)
    xs, ls, hs = contender["cosines"], low["cosines"], high["cosines"]

    def difference(x: list[float], lo: list[float], hi: list[float]) -> float:
        line = ((low[cost_key], statistics.fmean(lo)), (high[cost_key], statistics.fmean(hi)))
        return statistics.fmean(x) - log_cost_interpolate(contender[cost_key], line)

    draws = sorted(
        difference(rng.choices(xs, k=len(xs)), rng.choices(ls, k=len(ls)), rng.choices(hs, k=len(hs)))
        for _ in range(resamples)
    )
    below = sum(d <= 0 for d in draws) / resamples
    return {
        "mean": difference(xs, ls, hs),
        "ci95": [draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]],
        "p": min(1.0, 2 * min(below, 1 - below + sum(d == 0 for d in draws) / resamples)),
        "test": "bootstrap, GRPO interpolated in log cost",
    }


def confirmation_rows(task: str, stored: dict[str, Any], budgets: tuple[str, str]) -> list[dict[str, Any]]:
    """The protocol's decision for a confirmation run: each contender against GRPO at its sampled tokens (bootstrap
    of the log-cost interpolation between ``budgets``), or, when it costs less than the cheaper budget, against that
    budget by a paired t-test on the same prompts per repeat; Holm-corrected over the contenders."""
    from mcadvantage.evaluation.gradient_quality import at_equal_cost
    from mcadvantage.evaluation.stats import holm_adjust, paired_t_test

    by_name = {r["estimator"]: r for r in stored["records"]}
    low, high = by_name[budgets[0]], by_name[budgets[1]]
    rows = []
    for r in stored["records"]:
        if r["estimator"] in budgets:
            continue
        tokens = r["sampled_tokens"]
        if tokens < low["sampled_tokens"] and r["prompts_per_batch"] == low["prompts_per_batch"]:
            t = paired_t_test([a - b for a, b in zip(r["cosines"], low["cosines"], strict=True)])
            test = {"mean": t["mean"], "ci95": t["ci95"], "p": t["p"], "test": f"paired t vs {budgets[0]}"}
        elif low["sampled_tokens"] <= tokens <= high["sampled_tokens"]:
            test = equal_cost_bootstrap(r, low, high)
        else:
            test = {"mean": None, "ci95": None, "p": math.nan, "test": "outside GRPO's measured budgets"}
        grpo_at_cost = at_equal_cost([low, high, r])[-1]["baseline_cosine_at_cost"]
        rows.append(
            {
                "task": task,
                "estimator": r["estimator"],
                "repeats": r["repeats"],
                "sampled_tokens_vs_grpo_p4": tokens / low["sampled_tokens"],
                "cosine": r["cosine"],
                "vs_grpo_at_equal_sampled_tokens": test,
                "vs_grpo_at_equal_cost_model": None if grpo_at_cost is None else r["cosine"] - grpo_at_cost,
            }
        )
    finite = [i for i, row in enumerate(rows) if math.isfinite(row["vs_grpo_at_equal_sampled_tokens"]["p"])]
    for i, p_holm in zip(
        finite, holm_adjust([rows[i]["vs_grpo_at_equal_sampled_tokens"]["p"] for i in finite]), strict=True
    ):
        test = rows[i]["vs_grpo_at_equal_sampled_tokens"]
        test["p_holm"] = p_holm
        test["holm_family"] = len(finite)
        test["ahead"] = p_holm < 0.05 and test["mean"] > 0
    return rows


def learning_rows(learning: dict[str, Any]) -> list[dict[str, Any]]:
    """Per arm of the regime learning runs: paired final-accuracy differences to the GRPO arms, and token ratios."""
    from mcadvantage.evaluation.stats import paired_t_test

    finals: dict[str, dict[int, float]] = {}
    tokens: dict[str, dict[int, float]] = {}
    for rec in learning["records"]:
        arm, seed = rec["arm"], rec["seed"]
        if rec["step"] >= max(
            r["step"] for r in learning["records"] if r["arm"] == arm and r["seed"] == seed
        ):
            finals.setdefault(arm, {})[seed] = rec["accuracy"]
            tokens.setdefault(arm, {})[seed] = rec["sampled_tokens"]
    rows = []
    for arm in sorted(finals, key=lambda a: list(finals).index(a)):
        row: dict[str, Any] = {
            "arm": arm,
            "seeds": sorted(finals[arm]),
            "final_accuracy": statistics.fmean(finals[arm].values()),
        }
        for base in BASES:
            if base == arm or base not in finals:
                continue
            seeds = sorted(set(finals[arm]) & set(finals[base]))
            test = paired_t_test([finals[arm][s] - finals[base][s] for s in seeds])
            row[f"final_accuracy_vs_{base}"] = {
                "mean": test["mean"],
                "ci95": test["ci95"],
                "p": test["p"],
                "n": test["n"],
                "sd": test["sd"],
                # The paired difference this many seeds detect with 80% power at alpha 0.05, given the observed SD.
                "detectable_at_80_power": detectable_difference(test["sd"], test["n"]),
            }
        if "grpo" in tokens:
            seeds = sorted(set(tokens[arm]) & set(tokens["grpo"]))
            row["sampled_tokens_vs_grpo"] = statistics.fmean(
                tokens[arm][s] / tokens["grpo"][s] for s in seeds
            )
        row["gradient_row"] = ARM_TO_GRADIENT.get(arm)
        rows.append(row)
    return rows


def holm_over_tasks(learning: dict[str, list[dict[str, Any]]]) -> None:
    """Add ``p_holm`` to every paired test of ``learning`` (task -> rows): the same arm against the same base is one
    family across tasks, Holm-corrected (docs/regime-protocol.md, section 4)."""
    from mcadvantage.evaluation.stats import holm_adjust

    arms = {row["arm"] for rows in learning.values() for row in rows}
    for arm in arms:
        for base in BASES:
            tests = [
                row[f"final_accuracy_vs_{base}"]
                for rows in learning.values()
                for row in rows
                if row["arm"] == arm and f"final_accuracy_vs_{base}" in row
            ]
            family = sum(not math.isnan(t["p"]) for t in tests)  # holm_adjust leaves NaN p-values out
            for test, p in zip(tests, holm_adjust([t["p"] for t in tests]), strict=True):
                test["p_holm"] = p
                test["holm_family"] = family


def detectable_difference(sd: float, n: int, power: float = 0.8) -> float:
    """Smallest true paired difference a two-sided paired t-test at 5% detects with ``power`` with ``n`` pairs of
    standard deviation ``sd``: ``(t_0.975 + t_power) x sd / sqrt(n)`` on ``n - 1`` degrees of freedom (the usual
    approximation to the noncentral t)."""
    from mcadvantage.evaluation.stats import student_t_quantile

    if n < 2 or not math.isfinite(sd):
        return math.nan
    return (student_t_quantile(0.975, n - 1) + student_t_quantile(power, n - 1)) * sd / math.sqrt(n)


def ranking(estimator: str, diagnostics: dict[str, Any] | None) -> tuple[float | None, str | None]:
    """The ranking test's pairwise accuracy for an estimator row, and what was measured for it."""
    if diagnostics is None:
        return None, None
    rows = diagnostics["estimators"]
    m = re.match(r"vineppo_k(\d+)", estimator)

    def pairs(row: dict[str, Any]) -> str:
        return f"{int(row.get('ranking_pairs', 0))} pairs in {int(row.get('ranking_groups', 0))} states"

    if m and f"vineppo_k{m.group(1)}" in rows:
        row = rows[f"vineppo_k{m.group(1)}"]
        return row["ranking_pairwise"], f"vineppo_k{m.group(1)}; {pairs(row)}"
    for prefix, (proxy, why) in RANKING_PROXY.items():
        if estimator.startswith(prefix) and proxy in rows:
            return rows[proxy]["ranking_pairwise"], f"{proxy} ({why}); {pairs(rows[proxy])}"
    return None, None


def markdown(out: dict[str, Any], r: float) -> str:
    """The summary as Markdown tables (for ``--doc``): the gradient at equal cost per task, then the learning runs."""

    def fmt(x: float | None, spec: str = ".3f") -> str:
        return "-" if x is None else f"{x:{spec}}"

    lines = [
        f"Gradient cosine at equal cost (r = {r:.2f} measured; GRPO's budgets interpolated in log cost). The last "
        "column pairs the estimator with a GRPO budget on the same prompts that costs at least as much "
        "(mean per-repeat difference, 95% t interval).",
        "",
        "| task | estimator | sampled tokens per trained response (x GRPO) | ranking pairwise | cosine [95% CI] | "
        "GRPO, same sampled tokens | GRPO, same cost | paired vs costlier GRPO |",
        "|---|---|---:|---:|---|---:|---:|---|",
    ]
    for row in out["gradient"]:
        paired = row.get("paired_vs_costlier_grpo")
        lines.append(
            f"| {row['task']} | {row['estimator']} | {row['tokens_per_trained_response_vs_grpo']:.2f} | "
            f"{fmt(row['ranking_pairwise'])} | {row['gradient_cosine']:.3f} [{row['gradient_cosine_ci'][0]:.3f}, "
            f"{row['gradient_cosine_ci'][1]:.3f}] | {fmt(row['grpo_cosine_at_equal_sampled_tokens'])} | "
            f"{fmt(row['grpo_cosine_at_equal_cost_model'])} | "
            + (
                f"{paired['mean_cosine_difference']:+.3f} [{paired['ci95'][0]:+.3f}, {paired['ci95'][1]:+.3f}] vs "
                f"{paired['grpo']}"
                if paired
                else ""
            )
            + " |"
        )
    for task, rows in out.get("confirmation", {}).items():
        lines += [
            "",
            f"Confirmation run `{task}` (protocol amendment): each contender against GRPO at its sampled tokens "
            "(GRPO's 4 and 8 prompts interpolated in log tokens, bootstrap interval; or, when it costs less than 4 "
            "prompts, paired with them), Holm-corrected over the contenders; the cost model beside, not decided on.",
            "",
            "| estimator | repeats | sampled tokens x GRPO p4 | cosine | vs GRPO, same sampled tokens [95% CI] | test "
            "| p (Holm) | ahead | vs GRPO, same cost model |",
            "|---|---:|---:|---:|---|---|---:|---|---:|",
        ]
        for row in rows:
            t = row["vs_grpo_at_equal_sampled_tokens"]
            diff = (
                "-" if t["mean"] is None else f"{t['mean']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}]"
            )
            lines.append(
                f"| {row['estimator']} | {row['repeats']} | {row['sampled_tokens_vs_grpo_p4']:.2f} | "
                f"{row['cosine']:.3f} | {diff} | {t['test']} | {t['p']:.3f} ({t.get('p_holm', math.nan):.3f}) | "
                f"{'yes' if t.get('ahead') else 'no'} | {fmt(row['vs_grpo_at_equal_cost_model'], '+.3f')} |"
            )
    for task, rows in out["learning"].items():
        lines += [
            "",
            f"Learning runs from the plateau checkpoint (`{task}`): final held-out accuracy, paired by seed "
            "(mean difference, 95% t interval, two-sided p; Holm-corrected over the tasks in brackets where more "
            "than one task has run).",
            "",
            "| arm | seeds | final accuracy | vs `grpo` | vs `grpo_matched` | vs `grpo_matched_cost` | sampled tokens x GRPO "
            "| detectable vs `grpo_matched` (80% power) |",
            "|---|---:|---:|---|---|---|---:|---:|",
        ]

        def test(row: dict[str, Any], base: str) -> str:
            t = row.get(f"final_accuracy_vs_{base}")
            if not t:
                return ""
            holm = f" (Holm {t['p_holm']:.2f})" if t.get("holm_family", 1) > 1 else ""
            return f"{t['mean']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}], p {t['p']:.2f}{holm}"

        for row in rows:
            lines.append(
                f"| `{row['arm']}` | {len(row['seeds'])} | {row['final_accuracy']:.3f} | {test(row, 'grpo')} | "
                f"{test(row, 'grpo_matched')} | {test(row, 'grpo_matched_cost')} | "
                f"{row.get('sampled_tokens_vs_grpo', float('nan')):.2f} | "
                + (
                    f"{row['final_accuracy_vs_grpo_matched']['detectable_at_80_power']:.3f}"
                    if row.get("final_accuracy_vs_grpo_matched")
                    else ""
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


def _mc_tokens_to_k9(mc: dict | None) -> list[dict[str, Any]]:
    """From mc_efficiency.json: the tokens free samples and variance allocation need to reach fixed K=9's error."""
    return [
        {
            "task": o["task"],
            "family": o["family"],
            "ratio": o["tokens_ratio_vs_k9_at_equal_error"],
            "ci90": o.get("tokens_ratio_ci90"),
            # Against fixed K=9's expected error instead of its simulated point (no noise in the target).
            "ratio_vs_expected_k9": o.get("tokens_ratio_vs_expected_k9"),
            "ci90_vs_expected_k9": o.get("tokens_ratio_vs_expected_k9_ci90"),
            "repeats": o["repeats"],
        }
        for o in (mc or {}).get("options", [])
        if o["k"] == 9 and o["family"] in ("reuse", "variance")
    ]


def _write_demo_summary(out: dict[str, Any], gq: dict[str, Any], gradient: list[dict], r: float) -> None:
    """The demo's plateau task's part, for the demo's equal-cost answer (``DEMO_SUMMARY``)."""
    from mcadvantage.evaluation.cost_model import cost_model_tokens

    demo = {
        "command": out["command"],
        "cost_ratio": r,
        "gradient": [row for row in gradient if row["task"] == "demo_plateau"],
        "grpo_budgets": [
            {"estimator": g["estimator"], "cost_model": cost_model_tokens(g["sampled_tokens"], g["trained_tokens"], r),
             "cosine": g["cosine"], "cosine_ci": g["cosine_ci"]}
            for g in gq["tasks"]["demo_plateau"]["records"]
            if g["estimator"].startswith("grpo_p")
        ],
        "learning": out["learning"].get("demo_plateau", []),
    }  # fmt: skip
    DEMO_SUMMARY.write_text(json.dumps(demo, indent=2) + "\n", encoding="utf-8")


def _print_tables(out: dict[str, Any], r: float) -> None:
    """The gradient rows at equal cost and the learning rows against GRPO at equal tokens."""
    gradient = out["gradient"]
    print(f"gradient cosine at equal cost (r = {r:.2f}); GRPO interpolated between its measured budgets")
    print(f"{'task':<13} {'estimator':<24} {'tok/resp x GRPO':>15} {'cosine':>7} {'GRPO same tokens':>16} "
          f"{'GRPO same cost':>14} {'paired vs costlier GRPO':>30}")  # fmt: skip
    for row in gradient:
        paired = row.get("paired_vs_costlier_grpo")
        paired_text = (
            f"{paired['mean_cosine_difference']:+.3f} [{paired['ci95'][0]:+.3f}, {paired['ci95'][1]:+.3f}]"
            if paired
            else "-"
        )

        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        print(
            f"{row['task']:<13} {row['estimator']:<24} {row['tokens_per_trained_response_vs_grpo']:>15.2f} "
            f"{row['gradient_cosine']:>7.3f} {fmt(row['grpo_cosine_at_equal_sampled_tokens']):>16} "
            f"{fmt(row['grpo_cosine_at_equal_cost_model']):>14} {paired_text:>30}"
        )
    for task, rows in out["learning"].items():
        for row in rows:
            vs = row.get("final_accuracy_vs_grpo_matched")
            text = (
                ""
                if not vs
                else f"vs grpo_matched {vs['mean']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}] "
                f"p={vs['p']:.3f} (Holm {vs['p_holm']:.3f})"
            )
            print(
                f"learning {task} {row['arm']:<18} n={len(row['seeds'])} final {row['final_accuracy']:.3f} {text}"
            )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--doc", default=None, help="also write the tables between this file's results markers"
    )
    args = parser.parse_args(argv)
    gq = _load("gradient_quality.json")
    if gq is None:
        raise SystemExit(
            "benchmarks/results/gradient_quality.json is missing: run benchmarks/gradient_quality.py first."
        )

    r = gq["cost_ratio"]["cost_ratio"]
    diagnostics = {task: _load(name) for task, name in RANKING_FILES.items()}
    gradient = []
    for task, stored in gq["tasks"].items():
        for row in gradient_rows(task, stored, r):
            row["ranking_pairwise"], row["ranking_measured_as"] = ranking(
                row["estimator"], diagnostics.get(task)
            )
            gradient.append(row)
    learning = {task: learning_rows(runs) for task, name in LEARNING_FILES.items() if (runs := _load(name))}
    confirmation = {
        task: confirmation_rows(task, gq["tasks"][task], budgets)
        for task, budgets in CONFIRMATION_BUDGETS.items()
        if task in gq["tasks"] and {r["estimator"] for r in gq["tasks"][task]["records"]} >= set(budgets)
    }
    holm_over_tasks(learning)
    out = {
        "command": "python benchmarks/credit_at_grpo_price.py",
        "sources": {
            "gradient": "benchmarks/results/gradient_quality.json",
            "learning": {task: f"benchmarks/results/{LEARNING_FILES[task]}" for task in learning},
            "ranking": {
                task: f"benchmarks/results/{name}"
                for task, name in RANKING_FILES.items()
                if diagnostics[task] is not None
            },
            "mc_efficiency": "benchmarks/results/mc_efficiency.json",
        },  # fmt: skip
        "gradient": gradient,
        "confirmation": confirmation,
        "learning": learning,
        "mc_tokens_to_reach_k9_error": _mc_tokens_to_k9(_load("mc_efficiency.json")),
    }
    OUT.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    if "demo_plateau" in gq["tasks"]:
        _write_demo_summary(out, gq, gradient, r)
    _print_tables(out, r)
    print(f"wrote {OUT.relative_to(ROOT)}")
    if args.doc:
        from mcadvantage.evaluation.report import replace_between_markers

        if not replace_between_markers(args.doc, "credit_at_grpo_price", markdown(out, r)):
            raise SystemExit(
                f"--doc {args.doc}: no '<!-- credit_at_grpo_price results: start/end -->' markers"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
