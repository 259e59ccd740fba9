"""The Monte Carlo estimator's I/O (stages 2-4 of :meth:`~mcadvantage.mc.estimator.MCValueEstimator.estimate`):
rollout requests, one sampler call per wave, one call per reward function, and the values they give.

:func:`rollout_token_budget` says how many tokens a continuation from a state may add; :func:`build_requests` turns
every unique state with budget left into one :class:`~mcadvantage.samplers.RolloutRequest`;
:func:`run_wave` sends them all in ONE ``sampler.sample`` call (:func:`validate_samples` checks the answer)
and grades every rollout with :func:`grade_rollouts`, one call per reward function (TRL signature), on the full
response text ``decode(prefix ids + continuation ids)``, and returns a :class:`Wave`: the samples and what they
cost (an :class:`~mcadvantage.mc.stats.MCStats`); :func:`average_values` gives each state its value (the paper's
scheme, without free samples). What samples and grades comes as one :class:`RolloutIO`. Each step takes and returns
data; the estimator calls them in order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mcadvantage._moved import warn_old_spelling
from mcadvantage.core.settings import MCSettings
from mcadvantage.core.text import decode_batch, is_conversational
from mcadvantage.mc.planning import StatePlan
from mcadvantage.mc.stats import MCStats
from mcadvantage.mc.trajectory import Trajectory
from mcadvantage.rewards.errors import call_reward_func
from mcadvantage.samplers.base import Continuation, RolloutRequest, Sampler

__all__ = [
    "RewardFunc",
    "RolloutIO",
    "Wave",
    "average_values",
    "build_requests",
    "grade_rollouts",
    "rollout_token_budget",
    "run_wave",
    "validate_samples",
]

RewardFunc = Callable[..., Sequence[float | None]]


def __getattr__(name: str) -> Any:
    # 0.1's name of a wave's record, which is the estimate's record (MCStats) since they were made one.
    if name == "WaveCounts":
        warn_old_spelling("mcadvantage.mc.rollouts.WaveCounts", "mcadvantage.mc.stats.MCStats")
        return MCStats
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class RolloutIO:
    """What a wave samples with and grades by, the same for every wave of one estimate.

    Attributes:
        sampler: draws the continuations (:class:`~mcadvantage.samplers.Sampler`).
        tokenizer: decodes ``prefix ids + continuation ids`` into the graded text.
        reward_funcs: the reward functions (TRL signature), called once each per wave.
        reward_weights: one weight per reward function; rewards combine as a weighted sum that skips None/NaN.
        truncated_reward: replaces the grade of a truncated continuation
            (:attr:`~mcadvantage.core.settings.MCSettings.truncated_reward`); None: graded like any other.
        reward_kwargs: extra keyword arguments for every reward call (e.g. TRL's ``trainer_state``).
        progress: a tqdm-like bar advanced once per sampler call and once per reward call, or None.
    """

    sampler: Sampler
    tokenizer: Any
    reward_funcs: Sequence[RewardFunc]
    reward_weights: Sequence[float]
    truncated_reward: float | None = None
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)
    progress: Any = None


@dataclass
class Wave:
    """One wave's samples and their counts.

    Attributes:
        samples: per unique state, its samples as ``(completion ids, reward)``: the full response (the state's
            prefix plus the continuation), or the prefix alone for an unsampled no-budget state.
        counts: what the wave cost (an :class:`~mcadvantage.mc.stats.MCStats` of the wave alone).
    """

    samples: list[list[tuple[list[int], float]]]
    counts: MCStats


def rollout_token_budget(
    settings: MCSettings,
    prefix_len: int,
    prompt_len: int | None,
    *,
    max_completion_length: int | None,
    context_length: int | None,
) -> int:
    """Max new tokens for a continuation from a state with ``prefix_len`` completion tokens after a
    ``prompt_len``-token prompt: ``max_completion_length - prefix_len`` (``rollout_budget="remaining"``) or
    ``fixed_rollout_budget`` (``"fixed"``), capped so prompt + prefix + continuation fit in ``context_length``
    (no cap when either is None). Below 1: the state is not sampled."""
    if settings.rollout_budget == "fixed":
        tokens = int(settings.fixed_rollout_budget)  # type: ignore[arg-type]
    else:
        tokens = int(max_completion_length) - prefix_len  # type: ignore[arg-type]
    if context_length is not None and prompt_len is not None:
        tokens = min(tokens, context_length - prompt_len - prefix_len)
    return tokens


def build_requests(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    num_rollouts: int | Sequence[int],
    budgets: Sequence[int] | Callable[[int, int], int],
) -> tuple[list[RolloutRequest], list[int | None]]:
    """One request of ``num_rollouts`` samples per unique state with budget left.

    Args:
        num_rollouts: samples per state, one number for all or one per unique state (0: no request).
        budgets: per unique state, the max new tokens of a continuation from it (:func:`rollout_token_budget`); or,
            as in 0.1, a function ``(completion-prefix length, prompt length) -> max new tokens``.

    Returns:
        ``(requests, request_of_state)``: ``request_of_state[u]`` is the index of unique state
        ``u``'s request, or None when the state has no budget left (it is graded directly) or asks for no
        sample.
    """
    requests: list[RolloutRequest] = []
    request_of_state: list[int | None] = []
    if callable(budgets):  # 0.1's spelling
        warn_old_spelling(
            "build_requests(..., budgets=<function (prefix_len, prompt_len) -> tokens>)",
            "build_requests(..., budgets=[one token budget per unique state, e.g. rollout_token_budget(...)])",
        )
        budget_of = budgets
        budgets = [budget_of(prefix_len, len(trajectories[t].prompt_ids)) for t, prefix_len in plan.unique]
    for u, (t, prefix_len) in enumerate(plan.unique):
        traj = trajectories[t]
        max_tokens = int(budgets[u])
        n = num_rollouts if isinstance(num_rollouts, int) else int(num_rollouts[u])
        if max_tokens < 1 or n < 1:
            request_of_state.append(None)
            continue
        request_of_state.append(len(requests))
        prefix = tuple(traj.prompt_ids) + tuple(traj.completion_ids[:prefix_len])
        requests.append(
            RolloutRequest(prefix_ids=prefix, n=n, max_tokens=max_tokens, origin=(traj, prefix_len))
        )
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


def validate_samples(requests: Sequence[RolloutRequest], samples: Any) -> list[list[Continuation]]:
    """Check a sampler's answer to ``requests``: one list of exactly ``n`` continuations per request, each within
    its ``max_tokens``; raise a RuntimeError naming the request otherwise."""
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


def _graded_completions(
    items: list[tuple[Trajectory, list[int]]], io: RolloutIO, given: Sequence[Any] | None
) -> list[Any]:
    """The completions the reward functions get: ``given[j]`` where a sampler set one (an agent continuation's
    conversation), else the decoded ids (a message list for a conversational prompt)."""
    given = list(given) if given is not None else [None] * len(items)
    todo = [j for j, g in enumerate(given) if g is None]
    # Decode the concatenated ids (not prefix text + continuation text) so a character split
    # across the prefix/continuation boundary (multi-token UTF-8) decodes correctly.
    texts = decode_batch(io.tokenizer, [items[j][1] for j in todo]) if todo else []
    for j, text in zip(todo, texts, strict=True):
        traj = items[j][0]
        given[j] = [{"role": "assistant", "content": text}] if is_conversational(traj.prompt) else text
    return given


def grade_rollouts(
    items: list[tuple[Trajectory, list[int]]], io: RolloutIO, completions: Sequence[Any] | None = None
) -> tuple[list[float], int]:
    """Grade full responses ``(trajectory, completion ids)`` with every reward function of ``io``, one call
    per function for the whole batch (``completions``: per item, the completion as graded, or None to decode its
    ids). Returns the combined rewards and the unscorable count."""
    if not items:
        return [], 0
    keys: list[str] = []
    for traj, _ in items:
        keys.extend(k for k in traj.fields if k not in keys)
    arguments = dict(
        prompts=[traj.prompt for traj, _ in items],
        completions=_graded_completions(items, io, completions),
        completion_ids=[ids for _, ids in items],
        **{k: [traj.fields.get(k) for traj, _ in items] for k in keys},
        **io.reward_kwargs,
    )
    per_func: list[list[float]] = []
    for f in io.reward_funcs:
        # Raising, or returning inf, is a RewardFunctionError naming the function and the rollout: one infinite
        # rollout would make its state's value infinite and every whitened advantage NaN.
        name = getattr(f, "__name__", None) or type(f).__name__
        out = call_reward_func(f, name, arguments, where="Monte Carlo rollouts")
        if len(out) != len(items):
            raise RuntimeError(
                f"reward function {getattr(f, '__name__', f)!r} returned {len(out)} rewards for "
                f"{len(items)} completions; it must return one per completion."
            )
        per_func.append(out)
        if io.progress is not None:
            io.progress.update(1)
    rewards: list[float] = []
    unscorable = 0
    for j in range(len(items)):
        total, all_nan = _nansum_weighted([pf[j] for pf in per_func], io.reward_weights)
        unscorable += all_nan
        rewards.append(total)
    return rewards, unscorable


def _draw(requests: list[RolloutRequest], io: RolloutIO, tally: MCStats) -> list[list[Continuation]]:
    """ONE sampler call for the wave's requests, checked (:func:`validate_samples`) and timed."""
    t0 = time.perf_counter()
    samples = validate_samples(requests, io.sampler.sample(requests)) if requests else []
    tally.sampling_seconds = time.perf_counter() - t0
    if io.progress is not None:
        io.progress.update(1)
    return samples


def _count(tally: MCStats, cont: Continuation) -> None:
    """Add one continuation's cost to the wave's record: tokens the engine sampled (an agent continuation's
    tool results apart, with its tool calls and dropped rounds)."""
    tally.rollouts += 1
    tally.truncated_rollouts += bool(cont.truncated)
    if cont.tool_mask is None:
        tally.generated_tokens += len(cont.token_ids)
        return
    sampled = sum(cont.tool_mask)
    tally.generated_tokens += sampled
    tally.tool_result_tokens = (tally.tool_result_tokens or 0) + len(cont.token_ids) - sampled
    tally.tool_calls = (tally.tool_calls or 0) + cont.tool_calls
    tally.dropped_tool_results = (tally.dropped_tool_results or 0) + cont.dropped_tool_results


@dataclass
class _ToGrade:
    """What a wave sends to the reward functions: per item, who it is graded as, its ids, its completion (None:
    decode the ids) and the unique state it is a sample of."""

    items: list[tuple[Trajectory, list[int]]] = field(default_factory=list)
    completions: list[Any] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)

    def add(self, traj: Trajectory, ids: list[int], u: int, completion: Any = None) -> None:
        self.items.append((traj, ids))
        self.completions.append(completion)
        self.slots.append(u)


def run_wave(
    trajectories: Sequence[Trajectory],
    plan: StatePlan,
    counts: Sequence[int],
    budgets: Sequence[int],
    io: RolloutIO,
    *,
    grade_unsampled: bool,
) -> Wave:
    """One wave: ``counts[u]`` continuations from every unique state ``u`` with budget left (``budgets[u] >= 1``,
    :func:`rollout_token_budget`), in ONE call to ``io.sampler``, graded in one call per reward function
    (:func:`grade_rollouts`). With ``grade_unsampled``, states without budget are graded as their own (truncated)
    prefix. ``io.truncated_reward`` replaces the grade of a truncated continuation. Returns the samples per state
    and what the wave cost."""
    truncated_reward = io.truncated_reward
    tally = MCStats()
    requests, request_of_state = build_requests(trajectories, plan, counts, budgets)
    samples = _draw(requests, io, tally)
    out: list[list[tuple[list[int], float]]] = [[] for _ in plan.unique]
    grading = _ToGrade()
    for u, (t, prefix_len) in enumerate(plan.unique):
        traj = trajectories[t]
        prefix = list(traj.completion_ids[:prefix_len])
        r = request_of_state[u]
        if r is None:
            if grade_unsampled and budgets[u] < 1:
                # No budget left: the prefix itself is the (truncated) response.
                tally.unsampled_states += 1
                if truncated_reward is not None:
                    out[u].append((prefix, truncated_reward))
                else:
                    grading.add(traj, prefix, u)
            continue
        for cont in samples[r]:
            _count(tally, cont)
            ids = prefix + list(cont.token_ids)
            if cont.truncated and truncated_reward is not None:
                out[u].append((ids, truncated_reward))
                tally.rollout_rewards.append(truncated_reward)
            else:
                # A continuation's own fields (a continuation_func's extra outputs, an agent continuation's
                # environment) go over the state's row fields.
                graded_as = replace(traj, fields={**traj.fields, **cont.fields}) if cont.fields else traj
                grading.add(graded_as, ids, u, cont.completion)
    tally.requests = len(requests)
    t0 = time.perf_counter()
    graded, tally.unscorable_rollouts = grade_rollouts(grading.items, io, grading.completions)
    tally.grading_seconds = time.perf_counter() - t0
    for u, (_, ids), reward in zip(grading.slots, grading.items, graded, strict=True):
        out[u].append((ids, reward))
        if request_of_state[u] is not None:
            tally.rollout_rewards.append(reward)
    return Wave(samples=out, counts=tally)
