"""testbed/credit_map.py: the gauntlet task's exact start, anchor-state credit keyed by state or history (against
hand computations and core.anchors), the history-feature critic's fit, and train_arm's budget prefix."""

from __future__ import annotations

import math

import pytest
import torch

from mcadvantage.estimators.batch import AdvantageBatch
from testbed.agent_credit import TabularAgentPolicy, agent_gradient_task, start_logits, train_arm
from testbed.agent_env import BAD, GOOD, success_probability
from testbed.credit_map import (
    TUNED_ARMS,
    FeatureCritic,
    GauntletTask,
    anchor_advantages,
    history_features,
    turn_keys,
)


def test_gauntlet_breaks_at_any_decisive_turn_and_starts_exactly():
    task = GauntletTask(horizon=8, decisive=4, choices=8)
    assert task.decisive_turns == (0, 2, 4, 6)
    assert task.transition(2, GOOD, 3) == BAD and task.transition(3, GOOD, 3) == GOOD
    assert task.transition(5, BAD, 0) == BAD  # broken for good
    policy = TabularAgentPolicy(task, start_logits(task, 0.02, "shared"), parameterization="shared")
    assert abs(policy.exact_success() - 0.02) < 1e-12
    assert abs(success_probability(task, policy.table()) - 0.02) < 1e-12
    with pytest.raises(ValueError, match="decisive"):
        GauntletTask(horizon=4, decisive=5)


def _batch(policy: TabularAgentPolicy, choices: list[list[int]], rewards: list[float], prompts: list[int]):
    """A hand-made batch of whole episodes (choice and tool-result tokens, then EOS) for the given prompts."""
    tok = policy.tokenizer
    completions = []
    for ch in choices:
        ids, state = [], policy.task.initial_state()
        for t, a in enumerate(ch):
            state = policy.task.transition(t, state, a)
            ids += [policy._choice_ids[a], policy._state_ids[state]]
        completions.append(ids + [policy.eos_token_id])
    width = max(map(len, completions))
    prompt_ids = [tok(f"P{p:03d}:", add_special_tokens=False)["input_ids"] for p in prompts]
    mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    return AdvantageBatch(
        prompt_ids=prompt_ids,
        completion_ids=completions,
        completion_mask=mask,
        rewards_per_func=torch.tensor(rewards).unsqueeze(1),
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, len(completions)),
        group_size=len(completions) // len(set(prompts)),
        prompts=[f"P{p:03d}:" for p in prompts],
    )


def test_history_keys_stop_recurring_after_divergence_and_pooled_credit_lands_there():
    task = GauntletTask(horizon=3, decisive=1, choices=4)  # only turn 0 decides
    policy = TabularAgentPolicy(task, start_logits(task, 0.25, "shared"), parameterization="shared")
    # two episodes agree at turn 0 (the key), then differ at turn 1; a third fails at turn 0
    batch = _batch(policy, [[0, 1, 2], [0, 2, 2], [1, 1, 2]], [1.0, 1.0, 0.0], [0, 0, 0])
    hist = [turn_keys(policy, ids, "history") for ids in batch.completion_ids]
    state = [turn_keys(policy, ids, "state") for ids in batch.completion_ids]
    assert (
        hist[0][0] == hist[1][0] == hist[2][0] == () and hist[0][1] == hist[1][1] and hist[0][2] != hist[1][2]
    )
    assert state[0] == state[1] == [(0, GOOD), (1, GOOD), (2, GOOD)] and state[2][1] == (1, BAD)
    context = agent_gradient_task(policy, 1).context()
    pooled = anchor_advantages(policy, batch, context, variant="pooled", key="history")
    positions = [[p for p, t in enumerate(ids) if policy.is_policy_token(t)] for ids in batch.completion_ids]
    per_turn = [[float(pooled[i, p]) for p in pos] for i, pos in enumerate(positions)]
    # V(root) = 2/3; turn 0: V(after) - V(root); later turns: singletons or equal returns, so 0
    assert per_turn[0] == pytest.approx([1 - 2 / 3, 0.0, 0.0]) and per_turn[2] == pytest.approx(
        [-2 / 3, 0.0, 0.0]
    )
    norm = anchor_advantages(policy, batch, context, variant="normalised", key="state")
    grpo = (torch.tensor([1.0, 1.0, 0.0]) - 2 / 3) / (torch.tensor([1.0, 1.0, 0.0]).std() + 1e-4)
    # the step group of (0, GOOD) holds all three turn-0s: its normalised step advantage equals GRPO's
    assert float(norm[0, positions[0][0]]) == pytest.approx(2 * float(grpo[0]), rel=1e-3)
    assert all(
        float(pooled[i, p]) == 0.0 for i in range(3) for p in range(pooled.shape[1]) if p not in positions[i]
    )


def test_feature_critic_fits_a_value_its_features_represent():
    task = GauntletTask(horizon=4, decisive=1, choices=4)
    critic = FeatureCritic(task, rate=1.0)
    assert critic.value(0, history_features(task, [], 0)) == 0.5
    visits = []
    for ch, good in (([0, 1, 2, 3], True), ([1, 1, 2, 3], False)):
        for t, key in enumerate(critic.keys(task, ch)[:-1]):
            visits.append((t, key, 0.4 if t == 0 else float(good)))
    critic.update(visits)
    keys = critic.keys(task, [0, 1, 2, 3])
    assert critic.value(0, keys[0]) == pytest.approx(0.4, abs=1e-2)
    assert critic.value(2, keys[2]) == pytest.approx(1.0, abs=1e-2)
    assert len(keys[0]) == 5 + task.choices and not any(math.isnan(x) for x in keys[0])


def test_a_run_stopped_at_a_smaller_budget_is_the_prefix_of_the_whole_run():
    """The study reads 1/4 and 1/2 from the 1x run; training at 1/4 directly must give the same policy."""
    spec = TUNED_ARMS["anchor_pool_history"]
    kw = dict(parameterization="shared", lr=1.0, credit_episodes_per_batch=0, batch_shape=(1, 4))
    whole = train_arm("delayed", 4, 0.15, spec, 3, budget_episodes=40, **kw)
    quarter = train_arm("delayed", 4, 0.15, spec, 3, budget_episodes=10, **kw)
    limit = 10 * 4
    prefix = [(s, v) for s, v in whole.curve if s <= limit]
    assert quarter.curve == prefix and quarter.update_tokens == [u for u in whole.update_tokens if u <= limit]
    assert whole.steps == len(whole.update_tokens) == 10


def test_noisy_reward_flips_some_rewards_and_rejects_a_useless_rate():
    from testbed.agent_credit import NoisyOutcome

    noisy = NoisyOutcome(lambda completions, **kw: [1.0] * len(completions), 0.3, seed=0)
    flipped = 1 - sum(noisy(completions=["x"] * 2000)) / 2000
    assert 0.25 < flipped < 0.35
    with pytest.raises(ValueError, match="reward_noise"):
        NoisyOutcome(lambda **kw: [], 0.5, seed=0)
