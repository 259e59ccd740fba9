"""What one Monte Carlo estimate cost and saw: :class:`MCStats`, one typed record from a wave to the logged metrics.

Every wave of rollouts (:func:`~mcadvantage.mc.rollouts.run_wave`) returns an :class:`MCStats` of its own;
the estimator adds them up (:meth:`MCStats.add`) and fills in what the plan and the free-sample pool report, and
:attr:`~mcadvantage.mc.estimator.MCEstimate.stats` carries the record itself. Each field declares how the records of
parts of one batch's work combine (its ``reduce`` metadata: ``"sum"``, ``"max"`` or ``"concat"``): the waves of one
call are added by it, and the trainer reduces the logged metrics over processes by it
(:meth:`MCStats.metric_reductions`). The record reads as a mapping under the names ``MCEstimate.stats`` has always
had (``stats["rollouts"]``, ``dict(stats)``), and :meth:`MCStats.metrics` turns it into the training metrics only at
the edge, where an :class:`~mcadvantage.estimators.batch.AdvantageResult` is filled.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["MCStats", "Reduction"]

#: How the records of two parts of one batch's work combine, field by field: ``"sum"`` (counts, tokens, sequential
#: time), ``"max"`` (wall time of parts that run side by side) or ``"concat"`` (a list, in order).
Reduction = Literal["sum", "max", "concat"]


def _stat(reduce: Reduction, default: Any = 0) -> Any:
    """A field of :class:`MCStats` with its reduction."""
    return field(default=default, metadata={"reduce": reduce})


#: The record's names as read through the mapping (``MCEstimate.stats[name]``), in the order they are listed; the
#: options' statistics (None when the option is off) are left out when unset.
_STAT_NAMES = (
    "requests",
    "unsampled_states",
    "rollouts",
    "generated_tokens",
    "truncated_rollouts",
    "unscorable_rollouts",
    "sampling_seconds",
    "grading_seconds",
    "budget_tokens",
    "free_samples",
    "rollouts_saved",
    "tool_result_tokens",
    "tool_calls",
    "dropped_tool_results",
    "trajectories",
    "states",
    "unique_states",
    "dedup_ratio",
    "rollout_reward_mean",
    "seconds",
)

#: The fields logged as training metrics under their own names (:meth:`MCStats.metrics`); each reduces over
#: processes by its field's ``reduce``. The ratios :meth:`MCStats.metrics` adds are averaged (the trainer's default).
#: Logged always, then only where the option that sets them is on (None otherwise).
_ALWAYS_LOGGED = ("rollouts", "generated_tokens", "states", "seconds")
_LOGGED_WHEN_SET = (
    "free_samples",
    "rollouts_saved",
    "budget_tokens",
    "tool_result_tokens",
    "tool_calls",
    "dropped_tool_results",
)
_METRIC_FIELDS = _ALWAYS_LOGGED + _LOGGED_WHEN_SET


@dataclass
class MCStats(Mapping[str, float]):
    """What Monte Carlo estimation did, field by field: one wave's record or a whole
    :meth:`~mcadvantage.mc.estimator.MCValueEstimator.estimate` call's (:attr:`MCEstimate.stats`).

    Read it by attribute (``stats.rollouts``) or, as a read-only mapping of floats, by the names logged since 0.1
    (``stats["rollouts"]``, ``"free_samples" in stats``, ``dict(stats)`` for JSON): every field below except
    ``rollout_rewards``, plus :attr:`dedup_ratio` and :attr:`rollout_reward_mean`; the options' statistics only
    where the option is on.

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
        tool_result_tokens, tool_calls, dropped_tool_results: for agent episodes (continuations with a tool mask),
            the tool results' tokens the continuations appended (prefilled, not sampled: ``generated_tokens``
            counts the model's tokens only), the tool executions (the environments' rebuilds included) and the
            tool rounds whose results were dropped for the budget; None otherwise.
        trajectories: number of trajectories.
        states: non-terminal states over all trajectories, before dedup.
        unique_states: states left after dedup.
        rollout_rewards: the reward of every sampled continuation, in the order they were summed (per wave, those
            given ``truncated_reward`` first, then the graded ones); :attr:`rollout_reward_mean` is their mean.
        seconds: wall time of the call.
    """

    requests: int = _stat("sum")
    unsampled_states: int = _stat("sum")
    rollouts: int = _stat("sum")
    generated_tokens: int = _stat("sum")
    truncated_rollouts: int = _stat("sum")
    unscorable_rollouts: int = _stat("sum")
    sampling_seconds: float = _stat("sum", 0.0)
    grading_seconds: float = _stat("sum", 0.0)
    budget_tokens: float | None = _stat("sum", None)
    free_samples: float | None = _stat("sum", None)
    rollouts_saved: float | None = _stat("sum", None)
    tool_result_tokens: int | None = _stat("sum", None)
    tool_calls: int | None = _stat("sum", None)
    dropped_tool_results: int | None = _stat("sum", None)
    trajectories: int = _stat("sum")
    states: int = _stat("sum")
    unique_states: int = _stat("sum")
    rollout_rewards: list[float] = field(default_factory=list, metadata={"reduce": "concat"})
    seconds: float = _stat("max", 0.0)

    # -- combining parts ----------------------------------------------------------------------------------------

    def add(self, other: MCStats) -> None:
        """Add another part's record into this one, each field by its ``reduce`` (an unset option's statistic,
        None, leaves the other side's value)."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            how: Reduction = f.metadata["reduce"]
            if theirs is None:
                continue
            if how == "concat":
                mine.extend(theirs)
            elif mine is None:
                setattr(self, f.name, theirs)
            elif how == "sum":
                setattr(self, f.name, mine + theirs)
            else:
                setattr(self, f.name, max(mine, theirs))

    @classmethod
    def reduction(cls, name: str) -> Reduction:
        """How field ``name`` combines over parts (its ``reduce`` metadata)."""
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.metadata["reduce"]
        raise KeyError(
            f"MCStats has no field {name!r}; its fields are {[f.name for f in dataclasses.fields(cls)]}."
        )

    # -- derived statistics -------------------------------------------------------------------------------------

    @property
    def dedup_ratio(self) -> float:
        """``1 - unique_states / states``: the fraction of states (hence of rollouts) saved by dedup (0 when there
        is no state)."""
        return (1.0 - self.unique_states / self.states) if self.states else 0.0

    @property
    def rollout_reward_sum(self) -> float:
        """Sum of the sampled continuations' rewards, added one by one in their order (not ``math.fsum``: the
        logged mean has always been this running sum)."""
        total = 0.0
        for reward in self.rollout_rewards:
            total += reward
        return total

    @property
    def rollout_reward_count(self) -> int:
        """Number of sampled continuations with a reward."""
        return len(self.rollout_rewards)

    @property
    def rollout_reward_mean(self) -> float:
        """Mean reward of the graded rollouts (NaN if none)."""
        return self.rollout_reward_sum / self.rollout_reward_count if self.rollout_reward_count else math.nan

    # -- the mapping view (MCEstimate.stats["rollouts"]) ---------------------------------------------------------

    def __getitem__(self, name: str) -> float:
        value = getattr(self, name) if name in _STAT_NAMES else None
        if value is None:
            raise KeyError(name)
        return float(value)

    def __iter__(self) -> Iterator[str]:
        return (name for name in _STAT_NAMES if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def as_dict(self) -> dict[str, float]:
        """The mapping view as a plain dict (``dict(stats)``): every statistic as a float, under the names the
        recorded benchmark logs use; the options' statistics only where the option is on."""
        return dict(self)

    # -- the edge: training metrics -------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """The training metrics of this record (logged as ``mc/<name>``): ``rollouts``, ``generated_tokens``,
        ``states``, ``seconds``, ``dedup_ratio``, ``truncated_rollout_ratio`` (truncated / sampled rollouts, 0
        without rollouts) and the options' ``free_samples``, ``rollouts_saved``, ``budget_tokens`` where set."""
        out = {name: float(getattr(self, name)) for name in _ALWAYS_LOGGED}
        out["dedup_ratio"] = self.dedup_ratio
        out["truncated_rollout_ratio"] = self.truncated_rollouts / self.rollouts if self.rollouts else 0.0
        for name in _LOGGED_WHEN_SET:
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value)
        return out

    @classmethod
    def metric_reductions(cls) -> dict[str, Literal["sum", "max"]]:
        """How the trainer reduces :meth:`metrics` over processes: each field-backed metric by its field's
        ``reduce`` (the ratios are averaged, the trainer's default)."""
        out: dict[str, Literal["sum", "max"]] = {}
        for name in _METRIC_FIELDS:
            how = cls.reduction(name)
            if (
                how == "concat"
            ):  # a list is no metric; only a field added to _METRIC_FIELDS by mistake gets here
                raise TypeError(f"MCStats.{name} reduces by 'concat'; it cannot be a logged metric.")
            out[name] = how
        return out
