"""Monte Carlo value estimation (VinePPO): values of step-boundary prefixes and per-token advantages.

For each response ``y`` to a prompt ``x`` with step boundaries ``0 = b_0 < ... < b_n = len(y)`` and
reward ``R``, the value of the state before step ``i``, ``S_i = x + y[:b_i]``, is the mean reward of
``K`` continuations sampled from ``S_i`` by the current policy (arXiv 2410.01679, section 3). The
terminal state is never sampled: ``V(S_n) = R``. Step ``i`` gets ``A_i = V(S_i) - V(S_{i-1})``.

How a call to :meth:`MCValueEstimator.estimate` runs (each stage a small pure helper):

1. :func:`plan_states` lists the states of every trajectory and deduplicates them: states with the
   same prompt tokens, completion-prefix tokens and grading context (prompt and row fields) are
   estimated once, so the prompt state is sampled once per prompt, not once per response.
2. :func:`build_requests` turns every unique state with budget left into one
   :class:`~mcadvantage.samplers.RolloutRequest` of ``K`` samples; all go to the sampler in ONE
   ``sampler.sample(requests)`` call, so the engine can batch everything.
3. All rollouts are graded by the reward functions in one call per function (TRL signature), on the
   full response text ``decode(prefix ids + continuation ids)``.
4. :func:`average_values` gives each state its value; :func:`~mcadvantage.core.advantages.step_advantages`
   and :func:`~mcadvantage.core.advantages.token_advantages` give the advantages.

Reproducibility: this module adds no randomness; the estimate is a deterministic function of the
sampler's output (requests are issued in first-occurrence order). Seed the engine (e.g.
``torch.manual_seed`` for :class:`~mcadvantage.samplers.TransformersSampler`, ``LLM(seed=...)`` for
vLLM) to reproduce an estimate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mcadvantage.core.advantages import check_boundaries, step_advantages, token_advantages
from mcadvantage.core.settings import validate_mc_settings
from mcadvantage.core.text import decode_batch, is_conversational
from mcadvantage.mc.budget import (
    allocate_rollouts,
    first_wave_share,
    leave_one_out_mean,
    merge_short_steps,
    shrunk_variance,
    spread_boundaries,
    two_wave_mean,
)
from mcadvantage.rewards.errors import call_reward_func
from mcadvantage.samplers.base import Continuation, RolloutRequest, Sampler

__all__ = [
    "Trajectory",
    "MCEstimate",
    "MCValueEstimator",
    "StatePlan",
    "plan_states",
    "estimated_boundaries",
    "build_requests",
    "average_values",
]


@dataclass
class Trajectory:
    """One sampled response and what is needed to estimate its step values.

    Attributes:
        prompt_ids: prompt token ids (the model input before the completion).
        completion_ids: completion token ids, including the trailing EOS token if there is one,
            excluding padding.
        step_boundaries: token indices ``0 = b_0 < b_1 < ... < b_n = len(completion_ids)``;
            step ``i`` covers tokens ``b_{i-1} .. b_i - 1``. State ``S_i`` is
            ``prompt_ids + completion_ids[:b_i]``.
        reward: the response's own reward ``R`` (``V(S_n) = R``; never estimated).
        prompt: the prompt as the reward functions expect it (a string, or a message list for
            conversational data); passed through as ``prompts=`` when grading rollouts.
        fields: the dataset row's other columns (e.g. ``answer``), passed to reward functions as
            keyword arguments.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    step_boundaries: list[int]
    reward: float
    prompt: Any = None
    fields: dict[str, Any] = field(default_factory=dict)


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


RewardFunc = Callable[..., Sequence[float | None]]


# ---------------------------------------------------------------------------------------------
# Pure helpers: planning states, building requests, averaging values.
# ---------------------------------------------------------------------------------------------


def estimated_boundaries(
    boundaries: Sequence[int],
    max_estimated_steps: int | None,
    *,
    min_step_tokens: int | None = None,
    steps_after_cap: str = "merge",
) -> list[int]:
    """Boundaries of the states that are estimated, after the step budget.

    First steps shorter than ``min_step_tokens`` are merged (:func:`~mcadvantage.mc.budget.merge_short_steps`).
    Then, with ``m = max_estimated_steps`` and ``n > m`` steps left: ``steps_after_cap="spread"`` keeps ``m``
    states spread evenly by token position (:func:`~mcadvantage.mc.budget.spread_boundaries`); otherwise states
    ``S_0 .. S_{m-1}`` are kept and steps ``m .. n`` form one final step (boundaries ``b_0 .. b_{m-1}, b_n``),
    whose advantage is ``R - V(S_{m-1})``, so the telescoping sum ``R - V(S_0)`` is kept. (The official VinePPO
    code instead gave the steps past its cap 0 advantage: ``"zero"``, applied by the estimator.)
    """
    b = merge_short_steps(boundaries, min_step_tokens)
    n = len(b) - 1
    if max_estimated_steps is None or n <= max_estimated_steps:
        return b
    if steps_after_cap == "spread":
        return spread_boundaries(b, max_estimated_steps)
    return b[:max_estimated_steps] + [b[-1]]


@dataclass
class StatePlan:
    """Deduplicated states of a batch.

    Attributes:
        unique: per unique state, ``(trajectory index of its first occurrence, completion prefix
            length)``.
        state_index: per trajectory, the unique-state index of each of its states ``S_0..S_{m-1}``.
        boundaries: per trajectory, the (possibly merged, see :func:`estimated_boundaries`)
            boundaries used for the advantages.
        capped: per trajectory, whether ``max_estimated_steps`` cut its steps (what ``steps_after_cap="zero"``
            zeroes).
        parent: per unique state, the unique state before it in the trajectory of its first occurrence (None
            for a prompt state).
    """

    unique: list[tuple[int, int]]
    state_index: list[list[int]]
    boundaries: list[list[int]]
    capped: list[bool] = field(default_factory=list)
    parent: list[int | None] = field(default_factory=list)

    @property
    def num_states(self) -> int:
        return sum(len(s) for s in self.state_index)


def _grading_key(traj: Trajectory) -> str:
    # Two responses share a state only if they would be graded alike: same prompt and same row
    # fields (e.g. a duplicated question with another gold answer must not share a value). repr is
    # used because prompts and fields may hold unhashable lists/dicts.
    return repr((traj.prompt, sorted(traj.fields.items(), key=lambda kv: kv[0])))


def plan_states(
    trajectories: Sequence[Trajectory],
    max_estimated_steps: int | None = None,
    *,
    min_step_tokens: int | None = None,
    steps_after_cap: str = "merge",
) -> StatePlan:
    """List the non-terminal states of every trajectory and deduplicate them.

    A state is identified by its prompt token ids, its completion-prefix token ids and its grading
    context (prompt and fields); identical states anywhere in the batch map to one unique state. The step
    budget (``max_estimated_steps``, ``min_step_tokens``, ``steps_after_cap``) decides which boundaries are
    states (:func:`estimated_boundaries`).
    """
    key_to_index: dict[tuple[tuple[int, ...], tuple[int, ...], str], int] = {}
    unique: list[tuple[int, int]] = []
    parent: list[int | None] = []
    state_index: list[list[int]] = []
    all_boundaries: list[list[int]] = []
    capped: list[bool] = []
    for t, traj in enumerate(trajectories):
        merged = merge_short_steps(traj.step_boundaries, min_step_tokens)
        b = estimated_boundaries(merged, max_estimated_steps, steps_after_cap=steps_after_cap)
        all_boundaries.append(b)
        capped.append(max_estimated_steps is not None and len(merged) - 1 > max_estimated_steps)
        prompt_key = tuple(traj.prompt_ids)
        gkey = _grading_key(traj)
        idx: list[int] = []
        for prefix_len in b[:-1]:  # S_0 .. S_{n-1}: the terminal state is never sampled
            key = (prompt_key, tuple(traj.completion_ids[:prefix_len]), gkey)
            if key not in key_to_index:
                key_to_index[key] = len(unique)
                unique.append((t, prefix_len))
                parent.append(idx[-1] if idx else None)
            idx.append(key_to_index[key])
        state_index.append(idx)
    return StatePlan(
        unique=unique, state_index=state_index, boundaries=all_boundaries, capped=capped, parent=parent
    )


def build_requests(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    num_rollouts: int | Sequence[int],
    budget: Callable[[int, int], int],
) -> tuple[list[RolloutRequest], list[int | None]]:
    """One request of ``num_rollouts`` samples per unique state with budget left.

    Args:
        num_rollouts: samples per state, one number for all or one per unique state (0: no request).
        budget: ``(completion-prefix length, prompt length)`` -> max new tokens for a continuation from that
            state.

    Returns:
        ``(requests, request_of_state)``: ``request_of_state[u]`` is the index of unique state
        ``u``'s request, or None when the state has no budget left (it is graded directly) or asks for no
        sample.
    """
    requests: list[RolloutRequest] = []
    request_of_state: list[int | None] = []
    for u, (t, prefix_len) in enumerate(plan.unique):
        traj = trajectories[t]
        max_tokens = budget(prefix_len, len(traj.prompt_ids))
        n = num_rollouts if isinstance(num_rollouts, int) else int(num_rollouts[u])
        if max_tokens < 1 or n < 1:
            request_of_state.append(None)
            continue
        request_of_state.append(len(requests))
        prefix = tuple(traj.prompt_ids) + tuple(traj.completion_ids[:prefix_len])
        requests.append(RolloutRequest(prefix_ids=prefix, n=n, max_tokens=max_tokens))
    return requests, request_of_state


def average_values(rewards_per_state: Sequence[Sequence[float]]) -> list[float]:
    """Value of each state: the mean reward of its rollouts (``V(S) = 1/K sum_k R_k``)."""
    values = []
    for u, rewards in enumerate(rewards_per_state):
        if len(rewards) == 0:
            raise ValueError(f"average_values: state {u} has no rollout reward to average.")
        values.append(math.fsum(rewards) / len(rewards))
    return values


def _nansum_weighted(per_func: Sequence[float], weights: Sequence[float]) -> tuple[float, bool]:
    """Weighted sum skipping NaN (TRL's ``nansum``); also returns whether every entry was NaN."""
    total = 0.0
    all_nan = True
    for r, w in zip(per_func, weights, strict=True):
        if not math.isnan(r):
            total += w * r
            all_nan = False
    return total, all_nan


# ---------------------------------------------------------------------------------------------
# The estimator: validation, then the I/O (one sampler call, one call per reward function).
# ---------------------------------------------------------------------------------------------


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

    @staticmethod
    def _validate_samples(requests: Sequence[RolloutRequest], samples: Any) -> list[list[Continuation]]:
        if len(samples) != len(requests):
            raise RuntimeError(
                f"sampler returned {len(samples)} results for {len(requests)} requests; a Sampler must "
                "return one list of continuations per request."
            )
        for i, (req, conts) in enumerate(zip(requests, samples, strict=True)):
            if len(conts) != req.n:
                raise RuntimeError(
                    f"sampler returned {len(conts)} continuations for request {i} (n={req.n}); it must "
                    "return exactly n."
                )
            for c in conts:
                if len(c.token_ids) > req.max_tokens:
                    raise RuntimeError(
                        f"sampler returned a continuation of {len(c.token_ids)} tokens for request {i} "
                        f"with max_tokens={req.max_tokens}; continuations must respect the budget."
                    )
        return [list(c) for c in samples]

    # -- grading ---------------------------------------------------------------------------------

    def _grade(
        self,
        items: list[tuple[Trajectory, list[int]]],
        reward_kwargs: Mapping[str, Any],
        progress: Any,
    ) -> tuple[list[float], int]:
        """Grade full responses ``(trajectory, completion ids)`` with every reward function, one call
        per function for the whole batch. Returns the combined rewards and the unscorable count."""
        if not items:
            return [], 0
        # Decode the concatenated ids (not prefix text + continuation text) so a character split
        # across the prefix/continuation boundary (multi-token UTF-8) decodes correctly.
        completion_ids = [ids for _, ids in items]
        texts = decode_batch(self.tokenizer, completion_ids)
        prompts = [traj.prompt for traj, _ in items]
        completions: list[Any] = [
            [{"role": "assistant", "content": text}] if is_conversational(traj.prompt) else text
            for (traj, _), text in zip(items, texts, strict=True)
        ]
        keys: list[str] = []
        for traj, _ in items:
            for k in traj.fields:
                if k not in keys:
                    keys.append(k)
        columns = {k: [traj.fields.get(k) for traj, _ in items] for k in keys}

        per_func: list[list[float]] = []
        for f in self.reward_funcs:
            # Raising, or returning inf, is a RewardFunctionError naming the function and the rollout: one infinite
            # rollout would make its state's value infinite and every whitened advantage NaN.
            out = call_reward_func(
                f,
                getattr(f, "__name__", None) or type(f).__name__,
                dict(
                    prompts=prompts,
                    completions=completions,
                    completion_ids=completion_ids,
                    **columns,
                    **reward_kwargs,
                ),
                where="Monte Carlo rollouts",
            )
            if len(out) != len(items):
                raise RuntimeError(
                    f"reward function {getattr(f, '__name__', f)!r} returned {len(out)} rewards for "
                    f"{len(items)} completions; it must return one per completion."
                )
            per_func.append(out)
            if progress is not None:
                progress.update(1)

        rewards: list[float] = []
        unscorable = 0
        for j in range(len(items)):
            total, all_nan = _nansum_weighted([pf[j] for pf in per_func], self.reward_weights)
            unscorable += all_nan
            rewards.append(total)
        return rewards, unscorable

    # -- the estimate ----------------------------------------------------------------------------

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
        """One wave: ``counts[u]`` continuations from every unique state ``u`` with budget left, in ONE sampler
        call, graded in one call per reward function. With ``grade_unsampled``, states without budget are graded
        as their own (truncated) prefix. Adds to ``stats``; returns per state its samples as ``(completion ids,
        reward)`` (the full response: the state's prefix plus the continuation)."""
        requests, request_of_state = build_requests(trajectories, plan, counts, self.budget)

        t0 = time.perf_counter()
        samples: list[list[Continuation]] = []
        if requests:
            samples = self._validate_samples(requests, self.sampler.sample(requests))
        stats["sampling_seconds"] += time.perf_counter() - t0
        if progress is not None:
            progress.update(1)

        out: list[list[tuple[list[int], float]]] = [[] for _ in plan.unique]
        to_grade: list[tuple[Trajectory, list[int]]] = []
        slots: list[int] = []  # unique-state index of each graded item
        for u, (t, prefix_len) in enumerate(plan.unique):
            traj = trajectories[t]
            prefix = list(traj.completion_ids[:prefix_len])
            r = request_of_state[u]
            if r is None:
                if grade_unsampled and budgets[u] < 1:
                    # No budget left: the prefix itself is the (truncated) response.
                    stats["unsampled_states"] += 1
                    if self.truncated_reward is not None:
                        out[u].append((prefix, self.truncated_reward))
                    else:
                        to_grade.append((traj, prefix))
                        slots.append(u)
                continue
            for cont in samples[r]:
                stats["generated_tokens"] += len(cont.token_ids)
                stats["truncated_rollouts"] += bool(cont.truncated)
                stats["rollouts"] += 1
                ids = prefix + list(cont.token_ids)
                if cont.truncated and self.truncated_reward is not None:
                    out[u].append((ids, self.truncated_reward))
                    stats["rollout_reward_sum"] += self.truncated_reward
                    stats["rollout_reward_count"] += 1
                else:
                    to_grade.append((traj, ids))
                    slots.append(u)
        stats["requests"] += len(requests)

        t0 = time.perf_counter()
        graded, unscorable = self._grade(to_grade, reward_kwargs, progress)
        stats["grading_seconds"] += time.perf_counter() - t0
        stats["unscorable_rollouts"] += unscorable
        for u, (_, ids), reward in zip(slots, to_grade, graded, strict=True):
            out[u].append((ids, reward))
            if request_of_state[u] is not None:
                stats["rollout_reward_sum"] += reward
                stats["rollout_reward_count"] += 1
        return out

    def _pooled_values(
        self,
        trajectories: Sequence[Trajectory],
        extra: Sequence[Trajectory],
        plan: StatePlan,
        budgets: Sequence[int],
        sampled: Sequence[bool],
        reward_kwargs: Mapping[str, Any],
        stats: dict[str, float],
        progress: Any,
    ) -> tuple[Callable[[int, int], float], list[int]]:
        """Free samples and/or variance allocation: pool every response and rollout through each state and top the
        states up (first wave); with ``"variance"``, allocate the rest of the token budget (second wave). Returns the
        leave-one-out value ``(trajectory, unique state) -> V`` and the samples behind each state's values.

        The second wave is kept apart: a state's value mixes its first-wave mean and its second-wave mean with the
        fixed share :func:`~mcadvantage.mc.budget.first_wave_share`, so how many rollouts the allocation gave it
        (which depends on outcomes) never reweights the outcomes it looked at (see :mod:`mcadvantage.mc.budget`).
        """
        pool = _SamplePool(trajectories, plan)
        for traj in [*trajectories, *extra]:
            # Masked responses count too: which responses are masked may depend on their outcomes.
            pool.add_path(traj, traj.completion_ids, float(traj.reward))
        target = self.num_rollouts if self.allocation == "uniform" else self.min_rollouts
        first = [max(0, target - f) if ok else 0 for f, ok in zip(pool.others, sampled, strict=True)]
        own_rollouts = list(first)

        def wave(into: _SamplePool, counts: Sequence[int], grade_unsampled: bool) -> None:
            into.add_wave(
                trajectories,
                self._sample_and_grade(
                    trajectories,
                    plan,
                    counts,
                    budgets,
                    reward_kwargs,
                    stats,
                    grade_unsampled=grade_unsampled,
                    progress=progress,
                ),
            )

        wave(pool, first, grade_unsampled=True)
        # First-wave samples besides the response's own: counted by prefixes, never by outcomes.
        others = pool.others
        share = [
            first_wave_share(n, self.num_rollouts) if ok else 1.0
            for n, ok in zip(others, sampled, strict=True)
        ]
        second_pool: _SamplePool | None = None
        if self.allocation == "variance":
            second_pool = pool.empty_like()
            # A state whose value has a second-wave part needs a second-wave sample.
            need = [1 if a < 1.0 else 0 for a in share]
            costs = [pool.mean_remaining(u) for u in range(len(plan.unique))]
            token_budget = self.num_rollouts * math.fsum(
                c for c, ok in zip(costs, sampled, strict=True) if ok
            )
            stats["budget_tokens"] = token_budget
            # The value's variance is a^2 var / n_1 + (1 - a)^2 var / n_2: a second-wave rollout is worth
            # (1 - a)^2 of an advantage token's error, and nothing at a state with a = 1.
            extra_second = allocate_rollouts(
                weights=[w * (1.0 - a) ** 2 for w, a in zip(_advantage_weights(plan), share, strict=True)],
                variances=pool.variances(plan.parent, VARIANCE_PRIOR_STRENGTH),
                counts=need,
                costs=costs,
                budget=max(
                    0.0,
                    token_budget
                    - stats["generated_tokens"]
                    - math.fsum(c for c, n in zip(costs, need, strict=True) if n),
                ),
            )
            second = [a + b for a, b in zip(need, extra_second, strict=True)]
            own_rollouts = [a + b for a, b in zip(own_rollouts, second, strict=True)]
            wave(second_pool, second, grade_unsampled=False)
        used = [
            n + (second_pool.count[u] if second_pool is not None and share[u] < 1.0 else 0)
            for u, n in enumerate(others)
        ]
        stats["free_samples"] = float(sum(max(0, n - own) for n, own in zip(used, own_rollouts, strict=True)))
        stats["rollouts_saved"] = self.num_rollouts * sum(sampled) - stats["rollouts"]

        def value(t: int, u: int) -> float:
            first_mean = leave_one_out_mean(pool.total[u], pool.count[u], float(trajectories[t].reward))
            if second_pool is None:
                return first_mean
            second_mean = second_pool.total[u] / second_pool.count[u] if second_pool.count[u] else None
            return two_wave_mean(first_mean, second_mean, share[u])

        return value, used

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
                value, state_counts = self._pooled_values(
                    trajectories, extra, plan, budgets, sampled, kwargs, stats, progress
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


#: Pseudo-samples of the parent state's variance in a state's variance estimate (``allocation="variance"``).
VARIANCE_PRIOR_STRENGTH = 2.0


def _advantage_weights(plan: StatePlan) -> list[float]:
    """Per unique state, the advantage tokens its value enters: the steps before and after it, summed over the
    trajectories that pass through it."""
    weights = [0.0] * len(plan.unique)
    for b, states in zip(plan.boundaries, plan.state_index, strict=True):
        for i, u in enumerate(states):
            weights[u] += (b[i] - b[i - 1] if i else 0) + (b[i + 1] - b[i])
    return weights


class _SamplePool:
    """The samples of every unique state's value: each path (a response or a rollout, as completion ids with its
    reward) counts for every state whose prefix it starts with and goes beyond."""

    def __init__(self, trajectories: Sequence[Trajectory], plan: StatePlan) -> None:
        # Per grading group (prompt ids, grading context), a token trie of the states' completion prefixes; the
        # key None of a node holds the state ending there. A path walks it token by token and stops where it
        # leaves every state prefix, so matching costs O(path length), not O(states x length).
        self.tries: dict[tuple[tuple[int, ...], str], dict[Any, Any]] = {}
        for u, (t, prefix_len) in enumerate(plan.unique):
            traj = trajectories[t]
            node = self.tries.setdefault((tuple(traj.prompt_ids), _grading_key(traj)), {})
            for token in traj.completion_ids[:prefix_len]:
                node = node.setdefault(token, {})
            node[None] = u
        self.plan = plan
        size = len(plan.unique)
        self.total = [0.0] * size
        self.count = [0] * size
        self.remaining = [0.0] * size
        # Every sample's outcome, for the allocation's variance estimates. The allocation may look at the responses'
        # outcomes too: it only sets the size of the second wave, which is averaged apart (see _pooled_values).
        self.rewards: list[list[float]] = [[] for _ in range(size)]

    def empty_like(self) -> _SamplePool:
        """A pool over the same states with no sample in it (the second wave's)."""
        other = object.__new__(_SamplePool)
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
        node = self.tries.get((tuple(traj.prompt_ids), _grading_key(traj)))
        ids = list(completion_ids)
        depth = 0
        while node is not None and depth < len(ids):  # a state counts only paths that go beyond it
            u = node.get(None)
            if u is not None and depth >= start:
                self._add(u, reward, len(ids) - depth)
            node = node.get(ids[depth])
            depth += 1

    def add_wave(self, trajectories: Sequence[Trajectory], wave: list[list[tuple[list[int], float]]]) -> None:
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
