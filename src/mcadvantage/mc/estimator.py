"""Monte Carlo value estimation (VinePPO): values of step-boundary prefixes and per-token advantages.

For each response ``y`` to a prompt ``x`` with step boundaries ``0 = b_0 < ... < b_n = len(y)`` and
reward ``R``, the value of the state before step ``i``, ``S_i = x + y[:b_i]``, is the mean reward of
``K`` continuations sampled from ``S_i`` by the current policy (arXiv 2410.01679, section 3). The
terminal state is never sampled: ``V(S_n) = R``. Step ``i`` gets ``A_i = V(S_i) - V(S_{i-1})``.

How a call to :meth:`MCValueEstimator.estimate` runs (each stage a small pure helper):

1. :func:`~mcadvantage.mc.planning.plan_states` lists the states of every trajectory and deduplicates
   them: states with the same prompt tokens, completion-prefix tokens and grading context (prompt and row
   fields) are estimated once, so the prompt state is sampled once per prompt, not once per response.
2. :func:`~mcadvantage.mc.rollouts.build_requests` turns every unique state with budget left into one
   :class:`~mcadvantage.samplers.RolloutRequest` of ``K`` samples; all go to the sampler in ONE
   ``sampler.sample(requests)`` call, so the engine can batch everything.
3. All rollouts are graded by the reward functions in one call per function (TRL signature,
   :func:`~mcadvantage.mc.rollouts.run_wave`), on the full response text
   ``decode(prefix ids + continuation ids)``. One :class:`WaveRunner` runs every wave of a call: the uniform
   pass, or the two waves of ``allocation="variance"``.
4. A value scheme gives each state its value: :func:`fresh_rollout_values` (the paper's mean of ``K`` fresh
   rollouts) or, with free samples, :func:`pooled_values` (leave-one-out pooling, :mod:`~mcadvantage.mc.pool`, with
   :func:`variance_second_wave` under ``allocation="variance"``); :func:`credit` turns the values into advantages
   (:func:`~mcadvantage.core.advantages.step_advantages`, :func:`~mcadvantage.core.advantages.token_advantages`).

The stages live in their own modules, below this one: :mod:`~mcadvantage.mc.trajectory` (the input),
:mod:`~mcadvantage.mc.planning`, :mod:`~mcadvantage.mc.rollouts`, :mod:`~mcadvantage.mc.pool` and
:mod:`~mcadvantage.mc.budget`. Each takes and returns data; :class:`MCValueEstimator` calls them in order (it
is the only caller: no stage calls back into it) and adds up what they cost in one
:class:`~mcadvantage.mc.stats.MCStats` record, which :attr:`MCEstimate.stats` carries as it is. The settings come
whole, as one :class:`~mcadvantage.core.settings.MCSettings`.

Reproducibility: this module adds no randomness; the estimate is a deterministic function of the
sampler's output (requests are issued in first-occurrence order). Seed the engine (e.g.
``torch.manual_seed`` for :class:`~mcadvantage.samplers.TransformersSampler`, ``LLM(seed=...)`` for
vLLM) to reproduce an estimate.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mcadvantage._moved import warn_old_spelling
from mcadvantage.core.advantages import check_boundaries, step_advantages, token_advantages
from mcadvantage.core.settings import MCSettings, refuse_setting_assignment, setting_attribute
from mcadvantage.mc.planning import plan_states as _plan_states
from mcadvantage.mc.pool import (
    SamplePool,
    first_wave_counts,
    first_wave_shares,
    leave_one_out_values,
    samples_used,
    second_wave_counts,
)
from mcadvantage.mc.rollouts import (
    RewardFunc,
    RolloutIO,
    rollout_token_budget,
    run_wave,
)
from mcadvantage.mc.rollouts import (
    average_values as _average_values,
)
from mcadvantage.mc.stats import MCStats
from mcadvantage.mc.trajectory import Trajectory
from mcadvantage.samplers.base import Sampler

__all__ = [
    "Trajectory",
    "MCEstimate",
    "MCSettings",
    "MCStats",
    "MCValueEstimator",
    "WaveRunner",
    "credit",
    "fresh_rollout_values",
    "pooled_values",
    "variance_second_wave",
]

if TYPE_CHECKING:
    from mcadvantage.mc.planning import StatePlan

#: Names whose 0.1 home was this module, and the stage module that defines them: still importable from here, with a
#: FutureWarning.
_STAGE_NAMES = {
    "StatePlan": "mcadvantage.mc.planning",
    "plan_states": "mcadvantage.mc.planning",
    "estimated_boundaries": "mcadvantage.mc.planning",
    "build_requests": "mcadvantage.mc.rollouts",
    "average_values": "mcadvantage.mc.rollouts",
}


def __getattr__(name: str) -> Any:
    home = _STAGE_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_old_spelling(f"mcadvantage.mc.estimator.{name}", f"{home}.{name}")
    return getattr(importlib.import_module(home), name)


@dataclass
class MCEstimate:
    """Output of :meth:`MCValueEstimator.estimate` for a batch of trajectories.

    With ``max_estimated_steps = m`` and a response of ``n > m`` steps, ``values`` and
    ``step_advantages`` describe the merged steps (``m + 1`` values, ``m`` advantages).

    Attributes:
        values: per trajectory, ``[V(S_0), ..., V(S_{n-1}), R]`` (length ``n + 1``).
        step_advantages: per trajectory, ``[A_1, ..., A_n]`` with ``A_i = V(S_i) - V(S_{i-1})``.
        token_advantages: per trajectory, a float tensor of length ``len(completion_ids)``
            (not whitened).
        stats: what the call cost and saw, one typed :class:`~mcadvantage.mc.stats.MCStats` (each field described
            there), read by attribute or, as a mapping of floats, under these names (``stats["rollouts"]``;
            ``dict(stats)`` for JSON):

            - ``trajectories``, ``states``, ``unique_states``, ``dedup_ratio`` (``1 - unique_states / states``);
            - ``requests``, ``unsampled_states``, ``rollouts`` (``requests * num_rollouts``),
              ``generated_tokens``, ``truncated_rollouts``, ``unscorable_rollouts``, ``rollout_reward_mean``
              (NaN if none);
            - ``seconds``, ``sampling_seconds``, ``grading_seconds``: wall time of the call, of the sampler calls
              and of the reward calls;
            - with ``reuse_samples`` or ``allocation="variance"``: ``free_samples`` and ``rollouts_saved``; with
              ``allocation="variance"`` also ``budget_tokens`` (the rollout tokens allowed).

            None on the processes that sampled nothing when only the main process samples (a vLLM server): the
            main process's part carries the whole batch's record.
        sample_counts: per trajectory, the number of samples behind each of its state values (leave-one-out with
            ``reuse_samples``: the response's own outcome is not counted).
    """

    values: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[torch.Tensor]
    stats: MCStats | None
    sample_counts: list[list[int]] = field(default_factory=list)


def credit(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    state_values: Sequence[Sequence[float]],
    zero_after_cap: bool,
) -> tuple[list[list[float]], list[list[float]], list[torch.Tensor]]:
    """The algorithm, once the states have values: per trajectory ``[V(S_0), ..., V(S_{n-1}), R]``, the step
    advantages ``A_i = V(S_i) - V(S_{i-1})`` (with ``zero_after_cap``, the merged tail of a capped response gets
    0, as in the official code; the steps before a trajectory's ``first_state`` get 0 and those states' values are
    NaN) and every token of step ``i`` carrying ``A_i``.

    Args:
        state_values: per trajectory, the values of its estimated states ``S_first..S_{m-1}``.
    Returns:
        ``(values, step advantages, token advantages)`` per trajectory.
    """
    values: list[list[float]] = []
    step_advs: list[list[float]] = []
    token_advs: list[torch.Tensor] = []
    for t, traj in enumerate(trajectories):
        first = plan.first_state[t] if plan.first_state else 0
        v = [math.nan] * first + list(state_values[t]) + [float(traj.reward)]  # unestimated states: NaN
        a = step_advantages(v)
        a[:first] = [0.0] * first  # the steps before the first estimated state get no credit
        if plan.capped[t] and zero_after_cap:
            a[-1] = 0.0  # the merged tail (steps m..n) gets no credit, as in the official code
        values.append(v)
        step_advs.append(a)
        token_advs.append(token_advantages(a, plan.boundaries[t], len(traj.completion_ids)))
    return values, step_advs, token_advs


class MCValueEstimator:
    """Monte Carlo value estimator for step-level advantages (VinePPO).

    Args:
        sampler: draws continuations from the current policy with the training sampling settings
            (see :mod:`mcadvantage.samplers`).
        reward_funcs: one callable or a list, TRL-style:
            ``f(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list[float|None]``.
            Completions are strings, or ``[{"role": "assistant", "content": text}]`` when the
            trajectory's ``prompt`` is a message list.
        tokenizer: decodes ``prefix ids + continuation ids`` (``skip_special_tokens=True``) into the
            response text that is graded.
        settings: the Monte Carlo settings, whole (:class:`~mcadvantage.core.settings.MCSettings`; default: its
            defaults, K = 9 as in the paper).
        reward_weights: weights of the reward functions (default all 1); rewards are combined as a
            weighted sum that skips None/NaN, like TRL's ``nansum``.
        max_completion_length: the training responses' token budget; required by
            ``rollout_budget="remaining"``, unused by ``"fixed"``.
        context_length: the policy's context (prompt + completion); every continuation's budget is
            capped so it fits (the official code's ``min(1024, context - prefix)``). None: no cap.
        show_progress: show a tqdm progress bar over the call's phases (sampling, grading).
        **setting_values: single settings by name (``num_rollouts=4``, ``reuse_samples=True``, ...: every
            :class:`~mcadvantage.core.settings.MCSettings` field), applied over ``settings``.

    The settings are read as ``estimator.settings``; ``estimator.num_rollouts`` and the other setting names still
    read them, and setting one of them on the estimator is refused (replace ``estimator.settings`` instead).
    """

    def __init__(
        self,
        sampler: Sampler,
        reward_funcs: RewardFunc | Sequence[RewardFunc],
        tokenizer: Any,
        *,
        settings: MCSettings | None = None,
        reward_weights: Sequence[float] | None = None,
        max_completion_length: int | None = None,
        context_length: int | None = None,
        show_progress: bool = False,
        **setting_values: Any,
    ) -> None:
        if not callable(getattr(sampler, "sample", None)):
            raise TypeError(
                f"sampler={sampler!r} has no sample(requests) method; pass a mcadvantage Sampler "
                "(TransformersSampler, VLLMSampler, VLLMServerSampler or your own)."
            )
        funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
        if not funcs:
            raise ValueError("reward_funcs is empty; pass at least one reward function.")
        for f in funcs:
            if not callable(f):
                raise TypeError(
                    f"reward_funcs contains {f!r}, which is not callable; pass functions "
                    "f(prompts=, completions=, completion_ids=, **columns) -> list[float]."
                )
        if reward_weights is None:
            weights = [1.0] * len(funcs)
        else:
            weights = [float(w) for w in reward_weights]
            if len(weights) != len(funcs):
                raise ValueError(
                    f"reward_weights has {len(weights)} entries but there are {len(funcs)} reward "
                    "functions; pass one weight per function (or None for all 1)."
                )
        settings = (settings if settings is not None else MCSettings()).replace(**setting_values)
        settings.check_completion_room(max_completion_length)
        if context_length is not None and context_length < 2:
            raise ValueError(f"context_length={context_length!r} must be >= 2 (prompt + one token) or None.")

        self.settings = settings
        self.sampler = sampler
        self.reward_funcs = funcs
        self.reward_weights = weights
        self.tokenizer = tokenizer
        self.max_completion_length = max_completion_length
        self.context_length = context_length
        self.show_progress = show_progress

    def __getattr__(self, name: str) -> Any:
        return setting_attribute(self, name)  # estimator.num_rollouts etc.: the settings' values

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_setting_assignment(self, name)  # a setting set on the estimator would be silently ignored
        object.__setattr__(self, name, value)

    # -- budgets ---------------------------------------------------------------------------------

    def budget(self, prefix_len: int, prompt_len: int | None = None) -> int:
        """Max new tokens for a continuation from a state with ``prefix_len`` completion tokens (after a
        ``prompt_len``-token prompt), capped so prompt + prefix + continuation fit in ``context_length``
        (:func:`~mcadvantage.mc.rollouts.rollout_token_budget`)."""
        return rollout_token_budget(
            self.settings,
            prefix_len,
            prompt_len,
            max_completion_length=self.max_completion_length,
            context_length=self.context_length,
        )

    # -- validation ------------------------------------------------------------------------------

    @staticmethod
    def _validate(trajectories: Sequence[Trajectory]) -> None:
        for t, traj in enumerate(trajectories):
            if len(traj.prompt_ids) == 0:
                raise ValueError(
                    f"trajectories[{t}].prompt_ids is empty; the prompt state needs at least one token "
                    "(e.g. a BOS token)."
                )
            check_boundaries(
                traj.step_boundaries, len(traj.completion_ids), name=f"trajectories[{t}].step_boundaries"
            )
            try:
                r = float(traj.reward)
            except (TypeError, ValueError):
                raise ValueError(
                    f"trajectories[{t}].reward={traj.reward!r} is not a number; pass the response's reward."
                ) from None
            if not math.isfinite(r):
                raise ValueError(
                    f"trajectories[{t}].reward={traj.reward!r} is not finite; the terminal value V(S_n) = R "
                    "must be a number (map unscorable responses to a reward before estimating)."
                )

    # -- the estimate ----------------------------------------------------------------------------

    def estimate(
        self,
        trajectories: Sequence[Trajectory],
        *,
        reward_kwargs: Mapping[str, Any] | None = None,
        extra_responses: Sequence[Trajectory] = (),
    ) -> MCEstimate:
        """Estimate the values of every trajectory's step states and the resulting advantages.

        Args:
            trajectories: the batch of responses (all responses of a training step, so identical
                states are shared and the engine gets one large batch).
            reward_kwargs: extra keyword arguments passed to every reward function call (e.g.
                TRL's ``trainer_state``).
            extra_responses: with ``reuse_samples`` or ``allocation="variance"``, more responses of the same batch
                whose outcomes are free samples for the states they pass through but which get no values
                themselves (e.g. responses the trainer masks out: leaving them out of the pool would select the
                pool by outcome).

        Returns:
            An :class:`MCEstimate`.
        """
        start = time.perf_counter()
        s = self.settings
        trajectories, extra = list(trajectories), list(extra_responses)
        self._validate(trajectories)
        if extra:
            self._validate(extra)
        plan = _plan_states(trajectories, s)
        budgets = [self.budget(prefix_len, len(trajectories[t].prompt_ids)) for t, prefix_len in plan.unique]
        stats = MCStats(
            trajectories=len(trajectories), states=plan.num_states, unique_states=len(plan.unique)
        )
        with self._rollout_io(sum(b >= 1 for b in budgets), reward_kwargs) as io:
            waves = WaveRunner(trajectories, plan, budgets, io, stats)
            if s.pools_free_samples:
                state_values, state_counts = pooled_values(waves, extra, s)
            else:
                state_values, state_counts = fresh_rollout_values(waves, s.num_rollouts)

        values, step_advs, token_advs = credit(trajectories, plan, state_values, s.steps_after_cap == "zero")
        stats.seconds = time.perf_counter() - start
        return MCEstimate(
            values=values,
            step_advantages=step_advs,
            token_advantages=token_advs,
            stats=stats,
            sample_counts=[[state_counts[u] for u in states] for states in plan.state_index],
        )

    @contextmanager
    def _rollout_io(
        self, sampled_states: int, reward_kwargs: Mapping[str, Any] | None
    ) -> Iterator[RolloutIO]:
        """What one call's waves sample with and grade by; with ``show_progress``, with a tqdm bar over the call's
        phases (each wave's sampling, then each reward function), closed however the call ends."""
        progress = None
        if self.show_progress:
            from tqdm.auto import tqdm

            waves = 2 if self.settings.allocation == "variance" else 1
            progress = tqdm(
                total=waves * (1 + len(self.reward_funcs)),
                desc=f"MC values ({sampled_states} states x {self.settings.num_rollouts})",
                unit="phase",
            )
        try:
            yield RolloutIO(
                self.sampler,
                self.tokenizer,
                self.reward_funcs,
                self.reward_weights,
                truncated_reward=self.settings.truncated_reward,
                reward_kwargs=dict(reward_kwargs or {}),
                progress=progress,
            )
        finally:
            if progress is not None:
                progress.close()


# -- the waves and the value schemes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WaveRunner:
    """Runs the waves of one :meth:`MCValueEstimator.estimate` call: the batch, its plan and per-state token
    budgets, what samples and grades (:class:`~mcadvantage.mc.rollouts.RolloutIO`), and the call's
    :class:`~mcadvantage.mc.stats.MCStats`, to which every wave adds what it cost."""

    trajectories: list[Trajectory]
    plan: StatePlan
    budgets: list[int]
    io: RolloutIO
    stats: MCStats

    @property
    def sampled(self) -> list[bool]:
        """Per unique state, whether it has budget left to be sampled from."""
        return [b >= 1 for b in self.budgets]

    def run(
        self, counts: Sequence[int], *, grade_unsampled: bool = True
    ) -> list[list[tuple[list[int], float]]]:
        """Sample and grade one wave of ``counts[u]`` rollouts per unique state
        (:func:`~mcadvantage.mc.rollouts.run_wave`), add its cost to :attr:`stats` and return its samples
        per state as ``(completion ids, reward)``."""
        wave = run_wave(
            self.trajectories, self.plan, counts, self.budgets, self.io, grade_unsampled=grade_unsampled
        )
        self.stats.add(wave.counts)
        return wave.samples


def fresh_rollout_values(waves: WaveRunner, num_rollouts: int) -> tuple[list[list[float]], list[int]]:
    """The paper's scheme: ``num_rollouts`` fresh rollouts per sampled state, nothing shared between states; a
    state's value is their mean (:func:`~mcadvantage.mc.rollouts.average_values`).

    Returns:
        ``(values, counts)``: per trajectory, the values of its estimated states; per unique state, the samples
        behind its value.
    """
    samples = waves.run([num_rollouts if ok else 0 for ok in waves.sampled])
    per_state = _average_values([[r for _, r in state] for state in samples])
    values = [[per_state[u] for u in states] for states in waves.plan.state_index]
    return values, [len(state) for state in samples]


def pooled_values(
    waves: WaveRunner, extra: Sequence[Trajectory], settings: MCSettings
) -> tuple[list[list[float]], list[int]]:
    """Free samples (``reuse_samples`` or ``allocation="variance"``): every response (``extra`` ones too) and
    rollout through a state is a draw of its value, pooled leave-one-out (:mod:`~mcadvantage.mc.pool`). The first
    wave tops every sampled state up to ``num_rollouts`` samples (``min_rollouts`` under variance allocation, whose
    second wave then comes from :func:`variance_second_wave`). Sets the stats' ``free_samples`` and
    ``rollouts_saved``.

    Returns:
        ``(values, counts)``, as :func:`fresh_rollout_values`.
    """
    s, stats = settings, waves.stats
    pool = SamplePool(waves.trajectories, waves.plan)
    pool.add_responses([*waves.trajectories, *extra])
    own_rollouts = first_wave_counts(
        pool, waves.sampled, s.num_rollouts if s.allocation == "uniform" else s.min_rollouts
    )
    pool.add_wave(waves.trajectories, waves.run(own_rollouts))
    shares = first_wave_shares(pool, waves.sampled, s.num_rollouts)
    second_pool: SamplePool | None = None
    if s.allocation == "variance":
        second_pool, second = variance_second_wave(waves, pool, shares, s.num_rollouts)
        own_rollouts = [a + b for a, b in zip(own_rollouts, second, strict=True)]
    counts = samples_used(pool, second_pool, shares)
    stats.free_samples = float(sum(max(0, n - own) for n, own in zip(counts, own_rollouts, strict=True)))
    stats.rollouts_saved = float(s.num_rollouts * sum(waves.sampled) - stats.rollouts)
    return leave_one_out_values(waves.trajectories, waves.plan, pool, second_pool, shares), counts


def variance_second_wave(
    waves: WaveRunner, pool: SamplePool, shares: Sequence[float], num_rollouts: int
) -> tuple[SamplePool, list[int]]:
    """``allocation="variance"``: the second wave, where :func:`~mcadvantage.mc.pool.second_wave_counts` spends
    what is left of the token budget (set as the stats' ``budget_tokens``). It is pooled apart: a state's value
    mixes the two waves' means by its fixed first-wave share (see :mod:`mcadvantage.mc.budget`).

    Returns:
        ``(the second wave's pool, its rollouts per unique state)``.
    """
    counts, waves.stats.budget_tokens = second_wave_counts(
        pool, waves.plan, waves.sampled, shares, num_rollouts, waves.stats.generated_tokens
    )
    second = pool.empty_like()
    second.add_wave(waves.trajectories, waves.run(counts, grade_unsampled=False))
    return second, counts
