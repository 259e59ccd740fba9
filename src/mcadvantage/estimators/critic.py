"""PPO's learned critic on the estimator seam: the paper's main baseline (``advantage_estimator="gae"``).

A value model (by default the policy's own weights with a scalar head instead of the language-model head, as
the paper initialised it; or a separate model) predicts ``V(s_t)`` before every completion token. Advantages are
GAE with the paper's ``gamma = lambda = 1`` (then ``A_t = R - V(s_t)``). After the advantages of a training batch
are computed, the critic is trained on that batch: the clipped value loss (value clip 0.2) against the GAE
returns, ``num_iterations`` epochs of minibatches of ``per_device_train_batch_size`` responses, with its own
AdamW. The policy's loss sees the same batch in the same number of epochs; the critic's targets do not depend on
the policy update, so training it before or interleaved with the policy gives the same critic.

With several processes each process trains on its own responses and the gradients are summed over processes and
divided by the global token count of the minibatch, so a 2-process run matches one process given the same
minibatches. The critic is saved in every trainer checkpoint (``advantage_estimator.pt``) and restored when
training resumes from one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch

from mcadvantage.core.advantages import clipped_value_loss, gae_advantages
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.batch import AdvantageBatch, AdvantageResult, EstimatorContext
from mcadvantage.estimators.registry import register_advantage_estimator
from mcadvantage.estimators.rules import no_reward_scaling, summed_rewards, token_level_loss
from mcadvantage.tasks.segmentation import get_segmenter, segment_completion

__all__ = ["CriticEstimator", "value_model_from_policy"]


def value_model_from_policy(policy: Any) -> Any:
    """A token-classification model with one output (a scalar value per position) whose backbone is a copy of
    ``policy``'s (a causal LM, or a PEFT model, whose adapters are merged into the copy). The scalar head is new."""
    from transformers import AutoModelForTokenClassification

    source = policy
    if hasattr(
        source, "merge_and_unload"
    ):  # PEFT: the critic starts from the policy with its adapters merged
        source = copy.deepcopy(source).merge_and_unload()
    config = copy.deepcopy(source.config)
    config.num_labels = 1
    value_model = AutoModelForTokenClassification.from_config(config)
    missing, unexpected = value_model.base_model.load_state_dict(source.base_model.state_dict(), strict=False)
    if unexpected or [k for k in missing if "score" not in k]:
        raise ValueError(
            f"value_model_from_policy: the policy's backbone does not fit {type(value_model).__name__} (missing "
            f"{missing[:3]}, unexpected {unexpected[:3]}); pass critic_model with a model id instead."
        )
    return value_model.to(device=next(policy.parameters()).device, dtype=torch.float32)


def _world() -> tuple[bool, int]:
    ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    return ready, torch.distributed.get_world_size() if ready else 1


@register_advantage_estimator("gae")
class CriticEstimator(AdvantageEstimator):
    """PPO's advantages from a learned value model (GAE), trained alongside the policy.

    Args:
        gamma: GAE's discount (``gae_gamma``; the paper's 1.0).
        lam: GAE's parameter (``gae_lambda``; the paper's 1.0).
        value_clip: PPO's value clipping (``critic_value_clip``; the paper's 0.2).
        learning_rate: the critic's AdamW learning rate (``critic_learning_rate``, default the policy's).
        epochs: passes over each batch (``num_iterations``, as the policy).
        minibatch_size: responses per critic update (``per_device_train_batch_size``, as the policy).
        max_grad_norm: gradient clipping of the critic (``max_grad_norm``, as the policy).
        critic_model: a model id or directory for a separate value model (``critic_model``); None: initialise
            from the policy's weights on the first batch.
        shuffle: shuffle the responses into minibatches each epoch (a private generator seeded by ``seed``, so
            the policy's sampling is not disturbed).
        seed: seed of that generator and of the value head's initialisation.
        step_segmenter: cuts responses into steps for the reported step values (``AdvantageResult.values``).
        warmup_steps: the first ``warmup_steps`` training steps train the critic only (``critic_warmup_steps``;
            :meth:`updates_policy` tells the trainer to leave the policy as it is), as verl's ``critic_warmup``.

    Attributes:
        value_model: the critic (None until the first batch).
        last_values: per local response, the critic's ``[V(S_0), ..., V(S_{n-1}), R]`` at the step boundaries of
            the latest batch (before that batch's update), for the diagnostics.
        last_rows: local batch indices of the responses in ``last_values``.
    """

    whiten_by_default = True
    metric_prefix = "critic"
    # No rollouts (uses_rollouts stays False): the trainer calls it on evaluation batches too, where it predicts
    # without training.
    config_fields = (
        "gae_gamma",
        "gae_lambda",
        "critic_value_clip",
        "critic_learning_rate",
        "critic_model",
        "critic_warmup_steps",
        "step_segmenter",
    )
    config_rules = (no_reward_scaling, summed_rewards, token_level_loss)

    def __init__(
        self,
        *,
        gamma: float = 1.0,
        lam: float = 1.0,
        value_clip: float = 0.2,
        learning_rate: float = 1e-6,
        epochs: int = 1,
        minibatch_size: int = 8,
        max_grad_norm: float | None = 1.0,
        critic_model: str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        step_segmenter: Any = None,
        warmup_steps: int = 0,
    ) -> None:
        for name, value in (("gamma", gamma), ("lam", lam)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"CriticEstimator: {name}={value} must lie in [0, 1] (the paper uses 1.0).")
        if not value_clip > 0:
            raise ValueError(f"CriticEstimator: value_clip={value_clip} must be > 0 (the paper uses 0.2).")
        if not learning_rate > 0:
            raise ValueError(f"CriticEstimator: learning_rate={learning_rate} must be > 0.")
        if warmup_steps < 0:
            raise ValueError(
                f"CriticEstimator: warmup_steps={warmup_steps} must be >= 0 (0: the policy moves from the first step)."
            )
        if epochs < 1 or minibatch_size < 1:
            raise ValueError(
                f"CriticEstimator: epochs={epochs} and minibatch_size={minibatch_size} must be >= 1."
            )
        self.gamma, self.lam, self.value_clip = float(gamma), float(lam), float(value_clip)
        self.learning_rate, self.epochs, self.minibatch_size = (
            float(learning_rate),
            int(epochs),
            int(minibatch_size),
        )
        self.max_grad_norm = max_grad_norm
        self.critic_model = critic_model
        self.shuffle = shuffle
        self.seed = int(seed)
        self.warmup_steps = int(warmup_steps)
        self.segmenter = None if step_segmenter is None else get_segmenter(step_segmenter)
        self.value_model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.updates = 0
        self._pending_state: dict[str, Any] | None = None
        self.last_values: list[list[float]] = []
        self.last_rows: list[int] = []
        # Rewards of the training batches so far, for the constant predictor's value error.
        self._reward_sum = 0.0
        self._reward_count = 0

    def _mean_reward(self) -> float:
        return self._reward_sum / self._reward_count if self._reward_count else math.nan

    @classmethod
    def from_config(cls, config: Any) -> CriticEstimator:
        """Build the critic from a ``VinePPOConfig``."""
        return cls(
            gamma=config.gae_gamma,
            lam=config.gae_lambda,
            value_clip=config.critic_value_clip,
            learning_rate=config.critic_learning_rate or config.learning_rate,
            epochs=config.num_iterations,
            minibatch_size=config.per_device_train_batch_size,
            max_grad_norm=config.max_grad_norm,
            critic_model=config.critic_model,
            seed=config.seed,
            step_segmenter=config.step_segmenter,
            warmup_steps=config.critic_warmup_steps,
        )

    @staticmethod
    def validate_config(config: Any) -> None:
        """Refuse invalid critic settings."""
        for name in ("gae_gamma", "gae_lambda"):
            value = getattr(config, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} is invalid: it must lie in [0, 1] (the paper uses 1.0).")
        if not config.critic_value_clip > 0:
            raise ValueError(
                f"critic_value_clip={config.critic_value_clip} is invalid: it must be > 0 (the paper uses 0.2)."
            )
        if config.critic_learning_rate is not None and not config.critic_learning_rate > 0:
            raise ValueError(
                f"critic_learning_rate={config.critic_learning_rate} is invalid: it must be > 0, or None for the "
                "policy's learning_rate."
            )
        warmup = config.critic_warmup_steps
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise ValueError(
                f"critic_warmup_steps={warmup!r} is invalid: it must be an integer >= 0 (0: no warm-up; e.g. 10 trains "
                "the critic alone on the first 10 training steps' batches)."
            )
        if warmup and config.max_steps > 0 and warmup >= config.max_steps:
            raise ValueError(
                f"critic_warmup_steps={warmup} leaves the policy no step of max_steps={config.max_steps}: the warm-up "
                "steps count toward max_steps. Raise max_steps to the policy's steps plus the warm-up, or lower "
                "critic_warmup_steps."
            )
        if warmup and getattr(config, "deepspeed", None):
            raise NotImplementedError(
                f"critic_warmup_steps={warmup} with deepspeed: DeepSpeed's engine takes the optimizer step itself, "
                "so the trainer cannot hold the policy still during the warm-up. Use critic_warmup_steps=0, or DDP/FSDP."
            )

    def updates_policy(self, global_step: int) -> bool:
        """False on the warm-up's steps (``global_step < warmup_steps``): the trainer then leaves the policy as it
        is, while this estimator still trains the critic on the step's batch (the starting policy's responses)."""
        return global_step >= self.warmup_steps

    # -- the critic -------------------------------------------------------------------------------------------

    def ensure_value_model(self, context: EstimatorContext) -> Any:
        """Build the critic on first use (from ``critic_model`` or the context's policy) and its optimizer."""
        if self.value_model is not None:
            return self.value_model
        # The same new head on every process, without disturbing the caller's RNG.
        torch_state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        try:
            if self.critic_model is not None:
                from transformers import AutoModelForTokenClassification

                model = AutoModelForTokenClassification.from_pretrained(self.critic_model, num_labels=1)
                if context.policy_model is not None:
                    model = model.to(next(context.policy_model.parameters()).device)
            elif context.policy_model is None:
                raise ValueError(
                    "advantage_estimator='gae' initialises its critic from the policy, but the estimator context has "
                    "no policy_model. VinePPOTrainer passes it; elsewhere pass EstimatorContext(policy_model=...) or "
                    "set critic_model."
                )
            else:
                model = value_model_from_policy(context.policy_model)
        finally:
            torch.random.set_rng_state(torch_state)
        for module in model.modules():  # a regression head: no dropout (token classifiers add 0.1 by default)
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        self.value_model = model.float()
        self.value_model.config.pad_token_id = context.tokenizer.pad_token_id
        self.optimizer = torch.optim.AdamW(
            self.value_model.parameters(), lr=self.learning_rate, weight_decay=0.0
        )
        if self._pending_state is not None:
            self.load_state_dict(self._pending_state)
            self._pending_state = None
        return self.value_model

    def _inputs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad: int
    ) -> Any:
        rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        width = max(len(r) for r in rows)
        device = next(self.value_model.parameters()).device
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        attention = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            attention[i, : len(r)] = 1
        return ids, attention

    def token_values(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        width: int,
        *,
        grad: bool,
    ) -> torch.Tensor:
        """``(B, width)`` values ``V(s_t)`` of the state before each completion token (zero past a completion)."""
        pad = self.value_model.config.pad_token_id or 0
        ids, attention = self._inputs(prompt_ids, completion_ids, pad)
        with torch.set_grad_enabled(grad):
            scores = self.value_model(input_ids=ids, attention_mask=attention).logits[..., 0]
        out = torch.zeros((len(prompt_ids), width), dtype=scores.dtype, device=scores.device)
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            n = min(len(c), width)
            # The state before completion token t ends at position len(p) + t - 1.
            out[i, :n] = scores[i, len(p) - 1 : len(p) - 1 + n]
        return out

    def predict_values(
        self, prompt_ids: Sequence[Sequence[int]], prefixes: Sequence[Sequence[int]]
    ) -> list[float]:
        """The critic's value of each state ``prompt + prefix`` (for the diagnostics: any state, not only those of
        a batch)."""
        if self.value_model is None:
            raise RuntimeError(
                "CriticEstimator.predict_values: the critic is built on the first batch; none seen."
            )
        self.value_model.eval()
        pad = self.value_model.config.pad_token_id or 0
        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(prompt_ids), self.minibatch_size):  # batched, right-padded
                ps, cs = (
                    prompt_ids[start : start + self.minibatch_size],
                    prefixes[start : start + self.minibatch_size],
                )
                ids, attention = self._inputs(ps, cs, pad)
                scores = self.value_model(input_ids=ids, attention_mask=attention).logits[..., 0]
                last = attention.sum(dim=1) - 1  # each state's last token
                out += scores[torch.arange(len(ps), device=scores.device), last].tolist()
        return out

    # -- the seam ---------------------------------------------------------------------------------------------

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        """GAE advantages from the critic's values, then (training batches) the critic's update on this batch."""
        model = self.ensure_value_model(context)
        mask = batch.completion_mask.detach()
        width = mask.shape[1]
        rewards = batch.rewards.detach().to(torch.float32).cpu()
        finite = torch.isfinite(rewards)
        valid = torch.tensor(
            [
                bool(ids) and bool(finite[i]) and int(mask[i].sum()) > 0
                for i, ids in enumerate(batch.completion_ids)
            ],
            dtype=torch.bool,
        )
        token_mask = mask.bool().cpu() & valid.unsqueeze(1)
        model.eval()
        old_values = (
            self.token_values(batch.prompt_ids, batch.completion_ids, width, grad=False).detach().cpu()
        )
        clean_rewards = torch.where(finite, rewards, torch.zeros_like(rewards))
        advantages, returns = gae_advantages(
            old_values * token_mask, clean_rewards, token_mask, gamma=self.gamma, lam=self.lam
        )
        self._record_step_values(batch, context, old_values, valid)
        if batch.tool_mask is not None:
            # GAE runs over the whole completion (a tool result is a transition of the episode that takes
            # positions), but tool-result tokens are no action of the policy: no credit, no value target, and out
            # of the whitening statistics.
            token_mask = token_mask & batch.tool_mask.bool().cpu()
            advantages = advantages * token_mask

        # What V(s_t) estimates whatever lambda: the discounted reward-to-go (lambda = 1 returns).
        _, reward_to_go = gae_advantages(
            old_values * token_mask, clean_rewards, token_mask, gamma=self.gamma, lam=1.0
        )
        # Measured before this batch's update: the critic has never trained on these states (fresh), so this is
        # how well it predicts, not how well it fits.
        metrics = {
            "mean_value": float((old_values * token_mask).sum() / token_mask.sum())
            if token_mask.any()
            else math.nan,
            # The metric's historical name (GAE returns; equal to explained_variance_fresh at lambda = 1).
            "explained_variance": _explained_variance(old_values, returns, token_mask),
            "explained_variance_fresh": _explained_variance(old_values, reward_to_go, token_mask),
            "value_error_fresh": _mean_squared_error(old_values, reward_to_go, token_mask),
            # The same error for the constant predictor "mean reward of the earlier training batches": a critic
            # below it predicts better than one that learned only the mean (NaN before any training batch).
            "value_error_constant": _mean_squared_error(
                torch.full_like(old_values, self._mean_reward()), reward_to_go, token_mask
            ),
        }
        if batch.mode == "train":
            metrics["value_loss"] = self._train(batch, old_values, returns, token_mask)
            self._reward_sum += float(clean_rewards[valid].sum())
            self._reward_count += int(valid.sum())
        device = batch.completion_mask.device
        return AdvantageResult(
            advantages=advantages.to(device),
            token_mask=token_mask.to(device),
            values=self.last_values,
            metrics=metrics,
        )

    def _train(
        self, batch: AdvantageBatch, old_values: torch.Tensor, returns: torch.Tensor, token_mask: torch.Tensor
    ) -> float:
        model, optimizer = self.value_model, self.optimizer
        assert optimizer is not None
        ready, world = _world()
        size = len(batch.completion_ids)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.updates)
        losses = []
        model.train()
        for _ in range(self.epochs):
            order = torch.randperm(size, generator=generator).tolist() if self.shuffle else list(range(size))
            # Every process runs the same number of minibatches (TRL gives each the same number of responses), so
            # the gradient all-reduce below always pairs up.
            for start in range(0, size, self.minibatch_size):
                idx = order[start : start + self.minibatch_size]
                m = token_mask[idx]
                # On the parameters' device: NCCL all-reduces CUDA tensors only (gloo takes CPU ones).
                count = m.sum().to(device=next(model.parameters()).device, dtype=torch.float64).reshape(1)
                if ready and world > 1:
                    torch.distributed.all_reduce(count)
                new = self.token_values(
                    [batch.prompt_ids[i] for i in idx],
                    [batch.completion_ids[i] for i in idx],
                    m.shape[1],
                    grad=True,
                )
                device = new.device
                # Summed over tokens and divided by the global token count: the all-reduced gradient equals one
                # process' gradient on the union of the processes' minibatches.
                local = clipped_value_loss(
                    new,
                    old_values[idx].to(device),
                    returns[idx].to(device),
                    m.to(device),
                    clip=self.value_clip,
                )
                loss = local * (float(m.sum()) / max(count.item(), 1.0))
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if ready and world > 1:
                    for p in model.parameters():
                        if p.grad is not None:
                            torch.distributed.all_reduce(p.grad)
                if self.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
                optimizer.step()
                if m.any():
                    losses.append(float(local.detach()))
        self.updates += 1
        model.eval()
        return sum(losses) / len(losses) if losses else math.nan

    def _record_step_values(
        self, batch: AdvantageBatch, context: EstimatorContext, values: torch.Tensor, valid: torch.Tensor
    ) -> None:
        segmenter = (
            self.segmenter if self.segmenter is not None else get_segmenter(context.segmenter or "newline")
        )
        rewards = batch.rewards.detach().cpu()
        self.last_values, self.last_rows = [], []
        for i, ids in enumerate(batch.completion_ids):
            if not bool(valid[i]):
                continue
            bounds = segment_completion(segmenter, context.tokenizer, list(ids))
            self.last_values.append(
                [float(values[i, b]) for b in bounds[:-1] if b < values.shape[1]] + [float(rewards[i])]
            )
            self.last_rows.append(i)

    # -- checkpoints ------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The critic's weights, its optimizer and the update count (saved with every trainer checkpoint)."""
        if self.value_model is None:
            return dict(self._pending_state or {})
        assert self.optimizer is not None
        return {
            "value_model": self.value_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "reward_sum": self._reward_sum,
            "reward_count": self._reward_count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (deferred until the critic is built on the first batch)."""
        if not state:
            return
        if self.value_model is None:
            self._pending_state = state
            return
        assert self.optimizer is not None
        self.value_model.load_state_dict(state["value_model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state.get("updates", 0))
        self._reward_sum = float(state.get("reward_sum", 0.0))
        self._reward_count = int(state.get("reward_count", 0))


def _mean_squared_error(values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """``mean((V - G)^2)`` over the masked tokens (NaN without any)."""
    if not mask.any():
        return math.nan
    return float(((values[mask].double() - targets[mask].double()) ** 2).mean())


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(G - V) / Var(G)`` over the masked tokens (NaN when the returns do not vary)."""
    if mask.sum() < 2:
        return math.nan
    g, v = returns[mask].double(), values[mask].double()
    var_g = g.var()
    return float(1 - (g - v).var() / var_g) if var_g > 0 else math.nan
