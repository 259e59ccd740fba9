"""Cheaper Monte Carlo: which states to estimate, which samples are free, where new rollouts go (pure functions).

VinePPO's fixed scheme samples ``K`` continuations at every step boundary. Three things make that cheaper
without giving up what makes it work; each is a small pure function here, wired into
:class:`~mcadvantage.mc.estimator.MCValueEstimator` by its options:

1. **A step budget** (``min_step_tokens``, ``steps_after_cap="spread"``): cost grows with a budget, not with
   the number of newlines. :func:`merge_short_steps` merges steps shorter than ``m`` tokens;
   :func:`spread_boundaries` keeps at most ``n`` states per response, spread evenly by token position.
2. **Free samples** (``reuse_samples``): every response of the group that passes through a state (shares its
   prefix tokens and goes on) is a draw of that state's value, and so is every rollout that passes through it.
   :func:`leave_one_out_mean` pools them *leave-one-out*: a response's own outcome never enters the values used
   for its own advantages. (The value of ``S_i`` is the baseline of step ``i + 1``; if it contained the
   response's own reward it would correlate with that step's action and bias the policy gradient.)
3. **Adaptive allocation** (``allocation="variance"``): a per-batch budget of rollout tokens spent where it
   reduces advantage error most. :func:`allocate_rollouts` greedily minimises ``sum_s w_s var_s / n_s`` per
   token, where ``w_s`` is how many advantage tokens the state's value enters and ``var_s`` a variance estimate
   shrunk toward the parent state's (:func:`shrunk_variance`), so a state whose outcome already looks certain
   gets few rollouts.

**Why adaptive allocation is still exactly unbiased.** How many second-wave rollouts a state gets depends on what
the first wave saw there (its outcomes, its lengths, which responses are masked). Averaging all of a state's
samples into one mean would then be biased (optional stopping: a state whose first samples happened to agree gets
few more, so their luck is not averaged away; on the toy with exact values, per-state errors up to 0.03, 4-6
standard errors, and a covariance with the response's own outcome, z = -7, when failures were masked). So the two
waves are never pooled into one mean. A state's value is a fixed mix
(:func:`two_wave_mean`)::

    V = a * (mean of its first-wave samples) + (1 - a) * (mean of its second-wave samples)

with ``a = min(1, n_1 / K)`` (:func:`first_wave_share`), ``n_1`` its first-wave samples (free ones included,
the response's own outcome left out). ``n_1`` is fixed before any outcome is seen: it counts responses and
rollouts by their prefixes only, never by how they end, and it counts masked responses too. So the first-wave
mean is unbiased whatever its weight. The second-wave samples are fresh draws, so their mean is unbiased given
everything the allocation looked at. Every state with ``a < 1`` gets at least one second-wave rollout, so the
mean exists. A state that already has ``K`` first-wave samples (``a = 1``) gets none; second-wave rollouts that
pass through it do not count there. Hence ``E[V(s)] = V(s)`` at every state, under any allocation rule and any
masking, and a response's own outcome never enters its values. The allocation may look at the responses'
outcomes and at which of them are masked: what it decides only sets how many fresh draws go into the second
mean. The price: the second wave's few samples can carry a large share ``1 - a``, so the value is noisier than a
pooled mean of the same samples would be (the share is fixed before the allocation, so it cannot follow it),
and states with ``K`` free samples get no second-wave rollouts at all. (One assumption: the states above a state
are states of every response through it, so that the first-wave rollouts passing through it do not depend on
which responses are masked. Segmenters that cut by the prefix give that; ``steps_after_cap="spread"``, which
cuts by the whole response's length, need not.)

Free samples alone (``allocation="uniform"``) decide from prefix counts only, never from outcomes, and pool
everything into one mean; that is unbiased too. ``benchmarks/mc_efficiency.py`` measures the cost of both, and
the tests check per state, and under masking chosen by outcome, that the errors average to zero on a toy with
exact values.

These are written by hand because no library allocates Monte Carlo rollouts per state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

__all__ = [
    "merge_short_steps",
    "spread_boundaries",
    "leave_one_out_mean",
    "shrunk_variance",
    "allocate_rollouts",
    "first_wave_share",
    "two_wave_mean",
]


def merge_short_steps(boundaries: Sequence[int], min_step_tokens: int | None) -> list[int]:
    """Merge steps shorter than ``min_step_tokens`` tokens into the step after them (a short last step into the
    one before it), so every estimated segment covers at least that many tokens (unless the whole response is
    shorter).

    >>> merge_short_steps([0, 2, 10, 11, 20, 21], 3)
    [0, 10, 21]

    The boundaries stay valid (``0 = b_0 < ... < b_n``, the end kept) and the advantages still telescope to
    ``R - V(S_0)``.
    """
    b = [int(x) for x in boundaries]
    if min_step_tokens is None or min_step_tokens <= 1 or len(b) <= 2:
        return b
    kept = [b[0]]
    for x in b[1:-1]:
        if x - kept[-1] >= min_step_tokens:
            kept.append(x)
    if len(kept) > 1 and b[-1] - kept[-1] < min_step_tokens:
        kept.pop()  # the last segment is too short: it joins the one before it
    return kept + [b[-1]]


def spread_boundaries(boundaries: Sequence[int], max_states: int | None) -> list[int]:
    """Keep at most ``max_states`` states (``S_0`` always), the others nearest to evenly spaced token positions
    ``j * L / max_states``; the steps between kept states are merged.

    >>> spread_boundaries([0, 1, 2, 3, 4, 5, 6, 7, 8], 4)
    [0, 2, 4, 6, 8]
    """
    b = [int(x) for x in boundaries]
    n = len(b) - 1
    if max_states is None or n <= max_states:
        return b
    inner = b[1:-1]
    length = b[-1]
    chosen: list[int] = []
    for j in range(1, max_states):
        target = j * length / max_states
        best = min(inner, key=lambda x: (abs(x - target), x))
        if best not in chosen:
            chosen.append(best)
    return [b[0], *sorted(chosen), b[-1]]


def leave_one_out_mean(total: float, count: int, own: float | None) -> float:
    """Mean of a pool of ``count`` samples summing to ``total``, without ``own`` (a sample in the pool that must
    not count; None: nothing to leave out).

    Raises:
        ValueError: when nothing is left to average.
    """
    if own is not None:
        total, count = total - own, count - 1
    if count < 1:
        raise ValueError(
            "leave_one_out_mean: no sample left after leaving the response's own outcome out; the state needs "
            "at least one rollout or another response through it."
        )
    return total / count


def shrunk_variance(rewards: Sequence[float], prior_variance: float, prior_strength: float) -> float:
    """Variance of a state's reward, shrunk toward a prior (the parent state's):
    ``(n * v + a * prior) / (n + a)`` with ``v`` the plug-in variance of the ``n`` rewards and ``a`` the prior's
    weight in pseudo-samples. Never exactly zero while the prior is not, so a state whose few samples agree still
    gets a rollout when the budget allows."""
    n = len(rewards)
    if n == 0:
        return float(prior_variance)
    mean = math.fsum(rewards) / n
    plug_in = math.fsum((r - mean) ** 2 for r in rewards) / n
    return (n * plug_in + prior_strength * prior_variance) / (n + prior_strength)


def allocate_rollouts(
    weights: Sequence[float],
    variances: Sequence[float],
    counts: Sequence[int],
    costs: Sequence[float],
    budget: float,
) -> list[int]:
    """Extra rollouts per state that greedily minimise ``sum_s w_s var_s / n_s`` under a token budget.

    Each rollout goes to the state whose error falls most per token it costs,
    ``w_s var_s (1 / n_s - 1 / (n_s + 1)) / cost_s``, until the next best no longer fits the budget.

    Args:
        weights: how much each state's value error matters (e.g. advantage tokens it enters).
        variances: estimated variance of one sample of each state's value.
        counts: samples each state already has (free samples and the first wave); 0 means the first rollout
            is infinitely useful.
        costs: expected tokens of one rollout from each state (> 0).
        budget: rollout tokens to spend.

    Returns:
        Extra rollouts per state (ties go to the earlier state).
    """
    if not len(weights) == len(variances) == len(counts) == len(costs):
        raise ValueError(
            "allocate_rollouts: weights, variances, counts and costs must have one entry per state, got "
            f"{len(weights)}, {len(variances)}, {len(counts)} and {len(costs)}."
        )
    extra = [0] * len(weights)

    def gain(s: int) -> float:
        n = counts[s] + extra[s]
        worth = weights[s] * variances[s]
        if worth <= 0:
            return 0.0
        return math.inf if n == 0 else worth * (1 / n - 1 / (n + 1)) / costs[s]

    heap = [(-gain(s), s) for s in range(len(weights))]
    heapq.heapify(heap)
    left = float(budget)
    while heap:
        neg, s = heapq.heappop(heap)
        if -neg <= 0 or costs[s] > left:
            if -neg <= 0:
                break
            continue  # too expensive for what is left; cheaper states may still fit
        extra[s] += 1
        left -= costs[s]
        heapq.heappush(heap, (-gain(s), s))
    return extra


def first_wave_share(first_samples: int, num_rollouts: int) -> float:
    """The weight ``a = min(1, n_1 / K)`` of a state's first-wave mean in its value (:func:`two_wave_mean`).

    ``first_samples`` (``n_1``) counts the samples the value averages before the allocation: the other responses
    through the state and the first-wave rollouts through it. It must not depend on any outcome, which is why it
    is a share of the ``K`` samples the fixed scheme would average, not of how many the allocation later adds:
    the second-wave mean fills the ``K - n_1`` slots the first wave left, whatever it gets. 1 means the state
    needs no second wave.

    >>> first_wave_share(2, 8), first_wave_share(9, 8)
    (0.25, 1.0)
    """
    if num_rollouts < 1:
        raise ValueError(f"first_wave_share: num_rollouts={num_rollouts!r} must be >= 1.")
    return min(1.0, max(0, first_samples) / num_rollouts)


def two_wave_mean(first_mean: float, second_mean: float | None, share: float) -> float:
    """A state's value from its two waves: ``share * first_mean + (1 - share) * second_mean``.

    Unbiased when ``share`` was fixed before either wave was seen and the second wave's samples are fresh draws,
    however many the allocation gave it: unlike the pooled mean of both waves, the second wave's size never
    reweights the first wave's outcomes (see the module docstring).

    Raises:
        ValueError: when ``share < 1`` and there is no second-wave mean.
    """
    if share >= 1.0:
        return first_mean
    if second_mean is None:
        raise ValueError(
            f"two_wave_mean: the first wave covers only {share:.3g} of the state's value and it has no second-wave "
            "sample; every state with a share below 1 needs at least one second-wave rollout."
        )
    return share * first_mean + (1.0 - share) * second_mean
