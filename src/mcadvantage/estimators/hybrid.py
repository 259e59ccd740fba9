"""Hybrid credit: GRPO's advantage where the group has signal, Monte Carlo step credit where it has none.

GRPO's blind spot is the degenerate group: when every response to a prompt fails (or every one passes), its
group-relative advantage is zero and those responses train nothing, although their per-step values still differ
(a step that turns a likely solve into a likely failure is worth knowing about in an all-fail group). This
estimator gives every response GRPO's advantage, exactly as :class:`~mcadvantage.estimators.GRPOEstimator`
computes it, and spends a per-batch budget of extra sampled tokens on Monte Carlo step credit (VinePPO's
``V(S_i) - V(S_{i-1})``, :class:`~mcadvantage.estimators.VinePPOEstimator`) for responses of degenerate groups,
one response at a time in a seeded random order, buying each response's states from its end while the predicted
rollout tokens fit the budget.

- **Budget**: ``budget`` is a fraction of the batch's sampled response tokens (``hybrid_budget``: 0.1 = at most
  about 10% more sampled tokens than GRPO), masked responses included: they were sampled too. The prediction is
  ``K x (response length - state position)`` summed over the states the credit estimates (after the step budget:
  ``mc_min_step_tokens``, ``mc_max_estimated_steps``); the measured rollout tokens are
  logged (``hybrid/generated_tokens``). At budget 0 nothing is sampled and the advantages are GRPO's, exactly.
- **Per state**: a response the budget cannot afford whole gets its latest states that fit (the cheapest: their
  continuations are the shortest; :func:`affordable_first_state`), so on long episodes the budget is spent instead
  of skipping every response. Its steps before the first bought state keep GRPO's advantage (0 in a degenerate
  group) and those states are not estimated (``hybrid/states_skipped`` counts them); the bought states' credit is
  ``"vineppo"``'s. Which states are bought depends on lengths and the order only, never on outcomes.
- **Masked responses** (a zero ``completion_mask`` row, e.g. TRL's ``mask_truncated_completions``): the seeded
  order and the budget are decided as if nothing were masked, and a masked response that is chosen keeps its share
  of the budget but is not estimated (it trains nothing). So masking responses, often chosen by their outcome,
  changes neither which other responses get Monte Carlo credit nor the distribution of their credit, as with
  GRPO (with rollouts that depend only on their state, their credit is exactly the same: tested).
- **Values**: fresh rollouts only. Free samples (``mc_reuse_samples``) and ``mc_allocation="variance"`` pool the
  other responses' outcomes into a state's value, but the hybrid's responses are chosen *because* their group's
  outcomes are all equal: pooled, those outcomes would pull every value toward the group's outcome (measured in
  ``tests/estimators/test_hybrid.py``). So both are refused. With fresh rollouts a state's value is unbiased given its prefix
  and independent of the response's own outcome, whatever was selected (tested on the exact toy).
- **Scale**: Monte Carlo credit is in reward units; GRPO's is divided by the group's reward standard deviation.
  With ``scale_rewards="group"`` or ``"batch"`` the Monte Carlo credit is divided by the standard deviation of the
  batch's rewards (1 when they do not vary), so both are in the same units; with ``"none"`` neither is scaled.
- **Bias** (stated, and measured by ``benchmarks/gradient_quality.py``): which groups get Monte Carlo credit is
  decided from their outcomes (all equal), so the expected gradient is GRPO's plus ``P(degenerate) x E[Monte Carlo
  gradient | degenerate]``, which is not zero. In an all-fail group each response's step credits sum to
  ``-V(S_0)``: the estimator pushes down the steps that lost value, a signal GRPO's expectation does not contain.
  It is a different estimator of the policy gradient, not an unbiased one.
- **Agents** (``tools=`` / ``environment_factory=``: a batch with a ``tool_mask`` and ``context.episodes``): every
  episode gets GRPO's advantage; a chosen episode gets Monte Carlo credit per turn exactly as ``"vineppo"`` gives it
  (:class:`~mcadvantage.estimators.VinePPOEstimator` on the chosen rows, their episodes narrowed to them: states at
  turn boundaries and at the segmenter's steps inside the model's turns, continuations that resume the episode
  through its tool calls on replayed environments). The prediction counts ``K x (episode length - state position)``
  over those states, tool-result tokens included (as ``generated_tokens`` counts them), and so does the budget's
  base. Tool-result tokens get advantage 0 and no whitening weight. ``rollout_func=`` takes a
  ``continuation_func=`` beside it, as under ``"vineppo"`` (its ``env_mask`` places the states; your function
  continues them); without one it is refused when the trainer is built (:meth:`HybridEstimator.check_agent_support`).
- **Processes**: each process selects among the degenerate groups of its own rows, with its own budget. With a vLLM
  server (only the main process samples) a process that chose nothing still takes part in the main process'
  collective sampling call, with no rows.
- **Resuming**: the seeded order's position is the estimator's state (:meth:`HybridEstimator.state_dict`), so a
  single-process run resumed from a checkpoint offers the budget in the order the uninterrupted run would have. The
  main process saves it; in a multi-process run every process resumes from the main process's position.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.core.settings import MCSettings
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.baselines import GRPOEstimator, nanstd
from mcadvantage.estimators.batch import AdvantageBatch, AdvantageResult, EstimatorContext
from mcadvantage.estimators.registry import register_advantage_estimator
from mcadvantage.estimators.rules import sampled_continuations, summed_rewards, token_level_loss
from mcadvantage.estimators.vineppo import (
    MONTE_CARLO_CONFIG_FIELDS,
    VinePPOEstimator,
    check_turn_credit_support,
)
from mcadvantage.mc.planning import estimated_boundaries
from mcadvantage.tasks.segmentation import get_segmenter

# random.Random's state format (CPython's Mersenne Twister: 624 words and a position)
_RNG_STATE_VERSION = 3

__all__ = ["HybridEstimator", "affordable_first_state", "degenerate_groups", "predicted_rollout_tokens"]


def degenerate_groups(rewards: torch.Tensor, group_size: int) -> list[int]:
    """Indices of the groups whose scorable rewards are all equal (GRPO's advantage is zero for all of them)."""
    out = []
    for g, group in enumerate(rewards.view(-1, group_size)):
        scorable = group[~torch.isnan(group)]
        if len(scorable) >= 1 and bool((scorable == scorable[0]).all()):
            out.append(g)
    return out


def _pooling(settings: dict[str, Any]) -> list[str]:
    """``"name=value"`` for each of ``settings`` (the Monte Carlo options ``reuse_samples`` and ``allocation``, under
    any names, in that order) that pools other responses' outcomes into the values instead of fresh rollouts."""
    fresh = (False, "uniform")
    return [
        f"{name}={value!r}" for (name, value), ok in zip(settings.items(), fresh, strict=True) if value != ok
    ]


#: The hybrid's Monte Carlo settings when none are given: K = 4 (GRPO's price is the point), fresh rollouts.
_DEFAULT_SETTINGS = MCSettings(num_rollouts=4)


def predicted_rollout_tokens(boundaries: list[int], num_rollouts: int, first_state: int = 0) -> int:
    """Rollout tokens Monte Carlo credit is expected to cost for one response cut at ``boundaries``: ``K`` rollouts
    from every state from ``first_state`` on, each as long as what is left of the response."""
    length = boundaries[-1]
    return num_rollouts * sum(length - b for b in boundaries[first_state:-1])


def affordable_first_state(boundaries: list[int], num_rollouts: int, tokens_left: float) -> int | None:
    """The earliest state from which a response's states (to its end) fit ``tokens_left`` predicted rollout tokens
    (:func:`predicted_rollout_tokens`), or None when not even its last state fits. The latest states are the
    cheapest (their continuations are the shortest), so a budget too small for the whole response buys its end."""
    for first in range(len(boundaries) - 1):
        if predicted_rollout_tokens(boundaries, num_rollouts, first) <= tokens_left:
            return first
    return None


@register_advantage_estimator("hybrid")
class HybridEstimator(AdvantageEstimator):
    """GRPO's advantage, plus Monte Carlo step credit for degenerate groups within a token budget.

    Args:
        budget: extra sampled tokens allowed, as a fraction of the batch's response tokens (``hybrid_budget``).
        scale_rewards: GRPO's ``"group"``, ``"batch"`` or ``"none"`` (also scales the Monte Carlo credit, see the
            module docstring).
        num_rollouts: K for the Monte Carlo credit (``num_mc_rollouts``); None: ``settings``' (4 without them).
        step_segmenter: how responses are cut into steps (``step_segmenter``); the context's when None.
        seed: the order in which degenerate groups are offered the budget is a seeded shuffle.
        settings: the Monte Carlo settings, whole (:class:`~mcadvantage.core.settings.MCSettings`), honoured as
            :class:`~mcadvantage.estimators.VinePPOEstimator` honours them (the step budget, the state cap and what
            steps past it get, the rollout budget, the truncated reward); pooled values (``reuse_samples``,
            ``allocation="variance"``) are refused. Default: their defaults with K = 4.
        **monte_carlo: single settings by name (``max_estimated_steps=26``, ...), applied over ``settings``.
    """

    whiten_by_default = False
    metric_prefix = "hybrid"
    uses_rollouts = True
    default_scale_rewards = "group"
    config_fields = ("hybrid_budget", *MONTE_CARLO_CONFIG_FIELDS)
    # GRPO's reward scaling is welcome here (it scales the Monte Carlo credit too, see the module docstring).
    config_rules = (sampled_continuations, summed_rewards, token_level_loss)

    def __init__(
        self,
        *,
        budget: float = 0.1,
        scale_rewards: str = "group",
        num_rollouts: int | None = None,
        step_segmenter: Any = None,
        seed: int = 0,
        settings: MCSettings | None = None,
        **monte_carlo: Any,
    ) -> None:
        if not budget >= 0:
            raise ValueError(
                f"HybridEstimator: budget={budget} must be >= 0 (a fraction of the response tokens)."
            )
        if num_rollouts is not None:
            monte_carlo["num_rollouts"] = num_rollouts
        settings = (settings if settings is not None else _DEFAULT_SETTINGS).replace(**monte_carlo)
        pooled = _pooling({"reuse_samples": settings.reuse_samples, "allocation": settings.allocation})
        if pooled:
            raise ValueError(
                f"HybridEstimator: {', '.join(pooled)} pools other responses' outcomes into the values, but the "
                "hybrid's responses are chosen because their group's outcomes are all equal, so pooled they would "
                "bias every value toward that outcome. Leave it out (reuse_samples=False, allocation='uniform': "
                "fresh rollouts)."
            )
        self.budget = float(budget)
        self.grpo = GRPOEstimator(scale_rewards=scale_rewards)
        self.monte_carlo = VinePPOEstimator(settings=settings, step_segmenter=step_segmenter)
        self.rng = random.Random(seed)
        #: local rows that got Monte Carlo credit in the latest batch (in ``monte_carlo.last_estimate``'s order)
        self.last_rows: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        """The position of the seeded order (``random.Random``'s Mersenne Twister state as an int64 tensor), so a
        resumed run continues the order instead of replaying it from the start."""
        version, internal, gauss_next = self.rng.getstate()
        if version != _RNG_STATE_VERSION or gauss_next is not None:  # shuffle never draws a Gaussian
            raise RuntimeError(
                f"HybridEstimator cannot save its order: random.Random's state has version {version} and a pending "
                f"Gaussian {gauss_next!r}; this Python's format (version {_RNG_STATE_VERSION}, none pending) is expected."
            )
        return {"order_rng_state": torch.tensor(internal, dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (a checkpoint of a resumed run)."""
        if set(state) != {"order_rng_state"}:
            raise ValueError(
                f"HybridEstimator.load_state_dict: the state has keys {sorted(state)}, expected ['order_rng_state'] "
                "(a HybridEstimator.state_dict()); it was saved by another estimator."
            )
        self.rng.setstate((_RNG_STATE_VERSION, tuple(state["order_rng_state"].tolist()), None))

    @property
    def last_estimate(self) -> Any:
        """The Monte Carlo estimate of the latest batch's chosen responses (``last_rows``, in that order), or None."""
        return self.monte_carlo.last_estimate if self.last_rows else None

    @property
    def settings(self) -> MCSettings:
        """The Monte Carlo settings of the credit (those of :attr:`monte_carlo`)."""
        return self.monte_carlo.settings

    @classmethod
    def from_config(cls, config: Any) -> HybridEstimator:
        """Build the estimator from a ``VinePPOConfig`` (or any object with the same fields): every Monte Carlo
        setting, whole."""
        return cls(
            budget=config.hybrid_budget,
            scale_rewards=config.scale_rewards,
            step_segmenter=config.step_segmenter,
            seed=config.seed,
            settings=MCSettings.from_config(config),
        )

    @staticmethod
    def validate_config(config: Any) -> None:
        """Refuse a negative budget and GRPO settings the hybrid cannot honour."""
        if not config.hybrid_budget >= 0:
            raise ValueError(
                f"hybrid_budget={config.hybrid_budget} is invalid: it is the extra sampled tokens allowed as a fraction "
                "of the batch's response tokens, so >= 0 (0 is GRPO exactly; 0.1 allows about 10% more)."
            )
        pooled = _pooling(
            {"mc_reuse_samples": config.mc_reuse_samples, "mc_allocation": config.mc_allocation}
        )
        if pooled:
            raise ValueError(
                f"{', '.join(pooled)} is not supported by advantage_estimator='hybrid': it pools other responses' "
                "outcomes into a state's value, and the hybrid's responses are chosen because their group's outcomes "
                "are all equal, which would pull every value toward that outcome. Set mc_reuse_samples=False and "
                "mc_allocation='uniform'."
            )
        VinePPOEstimator.validate_config(config)

    def check_agent_support(self, given: Sequence[str]) -> None:
        """Tool and environment episodes get Monte Carlo credit per turn, as under ``"vineppo"``; a ``rollout_func=``
        needs a ``continuation_func=`` beside it (the trainer then leaves it out of ``given``), with ``"vineppo"``'s
        messages (:func:`~mcadvantage.estimators.vineppo.check_turn_credit_support`)."""
        check_turn_credit_support(given, self.name or type(self).__name__)

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """Per-token advantages of the local responses (see :class:`~mcadvantage.estimators.base.AdvantageEstimator`)."""
        result = self.grpo.estimate(batch, context)
        self.last_rows = []
        # Sampled tokens, masked responses included: masking (often chosen by outcome) must not move the budget.
        allowed = self.budget * sum(len(ids) for ids in batch.completion_ids)
        metrics = dict(result.metrics)
        metrics.update(budget_tokens=allowed, generated_tokens=0.0, groups_estimated=0.0)
        reductions = {"budget_tokens": "sum", "generated_tokens": "sum", "groups_estimated": "sum"}
        all_rewards = batch.all_rewards.cpu()
        degenerate = degenerate_groups(all_rewards, batch.group_size)
        metrics["degenerate_groups"] = float(len(degenerate))
        rows = self._candidate_rows(batch, degenerate) if allowed > 0 else []
        chosen, spent = self._choose(batch, context, rows, allowed) if rows else ({}, 0)
        if not chosen:  # no Monte Carlo credit this batch: nothing of an earlier batch's stays readable
            mc = self.monte_carlo
            mc.last_estimate, mc.last_rows, mc.last_turn_credit = None, [], []
            self._take_part_in_server_sampling(batch, context)
            return AdvantageResult(
                advantages=result.advantages,
                token_mask=result.token_mask,
                metrics=metrics,
                metric_reductions=reductions,
            )
        self.last_rows = sorted(chosen)
        mc = self.monte_carlo.estimate(
            _sub_batch(batch, self.last_rows),
            _sub_context(context, self.last_rows),
            first_states=[chosen[r] for r in self.last_rows],
        )
        scale = 1.0
        if self.grpo.scale_rewards != "none":
            std = float(nanstd(all_rewards)) if all_rewards.numel() > 1 else 0.0
            scale = 1.0 / std if std > 0 else 1.0
        advantages = result.advantages.clone()
        for j, r in enumerate(self.last_rows):
            advantages[r] = 0.0
            advantages[r, : mc.advantages.shape[1]] = mc.advantages[j].to(advantages.device) * scale
        # The tokens of the loss: tool results (tool_mask 0) get no credit from either estimator.
        advantages = advantages * loss_token_mask(batch.completion_mask, batch.tool_mask)
        start = batch.local_slice.indices(all_rewards.shape[0])[0]
        metrics.update(
            generated_tokens=float(mc.metrics.get("generated_tokens", 0.0)),
            groups_estimated=float(len({(start + r) // batch.group_size for r in chosen})),
            responses_estimated=float(len(chosen)),
            states_skipped=float(sum(chosen.values())),
            predicted_tokens=float(spent),
        )
        reductions.update(predicted_tokens="sum", responses_estimated="sum", states_skipped="sum")
        return AdvantageResult(
            advantages=advantages,
            token_mask=result.token_mask,
            metrics=metrics,
            metric_reductions=reductions,
        )

    def _candidate_rows(self, batch: AdvantageBatch, degenerate: list[int]) -> list[int]:
        """The local non-empty rows of the degenerate groups, in a seeded random order: a whole group of long
        responses rarely fits a budget near GRPO's price, one response often does."""
        start = batch.local_slice.indices(batch.all_rewards.shape[0])[0]
        local = range(start, start + len(batch.completion_ids))
        rows = [
            i - start
            for g in degenerate
            for i in range(g * batch.group_size, (g + 1) * batch.group_size)
            if i in local and batch.completion_ids[i - start]
        ]
        self.rng.shuffle(rows)
        return rows

    def _choose(
        self, batch: AdvantageBatch, context: EstimatorContext, rows: list[int], allowed: float
    ) -> tuple[dict[int, int], int]:
        """The budget offered state by state: each row in turn gets the longest run of its last states whose
        predicted cost fits what is left (:func:`affordable_first_state`; all of them when the whole response
        fits). Returns ``({row: its first estimated state}, their predicted tokens)``. The order and the budget
        ignore the mask; a chosen masked response keeps its share but is not estimated, so which responses are
        masked changes no other response's credit."""
        state_boundaries = self._state_boundaries(batch, context)
        k = self.settings.num_rollouts
        chosen: dict[int, int] = {}
        reserved = spent = 0
        for r in rows:
            bounds = state_boundaries(r)
            first = affordable_first_state(bounds, k, allowed - reserved)
            if first is None:
                continue
            cost = predicted_rollout_tokens(bounds, k, first)
            reserved += cost
            if int(batch.completion_mask[r].sum()) > 0:
                chosen[r] = first
                spent += cost
        return chosen, spent

    def _take_part_in_server_sampling(self, batch: AdvantageBatch, context: EstimatorContext) -> None:
        """With a vLLM server and several processes only the main process samples, in one collective call per batch
        that every process sends its work to: a process with nothing to estimate still takes part (with no rows), or
        the others would wait for it forever."""
        if context.sample_on_main_only and context.num_processes > 1:
            self.monte_carlo.estimate(_sub_batch(batch, []), _sub_context(context, []))

    def _state_boundaries(
        self, batch: AdvantageBatch, context: EstimatorContext
    ) -> Callable[[int], list[int]]:
        """``row -> boundaries`` of the states the credit of local row ``row`` estimates (what its predicted cost
        counts), cut exactly as :class:`~mcadvantage.estimators.VinePPOEstimator` cuts it: the segmenter's steps
        (after the step budget) of a single-turn response; for an episode with a ``tool_mask`` (``tools=``,
        ``environment_factory=``, or a ``rollout_func``'s ``env_mask``), turn boundaries and the segmenter's steps
        inside the model's turns."""
        segmenter = self.monte_carlo.segmenter or get_segmenter(context.segmenter)

        def boundaries(r: int) -> list[int]:
            traj = VinePPOEstimator.response_trajectory(batch, r, segmenter, context, 0.0)
            return estimated_boundaries(traj.step_boundaries, self.settings)

        return boundaries


def _sub_context(context: EstimatorContext, rows: list[int]) -> EstimatorContext:
    """``context`` with its agent episodes (if any) narrowed to the local rows ``rows``, in that order."""
    if context.episodes is None:
        return context
    episodes = [context.episodes.episodes[r] for r in rows]
    return dataclasses.replace(context, episodes=dataclasses.replace(context.episodes, episodes=episodes))


def _sub_batch(batch: AdvantageBatch, rows: list[int]) -> AdvantageBatch:
    """The local rows ``rows`` of ``batch`` as a batch of their own (one group: Monte Carlo credit needs no groups)."""
    index = torch.tensor(rows, dtype=torch.long)
    rewards = batch.rewards_per_func[batch.local_slice][index]
    return AdvantageBatch(
        prompt_ids=[batch.prompt_ids[r] for r in rows],
        completion_ids=[batch.completion_ids[r] for r in rows],
        completion_mask=batch.completion_mask[index.to(batch.completion_mask.device)],
        rewards_per_func=rewards,
        reward_weights=batch.reward_weights,
        local_slice=slice(0, len(rows)),
        group_size=max(1, len(rows)),  # no rows: a process that only takes part in the main process' sampling
        prompts=[batch.prompts[r] for r in rows] if batch.prompts else [],
        rows=[batch.rows[r] for r in rows] if batch.rows else [],
        mode=batch.mode,
        tool_mask=None if batch.tool_mask is None else batch.tool_mask[index.to(batch.tool_mask.device)],
    )
