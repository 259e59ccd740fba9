"""Anchor-state turn credit from the episodes already drawn (GiGPO's step groups), as pure functions on lists.

Episodes of one prompt often pass through the same environment state (a game board, a web page, a tool's state).
Grouping, across episodes, the turns that start from an identical state (an *anchor state*) and comparing their
returns gives per-turn credit at zero extra rollouts (Feng et al., 2025, "Group-in-Group Policy Optimization").

Inputs, for ``N`` episodes with ``n_i`` model turns each:

- ``keys[i][t]``: the state key before episode ``i``'s model turn ``t`` (any hashable);
- ``scopes[i]``: which episodes may share a step group (the prompt group's index for GiGPO's ``"group"`` scope, one
  constant for ``"batch"``);
- ``turn_rewards[i][t]``: the reward received after turn ``t`` (with one final reward: 0 except the last turn).

The two credits (:func:`anchor_step_advantages`, :func:`pooled_anchor_advantages`):

- *normalised* (GiGPO's step advantage): ``G(i,t)`` is the discounted return from turn ``t``; the step group of turn
  ``(i, t)`` is every turn ``(j, t')`` in the same scope with the same key (the turn index is not compared);
  ``A_step(i,t) = (G(i,t) - mean) / (std + eps)`` over the step group (no division when ``scale=False``), 0 for a
  step group of one turn.
- *pooled*: ``V(s)``, the mean return of the step group of ``s``, is a value estimated from the batch, and
  ``A(i,t) = r(i,t) + gamma * V(s(i,t+1)) - V(s(i,t))`` with ``V`` after the last turn 0 (with one final reward and
  ``gamma = 1``: ``V(s(i,t+1)) - V(s(i,t))``, the last ``V`` being the reward). Where keys stop recurring each later
  state is a singleton whose ``V`` is the episode's own return, so those turns get 0 and the credit lands on the
  turn where the episodes diverged.

An unscorable episode (its return NaN) is left out of every group's statistics and its turns get 0.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

__all__ = [
    "AnchorStats",
    "anchor_step_advantages",
    "anchor_stats",
    "check_state_keys",
    "pooled_anchor_advantages",
    "step_groups",
    "turn_returns",
]

Turn = tuple[int, int]  # (episode, turn)


def check_state_keys(keys: Sequence[Sequence[Any]], source: str = "state_key") -> None:
    """Refuse unhashable state keys with the fix (a key must identify a state: hashable and compared by value).

    Raises:
        TypeError: naming the episode, the turn, the key's type and the fix.
    """
    for i, episode in enumerate(keys):
        for t, key in enumerate(episode):
            try:
                hash(key)
            except TypeError as err:
                raise TypeError(
                    f"anchor credit: the state key of episode {i}, turn {t} (from {source}) is a "
                    f"{type(key).__name__}, which is unhashable ({err}). A state key must be hashable and compare by "
                    "value: return a tuple, a string or an int (e.g. tuple(board) instead of a list)."
                ) from None


def turn_returns(turn_rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Discounted returns ``G_t = r_t + gamma * G_{t+1}`` of one episode's turns (``G`` after the last turn: 0)."""
    returns = [0.0] * len(turn_rewards)
    running = 0.0
    for t in range(len(turn_rewards) - 1, -1, -1):
        running = float(turn_rewards[t]) + gamma * running
        returns[t] = running
    return returns


def step_groups(keys: Sequence[Sequence[Hashable]], scopes: Sequence[Hashable]) -> dict[Any, list[Turn]]:
    """Turns grouped by ``(scope, key)``: each step group's ``(episode, turn)`` members, in batch order."""
    if len(keys) != len(scopes):
        raise ValueError(f"step_groups: {len(keys)} episodes of keys but {len(scopes)} scopes.")
    groups: dict[Any, list[Turn]] = {}
    for i, episode in enumerate(keys):
        for t, key in enumerate(episode):
            groups.setdefault((scopes[i], key), []).append((i, t))
    return groups


def _group_moments(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, Bessel-corrected std (NaN below two values) and count of the finite ``values``."""
    finite = [v for v in values if not math.isnan(v)]
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    mean = math.fsum(finite) / n
    if n < 2:
        return mean, math.nan, n
    var = math.fsum((v - mean) ** 2 for v in finite) / (n - 1)
    return mean, math.sqrt(var), n


def _returns(turn_rewards: Sequence[Sequence[float]], gamma: float) -> list[list[float]]:
    return [turn_returns(episode, gamma) for episode in turn_rewards]


def _check_shapes(keys: Sequence[Sequence[Any]], turn_rewards: Sequence[Sequence[float]]) -> None:
    if len(keys) != len(turn_rewards) or any(
        len(k) != len(r) for k, r in zip(keys, turn_rewards, strict=False)
    ):
        raise ValueError(
            "anchor credit: keys and turn_rewards must give one entry per model turn of every episode "
            f"(turns per episode: keys {[len(k) for k in keys]}, rewards {[len(r) for r in turn_rewards]})."
        )


def anchor_step_advantages(
    keys: Sequence[Sequence[Hashable]],
    turn_rewards: Sequence[Sequence[float]],
    scopes: Sequence[Hashable],
    *,
    gamma: float = 1.0,
    scale: bool = True,
    eps: float = 1e-4,
) -> list[list[float]]:
    """GiGPO's step advantage of every turn: the turn's return normalised within its step group.

    Args:
        keys: per episode, the state key before each model turn.
        turn_rewards: per episode, the reward after each model turn (NaN anywhere: the episode is unscorable).
        scopes: per episode, its scope (prompt group); only turns of one scope share a step group.
        gamma: the discount of the turn returns.
        scale: divide by the step group's std + ``eps`` (GRPO's ``scale_rewards`` other than ``"none"``).
        eps: added to the std, as GRPO's.

    Returns:
        per episode, per turn, ``A_step(i,t)`` (0 for a singleton step group or an unscorable episode).
    """
    _check_shapes(keys, turn_rewards)
    returns = _returns(turn_rewards, gamma)
    out = [[0.0] * len(episode) for episode in keys]
    for members in step_groups(keys, scopes).values():
        mean, std, count = _group_moments([returns[i][t] for i, t in members])
        if count < 2:
            continue
        for i, t in members:
            g = returns[i][t]
            if not math.isnan(g):
                out[i][t] = (g - mean) / (std + eps) if scale else g - mean
    return out


def pooled_anchor_advantages(
    keys: Sequence[Sequence[Hashable]],
    turn_rewards: Sequence[Sequence[float]],
    scopes: Sequence[Hashable],
    *,
    gamma: float = 1.0,
) -> tuple[list[list[float]], list[list[float]]]:
    """The pooled variant: step groups' mean returns as batch values ``V(s)``, and TD advantages from them.

    Returns:
        ``(advantages, values)``: per episode, per turn, ``A(i,t) = r(i,t) + gamma * V(s(i,t+1)) - V(s(i,t))``
        (``V`` after the last turn: 0), and ``values[i]`` = ``[V(s(i,0)), ..., V(s(i,n-1)), G]`` with ``G`` the
        episode's return from its last turn (its reward, with one final reward). Unscorable episodes: all 0.
    """
    _check_shapes(keys, turn_rewards)
    returns = _returns(turn_rewards, gamma)
    value_of: dict[Any, float] = {}
    for group, members in step_groups(keys, scopes).items():
        value_of[group] = _group_moments([returns[i][t] for i, t in members])[0]
    advantages: list[list[float]] = []
    values: list[list[float]] = []
    for i, episode in enumerate(keys):
        if any(math.isnan(g) for g in returns[i]):
            advantages.append([0.0] * len(episode))
            values.append([0.0] * (len(episode) + 1))
            continue
        v = [value_of[(scopes[i], key)] for key in episode]
        nxt = v[1:] + [0.0]
        advantages.append([float(turn_rewards[i][t]) + gamma * nxt[t] - v[t] for t in range(len(episode))])
        values.append(v + [returns[i][-1] if episode else 0.0])
    return advantages, values


class AnchorStats(dict):
    """``anchor/*`` metrics of one batch: ``grouped_turn_share`` (turns whose step group has more than one turn),
    ``singleton_turn_share``, ``mean_step_group_size`` (averaged over turns) and ``mean_abs_step_advantage``."""


def anchor_stats(
    keys: Sequence[Sequence[Hashable]], scopes: Sequence[Hashable], step_advantages: Sequence[Sequence[float]]
) -> AnchorStats:
    """The batch's anchor metrics (see :class:`AnchorStats`); NaN shares for a batch without turns."""
    sizes = {group: len(members) for group, members in step_groups(keys, scopes).items()}
    per_turn = [sizes[(scopes[i], key)] for i, episode in enumerate(keys) for key in episode]
    flat = [abs(a) for episode in step_advantages for a in episode]
    n = len(per_turn)
    grouped = sum(1 for s in per_turn if s > 1)
    return AnchorStats(
        grouped_turn_share=grouped / n if n else math.nan,
        singleton_turn_share=(n - grouped) / n if n else math.nan,
        mean_step_group_size=sum(per_turn) / n if n else math.nan,
        mean_abs_step_advantage=math.fsum(flat) / len(flat) if flat else math.nan,
    )
