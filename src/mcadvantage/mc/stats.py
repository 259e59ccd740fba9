"""What one Monte Carlo estimate cost and saw: :class:`MCStats`, the typed record behind ``MCEstimate.stats``.

Each wave of rollouts returns its :class:`~mcadvantage.mc.rollouts.WaveCounts`; the estimator adds them up here
with what the plan and the free-sample pool report, and :meth:`MCStats.as_dict` gives the statistics under the
names the metrics and the recorded benchmark logs use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mcadvantage.mc.rollouts import WaveCounts

__all__ = ["MCStats"]


@dataclass
class MCStats:
    """What one :meth:`MCValueEstimator.estimate` call did, field by field (the keys of :attr:`MCEstimate.stats`).

    Attributes:
        requests: rollout requests sent to the sampler (unique states with budget left).
        unsampled_states: unique states with no token budget left, graded directly.
        rollouts: continuations sampled.
        generated_tokens: tokens in all continuations.
        truncated_rollouts: continuations that hit their budget before EOS.
        unscorable_rollouts: rollouts for which every reward function returned None.
        sampling_seconds, grading_seconds: wall time of the sampler calls and of the reward calls.
        budget_tokens: with ``allocation="variance"``, the rollout tokens allowed (None otherwise).
        free_samples: with free samples pooled (``reuse_samples`` or ``allocation="variance"``), samples of a
            state's value that were not drawn for it, summed over unique states (None otherwise).
        rollouts_saved: with free samples pooled, ``num_rollouts`` per sampled state minus the rollouts drawn.
        trajectories: number of trajectories.
        states: non-terminal states over all trajectories, before dedup.
        unique_states: states left after dedup.
        rollout_reward_sum, rollout_reward_count: running sum and count of the sampled continuations' rewards.
        seconds: wall time of the call.
    """

    requests: int = 0
    unsampled_states: int = 0
    rollouts: int = 0
    generated_tokens: int = 0
    truncated_rollouts: int = 0
    unscorable_rollouts: int = 0
    sampling_seconds: float = 0.0
    grading_seconds: float = 0.0
    budget_tokens: float | None = None
    free_samples: float | None = None
    rollouts_saved: float | None = None
    trajectories: int = 0
    states: int = 0
    unique_states: int = 0
    rollout_reward_sum: float = 0.0
    rollout_reward_count: int = 0
    seconds: float = 0.0

    def add(self, wave: WaveCounts) -> None:
        """Add one wave's counts (rewards summed one by one, in the wave's order)."""
        self.requests += wave.requests
        self.unsampled_states += wave.unsampled_states
        self.rollouts += wave.rollouts
        self.generated_tokens += wave.generated_tokens
        self.truncated_rollouts += wave.truncated_rollouts
        self.unscorable_rollouts += wave.unscorable_rollouts
        self.sampling_seconds += wave.sampling_seconds
        self.grading_seconds += wave.grading_seconds
        for reward in wave.rollout_rewards:
            self.rollout_reward_sum += reward
            self.rollout_reward_count += 1

    @property
    def dedup_ratio(self) -> float:
        """``1 - unique_states / states``: the fraction of states (hence of rollouts) saved by dedup (0 when there
        is no state)."""
        return (1.0 - self.unique_states / self.states) if self.states else 0.0

    @property
    def rollout_reward_mean(self) -> float:
        """Mean reward of the graded rollouts (NaN if none)."""
        return self.rollout_reward_sum / self.rollout_reward_count if self.rollout_reward_count else math.nan

    def as_dict(self) -> dict[str, float]:
        """The statistics as logged (:attr:`MCEstimate.stats`): every count as a float, under the names the
        metrics and the recorded benchmark logs use; the options' statistics only where the option is on."""
        out = {
            "requests": float(self.requests),
            "unsampled_states": float(self.unsampled_states),
            "rollouts": float(self.rollouts),
            "generated_tokens": float(self.generated_tokens),
            "truncated_rollouts": float(self.truncated_rollouts),
            "unscorable_rollouts": float(self.unscorable_rollouts),
            "sampling_seconds": self.sampling_seconds,
            "grading_seconds": self.grading_seconds,
        }
        for key in ("budget_tokens", "free_samples", "rollouts_saved"):
            value = getattr(self, key)
            if value is not None:
                out[key] = float(value)
        out.update(
            trajectories=float(self.trajectories),
            states=float(self.states),
            unique_states=float(self.unique_states),
            dedup_ratio=self.dedup_ratio,
            rollout_reward_mean=self.rollout_reward_mean,
            seconds=self.seconds,
        )
        return out
