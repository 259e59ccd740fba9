"""Turn credit's overhead over the engine before and after a change, measured in one run (issue 52, item 7).

``benchmarks/agent_turn_credit.py`` measures the Monte Carlo estimator's overhead on agent episodes,
``(estimator wall - tool time) / engine wall``, for one checkout of the code. This driver runs that script, unchanged,
in two checkouts, the code *before* (a ``git worktree`` of the older commit) and *after* (this checkout), as
alternating subprocesses on the same machine in the same minutes: pair ``i`` runs before then after when ``i`` is
even, after then before when it is odd, so drifting load falls on both sides alike. Each subprocess teaches the same
tiny policy (the same seed and steps), generates the same episodes and times the estimator ``--repeats`` times; its
overhead for each horizon H and K is the mean over those repeats.

Reported per H and K: each side's overhead, the mean over pairs with a 95% Student-t interval, and after / before,
the geometric mean of the per-pair ratios with a 95% Student-t interval on their logs. GRPO's own tool loop, timed
the same way in every run, is reported beside them as a control for the load each side saw.

    git worktree add /tmp/before 34b10c3^
    python benchmarks/agent_turn_credit_ab.py --before /tmp/before --pairs 6 \\
        --out benchmarks/results/agent_turn_credit_ab.json

Every finished run is written to ``--out`` at once, and a re-run with the same settings resumes after the last
finished run. Both checkouts run with the Python running this script, each with its own ``src/`` first on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import machine_info, uptime  # noqa: E402
from agent_turn_credit import ratio_interval, t_interval  # noqa: E402

SIDES = ("before", "after")


def order(pair: int) -> tuple[str, str]:
    """The sides' order in pair ``pair``: before first in even pairs, after first in odd ones."""
    return SIDES if pair % 2 == 0 else SIDES[::-1]


def bench_argv(tree: Path, args: argparse.Namespace, out: Path) -> list[str]:
    """The command line of one run of ``tree``'s ``benchmarks/agent_turn_credit.py``."""
    return [
        sys.executable,
        str(tree / "benchmarks" / "agent_turn_credit.py"),
        "--horizons",
        *map(str, args.horizons),
        "--k",
        *map(str, args.k),
        "--episodes",
        str(args.episodes),
        "--repeats",
        str(args.repeats),
        "--teach-steps",
        str(args.teach_steps),
        "--out",
        str(out),
    ]


def tree_commit(tree: Path) -> dict[str, Any]:
    """``tree``'s HEAD and whether its tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return {"tree": str(tree), "commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One subprocess run of ``tree``'s benchmark (its own ``src/`` and root first on the path, one thread); what
    :func:`summarise` needs from its record."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        started = time.perf_counter()
        proc = subprocess.run(bench_argv(tree, args, out), cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"agent_turn_credit_ab: the benchmark in {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        record = json.loads(out.read_text())
    return {
        "seconds": time.perf_counter() - started,
        "machine": record["machine"],
        "horizons": _cells(record),
    }


def _cells(record: dict[str, Any]) -> dict[str, Any]:
    """Per horizon: GRPO's and each K's per-repeat overheads, the milliseconds per episode they stand for
    (``extra_ms``: wall less tools less engine), walls and engine times, rollouts and values digest."""

    def timing(cell: dict[str, Any]) -> dict[str, Any]:
        walls, engines, tools = (
            cell["wall_per_episode_s"],
            cell["engine_per_episode_s"],
            cell["tools_per_episode_s"],
        )
        return {
            "overhead": [(w - t) / e for w, e, t in zip(walls, engines, tools, strict=True)],
            "extra_ms": [1000 * (w - t - e) for w, e, t in zip(walls, engines, tools, strict=True)],
            "wall_per_episode_s": walls,
            "engine_per_episode_s": engines,
        }

    cells = {}
    for rec in record["horizons"]:
        ks = {
            k: {
                **timing(v),
                "rollouts_per_episode": v["rollouts_per_episode"],
                "values_sha256": v["values_sha256"],
            }
            for k, v in rec["vineppo"].items()
        }
        cells[str(rec["horizon"])] = {"grpo": timing(rec["grpo"]), "vineppo": ks}
    return cells


def compare(before: Sequence[float], after: Sequence[float]) -> dict[str, Any]:
    """Each side's per-pair overheads (a run's mean over its repeats), their means with intervals, and after /
    before paired by pair."""
    return {
        "before_runs": list(before),
        "after_runs": list(after),
        "before": t_interval(before),
        "after": t_interval(after),
        "after_over_before": (
            ratio_interval([a / b for a, b in zip(after, before, strict=True)])
            if min(*before, *after) > 0
            else None  # a ratio of times needs both positive
        ),
    }


def run_means(
    pairs: Sequence[dict[str, Any]], side: str, h: str, k: str | None = None, key: str = "overhead"
) -> list[float]:
    """One side's ``key`` per pair at horizon ``h``: each run's mean over its repeats, for K = ``k`` (None: GRPO's
    own tool loop)."""
    cells = (p[side]["horizons"][h] for p in pairs)
    return [statistics.fmean((c["grpo"] if k is None else c["vineppo"][k])[key]) for c in cells]


def _compare_cell(pairs: Sequence[dict[str, Any]], h: str, k: str | None = None) -> dict[str, Any]:
    """:func:`compare` of the overheads, with that of the milliseconds per episode beside them (``extra_ms``)."""
    return {
        **compare(run_means(pairs, "before", h, k), run_means(pairs, "after", h, k)),
        "extra_ms": compare(
            run_means(pairs, "before", h, k, "extra_ms"), run_means(pairs, "after", h, k, "extra_ms")
        ),
    }


def summarise(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per horizon, GRPO's and each K's overheads compared over the finished pairs (:func:`compare`, for the ratio
    and for the milliseconds per episode), and each side's rollouts."""
    out: dict[str, Any] = {}
    for h, cell in pairs[0]["after"]["horizons"].items():
        out[h] = {"grpo": _compare_cell(pairs, h), "vineppo": {}}
        for k in cell["vineppo"]:
            out[h]["vineppo"][k] = {
                **_compare_cell(pairs, h, k),
                "rollouts_per_episode": {
                    side: pairs[0][side]["horizons"][h]["vineppo"][k]["rollouts_per_episode"]
                    for side in SIDES
                },
            }
    return out


def _iv(iv: dict[str, Any], key: str = "mean") -> str:
    if iv["low"] is None:
        return f"{iv[key]:.3f}"
    return f"{iv[key]:.3f} [{iv['low']:.3f}, {iv['high']:.3f}]"


def table(summary: dict[str, Any]) -> str:
    """The markdown table: one row per horizon and K (GRPO's own tool loop as K = GRPO)."""
    lines = [
        "| H | K | rollouts / ep before | after | (wall - tools) / engine before, 95% CI | after, 95% CI "
        "| after / before, 95% CI | ms / ep outside the engine before | after |",
        "|---:|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for h, cell in summary.items():
        rows = [("GRPO", cell["grpo"], None)] + [
            (k, v, v["rollouts_per_episode"]) for k, v in cell["vineppo"].items()
        ]
        for k, c, rollouts in rows:
            r = ("-", "-") if rollouts is None else (f"{rollouts['before']:.1f}", f"{rollouts['after']:.1f}")
            lines.append(
                f"| {h} | {k} | {r[0]} | {r[1]} | {_iv(c['before'])} | {_iv(c['after'])} "
                f"| {_iv(c['after_over_before'], 'ratio')} | {c['extra_ms']['before']['mean']:.1f} "
                f"| {c['extra_ms']['after']['mean']:.1f} |"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", type=Path, required=True, help="checkout of the code before (a git worktree)"
    )
    parser.add_argument(
        "--after", type=Path, default=ROOT, help="checkout of the code after (default: this one)"
    )
    parser.add_argument("--pairs", type=int, default=6, help="before/after pairs of runs")
    parser.add_argument("--horizons", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per horizon")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats inside each run")
    parser.add_argument("--teach-steps", type=int, default=150)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "agent_turn_credit_ab.json"
    )
    args = parser.parse_args(argv)
    for side in SIDES:
        tree = getattr(args, side).resolve()
        if not (tree / "benchmarks" / "agent_turn_credit.py").is_file():
            parser.error(
                f"--{side} {tree} has no benchmarks/agent_turn_credit.py; pass a checkout of the project"
            )
        setattr(args, side, tree)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} is invalid; pass at least 1 (2 or more for an interval)")
    return args


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "before": tree_commit(args.before),
        "after": tree_commit(args.after),
        "horizons": args.horizons,
        "k": args.k,
        "episodes_per_horizon": args.episodes,
        "repeats_per_run": args.repeats,
        "teach_steps": args.teach_steps,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = _config(args)
    result: dict[str, Any] = {"config": config, "pairs": []}
    if args.out.is_file():
        old = json.loads(args.out.read_text())
        if old.get("config") == config:  # the same settings and commits: go on after the last finished run
            result = old
    result.setdefault("uptime_before", uptime())
    result["command"] = "python benchmarks/agent_turn_credit_ab.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    for pair in range(len(result["pairs"]), args.pairs):
        runs = {}
        for side in order(pair):
            runs[side] = run_once(getattr(args, side), args)
            print(
                f"pair {pair + 1}/{args.pairs} {side}: {runs[side]['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        result["pairs"].append({"order": list(order(pair)), **runs})
        result["summary"] = summarise(result["pairs"])
        result["uptime_after"] = uptime()
        result["machine"] = machine_info()
        result["table"] = table(result["summary"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(result["table"])
    return result


if __name__ == "__main__":
    main()
