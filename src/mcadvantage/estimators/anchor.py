"""Anchor-state turn credit (GiGPO's step groups): per-turn credit from the episodes already drawn, at GRPO's cost.

Episodes of one prompt often pass through the same environment state (a board, a web page, a tool's state). The
turns that start from one state, across the episodes of a prompt group, form a *step group*; comparing their returns
credits each turn without sampling anything (Feng et al., 2025, "Group-in-Group Policy Optimization"). The formula
lives in :mod:`mcadvantage.core.anchors`; this module turns a batch into its inputs and its output into tokens.

Per token, under ``anchor_credit="normalized"`` (GiGPO's, the default)::

    A(i, token of turn t) = A_ep(i) + anchor_weight * A_step(i, t)

``A_ep`` is exactly GRPO's advantage for the batch (:func:`~mcadvantage.estimators.baselines.grpo_advantages`, the
same ``scale_rewards``); ``A_step`` normalises the turn's return within its step group (0 for a step group of one
turn). Under ``anchor_credit="pooled"`` the step groups' mean returns are batch values ``V(s)`` and each model token
of turn ``t`` gets ``(V(s(i,t+1)) - V(s(i,t))) / d(i)`` (the last ``V`` is the episode's return; ``d(i)`` is the
divisor GRPO's ``scale_rewards`` gives episode ``i``: its group's reward std + 1e-4, the batch's, or 1); the turns'
advantages sum to ``(R(i) - V(s(i,0))) / d(i)``, GRPO's advantage when the first state is shared by the group.
Tool-result tokens get 0 and stay out of the whitening (``token_mask``: the model's tokens), as everywhere.

**Where the keys come from** (``anchor_state``):

- ``"state_key"`` (default): the environment's read-only ``state_key`` property, any hashable. The trainer *records*
  it during GRPO's own tool loop: at each of the loop's generation calls it reads every episode's environment, so
  turn ``t``'s key is the state after ``reset`` (``t = 0``) or after the ``t``-th round of tool results, exactly as
  the model saw it. Recording was chosen over resetting a fresh environment and replaying the episode's tool calls:
  it costs one property read per turn, needs no environment to be deterministic or cheap to rebuild, and sees the
  state the model acted on rather than a re-creation of it. A ``rollout_func`` returns its keys as the extra field
  ``turn_keys`` (one list per completion, one key per model turn, the model turns being the runs of ``env_mask``
  1). With ``tools=`` alone (no environment object) the key is the observation below.
- ``"observation"``: the tokens of the tool results before the turn (the prompt's for the first turn), GiGPO's
  fallback; for environments without a state key. Observations that carry history or free text rarely recur: most
  turns are then singletons and the credit is GRPO's (``anchor/singleton_turn_share`` says how many).

The step group spans the prompt group (``anchor_scope="group"``, GiGPO's) or the whole batch (``"batch"``: for
environments whose keys identify a state across prompts, e.g. many seeds of one task; wrong when keys omit the task,
since two tasks' identical-looking states would pool returns that mean different things).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from mcadvantage.agents.env_checks import check_state_key_property
from mcadvantage.agents.state_keys import ROLLOUT_KEYS_FIELD, observation_keys, recorded_turn_keys
from mcadvantage.agents.turns import turn_spans
from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.core.anchors import (
    anchor_stats,
    anchor_step_advantages,
    check_state_keys,
    pooled_anchor_advantages,
)
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.baselines import _STD_EPS, _model_tokens, grpo_advantages, nanstd
from mcadvantage.estimators.batch import AdvantageBatch, AdvantageResult, EstimatorContext
from mcadvantage.estimators.registry import register_advantage_estimator
from mcadvantage.estimators.rules import summed_rewards, token_level_loss

__all__ = [
    "ANCHOR_CREDITS",
    "ANCHOR_SCOPES",
    "ANCHOR_STATES",
    "ROLLOUT_KEYS_FIELD",
    "AnchorEstimator",
    "check_state_key_property",
    "observation_keys",
    "recorded_turn_keys",
    "turn_spans",
]

logger = logging.getLogger(__name__)

ANCHOR_STATES = ("state_key", "observation")
ANCHOR_SCOPES = ("group", "batch")
ANCHOR_CREDITS = ("normalized", "pooled")
#: Above this share of singleton turns the pooled credit is mostly "all credit on the turn of divergence".
SINGLETON_WARNING_SHARE = 0.5


def _scopes(size: int, group_size: int, scope: str) -> list[int]:
    return [i // group_size for i in range(size)] if scope == "group" else [0] * size


def _reward_divisors(rewards: torch.Tensor, group_size: int, scale_rewards: str) -> list[float]:
    """Per episode, what GRPO's ``scale_rewards`` divides its advantage by (std + 1e-4, or 1 for ``"none"``)."""
    if scale_rewards == "none" or rewards.numel() < 2:
        return [1.0] * rewards.numel()
    if scale_rewards == "batch":
        std = float(nanstd(rewards))
        return [1.0 if math.isnan(std) else std + _STD_EPS] * rewards.numel()
    if group_size < 2:
        return [1.0] * rewards.numel()
    stds = nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size).tolist()
    return [1.0 if math.isnan(s) else s + _STD_EPS for s in stds]


def _final_rewards(turn_counts: Sequence[int], rewards: Sequence[float]) -> list[list[float]]:
    """Per episode, the reward after each turn: 0 except the last turn's, the episode's reward (NaN: unscorable)."""
    return [[0.0] * (n - 1) + [float(r)] if n else [] for n, r in zip(turn_counts, rewards, strict=True)]


@register_advantage_estimator("anchor")
class AnchorEstimator(AdvantageEstimator):
    """Anchor-state turn credit (GiGPO): GRPO's episode advantage plus a per-turn advantage from the turns of the
    batch that start from the same state, drawing nothing beyond GRPO's own generation (see the module docstring).

    Args:
        state_source: ``"state_key"`` (the environment's property; the trainer fills ``batch.turn_keys``) or
            ``"observation"`` (the tool results' tokens before each turn).
        gamma: discount of the turn returns (1.0: with one final reward every turn's return is that reward).
        weight: ``anchor_weight``, the step advantage's weight beside GRPO's (normalized credit only).
        scope: ``"group"`` (step groups within a prompt group) or ``"batch"``.
        credit: ``"normalized"`` (GiGPO's step advantage) or ``"pooled"`` (batch values, TD advantages).
        scale_rewards: GRPO's reward scaling, for ``A_ep`` and the step groups' std (``"none"``: no division).
    """

    whiten_by_default = False
    default_scale_rewards = "group"
    metric_prefix = "anchor"
    uses_rollouts = False
    config_fields = ("anchor_state", "anchor_gamma", "anchor_weight", "anchor_scope", "anchor_credit")
    config_rules = (summed_rewards, token_level_loss)

    def __init__(
        self,
        *,
        state_source: str = "state_key",
        gamma: float = 1.0,
        weight: float = 1.0,
        scope: str = "group",
        credit: str = "normalized",
        scale_rewards: str = "group",
    ) -> None:
        _check_settings(state_source, gamma, weight, scope, credit, scale_rewards)
        self.state_source = state_source
        self.gamma = float(gamma)
        self.weight = float(weight)
        self.scope = scope
        self.credit = credit
        self.scale_rewards = scale_rewards
        self._warned_singletons = False

    @classmethod
    def from_config(cls, config: Any) -> AnchorEstimator:
        """Build the estimator from a ``VinePPOConfig`` (or any object with the same fields)."""
        return cls(
            state_source=config.anchor_state,
            gamma=config.anchor_gamma,
            weight=config.anchor_weight,
            scope=config.anchor_scope,
            credit=config.anchor_credit,
            scale_rewards=config.scale_rewards,
        )

    @staticmethod
    def validate_config(config: Any) -> None:
        """Refuse invalid anchor settings, naming the field and the fix."""
        _check_settings(
            config.anchor_state,
            config.anchor_gamma,
            config.anchor_weight,
            config.anchor_scope,
            config.anchor_credit,
            config.scale_rewards,
            prefix="anchor_",
        )

    def local_keys(self, batch: AdvantageBatch) -> list[list[Hashable]]:
        """The state key of every model turn of the local responses, checked against their turns."""
        lengths = [len(ids) for ids in batch.completion_ids]
        masks = None if batch.tool_mask is None else batch.tool_mask.cpu().tolist()
        counts = [len(turn_spans(None if masks is None else masks[r], n)) for r, n in enumerate(lengths)]
        if self.state_source == "observation" or (batch.tool_mask is None and batch.turn_keys is None):
            # A single-turn response has one state: its prompt (under either source).
            mask_of = (lambda r: None) if masks is None else (lambda r: masks[r])
            return [
                observation_keys(batch.prompt_ids[r], batch.completion_ids[r], mask_of(r))
                for r in range(len(lengths))
            ]
        if batch.turn_keys is None:
            raise ValueError(
                "advantage_estimator='anchor' with anchor_state='state_key': the batch holds multi-turn episodes "
                "but no state keys (batch.turn_keys is None). Give the environment a read-only state_key property "
                f"(VinePPOTrainer records it), return a {ROLLOUT_KEYS_FIELD!r} field from your rollout_func (one "
                "list of keys per completion, one per model turn), or set anchor_state='observation'."
            )
        for r, (keys, n) in enumerate(zip(batch.turn_keys, counts, strict=True)):
            if len(keys) != n:
                raise ValueError(
                    f"advantage_estimator='anchor': local response {r} has {n} model turns (runs of tool_mask / "
                    f"env_mask 1) but {len(keys)} state keys; give one key per model turn, the state before it."
                )
        check_state_keys(batch.turn_keys, source=self.state_source)
        return [list(keys) for keys in batch.turn_keys]

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """Per-token advantages of the local responses (see :class:`~mcadvantage.estimators.base.AdvantageEstimator`).
        Collective: the keys of every process are gathered, as a step group may span processes."""
        all_rewards = batch.all_rewards.cpu()
        local = self.local_keys(batch)
        keys = context.gather_object(local)
        if len(keys) != all_rewards.numel():
            raise ValueError(
                f"advantage_estimator='anchor': {len(keys)} episodes of state keys gathered for a batch of "
                f"{all_rewards.numel()} responses; every process must give one list of keys per local response."
            )
        scopes = _scopes(len(keys), batch.group_size, self.scope)
        turn_rewards = _final_rewards([len(k) for k in keys], all_rewards.tolist())
        if self.credit == "normalized":
            turn_adv = anchor_step_advantages(
                keys, turn_rewards, scopes, gamma=self.gamma, scale=self.scale_rewards != "none", eps=_STD_EPS
            )
            episode = grpo_advantages(
                batch.rewards_per_func.cpu(),
                batch.reward_weights.cpu(),
                batch.group_size,
                scale_rewards=self.scale_rewards,
            ).tolist()
            per_turn = [[episode[i] + self.weight * a for a in turn_adv[i]] for i in range(len(keys))]
        else:
            turn_adv, _ = pooled_anchor_advantages(keys, turn_rewards, scopes, gamma=self.gamma)
            divisors = _reward_divisors(all_rewards, batch.group_size, self.scale_rewards)
            turn_adv = [[a / divisors[i] for a in turn] for i, turn in enumerate(turn_adv)]
            per_turn = turn_adv
        stats = anchor_stats(keys, scopes, turn_adv)
        self._warn_on_singletons(stats["singleton_turn_share"])
        start = batch.local_slice.indices(all_rewards.numel())[0]
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        advantages = torch.zeros(mask.shape, dtype=torch.float32)
        masks = None if batch.tool_mask is None else batch.tool_mask.cpu().tolist()
        for r, ids in enumerate(batch.completion_ids):
            spans = turn_spans(None if masks is None else masks[r], len(ids))
            for (s, e), value in zip(spans, per_turn[start + r], strict=True):
                advantages[r, s:e] = value
        advantages = advantages.to(mask.device) * mask
        return AdvantageResult(
            advantages=advantages,
            token_mask=_model_tokens(batch, mask),
            metrics={name: float(value) for name, value in stats.items()},
        )

    def _warn_on_singletons(self, share: float) -> None:
        """Under the pooled credit, warn (once per estimator) when most turns are singletons."""
        if self.credit != "pooled" or self._warned_singletons or not share > SINGLETON_WARNING_SHARE:
            return
        self._warned_singletons = True
        logger.warning(
            "advantage_estimator='anchor', anchor_credit='pooled': %.0f%% of this batch's turns start from a state no "
            "other turn of their step group shares. A singleton's value is its episode's own return, so those turns "
            "get 0 and the credit lands on the turn where episodes diverged (with free-text keys, usually the first). "
            "Use anchor_credit='normalized' (singletons get GRPO's credit), or keys that recur (a state_key that "
            "identifies the environment's state). anchor/singleton_turn_share tracks the share.",
            100 * share,
        )


def _check_settings(
    state_source: str,
    gamma: float,
    weight: float,
    scope: str,
    credit: str,
    scale_rewards: str,
    prefix: str = "",
) -> None:
    """Refuse invalid anchor settings (``prefix``: ``"anchor_"`` names them as config fields)."""
    names = {
        "state": "anchor_state" if prefix else "state_source",
        "gamma": f"{prefix}gamma",
        "weight": f"{prefix}weight",
        "scope": f"{prefix}scope",
        "credit": f"{prefix}credit",
    }
    for key, value, allowed in (
        ("state", state_source, ANCHOR_STATES),
        ("scope", scope, ANCHOR_SCOPES),
        ("credit", credit, ANCHOR_CREDITS),
    ):
        if value not in allowed:
            raise ValueError(
                f"{names[key]}={value!r} is invalid for the anchor credit; use one of {list(allowed)}."
            )
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards={scale_rewards!r} must be one of ['group', 'batch', 'none'].")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(
            f"{names['gamma']}={gamma} is invalid: the turn returns' discount lies in (0, 1] (1.0: none)."
        )
    if not (math.isfinite(weight) and weight >= 0.0):
        raise ValueError(
            f"{names['weight']}={weight} is invalid: the step advantage's weight beside GRPO's is finite and >= 0 "
            "(GiGPO: 1.0; 0 is GRPO exactly)."
        )
    if credit == "pooled" and weight != 1.0:
        raise ValueError(
            f"{names['weight']}={weight} is set with {names['credit']}='pooled', which does not read it: the pooled "
            "credit's turn advantages already sum to the episode's (no GRPO term to weigh against). Leave it at 1.0, "
            f"or use {names['credit']}='normalized'."
        )
