"""Subprocess check: PPO's learned critic (``advantage_estimator="gae"``) trains next to a colocated CPU vLLM engine.

Run by ``tests/trainer/test_trainer_vllm.py`` like ``train_colocate_check.py`` (a one-process torch.distributed
environment for TRL's colocate mode). Trains a tiny Llama for two steps with ``use_vllm=True,
vllm_mode="colocate"`` and the critic, and writes what the trainer logged and what the critic did as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import trl.generation.vllm_generation as trl_vllm_generation
    import vllm
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    # As in train_colocate_check.py: a float32, eager engine for the tiny model on vLLM's CPU backend.
    trl_vllm_generation.LLM = functools.partial(vllm.LLM, dtype="float32", enforce_eager=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": [f"Q: {a} + {a} = ?\nA:" for a in range(6)]})

    def digit_share(completions, **kwargs):
        return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]

    config = VinePPOConfig(
        output_dir=args.output_dir,
        advantage_estimator="gae",
        critic_learning_rate=1e-3,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=256,
        max_completion_length=16,
        num_generations=2,
        per_device_train_batch_size=4,
        num_iterations=1,
        max_steps=2,
        learning_rate=1e-3,
        beta=0.0,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    trainer = VinePPOTrainer(
        model=model, reward_funcs=digit_share, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    critic = trainer.advantage_estimator
    trainer.train()
    record = {
        "global_step": trainer.state.global_step,
        "engine": type(trainer.vllm_generation.llm).__name__,
        "critic_updates": critic.updates,
        "critic_is_separate": critic.value_model is not trainer.model,
        "log_history": trainer.state.log_history,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
