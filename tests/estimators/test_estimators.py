"""The advantage-estimator seam: registry, hand-computed GRPO/RLOO advantages, and GRPO/RLOO under
VinePPOTrainer equal to TRL's own GRPOTrainer/RLOOTrainer on the same batch, token for token."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.estimators import (  # noqa: E402
    AdvantageBatch,
    AdvantageResult,
    EstimatorContext,
    available_advantage_estimators,
    get_advantage_estimator,
    reduce_metrics,
    register_advantage_estimator,
)
from mcadvantage.estimators.baselines import grpo_advantages, rloo_advantages  # noqa: E402

NAN = float("nan")

# --------------------------------------------------------------------------------------------------------------
# Pure functions, hand-computed
# --------------------------------------------------------------------------------------------------------------


def test_grpo_group_mean_and_scaling_by_hand():
    # Two groups of 2: rewards (1, 0) and (3, 3).
    per_func = torch.tensor([[1.0], [0.0], [3.0], [3.0]])
    w = torch.tensor([1.0])
    none = grpo_advantages(per_func, w, 2, scale_rewards="none")
    assert none.tolist() == [0.5, -0.5, 0.0, 0.0]
    group = grpo_advantages(per_func, w, 2, scale_rewards="group")
    # group std (Bessel) of (1, 0) is sqrt(0.5); of (3, 3) is 0.
    s = math.sqrt(0.5)
    assert group.tolist() == pytest.approx([0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.0, 0.0])
    batch = grpo_advantages(per_func, w, 2, scale_rewards="batch")
    std = torch.tensor([1.0, 0.0, 3.0, 3.0]).std().item()  # 1.5
    assert batch.tolist() == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.0, 0.0])


def test_grpo_unscorable_rows_leave_the_baseline_and_get_zero():
    per_func = torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, 2.0], [4.0, NAN]])
    w = torch.tensor([1.0, 0.5])
    # combined: 1, NaN, 1, 4 -> group (1, NaN): mean 1; group (1, 4): mean 2.5
    assert grpo_advantages(per_func, w, 2, scale_rewards="none").tolist() == [0.0, 0.0, -1.5, 1.5]


def test_rloo_leave_one_out_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, NAN, 2.0])
    # group (1, 0, 0): 1 - 0 = 1, 0 - 0.5 = -0.5, -0.5; group (3, NaN, 2): 3 - 2 = 1, 0, 2 - 3 = -1
    assert rloo_advantages(rewards, 3).tolist() == [1.0, -0.5, -0.5, 1.0, 0.0, -1.0]
    assert rloo_advantages(rewards, 1).tolist() == [0.0] * 6


def test_metrics_reduce_by_declared_rule():
    parts = [
        {"rollouts": 3.0, "seconds": 1.0, "mean_value": 0.2},
        {"rollouts": 4.0, "seconds": 5.0, "mean_value": NAN},
    ]
    out = reduce_metrics(parts, {"rollouts": "sum", "seconds": "max"})
    assert out == {
        "rollouts": 7.0,
        "seconds": 5.0,
        "mean_value": 0.2,
    }  # a NaN mean does not poison the others


# --------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------


def test_builtins_registered_and_unknown_name_lists_them():
    assert {"vineppo", "grpo", "rloo"} <= set(available_advantage_estimators())
    assert get_advantage_estimator("GRPO").name == "grpo"
    with pytest.raises(ValueError, match=r"advantage_estimator='ppo' is not registered. Known: \[.*'grpo'"):
        get_advantage_estimator("ppo")


def test_a_new_estimator_is_one_class_and_one_registry_line():
    @register_advantage_estimator("test_constant_seam")
    class Constant:
        whiten_by_default = False

        @classmethod
        def from_config(cls, config):
            return cls()

        def estimate(self, batch, context):
            return AdvantageResult(advantages=batch.completion_mask.float() * 2.0, metrics={"calls": 1.0})

    est = get_advantage_estimator("test_constant_seam").from_config(None)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    batch = AdvantageBatch(
        prompt_ids=[[1], [1]],
        completion_ids=[[2, 3], [2]],
        completion_mask=mask,
        rewards_per_func=torch.tensor([[1.0], [0.0]]),
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, 2),
        group_size=2,
    )
    ctx = EstimatorContext.single_process(None, [lambda **kw: []], tokenizer=None)
    assert est.estimate(batch, ctx).advantages.tolist() == [[2.0, 2.0, 0.0], [2.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="already registered"):

        @register_advantage_estimator("test_constant_seam")
        class Other(Constant):
            pass


def test_batch_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="local_slice"):
        AdvantageBatch(
            prompt_ids=[[1]],
            completion_ids=[[2]],
            completion_mask=torch.ones(1, 1),
            rewards_per_func=torch.ones(4, 1),
            reward_weights=torch.ones(1),
            local_slice=slice(0, 2),
            group_size=2,
        )


# --------------------------------------------------------------------------------------------------------------
# Against TRL's own trainers, same batch
# --------------------------------------------------------------------------------------------------------------

pytest.importorskip("trl")


def _text(c) -> str:
    return c if isinstance(c, str) else c[-1]["content"]


def vowel_share(completions, **kwargs):
    return [sum(ch in "aeiou" for ch in _text(c)) / max(len(_text(c)), 1) for c in completions]


def length_or_none(completions, **kwargs):
    """Unscorable (None) for odd-length responses, so NaN handling is exercised."""
    return [None if len(_text(c)) % 2 else len(_text(c)) / 10 for c in completions]


def _common(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        seed=0,
        reward_weights=[1.0, 0.5],
    )
    kwargs.update(overrides)
    return kwargs


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["ab", "cd"]})


def _inputs():
    rows = [{"prompt": p} for p in ("ab", "cd")]
    return [dict(r) for r in rows for _ in range(4)]


def _generate_and_score(trainer, seed, training=True):
    trainer.model.train(training)
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(_inputs())


@pytest.mark.parametrize(
    "settings",
    [
        {"scale_rewards": "group"},
        {"scale_rewards": "batch"},
        {"scale_rewards": "none"},
        {"scale_rewards": "group", "multi_objective_aggregation": "normalize_then_sum"},
    ],
)
def test_grpo_estimator_equals_trl_grpo(tiny_model_dir, tmp_path, settings):
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    funcs = [vowel_share, length_or_none]
    ref = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=funcs,
        args=GRPOConfig(**_common(tmp_path / "g", **settings)),
        train_dataset=_dataset(),
    )
    ours = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=funcs,
        args=VinePPOConfig(**_common(tmp_path / "v", advantage_estimator="grpo", **settings)),
        train_dataset=_dataset(),
    )
    want, got = _generate_and_score(ref, 7), _generate_and_score(ours, 7)
    assert torch.equal(want["completion_ids"], got["completion_ids"])  # the same batch
    mask = got["completion_mask"].bool()
    assert got["advantages"].shape == mask.shape
    expected = want["advantages"].unsqueeze(1).expand_as(mask)
    assert torch.allclose(got["advantages"][mask], expected[mask], atol=1e-6, rtol=0)
    assert (got["advantages"][~mask] == 0).all()
    assert not torch.equal(want["advantages"], torch.zeros_like(want["advantages"]))  # a batch with signal


def test_rloo_estimator_equals_trl_rloo(tiny_model_dir, tmp_path):
    from trl import RLOOConfig, RLOOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    funcs = [vowel_share, length_or_none]
    ref = RLOOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=funcs,
        args=RLOOConfig(**_common(tmp_path / "r", normalize_advantages=False)),
        train_dataset=_dataset(),
    )
    ours = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=funcs,
        args=VinePPOConfig(**_common(tmp_path / "v", advantage_estimator="rloo")),
        train_dataset=_dataset(),
    )
    want, got = _generate_and_score(ref, 11), _generate_and_score(ours, 11)
    assert torch.equal(want["completion_ids"], got["completion_ids"])
    mask = got["completion_mask"].bool()
    expected = want["advantages"].unsqueeze(1).expand_as(mask)
    assert torch.allclose(got["advantages"][mask], expected[mask], atol=1e-6, rtol=0)
    assert not torch.equal(want["advantages"], torch.zeros_like(want["advantages"]))


def test_grpo_estimator_equals_trl_grpo_on_evaluation_batches(tiny_model_dir, tmp_path):
    # Reward-only estimators are cheap, so evaluation batches get advantages (and an eval loss) as in TRL.
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    funcs = [vowel_share, length_or_none]
    ref = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=funcs,
        args=GRPOConfig(**_common(tmp_path / "g")),
        train_dataset=_dataset(),
    )
    ours = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=funcs,
        args=VinePPOConfig(**_common(tmp_path / "v", advantage_estimator="grpo")),
        train_dataset=_dataset(),
    )
    want, got = _generate_and_score(ref, 5, training=False), _generate_and_score(ours, 5, training=False)
    assert torch.equal(want["completion_ids"], got["completion_ids"])
    mask = got["completion_mask"].bool()
    expected = want["advantages"].unsqueeze(1).expand_as(mask)
    assert torch.allclose(got["advantages"][mask], expected[mask], atol=1e-6, rtol=0)
    assert got["advantages"][mask].abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_baselines_train_end_to_end_on_cpu(tiny_model_dir, tmp_path, name):
    from transformers import AutoModelForCausalLM

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=[vowel_share, length_or_none],
        args=VinePPOConfig(
            **_common(
                tmp_path / name, advantage_estimator=name, max_steps=2, logging_steps=1, learning_rate=1e-3
            )
        ),
        train_dataset=_dataset(),
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.advantage_estimator.name == name and trainer.last_mc_estimate is None
    changed = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert changed > 0
    logs = [e for e in trainer.state.log_history if "advantage/frac_groups_zero_std" in e]
    assert logs and all(0.0 <= e["advantage/frac_groups_zero_std"] <= 1.0 for e in logs)
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)
    assert not any(k.startswith("mc/") for e in trainer.state.log_history for k in e)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "cispo"])
def test_swapping_grpoconfig_for_vinepposconfig_trains_the_same_weights(tiny_model_dir, tmp_path, loss_type):
    """Issue 18 finding 4: the drop-in story end to end. With only what a tiny CPU model needs set (no sampling or
    PPO setting), ``GRPOTrainer`` + ``GRPOConfig`` and ``VinePPOTrainer`` + ``VinePPOConfig(advantage_estimator=
    "grpo")`` train to the same weights. Before, VinePPOConfig's own defaults (temperature 0.6, two PPO epochs,
    ...) made these differ, and TRL's ``cispo`` test at lr 0.1 diverged to a sampling error under VinePPOConfig."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    settings = dict(
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=0.1,
        loss_type=loss_type,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    weights = []
    for trainer_cls, config_cls, extra in (
        (GRPOTrainer, GRPOConfig, {}),
        (VinePPOTrainer, VinePPOConfig, {"advantage_estimator": "grpo"}),
    ):
        trainer = trainer_cls(
            model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            reward_funcs=[vowel_share],
            args=config_cls(output_dir=str(tmp_path / trainer_cls.__name__), **settings, **extra),
            train_dataset=_dataset(),
        )
        trainer.train()
        assert trainer.state.global_step == 2
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    grpo, ours = weights
    for name, value in grpo.items():
        assert torch.isfinite(ours[name]).all(), name
        assert torch.allclose(ours[name], value, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_baselines_give_tool_tokens_no_credit_and_no_weight_in_the_whitening(name):
    from mcadvantage.estimators.base import finalize_advantages

    estimator = get_advantage_estimator(name)()
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    tool_mask = torch.tensor(
        [[1, 0, 0, 1], [1, 1, 1, 1]]
    )  # row 0: two tool-result tokens inside the completion
    batch = AdvantageBatch(
        prompt_ids=[[5], [5]],
        completion_ids=[[6, 7, 8, 9], [6, 7, 8]],
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor([[1.0], [0.0]]),
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, 2),
        group_size=2,
        tool_mask=tool_mask,
    )
    result = estimator.estimate(batch, EstimatorContext.single_process(None, [], tokenizer=None))
    assert torch.equal(result.token_mask, torch.tensor([[1, 0, 0, 1], [1, 1, 1, 0]]).bool())
    assert result.advantages[0, 1] == result.advantages[0, 2] == 0 and result.advantages[0, 0] > 0
    whitened = finalize_advantages(result, completion_mask, whiten=True)
    # Whitened over the 5 model tokens (2 of row 0 at +a, 3 of row 1 at -a): their mean is 0, the tool tokens 0.
    model_tokens = result.token_mask
    assert abs(float(whitened[model_tokens].mean())) < 1e-6 and not whitened[~model_tokens].any()
    without = AdvantageBatch(**{**batch.__dict__, "tool_mask": None})
    assert (
        estimator.estimate(without, EstimatorContext.single_process(None, [], tokenizer=None)).token_mask
        is None
    )
