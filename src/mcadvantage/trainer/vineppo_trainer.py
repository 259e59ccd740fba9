"""``VinePPOTrainer``: TRL's ``GRPOTrainer`` with a pluggable advantage estimator (VinePPO's Monte Carlo by default).

TRL 1.16's ``GRPOTrainer`` already implements VinePPO's policy loss (PPO clipped surrogate over ``num_iterations``
epochs, k3 KL to a reference model in the loss) and accepts per-token advantages ``(B, T)``. This module is only wiring:
GRPO generates and grades the responses; the configured estimator (``args.advantage_estimator``: a built-in of
:data:`~mcadvantage.estimators.BUILTIN_ESTIMATORS` or a registered one) turns them into per-token advantages, handed a
sampler holding the current policy; the advantages are whitened across processes when asked and go to GRPO's loss. Every
use of TRL internals lives in :mod:`mcadvantage.trainer.trl_compat`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from mcadvantage.agents.trainer_episodes import check_environment_classes, log_dropped_tool_results
from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.core.prompts import check_prompt_lengths, context_length
from mcadvantage.core.settings import needed_completion_room
from mcadvantage.estimators import (
    AdvantageBatch,
    AdvantageResult,
    EstimatorContext,
    ReadsStateKeys,
    build_advantage_estimator,
    reduce_metrics,
)
from mcadvantage.estimators.base import AdvantageEstimator, ContinuesEpisodes, KeepsMonteCarloEstimate
from mcadvantage.estimators.batch import finalize_advantages
from mcadvantage.rewards.models import as_rollout_reward_func
from mcadvantage.samplers.base import Sampler
from mcadvantage.tasks.segmentation import get_segmenter
from mcadvantage.trainer.checkpoints import ESTIMATOR_STATE_FILE, load_estimator_state, save_estimator_state
from mcadvantage.trainer.checks import check_engine_settings, check_rewards_and_datasets, check_trainer_args
from mcadvantage.trainer.config import VinePPOConfig
from mcadvantage.trainer.continuation import ContinuationFunc, attach_continuation
from mcadvantage.trainer.policy import draw_group_trees, policy_sampler
from mcadvantage.trainer.trl_compat import (
    SUPPORTED_TRL,
    GRPOTrainerHooks,
    check_trl_version,
    install_layerwise_weight_sync,
)

__all__ = ["VinePPOTrainer", "check_trl_version", "SUPPORTED_TRL"]


class VinePPOTrainer(GRPOTrainerHooks):
    """VinePPO (arXiv 2410.01679) as a drop-in TRL trainer: ``GRPOTrainer`` with Monte Carlo step advantages, or
    any other registered advantage estimator (``args.advantage_estimator``) on the same trainer.

    Use it like ``trl.GRPOTrainer`` with a :class:`~mcadvantage.trainer.config.VinePPOConfig`:

        trainer = VinePPOTrainer(model="path/to/sft-model", reward_funcs=GSM8KVerifier(), args=VinePPOConfig(...),
                                 train_dataset=dataset)   # columns: "prompt", "answer"
        trainer.train()

    Monte Carlo rollouts run on the engine that generated the responses, with the same sampling settings
    (:func:`~mcadvantage.trainer.policy.policy_sampler`): TRL's colocated vLLM engine (woken up for the rollouts in sleep
    mode), the vLLM server (the main process estimates every process' responses and sends each its part), or the
    policy itself with transformers ``generate``. With several processes each process estimates its own
    responses and the whitening statistics are global, so the advantages equal a single process' on the same batch.

    Args:
        model: the policy, as for ``trl.GRPOTrainer``: a model id, a local directory or a loaded causal LM.
        reward_funcs: as for ``trl.GRPOTrainer``: reward function(s) called TRL-style (e.g.
            :class:`~mcadvantage.tasks.gsm8k.GSM8KVerifier`), async reward functions, reward models (``nn.Module``
            or model ids), or a list of them. They grade both the responses and every Monte Carlo continuation (on
            the full response text); reward models score rollouts in batches with their own tokenizer
            (:class:`~mcadvantage.rewards.models.RewardModelScorer`).
        args: a :class:`~mcadvantage.trainer.config.VinePPOConfig` (a plain ``GRPOConfig`` raises ``TypeError``); default
            ``VinePPOConfig("<model name>-VinePPO")``.
        train_dataset: as for ``trl.GRPOTrainer``: a ``prompt`` column plus the reward functions' columns; checked.
        eval_dataset: as for ``trl.GRPOTrainer`` (checked like ``train_dataset``).
        processing_class: a text tokenizer, as for ``trl.GRPOTrainer`` (vision-language processors are refused).
        reward_processing_classes: as for ``trl.GRPOTrainer``: the reward models' tokenizers.
        callbacks: as for ``trl.GRPOTrainer``.
        optimizers: as for ``trl.GRPOTrainer``.
        quantization_config: as for ``trl.GRPOTrainer``.
        peft_config: as for ``trl.GRPOTrainer``.
        mc_sampler: optional :class:`~mcadvantage.samplers.Sampler` for the Monte Carlo rollouts instead of the
            engine chosen above (advanced: custom engines, tests). It must sample from the current policy.
        continuation_func: continues ``rollout_func`` episodes (:mod:`~mcadvantage.trainer.continuation`).
        advantage_estimator: optional estimator instance (anything with ``estimate(batch, context)``) used instead
            of the one ``args.advantage_estimator`` names.
        **kwargs: other ``GRPOTrainer`` arguments; ``tools``, ``environment_factory``, ``rollout_func``: as in GRPO
            under ``"grpo"``/``"rloo"``/``"gae"``; Monte Carlo credit per turn under ``"vineppo"`` and ``"hybrid"``
            (``rollout_func`` with a ``continuation_func``); ``"tree"`` branches in the first turn (docs: agents).

    Attributes:
        advantage_estimator: the estimator in use (e.g. a :class:`~mcadvantage.estimators.VinePPOEstimator`).
        last_mc_estimate: with an estimator that keeps one (``"vineppo"``, ``"hybrid"``), the local
            :class:`~mcadvantage.mc.estimator.MCEstimate` of the latest batch (estimated responses only, in batch
            order; see ``last_mc_rows``); else None.
        last_mc_rows: local batch indices of the responses in ``last_mc_estimate``. Responses left out (empty,
            unscorable, or masked by ``mask_truncated_completions``) get advantage 0 and no whitening weight.
        last_advantage_result: the estimator's :class:`~mcadvantage.estimators.AdvantageResult` for the latest
            local batch (advantages before whitening, values, metrics).

    Logged metrics: the estimator's metrics under its ``metric_prefix`` (``mc/`` for ``"vineppo"``: ``rollouts``,
    ``generated_tokens``, ``states`` (sums), ``seconds`` (slowest process), ``dedup_ratio``, ``mean_value``,
    ``mean_abs_advantage``, ``steps_per_response``, ``truncated_rollout_ratio``), reduced over processes. The
    completions table's ``advantage`` column holds, per response, the mean of its token advantages.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
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
        advantage_estimator: AdvantageEstimator | None = None,
        continuation_func: ContinuationFunc | None = None,
        **kwargs: Any,
    ) -> None:
        check_trl_version()
        args = check_trainer_args(args, model)
        # Missing reward sources and columns fail here, before the model (and a vLLM engine) is loaded.
        funcs = check_rewards_and_datasets(
            reward_funcs, train_dataset, eval_dataset, kwargs.get("environment_factory")
        )
        check_engine_settings(args)
        self.advantage_estimator = build_advantage_estimator(
            advantage_estimator or args.advantage_estimator, args
        )
        self._continuation = attach_continuation(continuation_func, kwargs, self.advantage_estimator, args)

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
        if self.is_vision_language_model:
            raise NotImplementedError(
                "VinePPOTrainer does not support vision-language processors: Monte Carlo continuations are sampled "
                "from token prefixes without images. Pass a text tokenizer as processing_class."
            )
        self._mc_custom_sampler = self._continuation.sampler(self, default=mc_sampler)
        # Reward models and async functions grade rollouts through synchronous wrappers, built once.
        self._rollout_reward_funcs = [
            as_rollout_reward_func(func, tokenizer, chat_template_kwargs=self.chat_template_kwargs)
            for func, tokenizer in zip(self.reward_funcs, self.reward_processing_classes, strict=True)
        ]
        self.last_advantage_result: AdvantageResult | None = None
        if self.use_vllm and self.vllm_mode == "colocate":
            # TRL's colocated weight sync fails on vLLM's CPU backend; this swaps in a layerwise reload there and is
            # a no-op on GPU platforms.
            install_layerwise_weight_sync(self)
        check_environment_classes(self.environment_classes, args.env_max_sessions)
        self._check_prompt_lengths()

    def _check_prompt_lengths(self) -> None:
        """Every training prompt, rendered with its environment's tools, leaves room for a full completion."""
        room, room_name = self.completion_room
        check_prompt_lengths(  # a row naming an unknown environment is GRPO's to refuse, at train()
            self.train_dataset, self.tokenize_prompt_ids, context=self.context_length, room=room,
            room_name=room_name, dataset_name="train_dataset", route_column=self.environment_route_column,
            routes=list(self.environment_classes),
        )  # fmt: skip

    @property
    def context_length(self) -> int | None:
        """Longest prompt + completion the policy (and a colocated vLLM engine) can take."""
        config = self.accelerator.unwrap_model(self.model).config
        return context_length(config, self.args.vllm_max_model_length if self.use_vllm else None)

    @property
    def completion_room(self) -> tuple[int, str]:
        """Positions a prompt must leave free (a full response, and a full fixed-budget Monte Carlo rollout), and
        the setting that decides it."""
        args = self.args
        return needed_completion_room(
            self.max_completion_length, args.mc_rollout_budget, args.mc_fixed_rollout_budget
        )

    @property
    def last_mc_estimate(self) -> Any:
        """The local :class:`~mcadvantage.mc.estimator.MCEstimate` of the latest batch (``"vineppo"``, ``"hybrid"``)."""
        est = self.advantage_estimator
        return est.last_estimate if isinstance(est, KeepsMonteCarloEstimate) else None

    @property
    def last_mc_rows(self) -> list[int]:
        """Local batch indices of the responses in ``last_mc_estimate`` (the others got advantage 0)."""
        est = self.advantage_estimator
        return list(est.last_rows) if isinstance(est, KeepsMonteCarloEstimate) else []

    def estimator_context(self, batch: AdvantageBatch | None = None) -> EstimatorContext:
        """What the estimator may use: the live policy's sampler, the graders, the segmenter, the collectives, and
        for ``batch``'s tool and environment episodes what continuing them needs (estimators that continue them)."""
        continues = batch is not None and isinstance(self.advantage_estimator, ContinuesEpisodes)
        return EstimatorContext(
            policy_sampler=self._rollout_sampler,
            reward_funcs=self._rollout_reward_funcs,
            reward_weights=self.reward_weights.tolist(),
            tokenizer=self.processing_class,
            segmenter=get_segmenter(self.args.step_segmenter),
            max_completion_length=self.max_completion_length,
            context_length=self.context_length,
            reward_kwargs=self.rollout_reward_kwargs(),
            sample_on_main_only=self.samples_on_main_only,
            process_index=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes,
            gather_object=gather_object,
            broadcast_object=_broadcast_from_main,
            policy_model=self.accelerator.unwrap_model(self.model),
            episodes=self.agents.context(batch) if continues else None,
        )

    @contextlib.contextmanager
    def _rollout_sampler(self) -> Iterator[Sampler | None]:
        if self._mc_custom_sampler is not None:
            yield self._mc_custom_sampler
            return
        with policy_sampler(self) as sampler:
            yield sampler

    @property
    def reads_state_keys(self) -> bool:
        """Whether the estimator's credit reads the environment's ``state_key`` (its agent side records them)."""
        return isinstance(e := self.advantage_estimator, ReadsStateKeys) and e.state_source == "state_key"

    @property
    def samples_on_main_only(self) -> bool:
        """Only the main process talks to a vLLM server, so it samples (rollouts, trees) for every process."""
        return self._mc_custom_sampler is None and self.use_vllm and self.vllm_mode == "server"

    def draw_group_trees(
        self, prompt_ids: list[list[int]], num_generations: int
    ) -> tuple[list[list[int]], list[Any]] | None:
        """With ``advantage_estimator="tree"``: the batch's groups drawn as trees (:func:`policy.draw_group_trees`)."""
        return draw_group_trees(
            self, prompt_ids, num_generations, self._rollout_sampler(), main_only=self.samples_on_main_only
        )

    #: File in a checkpoint directory holding the advantage estimator's own state (e.g. the "gae" critic).
    ESTIMATOR_STATE_FILE = ESTIMATOR_STATE_FILE

    def save_estimator_state(self, checkpoint_dir: str) -> None:
        """Save the estimator's own state (e.g. the ``"gae"`` critic) into ``checkpoint_dir``; every checkpoint."""
        if self.accelerator.is_main_process:
            save_estimator_state(self.advantage_estimator, checkpoint_dir)

    def load_estimator_state(self, checkpoint_dir: str) -> None:
        """Restore the estimator's state saved in ``checkpoint_dir`` (called when training resumes from it)."""
        load_estimator_state(self.advantage_estimator, checkpoint_dir)

    def compute_advantages(self, batch: AdvantageBatch) -> torch.Tensor:
        """Per-token advantages ``(B, T)`` of the local batch from the estimator, whitened across processes when
        ``whiten_advantages``; tool results (``tool_mask`` 0) get 0 and no weight. Collective: every process calls it."""
        mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
        log_dropped_tool_results(self, batch)  # every estimator's episodes: counted and warned
        samples = self.advantage_estimator.uses_rollouts
        if batch.mode == "eval" and samples and not self.args.mc_estimate_on_eval:
            # Rollouts on evaluation batches multiply the cost of evaluation: off unless asked for.
            return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        batch = self._continuation.dataset_rows(batch)  # rollout_func's extra fields are its responses' only
        result = self.advantage_estimator.estimate(batch, self.estimator_context(batch))
        self.last_advantage_result = result
        metrics = reduce_metrics(gather_object([result.metrics]), result.metric_reductions)
        prefix = self.advantage_estimator.metric_prefix
        self.log_metric_values(batch.mode, {f"{prefix}/{name}": value for name, value in metrics.items()})
        # The same step as every other caller of an estimator (verl's adapter included): finite check, whitening.
        return finalize_advantages(
            result,
            mask,
            whiten=bool(self.args.whiten_advantages),
            estimator=type(self.advantage_estimator).__name__,
            # masked_whiten needs two tokens over all processes: count them over all processes.
            valid_token_total=lambda valid: int(self.accelerator.gather(valid.sum().reshape(1)).sum().item()),
        )


def _broadcast_from_main(obj: Any) -> Any:
    payload = [obj]
    broadcast_object_list(payload, from_process=0)
    return payload[0]
