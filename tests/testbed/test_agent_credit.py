"""The agent credit toy (testbed/agent_credit.py): exact values and gradient, the sampler's values, the token
layout, the estimators through the seam and the arms' training loop."""

from __future__ import annotations

import math

import pytest
import torch

from mcadvantage.estimators.vineppo import VinePPOEstimator
from mcadvantage.samplers.base import RolloutRequest
from testbed.agent_credit import (
    ARMS,
    TabularAgentPolicy,
    TabularCritic,
    agent_gradient_task,
    arm_batch_gradients,
    gae_advantages,
    grpo_match_factor,
    start_logits,
    toy_task,
    train_arm,
    turn_pairs,
)
from testbed.agent_env import success_probability


@pytest.mark.parametrize("parameterization", ["turn", "shared"])
@pytest.mark.parametrize("structure", ["delayed", "recovery"])
def test_exact_success_and_gradient_match_the_testbed_and_finite_differences(structure, parameterization):
    task = toy_task(structure, 4)
    gen = torch.Generator().manual_seed(0)
    shape = start_logits(task, 0.3, parameterization).shape
    policy = TabularAgentPolicy(
        task, torch.randn(shape, generator=gen, dtype=torch.float64), parameterization=parameterization
    )
    assert policy.exact_success() == pytest.approx(success_probability(task, policy.table()), abs=1e-12)
    grad = policy.exact_gradient().double()
    eps = 1e-6
    flat = policy.logits.detach().reshape(-1)
    for k in range(0, flat.numel(), 3):
        bumped = flat.clone()
        bumped[k] += eps
        up = TabularAgentPolicy(
            task, bumped.reshape(shape), parameterization=parameterization
        ).exact_success()
        bumped[k] -= 2 * eps
        down = TabularAgentPolicy(
            task, bumped.reshape(shape), parameterization=parameterization
        ).exact_success()
        assert grad[k] == pytest.approx((up - down) / (2 * eps), abs=1e-6)


@pytest.mark.parametrize("structure", ["delayed", "recovery"])
@pytest.mark.parametrize("rate", [0.15, 0.5])
def test_start_logits_give_the_start_rate_exactly(structure, rate):
    for h in (2, 16):
        task = toy_task(structure, h)
        for param in ("turn", "shared"):
            policy = TabularAgentPolicy(task, start_logits(task, rate, param), parameterization=param)
            assert policy.exact_success() == pytest.approx(rate, abs=1e-12)


def test_sampler_values_from_a_prefix_are_the_exact_values_and_count_only_choices():
    task = toy_task("recovery", 4)
    policy = TabularAgentPolicy(task, start_logits(task, 0.3), seed=1)
    tok = policy.tokenizer
    # prompt, then turn 0 chose "b" (not the key: the state breaks) and its result "-"
    prefix = (
        tok("P000:", add_special_tokens=False)["input_ids"] + tok("b-", add_special_tokens=False)["input_ids"]
    )
    n = 4000
    (conts,) = policy.sample([RolloutRequest(prefix_ids=tuple(prefix), n=n, max_tokens=2 * 4 + 1)])
    wins = sum(tok.decode(list(c.token_ids), skip_special_tokens=True).endswith("+") for c in conts)
    exact = policy.exact_values()[1][0]  # before turn 1, state bad
    assert abs(wins / n - exact) < 4 * math.sqrt(exact * (1 - exact) / n)
    assert policy.sampled_tokens == 3 * n  # three turns left, one choice token each
    assert all(len(c.token_ids) == 3 * 2 + 1 and not c.truncated for c in conts)
    # a prefix ending just after a choice gets its tool result first, and no choice is counted for it
    before = policy.sampled_tokens
    (cont,) = policy.sample([RolloutRequest(prefix_ids=tuple(prefix[:-1]), n=1, max_tokens=1)])[0]
    assert tok.decode(list(cont.token_ids)) == "-" and cont.truncated and policy.sampled_tokens == before


def test_token_logprobs_are_zero_on_tool_results_and_eos():
    task = toy_task("delayed", 3)
    policy = TabularAgentPolicy(task, start_logits(task, 0.5))
    tok = policy.tokenizer
    ids = tok("a+b+c+", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    logp = policy.token_logprobs([[0]], [ids])[0]
    probs = policy.table().probs
    assert logp[0].item() == pytest.approx(math.log(probs[0][0][0]))  # turn 0, state bad, choice a
    assert logp[2].item() == pytest.approx(math.log(probs[1][1][1]))  # turn 1, state good, choice b
    assert [logp[i].item() for i in (1, 3, 5, 6)] == [0.0] * 4
    assert turn_pairs("a+b-c") == ["a+", "b-", "c"]


def test_vineppo_through_the_seam_gives_sealed_turns_zero_credit_and_unbiased_values():
    """In ``delayed`` the outcome is sealed after turn 0: every Monte Carlo value after it is the outcome exactly, so
    the library's vineppo gives every later turn exactly 0 credit; V(S_0) averages to the exact success."""
    task = toy_task("delayed", 4)
    policy = TabularAgentPolicy(task, start_logits(task, 0.3), seed=0)
    gtask = agent_gradient_task(policy, prompts=8)
    estimator = VinePPOEstimator(num_rollouts=2, step_segmenter=turn_pairs)
    v0 = []
    for _ in range(40):
        batch = gtask.sample_group(list(range(8)), 2)
        result = estimator.estimate(batch, gtask.context())
        for i, ids in enumerate(batch.completion_ids):
            choice_positions = [p for p, t in enumerate(ids) if policy.is_policy_token(t)]
            assert [float(result.advantages[i, p]) for p in choice_positions[1:]] == [0.0] * 3
            v0.append(result.values[i][0])
    assert abs(sum(v0) / len(v0) - 0.3) < 4 * math.sqrt(0.3 * 0.7 / (2 * len(v0)))


def test_gae_lambda_one_is_return_minus_value_and_the_critic_regresses():
    critic = TabularCritic(3)
    critic.values = [[0.2, 0.7], [0.1, 0.9], [0.0, 1.0]]
    adv, targets = gae_advantages([0, 1, 1, 1], 1.0, critic, 1.0)
    assert adv == pytest.approx([0.8, 0.1, 0.0])
    assert targets == pytest.approx([1.0, 1.0, 1.0])
    adv0, _ = gae_advantages([0, 1, 1, 1], 1.0, critic, 0.0)
    assert adv0 == pytest.approx([0.9 - 0.2, 1.0 - 0.9, 1.0 - 1.0])
    critic.update([(0, 0, 1.0), (0, 0, 0.0)])
    assert critic.values[0][0] == pytest.approx(0.2 + 0.5 * (0.5 - 0.2))


def test_every_arm_trains_within_its_budget_and_the_oracle_gives_irrelevant_turns_no_credit():
    assert [grpo_match_factor(h) for h in (2, 4, 8, 16)] == [3, 4, 6, 10]
    for arm in ARMS:
        run = train_arm("recovery", 2, 0.15, arm, 0, budget_episodes=160, parameterization="shared")
        assert run.sampled_tokens <= 160 * 2 and run.start_success == pytest.approx(0.15)
        assert run.curve[0] == (0, run.start_success) and run.success_at_budget == run.curve[-1][1]
        assert run.steps >= 1, arm
    oracle = train_arm("delayed", 6, 0.5, "oracle", 0, budget_episodes=64)
    grpo = train_arm("delayed", 6, 0.5, "grpo", 0, budget_episodes=64)
    assert oracle.irrelevant_share == 0.0 and oracle.decisive_sign_accuracy == 1.0
    assert grpo.irrelevant_share == pytest.approx(5 / 6)  # GRPO's one credit per episode, on all 6 turns
    assert oracle.rollout_tokens == 0 and grpo.success_at_budget > 0.5 and oracle.success_at_budget > 0.5


@pytest.mark.parametrize(("structure", "parameterization"), [("delayed", "shared"), ("recovery", "turn")])
def test_the_oracles_batch_gradient_is_the_exact_gradient_over_h_on_average(structure, parameterization):
    """Exact turn advantages: E[sum_t A_t grad log pi] = grad J per episode, and the loss divides by the N H policy
    tokens of N whole episodes, so the mean batch gradient is grad J / H (within its standard error)."""
    horizon, repeats = 3, 200
    exact, grads, tokens = arm_batch_gradients(
        structure, horizon, 0.3, "oracle", 0, repeats, parameterization=parameterization
    )
    stacked = torch.stack(grads)
    se = stacked.std(0) / math.sqrt(repeats)
    assert tokens == [16 * horizon] * repeats  # 4 prompts x 4 whole episodes of H choices, nothing else
    assert torch.all((stacked.mean(0) - exact / horizon).abs() <= 4 * se + 1e-7)
    assert float(exact.norm()) > 0.05  # a real signal, not a trivially met bound


def test_grpo_and_rloo_batch_gradients_are_zero_when_every_group_has_the_same_reward():
    """A start so sure of the key that every episode succeeds: every group is degenerate, so group-relative
    advantages, hence the batch gradient, are exactly zero (while the exact gradient is not)."""
    for arm in ("grpo", "rloo", "grpo_samples"):
        exact, grads, _ = arm_batch_gradients("delayed", 2, 1.0 - 1e-12, arm, 0, 5)
        assert all(float(g.abs().max()) == 0.0 for g in grads), arm
        assert float(exact.abs().max()) > 0
