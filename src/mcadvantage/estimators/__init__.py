"""Advantage estimators behind one seam (see :mod:`mcadvantage.estimators.base`).

Built in: ``"vineppo"`` (Monte Carlo step values, :class:`VinePPOEstimator`), ``"grpo"``
(:class:`GRPOEstimator`), ``"rloo"`` (:class:`RLOOEstimator`), ``"gae"`` (PPO's learned critic,
:class:`CriticEstimator`), ``"hybrid"`` (GRPO plus Monte Carlo step credit for degenerate groups within a token
budget, :class:`HybridEstimator`) and ``"tree"`` (groups drawn as trees, step credit from their own leaves,
:class:`TreeEstimator`); ``BUILTIN_ESTIMATORS`` is their table. Every estimator subclasses
:class:`AdvantageEstimator`, the contract; register your own with :func:`register_advantage_estimator`.
"""

from __future__ import annotations

import importlib
from typing import Any

from mcadvantage.estimators.base import (
    BUILTIN_ESTIMATORS,
    AdvantageBatch,
    AdvantageEstimator,
    AdvantageResult,
    EstimatorContext,
    as_advantage_estimator,
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
    "BUILTIN_ESTIMATORS",
    "AdvantageBatch",
    "AdvantageEstimator",
    "AdvantageResult",
    "EstimatorContext",
    "as_advantage_estimator",
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
