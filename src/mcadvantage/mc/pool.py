"""Free samples (``reuse_samples``, ``allocation="variance"``): every response and rollout through a state is a
draw of its value, pooled leave-one-out.

:class:`SamplePool` matches every path (a response or a rollout) to the states it passes through with a token trie
per grading group, and keeps per state the samples' reward sum, count and lengths. The estimator runs the waves
and these steps decide them: :func:`first_wave_counts` tops every state up, :func:`first_wave_shares` fixes each
state's first-wave share, :func:`second_wave_counts` (``allocation="variance"``) spends the rest of the token budget
where :func:`~mcadvantage.mc.budget.allocate_rollouts` says, and :func:`leave_one_out_values` gives each trajectory
its values: a response's own outcome never enters the values of its own states. Why that, and the two-wave mix,
are exactly unbiased: :mod:`mcadvantage.mc.budget`. Written by hand: no library pools Monte Carlo samples across
states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mcadvantage.mc.budget import (
    allocate_rollouts,
    first_wave_share,
    leave_one_out_mean,
    shrunk_variance,
    two_wave_mean,
)
from mcadvantage.mc.planning import StatePlan, grading_key
from mcadvantage.mc.trajectory import Trajectory

__all__ = [
    "VARIANCE_PRIOR_STRENGTH",
    "SamplePool",
    "advantage_weights",
    "first_wave_counts",
    "first_wave_shares",
    "leave_one_out_values",
    "samples_used",
    "second_wave_counts",
]


#: Pseudo-samples of the parent state's variance in a state's variance estimate (``allocation="variance"``).
VARIANCE_PRIOR_STRENGTH = 2.0


def advantage_weights(plan: StatePlan) -> list[float]:
    """Per unique state, the advantage tokens its value enters: the steps before and after it, summed over the
    trajectories that pass through it."""
    weights = [0.0] * len(plan.unique)
    for b, states in zip(plan.boundaries, plan.state_index, strict=True):
        for i, u in enumerate(states):
            weights[u] += (b[i] - b[i - 1] if i else 0) + (b[i + 1] - b[i])
    return weights


class SamplePool:
    """The samples of every unique state's value: each path (a response or a rollout, as completion ids with its
    reward) counts for every state whose prefix it starts with and goes beyond."""

    def __init__(self, trajectories: Sequence[Trajectory], plan: StatePlan) -> None:
        # Per grading group (prompt ids, grading context), a token trie of the states' completion prefixes; the
        # key None of a node holds the state ending there. A path walks it token by token and stops where it
        # leaves every state prefix, so matching costs O(path length), not O(states x length).
        self.tries: dict[tuple[tuple[int, ...], str], dict[Any, Any]] = {}
        for u, (t, prefix_len) in enumerate(plan.unique):
            traj = trajectories[t]
            node = self.tries.setdefault((tuple(traj.prompt_ids), grading_key(traj)), {})
            for token in traj.completion_ids[:prefix_len]:
                node = node.setdefault(token, {})
            node[None] = u
        self.plan = plan
        size = len(plan.unique)
        self.total = [0.0] * size
        self.count = [0] * size
        self.remaining = [0.0] * size
        # Every sample's outcome, for the allocation's variance estimates. The allocation may look at the responses'
        # outcomes too: it only sets the size of the second wave, which is averaged apart (see
        # mcadvantage.mc.budget.two_wave_mean).
        self.rewards: list[list[float]] = [[] for _ in range(size)]

    def empty_like(self) -> SamplePool:
        """A pool over the same states with no sample in it (the second wave's)."""
        other = object.__new__(SamplePool)
        other.tries, other.plan = self.tries, self.plan
        size = len(self.plan.unique)
        other.total, other.count, other.remaining = [0.0] * size, [0] * size, [0.0] * size
        other.rewards = [[] for _ in range(size)]
        return other

    def _add(self, u: int, reward: float, remaining: int) -> None:
        self.total[u] += reward
        self.count[u] += 1
        self.remaining[u] += remaining
        self.rewards[u].append(reward)

    def add_path(
        self,
        traj: Trajectory,
        completion_ids: Sequence[int],
        reward: float,
        start: int = 0,
    ) -> None:
        """Count a path for every state it passes through at or after ``start``, the token where its sampling
        began (0 for a response). A rollout from a deeper state is not a draw of a shallower state's value: it
        was made to follow that deeper prefix."""
        node = self.tries.get((tuple(traj.prompt_ids), grading_key(traj)))
        ids = list(completion_ids)
        depth = 0
        while node is not None and depth < len(ids):  # a state counts only paths that go beyond it
            u = node.get(None)
            if u is not None and depth >= start:
                self._add(u, reward, len(ids) - depth)
            node = node.get(ids[depth])
            depth += 1

    def add_responses(self, responses: Sequence[Trajectory]) -> None:
        """Count every response (masked ones too: which responses are masked may depend on their outcomes) for the
        states it passes through."""
        for traj in responses:
            self.add_path(traj, traj.completion_ids, float(traj.reward))

    def add_wave(self, trajectories: Sequence[Trajectory], wave: list[list[tuple[list[int], float]]]) -> None:
        """Count a wave's samples (per unique state, ``(completion ids, reward)``) for every state they pass
        through."""
        for u, samples in enumerate(wave):
            t, prefix_len = self.plan.unique[u]
            for ids, reward in samples:
                if len(ids) <= prefix_len:  # an unsampled state's own prefix, graded directly
                    self._add(u, reward, 0)
                else:  # a rollout is a sample of its own state and of every deeper state it passes through
                    self.add_path(trajectories[t], ids, reward, start=prefix_len)

    @property
    def others(self) -> list[int]:
        """Per state, its samples besides one response's own outcome (every state lies on at least one of the
        batch's responses): what a leave-one-out value averages."""
        return [max(0, n - 1) for n in self.count]

    def mean_remaining(self, u: int) -> float:
        """Expected tokens of one rollout from state ``u``: the mean length its samples had beyond it."""
        return max(1.0, self.remaining[u] / self.count[u]) if self.count[u] else 1.0

    def variances(self, parent: Sequence[int | None], strength: float) -> list[float]:
        """Each state's reward variance from its samples, shrunk toward its parent's (the root toward the
        variance of every sample of the pool)."""
        everything = [r for rs in self.rewards for r in rs]
        root = shrunk_variance(everything, 0.0, 0.0) if everything else 0.25
        out: list[float] = []
        for u, rewards in enumerate(self.rewards):  # a parent is always listed before its children
            prior = root if parent[u] is None else out[parent[u]]  # type: ignore[index]
            out.append(shrunk_variance(rewards, prior, strength))
        return out


def first_wave_counts(pool: SamplePool, sampled: Sequence[bool], target: int) -> list[int]:
    """First-wave rollouts per state: what tops each sampled state up to ``target`` samples besides one response's
    own outcome (``num_rollouts`` with free samples alone, ``min_rollouts`` under ``allocation="variance"``)."""
    return [max(0, target - f) if ok else 0 for f, ok in zip(pool.others, sampled, strict=True)]


def first_wave_shares(pool: SamplePool, sampled: Sequence[bool], num_rollouts: int) -> list[float]:
    """Per state, the share of its first-wave mean in its value (:func:`~mcadvantage.mc.budget.first_wave_share`),
    from its first-wave samples besides the response's own: counted by prefixes, never by outcomes. 1 for an
    unsampled state."""
    return [
        first_wave_share(n, num_rollouts) if ok else 1.0 for n, ok in zip(pool.others, sampled, strict=True)
    ]


def second_wave_counts(
    pool: SamplePool,
    plan: StatePlan,
    sampled: Sequence[bool],
    shares: Sequence[float],
    num_rollouts: int,
    generated_tokens: float,
) -> tuple[list[int], float]:
    """``allocation="variance"``: second-wave rollouts per state and the batch's rollout token budget (the tokens
    ``num_rollouts`` rollouts per sampled state would cost). Every state whose value has a second-wave part
    (share below 1) gets one; the budget left after the first wave's ``generated_tokens`` and those goes where
    :func:`~mcadvantage.mc.budget.allocate_rollouts` says.

    The value's variance is ``a^2 var / n_1 + (1 - a)^2 var / n_2``: a second-wave rollout is worth ``(1 - a)^2`` of
    an advantage token's error, and nothing at a state with ``a = 1``.
    """
    need = [1 if a < 1.0 else 0 for a in shares]
    costs = [pool.mean_remaining(u) for u in range(len(plan.unique))]
    token_budget = num_rollouts * math.fsum(c for c, ok in zip(costs, sampled, strict=True) if ok)
    extra = allocate_rollouts(
        weights=[w * (1.0 - a) ** 2 for w, a in zip(advantage_weights(plan), shares, strict=True)],
        variances=pool.variances(plan.parent, VARIANCE_PRIOR_STRENGTH),
        counts=need,
        costs=costs,
        budget=max(
            0.0,
            token_budget - generated_tokens - math.fsum(c for c, n in zip(costs, need, strict=True) if n),
        ),
    )
    return [a + b for a, b in zip(need, extra, strict=True)], token_budget


def samples_used(first: SamplePool, second: SamplePool | None, shares: Sequence[float]) -> list[int]:
    """Per state, the samples behind its values besides the response's own: the first wave's, plus the second
    wave's where its value has a second-wave part."""
    return [
        n + (second.count[u] if second is not None and shares[u] < 1.0 else 0)
        for u, n in enumerate(first.others)
    ]


def leave_one_out_values(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    first: SamplePool,
    second: SamplePool | None,
    shares: Sequence[float],
) -> list[list[float]]:
    """Per trajectory, the values of its states ``S_0..S_{m-1}``: the leave-one-out mean of each state's first-wave
    pool without the trajectory's own outcome, mixed with the second wave's mean by the fixed share when there is a
    second wave (:func:`~mcadvantage.mc.budget.two_wave_mean`)."""
    values: list[list[float]] = []
    for t, states in enumerate(plan.state_index):
        own = float(trajectories[t].reward)
        row = []
        for u in states:
            first_mean = leave_one_out_mean(first.total[u], first.count[u], own)
            if second is not None:
                second_mean = second.total[u] / second.count[u] if second.count[u] else None
                first_mean = two_wave_mean(first_mean, second_mean, shares[u])
            row.append(first_mean)
        values.append(row)
    return values
