"""RestEM (Singh et al., 2024), the paper's first RL-free baseline, on MATH or GSM8K with our verifiers: rounds of
sampling from the current policy, keeping the verified-correct responses, and fine-tuning the *starting* SFT
checkpoint on them with ``trl.SFTTrainer`` (the paper's Table 2: 10 iterations, 8 samples per problem at
temperature 0.6, 8 epochs, AdamW lr 1e-6, polynomial schedule with 3% warm-up).

    python examples/restem.py --task gsm8k --output_dir outputs/restem-gsm8k
    python examples/restem.py --task math --iterations 3 --max_train_samples 2000

Every ``trl.SFTConfig`` field is a flag, as are ``SelfTrainingArguments``' (``examples/_self_training.py``);
``--config recipe.yaml`` sets any of them. Iteration ``i`` is saved in ``<output_dir>/iteration-<i>`` and samples
from iteration ``i - 1`` (the paper picks each iteration's checkpoint on a validation split; pick yours from the
saved iterations with ``python examples/math.py --evaluate_only --model_name_or_path DIR``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from _common import TASKS, load_problems, logger
from _self_training import SelfTrainingArguments, sample_graded, task_defaults


@dataclass
class RestEMArguments:
    iterations: int = field(default=10, metadata={"help": "Sampling + fine-tuning rounds (paper: 10)."})


PAPER_SFT = {  # Table 2 of the paper
    "num_train_epochs": 8,
    "learning_rate": 1e-6,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "lr_scheduler_type": "polynomial",
    "warmup_steps": 0.03,
    "completion_only_loss": True,
    "logging_steps": 1,
    "save_strategy": "no",
    "output_dir": "outputs/restem",
}


def parse_args(argv: Sequence[str] | None = None) -> tuple[SelfTrainingArguments, RestEMArguments, Any]:
    """The command line over the paper's settings: ``(SelfTrainingArguments, RestEMArguments, SFTConfig)``."""
    from trl import SFTConfig, TrlParser

    parser = TrlParser((SelfTrainingArguments, RestEMArguments, SFTConfig))
    parser.set_defaults_with_config(**PAPER_SFT)
    script_args, restem_args, sft_args = parser.parse_args_and_config(args=argv)
    return task_defaults(script_args), restem_args, sft_args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run RestEM; returns a summary (also written to ``<output_dir>/restem.json``)."""
    from datasets import Dataset
    from trl import SFTTrainer

    from mcadvantage.trainer.self_training import restem_examples

    script_args, restem_args, sft_args = parse_args(argv)
    task = TASKS[script_args.task]
    verifier = task.verifier()
    rows = list(load_problems(task=task, script_args=script_args, split="train"))

    base, policy, rounds = script_args.model_name_or_path, script_args.model_name_or_path, []
    for iteration in range(1, restem_args.iterations + 1):
        # 1. Sample from the current policy and keep the verified-correct responses.
        graded = sample_graded(policy, rows, script_args, verifier)
        examples = restem_examples(graded)
        logger.info(
            "iteration %d: %d correct responses of %d",
            iteration,
            len(examples),
            len(rows) * script_args.samples_per_prompt,
        )
        if not examples:
            raise RuntimeError(
                f"iteration {iteration}: no correct response to train on; check the verifier and data."
            )
        # 2. Fine-tune the starting checkpoint on them (RestEM restarts from the base model every iteration).
        out = os.path.join(sft_args.output_dir, f"iteration-{iteration}")
        trainer = SFTTrainer(
            model=base,
            args=dataclasses.replace(sft_args, output_dir=out),
            train_dataset=Dataset.from_list(examples),
        )
        trainer.train()
        trainer.save_model(out)
        policy = out
        rounds.append({"iteration": iteration, "correct_responses": len(examples), "checkpoint": out})

    summary = {
        "task": task.name,
        "model": base,
        "epochs": sft_args.num_train_epochs,
        "learning_rate": sft_args.learning_rate,
        "iterations": rounds,
    }
    os.makedirs(sft_args.output_dir, exist_ok=True)
    with open(os.path.join(sft_args.output_dir, "restem.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
