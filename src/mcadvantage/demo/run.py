"""The offline CPU demo: supervised warm-up, then VinePPO, on a synthetic GSM8K-format task.

``python -m mcadvantage.demo --output_dir demo_output`` (``--help`` lists every flag). Nothing is
downloaded: the task is generated (:mod:`mcadvantage.demo.task`), the tokenizer and the 1M-parameter
Llama are built offline (:mod:`mcadvantage.testing`).

Steps:

1. A short supervised warm-up on reference solutions of problems with at most
   ``--warmup_max_steps`` operations (default 3), so the starting policy has seen the format and the
   arithmetic but never a 4- or 5-operation solution.
2. Held-out greedy accuracy (problems with 2-5 operations, disjoint from every training prompt).
3. VinePPO (``VinePPOTrainer`` with ``GSM8KVerifier`` as the reward, ``GSM8KSegmenter`` steps, ``K``
   rollouts per state on the transformers sampler) on prompts with 2-5 operations and their final
   answers only, no solutions.
4. Held-out greedy accuracy again; ``learning_curve.png``, ``responses.html`` (sampled held-out
   responses, each step coloured by its Monte Carlo advantage under the final policy) and
   ``metrics.json`` in ``--output_dir``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["DemoConfig", "main", "parse_args", "run_demo"]


@dataclass
class DemoConfig:
    """Every knob of the demo (each is a ``--flag`` of ``python -m mcadvantage.demo``)."""

    output_dir: str = "demo_output"
    seed: int = 0
    threads: int = 2
    # model (SPEC: hidden 128, 4 layers, 4 heads of 32 -> 1.06M parameters with the char vocabulary)
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 512
    # data
    warmup_problems: int = 20000
    warmup_max_steps: int = 3
    rl_problems: int = 5000
    eval_problems: int = 600
    curve_problems: int = 200
    min_steps: int = 2
    max_steps: int = 5
    # supervised warm-up
    warmup_steps: int = 400
    warmup_batch_size: int = 32
    warmup_lr: float = 1e-2
    warmup_evals: int = 4
    # VinePPO
    rl_steps: int = 40
    num_mc_rollouts: int = 4
    num_generations: int = 8
    prompts_per_step: int = 4
    rl_lr: float = 3e-4
    temperature: float = 1.0
    num_iterations: int = 1
    beta: float = 0.0
    max_completion_length: int = 64
    rl_evals: int = 4
    # report
    html_responses: int = 12
    quick: bool = False

    def apply_quick(self) -> None:
        """``--quick``: tiny sizes for tests and smoke runs (well under a minute; not meaningful)."""
        self.hidden_size, self.num_layers, self.num_heads, self.head_dim = 64, 2, 2, 32
        self.intermediate_size = 128
        self.warmup_problems, self.rl_problems = 400, 64
        self.eval_problems, self.curve_problems = 32, 16
        self.warmup_steps, self.warmup_batch_size, self.warmup_evals = 20, 16, 2
        self.rl_steps, self.num_mc_rollouts, self.num_generations, self.prompts_per_step = 2, 2, 2, 2
        self.rl_evals, self.html_responses, self.max_completion_length = 1, 3, 40


def parse_args(argv: Sequence[str] | None = None) -> DemoConfig:
    """Parse command-line flags into a :class:`DemoConfig` (``--quick`` overrides the sizes)."""
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(
        prog="python -m mcadvantage.demo",
        description="Offline CPU demo: supervised warm-up, then VinePPO, on a synthetic GSM8K-format task.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in fields(DemoConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            parser.add_argument(f"--{f.name}", action="store_true", help=f"{f.name} (flag)")
        else:
            parser.add_argument(f"--{f.name}", type=type(value), default=None, help=f"default: {value}")
    ns = parser.parse_args(argv)
    config = DemoConfig()
    if ns.quick:
        config.apply_quick()
        config.quick = True
    for f in fields(DemoConfig):
        value = getattr(ns, f.name)
        if value is not None and not isinstance(getattr(defaults, f.name), bool):
            setattr(config, f.name, value)
    _validate(config)
    return config


def _validate(config: DemoConfig) -> None:
    positive = ["warmup_steps", "warmup_batch_size", "rl_steps", "num_mc_rollouts", "prompts_per_step"]
    positive += [
        "eval_problems",
        "curve_problems",
        "threads",
        "max_completion_length",
        "warmup_evals",
        "rl_evals",
    ]
    for name in positive:
        if getattr(config, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(config, name)}.")
    if config.num_generations < 2:
        raise SystemExit(
            f"--num_generations must be >= 2 (TRL's GRPOTrainer, which VinePPOTrainer extends, requires "
            f"it), got {config.num_generations}."
        )
    if not 1 <= config.min_steps <= config.max_steps:
        raise SystemExit(
            f"need 1 <= --min_steps <= --max_steps, got {config.min_steps} and {config.max_steps}."
        )
    if config.curve_problems > config.eval_problems:
        raise SystemExit(
            f"--curve_problems ({config.curve_problems}) must be <= --eval_problems ({config.eval_problems}): "
            "the learning curve is measured on the first curve_problems held-out problems."
        )


def _quiet_libraries() -> None:
    # The demo prints its own progress; TRL/transformers' per-step warnings would bury it.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_DISABLED", "true")
    warnings.filterwarnings("ignore")
    for name in ("transformers", "trl", "accelerate", "datasets", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers
        from datasets.utils.logging import disable_progress_bar

        transformers.logging.set_verbosity_error()
        disable_progress_bar()
    except ImportError:  # pragma: no cover - both are dependencies of the package
        pass


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the whole demo and return the metrics written to ``metrics.json``."""
    _quiet_libraries()
    import torch
    from datasets import Dataset
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    from mcadvantage import GSM8KVerifier, VinePPOConfig, VinePPOTrainer
    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    from .evaluation import evaluate_accuracy
    from .report import plot_learning_curve
    from .task import generate_problems, to_rows
    from .warmup import supervised_warmup

    t_start = time.perf_counter()
    torch.set_num_threads(config.threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    # Disjoint problem sets, each from its own seed: held-out evaluation, warm-up, RL prompts.
    eval_set = generate_problems(
        config.eval_problems,
        seed=1_000_003 * (config.seed + 1),
        min_steps=config.min_steps,
        max_steps=config.max_steps,
    )
    taken = {p.prompt for p in eval_set}
    warmup_set = generate_problems(
        config.warmup_problems,
        seed=2_000_003 * (config.seed + 1),
        min_steps=config.min_steps,
        max_steps=min(config.max_steps, config.warmup_max_steps),
        exclude=taken,
    )
    taken |= {p.prompt for p in warmup_set}
    rl_set = generate_problems(
        config.rl_problems,
        seed=3_000_003 * (config.seed + 1),
        min_steps=config.min_steps,
        max_steps=config.max_steps,
        exclude=taken,
    )
    curve_set = eval_set[: config.curve_problems]

    verifier = GSM8KVerifier()
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=256,
        seed=config.seed,
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[demo] tiny Llama: {n_params / 1e6:.2f}M parameters; {len(warmup_set)} warm-up problems "
        f"(<= {config.warmup_max_steps} operations), {len(rl_set)} RL prompts, {len(eval_set)} held-out "
        f"problems ({config.min_steps}-{config.max_steps} operations)",
        flush=True,
    )

    def curve_accuracy() -> float:
        return evaluate_accuracy(
            model, tokenizer, curve_set, verifier.score, max_new_tokens=config.max_completion_length
        )[0]

    # ---- 1. supervised warm-up ------------------------------------------------------------------------
    warmup_curve: list[tuple[float, float]] = [(0.0, curve_accuracy())]
    eval_every = max(1, config.warmup_steps // config.warmup_evals)
    t0 = time.perf_counter()
    with tqdm(total=config.warmup_steps, desc="warm-up (SFT)", unit="step", file=sys.stdout) as bar:

        def on_step(step: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            if step % eval_every == 0 or step == config.warmup_steps:
                warmup_curve.append((float(step), curve_accuracy()))
                bar.set_postfix(loss=f"{loss:.3f}", acc=f"{warmup_curve[-1][1]:.2f}")

        supervised_warmup(
            model,
            tokenizer,
            warmup_set,
            steps=config.warmup_steps,
            batch_size=config.warmup_batch_size,
            learning_rate=config.warmup_lr,
            seed=config.seed,
            progress=on_step,
        )
    warmup_seconds = time.perf_counter() - t0
    acc_before, _ = evaluate_accuracy(
        model, tokenizer, eval_set, verifier.score, max_new_tokens=config.max_completion_length
    )
    print(f"[demo] held-out greedy accuracy after warm-up (before VinePPO): {acc_before:.3f}", flush=True)

    # ---- 2. VinePPO -----------------------------------------------------------------------------------
    # The trainer loads the policy by path (TRL reloads a reference model from it when beta > 0).
    policy_dir = out / "warmup_policy"
    model.save_pretrained(policy_dir)
    tokenizer.save_pretrained(policy_dir)
    batch = config.prompts_per_step * config.num_generations
    args = VinePPOConfig(
        output_dir=str(out / "vineppo"),
        max_steps=config.rl_steps,
        learning_rate=config.rl_lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=config.num_generations,
        num_iterations=config.num_iterations,
        num_mc_rollouts=config.num_mc_rollouts,
        step_segmenter="gsm8k",
        temperature=config.temperature,
        top_p=1.0,
        beta=config.beta,
        max_completion_length=config.max_completion_length,
        mc_max_batch_sequences=1024,
        # A 1M-parameter model on CPU: no checkpointing (it only costs time here), no bf16.
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=config.seed,
        disable_tqdm=True,  # the demo draws its own progress bar
        dataloader_num_workers=0,
    )
    rl_curve: list[tuple[float, float]] = [(0.0, curve_accuracy())]
    rl_reward: list[tuple[float, float]] = []
    rl_eval_every = max(1, config.rl_steps // config.rl_evals)

    class DemoProgress(TrainerCallback):
        """Progress bar over RL steps, training reward, and the held-out learning curve."""

        def __init__(self) -> None:
            self.bar = tqdm(total=config.rl_steps, desc="VinePPO", unit="step", file=sys.stdout)
            self.trainer: Any = None

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                rl_reward.append((float(state.global_step), float(logs["reward"])))
                self.bar.set_postfix(reward=f"{logs['reward']:.2f}")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.update(1)
            step = state.global_step
            if step % rl_eval_every == 0 or step == config.rl_steps:
                rl_curve.append((float(step), curve_accuracy_of(self.trainer.model)))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.close()

    def curve_accuracy_of(policy: Any) -> float:
        return evaluate_accuracy(
            policy, tokenizer, curve_set, verifier.score, max_new_tokens=config.max_completion_length
        )[0]

    progress = DemoProgress()
    trainer = VinePPOTrainer(
        model=str(policy_dir),
        reward_funcs=verifier,
        args=args,
        train_dataset=Dataset.from_list(to_rows(rl_set)),
        processing_class=tokenizer,
        callbacks=[progress],
    )
    progress.trainer = trainer
    t0 = time.perf_counter()
    trainer.train()
    rl_seconds = time.perf_counter() - t0
    policy = trainer.model
    policy.eval()
    acc_after, _ = evaluate_accuracy(
        policy, tokenizer, eval_set, verifier.score, max_new_tokens=config.max_completion_length
    )
    print(f"[demo] held-out greedy accuracy after VinePPO: {acc_after:.3f}", flush=True)

    # ---- 3. report ------------------------------------------------------------------------------------
    scored = _score_responses(policy, tokenizer, eval_set, config, verifier)
    by_steps = _accuracy_by_num_steps(policy, tokenizer, eval_set, verifier, config)
    plot_learning_curve(
        out / "learning_curve.png",
        warmup=warmup_curve,
        rl=rl_curve,
        rl_reward=rl_reward,
        title=f"Held-out greedy accuracy ({len(curve_set)} problems), seed {config.seed}",
    )
    from .report import render_responses_html

    summary = {
        "held-out accuracy (greedy)": f"{acc_before:.3f} before VinePPO, {acc_after:.3f} after "
        f"({len(eval_set)} problems)",
        "VinePPO": f"{config.rl_steps} steps x {batch} responses, K={config.num_mc_rollouts}, "
        f"temperature {config.temperature}, lr {config.rl_lr}",
    }
    (out / "responses.html").write_text(
        render_responses_html(scored, title="mcadvantage demo: Monte Carlo step advantages", summary=summary),
        encoding="utf-8",
    )
    metrics = {
        "seed": config.seed,
        "accuracy_before": acc_before,
        "accuracy_after": acc_after,
        "eval_problems": len(eval_set),
        "accuracy_after_by_num_steps": by_steps,
        "warmup_curve": warmup_curve,
        "rl_curve": rl_curve,
        "rl_reward": rl_reward,
        "warmup_seconds": warmup_seconds,
        "rl_seconds": rl_seconds,
        "total_seconds": time.perf_counter() - t_start,
        "parameters": n_params,
        "config": asdict(config),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(
        f"[demo] accuracy {acc_before:.3f} -> {acc_after:.3f}; warm-up {warmup_seconds:.0f}s, VinePPO "
        f"{rl_seconds:.0f}s, total {metrics['total_seconds']:.0f}s. Wrote {out / 'learning_curve.png'}, "
        f"{out / 'responses.html'}, {out / 'metrics.json'}",
        flush=True,
    )
    return metrics


def _accuracy_by_num_steps(
    policy: Any, tokenizer: Any, problems: Any, verifier: Any, config: DemoConfig
) -> dict:
    from .evaluation import generate_responses

    responses = generate_responses(
        policy, tokenizer, [p.prompt for p in problems], max_new_tokens=config.max_completion_length
    )
    groups: dict[int, list[float]] = {}
    for p, r in zip(problems, responses, strict=True):
        groups.setdefault(p.num_steps, []).append(verifier.score(r, p.answer))
    return {str(k): sum(v) / len(v) for k, v in sorted(groups.items())}


def _score_responses(policy: Any, tokenizer: Any, problems: Any, config: DemoConfig, verifier: Any) -> list:
    """Sample one response per held-out prompt with the final policy and estimate its step values
    with the library's own estimator (fresh rollouts, independent of training)."""
    from mcadvantage import MCValueEstimator, Trajectory, TransformersSampler, get_segmenter
    from mcadvantage.segmenters import segment_completion

    from .evaluation import generate_responses
    from .report import ScoredResponse

    chosen = problems[: config.html_responses]
    texts = generate_responses(
        policy,
        tokenizer,
        [p.prompt for p in chosen],
        do_sample=True,
        temperature=config.temperature,
        max_new_tokens=config.max_completion_length,
    )
    segmenter = get_segmenter("gsm8k")
    trajectories = []
    for p, text in zip(chosen, texts, strict=True):
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
    estimator = MCValueEstimator(
        sampler,
        verifier,
        tokenizer,
        num_rollouts=max(config.num_mc_rollouts, 8),
        max_completion_length=config.max_completion_length + 1,
    )
    estimate = estimator.estimate(trajectories)
    scored = []
    for p, _text, traj, values, advs in zip(
        chosen, texts, trajectories, estimate.values, estimate.step_advantages, strict=True
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
    config = parse_args(argv)
    run_demo(config)
    return 0
