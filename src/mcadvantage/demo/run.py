"""The offline CPU demo: GRPO and VinePPO side by side from one starting policy, on a synthetic GSM8K-format task.

``python -m mcadvantage.demo --output_dir demo_output`` (``--help`` lists every flag). Nothing is
downloaded: the task is generated (:mod:`mcadvantage.demo.task`), the tokenizer and the 1M-parameter
Llama are built offline (:mod:`mcadvantage.testing`).

Steps:

1. The starting policy: a supervised warm-up on demonstrations of problems with 2-5 operations. The
   demonstrations are imperfect on purpose, as real supervised data is: for problems with at least
   ``--flawed_demo_min_steps`` operations (default 4), a fraction ``--flawed_demo_rate`` (default 0.6) of
   the demonstrations forget the last operation and report the value before it
   (:func:`~mcadvantage.demo.task.skip_last_solution`). The package ships the checkpoint of the default settings
   and seed 0, trained to a plateau (``mcadvantage/demo/warmup_plateau``, made by ``python -m
   testbed.make_warmup --warmup_schedule plateau`` in a repository checkout); ``--warmup_schedule fixed`` starts
   from the 0.1 demo's checkpoint, which only a repository checkout has (``testbed/warmup_policy``). Other
   settings, ``--train_warmup``, or a checkpoint that is not there train it here (about 5 minutes).
2. Held-out greedy accuracy (problems with 2-5 operations, disjoint from every training prompt).
3. Each arm of ``--arms`` (default ``grpo,vineppo``), one after another from the same starting policy
   with the same prompts, prompt order, batch layout, learning rate and temperature: the same
   ``VinePPOTrainer`` with ``GSM8KVerifier`` as the reward, only the advantage differs (GRPO's
   group-relative advantage, or Monte Carlo step values from ``K`` rollouts per state on the
   transformers sampler). See :mod:`mcadvantage.demo.arms`.
4. Held-out greedy accuracy of each arm, a table, ``learning_curve.png`` (every arm on one axis, with a
   band of one binomial standard error), ``responses.html`` (sampled held-out responses of the starting
   policy and of each trained policy, each step coloured by its Monte Carlo advantage under that policy)
   and ``metrics.json`` in ``--output_dir``.

One run is one seed: RL run-to-run noise on this task (about 0.05 held-out accuracy) is larger than the
differences between arms, so the demo shows how to compare, and ``benchmarks/learning_efficiency.py``
measures the comparison over seeds (docs/learning-efficiency.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mcadvantage.demo.config import (
    DemoConfig,
    arm_names,
    build_data,
    parse_args,
    parse_arm,
    shipped_warmup_dir,
    usable_shipped_warmup,
    validate_config,
)
from mcadvantage.demo.equal_cost import equal_cost_lines, load_equal_cost, plot_equal_cost
from mcadvantage.demo.task import FLAW_DESCRIPTION, ArithmeticProblem

__all__ = ["accuracy_by_num_steps", "main", "run_demo"]


def accuracy_by_num_steps(problems: Sequence[ArithmeticProblem], scores: Sequence[float]) -> dict[str, float]:
    """Mean score per number of operations (keys are strings, for JSON)."""
    groups: dict[int, list[float]] = {}
    for p, s in zip(problems, scores, strict=True):
        groups.setdefault(p.num_steps, []).append(float(s))
    return {str(k): sum(v) / len(v) for k, v in sorted(groups.items())}


def _binomial_stderr(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def _quiet_libraries() -> None:
    # The demo prints its own progress; TRL/transformers' per-step warnings and bars would bury it.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_DISABLED", "true")
    warnings.filterwarnings("ignore")
    for name in ("transformers", "trl", "accelerate", "datasets", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers
        from datasets.utils.logging import disable_progress_bar

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()  # "Loading weights", "Writing model shards"
        disable_progress_bar()
    except ImportError:  # pragma: no cover - both are dependencies of the package
        pass


def _fmt_by_steps(by_steps: dict[str, float]) -> str:
    return ", ".join(f"{k} ops {v:.2f}" for k, v in by_steps.items())


def _arm_label(name: str) -> str:
    if name.startswith("vineppo_k"):
        return f"VinePPO (K={name.removeprefix('vineppo_k')})"
    return name.upper() if name in ("grpo", "rloo") else name


@dataclass
class _Evaluator:
    """Greedy held-out accuracy on the demo's problems (``tokenizer`` is set once the starting policy has one)."""

    config: DemoConfig
    eval_set: Sequence[ArithmeticProblem]
    curve_set: Sequence[ArithmeticProblem]
    verifier: Any
    tokenizer: Any = None

    def accuracy(self, policy: Any, problems: Sequence[ArithmeticProblem]) -> tuple[float, list[float]]:
        """Accuracy on ``problems`` and each problem's score."""
        from mcadvantage.demo.evaluation import evaluate_accuracy

        acc, _, scores = evaluate_accuracy(
            policy,
            self.tokenizer,
            problems,
            self.verifier.score,
            max_new_tokens=self.config.max_completion_length,
        )
        return acc, scores

    def curve(self, policy: Any) -> float:
        """Accuracy on the learning curve's first problems."""
        return self.accuracy(policy, self.curve_set)[0]

    def full(self, policy: Any) -> tuple[float, dict[str, float]]:
        """Accuracy on the whole held-out set, and by number of operations."""
        acc, scores = self.accuracy(policy, self.eval_set)
        return acc, accuracy_by_num_steps(self.eval_set, scores)


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the whole demo and return the metrics written to ``metrics.json``: the starting policy
    (:func:`_starting_policy`), the arms from it (:func:`_run_arm`), then the report (:func:`_report`)."""
    validate_config(config)
    _quiet_libraries()
    import torch

    from mcadvantage import GSM8KVerifier

    t_start = time.perf_counter()
    torch.set_num_threads(max(1, min(config.threads, os.cpu_count() or 1)))
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    arms = [parse_arm(name) for name in arm_names(config)]
    data = build_data(config)
    ev = _Evaluator(config, data.eval_set, data.eval_set[: config.curve_problems], GSM8KVerifier())

    t0 = time.perf_counter()
    model, warmup_curve, shipped = _starting_policy(config, data, out / "warmup_policy", ev)
    warmup_seconds = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    _print_start(config, data, n_params, len(ev.eval_set))
    acc_before, by_steps_before = ev.full(model)
    print(
        f"[demo] held-out greedy accuracy of the starting policy: {acc_before:.3f} ({_fmt_by_steps(by_steps_before)})",
        flush=True,
    )
    # the arms, one after another from the same starting policy
    results: dict[str, dict[str, Any]] = {}
    policies: dict[str, Any] = {}
    for arm in arms:
        policies[arm.name], results[arm.name] = _run_arm(config, arm, data, out, ev, acc_before, warmup_curve)

    t0 = time.perf_counter()
    _print_table(results, acc_before, len(ev.eval_set))
    _report(config, out, data, ev, model, policies, results, acc_before, warmup_curve, shipped)
    n_eval = len(ev.eval_set)
    metrics = {
        "seed": config.seed,
        "starting_policy": "shipped checkpoint" if shipped is not None else "trained warm-up",
        "accuracy_before": acc_before,
        "stderr_before": _binomial_stderr(acc_before, n_eval),
        "eval_problems": n_eval,
        "accuracy_before_by_num_steps": by_steps_before,
        "warmup_curve": warmup_curve,
        "arms": results,
        "warmup_seconds": warmup_seconds,
        "report_seconds": time.perf_counter() - t0,
        "total_seconds": time.perf_counter() - t_start,
        "parameters": n_params,
        "threads": torch.get_num_threads(),
        "flawed_demonstrations": data.flawed,
        "config": asdict(config),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(
        f"[demo] total {metrics['total_seconds']:.0f}s. Wrote {out / 'learning_curve.png'}, "
        f"{out / 'responses.html'}, {out / 'metrics.json'}",
        flush=True,
    )
    return metrics


def _print_start(config: DemoConfig, data: Any, n_params: int, n_eval: int) -> None:
    """What the demo trains: the model, the threads and the data."""
    import torch

    print(
        f"[demo] tiny Llama: {n_params / 1e6:.2f}M parameters, {torch.get_num_threads()} CPU threads. "
        f"{len(data.warmup)} warm-up demonstrations ({data.flawed} of them flawed, in "
        f"{config.flawed_demo_min_steps}+ operation problems: {FLAW_DESCRIPTION}), "
        f"{len(data.rl_set)} RL prompts, "
        f"{n_eval} held-out problems ({config.min_steps}-{config.max_steps} operations)",
        flush=True,
    )


def _starting_policy(
    config: DemoConfig, data: Any, policy_dir: Path, ev: _Evaluator
) -> tuple[Any, list[tuple[float, float]], dict[str, Any] | None]:
    """The starting policy in ``policy_dir``: the shipped warm-up checkpoint, or a warm-up trained now. Returns the
    model, its warm-up curve and the shipped checkpoint's metadata (None when trained here); sets ``ev``'s
    tokenizer."""
    import shutil

    from tqdm.auto import tqdm

    from mcadvantage.demo.arms import load_policy, train_warmup_policy

    shipped = usable_shipped_warmup(config)
    if shipped is not None:
        if policy_dir.exists():
            shutil.rmtree(policy_dir)
        shutil.copytree(shipped_warmup_dir(config.warmup_schedule), policy_dir)
        model, ev.tokenizer = load_policy(policy_dir)
        print(
            f"[demo] starting policy: the shipped warm-up checkpoint ({_warmup_length(shipped)}, seed "
            f"{shipped['config']['seed']}; retrain it with --train_warmup, or python -m testbed.make_warmup in a "
            "repository checkout)",
            flush=True,
        )
        return model, [tuple(point) for point in shipped["curve_on_first_problems"]], shipped
    from mcadvantage.testing import build_char_tokenizer

    if not (config.train_warmup or config.quick or shipped_warmup_dir(config.warmup_schedule).exists()):
        print(
            f"[demo] no {config.warmup_schedule}-schedule warm-up checkpoint at "
            f"{shipped_warmup_dir(config.warmup_schedule)} (the fixed one is kept in a repository checkout's "
            "testbed/, not in the installed package): training the warm-up here",
            flush=True,
        )
    ev.tokenizer = build_char_tokenizer()
    with tqdm(
        total=config.warmup_total_steps(), desc="warm-up (SFT)", unit="step", file=sys.stdout, mininterval=1
    ) as bar:

        def on_warmup_step(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

        model, ev.tokenizer, warmup_curve = train_warmup_policy(
            config, data, policy_dir, evaluate=ev.curve, on_step=on_warmup_step
        )
    return model, warmup_curve, None


def _run_arm(
    config: DemoConfig,
    arm: Any,
    data: Any,
    out: Path,
    ev: _Evaluator,
    acc_before: float,
    warmup_curve: list[tuple[float, float]],
) -> tuple[Any, dict[str, Any]]:
    """Train one arm from the starting policy, evaluate and save it; its policy and its record in ``metrics.json``."""
    from tqdm.auto import tqdm

    from mcadvantage.demo.arms import run_rl_arm

    label = _arm_label(arm.name)
    # A critic warm-up's steps come on top of the policy's (run_rl_arm).
    total_steps = config.rl_steps + arm.critic_warmup_steps
    with tqdm(total=total_steps, desc=label, unit="step", file=sys.stdout, mininterval=1) as bar:

        def on_rl_step(step: int, logs: dict[str, float]) -> None:
            bar.update(1)
            bar.set_postfix(reward=f"{logs.get('reward', 0.0):.2f}", refresh=False)

        policy, records, logs = run_rl_arm(
            config,
            arm,
            out / "warmup_policy",
            data,
            out / f"{arm.name}_trainer",
            evaluate=ev.curve,
            eval_every=max(1, config.rl_steps // config.rl_evals),
            on_step=on_rl_step,
        )
    acc_after, by_steps_after = ev.full(policy)
    print(
        f"[demo] {label}: held-out greedy accuracy {acc_before:.3f} -> {acc_after:.3f} "
        f"({_fmt_by_steps(by_steps_after)})",
        flush=True,
    )
    policy.save_pretrained(out / f"{arm.name}_policy")
    ev.tokenizer.save_pretrained(out / f"{arm.name}_policy")
    return policy, {
        "label": label,
        "accuracy_after": acc_after,
        "improvement": acc_after - acc_before,
        "stderr_after": _binomial_stderr(acc_after, len(ev.eval_set)),
        "accuracy_after_by_num_steps": by_steps_after,
        "curve": [(0.0, warmup_curve[-1][1])] + [(float(r.step), r.accuracy) for r in records],
        "train_seconds": records[-1].train_seconds,
        "sampled_tokens": records[-1].sampled_tokens,
        "mean_rollouts_per_step": sum(r.get("mc/rollouts", 0.0) for r in logs) / max(1, len(logs)),
        "logs": [
            {k: r[k] for k in ("step", "reward", "sampled_tokens", "mc/rollouts", "mc/seconds") if k in r}
            for r in logs
        ],
    }


def _print_table(results: dict[str, dict[str, Any]], acc_before: float, n_eval: int) -> None:
    """The held-out accuracy of the starting policy and of each arm, with its cost."""
    header = f"{'arm':<16} {'held-out accuracy':>22} {'change':>8} {'train s':>8} {'sampled tokens':>15}"
    print("[demo] " + header + "\n[demo] " + "-" * len(header))
    print(f"[demo] {'starting policy':<16} {acc_before:>14.3f} ± {_binomial_stderr(acc_before, n_eval):.3f}")
    for r in results.values():
        print(
            f"[demo] {r['label']:<16} {r['accuracy_after']:>14.3f} ± {r['stderr_after']:.3f} "
            f"{r['improvement']:>+8.3f} {r['train_seconds']:>8.0f} {r['sampled_tokens']:>15,.0f}"
        )
    print(
        "[demo] One seed, one run per arm: RL run-to-run noise on this task is about 0.05 (larger than the "
        "binomial error); docs/learning-efficiency.md has the multi-seed comparison.",
        flush=True,
    )


def _report(
    config: DemoConfig,
    out: Path,
    data: Any,
    ev: _Evaluator,
    model: Any,
    policies: dict[str, Any],
    results: dict[str, dict[str, Any]],
    acc_before: float,
    warmup_curve: list[tuple[float, float]],
    shipped: dict[str, Any] | None,
) -> None:
    """The equal-cost answer for a shipped start, the learning curve and the responses page."""
    from mcadvantage.demo.report import plot_learning_curve, render_responses_html

    equal_cost = load_equal_cost(shipped_warmup_dir(config.warmup_schedule)) if shipped is not None else None
    if equal_cost is not None:  # what one seed cannot say: the regime study's answer for this starting policy
        for line in equal_cost_lines(equal_cost):
            print(f"[demo] {line}")
        plot_equal_cost(equal_cost, out / "gradient_quality.png")
        print(
            f"[demo] Plotted as {out / 'gradient_quality.png'}; docs/gradient-quality.md explains it.",
            flush=True,
        )
    shown = _html_problems(ev.eval_set, config.html_responses)
    sections = {
        "The starting policy (after the supervised warm-up)": _score_responses(
            model, ev.tokenizer, shown, config, ev.verifier
        )
    }
    for name, r in results.items():
        sections[f"After {r['label']}"] = _score_responses(
            policies[name], ev.tokenizer, shown, config, ev.verifier
        )
    plot_learning_curve(
        out / "learning_curve.png",
        warmup=warmup_curve,
        arms={r["label"]: r["curve"] for r in results.values()},
        noise_problems=len(ev.curve_set),
        title=f"Held-out greedy accuracy ({len(ev.curve_set)} problems), seed {config.seed}",
    )
    n_eval, batch = len(ev.eval_set), config.prompts_per_step * config.num_generations
    summary = {
        "held-out greedy accuracy": f"{acc_before:.3f} for the starting policy; "
        + "; ".join(f"{r['accuracy_after']:.3f} after {r['label']}" for r in results.values())
        + f" ({n_eval} problems, binomial standard error about {_binomial_stderr(acc_before, n_eval):.3f})",
        "warm-up": f"{config.warmup_steps} steps x {config.warmup_batch_size} demonstrations, "
        f"{data.flawed} of {len(data.warmup)} demonstrations flawed ({FLAW_DESCRIPTION})",
        "RL": f"{config.rl_steps} steps x {batch} responses, temperature {config.temperature}, lr {config.rl_lr}; "
        "the arms differ only in the advantage",
    }
    (out / "responses.html").write_text(
        render_responses_html(
            sections, title="mcadvantage demo: Monte Carlo step advantages", summary=summary
        ),
        encoding="utf-8",
    )


def _warmup_length(meta: dict[str, Any]) -> str:
    """How long a shipped warm-up trained, from its warmup.json."""
    if "plateau" in meta:
        plateau = meta["plateau"]
        decay = meta["config"]["warmup_decay_steps"]
        return (
            f"trained to a plateau: best of {plateau['stop_step']} supervised steps at step {plateau['best_step']}"
            + (f", then {decay} decay steps" if decay else ", kept as it is (no decay)")
        )
    return f"{meta['config']['warmup_steps']} supervised steps"


def _html_problems(problems: Sequence[ArithmeticProblem], n: int) -> list[ArithmeticProblem]:
    """The first ``n`` held-out problems, but half of them long (the ones the flawed demonstrations
    taught the policy to get wrong), so the page shows both kinds of responses."""
    if n <= 0:
        return []
    longest = max(p.num_steps for p in problems)
    long = [p for p in problems if p.num_steps == longest][: (n + 1) // 2]
    rest = [p for p in problems if p.num_steps != longest][: n - len(long)]
    chosen = long + rest
    if len(chosen) < n:  # too few of one kind: fill with whatever is left, in order
        chosen += [p for p in problems if p not in chosen][: n - len(chosen)]
    return chosen


def _score_responses(
    policy: Any, tokenizer: Any, problems: Sequence[ArithmeticProblem], config: DemoConfig, verifier: Any
) -> list:
    """Sample one response per problem with ``policy`` (at the RL temperature) and estimate its step
    values with the library's own estimator and fresh rollouts of the same policy."""
    import torch

    from mcadvantage import MCValueEstimator, Trajectory, TransformersSampler, get_segmenter
    from mcadvantage.demo.evaluation import generate_responses
    from mcadvantage.demo.report import ScoredResponse
    from mcadvantage.tasks.segmentation import segment_completion

    if not problems:
        return []
    torch.manual_seed(config.seed)  # the same problems get comparable samples before and after
    texts = generate_responses(
        policy,
        tokenizer,
        [p.prompt for p in problems],
        do_sample=True,
        temperature=config.temperature,
        max_new_tokens=config.max_completion_length,
    )
    segmenter = get_segmenter("gsm8k")
    trajectories = []
    for p, text in zip(problems, texts, strict=True):
        prompt_ids = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(completion_ids) < config.max_completion_length:  # stopped at EOS, not at the budget
            completion_ids.append(tokenizer.eos_token_id)
        boundaries = segment_completion(segmenter, tokenizer, completion_ids)
        trajectories.append(
            Trajectory(
                prompt_ids,
                completion_ids,
                boundaries,
                verifier.score(text, p.answer),
                p.prompt,
                {"answer": p.answer},
            )
        )
    sampler = TransformersSampler(policy, tokenizer, temperature=config.temperature, max_batch_sequences=1024)
    # More rollouts than training uses: the page is read by people, so less noisy values are worth it.
    estimator = MCValueEstimator(
        sampler,
        verifier,
        tokenizer,
        num_rollouts=max(config.num_mc_rollouts, 16),
        max_completion_length=config.max_completion_length + 1,
    )
    estimate = estimator.estimate(trajectories)
    scored = []
    for p, traj, values, advs in zip(
        problems, trajectories, estimate.values, estimate.step_advantages, strict=True
    ):
        b = traj.step_boundaries
        steps = [
            tokenizer.decode(traj.completion_ids[b[i] : b[i + 1]], skip_special_tokens=True)
            for i in range(len(b) - 1)
        ]
        scored.append(ScoredResponse(p.prompt, steps, list(values), list(advs), traj.reward, p.answer))
    return scored


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m mcadvantage.demo``."""
    # Idle OpenMP threads must sleep, not spin: on a busy 2-core machine spinning threads of torch's
    # pool fight for the cores and one training step takes 20x longer (measured here). It only has an
    # effect before torch is imported, hence here and not in run_demo.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    config = parse_args(argv)
    run_demo(config)
    return 0
