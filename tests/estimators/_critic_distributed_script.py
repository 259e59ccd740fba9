"""Helper for tests/estimators/test_critic.py: the "gae" critic trained on one fixed batch of 8 responses, either in one
process or split over two gloo processes (``python -m torch.distributed.run --nproc_per_node 2``).

Minibatches are chosen so both layouts update on the same responses: with two processes each rank holds 4
responses and trains on minibatches of 2; with one process the 8 responses are ordered rank 0's first
minibatch, rank 1's first minibatch, rank 0's second, rank 1's second, in minibatches of 4. Writes the critic's
values of three states after two batches, and the last batch's advantages (gathered in global order).

    python tests/estimators/_critic_distributed_script.py MODEL_DIR OUT.json
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(model_dir: str, out: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcadvantage.estimators import AdvantageBatch, CriticEstimator, EstimatorContext
    from mcadvantage.testing import OutcomeReward

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir)

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    texts = ["aaaY", "abaY", "aabY", "abbN", "bbbN", "babN", "bbaY", "baaN"]
    # Global order as the two ranks hold them: rank 0 = responses 0-3, rank 1 = 4-7.
    per_rank = [texts[:4], texts[4:]]
    if world == 1:  # rank 0's minibatch 0, rank 1's minibatch 0, rank 0's minibatch 1, rank 1's minibatch 1
        local, minibatch = per_rank[0][:2] + per_rank[1][:2] + per_rank[0][2:] + per_rank[1][2:], 4
    else:
        local, minibatch = per_rank[rank], 2
    completions = [ids(t) + [tok.eos_token_id] for t in local]
    rewards = torch.tensor([[1.0 if t.endswith("Y") else 0.0] for t in local])
    batch = AdvantageBatch(
        prompt_ids=[ids("Q:")] * len(local),
        completion_ids=completions,
        completion_mask=torch.ones(len(local), 5, dtype=torch.long),
        rewards_per_func=rewards,
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, len(local)),
        group_size=len(local),
        prompts=["Q:"] * len(local),
    )
    ctx = EstimatorContext.single_process(
        None, [OutcomeReward("Y")], tok, policy_model=policy, segmenter="newline"
    )
    critic = CriticEstimator(learning_rate=1e-3, minibatch_size=minibatch, epochs=1, shuffle=False, seed=0)
    first = critic.estimate(batch, ctx)
    result = critic.estimate(batch, ctx)
    moved = float((first.advantages - result.advantages).abs().max())
    advantages = {t: result.advantages[i].tolist() for i, t in enumerate(local)}
    if world > 1:
        parts: list = [None] * world
        torch.distributed.all_gather_object(parts, advantages)
        advantages = {k: v for part in parts for k, v in part.items()}
    values = critic.predict_values([ids("Q:")] * 3, [ids("a"), ids("b"), []])
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"values": values, "advantages": [advantages[t] for t in texts], "moved": moved}, f)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
