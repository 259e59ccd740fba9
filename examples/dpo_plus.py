"""DPO+ (DPO-Positive, Pal et al., 2024), the paper's second RL-free baseline, on MATH or GSM8K with our verifiers:
responses sampled from the SFT checkpoint, (correct, incorrect) pairs to the same problem, and ``trl.DPOTrainer``
(the paper's Table 3: 64 samples and 64 pairs per problem at temperature 0.6, 3 epochs, beta 0.3 on GSM8K and 0.1
on MATH, AdamW lr 1e-6, polynomial schedule with 3% warm-up).

    python examples/dpo_plus.py --task gsm8k --output_dir outputs/dpo-plus-gsm8k

DPO-Positive's penalty is not a TRL 1.16 loss: ``loss_type=["sigmoid", "sft"]`` (the default here) adds the
chosen response's negative log-likelihood instead, which also keeps DPO from lowering the correct response's
probability (see ``docs/howto/restem-dpo-plus.md``). Every ``trl.DPOConfig`` field is a flag, as are
``SelfTrainingArguments``' (``examples/_self_training.py``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from _common import TASKS, load_problems, logger, requested_task
from _self_training import SelfTrainingArguments, sample_graded, task_defaults


@dataclass
class DPOPlusArguments:
    pairs_per_prompt: int = field(
        default=64, metadata={"help": "(correct, incorrect) pairs per problem (paper: 64)."}
    )


def paper_dpo(task: str) -> dict[str, Any]:
    """Table 3 of the paper for ``task``."""
    return {
        "num_train_epochs": 3,
        "learning_rate": 1e-6,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "lr_scheduler_type": "polynomial",
        "warmup_steps": 0.03,
        "beta": 0.3 if task == "gsm8k" else 0.1,
        "loss_type": ["sigmoid", "sft"],
        "samples_per_prompt": 64,
        "logging_steps": 1,
        "save_strategy": "no",
        "output_dir": f"outputs/dpo-plus-{task}",
    }


def parse_args(argv: Sequence[str] | None = None) -> tuple[SelfTrainingArguments, DPOPlusArguments, Any]:
    """The command line over the paper's settings for its ``--task``: ``(SelfTrainingArguments,
    DPOPlusArguments, DPOConfig)``."""
    from trl import DPOConfig, TrlParser

    argv = list(argv) if argv is not None else sys.argv[1:]
    parser = TrlParser((SelfTrainingArguments, DPOPlusArguments, DPOConfig))
    task = requested_task(argv)
    parser.set_defaults_with_config(task=task, **paper_dpo(task))
    script_args, dpo_plus_args, dpo_args = parser.parse_args_and_config(args=argv)
    return task_defaults(script_args), dpo_plus_args, dpo_args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run DPO+; returns a summary (also written to ``<output_dir>/dpo_plus.json``)."""
    from datasets import Dataset
    from trl import DPOTrainer

    from mcadvantage.trainer.self_training import preference_pairs

    script_args, dpo_plus_args, dpo_args = parse_args(argv)
    task_spec = TASKS[script_args.task]
    rows = list(load_problems(task=task_spec, script_args=script_args, split="train"))

    # 1. Sample from the SFT checkpoint and pair correct with incorrect responses to the same problem.
    graded = sample_graded(script_args.model_name_or_path, rows, script_args, task_spec.verifier())
    pairs = preference_pairs(graded, pairs_per_prompt=dpo_plus_args.pairs_per_prompt, seed=dpo_args.seed)
    logger.info("%d preference pairs from %d problems", len(pairs), len(rows))
    if not pairs:
        raise RuntimeError(
            "no (correct, incorrect) pair: every problem's responses were all right or all wrong."
        )
    # 2. DPO with the NLL term on the chosen response.
    trainer = DPOTrainer(
        model=script_args.model_name_or_path, args=dpo_args, train_dataset=Dataset.from_list(pairs)
    )
    trainer.train()
    trainer.save_model(dpo_args.output_dir)

    summary = {
        "task": task_spec.name,
        "model": script_args.model_name_or_path,
        "pairs": len(pairs),
        "beta": dpo_args.beta,
        "loss_type": list(dpo_args.loss_type),
    }
    with open(os.path.join(dpo_args.output_dir, "dpo_plus.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
