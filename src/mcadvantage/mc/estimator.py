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
   :func:`~mcadvantage.mc.rollouts.sample_and_grade`), on the full response text
   ``decode(prefix ids + continuation ids)``.
4. :func:`~mcadvantage.mc.rollouts.average_values` (or, with free samples, the steps of
   :mod:`~mcadvantage.mc.pool`) gives each state its value; :func:`credit` turns the values into advantages
   (:func:`~mcadvantage.core.advantages.step_advantages`, :func:`~mcadvantage.core.advantages.token_advantages`).

The stages live in their own modules, below this one: :mod:`~mcadvantage.mc.trajectory` (the input),
:mod:`~mcadvantage.mc.planning`, :mod:`~mcadvantage.mc.rollouts`, :mod:`~mcadvantage.mc.pool` and
:mod:`~mcadvantage.mc.budget`. Each takes and returns data; :class:`MCValueEstimator` calls them in order (it
is the only caller: no stage calls back into it) and adds up what they cost in one
:class:`~mcadvantage.mc.stats.MCStats` record. The settings come whole, as one
:class:`~mcadvantage.core.settings.MCSettings`.

Reproducibility: this module adds no randomness; the estimate is a deterministic function of the
sampler's output (requests are issued in first-occurrence order). Seed the engine (e.g.
``torch.manual_seed`` for :class:`~mcadvantage.samplers.TransformersSampler`, ``LLM(seed=...)`` for
vLLM) to reproduce an estimate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcadvantage.core.advantages import check_boundaries, step_advantages, token_advantages
from mcadvantage.core.settings import MCSettings, refuse_setting_assignment, setting_attribute
from mcadvantage.mc.planning import StatePlan, estimated_boundaries, plan_states
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
    Wave,
    average_values,
    build_requests,
    rollout_token_budget,
    sample_and_grade,
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
    "credit",
    # re-exported from the stage modules (their 0.1 home was this module):
    "StatePlan",
    "plan_states",
    "estimated_boundaries",
    "build_requests",
    "average_values",
]


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
        stats: aggregate statistics of the call, as floats (:meth:`~mcadvantage.mc.stats.MCStats.as_dict`; each
            key is described there):

            - ``trajectories``, ``states``, ``unique_states``, ``dedup_ratio`` (``1 - unique_states / states``);
            - ``requests``, ``unsampled_states``, ``rollouts`` (``requests * num_rollouts``),
              ``generated_tokens``, ``truncated_rollouts``, ``unscorable_rollouts``, ``rollout_reward_mean``
              (NaN if none);
            - ``seconds``, ``sampling_seconds``, ``grading_seconds``: wall time of the call, of the sampler calls
              and of the reward calls;
            - with ``reuse_samples`` or ``allocation="variance"``: ``free_samples`` and ``rollouts_saved``; with
              ``allocation="variance"`` also ``budget_tokens`` (the rollout tokens allowed).
        sample_counts: per trajectory, the number of samples behind each of its state values (leave-one-out with
            ``reuse_samples``: the response's own outcome is not counted).
    """

    values: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[torch.Tensor]
    stats: dict[str, float]
    sample_counts: list[list[int]] = field(default_factory=list)


def credit(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    state_values: Sequence[Sequence[float]],
    zero_after_cap: bool,
) -> tuple[list[list[float]], list[list[float]], list[torch.Tensor]]:
    """The algorithm, once the states have values: per trajectory ``[V(S_0), ..., V(S_{n-1}), R]``, the step
    advantages ``A_i = V(S_i) - V(S_{i-1})`` (with ``zero_after_cap``, the merged tail of a capped response gets
    0, as in the official code) and every token of step ``i`` carrying ``A_i``.

    Args:
        state_values: per trajectory, the values of its estimated states ``S_0..S_{m-1}``.
    Returns:
        ``(values, step advantages, token advantages)`` per trajectory.
    """
    values: list[list[float]] = []
    step_advs: list[list[float]] = []
    token_advs: list[torch.Tensor] = []
    for t, traj in enumerate(trajectories):
        v = list(state_values[t]) + [float(traj.reward)]
        a = step_advantages(v)
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

    # -- one wave ---------------------------------------------------------------------------------

    def _wave(
        self,
        trajectories: Sequence[Trajectory],
        plan: StatePlan,
        budgets: Sequence[int],
        reward_kwargs: Mapping[str, Any],
        stats: MCStats,
        progress: Any,
        *,
        counts: Sequence[int],
        grade_unsampled: bool,
    ) -> Wave:
        """Sample and grade one wave of ``counts[u]`` rollouts per unique state with this estimator's sampler and
        reward functions (:func:`~mcadvantage.mc.rollouts.sample_and_grade`), and add what it cost to ``stats``."""
        wave = sample_and_grade(
            trajectories,
            plan,
            counts,
            budgets,
            reward_kwargs,
            sampler=self.sampler,
            tokenizer=self.tokenizer,
            reward_funcs=self.reward_funcs,
            reward_weights=self.reward_weights,
            truncated_reward=self.settings.truncated_reward,
            grade_unsampled=grade_unsampled,
            progress=progress,
        )
        stats.add(wave.counts)
        return wave

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
        trajectories = list(trajectories)
        self._validate(trajectories)
        extra = list(extra_responses)
        if extra:
            self._validate(extra)
        plan = plan_states(trajectories, s)
        budgets = [self.budget(prefix_len, len(trajectories[t].prompt_ids)) for t, prefix_len in plan.unique]
        sampled = [b >= 1 for b in budgets]
        stats = MCStats()
        kwargs = dict(reward_kwargs or {})
        waves = 2 if s.allocation == "variance" else 1
        progress = None
        if self.show_progress:
            from tqdm.auto import tqdm

            progress = tqdm(
                total=waves * (1 + len(self.reward_funcs)),
                desc=f"MC values ({sum(sampled)} states x {s.num_rollouts})",
                unit="phase",
            )

        try:
            if not s.pools_free_samples:
                # The paper's scheme: K fresh rollouts per state, nothing shared between states.
                counts = [s.num_rollouts if ok else 0 for ok in sampled]
                samples = self._wave(
                    trajectories, plan, budgets, kwargs, stats, progress, counts=counts, grade_unsampled=True
                ).samples
                per_state = average_values([[r for _, r in state] for state in samples])
                state_values = [[per_state[u] for u in states] for states in plan.state_index]
                state_counts = [len(state) for state in samples]
            else:
                # Free samples: every response and rollout through a state is a draw of its value (leave-one-out).
                pool = SamplePool(trajectories, plan)
                pool.add_responses([*trajectories, *extra])
                target = s.num_rollouts if s.allocation == "uniform" else s.min_rollouts
                own_rollouts = first_wave_counts(pool, sampled, target)
                first = self._wave(
                    trajectories,
                    plan,
                    budgets,
                    kwargs,
                    stats,
                    progress,
                    counts=own_rollouts,
                    grade_unsampled=True,
                )
                pool.add_wave(trajectories, first.samples)
                shares = first_wave_shares(pool, sampled, s.num_rollouts)
                second_pool: SamplePool | None = None
                if s.allocation == "variance":
                    # The second wave is averaged apart, with the fixed shares (see mcadvantage.mc.budget).
                    second, stats.budget_tokens = second_wave_counts(
                        pool, plan, sampled, shares, s.num_rollouts, stats.generated_tokens
                    )
                    own_rollouts = [a + b for a, b in zip(own_rollouts, second, strict=True)]
                    second_pool = pool.empty_like()
                    late = self._wave(
                        trajectories,
                        plan,
                        budgets,
                        kwargs,
                        stats,
                        progress,
                        counts=second,
                        grade_unsampled=False,
                    )
                    second_pool.add_wave(trajectories, late.samples)
                state_counts = samples_used(pool, second_pool, shares)
                stats.free_samples = float(
                    sum(max(0, n - own) for n, own in zip(state_counts, own_rollouts, strict=True))
                )
                stats.rollouts_saved = float(s.num_rollouts * sum(sampled) - stats.rollouts)
                state_values = leave_one_out_values(trajectories, plan, pool, second_pool, shares)
        finally:
            if progress is not None:
                progress.close()

        values, step_advs, token_advs = credit(trajectories, plan, state_values, s.steps_after_cap == "zero")

        stats.trajectories = len(trajectories)
        stats.states = plan.num_states
        stats.unique_states = len(plan.unique)
        stats.seconds = time.perf_counter() - start
        return MCEstimate(
            values=values,
            step_advantages=step_advs,
            token_advantages=token_advs,
            stats=stats.as_dict(),
            sample_counts=[[state_counts[u] for u in states] for states in plan.state_index],
        )
