"""Parity with verl's own advantage code (``verl.trainer.ppo.core_algos``) on random batches: ragged response masks,
groups of two and larger, rewards on each response's last token as verl's reward loop puts them.

- GRPO without scaling (``scale_rewards="none"``; verl ``norm_adv_by_std_in_grpo=False``): equal exactly.
- GRPO scaled by the group's std: verl divides by ``std + 1e-6``, mcadvantage (as TRL) by ``std + 1e-4``. The two
  agree exactly once that difference is undone (``ours * (std + 1e-4) == verl * (std + 1e-6)``) and within
  ``1e-4 / std`` relative otherwise (docs/howto/verl.md states it).
- RLOO: equal within float32 rounding (verl computes ``r * n / (n - 1) - mean * n / (n - 1)``, mcadvantage
  ``r - (sum - r) / (n - 1)``: the same number, rounded differently).
- GAE: the returns equal within float32 rounding (verl computes in the input dtype, mcadvantage in float64), and
  the whitened advantages within float error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl is installed by scripts/_setup_venv.sh (install_verl_cpu)")

from verl.trainer.ppo import core_algos  # noqa: E402

from mcadvantage.core.advantages import gae_advantages, masked_whiten  # noqa: E402
from mcadvantage.estimators.baselines import _STD_EPS, grpo_advantages, nanstd, rloo_advantages  # noqa: E402
from mcadvantage.estimators.batch import sequence_to_token_advantages  # noqa: E402

VERL_EPS = 1e-6  # compute_grpo_outcome_advantage's default epsilon


def _batch(seed: int, groups: int, group_size: int, width: int = 12):
    """Random rewards (some ties), ragged right-padded masks (lengths 1..width), the reward on each response's
    last token as verl's ``token_level_rewards``, and verl's ``index`` (the group's uid per row)."""
    gen = torch.Generator().manual_seed(seed)
    n = groups * group_size
    rewards = torch.randint(0, 3, (n,), generator=gen).float() / 2 + torch.rand(n, generator=gen) * (seed % 2)
    lengths = torch.randint(1, width + 1, (n,), generator=gen)
    lengths[0] = width  # one full row
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    token_rewards = torch.zeros((n, width))
    token_rewards[torch.arange(n), lengths - 1] = rewards
    index = np.array([f"uid{i // group_size}" for i in range(n)], dtype=object)
    return rewards, mask, token_rewards, index


CASES = [(seed, groups, size) for seed, (groups, size) in enumerate([(6, 2), (3, 4), (2, 8), (5, 2), (4, 3)])]


@pytest.mark.parametrize("seed,groups,group_size", CASES)
def test_grpo_unscaled_equals_verl_exactly(seed, groups, group_size):
    rewards, mask, token_rewards, index = _batch(seed, groups, group_size)
    verl_adv, verl_ret = core_algos.compute_grpo_outcome_advantage(
        token_rewards, mask, index, norm_adv_by_std_in_grpo=False
    )
    ours = grpo_advantages(rewards.unsqueeze(1), torch.ones(1), group_size, scale_rewards="none")
    assert torch.equal(sequence_to_token_advantages(ours, mask), verl_adv)
    assert torch.equal(verl_adv, verl_ret)


@pytest.mark.parametrize("seed,groups,group_size", CASES)
def test_grpo_scaled_equals_verl_up_to_the_epsilon(seed, groups, group_size):
    rewards, mask, token_rewards, index = _batch(seed, groups, group_size)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=VERL_EPS)
    ours = grpo_advantages(rewards.unsqueeze(1), torch.ones(1), group_size, scale_rewards="group")
    std = nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
    # The epsilon undone on both sides: the same centred reward.
    torch.testing.assert_close(
        ours * (std + _STD_EPS), verl_adv[:, 0] * (std + VERL_EPS), rtol=1e-6, atol=1e-6
    )
    # Directly: within the epsilons' relative difference, (1e-4 - 1e-6) / (std + 1e-6).
    bound = (_STD_EPS - VERL_EPS) / (std + VERL_EPS) * verl_adv[:, 0].abs() + 1e-6
    assert bool(((ours - verl_adv[:, 0]).abs() <= bound).all())
    assert torch.equal(sequence_to_token_advantages(ours, mask).ne(0), verl_adv.ne(0))


@pytest.mark.parametrize("seed,groups,group_size", CASES)
def test_rloo_equals_verl(seed, groups, group_size):
    rewards, mask, token_rewards, index = _batch(seed, groups, group_size)
    verl_adv, verl_ret = core_algos.compute_rloo_outcome_advantage(token_rewards, mask, index)
    ours = sequence_to_token_advantages(rloo_advantages(rewards, group_size), mask)
    torch.testing.assert_close(ours, verl_adv, rtol=0, atol=4 * torch.finfo(torch.float32).eps)
    torch.testing.assert_close(ours, verl_ret, rtol=0, atol=4 * torch.finfo(torch.float32).eps)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (1.0, 0.9)])
@pytest.mark.parametrize("seed", range(3))
def test_gae_equals_verl(seed, gamma, lam):
    rewards, mask, token_rewards, _ = _batch(seed, groups=4, group_size=2, width=16)
    values = torch.randn(mask.shape, generator=torch.Generator().manual_seed(100 + seed)) * mask
    verl_adv, verl_ret = core_algos.compute_gae_advantage_return(
        token_rewards.double(), values.double(), mask.double(), gamma, lam
    )
    ours_adv, ours_ret = gae_advantages(values, rewards, mask, gamma=gamma, lam=lam)
    # Returns: verl's float64 result rounded to float32 is ours (mcadvantage computes in float64 too).
    torch.testing.assert_close(ours_ret, (verl_ret * mask.double()).float(), rtol=0, atol=2e-7)
    # Whitened advantages (both token-weighted, Bessel-corrected, over the response tokens).
    torch.testing.assert_close(
        masked_whiten(ours_adv, mask.bool()) * mask, verl_adv.float() * mask, rtol=1e-5, atol=1e-5
    )
