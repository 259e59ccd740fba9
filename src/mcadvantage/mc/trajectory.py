"""What the Monte Carlo estimator needs per response: :class:`Trajectory`, its tokens, step boundaries and reward.

The input of every stage of :mod:`mcadvantage.mc` (planning, rollouts, the free-sample pool, the estimator), so it
lives below them all. Re-exported by :mod:`mcadvantage.mc.estimator`, its public home.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Trajectory"]


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
        tool_mask: per completion token, 0 where the model did not generate it (a ``rollout_func``'s ``env_mask``:
            environment or tool tokens), 1 elsewhere; None: every token is the model's. The estimator does not read
            it (the caller places the step boundaries and zeroes those tokens' credit); a sampler that continues
            episodes receives it with the state (``RolloutRequest.origin``).
        episode: the rollout layer's record of the episode this response is (an agent episode of GRPO's tool loop,
            :class:`~mcadvantage.agents.tool_loop.Episode`), for a sampler that continues it; None elsewhere. The
            estimator does not read it.
        first_state: the first of its states (an index into the boundaries after the step budget) whose value is
            estimated; the steps before it get advantage 0 and their states' values are NaN (not estimated). 0 (the
            default): every state. A caller with a token budget (``"hybrid"``) sets it to estimate the states at
            the end of a response it cannot afford whole: the latest states are the cheapest to continue.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    step_boundaries: list[int]
    reward: float
    prompt: Any = None
    fields: dict[str, Any] = field(default_factory=dict)
    tool_mask: list[int] | None = None
    episode: Any = field(default=None, repr=False, compare=False)
    first_state: int = 0
