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
4. :func:`average_values` gives each state its value; :func:`~mcadvantage.advantages.step_advantages`
   and :func:`~mcadvantage.advantages.token_advantages` give the advantages.

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

from .advantages import check_boundaries, step_advantages, token_advantages
from .samplers.base import Continuation, RolloutRequest, Sampler
from .settings import validate_mc_settings
from .text import decode_batch, is_conversational

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
              the sampler call and of the reward calls.
    """

    values: list[list[float]]
    step_advantages: list[list[float]]
    token_advantages: list[torch.Tensor]
    stats: dict[str, float]


RewardFunc = Callable[..., Sequence[float | None]]


# ---------------------------------------------------------------------------------------------
# Pure helpers: planning states, building requests, averaging values.
# ---------------------------------------------------------------------------------------------


def estimated_boundaries(boundaries: Sequence[int], max_estimated_steps: int | None) -> list[int]:
    """Boundaries after the ``max_estimated_steps`` cap.

    With ``m = max_estimated_steps`` and ``n > m`` steps, states ``S_0 .. S_{m-1}`` are kept and
    steps ``m .. n`` are merged into one final step (boundaries ``b_0 .. b_{m-1}, b_n``), whose
    advantage is ``R - V(S_{m-1})``, so the telescoping sum ``R - V(S_0)`` is kept. (The official
    VinePPO code instead gave the steps past its cap 0 advantage.)
    """
    b = [int(x) for x in boundaries]
    n = len(b) - 1
    if max_estimated_steps is None or n <= max_estimated_steps:
        return b
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
    """

    unique: list[tuple[int, int]]
    state_index: list[list[int]]
    boundaries: list[list[int]]

    @property
    def num_states(self) -> int:
        return sum(len(s) for s in self.state_index)


def _grading_key(traj: Trajectory) -> str:
    # Two responses share a state only if they would be graded alike: same prompt and same row
    # fields (e.g. a duplicated question with another gold answer must not share a value). repr is
    # used because prompts and fields may hold unhashable lists/dicts.
    return repr((traj.prompt, sorted(traj.fields.items(), key=lambda kv: kv[0])))


def plan_states(trajectories: Sequence[Trajectory], max_estimated_steps: int | None = None) -> StatePlan:
    """List the non-terminal states of every trajectory and deduplicate them.

    A state is identified by its prompt token ids, its completion-prefix token ids and its grading
    context (prompt and fields); identical states anywhere in the batch map to one unique state.
    """
    key_to_index: dict[tuple[tuple[int, ...], tuple[int, ...], str], int] = {}
    unique: list[tuple[int, int]] = []
    state_index: list[list[int]] = []
    all_boundaries: list[list[int]] = []
    for t, traj in enumerate(trajectories):
        b = estimated_boundaries(traj.step_boundaries, max_estimated_steps)
        all_boundaries.append(b)
        prompt_key = tuple(traj.prompt_ids)
        gkey = _grading_key(traj)
        idx = []
        for prefix_len in b[:-1]:  # S_0 .. S_{n-1}: the terminal state is never sampled
            key = (prompt_key, tuple(traj.completion_ids[:prefix_len]), gkey)
            if key not in key_to_index:
                key_to_index[key] = len(unique)
                unique.append((t, prefix_len))
            idx.append(key_to_index[key])
        state_index.append(idx)
    return StatePlan(unique=unique, state_index=state_index, boundaries=all_boundaries)


def build_requests(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    num_rollouts: int,
    budget: Callable[[int, int], int],
) -> tuple[list[RolloutRequest], list[int | None]]:
    """One request of ``num_rollouts`` samples per unique state with budget left.

    Args:
        budget: ``(completion-prefix length, prompt length)`` -> max new tokens for a continuation from that
            state.

    Returns:
        ``(requests, request_of_state)``: ``request_of_state[u]`` is the index of unique state
        ``u``'s request, or None when the state has no budget left (it is graded directly).
    """
    requests: list[RolloutRequest] = []
    request_of_state: list[int | None] = []
    for t, prefix_len in plan.unique:
        traj = trajectories[t]
        max_tokens = budget(prefix_len, len(traj.prompt_ids))
        if max_tokens < 1:
            request_of_state.append(None)
            continue
        request_of_state.append(len(requests))
        prefix = tuple(traj.prompt_ids) + tuple(traj.completion_ids[:prefix_len])
        requests.append(RolloutRequest(prefix_ids=prefix, n=num_rollouts, max_tokens=max_tokens))
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
            out = f(
                prompts=prompts,
                completions=completions,
                completion_ids=completion_ids,
                **columns,
                **reward_kwargs,
            )
            out = list(out)
            if len(out) != len(items):
                raise RuntimeError(
                    f"reward function {getattr(f, '__name__', f)!r} returned {len(out)} rewards for "
                    f"{len(items)} completions; it must return one per completion."
                )
            per_func.append([math.nan if r is None else float(r) for r in out])
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

    def estimate(
        self, trajectories: Sequence[Trajectory], *, reward_kwargs: Mapping[str, Any] | None = None
    ) -> MCEstimate:
        """Estimate the values of every trajectory's step states and the resulting advantages.

        Args:
            trajectories: the batch of responses (all responses of a training step, so identical
                states are shared and the engine gets one large batch).
            reward_kwargs: extra keyword arguments passed to every reward function call (e.g.
                TRL's ``trainer_state``).

        Returns:
            An :class:`MCEstimate`.
        """
        start = time.perf_counter()
        trajectories = list(trajectories)
        self._validate(trajectories)
        plan = plan_states(trajectories, self.max_estimated_steps)
        requests, request_of_state = build_requests(trajectories, plan, self.num_rollouts, self.budget)

        progress = None
        if self.show_progress:
            from tqdm.auto import tqdm

            progress = tqdm(
                total=(1 if requests else 0) + len(self.reward_funcs),
                desc=f"MC values ({len(requests)} states x {self.num_rollouts})",
                unit="phase",
            )
        try:
            # 1. One sampler call for every rollout of the batch.
            t0 = time.perf_counter()
            samples: list[list[Continuation]] = []
            if requests:
                samples = self._validate_samples(requests, self.sampler.sample(requests))
                if progress is not None:
                    progress.update(1)
            sampling_seconds = time.perf_counter() - t0

            # 2. Collect what must be graded; fixed truncated rewards skip grading.
            rewards_per_state: list[list[float]] = [[] for _ in plan.unique]
            to_grade: list[tuple[Trajectory, list[int]]] = []
            slots: list[int] = []  # unique-state index of each graded item
            generated_tokens = truncated = 0
            for u, (t, prefix_len) in enumerate(plan.unique):
                traj = trajectories[t]
                prefix = list(traj.completion_ids[:prefix_len])
                r = request_of_state[u]
                if r is None:
                    # No budget left: the prefix itself is the (truncated) response.
                    if self.truncated_reward is not None:
                        rewards_per_state[u].append(self.truncated_reward)
                    else:
                        to_grade.append((traj, prefix))
                        slots.append(u)
                    continue
                for cont in samples[r]:
                    generated_tokens += len(cont.token_ids)
                    truncated += bool(cont.truncated)
                    if cont.truncated and self.truncated_reward is not None:
                        rewards_per_state[u].append(self.truncated_reward)
                    else:
                        to_grade.append((traj, prefix + list(cont.token_ids)))
                        slots.append(u)

            # 3. One call per reward function for every rollout of the batch.
            t0 = time.perf_counter()
            graded, unscorable = self._grade(to_grade, dict(reward_kwargs or {}), progress)
            grading_seconds = time.perf_counter() - t0
            for u, reward in zip(slots, graded, strict=True):
                rewards_per_state[u].append(reward)
        finally:
            if progress is not None:
                progress.close()

        # 4. Values and advantages.
        state_values = average_values(rewards_per_state)
        values: list[list[float]] = []
        step_advs: list[list[float]] = []
        token_advs: list[torch.Tensor] = []
        for t, traj in enumerate(trajectories):
            v = [state_values[u] for u in plan.state_index[t]] + [float(traj.reward)]
            a = step_advantages(v)
            capped = len(plan.boundaries[t]) < len(traj.step_boundaries)
            if capped and self.steps_after_cap == "zero":
                a[-1] = 0.0  # the merged tail (steps m..n) gets no credit, as in the official code
            values.append(v)
            step_advs.append(a)
            token_advs.append(token_advantages(a, plan.boundaries[t], len(traj.completion_ids)))

        num_states = plan.num_states
        num_unique = len(plan.unique)
        rollouts = sum(req.n for req in requests)
        stats: dict[str, float] = {
            "trajectories": float(len(trajectories)),
            "states": float(num_states),
            "unique_states": float(num_unique),
            "dedup_ratio": (1.0 - num_unique / num_states) if num_states else 0.0,
            "requests": float(len(requests)),
            "unsampled_states": float(sum(r is None for r in request_of_state)),
            "rollouts": float(rollouts),
            "generated_tokens": float(generated_tokens),
            "truncated_rollouts": float(truncated),
            "unscorable_rollouts": float(unscorable),
            "rollout_reward_mean": _mean(
                [r for u, rs in enumerate(rewards_per_state) if request_of_state[u] is not None for r in rs]
            ),
            "sampling_seconds": sampling_seconds,
            "grading_seconds": grading_seconds,
            "seconds": time.perf_counter() - start,
        }
        return MCEstimate(values=values, step_advantages=step_advs, token_advantages=token_advs, stats=stats)


def _mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan
