"""The credit map, tuned: every arm picks its learning rate and batch from one grid on held-out seeds, then 24 paired
evaluation seeds, at 1/4, 1/2 and 1x of the budget (issue 51; protocol: docs/credit-map-tuned-protocol.md).

    python benchmarks/credit_map_tuned.py run          # scout, the map's cells, then the hard cell once it is fixed
    python benchmarks/credit_map_tuned.py scout        # the hard variant's scout alone, and the candidate it picks
    python benchmarks/credit_map_tuned.py report       # JSON and the page's lead from whatever runs have finished
    python benchmarks/credit_map_tuned.py rerun --arms anchor_pool_state   # re-run committed runs, compare them

Each run trains one arm (:data:`testbed.credit_map.TUNED_ARMS`) at one grid point (lr, batch) with one seed on one
cell, once at the whole budget; its results at 1/4 and 1/2 are the same run's prefix (the policy after the last update
that fits). One record per run, ``<cell>/<arm>/lr<lr>_p<prompts>_s<seed>.json`` in the archive of
``benchmarks/results/credit_map_tuned_runs`` (``benchmarks/_runs.py``; settings, the
three budgets' results, commit, versions, CPU, threads); a run whose record exists with the same settings is not run
again, so the runner resumes where it stopped. It prints a progress line (runs done / planned, elapsed, estimate).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/credit_map_tuned.py` has only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from _runs import append_run, load_runs, run_keys  # noqa: E402  (beside this file)

from mcadvantage.evaluation.stats import holm_adjust, paired_t_test  # noqa: E402

RUNS = ROOT / "benchmarks" / "results" / "credit_map_tuned_runs"
SUMMARY = ROOT / "benchmarks" / "results" / "credit_map_tuned.json"
RERUN = ROOT / "benchmarks" / "results" / "credit_map_tuned_rerun.json"
HARD_CHOICE = RUNS / "hard_variant.json"

#: The protocol's grid, seeds and budgets (docs/credit-map-tuned-protocol.md).
LRS = (0.03, 0.1, 0.3, 1.0, 3.0)
PROMPTS = (1, 2, 4)
GROUP = 4
TUNING_SEEDS = (1000, 1001, 1002)
EVAL_SEEDS = tuple(range(24))
FRACTIONS = (0.25, 0.5, 1.0)
ALPHA = 0.05
#: The verdict rule's minimum effect (the protocol's amendment of 2026-12-07, as in docs/lm-stability-protocol.md's
#: "Minimum effects"): a paired difference in success smaller than this is "level" whatever its p.
MIN_EFFECT = 0.05
MAP_BUDGET, HARD_BUDGET = 240, 320
HARD_CEILING = 0.7  # the scout's rule: tuned GRPO's mean at 1x at most this


def _cell(structure: str, horizon: int, rate: float, **extra: Any) -> dict[str, Any]:
    cell = {"parameterization": "shared", "structure": structure, "horizon": horizon, "start_rate": rate,
            "budget_episodes": MAP_BUDGET, "choices": 4, "decisive": 1, "reward_noise": 0.0}  # fmt: skip
    cell.update(extra)
    if structure == "gauntlet":
        name = (f"gauntlet_H{horizon}_D{cell['decisive']}_A{cell['choices']}_e{cell['reward_noise']:g}"
                f"_r{rate:g}")  # fmt: skip
    else:
        name = f"shared_{structure}_H{horizon}_r{rate:g}"
    return {"name": name, **cell}


#: Stage map, in the protocol's order.
MAP_CELLS = (
    _cell("delayed", 16, 0.15),
    _cell("recovery", 16, 0.15),
    _cell("delayed", 16, 0.5),
    _cell("recovery", 16, 0.5),
    _cell("delayed", 2, 0.15),
    _cell("recovery", 2, 0.15),
)
#: The hard variant's scout candidates, in the protocol's order.
HARD_CANDIDATES = tuple(
    _cell("gauntlet", h, rate, decisive=d, choices=8, reward_noise=eps, budget_episodes=HARD_BUDGET)
    for h, d, eps, rate in ((16, 4, 0.1, 0.05), (16, 4, 0.2, 0.02), (32, 8, 0.2, 0.02))
)


def arm_order() -> list[str]:
    """The arms in run order: ``grpo`` (the comparison) and the oracle first, then the protocol's order."""
    from testbed.credit_map import TUNED_ARMS

    rest = [a for a in TUNED_ARMS if a not in ("grpo", "oracle")]
    return ["grpo", "oracle", *rest]


# -- one run ------------------------------------------------------------------------------------------------------


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "testbed", "benchmarks/*.py"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


_MACHINE: dict[str, Any] = {}


def machine() -> dict[str, Any]:
    """Commit, versions, CPU and threads (benchmarks/_machine.py), read once per process."""
    if not _MACHINE:
        from _machine import machine_info

        info = machine_info(commit=_commit())
        _MACHINE.update(
            {k: info[k] for k in ("commit", "python", "torch", "cpu", "cpu_count", "torch_threads")}
        )
    return _MACHINE


def settings(cell: dict[str, Any], arm: str, lr: float, prompts: int, seed: int) -> dict[str, Any]:
    return {"cell": cell["name"], "arm": arm, "lr": lr, "prompts": prompts, "group": GROUP, "seed": seed,
            "budget_episodes": cell["budget_episodes"]}  # fmt: skip


def budget_results(run: Any, budget_tokens: int) -> dict[str, dict[str, float]]:
    """Per budget fraction: the exact success after the last update that fits, the updates and tokens spent."""
    out = {}
    for f in FRACTIONS:
        limit = f * budget_tokens
        spent, success = max(((s, v) for s, v in run.curve if s <= limit), key=lambda sv: sv[0])
        steps = sum(1 for u in run.update_tokens if u <= limit)
        out[f"{f:g}"] = {"success": success, "steps": steps, "sampled_tokens": spent}
    return out


def train(cell: dict[str, Any], arm: str, lr: float, prompts: int, seed: int) -> dict[str, Any]:
    """Train one run and return its record (not written)."""
    from testbed.agent_credit import train_arm
    from testbed.credit_map import TUNED_ARMS, GauntletTask

    task = None
    if cell["structure"] == "gauntlet":
        task = GauntletTask(cell["horizon"], cell["decisive"], choices=cell["choices"])
    start = time.perf_counter()
    run = train_arm(
        cell["structure"], cell["horizon"], cell["start_rate"], TUNED_ARMS[arm], seed,
        budget_episodes=cell["budget_episodes"], parameterization=cell["parameterization"], lr=lr,
        credit_episodes_per_batch=0, task=task, batch_shape=(prompts, GROUP), reward_noise=cell["reward_noise"],
    )  # fmt: skip
    return {
        "settings": settings(cell, arm, lr, prompts, seed),
        "start": run.start_success,
        "budgets": budget_results(run, cell["budget_episodes"] * cell["horizon"]),
        "seconds": round(time.perf_counter() - start, 3),
        "machine": machine(),
    }


# -- records -----------------------------------------------------------------------------------------------------


def run_key(cell_name: str, arm: str, lr: float, prompts: int, seed: int) -> str:
    """The name of one run's record in the run directory's archive (``benchmarks/_runs.py``)."""
    return f"{cell_name}/{arm}/lr{lr:g}_p{prompts}_s{seed}.json"


def load_arm(root: Path, cell_name: str, arm: str) -> dict[tuple[float, int, int], dict[str, Any]]:
    """The arm's records on the cell keyed by (lr, prompts, seed); a record without its settings is skipped (it
    runs again)."""
    out: dict[tuple[float, int, int], dict[str, Any]] = {}
    for rec in load_runs(root, f"{cell_name}/{arm}/*.json").values():
        try:
            s = rec["settings"]
            out[(float(s["lr"]), int(s["prompts"]), int(s["seed"]))] = rec
        except (KeyError, TypeError):
            continue
    return out


class Runner:
    """Runs what is missing and appends each record as one line; prints a progress line as it goes."""

    def __init__(self, root: Path, planned: int, *, quiet: bool = False) -> None:
        self.root, self.planned, self.quiet = root, planned, quiet
        self.done = self.ran = 0
        self.t0 = time.perf_counter()

    def ensure(
        self, cell: dict[str, Any], arm: str, points: Iterable[tuple[float, int]], seeds: Sequence[int]
    ):
        """Every (point, seed) of ``arm`` on ``cell`` recorded; returns the arm's records."""
        have = load_arm(self.root, cell["name"], arm)
        for lr, prompts in points:
            for seed in seeds:
                self.done += 1
                rec = have.get((lr, prompts, seed))
                if rec is not None and rec["settings"] == settings(cell, arm, lr, prompts, seed):
                    continue
                rec = train(cell, arm, lr, prompts, seed)
                append_run(self.root, run_key(cell["name"], arm, lr, prompts, seed), rec)
                have[(lr, prompts, seed)] = rec
                self.ran += 1
                self._progress(cell["name"], arm)
        return have

    def _progress(self, cell: str, arm: str) -> None:
        if self.quiet or self.ran % 20:
            return
        elapsed = time.perf_counter() - self.t0
        left = max(self.planned - self.done, 0) * elapsed / max(self.ran, 1)
        print(f"[credit_map_tuned] {self.done}/{self.planned} runs ({self.ran} new) {cell} {arm} "
              f"elapsed {elapsed / 60:.1f} min, about {left / 60:.0f} min left (upper bound)", flush=True)  # fmt: skip


# -- tuning ------------------------------------------------------------------------------------------------------

GRID = tuple((lr, p) for lr in LRS for p in PROMPTS)


def choose(records: dict[tuple[float, int, int], dict[str, Any]], fraction: float) -> dict[str, Any] | None:
    """The protocol's rule: among the grid points that update at least once within the budget fraction on every
    tuning seed, the highest mean exact success over the tuning seeds; ties -> smaller lr, then smaller batch.
    None when no point affords an update (or the tuning runs are not all recorded)."""
    key = f"{fraction:g}"
    best: tuple[float, float, int] | None = None
    for lr, prompts in GRID:
        recs = [records.get((lr, prompts, s)) for s in TUNING_SEEDS]
        if any(r is None for r in recs):
            return None
        if any(r["budgets"][key]["steps"] < 1 for r in recs):
            continue
        mean = statistics.fmean(r["budgets"][key]["success"] for r in recs)
        cand = (-mean, lr, prompts)
        if best is None or cand < best:
            best = cand
    if best is None:
        return None
    return {"lr": best[1], "prompts": best[2], "group": GROUP, "tuning_mean": -best[0]}


def tuned_points(records: dict[tuple[float, int, int], dict[str, Any]]) -> list[tuple[float, int]]:
    """The distinct grid points chosen at the three budgets (those the evaluation seeds run)."""
    points = []
    for f in FRACTIONS:
        c = choose(records, f)
        if c is not None and (c["lr"], c["prompts"]) not in points:
            points.append((c["lr"], c["prompts"]))
    return points


def run_cell(runner: Runner, cell: dict[str, Any], arms: Sequence[str]) -> None:
    for arm in arms:
        records = runner.ensure(cell, arm, GRID, TUNING_SEEDS)
        runner.ensure(cell, arm, tuned_points(records), EVAL_SEEDS)


def scout(root: Path) -> dict[str, Any]:
    """The hard variant's scout: ``grpo`` over the grid on the tuning seeds for every candidate, and the candidate
    the protocol's rule picks."""
    runner = Runner(root, len(HARD_CANDIDATES) * len(GRID) * len(TUNING_SEEDS))
    rows = []
    for cell in HARD_CANDIDATES:
        records = runner.ensure(cell, "grpo", GRID, TUNING_SEEDS)
        rows.append({"cell": cell, "tuned_grpo": choose(records, 1.0)})
    chosen = next((r for r in rows if r["tuned_grpo"]["tuning_mean"] <= HARD_CEILING), None)
    if chosen is None:
        chosen = min(rows, key=lambda r: r["tuned_grpo"]["tuning_mean"])
    result = {"rule": f"first candidate whose tuned GRPO mean at 1x <= {HARD_CEILING}, else the lowest",
              "candidates": rows, "chosen": chosen["cell"]}  # fmt: skip
    (root / "hard_scout.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def hard_cell_if_fixed() -> dict[str, Any] | None:
    """The hard cell, once its choice file is committed unchanged (the protocol's amendment); None before."""
    if not HARD_CHOICE.exists():
        return None
    rel = str(HARD_CHOICE.relative_to(ROOT))
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", rel], cwd=ROOT, capture_output=True)
    clean = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", rel], cwd=ROOT)
    if tracked.returncode != 0 or clean.returncode != 0:
        return None
    return json.loads(HARD_CHOICE.read_text())["chosen"]


def planned_runs(cells: int) -> int:
    """Runs of ``cells`` cells: the tuning grid, and the evaluation seeds at up to three chosen points."""
    return cells * len(arm_order()) * (len(GRID) * len(TUNING_SEEDS) + 3 * len(EVAL_SEEDS))


def run_all(root: Path, cells: Sequence[dict[str, Any]], arms: Sequence[str]) -> int:
    """Scout, the map's cells, and the hard cell when its choice is committed; returns the runs made."""
    made = 0
    result = scout(root)
    print(f"[credit_map_tuned] scout: the rule picks {result['chosen']['name']}", flush=True)
    runner = Runner(root, planned_runs(len(cells) + 1))
    print(f"[credit_map_tuned] planned at most {runner.planned} runs (upper bound: 3 chosen points per arm)")
    for cell in cells:
        run_cell(runner, cell, arms)
    hard = hard_cell_if_fixed()
    if hard is None:
        print("[credit_map_tuned] the hard cell is not fixed yet (no committed hard_variant.json): not run")
    else:
        run_cell(runner, hard, arms)
    made += runner.ran
    print(f"[credit_map_tuned] done: {made} new runs in {(time.perf_counter() - runner.t0) / 60:.1f} min")
    return made


# -- re-runs against the records --------------------------------------------------------------------------------


def run_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A run record's results, flat: the start, and per budget fraction the success, updates and sampled tokens."""
    out: dict[str, Any] = {"start": record["start"]}
    for f, r in record["budgets"].items():
        out.update(
            {
                f"success_{f}": r["success"],
                f"steps_{f}": r["steps"],
                f"sampled_tokens_{f}": r["sampled_tokens"],
            }
        )
    return out


def run_rules() -> dict[str, Any]:
    """How a re-run compares with its record (benchmarks/_records.py): float64 success within relative 1e-9 (the
    exact toy's rule), updates and sampled tokens exactly."""
    from _records import EXACT, FLOAT64

    rules: dict[str, Any] = {"start": FLOAT64}
    for f in FRACTIONS:
        rules.update({f"success_{f:g}": FLOAT64, f"steps_{f:g}": EXACT, f"sampled_tokens_{f:g}": EXACT})
    return rules


def pick_reruns(root: Path, cells: Sequence[dict[str, Any]], arms: Sequence[str], per_cell: int, seed: int):
    """Which committed runs to re-run: per (cell, arm), evaluation seed 0 at each point the arm chose, and
    ``per_cell`` more drawn from all its runs (tuning and evaluation) with ``random.Random(seed)``."""
    import random

    rng = random.Random(seed)
    picks = []
    for cell in cells:
        for arm in arms:
            records = load_arm(root, cell["name"], arm)
            keys = [(lr, p, EVAL_SEEDS[0]) for lr, p in tuned_points(records)]
            others = sorted(k for k in records if k not in keys)
            keys += rng.sample(others, min(per_cell, len(others)))
            picks += [(cell, arm, records[k]) for k in keys if k in records]
    return picks


def rerun(root: Path, cells: Sequence[dict[str, Any]], arms: Sequence[str], *, per_cell: int = 1,
          seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Re-run committed runs (:func:`pick_reruns`) with the code as it is now and compare each with its record within
    :func:`run_rules`; returns the tally (:class:`_records.Comparison`), the runs and this machine."""
    from _records import Comparison

    picks = pick_reruns(root, cells, arms, per_cell, seed)
    tally, runs = Comparison(), []
    t0 = time.perf_counter()
    for k, (cell, arm, record) in enumerate(picks, 1):
        s = record["settings"]
        new = train(cell, arm, s["lr"], s["prompts"], s["seed"])
        label = f"{arm} lr {s['lr']:g} x {s['prompts']} seed {s['seed']} on {cell['name']}"
        ok = tally.add(
            label, run_fields(new), {**run_fields(record), "environment": record["machine"]}, run_rules()
        )
        runs.append({"run": label, "within": ok, "record": run_fields(record), "rerun": run_fields(new)})
        if k % 10 == 0 or k == len(picks):
            print(f"[credit_map_tuned] rerun {k}/{len(picks)}: {tally.summary()}, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    return {"comparison": tally.as_dict(), "summary": tally.summary(), "per_arm": per_arm_tally(runs),
            "runs": runs, "machine": machine(), "arms": list(arms), "cells": [c["name"] for c in cells],
            "per_cell": per_cell, "seed": seed}  # fmt: skip


def per_arm_tally(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: re-runs, how many equal their record in every field, how many are within tolerance, the largest
    absolute difference of any field."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        t = out.setdefault(r["run"].split()[0], {"runs": 0, "identical": 0, "within": 0, "largest": 0.0})
        d = max(abs(r["rerun"][k] - r["record"][k]) for k in r["record"])
        t["runs"] += 1
        t["identical"] += d == 0
        t["within"] += bool(r["within"])
        t["largest"] = max(t["largest"], d)
    return out


def compare_runs(root: Path, committed: Path, arms: Sequence[str]) -> dict[str, Any]:
    """Every run of ``arms`` under ``root`` against its committed record (:func:`run_rules`): runs, identical,
    within the rule, the largest difference of any field, and whether every count (updates, tokens) is equal."""
    from _records import Comparison

    tally, identical, counts = Comparison(), 0, True
    for cell_name, arm in sorted({tuple(k.split("/")[:2]) for k in run_keys(root, "*/*/*.json")}):
        if arm not in arms:
            continue
        old = load_arm(committed, cell_name, arm)
        for key, rec in load_arm(root, cell_name, arm).items():
            new, ref = run_fields(rec), run_fields(old[key]) if key in old else None
            tally.add(f"{arm} {key} on {cell_name}", new, ref, run_rules())
            identical += ref is not None and new == ref
            counts &= ref is not None and all(new[k] == ref[k] for k in new if not k.startswith("success"))
    worst = max((difference(o) for o in tally.outside), default=tally.largest)
    return {"runs": tally.found, "identical": identical, "within": tally.within, "largest": worst,
            "counts_equal": counts}  # fmt: skip


def difference(outside: dict[str, Any]) -> float:
    """The largest difference named in one :class:`_records.Comparison` outside entry ("a against the record's b")."""
    out = 0.0
    for field in outside["fields"]:
        new, old = field.split(": ", 1)[1].split(" (")[0].split(" against the record's ")
        out = max(out, abs(float(new) - float(old)))
    return out


def compare_summaries(new: dict[str, Any], old: dict[str, Any], arms: Sequence[str]) -> dict[str, Any]:
    """``arms``' (setting, budget) records of a summary from re-run records against the committed one: records whose
    chosen point, seeds or verdict differ, and the largest absolute difference of a success, mean or gap."""

    def index(summary: dict[str, Any]) -> dict[tuple[str, float, str], dict[str, Any]]:
        return {
            (r["setting"], r["budget_fraction"], r["arm"]): r for r in summary["records"] if r["arm"] in arms
        }

    a, b = index(new), index(old)
    changed, largest = [], 0.0
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            changed.append(f"{key}: on one side only")
            continue
        vx, vy = x.get("vs_best_grpo") or {}, y.get("vs_best_grpo") or {}
        if (x["chosen"], x["seeds"], vx.get("verdict")) != (y["chosen"], y["seeds"], vy.get("verdict")):
            changed.append(f"{key}: chosen {x['chosen']} / {y['chosen']}, verdict {vx.get('verdict')} / "
                           f"{vy.get('verdict')}")  # fmt: skip
            continue
        pairs = [*zip(x["success"], y["success"], strict=True), (x.get("mean"), y.get("mean")),
                 (vx.get("mean"), vy.get("mean"))]  # fmt: skip
        largest = max([largest, *(abs(p - q) for p, q in pairs if p is not None and q is not None)])
    return {"records": len(b), "changed": changed, "largest": largest, "arms": list(arms)}


# -- the summary -------------------------------------------------------------------------------------------------

#: Standardised effects (mean / SD of the paired differences) with 80% power at 24 seeds (the protocol's
#: simulation): at alpha 0.05 (Holm's last step) and at 0.05 / 14 (its first).
EFFECT_80 = {"last_holm_step": 0.60, "first_holm_step": 0.86}


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), digits)


def arm_record(cell: dict[str, Any], fraction: float, arm: str, records: dict) -> dict[str, Any]:
    """One (setting, budget fraction, arm) record: the chosen point, its evaluation seeds' results, collapses."""
    key = f"{fraction:g}"
    chosen = choose(records, fraction)
    tuning_done = all((lr, p, s) in records for lr, p in GRID for s in TUNING_SEEDS)
    base = {
        "setting": cell["name"],
        "budget_fraction": fraction,
        "arm": arm,
        "tuning_seeds": list(TUNING_SEEDS),
    }
    if chosen is None:
        status = "cannot afford" if tuning_done else "not run"
        return {**base, "status": status, "chosen": None, "seeds": [], "success": [], "sampled_tokens": [],
                "steps": [], "collapsed": [], "start": cell["start_rate"]}  # fmt: skip
    runs = [records.get((chosen["lr"], chosen["prompts"], s)) for s in EVAL_SEEDS]
    done = [(s, r) for s, r in zip(EVAL_SEEDS, runs, strict=True) if r is not None]
    success = [r["budgets"][key]["success"] for _, r in done]
    start = done[0][1]["start"] if done else cell["start_rate"]
    return {
        **base,
        "status": "complete" if len(done) == len(EVAL_SEEDS) else "partial",
        "chosen": {"lr": chosen["lr"], "prompts": chosen["prompts"], "group": chosen["group"]},
        "tuning_mean": _r(chosen["tuning_mean"], 6),
        "seeds": [s for s, _ in done],
        "success": success,
        "sampled_tokens": [r["budgets"][key]["sampled_tokens"] for _, r in done],
        "steps": [r["budgets"][key]["steps"] for _, r in done],
        "collapsed": [v < start - 1e-9 for v in success],
        "start": start,
        "mean": _r(statistics.fmean(success), 6) if success else None,
        "collapse_rate": _r(sum(v < start - 1e-9 for v in success) / len(success)) if success else None,
    }


def _versus(rec: dict[str, Any], grpo: dict[str, Any]) -> dict[str, Any] | None:
    """Paired difference to tuned GRPO over the seeds both have (complete records only)."""
    if rec["status"] != "complete" or grpo["status"] != "complete":
        return None
    diffs = [a - b for a, b in zip(rec["success"], grpo["success"], strict=True)]
    test = paired_t_test(diffs)
    return {"n": test["n"], "mean": _r(test["mean"], 6), "sd": _r(test["sd"], 6),
            "ci95": [_r(test["ci95"][0], 6), _r(test["ci95"][1], 6)], "p": test["p"]}  # fmt: skip


def decide(group: list[dict[str, Any]]) -> bool:
    """Holm over the (cell, budget) family: the non-GRPO arms that afford a batch. Only when every one of them
    and GRPO are complete; otherwise every verdict stays "pending". Returns whether the family was tested."""
    grpo = next(r for r in group if r["arm"] == "grpo")
    family = [r for r in group if r["arm"] != "grpo" and r["status"] != "cannot afford"]
    for r in family:
        r["vs_best_grpo"] = _versus(r, grpo)
    if grpo["status"] != "complete" or any(r["vs_best_grpo"] is None for r in family):
        for r in family:
            if r["vs_best_grpo"] is not None:
                r["vs_best_grpo"]["verdict"] = "pending"
        return False
    adjusted = holm_adjust([r["vs_best_grpo"]["p"] for r in family])
    for r, p in zip(family, adjusted, strict=True):
        v = r["vs_best_grpo"]
        v["p_holm"] = _r(p, 6)
        v["verdict"] = verdict(v["mean"], p)
        v["p"] = _r(v["p"], 6)
    return True


def verdict(mean: float, p_holm: float) -> str:
    """``pays`` / ``loses`` when Holm's p is below :data:`ALPHA` and the difference reaches :data:`MIN_EFFECT`
    (the protocol's amendment of 2026-12-07); ``level`` otherwise, whatever the p."""
    if p_holm >= ALPHA or abs(mean) < MIN_EFFECT:
        return "level"
    return "pays" if mean > 0 else "loses"


def summarize(root: Path) -> dict[str, Any]:
    """Every (setting, budget fraction, arm) record of the map's cells and the hard cell, from the run records."""
    hard = hard_cell_if_fixed()
    cells = [*MAP_CELLS, *([hard] if hard else [])]
    records, settings_rows = [], []
    for cell in cells:
        per_arm = {arm: load_arm(root, cell["name"], arm) for arm in arm_order()}
        tested = {}
        for f in FRACTIONS:
            group = [arm_record(cell, f, arm, per_arm[arm]) for arm in arm_order()]
            tested[f"{f:g}"] = decide(group)
            records.extend(group)
        statuses = {r["status"] for r in records if r["setting"] == cell["name"]}
        done = statuses <= {"complete", "cannot afford"}
        started = bool(statuses - {"not run"})
        settings_rows.append({**cell, "status": "complete" if done else ("partial" if started else "not run"),
                              "tested": tested})  # fmt: skip
    scout_path = root / "hard_scout.json"
    return {
        "rerun": rerun_digest(),
        "hybrid_budget": hybrid_budget_digest(root, cells),
        "protocol": "docs/credit-map-tuned-protocol.md",
        "grid": {"lr": list(LRS), "prompts": list(PROMPTS), "group": GROUP},
        "tuning_seeds": list(TUNING_SEEDS),
        "eval_seeds": list(EVAL_SEEDS),
        "budget_fractions": list(FRACTIONS),
        "alpha": ALPHA,
        "min_effect": MIN_EFFECT,
        "effect_80": EFFECT_80,
        "hard_scout": json.loads(scout_path.read_text()) if scout_path.exists() else None,
        "settings": settings_rows,
        "records": records,
    }


def _bought_nothing(run: dict[str, Any], horizon: int) -> bool:
    """Whether a hybrid run spent exactly GRPO's tokens at every budget (its episodes' ``H`` tokens each): no state
    got a Monte Carlo continuation."""
    s = run["settings"]
    return all(
        b["sampled_tokens"] == b["steps"] * s["prompts"] * s["group"] * horizon
        for b in run["budgets"].values()
    )


def hybrid_budget_digest(root: Path, cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``hybrid`` arm before and after the per-state budget (protocol amendment of 2026-11-29 06:52 UTC): per
    version, its runs and how many bought no state (spent exactly GRPO's tokens). The per-response runs are kept in
    ``<cell>/hybrid_per_response/``, outside every family."""
    out = {}
    for version, name in (("per_response", "hybrid_per_response"), ("per_state", "hybrid")):
        runs = [(r, c["horizon"]) for c in cells for r in load_arm(root, c["name"], name).values()]
        out[version] = {"runs": len(runs), "bought_nothing": sum(_bought_nothing(r, h) for r, h in runs)}
    return out


def rerun_digest(path: Path = RERUN) -> dict[str, Any] | None:
    """What the page says of the re-runs with the code as it is now (``rerun`` and ``compare``), or None."""
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    full = r.get("full_rerun")
    return {
        "summary": r["summary"],
        "per_arm": r["per_arm"],
        "commit": r["machine"]["commit"],
        "full_rerun": None
        if full is None
        else {k: full[k] for k in ("records", "changed", "largest", "arms", "runs")},
    }


def report(root: Path) -> dict[str, Any]:
    """The summary JSON and the page's lead, from whatever runs have finished."""
    summary = summarize(root)
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
    write_page(summary)
    write_readme(summary)
    return summary


README = ROOT / "README.md"
README_BEGIN = "<!-- tuned agent map: generated by benchmarks/credit_map_tuned.py report -->"
README_END = "<!-- end of the tuned agent map -->"


def write_readme(summary: dict[str, Any], readme: Path = README) -> None:
    """Replace the README's agent bullet (between its markers) with :func:`readme_bullet`."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(
            f"{readme} lacks the markers {README_BEGIN!r} ... {README_END!r} around the agent bullet."
        )
    head, rest = text.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    bullet = textwrap.fill(readme_bullet(summary), width=116, subsequent_indent="  ", break_on_hyphens=False)
    readme.write_text(f"{head}{README_BEGIN}\n{bullet}\n{README_END}{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("run", "scout", "report", "rerun", "compare"))
    parser.add_argument("--root", type=Path, default=RUNS, help="where the run records live")
    parser.add_argument("--arms", nargs="+", default=None, help="a subset of the arms (default: all)")
    parser.add_argument("--cells", nargs="+", default=None, help="a subset of the map's cells, by name")
    parser.add_argument(
        "--per_cell", type=int, default=1, help="rerun: random runs per (cell, arm) besides seed 0"
    )
    parser.add_argument("--output", type=Path, default=RERUN, help="rerun: where its comparison is written")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    arms = args.arms or arm_order()
    cells = [c for c in MAP_CELLS if args.cells is None or c["name"] in args.cells]
    if args.command == "scout":
        print(json.dumps(scout(args.root), indent=1))
    elif args.command == "run":
        run_all(args.root, cells, arms)
    elif args.command == "rerun":
        hard = hard_cell_if_fixed()
        every = [*MAP_CELLS, *([hard] if hard else [])]
        chosen = [c for c in every if args.cells is None or c["name"] in args.cells]
        result = rerun(args.root, chosen, arms, per_cell=args.per_cell)
        if args.output.exists():  # keep the full re-run's comparison (``compare``) beside this one
            result["full_rerun"] = json.loads(args.output.read_text()).get("full_rerun")
        result["command"] = "python benchmarks/credit_map_tuned.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        args.output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[credit_map_tuned] rerun: {result['summary']} -> {args.output}")
        if result["comparison"]["outside"]:
            from _records import Comparison

            print(Comparison(**result["comparison"]).explain())
            return 1
    elif (
        args.command == "compare"
    ):  # a summary of --root (re-run records of --arms) against the committed one
        found = compare_summaries(summarize(args.root), json.loads(SUMMARY.read_text()), arms)
        found["runs"] = compare_runs(args.root, RUNS, arms)
        saved = json.loads(args.output.read_text()) if args.output.exists() else {}
        saved["full_rerun"] = {**found, "machine": machine(), "command": (
            f"python benchmarks/credit_map_tuned.py run --root R --arms {' '.join(arms)} (R: the committed run "
            "records without those arms' files), then compare --root R --arms (the same)")}  # fmt: skip
        args.output.write_text(json.dumps(saved, indent=1) + "\n")
        print(f"[credit_map_tuned] compare: {len(found['changed'])} of {found['records']} records changed, "
              f"largest difference {found['largest']:.1e} -> {args.output}")  # fmt: skip
    else:
        summary = report(args.root)
        print(f"[credit_map_tuned] {len(summary['records'])} records -> {SUMMARY}")
    return 0


# -- the page ------------------------------------------------------------------------------------------------------

PAGE = ROOT / "docs" / "where-credit-pays.md"
#: Where the untuned map (benchmarks/horizon_sweep.py report) begins on the page; everything above is this report's.
MARKER = (
    "<!-- the untuned map below: generated by benchmarks/horizon_sweep.py report -->"  # = its UNTUNED_MARKER
)


def _gap(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    return f"{v['mean']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]"


def _label(setting: dict[str, Any]) -> str:
    if setting["structure"] == "gauntlet":
        return (f"gauntlet H={setting['horizon']} D={setting['decisive']} A={setting['choices']} "
                f"noise={setting['reward_noise']:g} start={setting['start_rate']:g}")  # fmt: skip
    return f"shared/{setting['structure']} H={setting['horizon']} start={setting['start_rate']:g}"


def _tested_groups(summary: dict[str, Any]) -> list[tuple[dict[str, Any], float, list[dict[str, Any]]]]:
    out = []
    for setting in summary["settings"]:
        for f in summary["budget_fractions"]:
            if setting["tested"].get(f"{f:g}"):
                group = [
                    r
                    for r in summary["records"]
                    if r["setting"] == setting["name"] and r["budget_fraction"] == f
                ]
                out.append((setting, f, group))
    return out


Tested = list[tuple[dict[str, Any], float, list[dict[str, Any]]]]

#: How the page and the README name the toy's oracle: like every arm it picks its learning rate and batch from the
#: grid, but its per-state values are computed exactly, not sampled, so they cost no tokens (a reference).
ORACLE_LABEL = (
    "the oracle (exact per-state values, tuned on the same grid; a reference: its values cost nothing)"
)
#: The oracle's arm cell in the page's tables.
ORACLE_CELL = "`oracle` (reference: exact values, cost nothing)"
#: Words for an arm where a sentence names it outside the tables.
ARM_WORDS = {"anchor_pool_state": "pooled anchor credit keyed by the true state"}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _span(rates: Sequence[float]) -> str:
    """``17%-71%``, or one share when they are equal."""
    low, high = _pct(min(rates)), _pct(max(rates))
    return low if low == high else f"{low}-{high}"


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def wins(tested: Tested) -> list[dict[str, Any]]:
    """Every arm ahead of the best tuned GRPO (verdict "pays"), the oracle included, in the order of the tested
    families: arm, setting, budget fraction, gap and tuned GRPO's collapse rate in that family."""
    out = []
    for setting, f, group in tested:
        grpo = next(r for r in group if r["arm"] == "grpo")
        for r in group:
            v = r.get("vs_best_grpo") or {}
            if r["arm"] != "grpo" and v.get("verdict") == "pays":
                out.append({"arm": r["arm"], "setting": setting, "fraction": f, "gap": _gap(v),
                            "grpo_collapse": grpo["collapse_rate"] or 0.0})  # fmt: skip
    return out


def where(found: Sequence[dict[str, Any]]) -> str:
    """The wins' families, grouped by setting: "<setting> at 0.25x, 0.5x and 1x; <setting> at 0.25x"."""
    by: dict[str, list[str]] = {}
    for w in found:
        by.setdefault(_label(w["setting"]), []).append(f"{w['fraction']:g}x")
    return "; ".join(f"{name} at {_and(fs)}" for name, fs in by.items())


def wins_context(tested: Tested) -> str:
    """Where the wins lie against tuned GRPO's collapses: the range of tuned GRPO's collapse rates in the winners'
    families, and what is ahead in the families where tuned GRPO never ended below its start."""
    found = wins(tested)
    if not found:
        return "No arm is ahead of the best tuned GRPO anywhere"
    calm = [s for s, _, g in tested if not next(r for r in g if r["arm"] == "grpo")["collapse_rate"]]
    calm_wins = [w for w in found if not w["grpo_collapse"]]
    rates = sorted(w["grpo_collapse"] for w in found if w["grpo_collapse"])
    oracle = sum(w["arm"] == "oracle" for w in found)
    share = _span(rates) if rates else "none"
    if calm_wins:
        return (f"{len(found) - len(calm_wins)} of the {len(found)} wins (the oracle's {oracle} included) are in "
                f"families where tuned GRPO ended below its start in {share} of its runs at that budget; "
                f"{len(calm_wins)} in the {len(calm)} families where it never did")  # fmt: skip
    return (f"All {len(found)} wins (the oracle's {oracle} included) are in families where tuned GRPO ended below its "
            f"start in {share} of its runs at that budget; in the {len(calm)} families where it never did, no arm "
            "is ahead")  # fmt: skip


def toy_answer(summary: dict[str, Any]) -> str:
    """One sentence on where the toy's wins lie (the language-model map's block cites it): the oracle's families,
    tuned GRPO's collapse rates there, and the practical arms that were ahead."""
    tested = _tested_groups(summary)
    found = wins(tested)
    oracle = [w for w in found if w["arm"] == "oracle"]
    practical: dict[str, int] = {}
    for w in found:
        if w["arm"] != "oracle":
            practical[w["arm"]] = practical.get(w["arm"], 0) + 1
    rates = sorted(w["grpo_collapse"] for w in oracle)
    head = f"On the toy, {ORACLE_LABEL} was ahead of the best tuned GRPO in {len(oracle)} of {len(tested)} families"
    if oracle:
        head += (f" ({where(oracle)}), families where tuned GRPO ended below its start in {_span(rates)} of its "
                 "runs at that budget")  # fmt: skip
    arms = [f"`{a}`" + (f" ({ARM_WORDS[a]})" if a in ARM_WORDS else "") for a in practical]
    counts = [f"{n} famil{'y' if n == 1 else 'ies'}" for n in practical.values()]
    if not arms:
        return head + ". No practical arm was ahead."
    if len(arms) == 1:
        return f"{head}. Of the practical arms only {arms[0]} was ahead, in {counts[0]}."
    ahead = "; ".join(f"{a} in {c}" for a, c in zip(arms, counts, strict=True))
    return f"{head}. Practical arms ahead: {ahead}."


def run_collapses(tested: Tested, arm: str) -> tuple[int, int, int]:
    """``arm``'s distinct evaluation runs in the tested families, each counted once: one run (setting, chosen grid
    point, seed) gives the 1/4, 1/2 and 1x readings, so a point chosen at several budgets is one run read several
    times. Returns (runs below their start at the largest budget the map reads them at, runs below it at some
    reading, runs)."""
    runs: dict[tuple[str, float, int, int], tuple[float, bool, bool]] = {}
    for setting, f, group in tested:
        r = next((x for x in group if x["arm"] == arm), None)
        if r is None or r["status"] != "complete":
            continue
        for seed, down in zip(r["seeds"], r["collapsed"], strict=True):
            key = (setting["name"], r["chosen"]["lr"], r["chosen"]["prompts"], seed)
            last, final, ever = runs.get(key, (-1.0, False, False))
            runs[key] = (f, bool(down), ever or bool(down)) if f > last else (last, final, ever or bool(down))
    return sum(v[1] for v in runs.values()), sum(v[2] for v in runs.values()), len(runs)


def grpo_collapse_sentence(tested: Tested) -> str:
    """How many of tuned GRPO's distinct evaluation runs ended below their start (:func:`run_collapses`)."""
    final, ever, n = run_collapses(tested, "grpo")
    return (f"Tuned GRPO ended below its start in {final} of its {n} evaluation runs of the tested families (a run, "
            "read at up to three budgets, counted once, at the largest budget the map reads it at; "
            f"{ever} were below their start at some reading)")  # fmt: skip


def answer_lines(summary: dict[str, Any]) -> list[str]:
    """The lead's bullets, from the tested (setting, budget) families only."""
    settings = summary["settings"]
    complete = [s for s in settings if s["status"] == "complete"]
    tested = _tested_groups(summary)
    lines = [f"- Settings complete: {len(complete)} of {len(settings)}; (setting, budget) families tested "
             f"(every arm's 24 seeds in): {len(tested)} of {len(settings) * len(summary['budget_fractions'])}. "
             f"Verdicts: Holm over each family, and a difference under {summary['min_effect']:g} in success is "
             "level whatever its p (the protocol's amendment of 2026-12-07)."]  # fmt: skip
    if len(complete) < len(settings):
        lines.append("- **Partial**: the runs had not all finished when this page was generated. Only the tested "
                     "families below carry a verdict; the rest show what is in, marked partial or not run.")  # fmt: skip
    if not tested:
        return lines
    lines += oracle_lines(tested)
    found = [w for w in wins(tested) if w["arm"] != "oracle"]
    losses = sum((r.get("vs_best_grpo") or {}).get("verdict") == "loses" for _, _, g in tested for r in g)
    history_wins = sorted({w["arm"] for w in found if "history" in w["arm"]})
    lines.append("- Arms that see only the observation history (anchors keyed by it, `critic_history`: what a "
                 "language model's context offers) ahead of the best tuned GRPO anywhere: "
                 + (", ".join(history_wins) if history_wins else "none") + ".")  # fmt: skip
    lines.append(f"- Practical arms that beat the best tuned GRPO (Holm): {len(found)}"
                 + (": " + "; ".join(f"{w['arm']} {w['gap']} ({_label(w['setting'])}, {w['fraction']:g}x)"
                                     for w in found) if found else "") + f". Losses: {losses} arm-family pairs.")  # fmt: skip
    lines.append(f"- Where the wins lie: {wins_context(tested)}.")
    collapses = []
    for s, f, group in tested:
        g = next(r for r in group if r["arm"] == "grpo")
        if g["collapse_rate"]:
            collapses.append(f"{_label(s)} at {f:g}x: {g['collapse_rate']:.2f}")
    lines.append("- Tuned GRPO's collapse rate (runs ending below their start at that budget), where not 0: "
                 + ("; ".join(collapses) if collapses else "none") + f". {grpo_collapse_sentence(tested)}.")  # fmt: skip
    lines.append("- Collapsed runs per arm over the tested families, each run counted once at the largest budget "
                 "the map reads it at (arms that could not afford a batch left out): " + collapse_totals(tested) + ".")  # fmt: skip
    return lines + hybrid_lines(summary.get("hybrid_budget")) + rerun_lines(summary.get("rerun"))


def oracle_lines(tested: Tested) -> list[str]:
    """The lead's bullets on the oracle: its largest gain and the families where it is ahead."""
    oracle = [(s, f, next(r for r in g if r["arm"] == "oracle")) for s, f, g in tested]
    oracle = [(s, f, r) for s, f, r in oracle if r.get("vs_best_grpo")]
    if not oracle:
        return []
    s, f, r = max(oracle, key=lambda x: x[2]["vs_best_grpo"]["mean"])
    pays = [w for w in wins(tested) if w["arm"] == "oracle"]
    return [
        f"- {ORACLE_LABEL[0].upper()}{ORACLE_LABEL[1:]}: its largest tuned gain over the best tuned GRPO: "
        f"{_gap(r['vs_best_grpo'])} at {_label(s)}, budget {f:g}x ({r['vs_best_grpo']['verdict']}, Holm).",
        f"- The oracle pays in {len(pays)} of {len(oracle)} tested families"
        + (": " + where(pays) if pays else "")
        + ".",
    ]


def hybrid_lines(digest: dict[str, Any] | None) -> list[str]:
    """The labelled line on the hybrid arm's two versions (outside every family)."""
    if not digest or not digest["per_response"]["runs"]:
        return []
    old, new = digest["per_response"], digest["per_state"]
    return [
        f"- `hybrid` is the library's per-state budget (issue 52; re-run whole by the protocol's amendment of "
        f"2026-11-29 06:52 UTC): {new['runs'] - new['bought_nothing']} of its {new['runs']} runs bought Monte "
        f"Carlo states. Its earlier per-response runs, outside every family (`<cell>/hybrid_per_response/` in the records), "
        f"bought none in {old['bought_nothing']} of {old['runs']} (those runs were GRPO)."
    ]


def rerun_lines(rerun: dict[str, Any] | None) -> list[str]:
    """The lead's note that the anchor arms are the library's estimator, and how the re-runs with it compare."""
    line = ("- The anchor arms are the library's `advantage_estimator=\"anchor\"` (through the toy's seam, "
            "`testbed.agent_credit.ToyAnchor`): `anchor_pool_*` is `anchor_credit=\"pooled\", "
            "scale_rewards=\"none\"`, `anchor_norm_*` the defaults (`anchor_credit=\"normalized\", "
            "scale_rewards=\"group\"`). The runs computed the same credit from `mcadvantage.core.anchors` "
            "directly; the code was unified after them (the protocol's amendment of 2026-11-29).")  # fmt: skip
    if rerun is None:
        return [line]
    per_arm = ", ".join(f"`{a}` {t['within']}/{t['runs']} ({t['identical']} identical, largest difference "
                        f"{t['largest']:.1e})" for a, t in rerun["per_arm"].items())  # fmt: skip
    line += (f" Committed runs re-run with the library's estimator (`credit_map_tuned.py rerun`, "
             f"`benchmarks/results/credit_map_tuned_rerun.json`): {rerun['summary']} (float64 success within "
             f"relative 1e-9, updates and tokens exact): {per_arm}.")  # fmt: skip
    full = rerun.get("full_rerun")
    if full:
        runs = full["runs"]
        line += (f" Every run of {', '.join(f'`{a}`' for a in full['arms'])} re-run (tuning and evaluation "
                 f"seeds, {runs['runs']} runs): {runs['identical']} identical, {runs['within']} within the rule, "
                 f"updates and tokens {'all equal' if runs['counts_equal'] else 'NOT all equal'}, the largest "
                 f"difference of a run's success {runs['largest']:.3f} (float32 rounding can flip a sampled choice, "
                 f"and the run then diverges); {len(full['changed'])} of their {full['records']} (setting, budget) "
                 f"records changed chosen point, seeds or verdict, and the largest difference of an evaluation "
                 f"success, mean or gap there is {full['largest']:.1e}.")  # fmt: skip
    return [line]


def collapse_totals(tested: Tested) -> str:
    """``arm k/n`` for every arm: of its n distinct evaluation runs over the tested families it ran in, k ended
    below their start (:func:`run_collapses`)."""
    arms = dict.fromkeys(r["arm"] for _, _, g in tested for r in g if r["status"] == "complete")
    totals = {arm: run_collapses(tested, arm) for arm in arms}
    return ", ".join(f"`{arm}` {k}/{n}" for arm, (k, _, n) in totals.items())


def setting_table(summary: dict[str, Any], setting: dict[str, Any], fraction: float) -> list[str]:
    group = [
        r for r in summary["records"] if r["setting"] == setting["name"] and r["budget_fraction"] == fraction
    ]
    rows = ["| arm | chosen lr x batch | status | mean success | minus tuned GRPO [95% CI] | Holm p | verdict | "
            "collapsed | tokens | updates |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in group:
        v = r.get("vs_best_grpo") or {}
        chosen = (
            f"{r['chosen']['lr']:g} x {r['chosen']['prompts']}x{r['chosen']['group']}" if r["chosen"] else "-"
        )
        mean = f"{r['mean']:.3f}" if r.get("mean") is not None else "-"
        n = len(r["success"])
        collapsed = f"{sum(r['collapsed'])}/{n}" if n else "-"
        tokens = f"{statistics.fmean(r['sampled_tokens']):.0f}" if n else "-"
        steps = f"{statistics.fmean(r['steps']):.1f}" if n else "-"
        verdict = "(the comparison)" if r["arm"] == "grpo" else v.get("verdict", "-")
        p_holm = f"{v['p_holm']:.3g}" if v.get("p_holm") is not None else "-"
        status = r["status"] if r["status"] != "partial" else f"partial ({n}/24)"
        arm = ORACLE_CELL if r["arm"] == "oracle" else f"`{r['arm']}`"
        rows.append(f"| {arm} | {chosen} | {status} | {mean} | {_gap(v)} | {p_holm} | {verdict} | "
                    f"{collapsed} | {tokens} | {steps} |")  # fmt: skip
    return rows


def _power_line(summary: dict[str, Any], setting: dict[str, Any], fraction: float) -> str:
    group = [
        r for r in summary["records"] if r["setting"] == setting["name"] and r["budget_fraction"] == fraction
    ]
    sds = sorted(r["vs_best_grpo"]["sd"] for r in group if r.get("vs_best_grpo") and r["vs_best_grpo"]["sd"])
    if not sds:
        return ""
    sd = statistics.median(sds)
    e = summary["effect_80"]
    return (f"Median SD of the paired differences {sd:.3f}: 24 seeds detect about {e['last_holm_step'] * sd:.3f} "
            f"(Holm's last step) to {e['first_holm_step'] * sd:.3f} (its first) at 80% power.")  # fmt: skip


def scout_lines(summary: dict[str, Any]) -> list[str]:
    scout = summary.get("hard_scout")
    if not scout:
        return ["The hard variant's scout has not run yet."]
    rows = ["| candidate | tuned GRPO (lr x batch) | tuned GRPO mean at 1x, tuning seeds |", "|---|---|---|"]
    for c in scout["candidates"]:
        t = c["tuned_grpo"]
        rows.append(
            f"| {_label(c['cell'])} | {t['lr']:g} x {t['prompts']}x{t['group']} | {t['tuning_mean']:.3f} |"
        )
    return [f"Rule: {scout['rule']}. Chosen: **{_label(scout['chosen'])}**.", "", *rows]


HOW_TO_READ = """## How to read it

- **Equal tuning**: every arm picks its learning rate and batch from the same grid (lr {lrs} x {prompts} prompts
  x {group} responses; trees for `tree`) by its mean exact success on the tuning seeds {tuning} (disjoint from the
  evaluation seeds 0-23), separately for each setting and budget; ties go to the smaller learning rate. GRPO's
  batch sizes are points of its grid, so "the best tuned GRPO" is one arm, chosen before the evaluation seeds ran.
- **Budgets**: 1/4, 1/2 and 1x of 240 episode-equivalents (320 in the hard variant) of sampled tokens; a smaller
  budget is the same run stopped earlier. "cannot afford": no grid point makes one update within the budget (at
  H = 16 one `vineppo` K = 4 batch of 1 x 4 costs 2,240 sampled tokens); such a cell is not a loss.
- **Anchor arms** (the library's `advantage_estimator="anchor"`): `norm` is GRPO's episode advantage plus GiGPO's
  step advantage (`anchor_credit="normalized"`, the default), `pool` the step groups' mean returns as values
  (`V(s') - V(s)`, undivided: `anchor_credit="pooled", scale_rewards="none"`). `_state` keys step groups by the true state
  `(turn, good/bad)`; `_history` by the whole observed history (what a language model's context holds), so after
  the first differing choice no two episodes share a key and the step groups are single turns.
- **Critics**: `critic_tabular` sees the exact `(turn, state)` and cannot generalise wrongly (the best case);
  `critic_history` is linear in features of the observed history (no state id, one weight vector for every turn),
  the stand-in for a language-model critic.
- **The oracle**: the exact per-state advantages; it picks its learning rate and batch from the same grid as every
  arm, but its values are computed, not sampled, so they cost no tokens: a reference, not a practical arm.
- **Verdicts**: the paired difference to the best tuned GRPO over the 24 seeds, Holm over the family; `pays` or
  `loses` only when Holm's p < {alpha:g} and the difference reaches the minimum effect, {min_effect:g} in success
  (the protocol's amendment of 2026-12-07); otherwise `level`, whatever its p.
- **Collapsed**: runs whose exact success at the budget is below the start. One run gives the 1/4, 1/2 and 1x
  readings, so the totals count each run once, at the largest budget the map reads it at.
"""


#: The language-model study's block on the page (``benchmarks/lm_agent_map.py --report`` writes it between these
#: markers, after the tuned answer); regenerating the tuned lead keeps it as it is.
LM_BEGIN = "<!-- the language-model map: generated by benchmarks/lm_agent_map.py --report -->"
LM_END = "<!-- end of the language-model map -->"


def lm_block(page: Path = PAGE) -> str:
    """The language-model block as on the page now (markers included), or "" when the page has none."""
    text = page.read_text() if page.exists() else ""
    if LM_BEGIN not in text or LM_END not in text:
        return ""
    return LM_BEGIN + text.split(LM_BEGIN, 1)[1].split(LM_END, 1)[0] + LM_END


def render_lead(summary: dict[str, Any], lm: str = "") -> str:
    """The page's lead: the tuned map (everything above :data:`MARKER`), with the language-model block ``lm``
    (:func:`lm_block`) after the tuned answer."""
    g = summary["grid"]
    out = [
        "# Where does turn credit pay? The map on the agent credit toy, tuned",
        "",
        "Generated by `python benchmarks/credit_map_tuned.py report` from the run records "
        "(`benchmarks/results/credit_map_tuned_runs/`) into `benchmarks/results/credit_map_tuned.json`; do not edit "
        "by hand. Protocol, committed before the runs: [the tuned map's protocol](credit-map-tuned-protocol.md). The "
        "untuned map (one learning rate for every arm: it measures step count at that rate) is kept below.",
        "",
        "## The answer, tuned",
        "",
        *answer_lines(summary),
        "",
        *([lm, ""] if lm else []),
        HOW_TO_READ.format(
            lrs=", ".join(f"{x:g}" for x in g["lr"]),
            prompts="/".join(map(str, g["prompts"])),
            group=g["group"],
            tuning=", ".join(map(str, summary["tuning_seeds"])),
            alpha=summary["alpha"],
            min_effect=summary["min_effect"],
        ),  # fmt: skip
        "## Per setting and budget",
        "",
    ]
    for setting in summary["settings"]:
        out += [f"### {_label(setting)} ({setting['status']})", ""]
        if setting["status"] == "not run":
            out += ["Not run yet.", ""]
            continue
        for f in summary["budget_fractions"]:
            tested = (
                "tested" if setting["tested"].get(f"{f:g}") else "not tested yet: some arms' runs are missing"
            )
            out += [f"Budget {f:g}x ({tested}). {_power_line(summary, setting, f)}", "",
                    *setting_table(summary, setting, f), ""]  # fmt: skip
    out += ["## The hard variant's scout", "", *scout_lines(summary), ""]
    return "\n".join(out)


def untuned_part(page: Path = PAGE) -> str:
    """The untuned map below the marker, as on the page now (horizon_sweep.py writes it)."""
    text = page.read_text() if page.exists() else ""
    return text.split(MARKER, 1)[1] if MARKER in text else ""


def write_page(summary: dict[str, Any], page: Path = PAGE) -> None:
    """The lead from ``summary`` above the marker; the untuned map below it is kept as it is (or, on the first
    run, horizon_sweep's page demoted under one heading)."""
    below = untuned_part(page)
    if not below:
        import horizon_sweep

        below = "\n" + horizon_sweep.untuned_section(json.loads(horizon_sweep.SUMMARY.read_text()))
    if not below.startswith("\n"):
        below = "\n" + below
    page.write_text(render_lead(summary, lm_block(page)) + "\n" + MARKER + below)


def readme_bullet(summary: dict[str, Any]) -> str:
    """The README's agent bullet ("What step credit buys"), every number from ``summary`` (tests tie them)."""
    settings = summary["settings"]
    complete = sum(s["status"] == "complete" for s in settings)
    tested = _tested_groups(summary)
    head = (
        "- **On multi-turn agent episodes, tuned** ([where credit pays](docs/where-credit-pays.md), an exact agent "
        "toy; [protocol](docs/credit-map-tuned-protocol.md) committed before the runs). Every arm picks its learning "
        f"rate and batch from one grid ({len(summary['grid']['lr'])} rates x {len(summary['grid']['prompts'])} "
        "batch sizes) on held-out seeds, then 24 paired seeds at 1/4, 1/2 and 1x of the budget, against the best "
        f"tuned GRPO (Holm; a difference under {summary['min_effect']:g} in success is level whatever its p). "
        f"Settings complete: {complete} of {len(settings)}; families tested: {len(tested)}"
        f" of {len(settings) * len(summary['budget_fractions'])}"
    )
    tail = (
        " `bash scripts/demo.sh --where_credit_pays` retrains the setting where the oracle gains most, with the best "
        "tuned GRPO and practical arms beside it, in about a minute. The first, untuned map (one learning rate, so "
        "it ranked arms by step count) is kept below it on the page; `--where_credit_pays_untuned` retrains its "
        "crossover."
    )
    if not tested:
        return head + " (partial: no conclusion yet)." + tail
    partial = "" if complete == len(settings) else " (partial: the rest had not finished)"
    found = wins(tested)
    oracle = [w for w in found if w["arm"] == "oracle"]
    practical = [f"`{w['arm']}` {w['gap']} ({_label(w['setting'])}, {w['fraction']:g}x)" for w in found
                 if w["arm"] != "oracle"]  # fmt: skip
    losses = sum((r2.get("vs_best_grpo") or {}).get("verdict") == "loses" for _, _, g in tested for r2 in g)
    s, f, r = max(((s, f, next(r for r in g if r["arm"] == "oracle")) for s, f, g in tested),
                  key=lambda x: x[2]["vs_best_grpo"]["mean"])  # fmt: skip
    history = sorted({w["arm"] for w in found if "history" in w["arm"]})
    return (
        f"{head}{partial}. {ORACLE_LABEL[0].upper()}{ORACLE_LABEL[1:]} is ahead of the best tuned GRPO in "
        f"{len(oracle)} of {len(tested)} families"
        + (f" ({where(oracle)})" if oracle else "")
        + f"; its largest gain is {_gap(r['vs_best_grpo'])} ({_label(s)}, {f:g}x budget). Practical arms ahead "
        f"of the best tuned GRPO: {'; '.join(practical) if practical else 'none'}; behind it: {losses} arm-family pairs. "
        f"{wins_context(tested)}. {grpo_collapse_sentence(tested)}. Of the arms that see only the observation "
        "history (what a language model's context offers: anchors keyed by it, the history critic), ahead "
        f"anywhere: {', '.join(history) or 'none'}.{tail}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
