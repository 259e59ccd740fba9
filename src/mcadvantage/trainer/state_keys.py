"""The state keys of a batch's agent episodes, before each model turn (``AdvantageBatch.turn_keys``), from what the
rollout layer has: keys recorded during GRPO's tool loop, a ``rollout_func``'s ``turn_keys`` field, or the
observation (the tool results before the turn) when there is no environment object. No TRL internals here: the
trainer's compatibility module records the keys and says which source a batch has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from mcadvantage.estimators.anchor import ROLLOUT_KEYS_FIELD, observation_keys, recorded_turn_keys, turn_spans
from mcadvantage.estimators.batch import AdvantageBatch

__all__ = ["KeySource", "batch_turn_keys"]

#: Where a batch's keys come from: ``"recorded"`` (``environment_factory=``: read during GRPO's tool loop),
#: ``"rollout_func"`` (its ``turn_keys`` field), ``"observation"`` (``tools=`` alone: no environment object).
KeySource = Literal["recorded", "rollout_func", "observation"]


def batch_turn_keys(
    batch: AdvantageBatch, source: KeySource, state_log: Sequence[Sequence[Any]] | None = None
) -> list[list[Any]]:
    """Per local episode, its state key before each model turn.

    Args:
        batch: the batch (``tool_mask`` set: a multi-turn batch).
        source: where the keys come from (:data:`KeySource`).
        state_log: with ``"recorded"``: per generation call of GRPO, every local episode's key at that moment.

    Raises:
        ValueError: a ``rollout_func`` batch without the ``turn_keys`` field, naming the fix.
    """
    assert batch.tool_mask is not None
    masks = batch.tool_mask.cpu().tolist()
    if source == "rollout_func":
        missing = [i for i, row in enumerate(batch.rows) if ROLLOUT_KEYS_FIELD not in row]
        if missing:
            raise ValueError(
                f"advantage_estimator='anchor' with anchor_state='state_key': rollout_func returned no "
                f"{ROLLOUT_KEYS_FIELD!r} field (local rows {missing[:5]}). Return, beside prompt_ids / "
                f"completion_ids / logprobs, {ROLLOUT_KEYS_FIELD!r}: one list per completion holding the "
                "environment's state key (any hashable) before each model turn (each run of env_mask 1); or set "
                "anchor_state='observation' to key turns by the environment's tokens before them."
            )
        return [list(row[ROLLOUT_KEYS_FIELD]) for row in batch.rows]
    if source == "observation":
        return [
            observation_keys(batch.prompt_ids[r], ids, masks[r]) for r, ids in enumerate(batch.completion_ids)
        ]
    counts = [len(turn_spans(masks[r], len(ids))) for r, ids in enumerate(batch.completion_ids)]
    return recorded_turn_keys(state_log or [], counts)
