"""The tuned map's anchor arms are the library's anchor estimator: on random toy batches (horizons 2-32, the
``delayed``, ``recovery`` and gauntlet tasks, noisy rewards, both keys, both credits) the advantages that
``train_arm`` gets through :data:`testbed.credit_map.TUNED_ARMS` equal those of the formula the 8,295 committed
runs of ``benchmarks/credit_map_tuned.py`` were made with (kept below as the reference, written out from
``mcadvantage.core.anchors`` and GRPO as that code was), to 1e-6 in float32."""

from __future__ import annotations

import random

import pytest
import torch

from mcadvantage.core.anchors import anchor_step_advantages, pooled_anchor_advantages
from mcadvantage.estimators.baselines import GRPOEstimator
from mcadvantage.estimators.registry import as_advantage_estimator
from testbed.agent_credit import (
    TabularAgentPolicy,
    ToyAnchor,
    _batch_advantages,
    _episode_states,
    agent_gradient_task,
    start_logits,
    toy_task,
)
from testbed.credit_map import TUNED_ARMS, GauntletTask

#: The tuned map's anchor arms and the (variant, key) the committed runs computed them with.
ARM_FORMULAS = {
    "anchor_norm_state": ("normalised", "state"),
    "anchor_norm_history": ("normalised", "history"),
    "anchor_pool_state": ("pooled", "state"),
    "anchor_pool_history": ("pooled", "history"),
}


def _reference(policy: TabularAgentPolicy, batch, context, variant: str, key: str) -> torch.Tensor:
    """The committed runs' anchor credit (the former ``testbed.credit_map.anchor_advantages``): keys ``(t, true
    state)`` or the completion's tokens before the turn, scope the prompt's tokens, GRPO's episode advantage plus
    the step advantage (normalised) or the step groups' TD advantages undivided (pooled)."""
    horizon = policy.task.horizon
    keys = []
    for ids in batch.completion_ids:
        positions = [p for p, tok in enumerate(ids) if policy.is_policy_token(tok)]
        if key == "state":
            states = _episode_states(policy.task, policy.choices_of(ids))
            keys.append([(t, states[t]) for t in range(horizon)])
        else:
            keys.append([tuple(ids[:p]) for p in positions])
    scopes = [tuple(p) for p in batch.prompt_ids]
    turn_rewards = [[0.0] * (horizon - 1) + [float(r)] for r in batch.rewards.tolist()]
    if variant == "normalised":
        per_turn = anchor_step_advantages(keys, turn_rewards, scopes)
        base = GRPOEstimator().estimate(batch, context).advantages.float()
    else:
        per_turn, _ = pooled_anchor_advantages(keys, turn_rewards, scopes)
        base = torch.zeros(batch.completion_mask.shape, dtype=torch.float32)
    out = torch.zeros(batch.completion_mask.shape, dtype=torch.float32)
    for i, ids in enumerate(batch.completion_ids):
        positions = [p for p, tok in enumerate(ids) if policy.is_policy_token(tok)]
        for p, a in zip(positions, per_turn[i], strict=True):
            out[i, p] = base[i, p] + a
    return out


def _tasks():
    yield "delayed", 2, None, 0.0
    yield "recovery", 4, None, 0.0
    yield "delayed", 16, None, 0.0
    yield "recovery", 16, None, 0.0
    yield "gauntlet", 16, GauntletTask(16, 4, choices=8), 0.1
    yield "gauntlet", 32, GauntletTask(32, 8, choices=8), 0.2


def _batches():
    """Random policies (start logits plus noise, both parameterisations) and their batches of 1-4 prompts x 4."""
    rng = random.Random(51)
    for structure, horizon, task, noise in _tasks():
        task = toy_task(structure, horizon) if task is None else task
        for parameterization in ("shared", "turn"):
            for seed in range(2):
                torch.manual_seed(seed)
                logits = start_logits(task, rng.uniform(0.1, 0.6), parameterization)
                logits = logits + 0.7 * torch.randn(logits.shape, dtype=logits.dtype)
                policy = TabularAgentPolicy(task, logits, parameterization=parameterization, seed=seed)
                prompts = rng.choice((1, 2, 4))
                gtask = agent_gradient_task(policy, prompts, reward_noise=noise, seed=seed)
                yield policy, gtask.sample_group(list(range(prompts)), 4), gtask.context()


def _through_the_arm(arm: str, policy: TabularAgentPolicy, batch, context) -> torch.Tensor:
    """The advantages ``train_arm`` trains on for ``arm`` (its raw advantages on its tokens; it does not whiten)."""
    spec = TUNED_ARMS[arm]
    estimator = as_advantage_estimator(spec.build(policy.task.horizon))
    raw, valid, whiten = _batch_advantages(spec, policy, batch, estimator, context, None)
    assert whiten is False
    return raw * valid


def test_the_tuned_maps_anchor_arms_equal_the_committed_runs_formula():
    worst, exact, batches, moved = 0.0, 0, 0, {arm: 0 for arm in ARM_FORMULAS}
    for policy, batch, context in _batches():
        batches += 1
        grpo = GRPOEstimator().estimate(batch, context).advantages.float()
        for arm, (variant, key) in ARM_FORMULAS.items():
            want = _reference(policy, batch, context, variant, key)
            got = _through_the_arm(arm, policy, batch, context)
            diff = float((got - want).abs().max())
            assert diff <= 1e-6, f"{arm} on {policy.task} ({policy.parameterization}): max |diff| {diff:.2e}"
            worst, exact = max(worst, diff), exact + (diff == 0.0)
            # the arm's credit is not GRPO's (so agreement is not agreement on something trivial)
            moved[arm] += bool(((got - (grpo if variant == "normalised" else 0)).abs() > 1e-3).any())
    assert batches == 24 and worst <= 1e-6
    assert all(n >= batches // 3 for n in moved.values()), moved


def test_the_pooled_arm_is_the_librarys_pooled_credit_without_reward_scaling():
    """The pooled arms are ``anchor_credit="pooled", scale_rewards="none"``; under GRPO's default ``"group"``
    scaling the library divides each episode's advantages by its group's reward std + 1e-4, which the runs did not."""
    assert TUNED_ARMS["anchor_pool_state"].build(4).inner.scale_rewards == "none"
    assert TUNED_ARMS["anchor_norm_state"].build(4).inner.scale_rewards == "group"
    differs = 0
    for policy, batch, context in _batches():
        want = _reference(policy, batch, context, "pooled", "state")
        scaled = ToyAnchor("state", "pooled").estimate(batch, context).advantages.float()
        differs += bool((scaled - want).abs().max() > 1e-3)
    assert differs > 0


@pytest.mark.parametrize("arm", list(ARM_FORMULAS))
def test_the_anchor_arms_go_through_the_library_estimator(arm):
    spec = TUNED_ARMS[arm]
    assert spec.kind == "estimator" and spec.advantages is None and spec.whiten is False
    assert isinstance(spec.build(8), ToyAnchor) and spec.build(8).key == ARM_FORMULAS[arm][1]
