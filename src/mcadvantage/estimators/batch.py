"""What flows through the advantage-estimator seam: the batch an estimator receives, the context it may sample
through, the result it returns, and the one step from result to the advantages that enter the loss.

    batch (AdvantageBatch) + context (EstimatorContext) --estimate()--> AdvantageResult
                                                                         --finalize_advantages()--> loss advantages

Plain dataclasses and pure functions on tensors; nothing here imports TRL. The contract an estimator implements is
:mod:`mcadvantage.estimators.base`; the registry of names is :mod:`mcadvantage.estimators.registry`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from mcadvantage.core.advantages import masked_whiten
from mcadvantage.samplers.base import Sampler

if TYPE_CHECKING:
    from mcadvantage.agents.tool_loop import AgentEpisodes

__all__ = [
    "AdvantageBatch",
    "AdvantageResult",
    "EstimatorContext",
    "MetricReduction",
    "check_finite_advantages",
    "combine_rewards",
    "finalize_advantages",
    "reduce_metrics",
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
        tool_mask: ``(B, T)`` TRL's ``tool_mask`` for multi-turn episodes (``tools=``, ``environment_factory=``,
            a ``rollout_func``'s ``env_mask``): 0 on the tool-result and environment tokens inside a completion,
            which the model did not choose and the loss leaves out (``completion_mask * tool_mask``); estimators
            give them no credit and leave them out of the whitening statistics. None: every completion token is
            the model's.
        turn_keys: per local response, the state key before each of its model turns (any hashable: the
            environment's ``state_key`` after ``reset`` and after each round of tool results, or a ``rollout_func``'s
            ``turn_keys`` field), filled by the trainer for estimators that credit turns by state
            (:class:`~mcadvantage.estimators.base.ReadsStateKeys`, ``"anchor"``); None otherwise. Turn ``t`` is the
            ``t``-th run of model tokens (``tool_mask`` 1) of the completion.
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
    tool_mask: torch.Tensor | None = None
    turn_keys: list[list[Hashable]] | None = None

    def __post_init__(self) -> None:
        size = len(self.completion_ids)
        if self.turn_keys is not None and len(self.turn_keys) != size:
            raise ValueError(
                f"AdvantageBatch: turn_keys holds {len(self.turn_keys)} episodes for {size} local responses; give "
                "one list of state keys (one per model turn) per response."
            )
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
        episodes: for a batch of GRPO's tool loop (``tools=`` / ``environment_factory=``), what continuing its
            episodes needs (:class:`~mcadvantage.agents.tool_loop.AgentEpisodes`: each row's episode, the environment
            factories, the parser, the tool results' tokens); None otherwise. ``"vineppo"`` reads it to give Monte
            Carlo credit per turn.
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
    episodes: AgentEpisodes | None = None

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
