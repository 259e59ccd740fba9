"""The credit map, tuned: every arm picks its learning rate and batch from one grid on held-out seeds, then 24 paired
evaluation seeds, at 1/4, 1/2 and 1x of the budget (issue 51; protocol: docs/credit-map-tuned-protocol.md).

    python benchmarks/credit_map_tuned.py run          # scout, the map's cells, then the hard cell once it is fixed
    python benchmarks/credit_map_tuned.py scout        # the hard variant's scout alone, and the candidate it picks
    python benchmarks/credit_map_tuned.py report       # JSON and the page's lead from whatever runs have finished

Each run trains one arm (:data:`testbed.credit_map.TUNED_ARMS`) at one grid point (lr, batch) with one seed on one
cell, once at the whole budget; its results at 1/4 and 1/2 are the same run's prefix (the policy after the last update
that fits). One JSON line per run in ``benchmarks/results/credit_map_tuned_runs/<cell>/<arm>.jsonl`` (settings, the
three budgets' results, commit, versions, CPU, threads); a run whose line exists with the same settings is not run
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
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/credit_map_tuned.py` has only benchmarks/ on the path
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from mcadvantage.evaluation.stats import holm_adjust, paired_t_test  # noqa: E402

RUNS = ROOT / "benchmarks" / "results" / "credit_map_tuned_runs"
SUMMARY = ROOT / "benchmarks" / "results" / "credit_map_tuned.json"
HARD_CHOICE = RUNS / "hard_variant.json"

#: The protocol's grid, seeds and budgets (docs/credit-map-tuned-protocol.md).
LRS = (0.03, 0.1, 0.3, 1.0, 3.0)
PROMPTS = (1, 2, 4)
GROUP = 4
TUNING_SEEDS = (1000, 1001, 1002)
EVAL_SEEDS = tuple(range(24))
FRACTIONS = (0.25, 0.5, 1.0)
ALPHA = 0.05
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
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
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
        _MACHINE.update({k: info[k] for k in ("commit", "python", "torch", "cpu", "cpu_count", "torch_threads")})
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


def arm_file(root: Path, cell_name: str, arm: str) -> Path:
    return root / cell_name / f"{arm}.jsonl"


def load_arm(root: Path, cell_name: str, arm: str) -> dict[tuple[float, int, int], dict[str, Any]]:
    """The arm's records on the cell keyed by (lr, prompts, seed); torn lines are skipped (they run again)."""
    path = arm_file(root, cell_name, arm)
    out: dict[tuple[float, int, int], dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            s = rec["settings"]
            out[(float(s["lr"]), int(s["prompts"]), int(s["seed"]))] = rec
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return out


class Runner:
    """Runs what is missing and appends each record as one line; prints a progress line as it goes."""

    def __init__(self, root: Path, planned: int, *, quiet: bool = False) -> None:
        self.root, self.planned, self.quiet = root, planned, quiet
        self.done = self.ran = 0
        self.t0 = time.perf_counter()

    def ensure(self, cell: dict[str, Any], arm: str, points: Iterable[tuple[float, int]], seeds: Sequence[int]):
        """Every (point, seed) of ``arm`` on ``cell`` recorded; returns the arm's records."""
        have = load_arm(self.root, cell["name"], arm)
        path = arm_file(self.root, cell["name"], arm)
        for lr, prompts in points:
            for seed in seeds:
                self.done += 1
                rec = have.get((lr, prompts, seed))
                if rec is not None and rec["settings"] == settings(cell, arm, lr, prompts, seed):
                    continue
                rec = train(cell, arm, lr, prompts, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
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
    return {"rule": f"first candidate whose tuned GRPO mean at 1x <= {HARD_CEILING}, else the lowest",
            "candidates": rows, "chosen": chosen["cell"]}  # fmt: skip


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


def report(root: Path) -> dict[str, Any]:  # filled in below the runner (the summary and the page)
    raise NotImplementedError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("run", "scout", "report"))
    parser.add_argument("--root", type=Path, default=RUNS, help="where the run records live")
    parser.add_argument("--arms", nargs="+", default=None, help="a subset of the arms (default: all)")
    parser.add_argument("--cells", nargs="+", default=None, help="a subset of the map's cells, by name")
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
    else:
        summary = report(args.root)
        print(f"[credit_map_tuned] {len(summary['records'])} records -> {SUMMARY}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
