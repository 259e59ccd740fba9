"""Credit-assignment diagnostics: how close an estimator's values and advantages are to the truth.

Pure functions on plain sequences, so they score any estimator (Monte Carlo at any K, a learned critic, GRPO's
implied per-token advantage) against ground truth (e.g. Monte Carlo values from a large K drawn independently of
the estimate being scored). The I/O that produces those numbers (sampling, grading) lives elsewhere.

- :func:`value_errors`: mean absolute error, root mean squared error and explained variance of state values.
- :func:`sign_accuracy`: how often an advantage estimate has the sign of the true advantage.
- :func:`ranking_accuracy`: the paper's ranking test (VinePPO, section 7): given alternative next steps from one
  state, how often the estimator orders a pair as the truth does (pairwise), and how often it picks the truly best
  step (top-1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

__all__ = ["ranking_accuracy", "sign_accuracy", "value_errors"]


def _pairs(estimated: Sequence[float], truth: Sequence[float], name: str) -> list[tuple[float, float]]:
    if len(estimated) != len(truth):
        raise ValueError(
            f"{name}: estimated has {len(estimated)} values but truth has {len(truth)}; pass one each."
        )
    pairs = [(float(e), float(t)) for e, t in zip(estimated, truth, strict=True)]
    if not pairs:
        raise ValueError(f"{name}: no values to compare.")
    if any(not (math.isfinite(e) and math.isfinite(t)) for e, t in pairs):
        raise ValueError(f"{name}: values must be finite (drop unscorable states first).")
    return pairs


def value_errors(estimated: Sequence[float], truth: Sequence[float]) -> dict[str, float]:
    """Errors of estimated state values against true ones.

    Returns:
        ``mae``, ``rmse`` and ``explained_variance`` (``1 - Var(truth - estimated) / Var(truth)``, population
        variances; NaN when the true values do not vary).
    """
    pairs = _pairs(estimated, truth, "value_errors")
    n = len(pairs)
    errors = [t - e for e, t in pairs]
    mean_t = math.fsum(t for _, t in pairs) / n
    var_t = math.fsum((t - mean_t) ** 2 for _, t in pairs) / n
    mean_err = math.fsum(errors) / n
    var_err = math.fsum((d - mean_err) ** 2 for d in errors) / n
    return {
        "mae": math.fsum(abs(d) for d in errors) / n,
        "rmse": math.sqrt(math.fsum(d * d for d in errors) / n),
        "explained_variance": 1.0 - var_err / var_t if var_t > 0 else math.nan,
    }


def sign_accuracy(estimated: Sequence[float], truth: Sequence[float], *, tolerance: float = 0.0) -> float:
    """Share of advantages whose estimate has the true sign, over the entries whose true advantage is decided
    (``|truth| > tolerance``); NaN when none is. An estimate of exactly 0 counts as wrong (it ranks nothing)."""
    if tolerance < 0:
        raise ValueError(f"sign_accuracy: tolerance={tolerance} must be >= 0.")
    decided = [(e, t) for e, t in _pairs(estimated, truth, "sign_accuracy") if abs(t) > tolerance]
    if not decided:
        return math.nan
    return sum((e > 0) == (t > 0) and e != 0 for e, t in decided) / len(decided)


def ranking_accuracy(
    estimated: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]
) -> dict[str, float]:
    """The paper's ranking test over groups of alternatives (e.g. the values of K alternative next steps sampled
    from one state, one group per state).

    Args:
        estimated: per group, the estimator's value of each alternative.
        truth: per group, the true value of each alternative (same shape).

    Returns:
        ``pairwise``: over the pairs of alternatives whose true values differ, the share the estimator orders the
        same way (ties in the estimate count as half). ``top1``: over the groups with a unique true best, the share
        where the estimator's best (ties split evenly) is it. ``pairs`` and ``groups``: how many were scored. NaN
        where nothing could be scored.
    """
    if len(estimated) != len(truth):
        raise ValueError(f"ranking_accuracy: {len(estimated)} estimated groups but {len(truth)} true groups.")
    agree = pairs = 0.0
    top1 = groups = 0.0
    for g, (est, tru) in enumerate(zip(estimated, truth, strict=True)):
        values = _pairs(est, tru, f"ranking_accuracy group {g}")
        for (e_i, t_i), (e_j, t_j) in combinations(values, 2):
            if t_i == t_j:
                continue
            pairs += 1
            agree += 0.5 if e_i == e_j else float((e_i > e_j) == (t_i > t_j))
        best_t = max(t for _, t in values)
        if sum(t == best_t for _, t in values) != 1:
            continue
        groups += 1
        best_e = max(e for e, _ in values)
        chosen = [t for e, t in values if e == best_e]
        top1 += sum(t == best_t for t in chosen) / len(chosen)
    return {
        "pairwise": agree / pairs if pairs else math.nan,
        "top1": top1 / groups if groups else math.nan,
        "pairs": pairs,
        "groups": groups,
    }
