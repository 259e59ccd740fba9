"""The paired t-test the studies decide with: mean difference, its 95% interval and a two-sided p-value; Holm's
correction when one question is asked of several tasks.

Written by hand because scipy is not a dependency of the package and this is all of it that the benchmarks need:
Student's t distribution by numerical integration of its density (Simpson's rule; accurate to about 1e-7 in the
tails that matter here), and its quantile by bisection.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["holm_adjust", "paired_t_test", "student_t_cdf", "student_t_quantile"]


def _density(x: float, df: float) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))


def student_t_cdf(t: float, df: float, *, intervals: int = 4000) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"student_t_cdf: df must be > 0, got {df}.")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    x = abs(t)
    # Substitute x = tan(u) so the integral over [0, |t|] has a bounded integrand and range, heavy tails included.
    upper = math.atan(x)
    n = intervals + intervals % 2
    h = upper / n
    total = 0.0
    for i in range(n + 1):
        u = i * h
        weight = 1 if i in (0, n) else (4 if i % 2 else 2)
        total += weight * _density(math.tan(u), df) / math.cos(u) ** 2
    half = total * h / 3
    return 0.5 + half if t >= 0 else 0.5 - half


@functools.lru_cache(maxsize=256)
def student_t_quantile(p: float, df: float) -> float:
    """The ``t`` with ``P(T <= t) = p`` (bisection on :func:`student_t_cdf`). Cached: a bisection is 100 numerical
    integrations, and a study asks for the same few (0.975, df) many times."""
    if not 0 < p < 1:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}.")
    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paired_t_test(differences: Sequence[float]) -> dict[str, Any]:
    """Two-sided paired t-test of ``differences`` (one per seed, arm minus comparison arm).

    Returns ``n``, ``mean``, ``sd``, ``se``, ``ci95`` (``[low, high]``), ``t`` and ``p`` (NaN with fewer than 2
    differences; ``p`` 1.0 and ``t`` 0 when every difference is 0)."""
    xs = [float(x) for x in differences]
    n = len(xs)
    if n < 2:
        mean = xs[0] if xs else math.nan
        return {"n": n, "mean": mean, "sd": math.nan, "se": math.nan, "ci95": [math.nan, math.nan],
                "t": math.nan, "p": math.nan}  # fmt: skip
    mean, sd = statistics.fmean(xs), statistics.stdev(xs)
    se = sd / math.sqrt(n)
    half = student_t_quantile(0.975, n - 1) * se
    if se == 0:
        t, p = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    else:
        t = mean / se
        p = 2 * (1 - student_t_cdf(abs(t), n - 1))
    return {"n": n, "mean": mean, "sd": sd, "se": se, "ci95": [mean - half, mean + half], "t": t, "p": p}


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the ``i``-th smallest of ``m`` p-values is multiplied by
    ``m - i`` (``i`` from 0), made non-decreasing in that order, and capped at 1. Rejecting where the adjusted value
    is below alpha controls the family-wise error at alpha. NaN p-values are returned as NaN and not counted."""
    ps = [float(p) for p in p_values]
    finite = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    m = len(finite)
    adjusted = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted
