"""Every access to TRL internals, in one place, for the one TRL range we test: TRL's seam.

TRL rewrites ``GRPOTrainer`` often and has deleted subclasses whose overrides drifted (huggingface/trl#7132,
#6235), so the rest of mcadvantage touches only public TRL names: every private attribute or method it needs is used
here, behind a public name (``tests/trainer/test_trl_compat.py`` fails if another module touches one;
``tests/trainer/test_trl_pins.py`` pins each). ``docs/design.md`` ("What is overridden, exactly") says what each
override does and why. In short: ``_generate_and_score_completions`` (the extension point TRL's maintainers name for
custom advantages, huggingface/trl#4525; what changes when TRL ships an advantage hook, #7291) puts the estimator's
``(B, T)`` advantages in ``output["advantages"]``; ``_calculate_rewards`` keeps what GRPO graded; ``_metrics`` and
``_logs["advantages"]`` are the logged metrics and the completions table; ``_is_vlm``, ``_tokenize_prompts`` and
``_dist.summon_full_params`` are GRPO's own answers to "vision model?", "how are prompts tokenised", "how are FSDP
parameters gathered"; ``_last_loaded_step`` and ``vllm_generation``'s ``_iter_named_params`` /
``_llm_weights_sleeping`` / ``sync_weights`` are GRPO's vLLM weight-sync bookkeeping; ``environment_factories``,
``_multi_environment``, ``environments``, ``_batch_environments``, ``_environment_pool``, ``_get_tool_suffix_ids``,
``_env_tools``, ``_standalone_tools`` and ``_tokenizer`` (TRL's ``tools=`` / ``environment_factory=``) stand behind
the public names the agent side (``trainer.agents``: :mod:`mcadvantage.agents.trainer_episodes`) reads;
``_generate_single_turn`` records each turn's state keys through it and draws trees (``"tree"``), and
``_tool_call_loop`` is wrapped only to mark its own calls; ``_save_checkpoint`` / ``_get_output_dir`` /
``_load_optimizer_and_scheduler`` keep the estimator's own state in every checkpoint; ``training_step`` and
``train`` add the run's guards; ``_tag_names`` / ``_name`` name the trainer.

Only compatibility lives here: accessors, and overrides that adapt TRL's data and call a named product function
(:mod:`mcadvantage.trainer.guards`, :mod:`mcadvantage.rewards`, :mod:`mcadvantage.agents`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer

from mcadvantage.agents.env_checks import check_environment_names
from mcadvantage.agents.trainer_episodes import TrainerEpisodes
from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.core.versions import check_version_range
from mcadvantage.estimators.batch import AdvantageBatch
from mcadvantage.rewards.errors import check_finite_reward_table, locate_reward_error
from mcadvantage.rewards.models import synchronous_reward_funcs
from mcadvantage.rewards.truncation import score_truncated_responses, truncated_responses
from mcadvantage.trainer.guards import checkpoint_to_resume, refuse_nonfinite_step

__all__ = [
    "SUPPORTED_TRL",
    "GRPOTrainerHooks",
    "check_trl_version",
    "install_layerwise_weight_sync",
    "sync_weights_if_stale",
    "vllm_awake",
]

_UNSET = object()

#: The TRL releases mcadvantage is tested with, stated once (pyproject's dependency says the same).
SUPPORTED_TRL = ">=1.16,<1.17"
_MIN, _MAX = Version("1.16"), Version("1.17")


def check_trl_version(version: str | None = None) -> None:
    """Check the installed (or given) TRL version against :data:`SUPPORTED_TRL`; ``ImportError`` (naming the install
    command) for a TRL outside it."""
    message = (
        "mcadvantage supports TRL {supported} but TRL {v} is installed: VinePPOTrainer builds on GRPOTrainer "
        "internals that TRL changes between minor releases. Run: pip install 'trl{supported}'."
    )
    found = version if version is not None else trl.__version__
    check_version_range(found, _MIN, _MAX, lambda v: message.format(supported=SUPPORTED_TRL, v=v))


def _ignore(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra`` / ``log_metric`` when rollouts are graded: they are not training responses, so what a
    reward function logs about them must not enter the completions table or metrics."""


class GRPOTrainerHooks(GRPOTrainer):
    """``GRPOTrainer`` with public hooks in place of its internals; ``VinePPOTrainer`` builds on this.

    Subclasses implement :meth:`compute_advantages`; everything else here adapts GRPO's internals.
    """

    _tag_names = ["trl", "vineppo", "mcadvantage"]
    _name = "VinePPO"

    def compute_advantages(self, batch: AdvantageBatch) -> torch.Tensor:
        """Per-token advantages ``(B, T)`` for the local batch (what GRPO's loss will use)."""
        raise NotImplementedError

    def save_estimator_state(self, checkpoint_dir: str) -> None:
        """Save the advantage estimator's own state (e.g. a critic) into a checkpoint directory."""

    def load_estimator_state(self, checkpoint_dir: str) -> None:
        """Restore the advantage estimator's own state from a checkpoint directory."""

    def updates_policy(self) -> bool:
        """Whether the policy takes the optimizer step now being trained: the advantage estimator's
        ``updates_policy(state.global_step)`` (False in the ``"gae"`` critic's warm-up); every step without one."""
        estimator = getattr(self, "advantage_estimator", None)
        return estimator is None or bool(estimator.updates_policy(int(self.state.global_step)))

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """GRPO's training step, then :func:`~mcadvantage.trainer.guards.refuse_nonfinite_step` (non-finite loss or
        gradient: ``FloatingPointError`` before the optimizer step). Where :meth:`updates_policy` is False the
        gradients are dropped (set to None: no update, no weight decay, the optimizer's state unchanged)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        args = self.args
        refuse_nonfinite_step(
            loss, model, global_step=self.state.global_step, learning_rate=args.learning_rate,
            num_iterations=args.num_iterations,
        )  # fmt: skip
        if not self.updates_policy():
            model.zero_grad(set_to_none=True)
        return loss

    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, **kwargs: Any) -> Any:
        """``Trainer.train`` from a checkpoint :func:`~mcadvantage.trainer.guards.checkpoint_to_resume` verified, with
        every environment giving the state key the estimator reads (``agents.check_state_keys_available``)."""
        checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir)
        self.agents.check_state_keys_available()
        return super().train(resume_from_checkpoint=checkpoint, trial=trial, **kwargs)

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        # Called on every resume path (plain, DeepSpeed, FSDP), unlike _load_from_checkpoint.
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.load_estimator_state(checkpoint)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        # Before Trainer's files: it writes trainer_state.json last, so a checkpoint that has one (what
        # verify_checkpoint requires) has its estimator state too, even when the run was killed while saving.
        run_dir = self._get_output_dir(trial=trial)
        self.save_estimator_state(f"{run_dir}/{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        super()._save_checkpoint(model, trial)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """GRPO's grading, kept for the estimator, after :mod:`mcadvantage.rewards`' checks (which function failed on
        which row, infinite rewards) and ``truncated_completion_reward``."""
        try:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except Exception as err:
            kwargs = self.reward_call_kwargs(inputs, prompts, completions, completion_ids_list)
            located = locate_reward_error(self.synchronous_reward_funcs(), kwargs, where="training responses")
            if located is None:  # not a synchronous reward function's own error: GRPO's error as it was
                raise
            raise located from err
        names, process = self.reward_func_names, self.accelerator.process_index
        check_finite_reward_table(rewards_per_func, names, prompts, completions, process_index=process)
        value = getattr(self.args, "truncated_completion_reward", None)
        if value is not None:
            # Rewards are gathered over processes, so the truncation mask is too.
            local = truncated_responses(completion_ids_list, self.stop_token_ids())
            truncated = self.accelerator.gather(torch.tensor(local, device=rewards_per_func.device))
            rewards_per_func = score_truncated_responses(rewards_per_func, truncated, value)
        ids = [list(ids) for ids in completion_ids_list]
        captured = dict(inputs=inputs, prompts=prompts, completion_ids=ids, completions=completions)
        self._mcadvantage_captured = {**captured, "rewards_per_func": rewards_per_func}
        return rewards_per_func

    def reward_call_kwargs(self, inputs: list[Any], prompts: list[Any], completions: list[Any], completion_ids_list: list[Any]) -> dict[str, Any]:  # fmt: skip
        """The keyword arguments GRPO calls reward functions with (its logging hooks replaced by no-ops)."""
        keys = [key for key in inputs[0] if key not in ("prompt", "completion", "completion_ids")]
        kwargs = {key: [example[key] for example in inputs] for key in keys}
        kwargs.update(self.rollout_reward_kwargs())
        if self.environments is not None:  # as GRPO passes them (an environment's get_reward reads them)
            kwargs["environments"] = self.environments
        return dict(prompts=prompts, completions=completions, completion_ids=completion_ids_list, **kwargs)

    def synchronous_reward_funcs(self) -> list[tuple[Any, str]]:
        """``(function, name)`` of the reward functions GRPO calls synchronously in this process
        (:func:`~mcadvantage.rewards.models.synchronous_reward_funcs`)."""
        return synchronous_reward_funcs(self.reward_funcs, self.reward_func_names)

    def stop_token_ids(self) -> set[int | None]:
        """The tokens that end a response as GRPO counts it (EOS tokens and padding): a response whose last token
        is none of them was cut at ``max_completion_length``."""
        return {*self.eos_token_ids, getattr(self.processing_class, "pad_token_id", None)}

    def draw_group_trees(
        self, prompt_ids: list[list[int]], num_generations: int
    ) -> tuple[list[list[int]], list[Any]] | None:
        """``(completions, tree paths)`` for a training batch whose groups are drawn as trees (one path per
        completion), or None for GRPO's own generation."""
        return None

    #: True while GRPO's tool loop runs (:meth:`_tool_call_loop`): its generations continue single leaves.
    _mcadvantage_in_tool_loop = False

    def _tool_call_loop(
        self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
    ):
        """GRPO's tool loop, marked as running: the turns it generates continue an episode, never draw trees."""
        self._mcadvantage_in_tool_loop = True
        try:
            return super()._tool_call_loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields
            )
        finally:
            self._mcadvantage_in_tool_loop = False

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        self.agents.record_turn_states()
        # Trees only in a training batch's first model turn: GRPO's _generate calls this once for it with the group
        # size; its tool loop calls it again for every later turn of each leaf (num_generations=1), as GRPO does.
        if self.model.training and not images and not self._mcadvantage_in_tool_loop:
            drawn = self.draw_group_trees(prompt_ids, num_generations)
            if drawn is not None:
                completions, self._mcadvantage_tree_paths = drawn
                # No engine log-probabilities for tree leaves: with vLLM, NaN makes GRPO's importance-sampling
                # correction a ratio of exactly 1 for these tokens (TRL's documented handling of missing logprobs);
                # the tool loop appends the later turns' own, so only the first turn's tokens go uncorrected.
                logprobs = [[float("nan")] * len(c) for c in completions] if self.use_vllm else None
                return completions, logprobs
        return super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self.agents.start_generation()
        self._mcadvantage_captured = self._mcadvantage_tree_paths = self._mcadvantage_completions = None
        output = super()._generate_and_score_completions(inputs)
        captured, self._mcadvantage_captured = self._mcadvantage_captured, None
        if captured is None:  # GRPO changed how it grades: refuse rather than train on GRPO's advantages
            raise RuntimeError(
                f"mcadvantage did not see GRPOTrainer._calculate_rewards being called (TRL {trl.__version__}); this "
                f"TRL version is not supported. Install trl{SUPPORTED_TRL}."
            )
        mode = "train" if self.model.training else "eval"
        local = len(captured["prompts"])
        start = self.accelerator.process_index * local
        prompt_ids = [
            ids[mask.bool()].tolist()
            for ids, mask in zip(output["prompt_ids"].cpu(), output["prompt_mask"].cpu(), strict=True)
        ]
        batch = AdvantageBatch(
            prompt_ids=prompt_ids, completion_ids=captured["completion_ids"], completion_mask=output["completion_mask"],
            rewards_per_func=captured["rewards_per_func"].float().cpu(), reward_weights=self.reward_weights.float().cpu(),
            local_slice=slice(start, start + local),
            group_size=self.num_generations if mode == "train" else self.num_generations_eval,
            prompts=list(captured["prompts"]), rows=list(captured["inputs"]), mode=mode,
            tree_paths=self._mcadvantage_tree_paths, tool_mask=output.get("tool_mask"),
        )  # fmt: skip
        batch.turn_keys = self.agents.end_generation(batch)  # the episodes' keys are kept for their rebuilds
        self._mcadvantage_completions = captured["completions"]
        advantages = self.compute_advantages(batch)
        output["advantages"] = advantages
        loss_mask = loss_token_mask(output["completion_mask"], batch.tool_mask)
        self._replace_logged_advantages(advantages, loss_mask)
        return output

    def _replace_logged_advantages(self, advantages: torch.Tensor, loss_mask: torch.Tensor) -> None:
        # The completions table takes one float per response: GRPO's own advantage, replaced by the mean of the
        # token advantages used instead, over the tokens of the loss (tool results left out).
        mask = loss_mask.to(advantages.dtype)
        per_response = (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        gathered = self.accelerator.gather(per_response).tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(gathered), len(logged))):
            logged.pop()
        logged.extend(gathered)

    def log_metric_values(self, mode: str, metrics: dict[str, float]) -> None:
        """Append already-reduced metric values to GRPO's logged metrics (averaged per logging step)."""
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def rollout_reward_kwargs(self) -> dict[str, Any]:
        """The keyword arguments GRPO passes to reward functions, with logging hooks that ignore rollouts."""
        return {"trainer_state": self.state, "log_extra": _ignore, "log_metric": _ignore}

    @property
    def is_vision_language_model(self) -> bool:
        """Whether the processing class is a vision-language processor (GRPO's own answer)."""
        return bool(self._is_vlm)

    def tokenize_prompt_ids(
        self, prompts: list[Any], environments: list[Any] | None = None
    ) -> list[list[int]]:
        """Prompt token ids exactly as GRPO tokenises prompts (chat template included); with ``environment_factory``
        each rendered with its environment's tools (``environments``: per prompt, the rows' ``environment`` values
        for a dict of factories, None for one), not with the observation ``reset`` adds at generation time."""
        if self.environment_factories is None:
            return [list(ids) for ids in self._tokenize_prompts(prompts)[0]]
        names = [None] * len(prompts) if environments is None else list(environments)
        check_environment_names(names, list(self.environment_factories))
        saved = getattr(self, "_batch_environments", _UNSET)
        self._batch_environments = names
        try:
            return [list(ids) for ids in self._tokenize_prompts(prompts)[0]]
        finally:
            if saved is _UNSET:
                del self._batch_environments
            else:
                self._batch_environments = saved

    @functools.cached_property
    def agents(self) -> TrainerEpisodes:
        """The trainer's agent side (:class:`~mcadvantage.agents.trainer_episodes.TrainerEpisodes`), which reads
        the public names below for GRPO's tool loop."""
        return TrainerEpisodes(self)

    @property
    def environment_classes(self) -> dict[str | None, type]:
        """The class of each environment ``environment_factory`` builds, by name (one factory: ``{None: cls}``)."""
        if self.environment_factories is None:
            return {}
        return {name: type(self._environment_pool[name][0]) for name in self.environment_factories}

    @property
    def environment_factory_map(self) -> dict[str | None, Any] | None:
        """The ``environment_factory`` factories by name (one factory: ``{None: factory}``), else None."""
        return self.environment_factories

    @property
    def episode_environments(self) -> list[Any]:
        """GRPO's environment of each local episode being generated (in batch order, in its latest state)."""
        return list(getattr(self, "environments", None) or [])

    @property
    def environment_route_column(self) -> str | None:
        """The column naming each row's environment (``"environment"`` for a dict ``environment_factory``) or None."""
        return "environment" if self.environment_factories is not None and self._multi_environment else None

    def episode_tools(self, environment: str | None = None) -> list[Any] | None:
        """The tools an episode's prompt offers: its environment's (by name; None: one factory), else ``tools=``."""
        return self._env_tools[environment] if self.environment_factories is not None else self.tools

    @property
    def text_tokenizer(self) -> Any:
        """The tokenizer GRPO parses generated turns with (TRL's ``parse_response`` reads it)."""
        return self._tokenizer

    def tool_result_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The tokens GRPO's tool loop appends for one round of tool results (tool turn and next assistant header)."""
        return list(self._get_tool_suffix_ids(tool_messages))

    @property
    def tool_calling_limit(self) -> int | None:
        """``max_tool_calling_iterations`` per episode; None: unlimited (GRPO stores ``sys.maxsize``)."""
        limit = self.max_tool_calling_iterations
        return None if limit == sys.maxsize else limit

    @property
    def batch_conversations(self) -> list[Any]:
        """The latest batch's completions as GRPO parsed them (per local episode: its messages); empty before."""
        return list(getattr(self, "_mcadvantage_completions", None) or [])

    @property
    def standalone_tools(self) -> list[Any]:
        """The ``tools=`` the trainer was given (without the environments' methods)."""
        return list(self._standalone_tools)

    @contextlib.contextmanager
    def generation_model(self) -> Iterator[Any]:
        """The policy as GRPO generates with it: unwrapped, ZeRO-3 / FSDP parameters gathered, no gradients."""
        from trl.models.utils import unwrap_model_for_generation

        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            yield unwrapped

    @property
    def vllm_engine(self) -> Any:
        """The colocated ``vllm.LLM`` (None without colocated vLLM)."""
        return self.vllm_generation.llm if self.use_vllm and self.vllm_mode == "colocate" else None

    @property
    def vllm_server_client(self) -> Any:
        """TRL's ``VLLMClient`` of the vLLM server (None without server mode or off the main process)."""
        server = self.use_vllm and self.vllm_mode == "server"
        return getattr(self.vllm_generation, "vllm_client", None) if server else None


#: vLLM weight sync around GRPO's bookkeeping: set on a VLLMGeneration whose sync_weights was replaced.
_INSTALLED_FLAG = "_mcadvantage_layerwise_sync"


def install_layerwise_weight_sync(trainer: Any) -> bool:
    """Make a TRL trainer's colocated vLLM weight sync work on vLLM's CPU backend, whose linear layers drop the
    weight loaders TRL's ``model.load_weights`` needs: ``vllm_generation.sync_weights`` is replaced by one that walks
    TRL's own ``_iter_named_params`` (PEFT merged, ZeRO-3 / FSDP gathered) and loads through
    :func:`mcadvantage.samplers.vllm_weights.reload_vllm_weights`; TRL keeps deciding when to sync. True when
    installed (or already), False when nothing needed changing (no vLLM, server mode, a GPU platform)."""
    from mcadvantage.samplers.vllm_weights import is_cpu_vllm_platform, reload_vllm_weights

    generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    if getattr(generation, "mode", None) != "colocate" or not is_cpu_vllm_platform():  # (None: no mode)
        return False
    if getattr(generation, _INSTALLED_FLAG, False):
        return True
    if not callable(getattr(generation, "_iter_named_params", None)):
        raise RuntimeError(
            f"install_layerwise_weight_sync needs VLLMGeneration._iter_named_params, which TRL {trl.__version__} "
            f"does not have: install trl{SUPPORTED_TRL}."
        )

    def sync_weights() -> None:
        if generation.enable_sleep_mode:  # as TRL does (vLLM's CPU platform refuses sleep mode: parity only)
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        # Every rank walks the (collective) parameter gather, and owns a colocated engine to load into.
        reload_vllm_weights(generation.llm, generation._iter_named_params())

    sync_weights.__wrapped__ = generation.sync_weights  # type: ignore[attr-defined]
    generation.sync_weights = sync_weights
    setattr(generation, _INSTALLED_FLAG, True)
    return True


def sync_weights_if_stale(trainer: Any) -> None:
    """Push a ``GRPOTrainer``'s current policy weights into its vLLM engine unless already pushed at this step
    (GRPO pushes before generating, not after every optimizer step; its own bookkeeping, so it does not push again)."""
    if trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


@contextlib.contextmanager
def vllm_awake(trainer: Any) -> Iterator[None]:
    """Keep a trainer's colocated vLLM engine awake, with current weights, inside the block: with
    ``vllm_enable_sleep_mode=True`` TRL sleeps it at level 2 after its own ``generate``. On exit (even on error) it
    sleeps again with the weights marked discarded, so TRL's next ``generate`` re-pushes them; else a no-op."""
    generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    if getattr(generation, "mode", None) != "colocate" or not getattr(generation, "enable_sleep_mode", False):
        yield
        return
    if getattr(generation, "_llm_weights_sleeping", False):
        generation.sync_weights()  # wakes the weights and loads the current policy into them
    generation.llm.wake_up(tags=["kv_cache"])
    try:
        yield
    finally:
        generation.llm.sleep(level=2)
        generation._llm_weights_sleeping = True
