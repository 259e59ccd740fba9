"""Config rules that several estimators share, each written once.

An estimator lists the rules it needs in its ``config_rules`` (a tuple of these functions); ``VinePPOConfig`` runs
them when it is built, before the estimator's own :meth:`~mcadvantage.estimators.base.AdvantageEstimator.validate_config`.
A rule takes the config and the estimator's name and raises ``ValueError`` naming the setting, its value, the
estimator and the fix. Rules read only ``GRPOConfig`` fields, so they apply to any config that has them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "TOKEN_LEVEL_CLIP_LOSSES",
    "ConfigRule",
    "no_reward_scaling",
    "sampled_continuations",
    "summed_rewards",
    "token_level_loss",
]

#: A rule: ``rule(config, estimator_name)`` raises ``ValueError`` when the config contradicts the estimator.
ConfigRule = Callable[[Any, str], None]

#: TRL loss types that aggregate the PPO-clip surrogate token by token; "dapo" (the default) is VinePPO's.
TOKEN_LEVEL_CLIP_LOSSES = ("dapo", "bnpo", "dr_grpo", "grpo")


def token_level_loss(config: Any, estimator: str) -> None:
    """Per-token advantages need a loss that weighs them token by token, and a per-token importance ratio."""
    if config.loss_type not in TOKEN_LEVEL_CLIP_LOSSES:
        raise ValueError(
            f"loss_type={config.loss_type!r} is not a token-level PPO-clip loss, so it would not use "
            f"advantage_estimator={estimator!r}'s per-token advantages as the paper does. Use one of "
            f"{list(TOKEN_LEVEL_CLIP_LOSSES)} ('dapo', the default, is the paper's token-weighted mean)."
        )
    if config.importance_sampling_level != "token":
        raise ValueError(
            f"importance_sampling_level={config.importance_sampling_level!r} averages the ratio over the "
            f"sequence, which discards advantage_estimator={estimator!r}'s per-token credit in the clipping. Set "
            "importance_sampling_level='token'."
        )


def no_reward_scaling(config: Any, estimator: str) -> None:
    """``scale_rewards`` shapes GRPO's group advantages only; an estimator that replaces them would ignore it."""
    if config.scale_rewards != "none":
        raise ValueError(
            f"scale_rewards={config.scale_rewards!r} scales GRPO's group advantages, which "
            f"advantage_estimator={estimator!r} replaces, so it would be ignored. Set scale_rewards='none' (or leave "
            "it unset) and use whiten_advantages=True to normalise the advantages, or choose "
            "advantage_estimator='grpo' for GRPO's scaling."
        )


def summed_rewards(config: Any, estimator: str) -> None:
    """Values and returns are means of the weighted sum of raw rewards: normalising each reward function within its
    group first has no equivalent there."""
    if config.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            f"multi_objective_aggregation={config.multi_objective_aggregation!r} is not supported by "
            f"advantage_estimator={estimator!r}: it works on the weighted sum of raw rewards, so group-normalising "
            "each reward function first has no equivalent there. Set "
            "multi_objective_aggregation='sum_then_normalize'."
        )


def sampled_continuations(config: Any, estimator: str) -> None:
    """Monte Carlo values average continuations sampled from the policy: greedy decoding makes them all one text."""
    if not config.temperature > 0:
        raise ValueError(
            f"temperature={config.temperature} is invalid for advantage_estimator={estimator!r}: Monte Carlo values "
            "average continuations sampled from the policy, and at temperature 0 every continuation from a state is "
            "the same greedy text (an estimate of nothing; transformers refuses temperature 0 when sampling). Use a "
            "temperature > 0 (the paper: 0.6)."
        )
