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
4. :func:`~mcadvantage.mc.rollouts.average_values` (or, with free samples,
   :func:`~mcadvantage.mc.pool.pooled_values`) gives each state its value;
   :func:`~mcadvantage.core.advantages.step_advantages` and :func:`~mcadvantage.core.advantages.token_advantages`
   give the advantages.

The stages live in their own modules, below this one: :mod:`~mcadvantage.mc.trajectory` (the input),
:mod:`~mcadvantage.mc.planning`, :mod:`~mcadvantage.mc.rollouts`, :mod:`~mcadvantage.mc.pool` and
:mod:`~mcadvantage.mc.budget`; this module wires them into :class:`MCValueEstimator`.

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
from typing import Any, Literal

import torch

from mcadvantage.core.advantages import check_boundaries, step_advantages, token_advantages
from mcadvantage.core.settings import validate_mc_settings
from mcadvantage.mc.planning import StatePlan, estimated_boundaries, plan_states
from mcadvantage.mc.pool import pooled_values
from mcadvantage.mc.rollouts import (
    RewardFunc,
    average_values,
    build_requests,
    grade_rollouts,
    sample_and_grade,
)
from mcadvantage.mc.trajectory import Trajectory
from mcadvantage.samplers.base import Sampler

__all__ = [
    "Trajectory",
    "MCEstimate",
    "MCValueEstimator",
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
        stats: aggregate statistics of the call:

            - ``trajectories``: number of trajectories;
            - ``states``: non-terminal states over all trajectories, before dedup;
            - ``unique_states``: states left after dedup;
            - ``dedup_ratio``: ``1 - unique_states / states``, the fraction of states (hence of
              rollouts) saved by dedup (0 when there is no state);
            - ``requests``: rollout requests sent to the sampler (unique states with budget left);
            - ``unsampled_states``: unique states with no token budget left, graded directly;
            - ``rollouts``: continuations sampled (``requests * num_rollouts``);
            - ``generated_tokens``: tokens in all continuations;
            - ``truncated_rollouts``: continuations that hit their budget before EOS;
            - ``unscorable_rollouts``: rollouts for which every reward function returned None;
            - ``rollout_reward_mean``: mean reward of the graded rollouts (NaN if none);
            - ``seconds``, ``sampling_seconds``, ``grading_seconds``: wall time of the call, of
              the sampler calls and of the reward calls;
            - with ``reuse_samples`` or ``allocation="variance"``: ``free_samples`` (samples of a state's value
              that were not drawn for it: other responses and other states' rollouts through it, summed over
              unique states) and ``rollouts_saved`` (``num_rollouts`` per sampled state minus the rollouts
              drawn); with ``allocation="variance"`` also ``budget_tokens`` (the rollout tokens allowed).
        sample_counts: per trajectory, the number of samples behind each of its state values (leave-one-out with
            ``reuse_samples``: the response's own outcome is not counted).
    """

    values: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[torch.Tensor]
    stats: dict[str, float]
    sample_counts: list[list[int]] = field(default_factory=list)


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
        num_rollouts: ``K``, continuations per state (paper default 9).
        reward_weights: weights of the reward functions (default all 1); rewards are combined as a
            weighted sum that skips None/NaN, like TRL's ``nansum``.
        max_completion_length: the training responses' token budget; required by
            ``rollout_budget="remaining"``, unused by ``"fixed"``.
        rollout_budget: ``"remaining"`` (default): a continuation from a state whose completion
            prefix has ``b`` tokens may add ``max_completion_length - b`` tokens, so a rollout is
            a response the policy could have produced under the training budget. A state with no
            budget left (only when a completion is longer than ``max_completion_length``) is not
            sampled: its value is the reward of the prefix itself graded as a truncated response.
            ``"fixed"``: every continuation gets a fresh ``fixed_rollout_budget`` tokens, as in the
            official VinePPO code.
        fixed_rollout_budget: the budget for ``rollout_budget="fixed"``.
        max_estimated_steps: estimate at most the states ``S_0..S_{m-1}`` of a response; what its
            steps ``m..n`` get is ``steps_after_cap``'s choice.
        steps_after_cap: ``"merge"`` (default): steps ``m..n`` are merged into one final step with
            advantage ``R - V(S_{m-1})``, keeping the telescoping sum ``R - V(S_0)``. ``"zero"``: they
            get advantage 0, as the official VinePPO code did on GSM8K.
        context_length: the policy's context (prompt + completion); every continuation's budget is
            capped so it fits (the official code's ``min(1024, context - prefix)``). None: no cap.
        truncated_reward: None (default): truncated continuations are graded like any other
            response. A float: truncated continuations (and unsampled no-budget states) get this
            reward without grading (the official code used 0.0). Never dropped either way.
        reuse_samples: pool *free samples* into every state's value: the other responses of the batch that pass
            through the state (share its prompt, grading context and prefix tokens, and go on) and every rollout
            that passes through it. Leave-one-out: a response's own outcome never enters the values of its own
            states. A state then gets only ``num_rollouts - free samples`` new rollouts (none when it has
            enough). Needs ``rollout_budget="remaining"`` (responses and rollouts must share one token budget to
            be draws of the same value).
        allocation: ``"uniform"`` (default): every state gets ``num_rollouts`` samples. ``"variance"``: a first
            wave tops every state up to ``min_rollouts`` samples, then the rollout tokens that ``num_rollouts``
            per state would cost are spent where they reduce advantage error most
            (:func:`~mcadvantage.mc.budget.allocate_rollouts`), at least one more rollout at every state with
            fewer than ``num_rollouts`` first-wave samples and none at the others. A state's value is a fixed
            mix of its first-wave and second-wave means, which keeps it exactly unbiased (see
            :mod:`mcadvantage.mc.budget`).
        min_rollouts: the first wave of ``allocation="variance"`` (free samples count toward it).
        min_step_tokens: merge steps shorter than this many tokens before estimating (None: keep every step).
        show_progress: show a tqdm progress bar over the call's phases (sampling, grading).
    """

    def __init__(
        self,
        sampler: Sampler,
        reward_funcs: RewardFunc | Sequence[RewardFunc],
        tokenizer: Any,
        *,
        num_rollouts: int = 9,
        reward_weights: Sequence[float] | None = None,
        max_completion_length: int | None = None,
        rollout_budget: Literal["remaining", "fixed"] = "remaining",
        fixed_rollout_budget: int | None = None,
        max_estimated_steps: int | None = None,
        truncated_reward: float | None = None,
        steps_after_cap: Literal["merge", "zero"] = "merge",
        context_length: int | None = None,
        reuse_samples: bool = False,
        allocation: Literal["uniform", "variance"] = "uniform",
        min_rollouts: int = 1,
        min_step_tokens: int | None = None,
        show_progress: bool = False,
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
        validate_mc_settings(
            num_rollouts=num_rollouts,
            rollout_budget=rollout_budget,
            fixed_rollout_budget=fixed_rollout_budget,
            max_completion_length=max_completion_length,
            max_estimated_steps=max_estimated_steps,
            truncated_reward=truncated_reward,
            steps_after_cap=steps_after_cap,
            reuse_samples=reuse_samples,
            allocation=allocation,
            min_rollouts=min_rollouts,
            min_step_tokens=min_step_tokens,
        )
        if context_length is not None and context_length < 2:
            raise ValueError(f"context_length={context_length!r} must be >= 2 (prompt + one token) or None.")

        self.sampler = sampler
        self.reward_funcs = funcs
        self.reward_weights = weights
        self.tokenizer = tokenizer
        self.num_rollouts = num_rollouts
        self.max_completion_length = max_completion_length
        self.rollout_budget = rollout_budget
        self.fixed_rollout_budget = fixed_rollout_budget
        self.max_estimated_steps = max_estimated_steps
        self.truncated_reward = None if truncated_reward is None else float(truncated_reward)
        self.steps_after_cap = steps_after_cap
        self.context_length = context_length
        self.reuse_samples = bool(reuse_samples)
        self.allocation = allocation
        self.min_rollouts = min_rollouts
        self.min_step_tokens = min_step_tokens
        self.show_progress = show_progress

    # -- budgets ---------------------------------------------------------------------------------

    def budget(self, prefix_len: int, prompt_len: int | None = None) -> int:
        """Max new tokens for a continuation from a state with ``prefix_len`` completion tokens (after a
        ``prompt_len``-token prompt), capped so prompt + prefix + continuation fit in ``context_length``."""
        if self.rollout_budget == "fixed":
            tokens = int(self.fixed_rollout_budget)  # type: ignore[arg-type]
        else:
            tokens = int(self.max_completion_length) - prefix_len  # type: ignore[arg-type]
        if self.context_length is not None and prompt_len is not None:
            tokens = min(tokens, self.context_length - prompt_len - prefix_len)
        return tokens

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

    # -- rollouts ---------------------------------------------------------------------------------

    def _grade(
        self,
        items: list[tuple[Trajectory, list[int]]],
        reward_kwargs: Mapping[str, Any],
        progress: Any,
    ) -> tuple[list[float], int]:
        """Grade full responses with this estimator's reward functions
        (:func:`~mcadvantage.mc.rollouts.grade_rollouts`)."""
        return grade_rollouts(
            items,
            reward_kwargs,
            progress,
            tokenizer=self.tokenizer,
            reward_funcs=self.reward_funcs,
            reward_weights=self.reward_weights,
        )

    def _sample_and_grade(
        self,
        trajectories: Sequence[Trajectory],
        plan: StatePlan,
        counts: Sequence[int],
        budgets: Sequence[int],
        reward_kwargs: Mapping[str, Any],
        stats: dict[str, float],
        *,
        grade_unsampled: bool,
        progress: Any = None,
    ) -> list[list[tuple[list[int], float]]]:
        """One wave with this estimator's sampler, budget and graders
        (:func:`~mcadvantage.mc.rollouts.sample_and_grade`)."""
        return sample_and_grade(
            trajectories,
            plan,
            counts,
            budgets,
            reward_kwargs,
            stats,
            sampler=self.sampler,
            budget=self.budget,
            grade=self._grade,
            truncated_reward=self.truncated_reward,
            grade_unsampled=grade_unsampled,
            progress=progress,
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
        trajectories = list(trajectories)
        self._validate(trajectories)
        extra = list(extra_responses)
        if extra:
            self._validate(extra)
        plan = plan_states(
            trajectories,
            self.max_estimated_steps,
            min_step_tokens=self.min_step_tokens,
            steps_after_cap=self.steps_after_cap,
        )
        budgets = [self.budget(prefix_len, len(trajectories[t].prompt_ids)) for t, prefix_len in plan.unique]
        sampled = [b >= 1 for b in budgets]
        pooled = self.reuse_samples or self.allocation == "variance"
        stats: dict[str, float] = dict.fromkeys(
            (
                "requests",
                "unsampled_states",
                "rollouts",
                "generated_tokens",
                "truncated_rollouts",
                "unscorable_rollouts",
                "sampling_seconds",
                "grading_seconds",
                "rollout_reward_sum",
                "rollout_reward_count",
            ),
            0.0,
        )
        kwargs = dict(reward_kwargs or {})
        waves = 2 if self.allocation == "variance" else 1
        progress = None
        if self.show_progress:
            from tqdm.auto import tqdm

            progress = tqdm(
                total=waves * (1 + len(self.reward_funcs)),
                desc=f"MC values ({sum(sampled)} states x {self.num_rollouts})",
                unit="phase",
            )
        try:
            if not pooled:
                # The paper's scheme: K fresh rollouts per state, nothing shared between states.
                counts = [self.num_rollouts if ok else 0 for ok in sampled]
                waves_out = self._sample_and_grade(
                    trajectories,
                    plan,
                    counts,
                    budgets,
                    kwargs,
                    stats,
                    grade_unsampled=True,
                    progress=progress,
                )
                state_values = average_values([[r for _, r in wave] for wave in waves_out])
                state_counts = [len(wave) for wave in waves_out]

                def value(t: int, u: int) -> float:
                    return state_values[u]
            else:
                value, state_counts = pooled_values(
                    trajectories,
                    extra,
                    plan,
                    sampled,
                    stats,
                    lambda counts, grade_unsampled: self._sample_and_grade(
                        trajectories,
                        plan,
                        counts,
                        budgets,
                        kwargs,
                        stats,
                        grade_unsampled=grade_unsampled,
                        progress=progress,
                    ),
                    num_rollouts=self.num_rollouts,
                    allocation=self.allocation,
                    min_rollouts=self.min_rollouts,
                )
        finally:
            if progress is not None:
                progress.close()

        # Values and advantages.
        values: list[list[float]] = []
        step_advs: list[list[float]] = []
        token_advs: list[torch.Tensor] = []
        for t, traj in enumerate(trajectories):
            v = [value(t, u) for u in plan.state_index[t]] + [float(traj.reward)]
            a = step_advantages(v)
            if plan.capped[t] and self.steps_after_cap == "zero":
                a[-1] = 0.0  # the merged tail (steps m..n) gets no credit, as in the official code
            values.append(v)
            step_advs.append(a)
            token_advs.append(token_advantages(a, plan.boundaries[t], len(traj.completion_ids)))

        num_states = plan.num_states
        num_unique = len(plan.unique)
        reward_sum, reward_count = stats.pop("rollout_reward_sum"), stats.pop("rollout_reward_count")
        stats.update(
            trajectories=float(len(trajectories)),
            states=float(num_states),
            unique_states=float(num_unique),
            dedup_ratio=(1.0 - num_unique / num_states) if num_states else 0.0,
            rollout_reward_mean=reward_sum / reward_count if reward_count else math.nan,
            seconds=time.perf_counter() - start,
        )
        return MCEstimate(
            values=values,
            step_advantages=step_advs,
            token_advantages=token_advs,
            stats=stats,
            sample_counts=[[state_counts[u] for u in states] for states in plan.state_index],
        )
