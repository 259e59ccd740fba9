"""Configuration of :class:`~mcadvantage.trainer.vineppo_trainer.VinePPOTrainer`: TRL's ``GRPOConfig`` plus the Monte Carlo
settings of VinePPO. GRPO's fields keep GRPOConfig's defaults (a drop-in; the exceptions
are :data:`GRPO_DEFAULT_DIFFERENCES`); ``VinePPOConfig.from_paper(task)`` sets the
paper's.

Importing this module imports TRL (``GRPOConfig``), but not vLLM.

Why this module is long: ``HfArgumentParser`` reads every command-line setting from the fields of one dataclass,
so every estimator's settings and their help texts live in ``VinePPOConfig``; the validation rules live elsewhere
(:mod:`mcadvantage.core.settings`, :mod:`mcadvantage.estimators.rules`).
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from trl import GRPOConfig

from mcadvantage.core.settings import MCSettings, environment_setting_field, validate_environment_settings
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.registry import (
    available_advantage_estimators,
    estimator_choices_text,
    estimators_reading,
    get_advantage_estimator,
)


def _bf16_refused_here(use_cpu: bool) -> bool:
    """True where ``TrainingArguments`` refuses ``bf16=True`` ("Your setup doesn't support bf16/gpu"): no
    bf16-capable GPU or XLA device, and ``use_cpu`` unset. Asks transformers the question it asks itself."""
    if use_cpu:
        return False
    try:
        from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

        return not (is_torch_bf16_gpu_available() or is_torch_xla_available())
    except Exception:  # a broken CUDA install must not break building a config
        return True


#: Every ``GRPOConfig`` field whose value ``VinePPOConfig`` resolves differently when left unset, with the reason:
#: the one list of differences (rendered on docs/howto/grpo-to-vineppo.md; tests/trainer/test_config.py compares
#: the two dataclasses field by field against it). Every other field keeps ``GRPOConfig``'s default.
GRPO_DEFAULT_DIFFERENCES: dict[str, str] = {
    "bf16": (
        "Unset, `GRPOConfig` turns bf16 on whenever fp16 is off, and `TrainingArguments` then refuses the config on a "
        'machine without a bf16-capable GPU unless `use_cpu=True` ("Your setup doesn\'t support bf16/gpu"). There, '
        "and only there, `VinePPOConfig` turns bf16 off instead, so a CPU-only machine trains in float32 without "
        "flags. Wherever `GRPOConfig` builds (a bf16 GPU, or `use_cpu=True`, where both give `bf16=True`), the value "
        "is `GRPOConfig`'s, also when `use_cpu=True` is set after the config was built."
    ),
    "scale_rewards": (
        'Unset, the estimator\'s `default_scale_rewards`: `"group"` (`GRPOConfig`\'s) under `"grpo"`, '
        '`"hybrid"` and `"anchor"`; `"none"` under the others, which refuse any other value (reward scaling shapes only '
        "GRPO's advantages)."
    ),
}


@dataclass
class VinePPOConfig(GRPOConfig):
    r"""Configuration for :class:`~mcadvantage.trainer.vineppo_trainer.VinePPOTrainer` (VinePPO, arXiv 2410.01679).

    A :class:`trl.GRPOConfig` (every GRPO / ``TrainingArguments`` field works, and ``HfArgumentParser`` turns it
    into command-line flags) plus the settings of the advantage estimators. Every GRPO field keeps GRPOConfig's
    default, so swapping ``GRPOConfig(...)`` for ``VinePPOConfig(...)`` changes the advantage and nothing else;
    :meth:`VinePPOConfig.from_paper` sets the paper's runs in one call.

    **Each estimator owns its settings.** `advantage_estimator` picks the estimator (`"vineppo"` by default; the
    built-ins are listed in the field's help, made from :data:`~mcadvantage.estimators.BUILTIN_ESTIMATORS`), and each
    estimator declares the fields it reads (its ``config_fields``). A field that another estimator reads and the
    chosen one does not is refused when it is not at its default, naming the field, the estimator and the fix,
    instead of being silently ignored. The sections below list each estimator's fields; every field's help says
    what it does.

    Settings of every estimator (read by the trainer):

    Attributes:
        advantage_estimator (str): How advantages are computed: a built-in name, or any name registered with
            :func:`~mcadvantage.register_advantage_estimator` or an installed package's entry points. Defaults to
            `"vineppo"`.
        env_max_sessions (int): The most server sessions an OpenEnv environment class holds open at once, for the
            batch's episodes and every Monte Carlo continuation together (a continuation whose session went to
            another is rebuilt by replay on a free one). Defaults to `16` (OpenEnv servers commonly allow 64).
        whiten_advantages (bool | None): Whiten the per-token advantages (zero mean, unit variance over the valid
            tokens of the generation batch, all-reduced across ranks). `None` resolves to the estimator's default
            (on for `"vineppo"`, `"gae"` and `"tree"`; off for `"grpo"`, `"rloo"` and `"hybrid"`, so they equal
            their own normalisation). Defaults to `None`.
        truncated_completion_reward (float | None): Reward of a training response that hit
            `max_completion_length` without EOS: every reward function's score for it is replaced by this value.
            `None` grades it like any response; the official code gave it 0. Unlike `mask_truncated_completions`,
            the response still trains (with a low reward). Defaults to `None`.
        mc_max_batch_sequences (int): With the transformers sampler (Monte Carlo rollouts, trees, and
            ``policy_sampler`` for evaluation), the most sequences generated in one `generate` call (memory bound).
            Defaults to `256`.
        mc_estimate_on_eval (bool): Also run an estimator that samples continuations (`uses_rollouts`, e.g.
            `"vineppo"`, `"hybrid"`) on evaluation batches; refused for the others, which estimate evaluation
            batches anyway. Off by default because it multiplies the cost of evaluation. Defaults to `False`.
        scale_rewards (str | None): GRPO's reward scaling. `None` resolves to the estimator's
            ``default_scale_rewards``: `"group"` (GRPO's) for `"grpo"`, `"hybrid"` and `"anchor"`, `"none"` for the rest,
            which refuse any other value (reward scaling shapes only GRPO's advantages).

    **`"vineppo"`** (Monte Carlo step values): `num_mc_rollouts` (K continuations per state, paper: 9),
    `mc_rollout_budget` and `mc_fixed_rollout_budget`, `mc_max_estimated_steps` and `mc_steps_after_cap`,
    `mc_truncated_reward`, `mc_min_step_tokens`, `mc_reuse_samples`, `mc_allocation` and `mc_min_rollouts` (the
    Monte Carlo settings: the fields of :class:`~mcadvantage.core.settings.MCSettings` under their config names,
    with its defaults, help and validation; see docs/howto/cheaper-monte-carlo.md), and `step_segmenter`: how a
    response is cut into reasoning steps, `"math"` (paper Appendix B rules, the default), `"gsm8k"` (one step per
    line, the final `#### N` line joins the last step), `"newline"`, a
    :class:`~mcadvantage.tasks.segmentation.StepSegmenter` or any picklable callable `text -> list[str]` whose parts
    concatenate back to `text`. Each token of step `i` gets `V(S_i) - V(S_{i-1})`, with `V(S_i)` the mean reward
    of K continuations sampled from the state before step `i`.

    **`"grpo"`** and **`"rloo"`**: no settings of their own (`"grpo"` reads GRPO's `scale_rewards` and
    `multi_objective_aggregation`; `"rloo"` refuses both).

    **`"gae"`** (PPO's learned critic): `gae_gamma` and `gae_lambda` (GAE's discount and parameter, the paper's
    `1.0` and `1.0`, then `A_t = R - V(s_t)`), `critic_value_clip` (PPO's value clipping, `0.2`),
    `critic_learning_rate` (`None`: the policy's `learning_rate`), `critic_model` (`None`: a copy of the policy
    with a scalar head, as the paper), `critic_warmup_steps` (the first N training steps train the critic alone on
    the starting policy's responses, as verl's `critic_warmup`; they count toward `max_steps`; default `0`), and
    `step_segmenter` (for the reported step values).

    **`"hybrid"`** (GRPO plus Monte Carlo step credit for the responses of groups whose rewards all tie):
    `hybrid_budget` (the extra sampled tokens per batch as a fraction of its sampled response tokens, masked ones
    included; `0` is GRPO exactly; default `0.1`) and every `"vineppo"` setting above (`step_segmenter` included), except the pooled values
    (`mc_reuse_samples`, `mc_allocation="variance"`), which it refuses: its responses are chosen by outcome.

    **`"tree"`** (each group drawn as a tree that branches at token depths; step credit from its own leaves, no
    rollouts): `tree_branching` (children per level, each >= 2, product `num_generations`; default `[4, 2]`) and
    `tree_depths` (the completion token depth of each level, first `0`, increasing; `None` spreads them over the
    first half of `max_completion_length`).

    **`"anchor"`** (GiGPO's anchor-state turn credit for agents, from the batch's own episodes, no extra samples):
    `anchor_state` (`"state_key"`, the environment's read-only property, or `"observation"`), `anchor_gamma` (the
    turn returns' discount, `1.0`), `anchor_weight` (the step advantage's weight beside GRPO's, `1.0`),
    `anchor_scope` (`"group"` or `"batch"`) and `anchor_credit` (`"normalized"`, GiGPO's, or `"pooled"`); it reads
    GRPO's `scale_rewards` (default `"group"`). See docs/howto/turn-credit-for-agents.md.

    **Defaults that differ from GRPOConfig**: only those listed, with their reasons, in
    :data:`GRPO_DEFAULT_DIFFERENCES`: `scale_rewards` (above), and unset `bf16` where `GRPOConfig` would be refused
    (no bf16-capable GPU and `use_cpu` unset: off instead of an error); with `use_cpu=True` or on a bf16 GPU, `bf16`
    is `GRPOConfig`'s (on). GRPO's defaults that already match the paper: `learning_rate=1e-6`, `epsilon=0.2`, `num_generations=8`, and
    `loss_type="dapo"` (the clipped surrogate summed over tokens and divided by the completion tokens of the whole
    accumulated batch: the paper's token-weighted mean). The per-token estimators (`"vineppo"`, `"gae"`,
    `"hybrid"`, `"tree"`) also accept `"bnpo"`, `"dr_grpo"` and `"grpo"` and refuse other loss types (rule
    :func:`~mcadvantage.estimators.rules.token_level_loss`). The paper's other PPO settings (`temperature=0.6`,
    `top_p=0.9`, `beta=1e-4`, `num_iterations=2`, `max_completion_length=1024`, K = 9, ...) come from
    :meth:`VinePPOConfig.from_paper`.
    """

    # ---- GRPO's settings keep GRPOConfig's defaults (the paper's come from VinePPOConfig.from_paper) ----------
    scale_rewards: str | None = field(
        default=None,
        metadata={
            "help": "GRPO reward scaling, used by advantage_estimator='grpo' ('group', 'batch' or 'none'). Unset: "
            "'group' for 'grpo' (GRPO's default), 'none' otherwise (other estimators refuse anything else)."
        },
    )

    # ---- Advantage estimator ------------------------------------------------------------------------------
    advantage_estimator: str = field(
        default="vineppo",
        metadata={
            "help": f"How advantages are computed: {estimator_choices_text()}; or any name registered with "
            "mcadvantage.register_advantage_estimator or an installed package's entry points. Each estimator reads "
            "its own settings below; another estimator's setting is refused."
        },
    )

    # ---- PPO's learned critic (advantage_estimator="gae") ------------------------------------------------
    gae_gamma: float = field(default=1.0, metadata={"help": "'gae' only: GAE discount (paper: 1.0)."})
    gae_lambda: float = field(default=1.0, metadata={"help": "'gae' only: GAE lambda (paper: 1.0)."})
    critic_value_clip: float = field(
        default=0.2, metadata={"help": "'gae' only: PPO value clipping (paper: 0.2)."}
    )
    critic_learning_rate: float | None = field(
        default=None,
        metadata={"help": "'gae' only: the critic's learning rate. None: the policy's learning_rate."},
    )
    critic_model: str | None = field(
        default=None,
        metadata={
            "help": "'gae' only: a model id or directory for a separate value model. None: a copy of the policy "
            "with a scalar head (the paper's initialisation)."
        },
    )
    critic_warmup_steps: int = field(
        default=0,
        metadata={
            "help": "'gae' only: the first N training steps train the critic alone (the policy does not move; verl's "
            "critic_warmup). They count toward max_steps. 0: no warm-up."
        },
    )

    hybrid_budget: float = field(
        default=0.1,
        metadata={
            "help": "'hybrid' only: extra sampled tokens for Monte Carlo step credit in degenerate groups, as a "
            "fraction of the batch's sampled response tokens, masked ones included (0: GRPO exactly)."
        },
    )

    tree_branching: list[int] = field(
        default_factory=lambda: [4, 2],
        metadata={
            "help": "'tree' only: children per level of each group's tree (product = num_generations, each >= 2)."
        },
    )
    tree_depths: list[int] | None = field(
        default=None,
        metadata={
            "help": "'tree' only: completion token depth where each level branches (first 0, increasing). None: "
            "spread over the first half of max_completion_length."
        },
    )

    # ---- Anchor-state turn credit (advantage_estimator="anchor") ------------------------------------------
    anchor_state: str = field(
        default="state_key",
        metadata={
            "help": "'anchor' only: the state key of each turn: 'state_key' (the environment's read-only state_key "
            "property; a rollout_func's 'turn_keys' field; the observation with tools= alone) or 'observation' (the "
            "tokens of the tool results before the turn; the prompt for the first)."
        },
    )
    anchor_gamma: float = field(
        default=1.0, metadata={"help": "'anchor' only: discount of the turn returns, in (0, 1]."}
    )
    anchor_weight: float = field(
        default=1.0,
        metadata={
            "help": "'anchor' only: weight of the step advantage beside GRPO's episode advantage (GiGPO: 1.0; "
            "0: GRPO exactly). Normalized credit only."
        },
    )
    anchor_scope: str = field(
        default="group",
        metadata={
            "help": "'anchor' only: which episodes share a step group: 'group' (the prompt group, GiGPO's) or "
            "'batch' (every episode whose key matches: only for keys that identify the task too)."
        },
    )
    anchor_credit: str = field(
        default="normalized",
        metadata={
            "help": "'anchor' only: 'normalized' (GiGPO: GRPO's advantage plus the turn return normalised in its step "
            "group) or 'pooled' (step groups' mean returns as values V(s), advantage V(s_t+1) - V(s_t))."
        },
    )

    # ---- Monte Carlo value estimation ---------------------------------------------------------------------
    num_mc_rollouts: int = MCSettings.config_field("num_rollouts")
    step_segmenter: Callable[[str], list[str]] | str | None = field(
        default="math",
        metadata={
            "help": "How responses are cut into reasoning steps: 'math' (default), 'gsm8k', 'newline', a "
            "StepSegmenter instance or a picklable callable text -> list[str]."
        },
    )
    mc_rollout_budget: str = MCSettings.config_field("rollout_budget")
    mc_fixed_rollout_budget: int | None = MCSettings.config_field("fixed_rollout_budget")
    mc_max_estimated_steps: int | None = MCSettings.config_field("max_estimated_steps")
    mc_truncated_reward: float | None = MCSettings.config_field("truncated_reward")
    mc_steps_after_cap: str = MCSettings.config_field("steps_after_cap")
    mc_min_step_tokens: int | None = MCSettings.config_field("min_step_tokens")
    mc_reuse_samples: bool = MCSettings.config_field("reuse_samples")
    mc_allocation: str = MCSettings.config_field("allocation")
    mc_min_rollouts: int = MCSettings.config_field("min_rollouts")
    truncated_completion_reward: float | None = field(
        default=None,
        metadata={
            "help": "Reward of a training response that hit max_completion_length without EOS, given by every reward "
            "function instead of grading it. None: graded like any response (official code: 0.0)."
        },
    )
    mc_max_batch_sequences: int = field(
        default=256,
        metadata={"help": "Transformers sampler only: most sequences per `generate` call."},
    )
    whiten_advantages: bool | None = field(
        default=None,
        metadata={
            "help": "Whiten per-token advantages over all completion tokens of the batch, across ranks. Unset: the "
            "estimator's default (on for 'vineppo', as the paper; off for 'grpo'/'rloo', which normalise their own)."
        },
    )
    env_max_sessions: int = environment_setting_field("env_max_sessions")
    mc_estimate_on_eval: bool = field(
        default=False,
        metadata={
            "help": "Also estimate Monte Carlo advantages on evaluation batches (costly). When off, evaluation "
            "batches carry zero advantages."
        },
    )

    def __post_init__(self) -> None:
        # Unset bf16 is GRPOConfig's (on unless fp16), except where TrainingArguments would refuse that
        # (GRPO_DEFAULT_DIFFERENCES): there it is off.
        if self.bf16 is None:
            refused = _bf16_refused_here(self.use_cpu)
            self.bf16 = (not self.fp16) and not refused
            # Turned off only because use_cpu is unset: GRPOConfig's value returns when use_cpu is set later.
            self._bf16_off_without_cpu = refused and not self.fp16
        estimator_cls = get_advantage_estimator(self.advantage_estimator)
        self.advantage_estimator = estimator_cls.name
        if self.scale_rewards is None:
            self.scale_rewards = estimator_cls.default_scale_rewards
        if self.whiten_advantages is None:
            self.whiten_advantages = bool(estimator_cls.whiten_by_default)
        try:
            super().__post_init__()
        except ValueError as err:
            one_generation = self.num_generations is not None and self.num_generations < 2
            if one_generation and estimator_cls.name != "grpo" and "generations" in str(err):
                raise ValueError(_one_generation_message(self.num_generations, estimator_cls, err)) from err
            raise
        self._validate_settings(estimator_cls)

    def __setattr__(self, name: str, value: Any) -> None:
        """Fields are set as usual; setting ``use_cpu=True`` after construction (as TRL's test fixture does) gives an
        unset ``bf16`` the value ``GRPOConfig`` gives it with ``use_cpu`` (on, with its mixed precision), where it had
        been turned off only because ``use_cpu`` was unset (:data:`GRPO_DEFAULT_DIFFERENCES`)."""
        super().__setattr__(name, value)
        if name == "use_cpu" and value and self.__dict__.get("_bf16_off_without_cpu"):
            super().__setattr__("_bf16_off_without_cpu", False)
            super().__setattr__("bf16", True)
            if getattr(self, "mixed_precision", "no") == "no":  # TrainingArguments derives it from bf16
                super().__setattr__("mixed_precision", "bf16")

    def _validate_settings(self, estimator_cls: type) -> None:
        """Reject Monte Carlo settings that are invalid or contradict each other, naming the field and fix."""
        validate_environment_settings(env_max_sessions=self.env_max_sessions)
        if self.truncated_completion_reward is not None and not math.isfinite(
            self.truncated_completion_reward
        ):
            raise ValueError(
                f"truncated_completion_reward={self.truncated_completion_reward} is invalid: it must be a finite "
                "reward (e.g. 0.0, the official code's) or None to grade truncated responses normally."
            )

        # Resolving the segmenter here makes an unknown name fail when the config is built, not mid-training.
        from mcadvantage.tasks.segmentation import get_segmenter

        if self.step_segmenter is None:
            raise ValueError(
                "step_segmenter=None is invalid: VinePPO needs a step segmenter. Use 'math', 'gsm8k', 'newline', "
                "a StepSegmenter instance or a callable text -> list[str]."
            )
        try:
            get_segmenter(self.step_segmenter)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"step_segmenter={self.step_segmenter!r} is invalid: {err} Use 'math', 'gsm8k', 'newline', a "
                "StepSegmenter instance or a callable text -> list[str]."
            ) from err
        if not isinstance(self.step_segmenter, str):
            # Trainer checkpoints pickle the config (training_args.bin); a lambda would fail at the first save.
            try:
                pickle.dumps(self.step_segmenter)
            except Exception as err:
                raise ValueError(
                    f"step_segmenter={self.step_segmenter!r} cannot be pickled ({err}), so saving a checkpoint "
                    "(which pickles the config) would fail mid-training. Pass a module-level function or a "
                    "StepSegmenter instance instead of a lambda or a local function."
                ) from err

        if self.mc_max_batch_sequences < 1:
            raise ValueError(
                f"mc_max_batch_sequences={self.mc_max_batch_sequences} is invalid. Set it >= 1 (default 256)."
            )

        self._refuse_settings_the_estimator_ignores(estimator_cls)
        # Rules shared by several estimators (a token-level loss, no reward scaling, ...), then the estimator's own.
        for rule in estimator_cls.config_rules:
            rule(self, estimator_cls.name)
        estimator_cls.validate_config(self)

    def _refuse_settings_the_estimator_ignores(self, estimator_cls: type[AdvantageEstimator]) -> None:
        """Refuse a non-default value of a setting that another estimator reads and the chosen one does not: it
        would be silently ignored."""
        reads = set(estimator_cls.config_fields)
        for name in sorted(estimator_owned_fields(type(self)) - reads):
            if _differs_from_default(self, name):
                readers = estimators_reading(name)
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is set, but advantage_estimator={estimator_cls.name!r} does not "
                    f"read it (it is a setting of {_quoted_or(readers)}), so it would be ignored. Drop {name}, or "
                    f"choose advantage_estimator={_quoted_or(readers)}."
                )
        if self.mc_estimate_on_eval and not estimator_cls.uses_rollouts:
            raise ValueError(
                f"mc_estimate_on_eval=True changes nothing under advantage_estimator={estimator_cls.name!r}: it "
                "samples no continuations, so evaluation batches get its advantages anyway. Drop mc_estimate_on_eval."
            )

    @classmethod
    def from_paper(cls, task: str, **overrides: Any) -> VinePPOConfig:
        """The settings of the paper's runs (Table 1) and of the official code (McGill-NLP/VinePPO), in one call.

        Sets: AdamW lr 1e-6, betas (0.9, 0.999), weight decay 0, gradient clip 1.0, polynomial schedule with 3%
        warm-up; 64 prompts x 8 responses = 512 episodes per PPO iteration, minibatch 64 (as gradient
        accumulation over ``per_device_train_batch_size`` x ``WORLD_SIZE`` processes), 2 inner epochs; 1,000 (MATH)
        or 650 (GSM8K) iterations as ``max_steps``; temperature 0.6, top-p 0.9, responses of up to 1,024 tokens,
        KL 1e-4, clip 0.2; K = 9 with a fresh 1,024-token budget per rollout (capped by the context), reward 0 for
        rollouts and for training responses that hit their length limit; the ``"math"`` or ``"gsm8k"`` segmenter,
        and on GSM8K at most 26 estimated states with advantage 0 after them. See docs/fidelity.md for what
        still differs from the official implementation.

        **The rollout budget follows the response budget.** The paper gave responses and rollouts the same 1,024
        tokens, so the preset's ``mc_fixed_rollout_budget`` is ``max_completion_length``: with
        ``max_completion_length=24`` every rollout gets a fresh 24 tokens, not 1,024. Set
        ``mc_fixed_rollout_budget`` yourself to decouple the two, or ``mc_rollout_budget="remaining"`` to give
        each rollout what is left of the response's budget (the preset then sets no fixed budget). A model whose
        context is shorter than a prompt plus ``max_completion_length`` is refused when the trainer starts, with
        the largest ``max_completion_length`` that fits; pass that here and the rollout budget follows it. Every
        rollout is also capped by the context at sampling time (``min(budget, context - prefix)``, as the
        official code).

        Args:
            task: ``"math"`` or ``"gsm8k"``.
            **overrides: any ``VinePPOConfig`` field (``output_dir`` is required by ``TrainingArguments``;
                hardware settings such as ``per_device_train_batch_size``, ``use_vllm`` or ``bf16`` belong here).
                Each wins over the preset, and the preset's derived settings (the rollout budget, gradient
                accumulation, ``max_steps``) follow it.
        Raises:
            ValueError: an unknown task, or a batch geometry that cannot make a 64-episode minibatch.
        """
        key = str(task).lower()
        if key not in _PAPER_ITERATIONS:
            raise ValueError(f"task={task!r} is not one of the paper's tasks: use 'math' or 'gsm8k'.")
        settings: dict[str, Any] = {
            "learning_rate": 1e-6,
            "adam_beta1": 0.9,
            "adam_beta2": 0.999,
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
            "lr_scheduler_type": "polynomial",
            "warmup_steps": 0.03,  # a float < 1 is a fraction of the training steps in transformers
            "num_generations": 8,
            "generation_batch_size": _PAPER_EPISODES_PER_ITERATION,
            "num_iterations": 2,
            "temperature": 0.6,
            "top_p": 0.9,
            "max_completion_length": 1024,
            "beta": 1e-4,
            "epsilon": 0.2,
            "advantage_estimator": "vineppo",
            "num_mc_rollouts": 9,
            "step_segmenter": key,
            "mc_rollout_budget": "fixed",
            "mc_truncated_reward": 0.0,
            "truncated_completion_reward": 0.0,
        }
        if key == "gsm8k":
            settings.update(mc_max_estimated_steps=26, mc_steps_after_cap="zero")
        settings.update(overrides)
        # The official code gave every rollout a fresh budget equal to the responses' (both 1,024). A preset budget
        # fixed at 1,024 would ignore a user's smaller max_completion_length and then make the trainer refuse
        # prompts that leave fewer than 1,024 positions free; so it follows max_completion_length, unless the user
        # sets the rollout budget (or a budget kind that takes none) themselves.
        if "mc_fixed_rollout_budget" not in overrides and settings["mc_rollout_budget"] == "fixed":
            settings["mc_fixed_rollout_budget"] = settings["max_completion_length"]
        # The preset sets only what the chosen estimator reads (the Monte Carlo settings are VinePPO's and the
        # hybrid's, the segmenter also the critic's): another estimator would refuse them as ignored.
        reads = set(get_advantage_estimator(settings["advantage_estimator"]).config_fields)
        for name in estimator_owned_fields(cls) - reads - set(overrides):
            settings.pop(name, None)
        per_device = int(settings.get("per_device_train_batch_size", 8))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if "gradient_accumulation_steps" not in overrides:
            if _PAPER_MINIBATCH % (per_device * world):
                raise ValueError(
                    f"per_device_train_batch_size={per_device} x {world} processes does not divide the paper's "
                    f"minibatch of {_PAPER_MINIBATCH} episodes. Pick a per_device_train_batch_size that does, or "
                    "pass gradient_accumulation_steps yourself."
                )
            settings["gradient_accumulation_steps"] = _PAPER_MINIBATCH // (per_device * world)
        if "max_steps" not in overrides:
            minibatch = per_device * world * int(settings["gradient_accumulation_steps"])
            steps_per_iteration = (
                int(settings["generation_batch_size"]) // minibatch * int(settings["num_iterations"])
            )
            settings["max_steps"] = _PAPER_ITERATIONS[key] * steps_per_iteration
        return cls(**settings)


def estimator_owned_fields(config_cls: type) -> set[str]:
    """The fields of ``config_cls`` that some registered estimator declares in its ``config_fields``: each is
    refused, when not at its default, under an estimator that does not read it."""
    declared = {
        name
        for est in available_advantage_estimators()
        for name in get_advantage_estimator(est).config_fields
    }
    return declared & {f.name for f in fields(config_cls)}


def _default_of(config: Any, name: str) -> Any:
    spec = next(f for f in fields(config) if f.name == name)
    return spec.default_factory() if spec.default_factory is not MISSING else spec.default


def _differs_from_default(config: Any, name: str) -> bool:
    value, default = getattr(config, name), _default_of(config, name)
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) != list(default)  # a tuple from the command line equals the default list
    return value != default


def _one_generation_message(num_generations: int, estimator_cls: type, trl_error: Exception) -> str:
    """Why ``num_generations < 2`` is refused under an estimator other than GRPO's, with the fix; TRL's own words
    follow (its check is what refuses it). The fix names only settings the estimator reads: fewer
    ``num_mc_rollouts`` only where it samples continuations (``"anchor"``, for one, refuses that field)."""
    estimator = estimator_cls.name
    fewer = (
        "; to sample less per prompt, use num_generations=2 and fewer num_mc_rollouts"
        if "num_mc_rollouts" in estimator_cls.config_fields
        else ""
    )
    return (
        f"num_generations={num_generations} is refused under advantage_estimator={estimator!r}: VinePPOTrainer is "
        "TRL's GRPOTrainer underneath, which samples every prompt as a group of num_generations responses and "
        "refuses groups of fewer than 2 whatever the estimator, even one whose values need no group (a Monte Carlo "
        f"value averages its own continuations). Set num_generations=2 or more (GRPOConfig's default is 8){fewer}. "
        f"TRL's GRPOConfig says: {trl_error}"
    )


def _quoted_or(names: list[str]) -> str:
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


# Table 1 of the paper: PPO iterations per task, episodes per iteration, minibatch size.
_PAPER_ITERATIONS = {"math": 1000, "gsm8k": 650}
_PAPER_EPISODES_PER_ITERATION = 512
_PAPER_MINIBATCH = 64
