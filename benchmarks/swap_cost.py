"""What the swap costs in wall time: ``trl.GRPOTrainer`` against ``VinePPOTrainer(advantage_estimator="grpo")``,
and Monte Carlo credit (``advantage_estimator="vineppo"``) against GRPO given the same sampled tokens.

Usage::

    python benchmarks/swap_cost.py [--steps 25] [--threads 1]
                                   [--out benchmarks/results/swap_cost.json]
    python benchmarks/swap_cost.py --quick --out /tmp/swap_cost.json   # a smoke run (numbers meaningless)

Four arms train the shipped tiny demo policy (``mcadvantage/demo/warmup_plateau``, a 1M-parameter character-level
Llama) on the demo's arithmetic prompts, graded by ``GSM8KVerifier``, on the CPU, with the same seed, learning
rate, temperature, response length and batch layout per prompt:

* ``grpo``: ``trl.GRPOTrainer`` with ``trl.GRPOConfig``, ``--prompts`` prompts x ``--generations`` responses a step;
* ``swap``: ``VinePPOTrainer`` with ``VinePPOConfig(advantage_estimator="grpo")``, the same fields: the drop-in
  swap a user makes before turning Monte Carlo credit on. The advantages are GRPO's, so any difference in step time
  is the subclass' own cost (target: ratio <= 1.02);
* ``vineppo``: ``VinePPOTrainer`` with Monte Carlo step values (K = ``--num-mc-rollouts``), the same prompts;
* ``grpo_matched``: ``trl.GRPOTrainer`` with as many prompts a step as give it ``vineppo``'s sampled tokens a step
  (responses plus Monte Carlo rollouts), measured in a short calibration run of both before the timed run; the same rule as
  ``grpo_matched`` in ``benchmarks/learning_efficiency.py``. Its ratio is what Monte Carlo credit costs in wall time
  beyond the tokens it samples.

All four trainers are built first (not timed) and train side by side in one process, one step at a time: a
baton lets exactly one trainer run a step while the others wait, so the run is ABCD, BCDA, CDAB, ... (the order
rotates by one arm each round, so every arm takes every position equally often and a drift in machine load hits
every arm alike). Each arm keeps its own random number streams across the switches, seeded as if it ran alone
(Python, NumPy, torch CPU), the arms set up their training loops one after another before any step runs, and every
arm draws the same prompts (TRL's sampler has its own seeded generator): ``grpo`` and ``swap`` sample the same
responses at every step (the recorded run checks it), so a round pairs identical work. A step's wall time is taken between the ``on_step_begin``
and ``on_step_end`` callbacks (generation, grading, the advantages, the optimizer step), and so is its CPU time (the
arm's thread: with ``--threads 1`` torch computes in the calling thread), which the load of a shared machine moves
far less than wall time; the first ``--warmup-steps`` rounds are left out (one-off costs). A comparison's ratio in
one round is one arm's step time over the other's in that round (the same step of the same data); the reported
ratio is the geometric mean over rounds with a 95% Student-t interval on the log ratios (paired by round), for wall
and for CPU time. Memory: the process' peak resident set during an arm's step
(Linux ``VmHWM``, reset before each step through ``/proc/self/clear_refs``), with how far it rose above the
resident set at the step's start (the arm's own working memory: every trainer's model stays resident throughout).

Prints a table and writes JSON: the command, the machine and its load (``uptime`` before and after), the settings,
the calibration, every step's time, peak memory and sampled tokens, and each comparison's ratio and interval.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("grpo", "swap", "vineppo", "grpo_matched")
#: (numerator, denominator, what the ratio answers): ratios of mean step times, numerator over denominator.
COMPARISONS = (
    ("swap", "grpo", "the swap: VinePPOTrainer(advantage_estimator='grpo') / trl.GRPOTrainer"),
    ("vineppo", "grpo_matched", "Monte Carlo credit at equal sampled tokens: vineppo / grpo_matched"),
    ("vineppo", "grpo", "Monte Carlo credit at equal prompts: vineppo / grpo"),
)


# ---- the workload -----------------------------------------------------------------------------------------------


def shipped_policy_dir() -> Path:
    """The tiny policy the wheel ships (the demo's plateau warm-up)."""
    from mcadvantage.demo.config import shipped_warmup_dir

    return shipped_warmup_dir("plateau")


def prompt_rows(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` of the demo's arithmetic problems as ``prompt`` / ``answer`` rows (what ``GSM8KVerifier`` grades)."""
    from mcadvantage.demo.task import generate_problems

    return [{"prompt": p.prompt, "answer": p.answer} for p in generate_problems(n, seed=seed)]


def training_args(arm: str, prompts: int, output_dir: Path, args: argparse.Namespace) -> Any:
    """The arm's config: ``trl.GRPOConfig`` for the GRPO arms, ``VinePPOConfig`` for the others, with the same
    fields (``VinePPOConfig`` keeps every ``GRPOConfig`` default but bf16, set here, and scale_rewards, which
    follows the estimator; so these are the only settings that differ from a default run)."""
    shared: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=args.steps,
        learning_rate=1e-4,  # the demo's RL learning rate: the policy moves, as in a real run
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=prompts * args.generations,
        gradient_accumulation_steps=1,
        num_generations=args.generations,
        temperature=0.6,
        top_p=1.0,
        max_completion_length=args.max_completion_length,
        gradient_checkpointing=False,  # a 1M-parameter model: checkpointing only costs time
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if arm in ("grpo", "grpo_matched"):
        from trl import GRPOConfig

        return GRPOConfig(**shared)
    from mcadvantage import VinePPOConfig

    if arm == "swap":
        return VinePPOConfig(advantage_estimator="grpo", **shared)
    return VinePPOConfig(
        advantage_estimator="vineppo",
        num_mc_rollouts=args.num_mc_rollouts,
        step_segmenter="gsm8k",
        # Every rollout of a step in one or two generate calls, as the demo does.
        mc_max_batch_sequences=1024,
        **shared,
    )


def sampled_tokens(logs: dict[str, Any], responses: int) -> float:
    """Tokens one step sampled, from its logs: the responses (mean completion length x responses) plus every
    estimator's rollouts (``mc/generated_tokens`` and any other ``<prefix>/generated_tokens``)."""
    rollouts = sum(float(v) for k, v in logs.items() if k.endswith("/generated_tokens"))
    return float(logs.get("completions/mean_length", 0.0)) * responses + rollouts


# ---- memory -----------------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else None


def reset_peak_rss() -> bool:
    """Reset the process' peak resident set (Linux >= 4.0); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")
    except OSError:
        return False
    return True


def rss_mib() -> float:
    """The resident set now (MiB); ``ru_maxrss`` where ``/proc`` is absent."""
    kib = _status_kib("VmRSS")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def peak_rss_mib() -> float:
    """The peak resident set since the last :func:`reset_peak_rss` (MiB; since start without a reset)."""
    kib = _status_kib("VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


# ---- arms training side by side, one step at a time ------------------------------------------------------------


class Baton:
    """Lets one arm run a step at a time, in ``order`` (one round: every arm once), rotating the order each round.
    A failing arm stops the others: they raise instead of waiting forever."""

    def __init__(self, arms: Sequence[str]) -> None:
        self.arms = list(arms)
        self.turn = 0
        self.failed: BaseException | None = None
        self.condition = threading.Condition()

    def whose_turn(self) -> str:
        round_, position = divmod(self.turn, len(self.arms))
        return self.arms[(position + round_) % len(self.arms)]

    def acquire(self, arm: str) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.failed is not None or self.whose_turn() == arm)
            if self.failed is not None:
                raise RuntimeError(f"arm {arm!r} stopped: another arm failed") from self.failed

    def release(self) -> None:
        with self.condition:
            self.turn += 1
            self.condition.notify_all()

    def fail(self, err: BaseException) -> None:
        with self.condition:
            self.failed = err
            self.condition.notify_all()


class RandomStreams:
    """One arm's random number streams (Python, NumPy, torch CPU), kept across the switches between arms."""

    def __init__(self, seed: int) -> None:
        from transformers import set_seed

        set_seed(seed)  # as if the arm ran alone from its first step
        self.save()

    def save(self) -> None:
        import numpy as np
        import torch

        self.state = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def restore(self) -> None:
        import numpy as np
        import torch

        python_state, numpy_state, torch_state = self.state
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)


def build_trainer(
    arm: str, prompts: int, args: argparse.Namespace, policy: Path, rows: list[dict], output_dir: Path
):
    """A trainer for ``arm`` from ``policy``: ``trl.GRPOTrainer`` or ``VinePPOTrainer``, printing nothing."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from mcadvantage import GSM8KVerifier

    if arm in ("grpo", "grpo_matched"):
        from trl import GRPOTrainer as trainer_cls
    else:
        from mcadvantage import VinePPOTrainer as trainer_cls
    trainer = trainer_cls(
        model=str(policy),
        reward_funcs=GSM8KVerifier(),
        args=training_args(arm, prompts, output_dir, args),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(policy),
    )
    trainer.remove_callback(PrinterCallback)  # with disable_tqdm, transformers prints every log dict
    return trainer


def train_side_by_side(
    prompts: dict[str, int], args: argparse.Namespace, policy: Path, rows: list[dict], steps: int
) -> dict[str, list[dict[str, float]]]:
    """Train one trainer per arm of ``prompts`` for ``steps`` steps, a step at a time in rotating order; per arm,
    per step: wall seconds, sampled tokens, peak and starting resident set (MiB)."""
    from transformers import TrainerCallback

    arms = list(prompts)
    baton = Baton(arms)
    records: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    # Setting up a training loop draws from the global random streams (the data loader's base seed); the arms set up
    # one after another, each waiting at its first step, so no set-up draws in the middle of another arm's step.
    ready = {arm: threading.Event() for arm in arms}
    go = threading.Event()

    class StepClock(TrainerCallback):
        """Holds the baton from a step's start until its metrics are logged; times the step in between."""

        def __init__(self, arm: str) -> None:
            self.arm, self.holding, self.streams, self.start = arm, False, RandomStreams(args.seed), {}

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            if not ready[self.arm].is_set():
                ready[self.arm].set()
                go.wait()
            baton.acquire(self.arm)
            self.holding = True
            self.streams.restore()
            gc.collect()
            self.start = {
                "rss": rss_mib(),
                "per_step": reset_peak_rss(),
                "cpu": time.thread_time(),
                "time": time.perf_counter(),
            }

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds = time.perf_counter() - self.start["time"]
            records[self.arm].append(
                {
                    "seconds": seconds,
                    "cpu_seconds": time.thread_time() - self.start["cpu"],
                    "rss_at_start_mib": self.start["rss"],
                    "peak_rss_mib": peak_rss_mib(),
                    "peak_is_per_step": self.start["per_step"],
                }
            )

        def on_log(self, *_: Any, logs: dict[str, Any] | None = None, **__: Any) -> None:
            if logs and "completions/mean_length" in logs and records[self.arm]:
                records[self.arm][-1]["sampled_tokens"] = sampled_tokens(
                    logs, prompts[self.arm] * args.generations
                )
            if self.holding:  # the step is done, its logging too: the next arm's turn
                self.holding = False
                self.streams.save()
                if baton.turn % len(arms) == len(arms) - 1:  # the round's last step
                    print(
                        f"round {baton.turn // len(arms) + 1}/{steps}: "
                        + ", ".join(f"{arm} {records[arm][-1]['seconds']:.2f} s" for arm in arms),
                        flush=True,
                    )
                baton.release()

    with tempfile.TemporaryDirectory(prefix="swap-cost-") as tmp:
        trainers = {}
        for arm in arms:
            settings = argparse.Namespace(**{**vars(args), "steps": steps})
            trainers[arm] = build_trainer(arm, prompts[arm], settings, policy, rows, Path(tmp) / arm)
            trainers[arm].add_callback(StepClock(arm))

        def train(arm: str) -> None:
            try:
                trainers[arm].train()
            except BaseException as err:  # stop the other arms too, then report it from the main thread
                baton.fail(err)
                raise

        threads = [threading.Thread(target=train, args=(arm,), name=f"swap-cost-{arm}") for arm in arms]
        for arm, thread in zip(arms, threads, strict=True):
            thread.start()
            while not ready[arm].wait(timeout=1.0) and thread.is_alive():
                pass  # its set-up is running (a failed set-up ends the thread, and the run below reports it)
        go.set()
        for thread in threads:
            thread.join()
    if baton.failed is not None:
        raise RuntimeError("an arm failed; see its traceback above") from baton.failed
    return records


# ---- statistics -------------------------------------------------------------------------------------------------


def ratio_interval(ratios: list[float], level: float = 0.95) -> dict[str, Any]:
    """Geometric mean of paired ratios with a Student-t interval on their logs (None bounds for one ratio)."""
    from mcadvantage.evaluation.stats import student_t_quantile

    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(centre), "low": None, "high": None, "level": level, "n": len(logs)}
    half = student_t_quantile(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "ratio": math.exp(centre),
        "low": math.exp(centre - half),
        "high": math.exp(centre + half),
        "level": level,
        "n": len(logs),
    }


def summarize(
    records: dict[str, list[dict[str, float]]], prompts: dict[str, int], warmup: int
) -> dict[str, Any]:
    """Per arm: median step time, sampled tokens and memory over the timed rounds; per comparison: the ratio of
    step times paired by round."""
    timed = {arm: rows[warmup:] for arm, rows in records.items()}
    arms = {
        arm: {
            "prompts_per_step": prompts[arm],
            "median_step_seconds": statistics.median(r["seconds"] for r in rows),
            "mean_step_seconds": statistics.fmean(r["seconds"] for r in rows),
            "median_step_cpu_seconds": statistics.median(r["cpu_seconds"] for r in rows),
            "sampled_tokens_per_step": statistics.fmean(r.get("sampled_tokens", math.nan) for r in rows),
            "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in rows),
            "median_rise_in_step_mib": statistics.median(
                r["peak_rss_mib"] - r["rss_at_start_mib"] for r in rows
            ),
        }
        for arm, rows in timed.items()
    }
    comparisons = []
    for numerator, denominator, label in COMPARISONS:
        pairs = list(zip(timed[numerator], timed[denominator], strict=True))
        paired = [a["seconds"] / b["seconds"] for a, b in pairs]
        cpu = ratio_interval([a["cpu_seconds"] / b["cpu_seconds"] for a, b in pairs])
        comparisons.append(
            {"numerator": numerator, "denominator": denominator, "label": label, "per_round": paired}
            | ratio_interval(paired)
            | {"cpu": cpu}
        )
    return {"arms": arms, "comparisons": comparisons}


# ---- the run ----------------------------------------------------------------------------------------------------


def uptime() -> str:
    """``uptime``'s line, or the load averages where the command is absent (:func:`_machine.uptime`)."""
    if str(Path(__file__).parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).parent))
    from _machine import uptime as load_line

    return load_line()


def machine(threads: int) -> dict[str, Any]:
    import trl

    if str(Path(__file__).parent) not in sys.path:  # a benchmark imported as a module, not run
        sys.path.insert(0, str(Path(__file__).parent))
    from _machine import machine_info

    import mcadvantage

    return machine_info(torch_threads=threads, trl=trl.__version__, mcadvantage=mcadvantage.__version__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=25, help="training steps of every arm (rounds)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="first rounds left out of the statistics")
    parser.add_argument("--calibration-steps", type=int, default=3, help="steps that measure tokens per step")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (grpo, swap, vineppo)")
    parser.add_argument("--generations", type=int, default=8, help="responses per prompt")
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--num-mc-rollouts", type=int, default=4, help="K of the vineppo arm")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 4 steps, 1 prompt x 2 responses of 24 tokens, K = 2",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "swap_cost.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup_steps, args.calibration_steps = 4, 1, 1
        args.prompts, args.generations, args.max_completion_length, args.num_mc_rollouts = 2, 4, 48, 2
    for name in ("steps", "calibration_steps", "prompts", "num_mc_rollouts", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.generations < 2:
        parser.error(f"--generations must be >= 2 (GRPO needs a group), got {args.generations}")
    if not 0 <= args.warmup_steps < args.steps - 1:
        parser.error(
            f"--warmup-steps must be in [0, --steps - 1) so at least two rounds are timed, got {args.warmup_steps} "
            f"with --steps {args.steps}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars, one per trainer
    torch.set_num_threads(args.threads)
    policy = shipped_policy_dir()
    uptime_before = uptime()
    print(f"policy: {policy}\nmachine load before: {uptime_before}", flush=True)

    # Calibration: GRPO's and VinePPO's sampled tokens per step on the same prompts give grpo_matched its prompts.
    rows = prompt_rows(args.steps * args.prompts * 16, args.seed)  # grpo_matched takes more prompts a step
    calibration = train_side_by_side(
        {"grpo": args.prompts, "vineppo": args.prompts}, args, policy, rows, args.calibration_steps
    )
    tokens = {arm: statistics.fmean(r["sampled_tokens"] for r in rs) for arm, rs in calibration.items()}
    tokens_ratio = tokens["vineppo"] / tokens["grpo"]
    matched_prompts = max(1, round(args.prompts * tokens_ratio))
    print(
        f"calibration: vineppo samples {tokens_ratio:.2f}x grpo's tokens a step -> grpo_matched gets "
        f"{matched_prompts} prompts a step",
        flush=True,
    )
    prompts = {
        "grpo": args.prompts,
        "swap": args.prompts,
        "vineppo": args.prompts,
        "grpo_matched": matched_prompts,
    }
    load_before = os.getloadavg()
    records = train_side_by_side(prompts, args, policy, rows, args.steps)
    load_after = os.getloadavg()
    uptime_after = uptime()
    summary = summarize(records, prompts, args.warmup_steps)

    trainers = {
        "grpo": "trl.GRPOTrainer",
        "swap": "VinePPOTrainer(advantage_estimator='grpo')",
        "vineppo": f"VinePPOTrainer(advantage_estimator='vineppo'), K={args.num_mc_rollouts}",
        "grpo_matched": "trl.GRPOTrainer, vineppo's sampled tokens",
    }
    header = (
        "| arm | trainer | prompts/step | wall s/step (median) | CPU s/step (median) | sampled tokens/step "
        "| peak RSS MiB | rise in step MiB |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|"
    )
    lines = [header]
    for arm, s in summary["arms"].items():
        lines.append(
            f"| {arm} | {trainers[arm]} | {s['prompts_per_step']} | {s['median_step_seconds']:.3f} | "
            f"{s['median_step_cpu_seconds']:.3f} | "
            f"{s['sampled_tokens_per_step']:.0f} | {s['median_peak_rss_mib']:.0f} | {s['median_rise_in_step_mib']:.1f} |"
        )
    lines.append("")
    for c in summary["comparisons"]:
        interval = "n/a" if c["low"] is None else f"[{c['low']:.3f}, {c['high']:.3f}]"
        cpu = c["cpu"]
        cpu_interval = "n/a" if cpu["low"] is None else f"[{cpu['low']:.3f}, {cpu['high']:.3f}]"
        lines.append(
            f"{c['label']}: wall {c['ratio']:.3f}, 95% CI {interval}; CPU {cpu['ratio']:.3f}, 95% CI "
            f"{cpu_interval} ({c['n']} paired rounds)"
        )
    lines.append(f"load before: {uptime_before}")
    lines.append(f"load after:  {uptime_after}")
    table = "\n".join(lines)
    print("\n" + table)

    result = {
        "command": " ".join(["python", "benchmarks/swap_cost.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(args.threads),
        "uptime_before": uptime_before,
        "uptime_after": uptime_after,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "policy": str(policy.relative_to(ROOT)) if policy.is_relative_to(ROOT) else str(policy),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "calibration": {
            "tokens_per_step": tokens,
            "tokens_ratio": tokens_ratio,
            "grpo_matched_prompts_per_step": matched_prompts,
            "steps": calibration,
        },
        "summary": summary,
        "table": table,
        "steps": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
