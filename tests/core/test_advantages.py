"""Advantage math: hand-computed step/token advantages and (cross-rank) masked whitening."""

from __future__ import annotations

import math
import os

import pytest
import torch
from _helpers import free_port

from mcadvantage.core.advantages import masked_whiten, step_advantages, token_advantages

# ----------------------------------------------------------------------------- step_advantages


def test_step_advantages_hand_computed():
    # V(S_0)=0.25, V(S_1)=0.5, V(S_2)=0.125, R=1 -> A = [0.25, -0.375, 0.875]
    assert step_advantages([0.25, 0.5, 0.125, 1.0]) == [0.25, -0.375, 0.875]


def test_one_step_response_gets_reward_minus_prompt_value():
    assert step_advantages([0.75, 0.0]) == [-0.75]


def test_empty_completion_has_no_advantage():
    # boundaries [0]: no step, values == [R]
    assert step_advantages([1.0]) == []
    out = token_advantages([], [0])
    assert out.shape == (0,) and out.dtype == torch.float32


def test_step_advantages_requires_the_reward():
    with pytest.raises(ValueError, match="values"):
        step_advantages([])


@pytest.mark.parametrize("seed", range(5))
def test_telescoping_identity(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 30, (1,), generator=g))
    values = torch.rand(n + 1, generator=g, dtype=torch.float64).tolist()
    advs = step_advantages(values)
    assert len(advs) == n
    assert math.fsum(advs) == pytest.approx(values[-1] - values[0], abs=1e-12)


# ----------------------------------------------------------------------------- token_advantages


def test_token_advantages_spread_over_steps_with_eos_in_last_step():
    # 3 steps over 7 tokens (the last one an EOS): [0,2) [2,3) [3,7)
    out = token_advantages([0.5, -1.0, 2.0], [0, 2, 3, 7])
    assert out.dtype == torch.float32
    assert out.tolist() == [0.5, 0.5, -1.0, 2.0, 2.0, 2.0, 2.0]


def test_token_advantages_pads_with_zero_past_the_last_boundary():
    # a completion of 4 tokens in a batch padded to 6: padding gets 0
    out = token_advantages([1.5, -0.5], [0, 1, 4], length=6)
    assert out.tolist() == [1.5, -0.5, -0.5, -0.5, 0.0, 0.0]


def test_token_advantages_truncated_completion():
    # a truncated completion (no EOS, hit the budget of 5) is just its steps: nothing special
    values = [0.5, 0.25, 0.0]  # R = 0 for the truncated response
    out = token_advantages(step_advantages(values), [0, 3, 5])
    assert out.tolist() == [-0.25, -0.25, -0.25, -0.25, -0.25]


@pytest.mark.parametrize(
    ("advs", "bounds", "length", "match"),
    [
        ([1.0], [1, 3], None, "start with 0"),
        ([1.0, 2.0], [0, 2, 2], None, "strictly increasing"),
        ([1.0], [0, 2, 4], None, "2 steps"),
        ([1.0], [0, 4], 3, "length=3"),
    ],
)
def test_token_advantages_rejects_bad_boundaries(advs, bounds, length, match):
    with pytest.raises(ValueError, match=match):
        token_advantages(advs, bounds, length)


# ----------------------------------------------------------------------------- masked_whiten


def test_masked_whiten_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 5.0, -7.0, 42.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # masked tokens 1..5: mean 3, biased var 2, unbiased var 2.5
    out = masked_whiten(values, mask)
    expected = (torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]) - 3.0) / math.sqrt(2.5 + 1e-8)
    assert torch.allclose(out[mask.bool()], expected, atol=1e-6)
    assert out[~mask.bool()].tolist() == [0.0, 0.0, 0.0]
    biased = masked_whiten(values, mask, unbiased=False)
    assert torch.allclose(biased[mask.bool()], (expected * math.sqrt(2.5)) / math.sqrt(2.0), atol=1e-6)


def test_masked_whiten_matches_trl_on_unmasked_tokens():
    # TRL's (legacy) masked_whiten: token-weighted mean, Bessel-corrected variance, eps 1e-8.
    g = torch.Generator().manual_seed(0)
    values = torch.randn(4, 9, generator=g) * 3 + 1
    mask = (torch.rand(4, 9, generator=g) > 0.3).long()
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    ref = (values - mean) * torch.rsqrt(var + 1e-8)
    out = masked_whiten(values, mask)
    assert torch.allclose(out[mask.bool()], ref[mask.bool()], atol=1e-5)
    # the whitened unmasked tokens have mean 0 and unbiased std 1
    kept = out[mask.bool()].double()
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert kept.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_without_mean_shift_keeps_the_mean():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    mask = torch.ones(5)
    out = masked_whiten(values, mask, shift_mean=False)
    assert out.mean().item() == pytest.approx(3.0, abs=1e-6)
    assert out.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_errors():
    with pytest.raises(ValueError, match="shape"):
        masked_whiten(torch.zeros(3), torch.ones(4))
    with pytest.raises(ValueError, match="1 unmasked token"):
        masked_whiten(torch.zeros(3), torch.tensor([0, 1, 0]))


def _whiten_worker(rank: int, world: int, port: int, values, masks, results) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results[rank] = masked_whiten(values[rank], masks[rank])
    finally:
        torch.distributed.destroy_process_group()


# Spawning two interpreters that import torch takes ~5 s alone, over 15 s on a loaded machine.
@pytest.mark.slow
def test_masked_whiten_across_two_gloo_ranks_equals_whitening_the_concatenation():
    # Each rank holds a different batch (different lengths and masks). With the all-reduced
    # statistics, every rank must get exactly the slice of the 1-process whitening of the
    # concatenated data, and NOT its own local whitening.
    mp = torch.multiprocessing.get_context("spawn")
    g = torch.Generator().manual_seed(1)
    values = [torch.randn(3, 5, generator=g) + 2.0, torch.randn(2, 5, generator=g) * 4.0 - 1.0]
    masks = [(torch.rand(3, 5, generator=g) > 0.2).long(), (torch.rand(2, 5, generator=g) > 0.5).long()]
    with mp.Manager() as manager:
        results = manager.dict()
        port = free_port()
        torch.multiprocessing.start_processes(
            _whiten_worker, args=(2, port, values, masks, results), nprocs=2, join=True, start_method="spawn"
        )
        per_rank = [results[0], results[1]]
    reference = masked_whiten(torch.cat(values), torch.cat(masks))
    assert torch.allclose(torch.cat(per_rank), reference, atol=1e-6)
    local0 = masked_whiten(values[0], masks[0])
    assert not torch.allclose(per_rank[0], local0, atol=1e-3)


# ----------------------------------------------------------------------------- GAE and the value loss (PPO's critic)


def test_gae_with_gamma_lambda_one_is_reward_minus_value():
    from mcadvantage.core.advantages import gae_advantages

    values = torch.tensor([[0.2, 0.5, 0.9], [0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, ret = gae_advantages(values, torch.tensor([1.0, 0.0]), mask)
    torch.testing.assert_close(adv, torch.tensor([[0.8, 0.5, 0.1], [-0.4, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_gae_hand_computed_with_lambda_half():
    from mcadvantage.core.advantages import gae_advantages

    # delta = (0.5 - 0.2, 0.9 - 0.5, 1 - 0.9) = (0.3, 0.4, 0.1); A_2 = 0.1, A_1 = 0.4 + 0.5 * 0.1 = 0.45,
    # A_0 = 0.3 + 0.5 * 0.45 = 0.525; returns = A + V = (0.725, 0.95, 1.0).
    adv, ret = gae_advantages(torch.tensor([[0.2, 0.5, 0.9]]), torch.tensor([1.0]), torch.ones(1, 3), lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.525, 0.45, 0.1]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.95, 1.0]]))
    # gamma = 0.5, lambda = 1: delta = (0.25 - 0.2, 0.45 - 0.5, 1 - 0.9) = (0.05, -0.05, 0.1);
    # A_2 = 0.1, A_1 = -0.05 + 0.05 = 0, A_0 = 0.05 + 0 = 0.05.
    adv, _ = gae_advantages(torch.tensor([[0.2, 0.5, 0.9]]), torch.tensor([1.0]), torch.ones(1, 3), gamma=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.05, 0.0, 0.1]]))


def test_gae_rejects_bad_shapes_and_parameters():
    from mcadvantage.core.advantages import gae_advantages

    with pytest.raises(ValueError, match="must be"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"lam=1.5"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2), lam=1.5)


def test_clipped_value_loss_hand_computed():
    from mcadvantage.core.advantages import clipped_value_loss

    new = torch.tensor([[0.9, 0.3]])
    old = torch.tensor([[0.5, 0.3]])
    ret = torch.tensor([[1.0, 0.0]])
    # Token 0: unclipped (0.9 - 1)^2 = 0.01; clipped 0.5 + 0.2 = 0.7 -> 0.09; max 0.09.
    # Token 1: 0.09 both ways. Mean of 0.5 * (0.09, 0.09) = 0.045; the padded third column does not count.
    loss = clipped_value_loss(new, old, ret, torch.tensor([[1, 1]]))
    assert loss.item() == pytest.approx(0.045)
    padded = clipped_value_loss(
        torch.tensor([[0.9, 0.3, 5.0]]),
        torch.tensor([[0.5, 0.3, 0.0]]),
        torch.tensor([[1.0, 0.0, 0.0]]),
        torch.tensor([[1, 1, 0]]),
    )
    assert padded.item() == pytest.approx(0.045)


def test_loss_token_mask_leaves_tool_tokens_out():
    from mcadvantage.core.advantages import loss_token_mask

    completion = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    tool = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 1, 1]])
    assert torch.equal(loss_token_mask(completion, tool), torch.tensor([[1, 0, 0, 1, 0], [1, 1, 0, 0, 0]]))
    assert loss_token_mask(completion, None) is completion
    with pytest.raises(ValueError, match=r"tool_mask \(2, 4\) must have completion_mask's shape \(2, 5\)"):
        loss_token_mask(completion, tool[:, :4])
