"""Advantage estimators behind one seam (see :mod:`mcadvantage.estimators.base`).

Built in: ``"vineppo"`` (Monte Carlo step values, :class:`VinePPOEstimator`), ``"grpo"``
(:class:`GRPOEstimator`), ``"rloo"`` (:class:`RLOOEstimator`) and ``"gae"`` (PPO's learned critic,
:class:`CriticEstimator`), ``"hybrid"`` (GRPO plus Monte Carlo step credit for degenerate groups within a token
budget, :class:`HybridEstimator`) and ``"tree"`` (groups drawn as trees, step credit from their own leaves,
:class:`TreeEstimator`). Register your own with
:func:`register_advantage_estimator`.
"""

from __future__ import annotations

import importlib
from typing import Any

from mcadvantage.estimators.base import (
    AdvantageBatch,
    AdvantageEstimator,
    AdvantageResult,
    EstimatorContext,
    available_advantage_estimators,
    build_advantage_estimator,
    check_finite_advantages,
    combine_rewards,
    finalize_advantages,
    get_advantage_estimator,
    reduce_metrics,
    register_advantage_estimator,
    sequence_to_token_advantages,
)

_LAZY = {
    "GRPOEstimator": ".baselines",
    "RLOOEstimator": ".baselines",
    "grpo_advantages": ".baselines",
    "rloo_advantages": ".baselines",
    "VinePPOEstimator": ".vineppo",
    "CriticEstimator": ".critic",
    "HybridEstimator": ".hybrid",
    "TreeEstimator": ".tree",
}

__all__ = [
    "AdvantageBatch",
    "AdvantageEstimator",
    "AdvantageResult",
    "EstimatorContext",
    "available_advantage_estimators",
    "build_advantage_estimator",
    "check_finite_advantages",
    "combine_rewards",
    "finalize_advantages",
    "get_advantage_estimator",
    "reduce_metrics",
    "register_advantage_estimator",
    "sequence_to_token_advantages",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mcadvantage.estimators' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
