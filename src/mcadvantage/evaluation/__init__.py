"""Measuring policies and estimators: Pass@1 (:mod:`~mcadvantage.evaluation.pass_at_1`), credit diagnostics against
ground-truth values (:mod:`~mcadvantage.evaluation.diagnostics`), gradient quality per unit of cost
(:mod:`~mcadvantage.evaluation.gradient_quality`, on the gradient instrument
:mod:`~mcadvantage.evaluation.gradient_instrument` and the cost model :mod:`~mcadvantage.evaluation.cost_model`)
and HTML pages of step-coloured responses (:mod:`~mcadvantage.evaluation.report`).

The 0.1 layout's ``mcadvantage.evaluation`` module was Pass@1; its public names stay importable from here.
"""

from __future__ import annotations

import importlib
from typing import Any

_PASS_AT_1 = (
    "PassAt1Settings",
    "PassAt1Result",
    "ScoredSamples",
    "score_samples",
    "evaluate_pass_at_1",
    "evaluate_checkpoint",
)

__all__ = list(_PASS_AT_1)


def __getattr__(name: str) -> Any:
    if name in _PASS_AT_1:
        return getattr(importlib.import_module(".pass_at_1", __name__), name)
    raise AttributeError(f"module 'mcadvantage.evaluation' has no attribute {name!r}")
