"""The reward of a training response cut at ``max_completion_length`` (``truncated_completion_reward``).

The official VinePPO code scored a truncated response 0 whatever it contained (a ``\\boxed{}`` answer before the
cut included). A response is truncated exactly as GRPO counts it: it is empty, or its last token is neither an
end-of-sequence token nor padding.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

__all__ = ["score_truncated_responses", "truncated_responses"]


def truncated_responses(
    completion_ids: Sequence[Sequence[int]], stop_token_ids: Collection[int | None]
) -> list[bool]:
    """Per response, whether it was cut at the length limit: empty, or its last token not in ``stop_token_ids``
    (the end-of-sequence tokens and the padding token)."""
    return [not ids or int(ids[-1]) not in stop_token_ids for ids in completion_ids]


def score_truncated_responses(
    rewards_per_func: torch.Tensor, truncated: torch.Tensor, value: float
) -> torch.Tensor:
    """``rewards_per_func`` (responses x reward functions) with every reward of a truncated response set to
    ``value``, on every reward function. The input is not modified.

    Args:
        rewards_per_func: ``(N, F)`` rewards, one row per response.
        truncated: ``(N,)`` booleans (:func:`truncated_responses`, over the same responses as the rows).
        value: the reward a truncated response gets (``truncated_completion_reward``).
    """
    scored = rewards_per_func.clone()
    scored[truncated] = float(value)
    return scored
