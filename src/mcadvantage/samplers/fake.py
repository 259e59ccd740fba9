"""A toy policy with exactly known state values, for testing estimators and training code.

:class:`FakeSampler` implements the :class:`~mcadvantage.samplers.Sampler` protocol without a model:
from a prefix, every continuation is ``num_filler_tokens`` filler tokens, then a success token with
probability ``p(prefix)`` (a failure token otherwise), then EOS. Graded by :class:`OutcomeReward`
(reward 1 when the response text ends with the success text), the true value of a state is exactly
``p(prefix)`` (when the budget fits the whole continuation), so Monte Carlo estimates can be checked
against the truth: with ``K`` rollouts the estimate is ``Binomial(K, p) / K``, unbiased with
variance ``p (1 - p) / K``.

Every call records its requests in :attr:`FakeSampler.calls`, so tests can assert what an estimator
asked for.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from .base import Continuation, RolloutRequest

__all__ = ["FakeSampler", "OutcomeReward"]


class FakeSampler:
    """Seeded toy sampler whose success probability is a known function of the prefix.

    Args:
        success_prob: ``p`` as a constant, or a function ``prefix_ids -> p`` (e.g. read a digit
            token encoded in the prefix).
        success_token_id: the token emitted on success.
        failure_token_id: the token emitted on failure.
        eos_token_id: appended after the outcome token (None: no EOS, continuations then end
            without one and are never marked truncated unless cut by the budget).
        filler_token_id: token emitted ``num_filler_tokens`` times before the outcome (to make
            continuations long enough to test budgets and truncation).
        num_filler_tokens: how many filler tokens precede the outcome.
        seed: seed of the private ``random.Random``; every continuation is a fresh draw from it,
            so continuations are independent and a sampler rebuilt with the same seed reproduces
            the same draws for the same calls.
    """

    def __init__(
        self,
        success_prob: float | Callable[[tuple[int, ...]], float],
        *,
        success_token_id: int,
        failure_token_id: int,
        eos_token_id: int | None = None,
        filler_token_id: int | None = None,
        num_filler_tokens: int = 0,
        seed: int = 0,
    ) -> None:
        if num_filler_tokens < 0:
            raise ValueError(f"num_filler_tokens={num_filler_tokens!r} must be >= 0.")
        if num_filler_tokens > 0 and filler_token_id is None:
            raise ValueError(
                f"num_filler_tokens={num_filler_tokens} needs a filler_token_id; pass the token to repeat."
            )
        self._prob = success_prob if callable(success_prob) else (lambda _prefix, p=float(success_prob): p)
        self.success_token_id = success_token_id
        self.failure_token_id = failure_token_id
        self.eos_token_id = eos_token_id
        self.filler_token_id = filler_token_id
        self.num_filler_tokens = num_filler_tokens
        self.rng = random.Random(seed)
        self.calls: list[list[RolloutRequest]] = []

    def success_prob(self, prefix_ids: Sequence[int]) -> float:
        """The true probability that a continuation of ``prefix_ids`` emits the success token."""
        p = float(self._prob(tuple(prefix_ids)))
        if not 0.0 <= p <= 1.0:
            raise ValueError(
                f"success_prob returned {p!r} for prefix {tuple(prefix_ids)!r}; it must be in [0, 1]."
            )
        return p

    @property
    def continuation_length(self) -> int:
        """Tokens in a full (untruncated) continuation."""
        return self.num_filler_tokens + 1 + (self.eos_token_id is not None)

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``n`` independent continuations per request, each cut at the request's ``max_tokens``."""
        self.calls.append(list(requests))
        out: list[list[Continuation]] = []
        for req in requests:
            p = self.success_prob(req.prefix_ids)
            conts = []
            for _ in range(req.n):
                outcome = self.success_token_id if self.rng.random() < p else self.failure_token_id
                tokens: list[Any] = [self.filler_token_id] * self.num_filler_tokens + [outcome]
                if self.eos_token_id is not None:
                    tokens.append(self.eos_token_id)
                cut = len(tokens) > req.max_tokens
                conts.append(Continuation(token_ids=tuple(tokens[: req.max_tokens]), truncated=cut))
            out.append(conts)
        return out


class OutcomeReward:
    """TRL-style reward function: 1.0 when the completion text ends with ``success_text``, else 0.0.

    Accepts standard (string) and conversational (``[{"role": "assistant", "content": ...}]``)
    completions and ignores every other keyword argument. ``calls`` records the keyword arguments
    of each call so tests can check what the reward function received.
    """

    def __init__(self, success_text: str, name: str = "outcome_reward") -> None:
        self.success_text = success_text
        self.__name__ = name
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), **kwargs: Any) -> list[float]:
        self.calls.append({"prompts": prompts, "completions": completions, **kwargs})
        rewards = []
        for c in completions:
            text = c[-1]["content"] if isinstance(c, list) else c
            rewards.append(1.0 if text.endswith(self.success_text) else 0.0)
        return rewards
