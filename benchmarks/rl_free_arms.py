"""The RL-free arms of ``benchmarks/learning_efficiency.py``: more supervised training (``sft``), RestEM
(``restem``) and DPO+ (``dpo_plus``), each from the same warm-up, prompts and settings as the RL arms.

Benchmark code, so it lives here and not in the installed package (the demo runs RL arms only,
:mod:`mcadvantage.demo.arms`). The data each baseline trains on comes from the library
(:mod:`mcadvantage.trainer.self_training`); the training is TRL's (``DPOTrainer``) or the demo's supervised loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcadvantage.demo.arms import ArmRecord, load_policy
from mcadvantage.demo.config import DemoConfig, DemoData

__all__ = ["run_dpo_plus_arm", "run_restem_arm", "run_sft_arm"]


def run_sft_arm(
    config: DemoConfig,
    policy_dir: str | Path,
    data: DemoData,
    *,
    steps: int,
    learning_rate: float,
    evaluate: Callable[[Any], float],
    eval_every: int,
    on_record: Callable[[ArmRecord], None] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[Any, list[ArmRecord]]:
    """More supervised steps: continue training the policy in ``policy_dir`` on the warm-up
    demonstrations (the same flawed data a user has) at a constant ``learning_rate`` for ``steps``
    steps of ``config.warmup_batch_size`` examples, evaluating every ``eval_every`` steps. The arm a
    comparison needs to show that RL beats simply training longer. No response is sampled, so its
    records have ``sampled_tokens = 0``."""
    from mcadvantage.demo.warmup import supervised_warmup

    if eval_every < 1 or steps < 1:
        raise ValueError(f"run_sft_arm: steps and eval_every must be >= 1, got {steps} and {eval_every}.")
    model, tokenizer = load_policy(policy_dir)
    records: list[ArmRecord] = []
    box = {"eval_seconds": 0.0}
    start = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        if on_step is not None:
            on_step(step, loss)
        if step % eval_every == 0 or step == steps:
            train_seconds = time.perf_counter() - start - box["eval_seconds"]
            t0 = time.perf_counter()
            accuracy = evaluate(model)
            model.train()
            box["eval_seconds"] += time.perf_counter() - t0
            record = ArmRecord("sft", config.seed, step, accuracy, 0.0, train_seconds)
            records.append(record)
            if on_record is not None:
                on_record(record)

    # A fresh shuffle of the same demonstrations (seed + 1: not the warm-up's order again), no warm-up
    # or decay phase: a constant learning rate continuing from where the warm-up's schedule ended.
    supervised_warmup(
        model,
        tokenizer,
        data.warmup,
        steps=steps,
        batch_size=config.warmup_batch_size,
        learning_rate=learning_rate,
        warmup_ratio=0.0,
        decay_ratio=0.0,
        seed=config.seed + 1,
        progress=progress,
    )
    model.eval()
    return model, records


def _sample_graded(
    config: DemoConfig, policy: Any, tokenizer: Any, rows: list[dict[str, str]], verifier: Any
) -> tuple[list[Any], float]:
    """The RL-free arms' data: ``config.num_generations`` responses per row at the RL temperature, graded, and
    the tokens sampled (what the arms' records count)."""
    from mcadvantage import TransformersSampler
    from mcadvantage.trainer.self_training import sample_and_grade

    sampler = TransformersSampler(policy, tokenizer, temperature=config.temperature, max_batch_sequences=1024)
    graded = sample_and_grade(
        sampler,
        tokenizer,
        rows,
        verifier,
        num_samples=config.num_generations,
        max_new_tokens=config.max_completion_length,
    )
    tokens = sum(
        len(tokenizer(c, add_special_tokens=False)["input_ids"]) for g in graded for c in g.completions
    )
    return graded, float(tokens)


def run_restem_arm(
    config: DemoConfig,
    policy_dir: str | Path,
    data: DemoData,
    *,
    iterations: int,
    prompts_per_iteration: int,
    epochs: int,
    learning_rate: float,
    evaluate: Callable[[Any], float],
    on_record: Callable[[ArmRecord], None] | None = None,
    steps_per_iteration: int | None = None,
) -> tuple[Any, list[ArmRecord]]:
    """RestEM (Singh et al., 2024) on the demo task, as the paper ran it: each iteration samples
    ``config.num_generations`` responses (temperature ``config.temperature``) to ``prompts_per_iteration``
    new RL prompts from the previous iteration's policy, keeps the verified-correct ones
    (:func:`mcadvantage.trainer.self_training.restem_examples`), and fine-tunes the *starting* policy on them for
    ``epochs`` epochs (the paper resets to the base model every iteration). Evaluated after every
    iteration; a record's ``step`` is the RL step that has consumed as many prompts
    (``steps_per_iteration``, default ``prompts_per_iteration / config.prompts_per_step``), so its curve
    lines up with the RL arms' by data consumed. The paper picks each iteration's checkpoint on a
    validation split; here every iteration is kept (no validation split is held out), which is stated with
    the results."""
    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.warmup import supervised_warmup
    from mcadvantage.trainer.self_training import restem_examples

    if min(iterations, prompts_per_iteration, epochs) < 1:
        raise ValueError(
            f"run_restem_arm: iterations, prompts_per_iteration and epochs must be >= 1, got {iterations}, "
            f"{prompts_per_iteration} and {epochs}."
        )
    if iterations * prompts_per_iteration > len(data.rl_set):
        raise ValueError(
            f"run_restem_arm: {iterations} x {prompts_per_iteration} prompts exceed the {len(data.rl_set)} RL prompts."
        )
    steps_per_iteration = steps_per_iteration or max(1, prompts_per_iteration // config.prompts_per_step)
    verifier = GSM8KVerifier()
    policy, tokenizer = load_policy(policy_dir)
    records: list[ArmRecord] = []
    tokens = 0.0
    train_seconds = 0.0
    for it in range(iterations):
        t0 = time.perf_counter()
        rows = [
            {"prompt": p.prompt, "answer": p.answer}
            for p in data.rl_set[it * prompts_per_iteration : (it + 1) * prompts_per_iteration]
        ]
        graded, sampled = _sample_graded(config, policy, tokenizer, rows, verifier)
        tokens += sampled
        examples = [(r["prompt"], r["completion"]) for r in restem_examples(graded)]
        policy, _ = load_policy(policy_dir)  # RestEM fine-tunes the starting policy every iteration
        if examples:
            steps = max(1, epochs * len(examples) // config.warmup_batch_size)
            supervised_warmup(
                policy,
                tokenizer,
                examples,
                steps=steps,
                batch_size=config.warmup_batch_size,
                learning_rate=learning_rate,
                warmup_ratio=0.0,
                decay_ratio=0.0,
                seed=config.seed + it,
            )
        train_seconds += time.perf_counter() - t0
        record = ArmRecord(
            "restem", config.seed, (it + 1) * steps_per_iteration, evaluate(policy), tokens, train_seconds
        )
        records.append(record)
        if on_record is not None:
            on_record(record)
    policy.eval()
    return policy, records


def run_dpo_plus_arm(
    config: DemoConfig,
    policy_dir: str | Path,
    data: DemoData,
    output_dir: str | Path,
    *,
    prompts: int,
    pairs_per_prompt: int,
    epochs: int,
    learning_rate: float,
    beta: float,
    evaluate: Callable[[Any], float],
    on_record: Callable[[ArmRecord], None] | None = None,
    step: int | None = None,
) -> tuple[Any, list[ArmRecord]]:
    """DPO+ (Pal et al., 2024) on the demo task, as the paper ran it: ``config.num_generations`` responses
    (temperature ``config.temperature``) to each of the first ``prompts`` RL prompts, sampled once from the
    starting policy; up to ``pairs_per_prompt`` (correct, incorrect) pairs per prompt
    (:func:`mcadvantage.trainer.self_training.preference_pairs`); ``trl.DPOTrainer`` for ``epochs`` epochs with ``beta`` and
    ``loss_type=["sigmoid", "sft"]`` (DPO plus the chosen response's NLL: TRL 1.16 has no DPO-Positive loss, see
    ``docs/howto/restem-dpo-plus.md``). Evaluated once trained; the record's ``step`` is ``step`` (default the RL
    step that has consumed as many prompts)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOConfig, DPOTrainer

    from mcadvantage import GSM8KVerifier
    from mcadvantage.trainer.self_training import preference_pairs

    if min(prompts, pairs_per_prompt, epochs) < 1 or prompts > len(data.rl_set):
        raise ValueError(
            f"run_dpo_plus_arm: prompts ({prompts}, at most {len(data.rl_set)}), pairs_per_prompt "
            f"({pairs_per_prompt}) and epochs ({epochs}) must be >= 1."
        )
    t0 = time.perf_counter()
    policy, tokenizer = load_policy(policy_dir)
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in data.rl_set[:prompts]]
    graded, tokens = _sample_graded(config, policy, tokenizer, rows, GSM8KVerifier())
    pairs = preference_pairs(graded, pairs_per_prompt=pairs_per_prompt, seed=config.seed)
    if pairs:
        args = DPOConfig(
            output_dir=str(output_dir),
            num_train_epochs=epochs,
            per_device_train_batch_size=config.warmup_batch_size,
            learning_rate=learning_rate,
            lr_scheduler_type="constant",
            beta=beta,
            loss_type=["sigmoid", "sft"],
            max_length=256,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            seed=config.seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = DPOTrainer(
            model=str(policy_dir),
            args=args,
            train_dataset=Dataset.from_list(pairs),
            processing_class=AutoTokenizer.from_pretrained(policy_dir),
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        policy = trainer.model
    train_seconds = time.perf_counter() - t0
    step = step if step is not None else max(1, prompts // config.prompts_per_step)
    policy.eval()
    record = ArmRecord("dpo_plus", config.seed, step, evaluate(policy), tokens, train_seconds)
    if on_record is not None:
        on_record(record)
    return policy, [record]
