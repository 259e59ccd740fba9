"""The sampler protocol: the only thing the Monte Carlo estimator needs from an inference engine.

A sampler receives rollout requests ``(prefix_ids, n, max_tokens)`` and returns, for every request,
``n`` independent continuations sampled from the *current* policy with the training sampling
settings. Engines (transformers ``generate``, a colocated ``vllm.LLM``, a vLLM server) live behind
this protocol so the estimator stays engine-agnostic and testable with a fake sampler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class RolloutRequest:
    """Sample ``n`` continuations of ``prefix_ids`` with at most ``max_tokens`` new tokens each.

    ``prefix_ids`` is the full model input: prompt token ids followed by the completion prefix. ``origin`` says
    which state asked, for samplers that continue from more than tokens (a ``continuation_func``,
    :mod:`mcadvantage.trainer.continuation`): the Monte Carlo estimator sets it to ``(trajectory, prefix_len)``,
    the :class:`~mcadvantage.mc.trajectory.Trajectory` and the length of its completion prefix; None elsewhere.
    Engines ignore it; it takes no part in equality.
    """

    prefix_ids: tuple[int, ...]
    n: int
    max_tokens: int
    origin: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"RolloutRequest.n must be >= 1, got {self.n}.")
        if self.max_tokens < 1:
            raise ValueError(
                f"RolloutRequest.max_tokens must be >= 1, got {self.max_tokens}: a state with no "
                "token budget left must not be sampled (the caller should grade it directly)."
            )
        if len(self.prefix_ids) == 0:
            raise ValueError("RolloutRequest.prefix_ids is empty: a prefix needs at least one token.")


@dataclass(frozen=True)
class Continuation:
    """One sampled continuation.

    ``token_ids`` are the generated tokens, including the EOS token when one was generated and
    excluding any padding. ``truncated`` is True when generation stopped because the budget
    (``max_tokens``) ran out rather than at EOS. ``fields``: extra keyword arguments for the reward functions that
    grade this continuation (what a ``continuation_func`` returned besides its tokens, as ``rollout_func``'s extra
    fields reach them; an agent continuation's ``environments``), over the state's own row fields; engines leave it
    empty.

    A sampler that continues agent episodes (:class:`~mcadvantage.agents.episode_sampler.EpisodeSampler`) also sets:
    ``completion``, the response from its start as reward functions take it (the conversation's messages; None:
    the estimator decodes the tokens); ``tool_mask``, 0 on the tokens the model did not sample (tool results),
    which count as ``tool_result_tokens`` rather than ``generated_tokens``; ``tool_calls``, the tool executions
    it ran (its environment's rebuild included); ``dropped_tool_results``, 1 when its last tool round's results
    were dropped for the budget.
    """

    token_ids: tuple[int, ...]
    truncated: bool
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False)
    completion: Any = field(default=None, compare=False)
    tool_mask: tuple[int, ...] | None = field(default=None, compare=False)
    tool_calls: int = field(default=0, compare=False)
    dropped_tool_results: int = field(default=0, compare=False)


@runtime_checkable
class Sampler(Protocol):
    """Anything that turns rollout requests into continuations.

    Implementations must return ``len(requests)`` lists, the i-th holding exactly
    ``requests[i].n`` continuations, each an independent sample (no seed shared across requests).
    """

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """Return, for every request in order, exactly ``request.n`` continuations of ``request.prefix_ids``,
        each at most ``request.max_tokens`` tokens long."""
        ...
