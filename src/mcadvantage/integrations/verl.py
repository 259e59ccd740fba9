"""VinePPO's Monte Carlo advantages inside verl (``pip install 'mcadvantage[verl]'``).

verl's registered advantage estimators (``core_algos.register_adv_est``) receive only reward tensors, so they
cannot sample continuations. The Monte Carlo step runs in the driver instead, where the rollout handle is
reachable (as verl's REMAX branch of ``RayPPOTrainer.fit`` does for its greedy baseline):

- :class:`VerlRolloutSampler`: the :class:`~mcadvantage.samplers.base.Sampler` protocol over anything with
  ``generate_sequences(DataProto) -> DataProto`` (verl's ``async_rollout_manager``, an actor-rollout worker
  group, or a stand-in). All requests of a training step go out in one call (or in chunks of
  ``max_batch_size``), packed the way verl packs prompts.
- :func:`compute_vineppo_advantage`: reads a verl training batch (after generation and rewards), runs
  :class:`~mcadvantage.estimators.vineppo.VinePPOEstimator` through that sampler, whitens as
  ``VinePPOTrainer`` does, and writes ``advantages`` and ``returns`` where verl's ``compute_advantage`` writes
  them. It returns metrics in verl's flat ``"section/name": float`` style.
- :func:`verl_reward_function`: verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``
  as a reward function the estimator can grade rollouts with.

The trainer subclass that calls it between reward computation and the actor update is a recipe in
``examples/verl/`` (it needs Ray and GPUs); see ``docs/howto/verl.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from packaging.version import Version

try:
    import verl
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "mcadvantage.integrations.verl needs verl: pip install 'mcadvantage[verl]' (or, next to pinned "
        "packages, `pip install --no-deps verl` plus tensordict and ray; see docs/howto/verl.md)."
    ) from err

from mcadvantage.core.versions import check_version_range
from mcadvantage.estimators.batch import AdvantageBatch, EstimatorContext, finalize_advantages
from mcadvantage.estimators.vineppo import VinePPOEstimator
from mcadvantage.samplers.base import Continuation, RolloutRequest

__all__ = [
    "SUPPORTED_VERL",
    "VerlRolloutSampler",
    "advantage_batch_from_verl",
    "check_verl_version",
    "compute_vineppo_advantage",
    "continuation_from_ids",
    "response_scores",
    "verl_reward_function",
]

#: The verl releases this adapter is tested with (pyproject's ``verl`` extra says the same).
SUPPORTED_VERL = ">=0.8,<0.10"
_MIN, _MAX = Version("0.8"), Version("0.10")

# Non-tensor columns that are not reward-function inputs (engine inputs, rollout bookkeeping).
_NOT_REWARD_COLUMNS = frozenset(
    {
        "raw_prompt",
        "raw_prompt_ids",
        "multi_modal_data",
        "multi_modal_inputs",
        "agent_name",
        "__num_turns__",
        "tools_kwargs",
        "interaction_kwargs",
    }
)


def check_verl_version(version: str | None = None) -> None:
    """Check the installed (or given) verl version against :data:`SUPPORTED_VERL`.

    Raises:
        ImportError: for a verl outside the supported range, naming the install command.
    """
    check_version_range(
        version if version is not None else verl.__version__,
        _MIN,
        _MAX,
        lambda v: (
            f"mcadvantage.integrations.verl supports verl {SUPPORTED_VERL} but verl {v} is installed: it relies on "
            f"DataProto's layout and RayPPOTrainer's hooks, which verl changes between minor releases. Run: "
            f"pip install 'verl{SUPPORTED_VERL}'."
        ),
    )


check_verl_version()


def _object_array(items: Sequence[Any]) -> np.ndarray:
    """A 1-D object array (numpy would turn equal-length lists into a 2-D array)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """verl's convention (``verl.utils.model.compute_position_id_with_mask``): 0 on left padding, then 0, 1, ..."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


def continuation_from_ids(
    ids: Sequence[int], budget: int, eos_token_ids: frozenset[int], *, width: int | None = None
) -> Continuation:
    """A generated row as a :class:`Continuation`: cut after the first EOS (kept) and at ``budget`` tokens;
    truncated when it has no EOS and used its whole budget (or the engine's ``width``, when smaller)."""
    ids = list(ids)
    end = next((j + 1 for j, t in enumerate(ids) if t in eos_token_ids), None)
    ids = ids[: min(end if end is not None else len(ids), budget)]
    finished = bool(ids) and ids[-1] in eos_token_ids
    limit = budget if width is None else min(budget, width)
    return Continuation(tuple(ids), truncated=not finished and len(ids) >= limit)


class VerlRolloutSampler:
    """The :class:`~mcadvantage.samplers.base.Sampler` protocol over a verl rollout handle.

    Args:
        rollout: anything with ``generate_sequences(DataProto) -> DataProto`` returning verl's output layout
            (``responses`` right-padded, ``attention_mask`` over prompt + response with 1 up to and including
            EOS): ``RayPPOTrainer.async_rollout_manager``, an actor-rollout worker group, or a stand-in.
        pad_token_id: the tokenizer's pad id (left-pads the prefixes).
        eos_token_id: EOS id, or several (a continuation ends at the first one).
        temperature: sent as ``meta_info["temperature"]`` (verl's engines sample with the rollout config's
            temperature; set it to the same value).
        max_batch_size: at most this many sequences per ``generate_sequences`` call (None: one call).
        size_divisor: pad every call to a multiple of this (a worker group's world size), with verl's
            ``pad_dataproto_to_divisor`` / ``unpad_dataproto``.
        agent_name: sets the ``agent_name`` column (verl's agent-loop manager picks the loop per row); the
            recipe's ``mcadvantage_prefix`` loop generates from ``raw_prompt_ids``. verl's default single-turn loop
            cannot generate from a partial response, so with ``RayPPOTrainer.async_rollout_manager`` pass the
            recipe's loop.
        meta_info: extra ``meta_info`` for every call.

    Each request's ``n`` samples are ``n`` rows (verl's ``DataProto.repeat(n, interleave=True)`` layout), so
    requests with different ``n`` share a call. The call's ``meta_info["response_length"]`` is the largest
    budget; a longer continuation is cut at its request's ``max_tokens`` (the first ``m`` tokens of a sample
    are a sample of ``m`` tokens) and marked truncated. ``calls`` counts ``generate_sequences`` calls.

    On verl's agent-loop manager (``async_rollout_manager``), every call is split evenly over its agent-loop
    workers (``DataProto.chunk``), so set ``size_divisor`` to ``actor_rollout_ref.rollout.agent.num_workers``
    (the recipe does). The agent loop copies each row's ``raw_prompt`` into its output, which :meth:`pack` provides
    (an empty message list: a Monte Carlo state is token ids, not chat messages). verl's reward loop is not asked
    to grade the continuations: the recipe's prefix loop returns them with a score, which makes verl skip its own
    ``compute_score``. A continuation alone is not the response verl's score functions expect (the step prefix is
    missing from it), and the estimator grades every rollout itself with its ``reward_funcs`` on the whole
    response, so the packed rows carry no ``data_source`` / ``reward_model`` columns.
    """

    def __init__(
        self,
        rollout: Any,
        *,
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
        temperature: float | None = None,
        max_batch_size: int | None = None,
        size_divisor: int = 1,
        agent_name: str | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> None:
        if not callable(getattr(rollout, "generate_sequences", None)):
            raise TypeError(f"{type(rollout).__name__} has no generate_sequences(DataProto) -> DataProto.")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}.")
        self.rollout = rollout
        self.pad_token_id = int(pad_token_id)
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.eos_token_ids = frozenset(int(e) for e in eos)
        self.temperature = temperature
        self.max_batch_size = max_batch_size
        self.size_divisor = int(size_divisor)
        self.agent_name = agent_name
        self.meta_info = dict(meta_info or {})
        self.calls = 0

    def pack(self, prefixes: Sequence[Sequence[int]], budgets: Sequence[int]) -> DataProto:
        """One row per prefix: left-padded ``input_ids``, ``attention_mask``, ``position_ids``; as non-tensor
        columns ``raw_prompt_ids`` (the prefix), ``raw_prompt`` (an empty message list, which verl's agent loop
        copies into its output), the per-row budget ``mc_max_tokens`` and ``agent_name`` when set; the sampling
        settings in ``meta_info``."""
        width = max(len(p) for p in prefixes)
        input_ids = torch.full((len(prefixes), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prefixes), width), dtype=torch.long)
        for i, prefix in enumerate(prefixes):
            input_ids[i, width - len(prefix) :] = torch.tensor(list(prefix), dtype=torch.long)
            attention_mask[i, width - len(prefix) :] = 1
        non_tensors: dict[str, np.ndarray] = {
            "raw_prompt_ids": _object_array([list(p) for p in prefixes]),
            "raw_prompt": _object_array([[] for _ in prefixes]),
            "mc_max_tokens": np.asarray(budgets, dtype=np.int64),
        }
        if self.agent_name is not None:
            non_tensors["agent_name"] = _object_array([self.agent_name] * len(prefixes))
        meta = {
            "eos_token_id": sorted(self.eos_token_ids)[0]
            if len(self.eos_token_ids) == 1
            else sorted(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
            "do_sample": True,
            "validate": False,
            "response_length": int(max(budgets)),
            **({"temperature": self.temperature} if self.temperature is not None else {}),
            **self.meta_info,
        }
        return DataProto.from_dict(
            tensors={
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "position_ids": _position_ids(attention_mask),
            },
            non_tensors=non_tensors,
            meta_info=meta,
        )

    def unpack(self, output: DataProto, budgets: Sequence[int]) -> list[Continuation]:
        """verl's generation output -> one :class:`Continuation` per row (EOS kept, padding dropped)."""
        responses = output.batch["responses"]
        width = responses.shape[1]
        mask = output.batch["attention_mask"][:, -width:].bool()
        if len(output) != len(budgets):
            raise RuntimeError(f"generate_sequences returned {len(output)} rows for {len(budgets)} requests.")
        return [
            continuation_from_ids(responses[i][mask[i]].tolist(), budget, self.eos_token_ids, width=width)
            for i, budget in enumerate(budgets)
        ]

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """Per request, ``request.n`` continuations: one ``generate_sequences`` call per ``max_batch_size``
        sequences (one call when None)."""
        rows = [(k, tuple(r.prefix_ids), r.max_tokens) for k, r in enumerate(requests) for _ in range(r.n)]
        results: list[list[Continuation]] = [[] for _ in requests]
        step = self.max_batch_size or max(len(rows), 1)
        for start in range(0, len(rows), step):
            part = rows[start : start + step]
            budgets = [m for _, _, m in part]
            data, pad = pad_dataproto_to_divisor(
                self.pack([p for _, p, _ in part], budgets), self.size_divisor
            )
            output = unpad_dataproto(self.rollout.generate_sequences(data), pad_size=pad)
            self.calls += 1
            for (k, _, _), continuation in zip(part, self.unpack(output, budgets), strict=True):
                results[k].append(continuation)
        return results


def verl_reward_function(compute_score: Callable[..., Any] | None = None) -> Callable[..., list[float]]:
    """verl's score function as a reward function for the estimator (TRL's signature).

    ``compute_score(data_source, solution_str, ground_truth, extra_info)`` (verl's
    ``verl.utils.reward_score.default_compute_score`` when None) is called per rollout with the row's
    ``data_source``, ``reward_model["ground_truth"]`` and ``extra_info`` columns; a dict result gives its
    ``"score"``.
    """

    def verl_score(
        prompts: Sequence[Any],
        completions: Sequence[str],
        data_source: Sequence[Any] | None = None,
        reward_model: Sequence[Any] | None = None,
        extra_info: Sequence[Any] | None = None,
        **_: Any,
    ) -> list[float]:
        score = compute_score
        if score is None:
            from verl.utils.reward_score import default_compute_score as score
        out = []
        for i, text in enumerate(completions):
            gold = reward_model[i].get("ground_truth") if reward_model is not None else None
            value = score(
                data_source[i] if data_source is not None else None,
                text,
                gold,
                extra_info[i] if extra_info is not None else None,
            )
            out.append(float(value["score"] if isinstance(value, dict) else value))
        return out

    return verl_score


def response_scores(data: DataProto) -> torch.Tensor:
    """``(B,)`` reward of every response: ``token_level_scores`` (before any KL penalty), else ``rm_scores``,
    else ``token_level_rewards``, summed over tokens (verl puts the score on the last response token)."""
    for key in ("token_level_scores", "rm_scores", "token_level_rewards"):
        if key in data.batch.keys():
            return data.batch[key].float().sum(dim=-1).cpu()
    raise KeyError(
        "The verl batch has no token_level_scores, rm_scores or token_level_rewards: compute rewards first."
    )


def advantage_batch_from_verl(data: DataProto, tokenizer: Any = None) -> AdvantageBatch:
    """A verl training batch (``prompts`` left-padded, ``responses`` right-padded, ``attention_mask`` over both)
    as the estimator seam's :class:`~mcadvantage.estimators.batch.AdvantageBatch`.

    Prompts for the reward functions are ``raw_prompt`` when the batch has it, else the decoded prompt; the
    other non-tensor columns (``data_source``, ``reward_model``, ``extra_info``, ...) are the rows.

    Raises:
        NotImplementedError: for multi-turn responses (``response_mask`` differs from the response's attention
            mask: tool outputs inside the response are not the policy's tokens).
    """
    prompts = data.batch["prompts"]
    responses = data.batch["responses"]
    width = prompts.shape[1]
    attention = data.batch["attention_mask"]
    prompt_mask, response_attention = attention[:, :width].bool(), attention[:, width:].bool()
    response_mask = (
        data.batch["response_mask"] if "response_mask" in data.batch.keys() else response_attention
    )
    if not torch.equal(response_mask.bool(), response_attention):
        raise NotImplementedError(
            "response_mask differs from the responses' attention mask (multi-turn or tool tokens): Monte Carlo "
            "states inside tool outputs are not supported."
        )
    size = responses.shape[0]
    prompt_ids = [prompts[i][prompt_mask[i]].tolist() for i in range(size)]
    columns = {k: v for k, v in data.non_tensor_batch.items() if k not in _NOT_REWARD_COLUMNS}
    if "raw_prompt" in data.non_tensor_batch:
        texts = list(data.non_tensor_batch["raw_prompt"])
    elif tokenizer is not None:
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in prompt_ids]
    else:
        texts = []
    return AdvantageBatch(
        prompt_ids=prompt_ids,
        completion_ids=[responses[i][response_attention[i]].tolist() for i in range(size)],
        completion_mask=response_mask.long().cpu(),
        rewards_per_func=response_scores(data).unsqueeze(1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, size),
        group_size=1,
        prompts=texts,
        rows=[{k: v[i] for k, v in columns.items()} for i in range(size)],
    )


def compute_vineppo_advantage(
    data: DataProto,
    *,
    sampler: Any,
    reward_funcs: Callable[..., Any] | Sequence[Callable[..., Any]],
    tokenizer: Any,
    estimator: VinePPOEstimator | None = None,
    reward_weights: Sequence[float] | None = None,
    segmenter: Any = "gsm8k",
    max_completion_length: int | None = None,
    context_length: int | None = None,
    whiten: bool = True,
    metric_prefix: str = "mc",
) -> dict[str, float]:
    """VinePPO advantages for a verl training batch, written to ``data.batch["advantages"]`` and
    ``data.batch["returns"]`` (as verl's critic-free estimators, ``returns`` equals ``advantages``).

    Args:
        data: the batch after generation and reward computation (``prompts``, ``responses``,
            ``attention_mask``, and ``token_level_scores`` / ``rm_scores`` / ``token_level_rewards``).
        sampler: a :class:`~mcadvantage.samplers.base.Sampler` on the current policy
            (:class:`VerlRolloutSampler` in a verl trainer).
        reward_funcs: grade the rollouts (TRL signature): :func:`verl_reward_function` or a verifier.
        tokenizer: the policy's tokenizer.
        estimator: a configured :class:`~mcadvantage.estimators.vineppo.VinePPOEstimator` (default: K=9).
        reward_weights: weights of ``reward_funcs`` (default: 1 each).
        segmenter: how responses are cut into steps (a name or a segmenter; the estimator's own wins).
        max_completion_length: the responses' token budget (default: the batch's response width, verl's
            ``data.max_response_length``).
        context_length: the policy's context, checked per prompt when given.
        whiten: token-weighted whitening over the batch, as ``VinePPOTrainer(whiten_advantages=True)``: the
            estimator's result goes through :func:`~mcadvantage.estimators.batch.finalize_advantages`, the step
            ``VinePPOTrainer.compute_advantages`` uses.
        metric_prefix: prefix of the returned metric names.

    Returns:
        ``{f"{metric_prefix}/{name}": value}``, to ``metrics.update(...)`` in ``RayPPOTrainer.fit``.

    Raises:
        FloatingPointError: when the estimator returns a non-finite advantage on an estimated token (nothing is
            written to ``data``).
    """
    batch = advantage_batch_from_verl(data, tokenizer)
    estimator = estimator if estimator is not None else VinePPOEstimator()
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    context = EstimatorContext.single_process(
        sampler,
        funcs,
        tokenizer,
        reward_weights=list(reward_weights) if reward_weights is not None else [1.0] * len(funcs),
        segmenter=segmenter,
        max_completion_length=max_completion_length or int(data.batch["responses"].shape[1]),
        context_length=context_length,
    )
    result = estimator.estimate(batch, context)
    # VinePPOTrainer.compute_advantages' own step (finite check, whitening over the estimated tokens).
    advantages = finalize_advantages(
        result, batch.completion_mask, whiten=whiten, estimator=type(estimator).__name__
    )
    device = data.batch["responses"].device
    data.batch["advantages"] = advantages.to(device)
    data.batch["returns"] = advantages.clone().to(device)
    return {
        f"{metric_prefix}/{name}": float(value)
        for name, value in result.metrics.items()
        if not math.isnan(value)
    }
