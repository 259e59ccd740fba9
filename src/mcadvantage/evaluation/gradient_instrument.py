"""The gradient instrument: how close an advantage estimator's batch gradient comes to the true policy gradient,
and what it paid for it.

Better credit should show first in the *gradient*, before any learning curve: a learning curve over 3 seeds decides
at p ~ 0.18, whereas one batch gradient can be drawn hundreds of times from one fixed policy. For a fixed policy and
prompt set this module measures, per estimator and budget:

- the **reference gradient** ``g = grad E[R]`` (mean over the prompt set), from a large on-policy sample:
  REINFORCE with a leave-one-out baseline per prompt, ``sum_i (R_i - mean_{j != i} R_j) grad log pi(y_i)``. The
  baseline never contains the response's own reward, so the estimate is unbiased; it is drawn in independent
  rounds (every prompt in every round), which give its per-coordinate standard error and a split-half cosine;
- **batch-gradient estimates** exactly as :class:`~mcadvantage.trainer.vineppo_trainer.VinePPOTrainer` computes them for one
  update: responses sampled from the policy, graded, the estimator's per-token advantages (whitened when the trainer
  would whiten them), and the gradient of GRPO's on-policy loss at ratio 1 with ``loss_type="dapo"``: ``sum_{i,t}
  A_{i,t} grad log pi(y_{i,t}) / (number of completion tokens)``;
- their **quality**: cosine to the reference, relative squared error after removing each estimator's overall scale
  (whitening and GRPO's std scaling change the gradient's length, which Adam largely ignores), the share of
  per-coordinate signs that agree with the reference (Adam acts per coordinate), and the cosine of the *mean*
  estimate (a biased estimator's mean does not converge to the reference: :func:`gradient_metrics`' ``bias_ratio``);
- their **cost**: sampled tokens (responses and Monte Carlo rollouts), and ``generated + r * trained`` tokens, where
  ``r`` is a training token's cost in generated tokens (:func:`~mcadvantage.evaluation.cost_model.measure_cost_ratio`
  measures it for a model on this machine; set it for your hardware). The cost model is
  :mod:`~mcadvantage.evaluation.cost_model`.

The policy enters through a *policy-gradient oracle*: anything with ``parameters()`` and ``token_logprobs(
prompt_ids, completion_ids) -> (B, T)`` (differentiable). :class:`CausalLMOracle` wraps a transformers causal LM;
:class:`~mcadvantage.testing.TabularStepPolicy` is an exact toy whose true gradient is known in closed form (the
instrument's validation). Everything here is written by hand: no library measures estimator gradients against a
reference.

Why this module is long: the oracle, the task that samples groups (or trees) as the trainer does, the reference, one
batch estimate and the metrics are one measurement; a reader checking that it is unbiased reads them together.

Many estimators at several budgets on one task, compared at equal cost, with a table, a plot and a command line:
:mod:`mcadvantage.evaluation.gradient_quality`, built on this module.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mcadvantage.core.advantages import masked_whiten
from mcadvantage.estimators.base import DrawsTrees
from mcadvantage.estimators.batch import AdvantageBatch, EstimatorContext
from mcadvantage.estimators.registry import as_advantage_estimator
from mcadvantage.rewards.errors import call_reward_func
from mcadvantage.samplers.base import RolloutRequest, Sampler

__all__ = [
    "CausalLMOracle",
    "GradientEstimate",
    "GradientTask",
    "PolicyGradientOracle",
    "ReferenceGradient",
    "estimator_gradient",
    "gradient_metrics",
    "reference_gradient",
    "weighted_logprob_gradient",
]


class PolicyGradientOracle(Protocol):
    """The policy, as the instrument needs it: its parameters and differentiable token log-probabilities."""

    def parameters(self) -> Sequence[torch.Tensor]: ...

    def token_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """``(B, T)`` log-probabilities of the completion tokens (zero on padding), differentiable."""
        ...


class CausalLMOracle:
    """A transformers causal LM as a :class:`PolicyGradientOracle`.

    Args:
        model: the policy (``AutoModelForCausalLM``), in the state whose gradient is measured.
        parameter_filter: keep only parameters whose name passes (e.g. the last layers of a large model, to keep
            the gradient vector small); None keeps every trainable parameter.
    """

    def __init__(self, model: Any, *, parameter_filter: Callable[[str], bool] | None = None) -> None:
        self.model = model
        self.names = [
            n
            for n, p in model.named_parameters()
            if p.requires_grad and (parameter_filter is None or parameter_filter(n))
        ]
        if not self.names:
            raise ValueError("CausalLMOracle: no trainable parameter passes parameter_filter.")
        params = dict(model.named_parameters())
        self._params = [params[n] for n in self.names]

    def parameters(self) -> list[torch.Tensor]:
        return list(self._params)

    def token_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        device = self._params[0].device
        lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        width = max(lengths)
        pad = getattr(getattr(self.model, "config", None), "pad_token_id", None) or 0
        ids = torch.full((len(lengths), width), int(pad), dtype=torch.long, device=device)
        attention = torch.zeros((len(lengths), width), dtype=torch.long, device=device)
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            seq = list(p) + list(c)
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention[i, : len(seq)] = 1
        logits = self.model(input_ids=ids, attention_mask=attention).logits.float()
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        t_max = max((len(c) for c in completion_ids), default=0)
        out = torch.zeros((len(lengths), t_max), dtype=log_probs.dtype, device=device)
        rows = []
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            start = len(p) - 1  # the logit at position k predicts token k + 1
            row = log_probs[i, start : start + len(c)]
            rows.append(torch.nn.functional.pad(row, (0, t_max - len(c))))
        return torch.stack(rows) if rows else out


def _flatten(grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).reshape(-1).to(torch.float32).cpu()
            for g, p in zip(grads, params, strict=True)
        ]
    )


def weighted_logprob_gradient(
    oracle: PolicyGradientOracle,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    weights: torch.Tensor,
    *,
    chunk_size: int = 64,
) -> torch.Tensor:
    """``grad sum_{i,t} w_{i,t} log pi(y_{i,t})``, flattened over ``oracle.parameters()`` (float32, CPU).

    The sum is linear in the rows, so it is accumulated over chunks of ``chunk_size`` responses (memory bound).
    """
    params = list(oracle.parameters())
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
    for start in range(0, len(completion_ids), chunk_size):
        stop = start + chunk_size
        w = weights[start:stop]
        if not bool(w.abs().sum() > 0):
            continue
        logp = oracle.token_logprobs(prompt_ids[start:stop], completion_ids[start:stop])
        w = w[:, : logp.shape[1]].to(device=logp.device, dtype=logp.dtype)
        objective = (w * logp[:, : w.shape[1]]).sum()
        grads = torch.autograd.grad(objective, params, allow_unused=True)
        total += _flatten(grads, params)
    return total


# ---------------------------------------------------------------------------------------------------------------
# The task: a policy, its prompts and graders
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class GradientTask:
    """A fixed policy and prompt set to measure gradients on.

    Attributes:
        oracle: the policy's parameters and log-probabilities.
        sampler: draws from the same policy (responses and Monte Carlo rollouts).
        prompt_ids: per prompt, its token ids.
        prompts: per prompt, what reward functions receive as ``prompts``.
        rows: per prompt, the other dataset columns reward functions read (e.g. ``answer``).
        reward_funcs: TRL-style reward functions.
        tokenizer: the policy's tokenizer (decoding, segmentation).
        segmenter: the step segmenter Monte Carlo estimators use.
        max_completion_length: the responses' token budget.
        reward_weights: one weight per reward function (default 1 each).
        policy_model: the policy module, for estimators that build on its weights (the ``"gae"`` critic starts as a
            copy of it); None when there is none (a toy).
    """

    oracle: PolicyGradientOracle
    sampler: Sampler
    prompt_ids: list[list[int]]
    prompts: list[Any]
    rows: list[dict[str, Any]]
    reward_funcs: list[Callable[..., Any]]
    tokenizer: Any
    segmenter: Any
    max_completion_length: int
    reward_weights: list[float] = field(default_factory=list)
    policy_model: Any = None

    def __post_init__(self) -> None:
        if not (len(self.prompt_ids) == len(self.prompts) == len(self.rows)) or not self.prompt_ids:
            raise ValueError(
                f"GradientTask: prompt_ids ({len(self.prompt_ids)}), prompts ({len(self.prompts)}) and rows "
                f"({len(self.rows)}) must describe the same, non-empty prompt set."
            )
        if not self.reward_weights:
            self.reward_weights = [1.0] * len(self.reward_funcs)

    def sample_group(self, prompt_indices: Sequence[int], group_size: int) -> AdvantageBatch:
        """``group_size`` responses to each prompt, graded: one batch as the trainer sees it."""
        requests = [
            RolloutRequest(
                prefix_ids=tuple(self.prompt_ids[p]), n=group_size, max_tokens=self.max_completion_length
            )
            for p in prompt_indices
        ]
        samples = self.sampler.sample(requests)
        return self._graded_batch(
            prompt_indices, [[list(c.token_ids) for c in conts] for conts in samples], group_size
        )

    def sample_trees(self, prompt_indices: Sequence[int], schedule: Any) -> tuple[AdvantageBatch, int]:
        """One tree per prompt (:func:`~mcadvantage.mc.tree.draw_trees`), graded, as the trainer draws them with
        ``advantage_estimator="tree"``; returns the batch (with its tree paths) and the tokens generated."""
        from mcadvantage.mc.tree import draw_trees

        trees = draw_trees(
            self.sampler, [self.prompt_ids[p] for p in prompt_indices], schedule, self.max_completion_length
        )
        batch = self._graded_batch(
            prompt_indices,
            [tree.completions for tree in trees],
            schedule.group_size,
            tree_paths=[path for tree in trees for path in tree.paths],
        )
        return batch, sum(tree.generated_tokens for tree in trees)

    def _graded_batch(
        self,
        prompt_indices: Sequence[int],
        completions: Sequence[Sequence[list[int]]],
        group_size: int,
        tree_paths: list[Any] | None = None,
    ) -> AdvantageBatch:
        """The graded batch of ``completions[j]`` (a group) for prompt ``prompt_indices[j]``."""
        prompt_ids, completion_ids, prompts, rows = [], [], [], []
        for p, group in zip(prompt_indices, completions, strict=True):
            for ids in group:
                prompt_ids.append(list(self.prompt_ids[p]))
                completion_ids.append(list(ids))
                prompts.append(self.prompts[p])
                rows.append(dict(self.rows[p]))
        rewards = self.grade(prompt_ids, completion_ids, prompts, rows)
        width = max((len(c) for c in completion_ids), default=0)
        mask = torch.zeros((len(completion_ids), width), dtype=torch.long)
        for i, c in enumerate(completion_ids):
            mask[i, : len(c)] = 1
        return AdvantageBatch(
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            completion_mask=mask,
            rewards_per_func=rewards,
            reward_weights=torch.tensor(self.reward_weights, dtype=torch.float32),
            local_slice=slice(0, len(completion_ids)),
            group_size=group_size,
            prompts=prompts,
            rows=rows,
            tree_paths=tree_paths,
        )

    def grade(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        prompts: list[Any],
        rows: list[dict[str, Any]],
    ) -> torch.Tensor:
        """``(N, F)`` rewards, NaN where a function could not score."""
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        columns = {k: [r.get(k) for r in rows] for k in (rows[0] if rows else {})}
        per_func = [
            call_reward_func(
                f,
                getattr(f, "__name__", None) or type(f).__name__,
                dict(prompts=prompts, completions=texts, completion_ids=completion_ids, **columns),
                where="responses",
            )
            for f in self.reward_funcs
        ]
        return torch.tensor(per_func, dtype=torch.float32).T.reshape(
            len(completion_ids), len(self.reward_funcs)
        )

    def context(self) -> EstimatorContext:
        """The single-process estimator context on this task's sampler, reward functions and segmenter."""
        return EstimatorContext.single_process(
            self.sampler,
            self.reward_funcs,
            self.tokenizer,
            segmenter=self.segmenter,
            max_completion_length=self.max_completion_length,
            reward_weights=list(self.reward_weights),
            policy_model=self.policy_model,
        )


# ---------------------------------------------------------------------------------------------------------------
# The reference and the estimates
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ReferenceGradient:
    """The reference policy gradient and its own uncertainty.

    Attributes:
        gradient: the mean over rounds (an unbiased estimate of ``grad E[R]``, mean over the prompt set).
        standard_error: per coordinate, the standard error of ``gradient`` (from the rounds).
        split_half_cosine: cosine between the means of the first and second half of the rounds (1: noiseless).
        responses: responses drawn.
        rounds: independent rounds (every prompt in each).
        mean_reward: the mean reward of those responses (NaN rewards counted as 0, as in the gradient).
        degenerate_share: the share of (prompt, round) groups whose rewards are all equal, where a group-relative
            advantage such as GRPO's is zero (NaN when not measured).
    """

    gradient: torch.Tensor
    standard_error: torch.Tensor
    split_half_cosine: float
    responses: int
    rounds: int
    mean_reward: float = math.nan
    degenerate_share: float = math.nan

    @property
    def relative_standard_error(self) -> float:
        """``||standard_error|| / ||gradient||``: the reference's noise relative to its signal."""
        norm = float(self.gradient.norm())
        return float(self.standard_error.norm()) / norm if norm > 0 else math.inf


def groups_without_signal(rewards: torch.Tensor) -> tuple[int, int, int]:
    """``(all equal, all fail, all pass)``: how many rows of ``rewards`` (one group of 0/1 rewards per row, NaN already
    counted as 0) have rewards that are all equal, where a group-relative advantage such as GRPO's is zero."""
    equal = int((rewards == rewards[:, :1]).all(dim=1).sum())
    return equal, int((rewards == 0).all(dim=1).sum()), int((rewards == 1).all(dim=1).sum())


def reference_gradient(
    task: GradientTask, *, responses_per_round: int = 8, rounds: int = 8, progress: bool = False
) -> ReferenceGradient:
    """An unbiased estimate of ``grad E[R]`` over the task's prompts: ``rounds`` independent rounds, each with
    ``responses_per_round`` responses to every prompt, each response weighted by its reward minus the mean reward
    of the *other* responses to its prompt in its round (leave-one-out: unbiased), divided by the number of
    responses per round."""
    if responses_per_round < 2 or rounds < 2:
        raise ValueError(
            f"reference_gradient: responses_per_round={responses_per_round} and rounds={rounds} must both be >= 2 "
            "(a leave-one-out baseline needs two responses; a standard error needs two rounds)."
        )
    indices = list(range(len(task.prompt_ids)))
    per_round: list[torch.Tensor] = []
    reward_sum, degenerate = 0.0, 0
    iterator: Any = range(rounds)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="reference gradient", unit="round")
    for _ in iterator:
        batch = task.sample_group(indices, responses_per_round)
        rewards = torch.nan_to_num(batch.all_rewards, nan=0.0).view(-1, responses_per_round)
        reward_sum += float(rewards.sum())
        degenerate += groups_without_signal(rewards)[0]
        others = (rewards.sum(dim=1, keepdim=True) - rewards) / (responses_per_round - 1)
        per_response = ((rewards - others) / rewards.numel()).reshape(-1)
        weights = per_response[:, None] * batch.completion_mask.float()
        per_round.append(
            weighted_logprob_gradient(task.oracle, batch.prompt_ids, batch.completion_ids, weights)
        )
    stacked = torch.stack(per_round)
    half = rounds // 2
    first, second = stacked[:half].mean(0), stacked[half:].mean(0)
    return ReferenceGradient(
        gradient=stacked.mean(0),
        standard_error=stacked.std(0, unbiased=True) / math.sqrt(rounds),
        split_half_cosine=_cosine(first, second),
        responses=rounds * responses_per_round * len(indices),
        rounds=rounds,
        mean_reward=reward_sum / (rounds * responses_per_round * len(indices)),
        degenerate_share=degenerate / (rounds * len(indices)),
    )


@dataclass
class GradientEstimate:
    """One batch gradient of one estimator, with what it cost.

    Attributes:
        gradient: the ascent direction the trainer's loss would follow (flattened).
        sampled_tokens: response tokens plus Monte Carlo rollout tokens.
        trained_tokens: completion tokens in the loss.
        seconds: wall time of sampling, estimating and the gradient.
    """

    gradient: torch.Tensor
    sampled_tokens: int
    trained_tokens: int
    seconds: float


def estimator_gradient(
    task: GradientTask,
    estimator: Any,
    prompt_indices: Sequence[int],
    group_size: int,
    *,
    whiten: bool | None = None,
) -> GradientEstimate:
    """One batch gradient exactly as the trainer computes it for one update (on-policy, ratio 1, ``dapo``): sample
    ``group_size`` responses per prompt (drawn as a tree when the estimator has a ``tree_schedule``), grade them,
    run the estimator, whiten the advantages over the batch's
    valid tokens when ``whiten`` (None: the estimator's ``whiten_by_default``), and differentiate
    ``sum A log pi / completion tokens``."""
    start = time.perf_counter()
    estimator = as_advantage_estimator(estimator)
    schedule = (
        estimator.tree_schedule(task.max_completion_length) if isinstance(estimator, DrawsTrees) else None
    )
    # A group drawn as a tree: its sampled tokens are what the tree generated, not its leaves' lengths.
    if schedule is not None:
        batch, tree_tokens = task.sample_trees(prompt_indices, schedule)
    else:
        batch, tree_tokens = task.sample_group(prompt_indices, group_size), None
    result = estimator.estimate(batch, task.context())
    mask = batch.completion_mask.bool()
    valid = mask if result.token_mask is None else (result.token_mask.bool() & mask)
    advantages = result.advantages.float() * valid
    if whiten if whiten is not None else estimator.whiten_by_default:
        advantages = (
            masked_whiten(advantages, valid) if int(valid.sum()) >= 2 else torch.zeros_like(advantages)
        )
    weights = advantages * mask / max(int(mask.sum()), 1)
    gradient = weighted_logprob_gradient(task.oracle, batch.prompt_ids, batch.completion_ids, weights)
    response_tokens = int(mask.sum())
    rollout_tokens = int(result.metrics.get("generated_tokens", 0) or 0)
    return GradientEstimate(
        gradient=gradient,
        sampled_tokens=response_tokens + rollout_tokens if tree_tokens is None else tree_tokens,
        trained_tokens=response_tokens,
        seconds=time.perf_counter() - start,
    )


# ---------------------------------------------------------------------------------------------------------------
# Quality
# ---------------------------------------------------------------------------------------------------------------


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = float(a.norm() * b.norm())
    return float(a @ b) / denom if denom > 0 else math.nan


def _bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> list[float]:
    """Percentile bootstrap interval of the mean."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return [math.nan, math.nan]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(finite, k=len(finite))) / len(finite) for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return [lo, hi]


def gradient_metrics(
    estimates: Sequence[torch.Tensor],
    reference: ReferenceGradient | torch.Tensor,
    *,
    seed: int = 0,
) -> dict[str, Any]:
    """Quality of repeated batch-gradient estimates against the reference.

    Returns a dict with, over the ``repeats`` estimates (95% percentile-bootstrap intervals of the mean):

    - ``cosine`` / ``cosine_ci``: cosine to the reference (``cosines``: per repeat, for paired comparisons);
    - ``scale``: the estimator's overall scale, ``mean <g_hat, g> / ||g||^2`` (whitening changes it);
    - ``rel_sq_error`` / ``rel_sq_error_ci``: ``||g_hat / scale - g||^2 / ||g||^2``: variance and bias relative to
      the signal once the overall scale is removed;
    - ``sign_agreement`` / ``sign_agreement_ci``: share of coordinates whose sign matches the reference's, over the
      coordinates the reference decides (``|g_j| > 2 SE_j``; all coordinates for an exact reference);
    - ``mean_cosine``: cosine of the *mean* estimate to the reference (tends to 1 with more repeats iff the
      estimator is unbiased up to scale);
    - ``bias_ratio``: the squared norm of the mean estimate's component orthogonal to the reference, divided by
      what noise alone (the estimates' spread / repeats, and the reference's standard error) would give. About 1
      for an unbiased estimator, growing with the repeats for a biased one.
    """
    if len(estimates) < 2:
        raise ValueError(f"gradient_metrics: got {len(estimates)} estimates; pass at least 2 repeats.")
    if isinstance(reference, ReferenceGradient):
        g, se = reference.gradient.float(), reference.standard_error.float()
    else:
        g, se = reference.float(), torch.zeros_like(reference, dtype=torch.float32)
    stacked = torch.stack([e.float() for e in estimates])
    norm2 = float(g @ g)
    if norm2 <= 0:
        raise ValueError("gradient_metrics: the reference gradient is zero; nothing to compare with.")
    # A zero estimate (every group degenerate: all rewards equal) moves nothing: cosine 0, not undefined.
    cosines = [_cosine(e, g) if float(e.norm()) > 0 else 0.0 for e in stacked]
    projections = stacked @ g / norm2
    scale = float(projections.mean())
    rel = [float(((e / scale - g) ** 2).sum()) / norm2 if scale > 0 else math.nan for e in stacked]
    decided = g.abs() > 2 * se
    if not bool(decided.any()):
        decided = torch.ones_like(g, dtype=torch.bool)
    signs = [float((torch.sign(e[decided]) == torch.sign(g[decided])).float().mean()) for e in stacked]
    # Bias shows as a mean estimate that leaves the reference's direction: compare its orthogonal part with what
    # noise alone puts there (the estimates' own orthogonal spread over the repeats, and the reference's error).
    orthogonal_parts = stacked - projections[:, None] * g
    orthogonal = orthogonal_parts.mean(0)
    repeats = stacked.shape[0]
    noise = float(orthogonal_parts.var(0, unbiased=True).sum()) / repeats + scale**2 * float((se**2).sum())
    return {
        "repeats": repeats,
        "cosine": sum(cosines) / repeats,
        "cosine_ci": _bootstrap_ci(cosines, seed=seed),
        "scale": scale,
        "rel_sq_error": sum(rel) / repeats,
        "rel_sq_error_ci": _bootstrap_ci(rel, seed=seed + 1),
        "sign_agreement": sum(signs) / repeats,
        "sign_agreement_ci": _bootstrap_ci(signs, seed=seed + 2),
        "decided_coordinates": int(decided.sum()),
        "mean_cosine": _cosine(stacked.mean(0), g),
        "bias_ratio": float(orthogonal @ orthogonal) / noise if noise > 0 else math.nan,
        # Per repeat, for paired comparisons between estimators measured on the same prompts (common random numbers).
        "cosines": [round(c, 6) for c in cosines],
    }
