"""Training one arm of the side-by-side comparison on the demo task: the supervised warm-up every arm starts from
(:func:`train_warmup_policy`) and an RL arm (:func:`run_rl_arm`: ``VinePPOTrainer`` with the arm's estimator).

Used by the demo (GRPO and VinePPO side by side) and by ``benchmarks/learning_efficiency.py`` (every arm, several
seeds). What an arm name means is :func:`mcadvantage.demo.config.parse_arm`'s grammar. Every RL arm is the same
``VinePPOTrainer`` with the same settings (:func:`rl_training_args`); the estimator is the only difference, so a gap
between arms is the advantage's doing. The RL-free arms (``sft``, ``restem``, ``dpo_plus``) are benchmark code
outside the installed package: their names in ``testbed/arms.py``, their training in ``benchmarks/rl_free_arms.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mcadvantage.demo.config import ArmSpec, DemoConfig, DemoData

__all__ = [
    "RESUME_FILE",
    "ArmRecord",
    "initial_policy",
    "load_policy",
    "rl_training_args",
    "run_rl_arm",
    "train_warmup_policy",
]


@dataclass
class ArmRecord:
    """One point of an arm's learning curve: held-out greedy accuracy after ``step`` optimizer steps,
    with the responses sampled so far (policy responses plus Monte Carlo rollouts, in tokens) and the
    training wall time so far (evaluation excluded)."""

    arm: str
    seed: int
    step: int
    accuracy: float
    sampled_tokens: float
    train_seconds: float


def load_policy(policy_dir: str | Path) -> tuple[Any, Any]:
    """The saved policy and tokenizer in ``policy_dir`` (a warm-up checkpoint)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(policy_dir), AutoTokenizer.from_pretrained(policy_dir)


def initial_policy(config: DemoConfig) -> tuple[Any, Any]:
    """The demo's tiny Llama before any training, built from ``config.seed`` and its size settings, with the
    character tokenizer: ``(model, tokenizer)``. The warm-up starts from it."""
    import torch

    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    torch.manual_seed(config.seed)
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
    return model, tokenizer


def train_warmup_policy(
    config: DemoConfig,
    data: DemoData,
    save_dir: str | Path,
    *,
    evaluate: Callable[[Any], float] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    schedule_record: dict[str, Any] | None = None,
    resume: bool = False,
    keep_resume_state: bool = False,
) -> tuple[Any, Any, list[tuple[float, float]]]:
    """Build the demo's tiny Llama from ``config.seed``, train it on ``data.warmup`` with the demo's
    warm-up recipe (``config.warmup_*``), save it with its tokenizer to ``save_dir`` and return
    ``(model, tokenizer, curve)``, where ``curve`` holds ``(step, evaluate(model))`` at step 0, every
    ``config.warmup_steps // config.warmup_evals`` steps (``config.warmup_eval_every`` for the plateau schedule) and
    the last step (empty without ``evaluate``). With ``config.warmup_schedule="plateau"``, ``schedule_record`` (if
    given) receives the validation curve, the best step and the stop step.

    The plateau schedule saves where it stands at every evaluation to ``save_dir/resume_state.pt``
    (:data:`RESUME_FILE`; removed once the policy is saved, unless ``keep_resume_state``: a caller with more to do
    before the run counts as done removes it then); with ``resume=True`` a run killed in its constant phase
    continues from its last evaluation, exactly as if it had not stopped (same batches, optimizer and record)."""
    from mcadvantage.demo.warmup import train_to_plateau

    model, tokenizer = initial_policy(config)
    if config.warmup_schedule == "plateau":
        record = train_to_plateau(
            config,
            data,
            model,
            tokenizer,
            evaluate=evaluate,
            on_step=on_step,
            log_path=Path(save_dir) / "plateau_log.json",
            state_path=Path(save_dir) / RESUME_FILE,
            resume=resume,
        )
        # The final policy's point after the curve; without a decay it is the best step's own point, already there.
        curve = record["held_out"] + (
            [(float(record["stop_step"] + config.warmup_decay_steps), record["final_held_out"])]
            if "final_held_out" in record and config.warmup_decay_steps
            else []
        )
        if schedule_record is not None:
            schedule_record.update(record)
    else:
        curve = _train_fixed(config, data, model, tokenizer, evaluate=evaluate, on_step=on_step)
    model.eval()
    save_dir = Path(save_dir)
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    if not keep_resume_state:
        (save_dir / RESUME_FILE).unlink(missing_ok=True)
    return model, tokenizer, curve


def _train_fixed(
    config: DemoConfig,
    data: DemoData,
    model: Any,
    tokenizer: Any,
    *,
    evaluate: Callable[[Any], float] | None,
    on_step: Callable[[int, float], None] | None,
) -> list[tuple[float, float]]:
    """``config.warmup_steps`` steps of the warmup-stable-decay schedule (the 0.1 demo checkpoint's recipe)."""
    from mcadvantage.demo.warmup import supervised_warmup

    every = max(1, config.warmup_steps // config.warmup_evals)
    curve: list[tuple[float, float]] = []
    if evaluate is not None:
        curve.append((0.0, evaluate(model)))

    def progress(step: int, loss: float) -> None:
        if evaluate is not None and (step % every == 0 or step == config.warmup_steps):
            curve.append((float(step), evaluate(model)))
            model.train()  # evaluation switched it to eval mode
        if on_step is not None:
            on_step(step, loss)

    supervised_warmup(
        model,
        tokenizer,
        data.warmup,
        steps=config.warmup_steps,
        batch_size=config.warmup_batch_size,
        learning_rate=config.warmup_lr,
        seed=config.seed,
        progress=progress,
    )
    return curve


#: Where an unfinished plateau warm-up keeps what resuming it needs (in its output directory; the research
#: testbed's ``testbed.make_warmup.resumable_step`` reads where one stands).
RESUME_FILE = "resume_state.pt"


def step_sampled_tokens(logs: dict[str, Any], responses_per_step: int) -> float:
    """Tokens one RL step sampled, from its logs: the responses (mean completion length x responses; a tree's
    generated tokens instead, which count its shared prefixes once) plus every estimator's rollouts."""
    responses = float(logs.get("completions/mean_length", 0.0)) * responses_per_step
    return float(logs.get("tree/generated_tokens", responses)) + rollout_tokens(logs)


def rollout_tokens(logs: dict[str, Any]) -> float:
    """Tokens an estimator sampled beyond the responses in one step's logs: every ``<prefix>/generated_tokens``
    (``mc/`` for VinePPO, ``hybrid/`` for the hybrid), except a tree's, which are its responses."""
    return sum(
        float(v) for k, v in logs.items() if k.endswith("/generated_tokens") and k != "tree/generated_tokens"
    )


def rl_training_args(config: DemoConfig, arm: ArmSpec, output_dir: str | Path) -> Any:
    """The ``VinePPOConfig`` of an RL arm: the demo's settings, with the arm's estimator, ``K`` and
    prompts per step. Every RL arm shares everything else (seed, learning rate, temperature, batch
    layout per prompt), so the data order is the same: TRL's sampler draws prompts from ``seed``."""
    from mcadvantage import VinePPOConfig
    from mcadvantage.estimators import get_advantage_estimator

    prompts = arm.prompts_per_step or config.prompts_per_step
    # The demo's K and segmenter go to the estimators that read them (another estimator would refuse them).
    reads = get_advantage_estimator(arm.advantage_estimator).config_fields
    shared = {"num_mc_rollouts": arm.num_mc_rollouts or config.num_mc_rollouts, "step_segmenter": "gsm8k"}
    return VinePPOConfig(
        output_dir=str(output_dir),
        advantage_estimator=arm.advantage_estimator,
        max_steps=config.rl_steps,
        learning_rate=config.rl_lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=prompts * config.num_generations,
        gradient_accumulation_steps=1,
        num_generations=config.num_generations,
        num_iterations=config.num_iterations,
        **{name: value for name, value in shared.items() if name in reads},
        temperature=config.temperature,
        top_p=1.0,
        beta=config.beta,
        max_completion_length=config.max_completion_length,
        # Every rollout of a step in one or two generate calls: at this model size transformers'
        # per-decoding-step overhead, not the arithmetic, is the cost.
        mc_max_batch_sequences=1024,
        # A 1M-parameter model on CPU: no checkpointing (it only costs time here), no bf16.
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=config.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **dict(arm.mc_options),
    )


def _recorder(
    config: DemoConfig,
    arm: ArmSpec,
    batch: int,
    evaluate: Callable[[Any], float],
    eval_every: int,
    on_record: Callable[[ArmRecord], None] | None,
    on_step: Callable[[int, dict[str, float]], None] | None,
    records: list[ArmRecord],
    logs_out: list[dict[str, float]],
) -> Any:
    """:func:`run_rl_arm`'s callback: every step's logs into ``logs_out`` and, every ``eval_every`` policy steps and
    at the last, an evaluation into ``records`` (its time left out of the training seconds). Set its ``trainer``
    before training."""
    from transformers import TrainerCallback

    warmup = arm.critic_warmup_steps

    class Recorder(TrainerCallback):
        # Evaluates in on_log, not on_step_end: transformers logs a step after its on_step_end, and the
        # record must count that step's sampled tokens.
        trainer: Any = None
        tokens, eval_seconds, start = 0.0, 0.0, 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not logs or "reward" not in logs:
                return
            step = int(state.global_step) - warmup  # the policy's steps (<= 0 while only the critic trains)
            tokens = step_sampled_tokens(logs, batch)
            self.tokens += tokens
            kept = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
            kept.update(step=float(step), sampled_tokens=tokens)
            if warmup:
                kept.update(trainer_step=float(state.global_step), critic_warmup=float(step <= 0))
            logs_out.append(kept)
            if on_step is not None:
                on_step(step, kept)
            if step > 0 and (step % eval_every == 0 or step == config.rl_steps):
                train_seconds = time.perf_counter() - self.start - self.eval_seconds
                t0 = time.perf_counter()
                accuracy = evaluate(self.trainer.model)
                self.trainer.model.train()
                self.eval_seconds += time.perf_counter() - t0
                record = ArmRecord(arm.name, config.seed, step, accuracy, self.tokens, train_seconds)
                records.append(record)
                if on_record is not None:
                    on_record(record)

    return Recorder()


def run_rl_arm(
    config: DemoConfig,
    arm: ArmSpec,
    policy_dir: str | Path,
    data: DemoData,
    output_dir: str | Path,
    *,
    evaluate: Callable[[Any], float],
    eval_every: int,
    on_record: Callable[[ArmRecord], None] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[Any, list[ArmRecord], list[dict[str, float]]]:
    """Train one RL arm from the policy in ``policy_dir`` for ``config.rl_steps`` policy steps.

    ``evaluate(model) -> accuracy`` is called after every ``eval_every`` steps and after the last one
    (its time is not counted as training time); each result becomes an :class:`ArmRecord` passed to
    ``on_record``. ``on_step(step, logs)`` sees every step's logged metrics (for progress bars).

    An arm with a critic warm-up (``arm.critic_warmup_steps`` W > 0, ``ppo_warm``) trains ``W + config.rl_steps``
    steps, the first W the critic's alone, so the policy gets ``config.rl_steps`` steps like every other arm. Steps
    count the policy's: a record's ``step`` and a log's ``step`` are the trainer's step minus W (the warm-up's logs
    have steps ``1 - W`` to 0 and ``critic_warmup`` 1; every log keeps the trainer's own as ``trainer_step``), and
    evaluations fall on the same policy steps as another arm's. Sampled tokens and training seconds include the
    warm-up's.
    Returns the trained model, the records (without step 0: the caller owns the starting policy's
    evaluation) and the per-step logs.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from mcadvantage import GSM8KVerifier, VinePPOTrainer

    if eval_every < 1:
        raise ValueError(f"run_rl_arm: eval_every must be >= 1, got {eval_every}.")
    warmup = arm.critic_warmup_steps
    # The warm-up's steps come on top of the policy's: the trainer counts them toward max_steps.
    args = rl_training_args(replace(config, rl_steps=config.rl_steps + warmup), arm, output_dir)
    batch = args.per_device_train_batch_size
    records: list[ArmRecord] = []
    logs_out: list[dict[str, float]] = []
    recorder = _recorder(config, arm, batch, evaluate, eval_every, on_record, on_step, records, logs_out)
    trainer = VinePPOTrainer(
        model=str(policy_dir),
        reward_funcs=GSM8KVerifier(),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in data.rl_set]),
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        callbacks=[recorder],
    )
    recorder.trainer = trainer  # its evaluations read the trainer's model
    trainer.remove_callback(PrinterCallback)  # with disable_tqdm, transformers prints every log dict
    trainer.train()
    model = trainer.model
    model.eval()
    if arm.advantage_estimator == "gae":
        # The "ppo" arm's critic: keep the final policy and the critic together for the diagnostics
        # (benchmarks/credit_diagnostics.py --critic).
        final = Path(output_dir) / "final"
        trainer.save_model(str(final))
        trainer.save_estimator_state(str(final))
    return model, records, logs_out
