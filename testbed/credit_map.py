"""The tuned credit map's additions to the agent credit toy (docs/credit-map-tuned-protocol.md): a harder task with
several decisive turns, anchor-state credit keyed by the true state or by the observation history, a critic that sees
only features of the history, and the study's arms (:data:`TUNED_ARMS`).

- :class:`GauntletTask`: ``D`` decisive turns spread over the horizon; a wrong choice at any of them breaks the state
  for good; the reward is 1 iff the state is good at the end (so ``P = p ** D`` when each decisive turn picks the key
  with ``p``). It offers :class:`~testbed.agent_env.AgentTask`'s interface (``horizon``, ``choices``, ``key``,
  ``initial_state``, ``transition``, ``relevant_turns``), so the toy's policy and exact values play it unchanged.
- Anchor-state credit: the pure functions of :mod:`mcadvantage.core.anchors` (GiGPO's step groups), fed with the
  batch's episodes. The *normalised* variant adds GiGPO's step advantage (``anchor_weight = 1``) to GRPO's episode
  advantage (the library's :class:`~mcadvantage.estimators.baselines.GRPOEstimator` on the same batch); the *pooled*
  variant uses the step groups' mean returns as values, ``A = V(s_{t+1}) - V(s_t)``. Scope: the prompt group. Keys:
  ``state``: the true environment state before the turn, ``(turn, good/bad)``; ``history``: the whole observed history
  (the completion's tokens so far: every earlier choice and tool result), which is what a language model's context
  holds; with history keys two episodes share a key only until they first differ.
- :class:`FeatureCritic`: the stand-in for a language-model critic. It never sees a state id: its value is linear in
  features of the observed history (:func:`history_features`) and is fitted by least squares on each batch's
  lambda-return targets, moving ``rate`` of the way to the batch's fit (the :class:`~testbed.agent_credit.
  TabularCritic`'s rule with one-hot features in place of these).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcadvantage.core.anchors import anchor_step_advantages, pooled_anchor_advantages
from mcadvantage.estimators.baselines import GRPOEstimator
from testbed.agent_credit import ARMS, ArmSpec, TabularAgentPolicy, _episode_states
from testbed.agent_env import BAD, GOOD

__all__ = [
    "ANCHOR_KEYS",
    "FeatureCritic",
    "GauntletTask",
    "TUNED_ARMS",
    "anchor_advantages",
    "history_features",
    "turn_keys",
]

ANCHOR_KEYS = ("state", "history")


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


# -- anchor-state credit ---------------------------------------------------------------------------------------


def turn_keys(policy: TabularAgentPolicy, ids: Sequence[int], key: str) -> list[Hashable]:
    """The key before each model turn of one episode: ``"state"``: ``(turn, true state)``; ``"history"``: the
    completion's tokens before the turn (earlier choices and tool results)."""
    if key == "state":
        states = _episode_states(policy.task, policy.choices_of(ids))
        return [(t, states[t]) for t in range(policy.task.horizon)]
    if key == "history":
        positions = [p for p, tok in enumerate(ids) if policy.is_policy_token(tok)]
        return [tuple(ids[:p]) for p in positions]
    raise ValueError(f"anchor key={key!r} must be one of {ANCHOR_KEYS}.")


def anchor_advantages(
    policy: TabularAgentPolicy, batch: Any, context: Any, *, variant: str, key: str
) -> torch.Tensor:
    """``(B, T)`` anchor-state credit on the choice tokens of a batch (0 elsewhere), by :mod:`mcadvantage.core.
    anchors`: ``variant="normalised"`` is GRPO's episode advantage plus GiGPO's step advantage, ``"pooled"`` the
    step groups' mean returns as values. Scope: the episode's prompt (its group)."""
    if variant not in ("normalised", "pooled"):
        raise ValueError(f"anchor variant={variant!r} must be 'normalised' or 'pooled'.")
    horizon = policy.task.horizon
    keys = [turn_keys(policy, ids, key) for ids in batch.completion_ids]
    if any(len(k) != horizon for k in keys):
        raise ValueError("anchor credit on the toy needs whole episodes (every episode has horizon turns).")
    scopes = [tuple(p) for p in batch.prompt_ids]
    rewards = batch.rewards.tolist()
    turn_rewards = [[0.0] * (horizon - 1) + [float(r)] for r in rewards]
    if variant == "normalised":
        per_turn = anchor_step_advantages(keys, turn_rewards, scopes)
        base = GRPOEstimator().estimate(batch, context).advantages.float()
    else:
        per_turn, _ = pooled_anchor_advantages(keys, turn_rewards, scopes)
        base = torch.zeros(batch.completion_mask.shape, dtype=torch.float32)
    out = torch.zeros(batch.completion_mask.shape, dtype=torch.float32)
    for i, ids in enumerate(batch.completion_ids):
        positions = [p for p, tok in enumerate(ids) if policy.is_policy_token(tok)]
        for p, a in zip(positions, per_turn[i], strict=True):
            out[i, p] = base[i, p] + a
    return out


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


def _anchor(variant: str, key: str) -> Callable[..., torch.Tensor]:
    return lambda policy, batch, context: anchor_advantages(policy, batch, context, variant=variant, key=key)


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
    for variant in ("normalised", "pooled"):
        for key in ANCHOR_KEYS:
            name = f"anchor_{variant[:4]}_{key}"
            arms[name] = ArmSpec(name, "custom", advantages=_anchor(variant, key), whiten=False)
    arms["critic_history"] = ArmSpec("critic_history", "critic", lam=1.0, whiten=True, critic=FeatureCritic)
    arms["critic_tabular"] = ARMS["critic_l1"]
    arms["oracle"] = ARMS["oracle"]
    return arms


#: The tuned map's arms (docs/credit-map-tuned-protocol.md), in report order. ``critic_tabular`` is the map's
#: ``critic_l1`` (the best case for a critic); ``oracle`` the exact advantages at no sampling cost.
TUNED_ARMS: dict[str, ArmSpec] = _tuned_arms()
