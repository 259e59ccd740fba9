"""Helper for tests/trainer/test_trainer_distributed.py, run with ``python`` (one process) or
``accelerate launch --cpu --num_processes 2`` (two gloo processes).

Modes:
    estimate [--main-only]: build a VinePPOTrainer whose Monte Carlo sampler is deterministic (a continuation depends only on
        its prefix and sample index, never on the process or on the other requests), give each rank its slice of
        a fixed global batch, run the trainer's estimation + whitening step, and write the gathered advantages and
        what each rank's estimator saw to ``<out>/estimate_world<N>.json``.
    train: a short real training run with the transformers sampler; each rank writes what its estimator handled
        at every generation to ``<out>/train_rank<r>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import string
import sys
from pathlib import Path

import torch

# Run as a script, from tests/trainer/: the tests' shared helpers live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import tiny_config  # noqa: E402

from mcadvantage.samplers.base import Continuation, RolloutRequest

LETTERS = string.ascii_lowercase + " \n"


class HashSampler:
    """Deterministic fake policy: continuation ``k`` of a prefix is a hash of ``(prefix, k)``.

    Between 1 and 4 tokens drawn from ``token_ids`` then EOS, cut (and marked truncated) at the request budget.
    """

    def __init__(self, token_ids: list[int], eos_token_id: int) -> None:
        self.token_ids = token_ids
        self.eos_token_id = eos_token_id
        self.requests: list[RolloutRequest] = []

    def sample(self, requests):
        self.requests.extend(requests)
        out = []
        for req in requests:
            conts = []
            for k in range(req.n):
                digest = hashlib.sha256(f"{list(req.prefix_ids)}|{k}".encode()).digest()
                tokens = [self.token_ids[b % len(self.token_ids)] for b in digest[1 : 2 + digest[0] % 4]]
                tokens.append(self.eos_token_id)
                truncated = len(tokens) > req.max_tokens
                conts.append(Continuation(token_ids=tuple(tokens[: req.max_tokens]), truncated=truncated))
            out.append(conts)
        return out


def vowel_reward(completions, **kwargs):
    """Deterministic reward in [0, 1]: the share of vowels in the response text."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


# A fixed global batch: 2 prompts x 4 responses, several steps each (newline segmenter), some without EOS.
PROMPTS = ["spell cat:", "spell dog:"]
RESPONSES = [
    ["c\na\nt", "ca\nt", "c\nat\n", "kat"],
    ["d\no\ng", "do\ng\n", "dg", "d\noo\ngg"],
]


def make_config(output_dir: str, **overrides):
    settings = dict(
        max_completion_length=12, num_mc_rollouts=3, step_segmenter="newline", beta=0.0, logging_steps=1
    )
    return tiny_config(output_dir, **(settings | overrides))


def run_estimate(model_dir: str, out: Path, main_only: bool = False) -> None:
    from accelerate.utils import gather_object
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage import VinePPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    sampler = HashSampler(tok.convert_tokens_to_ids(list(LETTERS)), tok.eos_token_id)
    dataset = Dataset.from_dict({"prompt": PROMPTS, "answer": ["cat", "dog"]})
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=vowel_reward,
        args=make_config(str(out / "estimate-run")),
        train_dataset=dataset,
        processing_class=tok,
        mc_sampler=sampler,
    )
    if main_only:
        # Exercise the vLLM-server code path (only the main process may sample; it estimates every rank's
        # responses and sends each rank its part) with the deterministic sampler standing in for the server.
        import dataclasses

        make_context = trainer.estimator_context
        trainer.estimator_context = lambda batch=None: dataclasses.replace(
            make_context(batch), sample_on_main_only=True
        )
    acc = trainer.accelerator
    rows = [(p, r) for p, responses in zip(PROMPTS, RESPONSES, strict=True) for r in responses]
    per_rank = len(rows) // acc.num_processes
    local = rows[acc.process_index * per_rank : (acc.process_index + 1) * per_rank]
    width = 16  # fixed (B, T) width shared by every rank, like GRPO's padded completion tensor per rank

    prompt_ids, completion_ids = [], []
    mask = torch.zeros((len(local), width), dtype=torch.long)
    for i, (prompt, response) in enumerate(local):
        prompt_ids.append(tok(prompt)["input_ids"])
        ids = tok(response)["input_ids"]
        if i % 2 == 0:  # half the responses end with EOS, as generated ones would
            ids = ids + [tok.eos_token_id]
        completion_ids.append(ids)
        mask[i, : len(ids)] = 1
    # Every rank's rewards, as GRPO gathers them (group baselines may need the whole batch).
    all_rewards = torch.tensor(vowel_reward([r for _, r in rows]), dtype=torch.float32).unsqueeze(1)

    from mcadvantage.estimators import AdvantageBatch

    advantages = trainer.compute_advantages(
        AdvantageBatch(
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            completion_mask=mask,
            rewards_per_func=all_rewards,
            reward_weights=torch.ones(1),
            local_slice=slice(acc.process_index * per_rank, (acc.process_index + 1) * per_rank),
            group_size=len(RESPONSES[0]),
            prompts=[p for p, _ in local],
            rows=[{"prompt": p, "answer": p.split()[-1][:-1]} for p, _ in local],
        )
    )
    estimate = trainer.last_mc_estimate
    report = {
        "rank": acc.process_index,
        "rows": [acc.process_index * per_rank + i for i in trainer.last_mc_rows],
        "values": estimate.values,
        "stats": dict(estimate.stats) if estimate.stats is not None else {},
        "sampler_requests": len(sampler.requests),
        "request_prompts": sorted(
            {tok.decode(list(r.prefix_ids)).split(":")[0] + ":" for r in sampler.requests}
        ),
    }
    all_advantages = acc.gather(advantages.contiguous()).tolist()
    reports = gather_object([report])
    if acc.is_main_process:
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
        result = {
            "world_size": acc.num_processes,
            "backend": backend,
            "advantages": all_advantages,
            "ranks": reports,
        }
        name = f"estimate_world{acc.num_processes}{'_main_only' if main_only else ''}.json"
        with open(out / name, "w") as f:
            json.dump(result, f)


def run_train(model_dir: str, out: Path) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage import VinePPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    dataset = Dataset.from_dict(
        {"prompt": [f"{a}+{a}=" for a in range(8)], "answer": [str(2 * a) for a in range(8)]}
    )
    seen: list[dict] = []

    class Recording(VinePPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            seen.append(
                {
                    "local_batch": len(inputs),
                    "local_prompts": sorted({x["prompt"] for x in inputs}),
                    "estimated_rows": list(self.last_mc_rows),
                    "trajectories": self.last_mc_estimate.stats["trajectories"],
                    "rollouts": self.last_mc_estimate.stats["rollouts"],
                }
            )
            return output

    trainer = Recording(
        model=model,
        reward_funcs=vowel_reward,
        args=make_config(str(out / "train-run"), num_mc_rollouts=2, max_steps=2, num_iterations=1),
        train_dataset=dataset,
        processing_class=tok,
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(out / f"train_rank{rank}.json", "w") as f:
        json.dump(
            {
                "rank": rank,
                "world_size": trainer.accelerator.num_processes,
                "global_step": trainer.state.global_step,
                "generations": seen,
                "log_history": trainer.state.log_history,
            },
            f,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["estimate", "train"])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--main-only", action="store_true", help="estimate mode: the main process samples for all"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.mode == "estimate":
        run_estimate(args.model_dir, out, main_only=args.main_only)
    else:
        run_train(args.model_dir, out)
    if torch.distributed.is_initialized():
        # Left to interpreter exit, gloo's worker threads can still hold tensors and abort the process
        # (SIGABRT, "terminate called without an active exception"; seen in CI after a finished run).
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
