"""The estimator contract, checked on every registered estimator: the built-ins, one estimator registered here, and
any other registered when the tests are collected. A new estimator gets these checks by being registered.

For each, a tiny VinePPOTrainer (the offline tiny Llama) trains two optimizer steps from one generation batch
(``num_iterations=2`` epochs of 2 accumulated micro-batches), and every advantage result the estimator returned on
the way is checked: ``(B, T)`` float advantages, finite on the token mask, zero on padding, float metrics with known
reductions, logged under the estimator's ``metric_prefix``; then its ``state_dict`` goes through a checkpoint file
into a fresh estimator and back unchanged.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from _helpers import tiny_config  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from mcadvantage import VinePPOTrainer  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    AdvantageBatch,
    AdvantageEstimator,
    AdvantageResult,
    EstimatorContext,
    available_advantage_estimators,
    get_advantage_estimator,
    register_advantage_estimator,
    sequence_to_token_advantages,
)
from mcadvantage.trainer.checkpoints import (  # noqa: E402
    ESTIMATOR_STATE_FILE,
    load_estimator_state,
    save_estimator_state,
)


@register_advantage_estimator("contract_test_baseline")
class GroupMeanWithCount(AdvantageEstimator):
    """Registered here so the contract runs on an estimator written by a user: GRPO's group-mean baseline without
    scaling, with state of its own (the batches it has seen) so the checkpoint round trip carries something."""

    metric_prefix = "contract"
    uses_rollouts = False

    def __init__(self) -> None:
        self.batches_seen = 0

    def estimate(self, batch: AdvantageBatch, context: EstimatorContext) -> AdvantageResult:
        rewards = torch.nan_to_num(batch.all_rewards.cpu(), nan=0.0).view(-1, batch.group_size)
        advantages = (rewards - rewards.mean(dim=1, keepdim=True)).view(-1)[batch.local_slice]
        self.batches_seen += 1
        return AdvantageResult(
            advantages=sequence_to_token_advantages(advantages, batch.completion_mask),
            metrics={"mean_reward": float(rewards.mean()), "responses": float(len(batch.completion_ids))},
            metric_reductions={"responses": "sum"},
        )

    def state_dict(self) -> dict:
        return {"batches_seen": self.batches_seen}

    def load_state_dict(self, state: dict) -> None:
        self.batches_seen = int(state["batches_seen"])


# Settings a built-in needs on the tiny run beyond the shared ones below (the tree's branching must multiply to the
# group size of 4). A new estimator whose defaults fit a tiny run needs no entry.
EXTRA_SETTINGS: dict[str, dict] = {"tree": {"tree_branching": [2, 2]}}
REDUCTIONS = {"mean", "sum", "max", "min"}


def vowel_share(completions, **kwargs):
    """A reward with variance on the tiny model's random text: the share of vowels."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


def chunk4(text: str) -> list[str]:
    """Steps of 4 characters, so Monte Carlo estimators see several steps per short response (module level:
    the config pickles its segmenter)."""
    return [text[i : i + 4] for i in range(0, len(text), 4)] or [text]


class RecordingTrainer(VinePPOTrainer):
    """Keeps every batch, the estimator's result for it and the advantages that went to the loss."""

    def compute_advantages(self, batch: AdvantageBatch) -> torch.Tensor:
        advantages = super().compute_advantages(batch)
        self.recorded.append((batch, self.last_advantage_result, advantages))
        return advantages


def _state_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_result(
    name: str, batch: AdvantageBatch, result: AdvantageResult, loss_advantages: torch.Tensor
) -> None:
    """The contract on one estimate: what ``estimate`` returned, and what the trainer made of it."""
    mask = batch.completion_mask.bool()
    advantages = result.advantages
    assert isinstance(advantages, torch.Tensor) and advantages.is_floating_point(), (
        f"{name}: advantages must be a float tensor, got {type(advantages).__name__} "
        f"{getattr(advantages, 'dtype', '')}"
    )
    assert tuple(advantages.shape) == tuple(mask.shape), (
        f"{name}: advantages have shape {tuple(advantages.shape)}, the batch's completion mask (B, T) "
        f"{tuple(mask.shape)}"
    )
    valid = mask.clone()
    if result.token_mask is not None:
        assert tuple(result.token_mask.shape) == tuple(mask.shape), f"{name}: token_mask is not (B, T)"
        valid &= result.token_mask.to(mask.device).bool()
    assert torch.isfinite(advantages[valid]).all(), f"{name}: non-finite advantages on the token mask"
    padding = advantages.to(mask.device)[~mask]
    assert (padding == 0).all(), (
        f"{name}: advantages must be zero on padding; {int((padding != 0).sum())} padding tokens are not "
        f"(largest {float(padding.abs().max()):.4g})"
    )
    assert isinstance(result.metrics, dict), f"{name}: metrics must be a dict"
    for key, value in result.metrics.items():
        assert isinstance(key, str) and "/" not in key, f"{name}: metric name {key!r} must be a plain string"
        assert isinstance(value, float), f"{name}: metric {key!r} is {type(value).__name__}, not float"
    for key, how in result.metric_reductions.items():  # may name metrics a batch did not report
        assert how in REDUCTIONS, (
            f"{name}: metric {key!r} reduces by {how!r}, not one of {sorted(REDUCTIONS)}"
        )
    # What reached the loss: the same (B, T), finite everywhere, zero on padding.
    assert tuple(loss_advantages.shape) == tuple(mask.shape)
    assert torch.isfinite(loss_advantages).all() and (loss_advantages[~mask] == 0).all()


@pytest.mark.parametrize("name", available_advantage_estimators())
def test_the_class_declares_the_contract(name):
    cls = get_advantage_estimator(name)
    assert issubclass(cls, AdvantageEstimator) and cls.name == name
    assert cls.estimate is not AdvantageEstimator.estimate, f"{name} does not implement estimate"
    assert isinstance(cls.whiten_by_default, bool) and isinstance(cls.uses_rollouts, bool)
    assert cls.default_scale_rewards in ("group", "batch", "none")
    assert isinstance(cls.metric_prefix, str) and cls.metric_prefix and "/" not in cls.metric_prefix


@pytest.mark.parametrize("name", available_advantage_estimators())
def test_one_training_step_keeps_the_contract(name, tiny_model_dir, tmp_path):
    eos_token_id = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    args = tiny_config(
        tmp_path / "out",
        advantage_estimator=name,
        max_completion_length=8,
        num_mc_rollouts=2,
        step_segmenter=chunk4,
        beta=0.0,
        learning_rate=1e-3,
        num_iterations=2,
        gradient_accumulation_steps=2,
        max_steps=2,
        logging_steps=1,
        # A bias toward EOS ends some responses early, so the batch has padding to check.
        generation_kwargs={"sequence_bias": [[[eos_token_id], 4.0]]},
        **EXTRA_SETTINGS.get(name, {}),
    )
    dataset = Dataset.from_dict({"prompt": [f"{a}+{a}=" for a in range(4)]})
    trainer = RecordingTrainer(
        model=str(tiny_model_dir), reward_funcs=vowel_share, args=args, train_dataset=dataset
    )
    trainer.recorded = []
    estimator = trainer.advantage_estimator
    assert isinstance(estimator, AdvantageEstimator) and estimator.name == name
    trainer.train()

    # Two optimizer steps of 2 micro-batches each from one generation batch: both epochs of num_iterations=2.
    assert trainer.state.global_step == 2
    assert len(trainer.recorded) == 1, f"{name}: expected one generation batch, got {len(trainer.recorded)}"
    for batch, result, loss_advantages in trainer.recorded:
        lengths = batch.completion_mask.sum(dim=1)
        assert bool((lengths < batch.completion_mask.shape[1]).any()), (
            "no padding in the batch: nothing to check"
        )
        check_result(name, batch, result, loss_advantages)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    logged = {key for entry in trainer.state.log_history for key in entry}
    for metric in trainer.recorded[-1][1].metrics:
        assert f"{estimator.metric_prefix}/{metric}" in logged, f"{name}: metric {metric!r} was not logged"

    # state_dict round trip through a checkpoint file into a fresh estimator.
    state = estimator.state_dict()
    assert isinstance(state, dict)
    save_estimator_state(estimator, tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint" / ESTIMATOR_STATE_FILE).exists() == bool(state)
    fresh = type(estimator).from_config(trainer.args)
    load_estimator_state(fresh, tmp_path / "checkpoint")
    assert _state_equal(fresh.state_dict(), state), f"{name}: state_dict did not survive the checkpoint"
