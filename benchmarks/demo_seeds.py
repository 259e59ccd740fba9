"""Run-to-run noise of the offline CPU demo: run it for several seeds and compare the held-out accuracy
before and after VinePPO with the spread between runs.

    python benchmarks/demo_seeds.py --seeds 0 1 2            # ~8 minutes per seed on 2 CPU cores
    python benchmarks/demo_seeds.py --seeds 0 1 2 --reuse    # aggregate runs already in --root

Each seed is a separate ``python -m mcadvantage.demo`` process (its own output directory
``<root>/seed<N>``), run one after another so they do not compete for the cores. The seed changes
everything random: the problem sets, the flawed demonstrations, the model initialisation, the
sampling. Prints a table and writes ``benchmarks/results/demo_seeds.json``.

Noise is stated two ways: the binomial standard error of one accuracy measurement (finite held-out
set), and the sample standard deviation across seeds (everything that changes between runs). The
improvement counts as real when every seed improves and the mean improvement exceeds twice its
standard error across seeds; whether it also exceeds the across-seed spread of the "before" accuracy
(how different two warm-ups are) is reported too.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_seed(seed: int, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "mcadvantage.demo", "--seed", str(seed), "--output_dir", str(out), *extra]
    print(f"[demo_seeds] {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo with --seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["process_seconds"] = time.perf_counter() - t0
    return metrics


def summarize(runs: list[dict]) -> dict:
    before = [r["accuracy_before"] for r in runs]
    after = [r["accuracy_after"] for r in runs]
    gain = [a - b for a, b in zip(after, before, strict=True)]
    n = len(runs)

    def sd(xs: list[float]) -> float:
        return statistics.stdev(xs) if len(xs) > 1 else float("nan")

    mean_gain = statistics.mean(gain)
    sem_gain = sd(gain) / n**0.5
    return {
        "seeds": [r["seed"] for r in runs],
        "mean_before": statistics.mean(before),
        "mean_after": statistics.mean(after),
        "sd_before_across_seeds": sd(before),
        "sd_after_across_seeds": sd(after),
        "mean_improvement": mean_gain,
        "sd_improvement_across_seeds": sd(gain),
        "sem_improvement": sem_gain,
        "min_improvement": min(gain),
        "mean_binomial_stderr": statistics.mean(
            [r["stderr_before"] for r in runs] + [r["stderr_after"] for r in runs]
        ),
        # Paired per seed: the same held-out problems before and after, so the warm-up's own spread
        # across seeds (sd_before_across_seeds) cancels out of the gain; the gain's noise is its spread.
        "improvement_exceeds_noise": bool(n > 1 and min(gain) > 0 and mean_gain > 2 * sem_gain),
        "mean_improvement_exceeds_sd_before": bool(n > 1 and mean_gain > sd(before)),
        "mean_total_seconds": statistics.mean([r["total_seconds"] for r in runs]),
        "max_total_seconds": max(r["total_seconds"] for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--root", default="benchmarks/results/demo_runs", help="output directories live here")
    parser.add_argument("--reuse", action="store_true", help="use <root>/seed<N>/metrics.json when present")
    parser.add_argument("--json", default="benchmarks/results/demo_seeds.json")
    parser.add_argument("demo_args", nargs="*", help="extra demo flags after --, e.g. -- --rl_steps 20")
    args = parser.parse_args(argv)

    runs = []
    for seed in args.seeds:
        out = Path(args.root) / f"seed{seed}"
        if args.reuse and (out / "metrics.json").exists():
            runs.append(json.loads((out / "metrics.json").read_text()))
        else:
            runs.append(run_seed(seed, out, args.demo_args))

    header = f"{'seed':>4} {'before':>7} {'after':>7} {'gain':>7} {'SE':>6} {'warm-up s':>9} {'RL s':>6} {'total s':>7}"
    print(header)
    print("-" * len(header))
    for r in runs:
        print(
            f"{r['seed']:>4} {r['accuracy_before']:>7.3f} {r['accuracy_after']:>7.3f} "
            f"{r['accuracy_after'] - r['accuracy_before']:>+7.3f} {r['stderr_after']:>6.3f} "
            f"{r['warmup_seconds']:>9.0f} {r['rl_seconds']:>6.0f} {r['total_seconds']:>7.0f}"
        )
    summary = summarize(runs)
    print(
        f"mean {summary['mean_before']:.3f} -> {summary['mean_after']:.3f} "
        f"(improvement {summary['mean_improvement']:+.3f}, sd across seeds {summary['sd_improvement_across_seeds']:.3f}, "
        f"SE of the mean {summary['sem_improvement']:.3f}); sd of 'before' across seeds "
        f"{summary['sd_before_across_seeds']:.3f}, binomial SE of one measurement {summary['mean_binomial_stderr']:.3f}; "
        f"improvement exceeds noise: {summary['improvement_exceeds_noise']}"
    )
    result = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
        },
        "command": "python benchmarks/demo_seeds.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "summary": summary,
        "runs": [
            {
                k: r[k]
                for k in (
                    "seed",
                    "accuracy_before",
                    "accuracy_after",
                    "stderr_before",
                    "stderr_after",
                    "accuracy_before_by_num_steps",
                    "accuracy_after_by_num_steps",
                    "warmup_seconds",
                    "rl_seconds",
                    "report_seconds",
                    "total_seconds",
                    "mean_rollouts_per_step",
                    "rl_curve",
                )
            }
            for r in runs
        ],
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
