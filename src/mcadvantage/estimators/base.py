"""The advantage-estimator contract: what every estimator is, with the default of every hook.

An estimator turns one generation batch into per-token advantages::

    batch (AdvantageBatch) + context (EstimatorContext) --estimate()--> AdvantageResult

A new estimator is one class and one decorator::

    @register_advantage_estimator("my_estimator")
    class MyEstimator(AdvantageEstimator):
        metric_prefix = "mine"
        def estimate(self, batch, context): ...

and :func:`mcadvantage.testing.check_advantage_estimator` checks it in your own test suite. What flows through the
seam lives in :mod:`mcadvantage.estimators.batch`, the names in :mod:`mcadvantage.estimators.registry`, the config
rules several estimators share in :mod:`mcadvantage.estimators.rules`. Optional capabilities that only some
estimators have (a Monte Carlo estimate to inspect, groups drawn as trees) are the small protocols at the end of this
module, not members of the contract. Nothing here imports TRL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from mcadvantage.estimators.batch import (
    AdvantageBatch,
    AdvantageResult,
    EstimatorContext,
    MetricReduction,
    check_finite_advantages,
    combine_rewards,
    finalize_advantages,
    reduce_metrics,
    sequence_to_token_advantages,
)
from mcadvantage.estimators.rules import ConfigRule

if TYPE_CHECKING:
    from mcadvantage.mc.estimator import MCEstimate
    from mcadvantage.mc.tree import TreeSchedule

__all__ = [
    "AdvantageBatch",
    "AdvantageEstimator",
    "AdvantageResult",
    "ContinuesEpisodes",
    "DrawsTrees",
    "EstimatorContext",
    "KeepsMonteCarloEstimate",
    "MetricReduction",
    "ReadsStateKeys",
    "check_finite_advantages",
    "combine_rewards",
    "finalize_advantages",
    "reduce_metrics",
    "sequence_to_token_advantages",
]


class AdvantageEstimator:
    """The estimator contract: what the trainer and checkpointing read from every estimator, with the default
    each hook takes when an estimator leaves it out.

    Subclass it and implement :meth:`estimate`; add :meth:`from_config` and ``config_fields`` when the estimator has
    settings. The defaults suit a reward-only estimator without state (most built-ins are). The built-in estimators
    subclass it; a class written to the 0.1 protocol (``from_config`` and ``estimate`` only) is adapted by
    :func:`~mcadvantage.estimators.registry.register_advantage_estimator`.

    Class attributes (read from the class when ``VinePPOConfig`` is built, and from the instance by the trainer):

    Attributes:
        name: the name it is registered under (set by the registry; None: unregistered).
        whiten_by_default: what ``whiten_advantages=None`` resolves to (VinePPO: True, as the paper; GRPO/RLOO:
            False, their own normalisation is part of the estimator).
        default_scale_rewards: what ``scale_rewards=None`` resolves to (GRPO's ``"group"`` for estimators built on
            GRPO's advantage; ``"none"`` otherwise).
        metric_prefix: the trainer logs the estimator's metrics as ``{metric_prefix}/{name}``.
        uses_rollouts: True when ``estimate`` samples from the policy (costly): evaluation batches then skip it and
            get zero advantages unless ``mc_estimate_on_eval=True``. False (the default) for estimators that only
            read the batch: evaluation batches get their advantages too.
        config_fields: the ``VinePPOConfig`` fields of its own that the estimator reads (``gae_gamma``,
            ``hybrid_budget``, ...). ``VinePPOConfig`` refuses a non-default value of a field that another
            registered estimator declares and the chosen one does not, and ``VinePPOConfig.from_paper`` sets only
            these. Fields shared by every estimator (``GRPOConfig``'s, ``whiten_advantages``) are not listed.
        config_rules: the shared rules of :mod:`mcadvantage.estimators.rules` the config must meet (a token-level
            loss, no reward scaling, ...), run when ``VinePPOConfig`` is built, before :meth:`validate_config`.
    """

    name: ClassVar[str | None] = None
    whiten_by_default: ClassVar[bool] = False
    default_scale_rewards: ClassVar[str] = "none"
    metric_prefix: ClassVar[str] = "advantage"
    uses_rollouts: ClassVar[bool] = False
    config_fields: ClassVar[tuple[str, ...]] = ()
    config_rules: ClassVar[tuple[ConfigRule, ...]] = ()

    @classmethod
    def from_config(cls, config: Any) -> AdvantageEstimator:
        """Build the estimator from a :class:`~mcadvantage.trainer.config.VinePPOConfig` (or any object with the
        same fields). Default: ``cls()``, for estimators without settings."""
        return cls()

    @staticmethod
    def validate_config(config: Any) -> None:
        """Refuse, when the config is built, values of the estimator's own settings that are invalid or contradict
        each other (raise ``ValueError`` naming the setting and the fix). Rules shared with other estimators belong
        in ``config_rules``. Default: accept every config."""

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """Advantages of the local responses: ``(B, T)``, finite on ``token_mask``, zero on padding. Collective:
        every process calls it for the same batch. Every estimator implements it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement estimate(batch, context), which every advantage estimator "
            "must (return an AdvantageResult with (B, T) advantages)."
        )

    def state_dict(self) -> dict[str, Any]:
        """The estimator's own state (e.g. a critic's weights) that every trainer checkpoint saves; an empty dict
        saves nothing (the default). Values must load with ``torch.load(weights_only=True)``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output when training resumes from a checkpoint. The default accepts only
        the default's empty state: an estimator that overrides ``state_dict`` overrides this too."""
        if state:
            raise NotImplementedError(
                f"{type(self).__name__} saved state (state_dict() returned {sorted(state)}) but does not implement "
                "load_state_dict(state), so a resumed run would lose it. Define load_state_dict to restore it."
            )

    def updates_policy(self, global_step: int) -> bool:
        """Whether the policy takes the optimizer step ``global_step`` (0-based: the step being trained). False
        makes the trainer drop the policy's gradients before that step, so the policy does not move while the
        estimator still sees the step's batch (the ``"gae"`` critic's warm-up). Default: every step."""
        return True

    @property
    def has_state(self) -> bool:
        """Whether the estimator keeps state of its own (its class overrides :meth:`state_dict`): checkpoints then
        carry it, and resuming from a checkpoint without it warns."""
        return type(self).state_dict is not AdvantageEstimator.state_dict


# ---------------------------------------------------------------------------------------------------------------
# Optional capabilities: what only some estimators have, checked with isinstance where it is read.
# ---------------------------------------------------------------------------------------------------------------


@runtime_checkable
class KeepsMonteCarloEstimate(Protocol):
    """An estimator that keeps the Monte Carlo estimate of its latest batch (``vineppo``, ``hybrid``): the trainer's
    ``last_mc_estimate`` and ``last_mc_rows`` read it.

    Attributes:
        last_estimate: the local :class:`~mcadvantage.mc.estimator.MCEstimate` of the latest batch, or None.
        last_rows: local batch indices of the responses in ``last_estimate``, in its order.
    """

    last_estimate: MCEstimate | None
    last_rows: Sequence[int]


@runtime_checkable
class DrawsTrees(Protocol):
    """An estimator whose training groups are drawn as trees of shared prefixes (``tree``): the trainer's policy
    sampler reads :meth:`tree_schedule` (:func:`~mcadvantage.trainer.policy.draw_group_trees`). With ``tools=`` /
    ``environment_factory=`` the tree is drawn in the first model turn only and GRPO's tool loop finishes every leaf,
    so the estimator gets whole episodes (``batch.tool_mask`` set) whose ``tree_paths`` branch inside the first turn;
    ``rollout_func=`` is refused (its rollout never reaches the generation a tree is drawn in)."""

    def tree_schedule(self, max_completion_length: int) -> TreeSchedule:
        """How each training group is drawn as a tree (:mod:`mcadvantage.mc.tree`)."""
        ...


@runtime_checkable
class ContinuesEpisodes(Protocol):
    """An estimator that samples continuations and can continue a multi-turn episode of GRPO's tool loop
    (``tools=`` / ``environment_factory=``) through its tool calls and environment steps (``vineppo``, ``hybrid``:
    Monte Carlo credit per turn, from ``EstimatorContext.episodes``). The trainer lets it take those arguments, after
    :meth:`check_agent_support`, and builds ``EstimatorContext.episodes`` for it; other estimators that sample
    continuations refuse them."""

    def check_agent_support(self, given: Sequence[str]) -> None:
        """Refuse, before a model is loaded, what it cannot do with episodes built by the trainer arguments
        ``given`` (names among ``tools``, ``environment_factory``, ``rollout_func``) or with its own settings: raise
        ``NotImplementedError`` for an argument, ``ValueError`` for a setting, naming it and the fix."""
        ...


@runtime_checkable
class ReadsStateKeys(Protocol):
    """An estimator that credits the turns of multi-turn episodes by the environment state before them (``"anchor"``):
    the trainer fills ``AdvantageBatch.turn_keys`` for it.

    Attributes:
        state_source: where the keys come from. ``"state_key"``: the environment's read-only ``state_key`` property
            (recorded during GRPO's tool loop after ``reset`` and after each round of tool results; a
            ``rollout_func`` returns them as its ``turn_keys`` field; with ``tools=`` alone, which has no environment
            object, the observation below). ``"observation"``: the estimator keys each turn by the tokens of the
            tool results before it (the prompt's for the first turn) and needs nothing from the trainer.
    """

    state_source: str
