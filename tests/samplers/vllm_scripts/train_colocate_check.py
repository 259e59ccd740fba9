"""Subprocess check: ``VinePPOTrainer`` trains on a colocated CPU vLLM engine with real weight syncs.

Run by ``tests/trainer/test_trainer_vllm.py`` with ``sys.executable`` and a one-process torch.distributed
environment (TRL's colocate mode creates its ``vllm.LLM`` with the ``external_launcher`` executor).
Trains a tiny Llama for a few steps with ``use_vllm=True, vllm_mode="colocate"``. Every time the
trainer's Monte Carlo sampler is called (after TRL synced the policy into the engine for this step,
before any optimizer step of the step) it records the engine's greedy continuation of probe prompts
and the transformers greedy continuation of the live policy, plus what the sampler did. Writes
everything as JSON for the test to assert on.
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
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument(
        "--peft", action="store_true", help="train a LoRA adapter (TRL merges it for the sync)"
    )
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument(
        "--tree",
        action="store_true",
        help="advantage_estimator='tree': the groups are drawn as trees on the engine",
    )
    args = parser.parse_args()

    import torch
    import trl.generation.vllm_generation as trl_vllm_generation
    import vllm
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    # TRL creates the engine without a dtype, and vLLM's CPU backend then downcasts a float32 model to
    # bfloat16, whose rounding flips near-tied greedy choices of a random tiny model. Running the engine
    # in float32 (and eagerly, to skip compilation) makes the token-for-token comparison exact; the weight
    # sync under test is untouched.
    trl_vllm_generation.LLM = functools.partial(vllm.LLM, dtype="float32", enforce_eager=True)

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)

    prompts = [f"Q: {a} + {b} = ?\nA:" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4)]]
    dataset = Dataset.from_dict({"prompt": prompts})

    def digit_share(completions, **kwargs):
        """A dense reward (share of digits in the response) so advantages are non-zero and steps move."""
        return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]

    config = VinePPOConfig(
        output_dir=args.output_dir,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=256,
        max_completion_length=16,
        num_generations=4 if args.tree else 2,
        per_device_train_batch_size=4,
        # The tree reads neither K nor the segmenter (it would refuse them); VinePPO reads both.
        **(
            {"advantage_estimator": "tree", "tree_branching": [2, 2], "tree_depths": [0, 4]}
            if args.tree
            else {"num_mc_rollouts": 2, "step_segmenter": "newline"}
        ),
        num_iterations=1,  # one optimizer step per generation: every step syncs and generates
        max_steps=args.max_steps,
        learning_rate=args.lr,  # large, so every step visibly changes the tiny policy's greedy outputs
        beta=0.0,  # no reference model: nothing else to load
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    peft_config = None
    if args.peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=digit_share,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    generation = trainer.vllm_generation
    llm = generation.llm

    probe_prompts = ["Q: 12 + 7 = ?\nA:", "The cat sat on", "Solve x + 3 = 5."]
    probe_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in probe_prompts]
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=16)

    @torch.no_grad()
    def hf_greedy(policy) -> list[list[int]]:
        was_training = policy.training
        policy.eval()
        result = []
        for ids in probe_ids:
            input_ids = torch.tensor([ids], device=policy.device)
            out = policy.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=16,
                pad_token_id=tokenizer.pad_token_id,
            )
            result.append(out[0, len(ids) :].tolist())
        policy.train(was_training)
        return result

    record: dict = {
        "is_peft_model": hasattr(trainer.model, "peft_config"),
        "sync_installed": bool(getattr(generation, "_mcadvantage_layerwise_sync", False)),
        "sync_is_instance_override": "sync_weights" in vars(generation),
        "sampler_type": None,  # set by the first Monte Carlo sampler call
        "sampler_uses_trainer_engine": None,
        "sampler_calls": [],
    }

    # The trainer builds its rollout sampler per step (mcadvantage.trainer.policy.policy_sampler); observe every
    # VLLMSampler call. A transformers sampler would leave sampler_type None and fail the test.
    from mcadvantage.samplers.vllm import VLLMSampler

    original_sample = VLLMSampler.sample

    def observed_sample(self, requests):
        # Observation only: record engine vs policy at this moment, then delegate unchanged.
        record["sampler_type"] = type(self).__name__
        record["sampler_uses_trainer_engine"] = self.llm is llm
        step = trainer.state.global_step
        entry = {
            "global_step": step,
            "last_loaded_step": trainer._last_loaded_step,
            "requests": len(requests),
            "requested_samples": sum(r.n for r in requests),
            "engine_greedy": [
                list(o.outputs[0].token_ids)
                for o in llm.generate(
                    [{"prompt_token_ids": ids} for ids in probe_ids], greedy, use_tqdm=False
                )
            ],
            "policy_greedy": hf_greedy(trainer.model),
        }
        result = original_sample(self, requests)
        entry["returned_samples"] = sum(len(conts) for conts in result)
        entry["returned_tokens"] = sum(len(c.token_ids) for conts in result for c in conts)
        record["sampler_calls"].append(entry)
        return result

    VLLMSampler.sample = observed_sample

    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    record["max_abs_weight_change"] = max(
        (p.detach() - before[name]).abs().max().item() for name, p in trainer.model.named_parameters()
    )
    record["global_step"] = trainer.state.global_step
    estimate = trainer.last_mc_estimate
    record["mc_stats"] = {k: float(v) for k, v in (estimate.stats if estimate is not None else {}).items()}
    record["log_history"] = [
        {k: v for k, v in entry.items() if isinstance(v, (int, float))} for entry in trainer.state.log_history
    ]

    # After the last optimizer step nothing has synced yet: TRL's own sync (the installed layerwise one)
    # must bring the engine to the final policy.
    generation.sync_weights()
    record["final_engine_greedy"] = [
        list(o.outputs[0].token_ids)
        for o in llm.generate([{"prompt_token_ids": ids} for ids in probe_ids], greedy, use_tqdm=False)
    ]
    record["final_policy_greedy"] = hf_greedy(trainer.model)

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
