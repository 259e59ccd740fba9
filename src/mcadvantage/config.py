"""Configuration of :class:`~mcadvantage.trainer.VinePPOTrainer`: TRL's ``GRPOConfig`` plus the Monte Carlo
settings of VinePPO, with the paper's PPO settings as defaults.

Importing this module imports TRL (``GRPOConfig``), but not vLLM.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field

from trl import GRPOConfig

# TRL loss types that aggregate the PPO-clip surrogate token by token; "dapo" (the default) is VinePPO's.
_TOKEN_LEVEL_CLIP_LOSSES = ("dapo", "bnpo", "dr_grpo", "grpo")


def _bf16_available() -> bool:
    """True when a CUDA device with native bfloat16 support is visible (the only case where ``bf16=None``
    resolves to True)."""
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except Exception:  # a broken CUDA install must not break building a config
        return False


@dataclass
class VinePPOConfig(GRPOConfig):
    r"""Configuration for :class:`~mcadvantage.trainer.VinePPOTrainer` (VinePPO, arXiv 2410.01679).

    A :class:`trl.GRPOConfig` (every GRPO / ``TrainingArguments`` field works, and ``HfArgumentParser`` turns it
    into command-line flags) plus the Monte Carlo value-estimation settings below.

    VinePPO keeps PPO's clipped objective but replaces the critic: each response is cut into reasoning steps,
    the value of the state before each step is the mean reward of ``num_mc_rollouts`` continuations sampled
    from it with the current policy, and every token of step ``i`` gets the advantage
    ``V(S_i) - V(S_{i-1})`` (the last step gets ``R - V(S_{n-1})``).

    Attributes:
        num_mc_rollouts (int): K, the number of continuations sampled from every state to estimate its value
            (paper: 9; larger is better, K=1 already beats PPO). Defaults to `9`.
        step_segmenter (str | Callable[[str], list[str]]): How a response is cut into reasoning steps: `"math"`
            (paper Appendix B MATH rules: newlines and sentence ends, never inside a math expression, long parts
            split again), `"gsm8k"` (one step per line, the final `#### N` line joins the last step), `"newline"`
            (one step per line), a :class:`~mcadvantage.segmenters.StepSegmenter` instance or any picklable
            callable `text -> list[str]` whose parts concatenate back to `text`. `"math"` is the default because
            it also cuts long responses without newlines into several steps; use `"gsm8k"` for GSM8K-style data.
            Defaults to `"math"`.
        mc_rollout_budget (str): Token budget of a continuation from the state after `b` completion tokens:
            `"remaining"` gives it `max_completion_length - b` tokens, so a continuation faces the same length
            limit as the response it estimates; `"fixed"` gives every continuation `mc_fixed_rollout_budget`
            tokens (the official code's choice: a fresh 1024-token budget). Defaults to `"remaining"`.
        mc_fixed_rollout_budget (int | None): Budget per continuation with `mc_rollout_budget="fixed"` (required
            there, rejected otherwise). Defaults to `None`.
        mc_max_estimated_steps (int | None): Estimate at most the first `m` states of a response; its later steps
            are merged into one final step whose advantage is `R - V(S_{m-1})` (the official code used 25 on GSM8K
            and gave later steps 0). Defaults to `None`.
        mc_truncated_reward (float | None): Reward of a continuation that hit its token budget without EOS. `None`
            (default) grades it with the reward functions like any other text; the official code used `0.0`.
            Defaults to `None`.
        mc_max_batch_sequences (int): With the transformers sampler, the most sequences generated in one
            `generate` call (memory bound). Defaults to `256`.
        whiten_advantages (bool): Whiten the per-token advantages (zero mean, unit variance over all completion
            tokens of the generation batch, statistics all-reduced across data-parallel ranks), as the paper does.
            Defaults to `True`.
        mc_estimate_on_eval (bool): Also run the Monte Carlo estimation on evaluation batches. Off by default
            because it multiplies the cost of evaluation; evaluation batches then carry zero advantages, so the
            eval loss is only the KL term and the reward metrics are the useful evaluation signal. Defaults to
            `False`.

    Defaults that differ from :class:`trl.GRPOConfig` (the paper's Table 1 and the official code):

    - `temperature=0.6` (GRPO: 1.0) and `top_p=0.9` (GRPO: 1.0; official code): used for the training
      responses and, identically, for every Monte Carlo continuation.
    - `beta=1e-4` (GRPO: 0.0): KL penalty to the reference model in the loss (k3 estimator). A reference
      model is loaded from `model.config.name_or_path`, so pass a model id or a saved directory; set
      `beta=0.0` to train without one.
    - `num_iterations=2` (GRPO: 1): two PPO epochs over every generation batch.
    - `max_completion_length=1024` (GRPO: 512).
    - `scale_rewards="none"` (GRPO: `"group"`): GRPO's reward scaling only shapes GRPO's own advantages,
      which VinePPO replaces; `whiten_advantages` is VinePPO's normalisation. Setting `"group"` or
      `"batch"` is rejected as contradictory.
    - `bf16=None` resolves to True only on a CUDA GPU with bfloat16 support and to False elsewhere (GRPO
      turns bf16 on whenever fp16 is off, which slows CPU runs). Set it explicitly on other accelerators.

    Kept from GRPO because they already match VinePPO: `learning_rate=1e-6`, `epsilon=0.2` (clip),
    `num_generations=8` responses per prompt, and `loss_type="dapo"`: the clipped surrogate is summed over
    tokens and divided by the number of completion tokens in the whole (accumulated, all-rank) batch, i.e. a
    token-weighted mean like the paper's PPO loss, independent of how the batch is split into micro-batches.
    `"bnpo"` (token mean per micro-batch, what the official code did), `"dr_grpo"` and `"grpo"` (per-sequence
    mean) are also accepted; other loss types are rejected. Remaining Table 1 settings are not defaults here
    because they depend on the user's hardware: 64 prompts x 8 responses per iteration
    (`generation_batch_size=512`), minibatch 64, weight decay 0, grad clip 1.0 (`max_grad_norm`, TRL's default),
    warmup 3% (`warmup_ratio=0.03`). `gradient_checkpointing` stays on (GRPO's default) for memory; turn it off
    for tiny models on CPU.
    """

    # ---- GRPO defaults overridden with the paper's values -------------------------------------------------
    temperature: float = field(
        default=0.6,
        metadata={
            "help": "Sampling temperature of the training responses and of every Monte Carlo continuation "
            "(VinePPO paper: 0.6)."
        },
    )
    top_p: float = field(
        default=0.9,
        metadata={
            "help": "Nucleus sampling threshold for responses and Monte Carlo continuations (official VinePPO code: "
            "0.9). Must be in (0, 1]."
        },
    )
    beta: float = field(
        default=1e-4,
        metadata={
            "help": "KL coefficient (k3 estimator, in the loss); VinePPO paper: 1e-4. A reference model is loaded "
            "from the policy's name_or_path when > 0."
        },
    )
    num_iterations: int = field(
        default=2,
        metadata={"help": "PPO epochs over each generation batch (VinePPO paper: 2)."},
    )
    max_completion_length: int | None = field(
        default=1024,
        metadata={"help": "Maximum length of a generated response, in tokens (VinePPO paper: 1024)."},
    )
    scale_rewards: str = field(
        default="none",
        metadata={
            "help": "GRPO reward scaling. VinePPO replaces GRPO's advantages, so only 'none' is accepted; use "
            "`whiten_advantages` to normalise VinePPO's advantages."
        },
    )

    # ---- Monte Carlo value estimation ---------------------------------------------------------------------
    num_mc_rollouts: int = field(
        default=9,
        metadata={
            "help": "K: continuations sampled from every state to estimate its value (VinePPO paper: 9)."
        },
    )
    step_segmenter: Callable[[str], list[str]] | str | None = field(
        default="math",
        metadata={
            "help": "How responses are cut into reasoning steps: 'math' (default), 'gsm8k', 'newline', a "
            "StepSegmenter instance or a picklable callable text -> list[str]."
        },
    )
    mc_rollout_budget: str = field(
        default="remaining",
        metadata={
            "help": "Token budget of a Monte Carlo continuation: 'remaining' (max_completion_length minus the "
            "prefix length) or 'fixed' (mc_fixed_rollout_budget tokens)."
        },
    )
    mc_fixed_rollout_budget: int | None = field(
        default=None,
        metadata={"help": "Tokens per continuation when mc_rollout_budget='fixed' (official code: 1024)."},
    )
    mc_max_estimated_steps: int | None = field(
        default=None,
        metadata={
            "help": "Estimate at most the first m states of a response; later steps merge into one final step "
            "(official code: 25 on GSM8K). None: estimate every state."
        },
    )
    mc_truncated_reward: float | None = field(
        default=None,
        metadata={
            "help": "Reward of a continuation that ran out of budget without EOS. None: grade it with the reward "
            "functions (official code: 0.0)."
        },
    )
    mc_max_batch_sequences: int = field(
        default=256,
        metadata={"help": "Transformers sampler only: most sequences per `generate` call."},
    )
    whiten_advantages: bool = field(
        default=True,
        metadata={
            "help": "Whiten per-token advantages over all completion tokens of the batch, across ranks (paper: on)."
        },
    )
    mc_estimate_on_eval: bool = field(
        default=False,
        metadata={
            "help": "Also estimate Monte Carlo advantages on evaluation batches (costly). When off, evaluation "
            "batches carry zero advantages."
        },
    )

    def __post_init__(self) -> None:
        # Resolve bf16 before GRPOConfig does: it would turn bf16 on unconditionally (slow on CPU).
        if self.bf16 is None:
            self.bf16 = (not self.fp16) and (not self.use_cpu) and _bf16_available()
        super().__post_init__()
        self._validate_mc_settings()

    def _validate_mc_settings(self) -> None:
        """Reject Monte Carlo settings that are invalid or contradict each other, naming the field and fix."""
        if not isinstance(self.num_mc_rollouts, int) or isinstance(self.num_mc_rollouts, bool):
            raise TypeError(
                f"num_mc_rollouts must be an int, got {self.num_mc_rollouts!r}. Set it to the number of "
                "continuations per state, e.g. num_mc_rollouts=9."
            )
        if self.num_mc_rollouts < 1:
            raise ValueError(
                f"num_mc_rollouts={self.num_mc_rollouts} is invalid: every state needs at least one Monte Carlo "
                "continuation. Set num_mc_rollouts >= 1 (the paper uses 9)."
            )

        # Resolving the segmenter here makes an unknown name fail when the config is built, not mid-training.
        from .segmenters import get_segmenter

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

        if self.mc_rollout_budget not in ("remaining", "fixed"):
            raise ValueError(
                f"mc_rollout_budget={self.mc_rollout_budget!r} is invalid. Use 'remaining' (continuations get what "
                "is left of max_completion_length) or 'fixed' (with mc_fixed_rollout_budget)."
            )
        if self.mc_rollout_budget == "fixed":
            if self.mc_fixed_rollout_budget is None:
                raise ValueError(
                    "mc_rollout_budget='fixed' needs mc_fixed_rollout_budget (tokens per continuation), which is "
                    "None. Set mc_fixed_rollout_budget, e.g. 1024, or use mc_rollout_budget='remaining'."
                )
            if self.mc_fixed_rollout_budget < 1:
                raise ValueError(
                    f"mc_fixed_rollout_budget={self.mc_fixed_rollout_budget} is invalid: a continuation needs at "
                    "least one token. Set mc_fixed_rollout_budget >= 1."
                )
        elif self.mc_fixed_rollout_budget is not None:
            raise ValueError(
                f"mc_fixed_rollout_budget={self.mc_fixed_rollout_budget} is set but mc_rollout_budget="
                f"{self.mc_rollout_budget!r} ignores it. Set mc_rollout_budget='fixed' to use it, or drop "
                "mc_fixed_rollout_budget."
            )
        if self.mc_rollout_budget == "remaining" and self.max_completion_length is None:
            raise ValueError(
                "mc_rollout_budget='remaining' needs max_completion_length (the budget continuations share with "
                "the response), which is None. Set max_completion_length, or use mc_rollout_budget='fixed'."
            )

        if self.mc_max_estimated_steps is not None and self.mc_max_estimated_steps < 1:
            raise ValueError(
                f"mc_max_estimated_steps={self.mc_max_estimated_steps} is invalid: at least the prompt state "
                "S_0 must be estimated. Set mc_max_estimated_steps >= 1, or None to estimate every step."
            )
        if self.mc_truncated_reward is not None and not math.isfinite(self.mc_truncated_reward):
            raise ValueError(
                f"mc_truncated_reward={self.mc_truncated_reward} is invalid: it must be a finite reward (e.g. 0.0) "
                "or None to grade truncated continuations normally."
            )
        if self.mc_max_batch_sequences < 1:
            raise ValueError(
                f"mc_max_batch_sequences={self.mc_max_batch_sequences} is invalid. Set it >= 1 (default 256)."
            )

        # GRPO settings that VinePPO would silently ignore or contradict.
        if self.scale_rewards != "none":
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} contradicts VinePPO: it scales GRPO's group advantages, "
                "which VinePPOTrainer replaces with Monte Carlo advantages. Set scale_rewards='none' and use "
                "whiten_advantages=True to normalise the advantages."
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation!r} is not supported: VinePPO's "
                "values are means of the weighted sum of raw rewards, so group-normalising each reward function "
                "first has no Monte Carlo equivalent. Set multi_objective_aggregation='sum_then_normalize'."
            )
        if self.loss_type not in _TOKEN_LEVEL_CLIP_LOSSES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not a token-level PPO-clip loss, so it would not use VinePPO's "
                f"per-token advantages as the paper does. Use one of {list(_TOKEN_LEVEL_CLIP_LOSSES)} "
                "('dapo', the default, is the paper's token-weighted mean)."
            )
        if self.importance_sampling_level != "token":
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r} averages the ratio over the "
                "sequence, which discards VinePPO's per-step credit in the clipping. Set "
                "importance_sampling_level='token'."
            )
