"""``VinePPOTrainer``: TRL's ``GRPOTrainer`` with VinePPO's Monte Carlo per-token advantages.

TRL 1.16's ``GRPOTrainer`` already implements VinePPO's policy loss (PPO clipped surrogate over
``num_iterations`` epochs, k3 KL to a reference model in the loss) and accepts per-token advantages of
shape ``(B, T)`` from subclasses. So this trainer overrides only ``_generate_and_score_completions``
(TRL maintainers' supported extension point): it lets GRPO generate and grade the responses, then
replaces GRPO's group advantages with Monte Carlo step advantages:

1. every local response is cut into reasoning steps (``args.step_segmenter``) aligned to its tokens;
2. :class:`~mcadvantage.estimator.MCValueEstimator` samples ``num_mc_rollouts`` continuations from the
   state before each step with the current policy (same engine and sampling settings as the
   responses) and grades them with the trainer's reward functions;
3. every token of step ``i`` gets ``V(S_i) - V(S_{i-1})`` (``V(S_n) = R``, the response's own reward);
4. the advantages are whitened over all completion tokens of the batch, statistics all-reduced across
   ranks, and handed to GRPO's loss.

``_calculate_rewards`` is wrapped only to keep what GRPO computed (the exact completion token ids,
prompts and the gathered rewards) instead of recomputing it.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import trl
from accelerate.utils import broadcast_object_list, gather_object
from packaging.version import Version
from torch import nn
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

from .advantages import masked_whiten
from .config import VinePPOConfig
from .estimator import MCEstimate, MCValueEstimator, Trajectory
from .samplers.base import Sampler
from .segmenters import get_segmenter, segment_completion

__all__ = ["VinePPOTrainer", "check_trl_version", "SUPPORTED_TRL"]

#: TRL versions this trainer is tested against. It relies on GRPOTrainer internals that TRL rewrites often
#: (``_generate_and_score_completions``' output keys, ``_calculate_rewards``, ``vllm_generation``), so other
#: 1.x minors get a warning and other majors are refused.
SUPPORTED_TRL = ">=1.16,<1.17"

# Dataset columns that GRPO itself consumes; everything else is passed to reward functions.
_NON_REWARD_COLUMNS = ("prompt", "completion", "completion_ids")


def check_trl_version(version: str | None = None) -> None:
    """Check the installed (or given) TRL version against :data:`SUPPORTED_TRL`.

    Raises:
        ImportError: for TRL < 1.16 (no ``(B, T)`` advantages in ``GRPOTrainer``) or another major version.
    Warns:
        UserWarning: for a TRL 1.x release newer than 1.16 (untested GRPO internals).
    """
    v = Version(version if version is not None else trl.__version__)
    if v.major != 1 or v < Version("1.16"):
        raise ImportError(
            f"mcadvantage.VinePPOTrainer supports TRL {SUPPORTED_TRL} but TRL {v} is installed. "
            "Install a supported version: pip install 'trl>=1.16,<1.17'."
        )
    if (v.major, v.minor) != (1, 16):
        warnings.warn(
            f"mcadvantage.VinePPOTrainer is tested with TRL {SUPPORTED_TRL}; TRL {v} is installed. GRPOTrainer "
            "internals may have changed: if training fails, pip install 'trl>=1.16,<1.17'.",
            UserWarning,
            stacklevel=3,
        )


def _reward_func_name(func: Any) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def _required_column_options(func: Any) -> list[tuple[str, ...]]:
    """Columns a reward function needs, as a list of alternatives groups: each tuple needs at least one of
    its columns. Uses ``required_columns`` when the function declares it (mcadvantage verifiers do), else the
    verifiers' ``answer_field`` / ``solution_field`` convention; plain functions declare nothing."""
    declared = getattr(func, "required_columns", None)
    if declared is not None:
        if isinstance(declared, str):
            return [(declared,)]
        return [tuple(group) if isinstance(group, (tuple, list)) else (group,) for group in declared]
    answer = getattr(func, "answer_field", None)
    solution = getattr(func, "solution_field", None)
    fields = tuple(f for f in (answer, solution) if isinstance(f, str))
    return [fields] if fields else []


def _check_dataset_columns(dataset: Any, reward_funcs: Sequence[Any], dataset_name: str) -> None:
    """Fail at init when a dataset lacks a column a reward function needs (instead of at the first batch)."""
    columns = getattr(dataset, "column_names", None)
    if (
        columns is None
    ):  # e.g. an IterableDataset without known features: checked at batch time by the verifier
        return
    columns = set(columns)
    if "prompt" not in columns:
        raise ValueError(
            f"{dataset_name} has no 'prompt' column (columns: {sorted(columns)}). VinePPOTrainer, like "
            "GRPOTrainer, needs prompts in a 'prompt' column: rename yours with dataset.rename_column(...)."
        )
    for func in reward_funcs:
        for group in _required_column_options(func):
            if not columns.intersection(group):
                need = repr(group[0]) if len(group) == 1 else "one of " + ", ".join(repr(c) for c in group)
                raise ValueError(
                    f"Reward function {_reward_func_name(func)!r} needs the dataset column {need}, but "
                    f"{dataset_name} has only {sorted(columns)}. Add the column, rename it (e.g. "
                    "dataset.rename_column('gold', 'answer')), or build the verifier with answer_field=<your column>."
                )


class _NoopLogger:
    """Stands in for TRL's ``log_extra`` / ``log_metric`` during Monte Carlo grading: rollouts are not training
    responses, so what a reward function logs about them must not enter the completions table or metrics."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class VinePPOTrainer(GRPOTrainer):
    """VinePPO (arXiv 2410.01679) as a drop-in TRL trainer: ``GRPOTrainer`` with Monte Carlo step advantages.

    Use it like ``trl.GRPOTrainer`` with a :class:`~mcadvantage.config.VinePPOConfig`:

        trainer = VinePPOTrainer(model="path/to/sft-model", reward_funcs=GSM8KVerifier(), args=VinePPOConfig(...),
                                 train_dataset=dataset)   # columns: "prompt", "answer"
        trainer.train()

    Monte Carlo rollouts run on the engine that generated the responses, with the same sampling settings:
    TRL's colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``; woken up for the rollouts when
    ``vllm_enable_sleep_mode`` is on), the vLLM server (``vllm_mode="server"``: the main process gathers every
    rank's responses, estimates them and sends each rank its part), or the policy itself with transformers
    ``generate`` otherwise. With several processes each rank estimates its own responses (except in server
    mode) and the whitening statistics are global, so the advantages equal a single process' on the same
    batch.

    Args:
        model: the policy, as for ``trl.GRPOTrainer``: a model id, a local directory or a loaded causal LM.
        reward_funcs: reward function(s) called TRL-style, e.g. :class:`~mcadvantage.verifiers.GSM8KVerifier`.
            They grade both the responses and every Monte Carlo continuation (on the full response text).
            Only Python callables are supported: reward models (``nn.Module`` or model ids) and async
            functions raise ``NotImplementedError``.
        args: a :class:`~mcadvantage.config.VinePPOConfig` (a plain ``GRPOConfig`` raises ``TypeError``);
            default ``VinePPOConfig("<model name>-VinePPO")``.
        train_dataset: as for ``trl.GRPOTrainer``: a ``prompt`` column plus the columns the reward
            functions read (e.g. ``answer``); checked at init.
        eval_dataset: as for ``trl.GRPOTrainer`` (checked like ``train_dataset``).
        processing_class: as for ``trl.GRPOTrainer``: a text tokenizer (vision-language processors raise
            ``NotImplementedError``).
        reward_processing_classes: as for ``trl.GRPOTrainer`` (only used by reward models, which are not
            supported).
        callbacks: as for ``trl.GRPOTrainer``.
        optimizers: as for ``trl.GRPOTrainer``.
        quantization_config: as for ``trl.GRPOTrainer``.
        peft_config: as for ``trl.GRPOTrainer``.
        mc_sampler: optional :class:`~mcadvantage.samplers.Sampler` used for the Monte Carlo rollouts instead of
            the engine chosen above (advanced: custom engines, tests). It must sample from the current policy.
        **kwargs: other ``GRPOTrainer`` keyword arguments. ``tools``, ``rollout_func`` and ``environment_factory``
            raise ``NotImplementedError`` (a Monte Carlo continuation cannot replay tool calls or environment steps).

    Attributes:
        last_mc_estimate: the local :class:`~mcadvantage.estimator.MCEstimate` of the latest batch (responses
            that were estimated, in batch order; see ``last_mc_rows``).
        last_mc_rows: indices in the local batch of the responses in ``last_mc_estimate``. Responses left out
            (empty, unscorable by every reward function, or masked by ``mask_truncated_completions``) get
            advantage 0 and do not count in the whitening statistics.

    Logged metrics (``mc/*``, summed or averaged over ranks): ``rollouts``, ``generated_tokens``, ``seconds``
    (slowest rank's estimation time), ``states``, ``dedup_ratio`` (share of states served by another
    identical state), ``mean_value`` (mean estimated ``V(S_i)``), ``mean_abs_advantage`` (token mean of
    ``|A|`` before whitening), ``steps_per_response``, ``truncated_rollout_ratio``. The completions table's
    ``advantage`` column holds, per response, the mean of its whitened token advantages.
    """

    _tag_names = ["trl", "vineppo", "mcadvantage"]
    _name = "VinePPO"

    def __init__(
        self,
        model: Any,
        reward_funcs: Callable | Sequence[Callable],
        args: VinePPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: Any = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        *,
        mc_sampler: Sampler | None = None,
        **kwargs: Any,
    ) -> None:
        check_trl_version()
        for unsupported in ("tools", "rollout_func", "environment_factory"):
            if kwargs.get(unsupported) is not None:
                raise NotImplementedError(
                    f"VinePPOTrainer does not support {unsupported}=: Monte Carlo continuations are plain "
                    "generations from a prefix, so tool calls or environment steps inside a response could not "
                    f"be replayed. Use trl.GRPOTrainer for {unsupported}, or drop it."
                )
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = VinePPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-VinePPO")
        elif not isinstance(args, VinePPOConfig):
            kind = "a GRPOConfig" if isinstance(args, GRPOConfig) else type(args).__name__
            raise TypeError(
                f"args is {kind}, but VinePPOTrainer needs a mcadvantage.VinePPOConfig (it adds the Monte Carlo "
                "settings and the paper's defaults). Build one with VinePPOConfig(**your_kwargs)."
            )
        if reward_funcs is None:
            raise ValueError(
                "reward_funcs is None: VinePPO grades every response and Monte Carlo continuation with reward "
                "functions. Pass e.g. mcadvantage.GSM8KVerifier() or a function f(prompts, completions, **kw)."
            )
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        for func in funcs:
            if isinstance(func, (str, nn.Module)):
                raise NotImplementedError(
                    f"reward function {func!r} is a reward model; VinePPOTrainer supports only Python callables, "
                    "since every Monte Carlo continuation is graded too and reward-model scoring of rollouts is "
                    "not implemented. Wrap the model in a function f(prompts, completions, **kw) -> list[float]."
                )
            if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
                raise NotImplementedError(
                    f"reward function {_reward_func_name(func)!r} is async; the Monte Carlo estimator calls reward "
                    "functions synchronously. Pass a synchronous function."
                )
        # Missing columns fail here, before the model (and a vLLM engine) is loaded.
        if train_dataset is not None:
            _check_dataset_columns(train_dataset, funcs, "train_dataset")
        if isinstance(eval_dataset, dict):
            for key, ds in eval_dataset.items():
                _check_dataset_columns(ds, funcs, f"eval_dataset[{key!r}]")
        elif eval_dataset is not None:
            _check_dataset_columns(eval_dataset, funcs, "eval_dataset")
        if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size > 1:
            raise NotImplementedError(
                f"vllm_tensor_parallel_size={args.vllm_tensor_parallel_size} is not supported by VinePPOTrainer "
                "in colocate mode (every rank of a tensor-parallel group would have to submit the same rollout "
                "requests). Use vllm_tensor_parallel_size=1 or vllm_mode='server'."
            )

        super().__init__(
            model=model,
            reward_funcs=funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            **kwargs,
        )
        if self._is_vlm:
            raise NotImplementedError(
                "VinePPOTrainer does not support vision-language processors: Monte Carlo continuations are "
                "sampled from token prefixes without images. Pass a text tokenizer as processing_class."
            )

        self._segmenter = get_segmenter(args.step_segmenter)
        self._mc_custom_sampler = mc_sampler
        self._mc_captured: dict[str, Any] | None = None
        self.last_mc_estimate: MCEstimate | None = None
        self.last_mc_rows: list[int] = []
        # In server mode only the main process can talk to the vLLM server, so it estimates every rank's
        # responses; everywhere else each rank estimates its own.
        self._mc_on_main_only = mc_sampler is None and self.use_vllm and self.vllm_mode == "server"
        self._mc_vllm_sampler: Sampler | None = None
        if mc_sampler is None and self.use_vllm:
            self._mc_vllm_sampler = self._build_vllm_sampler()
        if self.use_vllm and self.vllm_mode == "colocate":
            # TRL's colocated weight sync fails on vLLM's CPU backend; this swaps in a layerwise reload there and
            # is a no-op on GPU platforms.
            from .samplers.vllm_sync import install_layerwise_weight_sync

            install_layerwise_weight_sync(self)

        self._check_prompt_lengths(self.train_dataset, "train_dataset")

    # ------------------------------------------------------------------------------------------------------
    # Setup helpers
    # ------------------------------------------------------------------------------------------------------

    def _sampling_kwargs(self) -> dict[str, Any]:
        """The training responses' sampling settings, reused for every Monte Carlo continuation."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            # TRL encodes "no top-k" as 0; the samplers use None.
            "top_k": self.top_k if self.top_k else None,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }

    def _build_vllm_sampler(self) -> Sampler | None:
        from .samplers.vllm import VLLMSampler, VLLMServerSampler

        # TRL forwards generation_kwargs to vLLM's SamplingParams for the responses; the rollouts get them too.
        extra = dict(self.args.generation_kwargs or {})
        if self.vllm_mode == "colocate":
            return VLLMSampler(self.vllm_generation.llm, generation_kwargs=extra, **self._sampling_kwargs())
        if self.accelerator.is_main_process:
            return VLLMServerSampler(
                client=self.vllm_generation.vllm_client, generation_kwargs=extra, **self._sampling_kwargs()
            )
        return None

    def _context_length(self) -> int | None:
        """Longest sequence (prompt + completion) the model, or the colocated vLLM engine, can handle."""
        limits = []
        text_config = self.accelerator.unwrap_model(self.model).config.get_text_config()
        max_pos = getattr(text_config, "max_position_embeddings", None)
        if isinstance(max_pos, int) and max_pos > 0:
            limits.append(max_pos)
        if self.use_vllm and self.args.vllm_max_model_length:
            limits.append(int(self.args.vllm_max_model_length))
        return min(limits) if limits else None

    def _needed_completion_room(self) -> int:
        room = int(self.max_completion_length or 0)
        if self.args.mc_rollout_budget == "fixed":
            room = max(room, int(self.args.mc_fixed_rollout_budget))
        return room

    def _check_prompt_lengths(self, dataset: Any, dataset_name: str) -> None:
        """Fail at init when a prompt leaves no room for a full-length completion in the model's context.

        TRL 1.16 has no prompt truncation, so such a prompt would make generation or the Monte Carlo rollouts
        run past the context (an engine error or silent garbage, mid-training). Prompts are tokenised exactly as
        GRPO does; sized datasets are checked in full, iterable ones are checked batch by batch.
        """
        context = self._context_length()
        if dataset is None or context is None or not hasattr(dataset, "__len__"):
            return
        room = self._needed_completion_room()
        chunk = 256
        for start in range(0, len(dataset), chunk):
            prompts = dataset[start : start + chunk]["prompt"]
            prompt_ids, _, _ = self._tokenize_prompts(prompts)
            for offset, ids in enumerate(prompt_ids):
                self._raise_if_too_long(len(ids), context, room, f"{dataset_name} row {start + offset}")

    def _raise_if_too_long(self, prompt_len: int, context: int, room: int, where: str) -> None:
        if prompt_len + room > context:
            budget = (
                "max_completion_length" if room == self.max_completion_length else "mc_fixed_rollout_budget"
            )
            raise ValueError(
                f"The prompt of {where} has {prompt_len} tokens; with {budget}={room} a response needs "
                f"{prompt_len + room} positions but the model's context is {context} (max_position_embeddings"
                f"{' / vllm_max_model_length' if self.use_vllm else ''}). Shorten or filter long prompts (e.g. "
                f"dataset.filter(...)), or lower {budget} to at most {context - prompt_len}."
            )

    # ------------------------------------------------------------------------------------------------------
    # GRPO hooks
    # ------------------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Keep exactly what GRPO graded (token ids with EOS, prompts, rows) and its gathered rewards, so the
        # Monte Carlo step uses the same responses and rewards rather than re-decoding or re-grading them.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mc_captured = {
            "inputs": inputs,
            "prompts": prompts,
            "completion_ids": [list(ids) for ids in completion_ids_list],
            "rewards_per_func": rewards_per_func,
        }
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """GRPO's generation and grading, with ``output["advantages"]`` replaced by VinePPO's per-token ``(B, T)``
        Monte Carlo advantages (whitened across ranks when ``whiten_advantages``)."""
        self._mc_captured = None
        output = super()._generate_and_score_completions(inputs)
        captured = self._mc_captured
        self._mc_captured = None
        if captured is None:  # GRPO changed how it grades: refuse rather than train on GRPO advantages
            raise RuntimeError(
                f"VinePPOTrainer did not see GRPOTrainer._calculate_rewards being called (TRL {trl.__version__}); "
                f"this TRL version is not supported. Install trl{SUPPORTED_TRL}."
            )
        mode = "train" if self.model.training else "eval"
        completion_mask = output["completion_mask"]
        if mode == "eval" and not self.args.mc_estimate_on_eval:
            advantages = torch.zeros(
                completion_mask.shape, dtype=torch.float32, device=completion_mask.device
            )
        else:
            prompt_ids = [
                ids[mask.bool()].tolist()
                for ids, mask in zip(output["prompt_ids"].cpu(), output["prompt_mask"].cpu(), strict=True)
            ]
            advantages = self._estimate_advantages(
                prompt_ids=prompt_ids,
                completion_ids=captured["completion_ids"],
                completion_mask=completion_mask,
                prompts=captured["prompts"],
                rows=captured["inputs"],
                rewards=self._local_rewards(captured["rewards_per_func"], len(prompt_ids)),
                mode=mode,
            )
        output["advantages"] = advantages
        self._log_response_advantages(advantages, completion_mask)
        return output

    # ------------------------------------------------------------------------------------------------------
    # Monte Carlo advantages
    # ------------------------------------------------------------------------------------------------------

    def _local_rewards(self, rewards_per_func: torch.Tensor, batch_size: int) -> torch.Tensor:
        """This process' combined rewards, computed as GRPO does: weighted ``nansum`` over reward functions, NaN
        when every function returned None (unscorable)."""
        start = self.accelerator.process_index * batch_size
        local = rewards_per_func[start : start + batch_size].float().cpu()
        weights = self.reward_weights.to(local.dtype).cpu()
        rewards = (local * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(local).all(dim=1)] = torch.nan
        return rewards

    def _estimate_advantages(
        self,
        *,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        completion_mask: torch.Tensor,
        prompts: Sequence[Any],
        rows: Sequence[dict[str, Any]],
        rewards: torch.Tensor,
        mode: str = "train",
    ) -> torch.Tensor:
        """Per-token Monte Carlo advantages ``(B, T)`` for this process' part of a batch.

        Args:
            prompt_ids: per response, the prompt token ids without padding.
            completion_ids: per response, the completion token ids (EOS kept, no padding).
            completion_mask: ``(B, T)`` GRPO's completion mask (zero rows: masked truncated completions).
            prompts: per response, the prompt as the reward functions take it (string or messages).
            rows: per response, the dataset row (its other columns go to the reward functions).
            rewards: ``(B,)`` combined reward of each response (NaN: unscorable).
            mode: ``"train"`` or ``"eval"`` (where the ``mc/*`` metrics go).

        Collective: every rank must call it (whitening statistics and metrics are all-reduced).
        """
        batch, width = completion_mask.shape
        device = completion_mask.device
        trajectories: list[Trajectory] = []
        estimated_rows: list[int] = []
        mask_cpu = completion_mask.detach().cpu()
        context = self._context_length()
        room = self._needed_completion_room()
        for i in range(batch):
            ids = list(completion_ids[i])
            reward = float(rewards[i])
            if not ids or not math.isfinite(reward) or int(mask_cpu[i].sum()) == 0:
                continue  # nothing to credit: advantage 0, excluded from the whitening statistics
            if context is not None:  # iterable datasets are not checked at init
                self._raise_if_too_long(len(prompt_ids[i]), context, room, f"local batch row {i}")
            fields = {k: v for k, v in rows[i].items() if k not in _NON_REWARD_COLUMNS}
            trajectories.append(
                Trajectory(
                    prompt_ids=list(prompt_ids[i]),
                    completion_ids=ids,
                    step_boundaries=segment_completion(self._segmenter, self.processing_class, ids),
                    reward=reward,
                    prompt=prompts[i],
                    fields=fields,
                )
            )
            estimated_rows.append(i)

        estimate = self._run_estimator(trajectories)
        self.last_mc_estimate = estimate
        self.last_mc_rows = estimated_rows

        raw = torch.zeros((batch, width), dtype=torch.float32)
        valid = torch.zeros((batch, width), dtype=torch.bool)
        for j, i in enumerate(estimated_rows):
            token_advs = estimate.token_advantages[j]
            raw[i, : len(token_advs)] = token_advs
            valid[i] = mask_cpu[i].bool()
        raw, valid = raw.to(device), valid.to(device)

        self._log_mc_metrics(estimate, trajectories, raw, valid, mode)

        if not self.args.whiten_advantages:
            return raw * valid
        # masked_whiten needs two tokens over all ranks; a batch with (almost) nothing to credit keeps zeros.
        total_tokens = self.accelerator.gather(valid.sum().reshape(1)).sum().item()
        if total_tokens < 2:
            return torch.zeros_like(raw)
        return masked_whiten(raw, valid)

    def _run_estimator(self, trajectories: list[Trajectory]) -> MCEstimate:
        """Run the Monte Carlo estimator on this rank's trajectories (or, in vLLM server mode, on every rank's
        trajectories on the main process, which then sends each rank its part)."""
        if not self._mc_on_main_only:
            with self._mc_sampler() as sampler:
                return self._make_estimator(sampler).estimate(
                    trajectories, reward_kwargs=self._mc_reward_kwargs()
                )

        per_rank = gather_object([trajectories])
        payload: list[Any] = [None]
        if self.accelerator.is_main_process:
            try:
                flat = [t for part in per_rank for t in part]
                with self._mc_sampler() as sampler:
                    full = self._make_estimator(sampler).estimate(
                        flat, reward_kwargs=self._mc_reward_kwargs()
                    )
                parts, start = [], 0
                for rank, part in enumerate(per_rank):
                    stop = start + len(part)
                    parts.append(
                        MCEstimate(
                            values=full.values[start:stop],
                            step_advantages=full.step_advantages[start:stop],
                            token_advantages=full.token_advantages[start:stop],
                            # The main process did all the work: its part carries the stats, so sums over ranks
                            # count every rollout once.
                            stats=dict(full.stats) if rank == 0 else {},
                        )
                    )
                    start = stop
                payload = [("ok", parts)]
            except Exception as err:  # other ranks wait in the broadcast: tell them, then fail everywhere
                payload = [("error", f"{type(err).__name__}: {err}")]
                broadcast_object_list(payload, from_process=0)
                raise
        broadcast_object_list(payload, from_process=0)
        status, content = payload[0]
        if status == "error":
            raise RuntimeError(f"Monte Carlo estimation failed on the main process: {content}")
        return content[self.accelerator.process_index]

    def _make_estimator(self, sampler: Sampler) -> MCValueEstimator:
        args = self.args
        return MCValueEstimator(
            sampler,
            list(self.reward_funcs),
            self.processing_class,
            num_rollouts=args.num_mc_rollouts,
            reward_weights=self.reward_weights.tolist(),
            max_completion_length=self.max_completion_length,
            rollout_budget=args.mc_rollout_budget,
            fixed_rollout_budget=args.mc_fixed_rollout_budget,
            max_estimated_steps=args.mc_max_estimated_steps,
            truncated_reward=args.mc_truncated_reward,
        )

    def _mc_reward_kwargs(self) -> dict[str, Any]:
        # GRPO passes these to reward functions; keep the signature identical for rollouts, but their logging
        # hooks must not record rollouts as training responses.
        noop = _NoopLogger()
        return {"trainer_state": self.state, "log_extra": noop, "log_metric": noop}

    @contextlib.contextmanager
    def _mc_sampler(self) -> Iterator[Sampler]:
        """The sampler for this step's rollouts, with the engine holding the current policy weights."""
        if self._mc_custom_sampler is not None:
            yield self._mc_custom_sampler
            return
        if self.use_vllm:
            if self.vllm_mode == "colocate":
                from .samplers.vllm_sync import sync_weights_if_stale, vllm_awake

                with vllm_awake(self):  # sleep mode: re-push the weights and wake the KV cache
                    # GRPO synced the weights before generating the responses at this step; sync if it did not.
                    sync_weights_if_stale(self)
                    yield self._mc_vllm_sampler
            else:
                # Server mode: GRPO pushed this step's weights to the server before generating the responses.
                yield self._mc_vllm_sampler
            return

        from .samplers.hf import TransformersSampler

        generation_kwargs = dict(self.args.generation_kwargs or {})
        if self.args.cache_implementation is not None:
            generation_kwargs.setdefault("cache_implementation", self.args.cache_implementation)
        # Same context as GRPO's transformers generation: unwraps DDP, gathers ZeRO-3 / FSDP parameters.
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped_model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            sampler = TransformersSampler(
                unwrapped_model,
                self.processing_class,
                max_batch_sequences=self.args.mc_max_batch_sequences,
                generation_kwargs=generation_kwargs,
                **self._sampling_kwargs(),
            )
            # Every EOS id the model declares ends a rollout, exactly as it ends a GRPO response.
            sampler.eos_token_ids = {int(e) for e in self.eos_token_ids}
            yield sampler

    # ------------------------------------------------------------------------------------------------------
    # Logging
    # ------------------------------------------------------------------------------------------------------

    def _log_mc_metrics(
        self,
        estimate: MCEstimate,
        trajectories: Sequence[Trajectory],
        raw: torch.Tensor,
        valid: torch.Tensor,
        mode: str,
    ) -> None:
        stats = estimate.stats
        state_values = [v for values in estimate.values for v in values[:-1]]
        local = torch.tensor(
            [
                stats.get("rollouts", 0.0),
                stats.get("generated_tokens", 0.0),
                stats.get("states", 0.0),
                stats.get("unique_states", 0.0),
                stats.get("truncated_rollouts", 0.0),
                math.fsum(state_values),
                float(len(state_values)),
                float((raw.abs() * valid).sum()),
                float(valid.sum()),
                float(sum(len(values) - 1 for values in estimate.values)),
                float(len(trajectories)),
                stats.get("seconds", 0.0),
            ],
            dtype=torch.float64,
            device=self.accelerator.device,
        )
        totals = self.accelerator.gather(local.unsqueeze(0)).view(-1, local.numel())
        summed = totals.sum(dim=0).tolist()
        (
            rollouts,
            tokens,
            states,
            unique,
            truncated,
            value_sum,
            value_count,
            abs_sum,
            token_count,
            steps,
            responses,
        ) = summed[:11]
        metrics = self._metrics[mode]
        metrics["mc/rollouts"].append(rollouts)
        metrics["mc/generated_tokens"].append(tokens)
        metrics["mc/seconds"].append(totals[:, 11].max().item())
        metrics["mc/states"].append(states)
        metrics["mc/dedup_ratio"].append(1.0 - unique / states if states else 0.0)
        metrics["mc/truncated_rollout_ratio"].append(truncated / rollouts if rollouts else 0.0)
        metrics["mc/mean_value"].append(value_sum / value_count if value_count else math.nan)
        metrics["mc/mean_abs_advantage"].append(abs_sum / token_count if token_count else math.nan)
        metrics["mc/steps_per_response"].append(steps / responses if responses else math.nan)

    def _log_response_advantages(self, advantages: torch.Tensor, completion_mask: torch.Tensor) -> None:
        """Replace the per-response advantages GRPO put in the completions table (its own, now unused) with the
        mean of each response's VinePPO token advantages, gathered across ranks."""
        mask = completion_mask.to(advantages.dtype)
        per_response = (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        gathered = self.accelerator.gather(per_response).tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(gathered), len(logged))):
            logged.pop()
        logged.extend(gathered)
