"""Reward-only baselines on the estimator seam: GRPO's group-normalised and RLOO's leave-one-out advantages.

Both give every token of a response the same advantage, computed from the rewards of the responses to the same
prompt (a group of ``group_size`` consecutive responses of the global batch). They reproduce TRL 1.16's
``GRPOTrainer`` / ``RLOOTrainer`` advantages exactly (tested against them on the same batch), so VinePPO and
its baselines can be compared on one trainer, one data order and one logging path. Unscorable responses (every
reward function returned None) are left out of the group statistics and get advantage 0, as in TRL.

Differences from the TRL trainers that are not about advantages: under ``VinePPOTrainer`` the KL penalty stays
in the loss (``beta``, GRPO's k3 estimator) for every estimator, whereas ``trl.RLOOTrainer`` subtracts a
sequence-level KL from the reward; compare with ``beta=0`` or read the difference into the results.
"""

from __future__ import annotations

from typing import Any

import torch

from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.batch import (
    AdvantageBatch,
    AdvantageResult,
    EstimatorContext,
    combine_rewards,
    sequence_to_token_advantages,
)
from mcadvantage.estimators.registry import register_advantage_estimator
from mcadvantage.estimators.rules import no_reward_scaling, summed_rewards

__all__ = ["GRPOEstimator", "RLOOEstimator", "grpo_advantages", "rloo_advantages", "nanstd"]

# TRL's epsilon in the std normalisation (kept identical so advantages match token for token).
_STD_EPS = 1e-4
_SCALE_REWARDS = ("group", "batch", "none")
_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Sample standard deviation (Bessel-corrected) ignoring NaN; NaN where fewer than two values count."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std if keepdim else (std.squeeze(dim) if dim is not None else std.reshape(()))


def grpo_advantages(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    group_size: int,
    *,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """GRPO's advantage of every response of the global batch, ``(N,)``.

    ``sum_then_normalize``: ``A = R - mean(group)``, divided by ``std(group) + 1e-4`` (``scale_rewards="group"``),
    by the batch std (``"batch"``) or not at all (``"none"``). ``normalize_then_sum``: every reward function is
    normalised within its group first, the weighted sum is then normalised over the batch.
    """
    if scale_rewards not in _SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r} must be one of {list(_SCALE_REWARDS)}.")
    per_func = rewards_per_func.float()
    unscorable = torch.isnan(per_func).all(dim=1)
    if multi_objective_aggregation == "sum_then_normalize":
        rewards = combine_rewards(per_func, reward_weights)
        grouped = rewards.view(-1, group_size)
        mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)
        advantages = rewards - mean
        if scale_rewards == "group":
            std = (
                nanstd(grouped, dim=1).repeat_interleave(group_size)
                if group_size > 1
                else torch.zeros_like(rewards)
            )
            advantages = advantages / (std + _STD_EPS)
        elif scale_rewards == "batch":
            std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
            advantages = advantages / (std + _STD_EPS)
    elif multi_objective_aggregation == "normalize_then_sum":
        grouped = per_func.view(-1, group_size, per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean_k)
        normalised = ((grouped - mean_k) / (std_k + _STD_EPS)).view(-1, per_func.shape[1])
        w = torch.as_tensor(reward_weights, dtype=normalised.dtype)
        rewards = (normalised * w.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards) if rewards.numel() > 1 else torch.zeros(())
        advantages = (rewards - torch.nanmean(rewards)) / (std + _STD_EPS)
    else:
        raise ValueError(
            f"multi_objective_aggregation={multi_objective_aggregation!r} must be one of {list(_AGGREGATIONS)}."
        )
    return torch.nan_to_num(advantages, nan=0.0)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO's advantage of every response, ``(N,)``: its reward minus the mean reward of the other scorable
    responses to the same prompt (0 for unscorable responses and for groups with one scorable response)."""
    rewards = rewards.float()
    if group_size < 2:
        return torch.zeros_like(rewards)
    grouped = rewards.view(-1, group_size)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    total = torch.nansum(grouped, dim=1, keepdim=True)
    baselines = ((total - grouped) / (count - 1)).view(-1)
    return torch.nan_to_num(rewards - baselines, nan=0.0)


def _model_tokens(batch: AdvantageBatch, loss_mask: torch.Tensor) -> torch.Tensor | None:
    """The result's ``token_mask``: None (every completion token) for single-turn batches; with a ``tool_mask``,
    the model's own tokens, so tool results stay out of the whitening statistics."""
    return None if batch.tool_mask is None else loss_mask.bool()


def _group_metrics(rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    grouped = rewards.view(-1, group_size)
    solved = torch.nan_to_num(grouped, nan=0.0)
    zero_std = (solved.max(dim=1).values == solved.min(dim=1).values).float().mean()
    return {"frac_groups_zero_std": float(zero_std)}


@register_advantage_estimator("grpo")
class GRPOEstimator(AdvantageEstimator):
    """GRPO (Shao et al., 2024) as TRL computes it: group-mean baseline, optional std scaling.

    Args:
        scale_rewards: ``"group"`` (TRL's default), ``"batch"`` or ``"none"`` (Dr. GRPO).
        multi_objective_aggregation: ``"sum_then_normalize"`` or ``"normalize_then_sum"``.
    """

    whiten_by_default = False
    #: ``VinePPOConfig.scale_rewards`` when left unset: GRPO's own default.
    default_scale_rewards = "group"

    def __init__(
        self, *, scale_rewards: str = "group", multi_objective_aggregation: str = "sum_then_normalize"
    ) -> None:
        if scale_rewards not in _SCALE_REWARDS:
            raise ValueError(f"scale_rewards={scale_rewards!r} must be one of {list(_SCALE_REWARDS)}.")
        if multi_objective_aggregation not in _AGGREGATIONS:
            raise ValueError(
                f"multi_objective_aggregation={multi_objective_aggregation!r} must be one of {list(_AGGREGATIONS)}."
            )
        self.scale_rewards = scale_rewards
        self.multi_objective_aggregation = multi_objective_aggregation

    @classmethod
    def from_config(cls, config: Any) -> GRPOEstimator:
        """Build the estimator from a ``VinePPOConfig`` (or any object with the same fields)."""
        return cls(
            scale_rewards=config.scale_rewards, multi_objective_aggregation=config.multi_objective_aggregation
        )

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """Per-token advantages of the local responses (see :class:`~mcadvantage.estimators.base.AdvantageEstimator`)."""
        advantages = grpo_advantages(
            batch.rewards_per_func.cpu(),
            batch.reward_weights.cpu(),
            batch.group_size,
            scale_rewards=self.scale_rewards,
            multi_objective_aggregation=self.multi_objective_aggregation,
        )[batch.local_slice]
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        tokens = sequence_to_token_advantages(advantages.to(mask.device), mask)
        return AdvantageResult(
            advantages=tokens,
            token_mask=_model_tokens(batch, mask),
            metrics=_group_metrics(batch.all_rewards.cpu(), batch.group_size),
        )


@register_advantage_estimator("rloo")
class RLOOEstimator(AdvantageEstimator):
    """RLOO (Ahmadian et al., 2024): leave-one-out baseline, as TRL's ``RLOOTrainer`` computes it (with
    ``normalize_advantages=False``; set ``whiten_advantages=True`` to normalise, token-weighted)."""

    whiten_by_default = False
    # Reward scaling and per-function normalisation shape GRPO's advantages, not RLOO's.
    config_rules = (no_reward_scaling, summed_rewards)

    @classmethod
    def from_config(cls, config: Any) -> RLOOEstimator:
        """Build the estimator from a ``VinePPOConfig`` (or any object with the same fields)."""
        return cls()

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """Per-token advantages of the local responses (see :class:`~mcadvantage.estimators.base.AdvantageEstimator`)."""
        all_rewards = batch.all_rewards.cpu()
        advantages = rloo_advantages(all_rewards, batch.group_size)[batch.local_slice]
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        tokens = sequence_to_token_advantages(advantages.to(mask.device), mask)
        return AdvantageResult(
            advantages=tokens,
            token_mask=_model_tokens(batch, mask),
            metrics=_group_metrics(all_rewards, batch.group_size),
        )
