"""The advantage-estimator seam: what an estimator receives, what it returns, and the registry.

An estimator turns one generation batch (prompts, sampled responses, their rewards) into per-token
advantages. It is handed what it needs to sample (the live policy, behind a sampler context) so Monte Carlo
estimators fit the same seam as reward-only baselines:

    batch (AdvantageBatch) + context (EstimatorContext) --estimate()--> AdvantageResult
                                                                         (per-token advantages, not whitened;
                                                                          optional state values; metrics)

The trainer (or any RL loop: verl, OpenRLHF, your own) builds the batch and the context, calls ``estimate``,
whitens if asked, and logs the metrics under a prefix without knowing their keys. Nothing here imports TRL.

A new estimator is one class plus one registry line; :class:`AdvantageEstimator` declares every hook the trainer,
the policy sampler and checkpointing read, with its default::

    @register_advantage_estimator("my_estimator")
    class MyEstimator(AdvantageEstimator):
        metric_prefix = "mine"
        def estimate(self, batch, context): ...

Why this module is long: it is the whole seam in one file (the batch, the context, the result and the one step
from result to loss advantages, the contract with every hook's default, the registry), so a reader who writes an
estimator, or another RL loop that calls one, learns every part of the interface from one place.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from mcadvantage.core.advantages import masked_whiten
from mcadvantage.samplers.base import Sampler

if TYPE_CHECKING:
    from mcadvantage.mc.tree import TreeSchedule

__all__ = [
    "BUILTIN_ESTIMATORS",
    "AdvantageBatch",
    "AdvantageEstimator",
    "AdvantageResult",
    "EstimatorContext",
    "MetricReduction",
    "as_advantage_estimator",
    "available_advantage_estimators",
    "build_advantage_estimator",
    "check_finite_advantages",
    "combine_rewards",
    "finalize_advantages",
    "get_advantage_estimator",
    "register_advantage_estimator",
    "sequence_to_token_advantages",
]

MetricReduction = Literal["mean", "sum", "max", "min"]


def combine_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """Weighted sum over reward functions that skips NaN (TRL's ``nansum``); NaN where every function returned
    None (an unscorable response).

    Args:
        rewards_per_func: ``(N, F)`` rewards, NaN where a function returned None.
        weights: ``F`` reward weights.
    """
    per_func = rewards_per_func.float()
    w = torch.as_tensor(weights, dtype=per_func.dtype, device=per_func.device)
    rewards = (per_func * w.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
    return rewards


def sequence_to_token_advantages(advantages: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Give every completion token its response's advantage: ``(B,)`` -> ``(B, T)``, zero on padding."""
    return advantages.to(torch.float32).unsqueeze(1) * completion_mask.to(torch.float32)


@dataclass
class AdvantageBatch:
    """One process' share of a generation batch, plus what group baselines need from the whole batch.

    Responses to one prompt are consecutive (``group_size`` of them) in the global batch, as TRL's
    ``RepeatSampler`` lays them out; a group may span processes, which is why the rewards of every process are
    given (``rewards_per_func``) along with this process' rows (``local_slice``).

    Attributes:
        prompt_ids: per local response, the prompt token ids without padding.
        completion_ids: per local response, the completion token ids (EOS kept, no padding).
        completion_mask: ``(B, T)`` completion mask (1 on completion tokens that enter the loss; an all-zero row
            is a response the trainer masked out, e.g. a truncated one under ``mask_truncated_completions``).
        rewards_per_func: ``(N, F)`` rewards of every response of the global batch (all processes, in process
            order), one column per reward function, NaN where the function returned None.
        reward_weights: ``F`` weights of the reward functions.
        local_slice: this process' rows of the global batch.
        group_size: responses per prompt (GRPO's ``num_generations``).
        prompts: per local response, the prompt as reward functions take it (a string or a message list).
        rows: per local response, its dataset row (other columns go to the reward functions).
        mode: ``"train"`` or ``"eval"``.
        tree_paths: per local response, its :class:`~mcadvantage.mc.tree.TreePath` when the trainer drew the groups
            as trees (``advantage_estimator="tree"``); None for independent responses.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    completion_mask: torch.Tensor
    rewards_per_func: torch.Tensor
    reward_weights: torch.Tensor
    local_slice: slice
    group_size: int
    prompts: list[Any] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "train"
    tree_paths: list[Any] | None = None

    def __post_init__(self) -> None:
        size = len(self.completion_ids)
        if len(self.prompt_ids) != size or self.completion_mask.shape[0] != size:
            raise ValueError(
                f"AdvantageBatch: prompt_ids ({len(self.prompt_ids)}), completion_ids ({size}) and completion_mask "
                f"({self.completion_mask.shape[0]} rows) must describe the same responses."
            )
        local_rows = len(range(*self.local_slice.indices(self.rewards_per_func.shape[0])))
        if local_rows != size:
            raise ValueError(
                f"AdvantageBatch: local_slice={self.local_slice} selects {local_rows} rows of rewards_per_func "
                f"({self.rewards_per_func.shape[0]} rows) but the batch has {size} local responses."
            )
        if self.group_size < 1 or self.rewards_per_func.shape[0] % self.group_size:
            raise ValueError(
                f"AdvantageBatch: group_size={self.group_size} must be >= 1 and divide the global batch "
                f"({self.rewards_per_func.shape[0]} responses)."
            )

    @property
    def all_rewards(self) -> torch.Tensor:
        """``(N,)`` combined reward of every response of the global batch (NaN: unscorable)."""
        return combine_rewards(self.rewards_per_func, self.reward_weights)

    @property
    def rewards(self) -> torch.Tensor:
        """``(B,)`` combined reward of this process' responses (NaN: unscorable)."""
        return self.all_rewards[self.local_slice]


@dataclass
class AdvantageResult:
    """What an estimator returns for the local batch.

    Attributes:
        advantages: ``(B, T)`` float per-token advantages, not whitened (zero on padding).
        token_mask: ``(B, T)`` bool: tokens whose advantages are estimates and enter the whitening statistics
            (None: every completion token). Tokens outside it end with advantage 0 after whitening.
        values: optional per-response state values, e.g. ``[V(S_0), ..., V(S_{n-1}), R]`` for Monte Carlo or
            a critic; None when the estimator has no values (GRPO, RLOO).
        metrics: flat ``name -> float`` of this process; the trainer logs them under a prefix (``mc/``), reduced
            across processes as ``metric_reductions`` says (default: mean).
        metric_reductions: per metric name, ``"sum"``, ``"max"``, ``"min"`` or ``"mean"`` over processes.
    """

    advantages: torch.Tensor
    token_mask: torch.Tensor | None = None
    values: list[list[float]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metric_reductions: dict[str, MetricReduction] = field(default_factory=dict)


def check_finite_advantages(advantages: torch.Tensor, valid: torch.Tensor, estimator: str) -> None:
    """Refuse non-finite advantages before they reach the loss (one would turn every weight NaN at the next
    optimizer step): ``FloatingPointError`` naming the estimator and the local rows."""
    bad = ~torch.isfinite(advantages) & valid
    if bool(bad.any()):
        rows = sorted({int(r) for r in bad.nonzero()[:, 0]})
        raise FloatingPointError(
            f"{estimator} returned non-finite advantages for local batch rows {rows[:10]}; they would turn the weights "
            "to NaN, so training stops before the loss (weights untouched). An estimator must return finite "
            "advantages (0 for responses it cannot credit) on every token of its token_mask."
        )


def finalize_advantages(
    result: AdvantageResult,
    completion_mask: torch.Tensor,
    *,
    whiten: bool,
    estimator: str = "the advantage estimator",
    valid_token_total: Callable[[torch.Tensor], int] | None = None,
) -> torch.Tensor:
    """The per-token advantages that enter the loss, from an estimator's result.

    The one step between ``estimate`` and the loss that every caller shares (``VinePPOTrainer.compute_advantages``
    and :func:`mcadvantage.integrations.verl.compute_vineppo_advantage` call it, so both give the same advantages
    on the same responses):

    1. the valid tokens are the completion tokens inside ``result.token_mask`` (every completion token when None);
    2. a non-finite advantage on a valid token raises ``FloatingPointError`` (:func:`check_finite_advantages`);
    3. without ``whiten``: the advantages on valid tokens, 0 elsewhere; with ``whiten``: token-weighted
       :func:`~mcadvantage.core.advantages.masked_whiten` over the valid tokens (its statistics all-reduced over the
       processes when ``torch.distributed`` is initialised), or all zeros when fewer than two tokens are valid
       over all processes (a batch with nothing to credit).

    Args:
        result: what ``estimator.estimate(batch, context)`` returned.
        completion_mask: ``(B, T)`` completion mask of the batch; the output is on its device.
        whiten: whiten over the valid tokens (VinePPO's default, as in the paper).
        estimator: the estimator's name, for the error message.
        valid_token_total: the number of valid tokens over all processes, given this process' ``(B, T)`` bool
            mask of valid tokens (the trainer passes an all-gather); None: this process' count (one process).

    Returns:
        ``(B, T)`` float32 advantages, 0 outside the valid tokens.
    """
    mask = completion_mask.bool()
    raw = result.advantages.to(device=mask.device, dtype=torch.float32)
    valid = (mask if result.token_mask is None else result.token_mask.to(mask.device).bool()) & mask
    check_finite_advantages(raw, valid, estimator)
    if not whiten:
        return raw * valid
    total = int(valid.sum()) if valid_token_total is None else int(valid_token_total(valid))
    if total < 2:  # masked_whiten needs two tokens; a batch with (almost) nothing to credit keeps zeros
        return torch.zeros_like(raw)
    return masked_whiten(raw, valid)


def _gather_one_process(objs: list[Any]) -> list[Any]:
    """All-gather with one process: the objects themselves."""
    return list(objs)


def _broadcast_one_process(obj: Any) -> Any:
    """Broadcast with one process: the object itself."""
    return obj


@dataclass
class EstimatorContext:
    """What an estimator may use besides the batch: the live policy (through a sampler), the graders and the
    step segmenter, and the collectives of the process group.

    Attributes:
        policy_sampler: ``policy_sampler()`` opens a context that yields a :class:`~mcadvantage.samplers.Sampler`
            drawing from the *current* policy with the training sampling settings (None on processes that cannot
            sample, e.g. the non-main processes in vLLM server mode: see ``sample_on_main_only``).
        reward_funcs: the reward functions (TRL signature), for grading rollouts.
        reward_weights: their weights.
        tokenizer: the policy's tokenizer.
        segmenter: the step segmenter (``text -> steps``).
        max_completion_length: the responses' token budget.
        context_length: the policy's context (prompt + completion), None when unknown.
        reward_kwargs: extra keyword arguments for reward-function calls (TRL's ``trainer_state`` and
            logging hooks that must ignore rollouts).
        sample_on_main_only: True when only the main process can sample (vLLM server mode).
        process_index, num_processes: this process' rank and the world size.
        gather_object: all-gather of picklable objects (one list element per process, concatenated).
        broadcast_object: broadcast ``obj`` from the main process; returns it everywhere.
        policy_model: the (unwrapped) policy model, for estimators that need its weights (the ``"gae"`` critic is
            initialised from them); None when not available.
    """

    policy_sampler: Callable[[], AbstractContextManager[Sampler | None]]
    reward_funcs: list[Callable[..., Any]]
    reward_weights: list[float]
    tokenizer: Any
    segmenter: Any = None
    max_completion_length: int | None = None
    context_length: int | None = None
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    sample_on_main_only: bool = False
    process_index: int = 0
    num_processes: int = 1
    gather_object: Callable[[list[Any]], list[Any]] = field(default_factory=lambda: _gather_one_process)
    broadcast_object: Callable[[Any], Any] = field(default_factory=lambda: _broadcast_one_process)
    policy_model: Any = None

    @classmethod
    def single_process(
        cls,
        sampler: Sampler | None,
        reward_funcs: Sequence[Callable[..., Any]],
        tokenizer: Any,
        **kwargs: Any,
    ) -> EstimatorContext:
        """A context for one process around an existing sampler (scripts, notebooks, other RL loops)."""

        @contextlib.contextmanager
        def fixed() -> Iterator[Sampler | None]:
            yield sampler

        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        kwargs.setdefault("reward_weights", [1.0] * len(funcs))
        return cls(policy_sampler=fixed, reward_funcs=funcs, tokenizer=tokenizer, **kwargs)


class AdvantageEstimator:
    """The estimator contract: the one place that declares what the trainer, the policy sampler and checkpointing
    read from an estimator, with the default every hook takes when an estimator leaves it out.

    Subclass it and implement :meth:`estimate` (and :meth:`from_config` when the estimator has settings); every
    other hook has a default that suits an estimator without state; a reward-only estimator (one that samples
    nothing) also sets ``uses_rollouts = False``, so evaluation batches get its advantages. The built-in estimators subclass
    it. A class written to the 0.1 protocol (a plain class with ``from_config`` and ``estimate``) still works:
    :func:`register_advantage_estimator` and :func:`as_advantage_estimator` adapt it (see there).

    Class attributes (read from the class when ``VinePPOConfig`` is built, and from the instance by the trainer):

    Attributes:
        name: the name it is registered under (set by :func:`register_advantage_estimator`; None: unregistered).
        whiten_by_default: what ``whiten_advantages=None`` resolves to (VinePPO: True, as the paper; GRPO/RLOO:
            False, their own normalisation is part of the estimator).
        default_scale_rewards: what ``scale_rewards=None`` resolves to (GRPO's ``"group"`` for estimators built on
            GRPO's advantage; ``"none"`` otherwise).
        metric_prefix: the trainer logs the estimator's metrics as ``{metric_prefix}/{name}``.
        uses_rollouts: True when ``estimate`` samples from the policy (costly): evaluation batches then skip it and
            get zero advantages unless ``mc_estimate_on_eval=True``. False for estimators that only read the batch.
        last_estimate: the local Monte Carlo estimate (:class:`~mcadvantage.mc.estimator.MCEstimate`) of the latest
            batch, for estimators that keep one (the trainer's ``last_mc_estimate``); None otherwise.
        last_rows: local batch indices of the responses in ``last_estimate`` (the trainer's ``last_mc_rows``).
    """

    name: ClassVar[str | None] = None
    whiten_by_default: ClassVar[bool] = False
    default_scale_rewards: ClassVar[str] = "none"
    metric_prefix: ClassVar[str] = "advantage"
    uses_rollouts: ClassVar[bool] = True
    last_estimate: Any = None
    last_rows: Sequence[int] = ()

    @classmethod
    def from_config(cls, config: Any) -> AdvantageEstimator:
        """Build the estimator from a :class:`~mcadvantage.trainer.config.VinePPOConfig` (or any object with the
        same fields). Default: ``cls()``, for estimators without settings."""
        return cls()

    @staticmethod
    def validate_config(config: Any) -> None:
        """Refuse, when the config is built, settings that contradict the estimator (raise ``ValueError`` naming the
        setting and the fix). Default: accept every config."""

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """Advantages of the local responses: ``(B, T)``, finite on ``token_mask``, zero on padding. Collective:
        every process calls it for the same batch. Every estimator implements it."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement estimate(batch, context), which every advantage estimator "
            "must (return an AdvantageResult with (B, T) advantages)."
        )

    def tree_schedule(self, max_completion_length: int) -> TreeSchedule | None:
        """How the trainer draws each training group as a tree (:mod:`mcadvantage.mc.tree`), or None to draw
        independent responses (the default). Read by :func:`~mcadvantage.trainer.policy.draw_group_trees`."""
        return None

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


# Adapted classes by the 0.1-protocol class they adapt, so adapting a class twice gives one class.
_ADAPTED: dict[type, type[AdvantageEstimator]] = {}


def _adapted_class(cls: type) -> type[AdvantageEstimator]:
    """``cls`` itself when it subclasses :class:`AdvantageEstimator`; else (a class written to the 0.1 protocol)
    a subclass of both, the same name, whose hooks ``cls`` leaves out take the contract's defaults (``cls``'s own
    attributes come first). One adapted class per ``cls``."""
    if issubclass(cls, AdvantageEstimator):
        return cls
    adapted = _ADAPTED.get(cls)
    if adapted is None:
        namespace = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "_adapted_from": cls,
        }
        adapted = _ADAPTED[cls] = type(cls.__name__, (cls, AdvantageEstimator), namespace)
    return adapted


def as_advantage_estimator(estimator: Any) -> AdvantageEstimator:
    """``estimator`` as an :class:`AdvantageEstimator`: itself when it is one; for an instance of a class written
    to the 0.1 protocol (``estimate`` without the base class), a view of it through its adapted class (see
    :func:`register_advantage_estimator`) that shares its attributes, so state it keeps (``last_rows``, a model)
    is the instance's own and the hooks it leaves out take the contract's defaults.

    Raises:
        TypeError: when ``estimator`` has no ``estimate`` method, or keeps its attributes in ``__slots__`` (then
            subclass :class:`AdvantageEstimator`).
    """
    if isinstance(estimator, AdvantageEstimator):
        return estimator
    if isinstance(estimator, type) or not callable(getattr(estimator, "estimate", None)):
        raise TypeError(
            f"advantage_estimator={estimator!r} is neither a registered name nor an estimator instance (an object "
            "with estimate(batch, context)); subclass mcadvantage.AdvantageEstimator."
        )
    if not hasattr(estimator, "__dict__"):
        raise TypeError(
            f"advantage_estimator={estimator!r}: {type(estimator).__name__} keeps its attributes in __slots__, so it "
            "cannot be adapted to the estimator contract; subclass mcadvantage.AdvantageEstimator."
        )
    view = object.__new__(_adapted_class(type(estimator)))
    view.__dict__ = estimator.__dict__  # one attribute dict: the view and the instance are the same estimator
    return view


# ---------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[AdvantageEstimator]] = {}
#: The built-in estimators, by name, with the module that registers each when imported: the one table the
#: registry loads them from, and that the config's help, the trainer's docstring and the docs' lists are checked
#: against (tests/estimators/test_contract.py).
BUILTIN_ESTIMATORS: dict[str, str] = {
    "vineppo": ".vineppo",
    "grpo": ".baselines",
    "rloo": ".baselines",
    "gae": ".critic",
    "hybrid": ".hybrid",
    "tree": ".tree",
}


def _qualified(cls: type) -> str:
    """``module.QualName`` of the class a user wrote (the 0.1-protocol class behind an adapted one)."""
    origin = cls.__dict__.get("_adapted_from", cls)
    return f"{origin.__module__}.{origin.__qualname__}"


def register_advantage_estimator(name: str, *, replace: bool = False) -> Callable[[type], type]:
    """Class decorator: make an estimator class available as ``advantage_estimator=name`` (case-insensitive).

    The class should subclass :class:`AdvantageEstimator`. A class written to the 0.1 protocol (``from_config`` and
    ``estimate`` only) is adapted: the decorator returns a subclass of it and of :class:`AdvantageEstimator`, of the
    same name, so the hooks it leaves out take the contract's defaults.

    Registration is by identity: registering the same class again under its name does nothing; another class under
    a taken name raises, unless ``replace=True`` (e.g. re-running a notebook cell that defines the class).

    Raises:
        TypeError: when the class does not implement ``estimate``.
        ValueError: when ``name`` is registered to another class and ``replace`` is False.
    """
    key = name.lower()

    def decorate(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError(f"register_advantage_estimator({name!r}) decorates a class, not {cls!r}.")
        adapted = _adapted_class(cls)
        if adapted.estimate is AdvantageEstimator.estimate:
            raise TypeError(
                f"register_advantage_estimator({name!r}): {cls.__qualname__} has no estimate(); an advantage "
                "estimator implements estimate(batch, context) (and from_config(config) when it has settings)."
            )
        builtin = BUILTIN_ESTIMATORS.get(key)
        if (
            builtin is not None
        ):  # a built-in name is taken by the built-in, whether or not it was imported yet
            importlib.import_module(builtin, __package__)
        existing = _REGISTRY.get(key)
        if existing is adapted:
            return adapted
        if existing is not None and not replace:
            same_name = _qualified(existing) == _qualified(cls)
            raise ValueError(
                f"advantage estimator {name!r} is already registered to {_qualified(existing)}; {_qualified(cls)} is "
                "a different class"
                + (
                    " of the same name (its definition ran twice: a re-run notebook cell, a module imported under "
                    "two names)"
                    if same_name
                    else ""
                )
                + f". Register {cls.__name__} under another name, or pass "
                f"register_advantage_estimator({name!r}, replace=True) to replace the registered class on purpose."
            )
        adapted.name = key
        _REGISTRY[key] = adapted
        return adapted

    return decorate


def _load_builtins() -> None:
    for module in sorted(set(BUILTIN_ESTIMATORS.values())):
        importlib.import_module(module, __package__)


def available_advantage_estimators() -> list[str]:
    """Names accepted by ``VinePPOConfig.advantage_estimator``: the built-ins and every registered one."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_advantage_estimator(name: str) -> type[AdvantageEstimator]:
    """The estimator class registered as ``name`` (case-insensitive).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"advantage_estimator={name!r} must be a registered name (a string).")
    key = name.lower()
    if key not in _REGISTRY:
        _load_builtins()
    if key not in _REGISTRY:
        raise ValueError(
            f"advantage_estimator={name!r} is not registered. Known: {available_advantage_estimators()}; register "
            "your own with @mcadvantage.register_advantage_estimator('name')."
        )
    return _REGISTRY[key]


def build_advantage_estimator(spec: str | Any, config: Any) -> AdvantageEstimator:
    """An estimator instance from a registered name (built with ``from_config(config)``) or an instance
    (through :func:`as_advantage_estimator`)."""
    if isinstance(spec, str):
        return get_advantage_estimator(spec).from_config(config)
    return as_advantage_estimator(spec)


def reduce_metrics(
    gathered: Sequence[Mapping[str, float]], reductions: Mapping[str, MetricReduction]
) -> dict[str, float]:
    """Reduce per-process metric dicts (one per process) into one dict, key by key."""
    keys: list[str] = []
    for part in gathered:
        keys.extend(k for k in part if k not in keys)
    out: dict[str, float] = {}
    for key in keys:
        values = [float(part[key]) for part in gathered if key in part]
        how = reductions.get(key, "mean")
        if how == "mean":  # a process with nothing to average (NaN) does not poison the others
            values = [v for v in values if v == v] or [float("nan")]
        if how == "sum":
            out[key] = sum(values)
        elif how == "max":
            out[key] = max(values)
        elif how == "min":
            out[key] = min(values)
        elif how == "mean":
            out[key] = sum(values) / len(values)
        else:
            raise ValueError(f"metric {key!r}: reduction {how!r} must be 'sum', 'max', 'min' or 'mean'.")
    return out
