"""Advantage estimators behind one seam: the contract (:mod:`mcadvantage.estimators.base`), what flows through it
(:mod:`~mcadvantage.estimators.batch`), the shared config rules (:mod:`~mcadvantage.estimators.rules`) and the
registry with the one table of built-ins, ``BUILTIN_ESTIMATORS`` (:mod:`~mcadvantage.estimators.registry`).

The built-in classes: :class:`VinePPOEstimator`, :class:`GRPOEstimator`, :class:`RLOOEstimator`,
:class:`CriticEstimator`, :class:`HybridEstimator`, :class:`TreeEstimator` and :class:`AnchorEstimator`. Every estimator subclasses
:class:`AdvantageEstimator`; register your own with :func:`register_advantage_estimator` and check it with
:func:`mcadvantage.testing.check_advantage_estimator`.
"""

from __future__ import annotations

import importlib
from typing import Any

from mcadvantage.estimators.base import (
    AdvantageEstimator,
    DrawsTrees,
    KeepsMonteCarloEstimate,
    ReadsStateKeys,
)
from mcadvantage.estimators.batch import (
    AdvantageBatch,
    AdvantageResult,
    EstimatorContext,
    check_finite_advantages,
    combine_rewards,
    finalize_advantages,
    reduce_metrics,
    sequence_to_token_advantages,
)
from mcadvantage.estimators.registry import (
    BUILTIN_ESTIMATORS,
    ENTRY_POINT_GROUP,
    BuiltinEstimator,
    as_advantage_estimator,
    available_advantage_estimators,
    build_advantage_estimator,
    estimator_choices_text,
    estimators_reading,
    get_advantage_estimator,
    register_advantage_estimator,
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
    "AnchorEstimator": ".anchor",
}

__all__ = [
    "BUILTIN_ESTIMATORS",
    "ENTRY_POINT_GROUP",
    "AdvantageBatch",
    "AdvantageEstimator",
    "AdvantageResult",
    "BuiltinEstimator",
    "DrawsTrees",
    "EstimatorContext",
    "KeepsMonteCarloEstimate",
    "ReadsStateKeys",
    "as_advantage_estimator",
    "available_advantage_estimators",
    "build_advantage_estimator",
    "check_finite_advantages",
    "combine_rewards",
    "estimator_choices_text",
    "estimators_reading",
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
