"""The tuned credit map's additions to the agent credit toy (docs/credit-map-tuned-protocol.md): a harder task with
several decisive turns, anchor-state credit keyed by the true state or by the observation history, a critic that sees
only features of the history, and the study's arms (:data:`TUNED_ARMS`).

- :class:`GauntletTask`: ``D`` decisive turns spread over the horizon; a wrong choice at any of them breaks the state
  for good; the reward is 1 iff the state is good at the end (so ``P = p ** D`` when each decisive turn picks the key
  with ``p``). It offers :class:`~testbed.agent_env.AgentTask`'s interface (``horizon``, ``choices``, ``key``,
  ``initial_state``, ``transition``, ``relevant_turns``), so the toy's policy and exact values play it unchanged.
- Anchor-state credit: the library's estimator, ``advantage_estimator="anchor"``
  (:class:`~mcadvantage.estimators.anchor.AnchorEstimator`), through the toy's seam
  (:class:`~testbed.agent_credit.ToyAnchor`), scope the prompt group. ``anchor_norm_*`` is GiGPO's normalised credit
  at the library's defaults (GRPO's episode advantage plus the step advantage, ``scale_rewards="group"``);
  ``anchor_pool_*`` is ``anchor_credit="pooled", scale_rewards="none"``: the step groups' mean returns as values,
  ``A = V(s_{t+1}) - V(s_t)``, undivided. Keys: ``state``: the true environment state before the turn,
  ``(turn, good/bad)``; ``history``: the whole observed history (the prompt and the completion's tokens so far: every
  earlier choice and tool result), which is what a language model's context holds; with history keys two episodes
  share a key only until they first differ. (The committed runs computed the same credit from
  :mod:`mcadvantage.core.anchors` directly; ``tests/testbed/test_credit_map_anchor_equivalence.py`` ties the two.)
- :class:`FeatureCritic`: the stand-in for a language-model critic. It never sees a state id: its value is linear in
  features of the observed history (:func:`history_features`) and is fitted by least squares on each batch's
  lambda-return targets, moving ``rate`` of the way to the batch's fit (the :class:`~testbed.agent_credit.
  TabularCritic`'s rule with one-hot features in place of these).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcadvantage.estimators.anchor import ANCHOR_CREDITS
from testbed.agent_credit import ANCHOR_KEYS, ARMS, ArmSpec, ToyAnchor, _episode_states
from testbed.agent_env import BAD, GOOD

__all__ = [
    "ANCHOR_KEYS",
    "FeatureCritic",
    "GauntletTask",
    "TUNED_ARMS",
    "history_features",
]


@dataclass(frozen=True)
class GauntletTask:
    """``decisive`` decisive turns at ``round(k H / D)``; a wrong choice at any breaks the state for good.

    Args:
        horizon: turns per episode.
        decisive: how many decisive turns (``1 <= D <= H``).
        choices: choices per turn (at most 8 in the toy's alphabet).
        key: the right choice at every decisive turn.
    """

    horizon: int
    decisive: int
    choices: int = 8
    key: int = 0
    structure: str = "gauntlet"

    def __post_init__(self) -> None:
        if not 1 <= self.decisive <= self.horizon:
            raise ValueError(f"decisive={self.decisive} must lie in 1 .. horizon={self.horizon}.")
        if self.choices < 2 or not 0 <= self.key < self.choices:
            raise ValueError(
                f"choices={self.choices}, key={self.key}: need choices >= 2 and 0 <= key < choices."
            )

    @property
    def decisive_turns(self) -> tuple[int, ...]:
        return tuple(round(k * self.horizon / self.decisive) for k in range(self.decisive))

    @property
    def decisive_turn(self) -> int:
        """The first decisive turn (the attribute the testbed's credit report reads)."""
        return self.decisive_turns[0]

    def initial_state(self) -> int:
        return GOOD

    def transition(self, turn: int, state: int, choice: int) -> int:
        if state == BAD or (turn in self.decisive_turns and choice != self.key):
            return BAD
        return state

    def relevant_turns(self) -> tuple[int, ...]:
        return self.decisive_turns


# -- the history critic ----------------------------------------------------------------------------------------


def history_features(task: Any, choices: Sequence[int], turn: int) -> list[float]:
    """Features of the observed history before ``turn`` (the first ``turn`` choices and their tool results):
    bias, ``turn / H``, whether there is an observation yet and whether the last was good, the share of good
    observations so far, and a one-hot of the previous choice. No state id and no per-turn table: one weight vector
    serves every turn, as one network does."""
    states = _episode_states(task, choices[:turn])
    observed = states[1:]
    last_good = float(bool(observed) and observed[-1] == GOOD)
    share = sum(1.0 for s in observed if s == GOOD) / len(observed) if observed else 0.0
    prev = [0.0] * task.choices
    if turn > 0:
        prev[choices[turn - 1]] = 1.0
    return [1.0, turn / task.horizon, float(bool(observed)), last_good, share, *prev]


class FeatureCritic:
    """A linear critic on :func:`history_features`: ``V(h) = w . phi(h)``, starting at 0.5 everywhere; after each
    batch ``w`` moves ``rate`` of the way to the batch's ridge least-squares fit of its lambda-return targets."""

    def __init__(self, task: Any, *, rate: float = 0.5, ridge: float = 1e-3) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate={rate} must lie in (0, 1].")
        self.task, self.rate, self.ridge = task, rate, ridge
        self.weights = torch.zeros(5 + task.choices, dtype=torch.float64)
        self.weights[0] = 0.5

    def keys(self, task: Any, choices: Sequence[int]) -> list[tuple[float, ...]]:
        """What the critic sees before each turn and after the last: the history's features."""
        return [tuple(history_features(task, choices, t)) for t in range(len(choices) + 1)]

    def value(self, turn: int, features: Sequence[float]) -> float:
        return float(torch.tensor(features, dtype=torch.float64) @ self.weights)

    def update(self, visits: Sequence[tuple[int, Sequence[float], float]]) -> None:
        """Move toward the ridge least-squares fit of one batch's ``(turn, features, target)`` visits."""
        if not visits:
            return
        x = torch.tensor([list(f) for _, f, _ in visits], dtype=torch.float64)
        y = torch.tensor([t for _, _, t in visits], dtype=torch.float64)
        gram = x.T @ x + self.ridge * len(visits) * torch.eye(x.shape[1], dtype=torch.float64)
        fit = torch.linalg.solve(gram, x.T @ y + self.ridge * len(visits) * self.weights)
        self.weights += self.rate * (fit - self.weights)


# -- the study's arms --------------------------------------------------------------------------------------------


def _anchor(credit: str, key: str) -> Callable[[int], ToyAnchor]:
    """The library's anchor estimator on the toy (:class:`~testbed.agent_credit.ToyAnchor`): ``"normalized"`` at
    its defaults, ``"pooled"`` with ``scale_rewards="none"`` (the step groups' TD advantages, undivided)."""
    scale = "none" if credit == "pooled" else "group"
    return lambda h: ToyAnchor(key, credit, scale_rewards=scale)


def _tuned_arms() -> dict[str, ArmSpec]:
    keep = (
        "grpo",
        "rloo",
        "vineppo_k1",
        "vineppo_k1_reuse",
        "vineppo_k4",
        "vineppo_k4_reuse",
        "hybrid",
        "tree",
    )
    arms = {name: ARMS[name] for name in keep}
    for credit in ANCHOR_CREDITS:
        for key in ANCHOR_KEYS:
            name = f"anchor_{credit[:4]}_{key}"
            arms[name] = ArmSpec(name, "estimator", build=_anchor(credit, key), whiten=False)
    arms["critic_history"] = ArmSpec("critic_history", "critic", lam=1.0, whiten=True, critic=FeatureCritic)
    arms["critic_tabular"] = ARMS["critic_l1"]
    arms["oracle"] = ARMS["oracle"]
    return arms


#: The tuned map's arms (docs/credit-map-tuned-protocol.md), in report order. ``critic_tabular`` is the map's
#: ``critic_l1`` (the best case for a critic); ``oracle`` the exact advantages at no sampling cost.
TUNED_ARMS: dict[str, ArmSpec] = _tuned_arms()
