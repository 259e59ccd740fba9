"""The state keys of a batch's agent episodes: before each model turn (``AdvantageBatch.turn_keys``, for credit by
state, :mod:`mcadvantage.estimators.anchor`) from keys recorded during GRPO's tool loop, a ``rollout_func``'s
``turn_keys`` field, or the observation (the tool results before the turn) when there is no environment object; and
after each tool round (``Episode.state_keys``, what every rebuild of an episode's environment is checked against)
from the same recorded keys. No TRL internals here: :class:`~mcadvantage.agents.trainer_episodes.TrainerEpisodes`
records the keys during the trainer's generation and says which source a batch has."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal, Protocol

from mcadvantage.agents.env_checks import read_state_key
from mcadvantage.agents.rebuild import NOT_RECORDED
from mcadvantage.agents.turns import turn_spans

__all__ = [
    "ROLLOUT_KEYS_FIELD",
    "KeySource",
    "TurnBatch",
    "batch_turn_keys",
    "episode_round_keys",
    "observation_keys",
    "recorded_turn_keys",
    "state_key_snapshot",
]

#: The extra field of a ``rollout_func``'s output holding each completion's per-turn state keys.
ROLLOUT_KEYS_FIELD = "turn_keys"

#: Where a batch's keys come from: ``"recorded"`` (``environment_factory=``: read during GRPO's tool loop),
#: ``"rollout_func"`` (its ``turn_keys`` field), ``"observation"`` (``tools=`` alone: no environment object).
KeySource = Literal["recorded", "rollout_func", "observation"]


class TurnBatch(Protocol):
    """What the keys of a batch are read from: the fields of an :class:`~mcadvantage.estimators.batch.AdvantageBatch`
    used here (the local episodes' prompt and completion ids, their rows, and TRL's tool mask)."""

    prompt_ids: Sequence[Sequence[int]]
    completion_ids: Sequence[Sequence[int]]
    rows: Sequence[Mapping[str, Any]]
    tool_mask: Any


def batch_turn_keys(
    batch: TurnBatch, source: KeySource, state_log: Sequence[Sequence[Any]] | None = None
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


def episode_round_keys(
    snapshots: Sequence[Sequence[Any]], episode: int, rounds: int, final: Any = NOT_RECORDED
) -> dict[int, Any]:
    """``{r: key}``: local episode ``episode``'s environment ``state_key`` after ``r`` of its ``rounds`` recorded
    tool rounds (0: right after ``reset``), for ``Episode.state_keys``, so a rebuild to any of its states is checked
    after every replayed round.

    ``snapshots[t][episode]`` is its key at GRPO's ``t``-th generation call of the batch (call 0: the first turn,
    after ``reset``; call ``t``: after the tool loop's ``t``-th round of results). An episode takes part in calls
    ``0 .. rounds``: its turn after its last recorded round was generated at call ``rounds``, before GRPO ran any
    later round it then dropped for the token budget (those calls ran, but no replay runs them). So snapshot ``r``
    holds its key after ``r`` rounds for every ``r <= rounds``; later snapshots (a dropped round, or an episode that
    left the loop) are not its rounds and are never used.

    Args:
        snapshots: the keys recorded per generation call (empty when none were: GRPO's generation replaced from
            outside); an environment without ``state_key`` reads ``NOT_RECORDED`` and its keys are left out.
        episode: the episode's index in the local batch.
        rounds: its recorded tool rounds (``len(recorded_tool_turns(messages))``).
        final: the key its environment ended with, ``NOT_RECORDED`` when unknown or when its last round was dropped
            for the budget: the key after ``rounds`` rounds when no snapshot holds it.
    """
    keys = {} if final is NOT_RECORDED else {rounds: final}
    for r in range(min(rounds + 1, len(snapshots))):
        key = snapshots[r][episode]
        if key is not NOT_RECORDED:
            keys[r] = key
    return keys


def state_key_snapshot(environments: Sequence[Any], *, for_credit: bool) -> list[Any]:
    """Every local episode's environment ``state_key`` now (:func:`~mcadvantage.agents.env_checks.read_state_key`:
    ``NOT_RECORDED`` for a class without one; a key that raises is an error under every estimator, naming the
    class and the exception).

    Args:
        for_credit: the keys are ``"anchor"``'s credit by state, which needs every one.

    Raises:
        AttributeError: ``for_credit`` and an environment without ``state_key``, naming the episode and the fix.
    """
    keys = [read_state_key(environment, f"local episode {i}") for i, environment in enumerate(environments)]
    missing = [i for i, key in enumerate(keys) if key is NOT_RECORDED]
    if for_credit and missing:
        i = missing[0]
        raise AttributeError(
            f"reading state_key of the environment of local episode {i} ({type(environments[i]).__name__}) "
            "failed: it has none. advantage_estimator='anchor' with anchor_state='state_key' reads a read-only "
            "property state_key before each model turn; add it, or set anchor_state='observation'."
        )
    return keys


def observation_keys(
    prompt_ids: Sequence[int], completion_ids: Sequence[int], tool_mask: Sequence[int] | None
) -> list[Hashable]:
    """One episode's keys under ``anchor_state="observation"``: the first turn's is the prompt (with any tokens
    before the first model token), each later turn's the tokens between the previous model turn and it (the tool
    results as GRPO appended them)."""
    keys: list[Hashable] = []
    end = 0
    for t, (start, stop) in enumerate(turn_spans(tool_mask, len(completion_ids))):
        seen = tuple(completion_ids[end:start])
        keys.append(("prompt", tuple(prompt_ids), seen) if t == 0 else seen)
        end = stop
    return keys


def recorded_turn_keys(
    snapshots: Sequence[Sequence[Hashable]], turn_counts: Sequence[int], source: str = "state_key"
) -> list[list[Hashable]]:
    """Per episode, the keys of its turns from the keys recorded during the tool loop: ``snapshots[t][i]`` is
    episode ``i``'s key at the loop's ``t``-th generation call (an episode takes part in calls ``0 .. n_i - 1``
    and then leaves the loop for good), ``turn_counts[i]`` its number of model turns.

    Raises:
        ValueError: an episode with more turns than recorded calls (the recording missed a generation).
    """
    out = []
    for i, n in enumerate(turn_counts):
        if n > len(snapshots):
            raise ValueError(
                f"anchor credit: episode {i} has {n} model turns but {source} was recorded at {len(snapshots)} "
                "generation calls of the tool loop; the recording missed a turn (was the batch generated outside "
                "VinePPOTrainer's tool loop?). Set anchor_state='observation' to key turns by their tool results."
            )
        out.append([snapshots[t][i] for t in range(n)])
    return out
