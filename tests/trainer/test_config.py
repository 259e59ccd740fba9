"""VinePPOConfig: GRPO's defaults (the paper's through from_paper), validation errors naming the field and the fix, CLI parsing."""

from __future__ import annotations

import pickle
import warnings

import pytest

pytest.importorskip("trl")

from mcadvantage.tasks.gsm8k import GSM8KSegmenter  # noqa: E402
from mcadvantage.trainer.config import GRPO_DEFAULT_DIFFERENCES, VinePPOConfig  # noqa: E402


def make(**kwargs):
    kwargs.setdefault("output_dir", "unused-output-dir")
    kwargs.setdefault("report_to", "none")
    return VinePPOConfig(**kwargs)


def split_lines(text: str) -> list[str]:
    """A module-level (hence picklable) custom segmenter."""
    return text.splitlines(keepends=True) or [text]


#: The only GRPOConfig fields whose VinePPOConfig default differs: the listed ones (output_dir is the test's own).
DOCUMENTED_DIFFERENCES = {*GRPO_DEFAULT_DIFFERENCES, "output_dir"}


def test_every_grpo_field_keeps_grpos_default_so_the_swap_changes_only_the_advantage():
    """Issue 18 finding 4: VinePPOConfig used to change five GRPO defaults silently (temperature 0.6, top_p 0.9,
    beta 1e-4, num_iterations 2, max_completion_length 1024), so the "grpo" estimator under VinePPOConfig was not
    TRL's GRPO out of the box. Every shared field is compared, so a new silent override fails here."""
    import dataclasses

    import torch
    from trl import GRPOConfig

    cfg = make(advantage_estimator="grpo")
    grpo = GRPOConfig(output_dir="unused-output-dir", report_to="none", bf16=False)
    differing = {
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if f.init and getattr(cfg, f.name) != getattr(grpo, f.name) and f.name not in DOCUMENTED_DIFFERENCES
    }
    assert differing == set(), {name: (getattr(cfg, name), getattr(grpo, name)) for name in differing}
    assert (cfg.temperature, cfg.top_p, cfg.beta, cfg.num_iterations, cfg.max_completion_length) == (
        1.0,
        1.0,
        0.0,
        1,
        512,
    )
    # scale_rewards follows the estimator: GRPO's "group" under "grpo", "none" under Monte Carlo.
    assert cfg.scale_rewards == grpo.scale_rewards == "group"
    vine = make()
    assert vine.scale_rewards == "none" and vine.whiten_advantages is True
    assert vine.epsilon == 0.2 and vine.learning_rate == 1e-6 and vine.num_generations == 8
    assert vine.loss_type == "dapo"
    # Monte Carlo settings.
    assert vine.num_mc_rollouts == 9
    assert vine.step_segmenter == "math"
    assert vine.mc_rollout_budget == "remaining" and vine.mc_fixed_rollout_budget is None
    assert vine.mc_max_estimated_steps is None and vine.mc_truncated_reward is None
    assert vine.mc_estimate_on_eval is False
    # bf16 unset: GRPOConfig's (on) wherever GRPOConfig builds; off only where it would be refused (no bf16 GPU
    # and use_cpu unset; tests/trainer/test_drop_in.py).
    assert vine.bf16 == bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    assert make(use_cpu=True).bf16 is GRPOConfig(output_dir="unused", use_cpu=True).bf16 is True
    assert make(bf16=False, use_cpu=True).bf16 is False  # an explicit value wins


def test_the_papers_ppo_settings_come_from_from_paper():
    cfg = VinePPOConfig.from_paper("math", output_dir="unused-output-dir", report_to="none", bf16=False)
    assert (cfg.temperature, cfg.top_p, cfg.beta, cfg.num_iterations, cfg.max_completion_length) == (
        0.6,
        0.9,
        1e-4,
        2,
        1024,
    )


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_vineppo_refuses_temperature_zero_with_its_own_message(temperature):
    """Issue 18 finding 3: temperature 0 used to end in a transformers error mid-training."""
    with pytest.raises(ValueError, match=r"temperature=.*advantage_estimator='vineppo'.*greedy"):
        make(temperature=temperature, num_mc_rollouts=4)
    make(temperature=0.0, advantage_estimator="grpo")  # GRPO's own behaviour is TRL's business


@pytest.mark.parametrize("k", [0, -3])
def test_num_mc_rollouts_below_one(k):
    with pytest.raises(ValueError, match=r"num_mc_rollouts=.*>= 1"):
        make(num_mc_rollouts=k)


def test_unknown_segmenter_name():
    with pytest.raises(
        ValueError, match=r"step_segmenter='sentences' is invalid.*'math', 'gsm8k', 'newline'"
    ):
        make(step_segmenter="sentences")


def test_segmenter_none_rejected():
    with pytest.raises(ValueError, match="step_segmenter=None"):
        make(step_segmenter=None)


def test_segmenter_lambda_rejected_because_checkpoints_pickle_the_config():
    with pytest.raises(ValueError, match="cannot be pickled.*module-level function"):
        make(step_segmenter=lambda text: [text])


def test_segmenter_instance_and_function_accepted_and_picklable():
    for seg in (GSM8KSegmenter(max_steps=25), split_lines):
        cfg = make(step_segmenter=seg)
        restored = pickle.loads(pickle.dumps(cfg))
        assert restored.step_segmenter("a\nb") == ["a\n", "b"]


def test_fixed_budget_requires_a_budget():
    with pytest.raises(ValueError, match=r"mc_rollout_budget='fixed' needs mc_fixed_rollout_budget"):
        make(mc_rollout_budget="fixed")
    with pytest.raises(ValueError, match=r"mc_fixed_rollout_budget=0 is invalid"):
        make(mc_rollout_budget="fixed", mc_fixed_rollout_budget=0)
    assert make(mc_rollout_budget="fixed", mc_fixed_rollout_budget=64).mc_fixed_rollout_budget == 64


def test_fixed_budget_without_fixed_mode_is_contradictory():
    with pytest.raises(
        ValueError, match=r"mc_fixed_rollout_budget=64 is set but mc_rollout_budget='remaining'"
    ):
        make(mc_fixed_rollout_budget=64)


def test_unknown_budget_mode():
    with pytest.raises(ValueError, match=r"mc_rollout_budget='fresh' is invalid"):
        make(mc_rollout_budget="fresh")


def test_remaining_budget_needs_max_completion_length():
    with pytest.raises(ValueError, match=r"needs max_completion_length"):
        make(max_completion_length=None)


def test_max_estimated_steps_below_one():
    with pytest.raises(ValueError, match=r"mc_max_estimated_steps=0 is invalid"):
        make(mc_max_estimated_steps=0)
    assert make(mc_max_estimated_steps=25).mc_max_estimated_steps == 25


def test_truncated_reward_must_be_finite():
    with pytest.raises(ValueError, match=r"mc_truncated_reward=nan is invalid"):
        make(mc_truncated_reward=float("nan"))
    assert make(mc_truncated_reward=0.0).mc_truncated_reward == 0.0


def test_max_batch_sequences_below_one():
    with pytest.raises(ValueError, match=r"mc_max_batch_sequences=0 is invalid"):
        make(mc_max_batch_sequences=0)


@pytest.mark.parametrize("scale", ["group", "batch", True])
def test_grpo_reward_scaling_contradicts_vineppo(scale):
    with pytest.raises(
        ValueError, match=r"scale_rewards=.*advantage_estimator=.vineppo. replaces.*whiten_advantages"
    ):
        make(scale_rewards=scale)


def test_normalize_then_sum_rejected():
    with pytest.raises(
        ValueError, match=r"multi_objective_aggregation='normalize_then_sum' is not supported"
    ):
        make(multi_objective_aggregation="normalize_then_sum")


@pytest.mark.parametrize("loss", ["cispo", "sapo", "luspo", "vespo"])
def test_non_ppo_clip_losses_rejected(loss):
    with pytest.raises(ValueError, match=rf"loss_type='{loss}' is not a token-level PPO-clip loss"):
        make(loss_type=loss)


@pytest.mark.parametrize("loss", ["dapo", "bnpo", "dr_grpo", "grpo"])
def test_ppo_clip_losses_accepted(loss):
    assert make(loss_type=loss).loss_type == loss


def test_sequence_level_importance_sampling_rejected():
    with pytest.raises(
        ValueError, match=r"importance_sampling_level='sequence'.*Set importance_sampling_level='token'"
    ):
        make(importance_sampling_level="sequence")


def test_grpo_validation_still_runs():
    # GRPOConfig's own checks are kept (num_generations >= 2).
    with pytest.raises(ValueError, match="at least 2 generations"):
        make(num_generations=1, per_device_train_batch_size=1)


def test_cli_parsing_with_hf_argument_parser():
    from transformers import HfArgumentParser

    (cfg,) = HfArgumentParser(VinePPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            "unused-output-dir",
            "--report_to",
            "none",
            "--num_mc_rollouts",
            "4",
            "--step_segmenter",
            "gsm8k",
            "--mc_rollout_budget",
            "fixed",
            "--mc_fixed_rollout_budget",
            "64",
            "--mc_max_estimated_steps",
            "25",
            "--mc_truncated_reward",
            "0.0",
            "--whiten_advantages",
            "false",
        ]
    )
    assert isinstance(cfg, VinePPOConfig)
    assert cfg.num_mc_rollouts == 4 and cfg.step_segmenter == "gsm8k"
    assert cfg.mc_rollout_budget == "fixed" and cfg.mc_fixed_rollout_budget == 64
    assert cfg.mc_max_estimated_steps == 25 and cfg.mc_truncated_reward == 0.0
    assert cfg.whiten_advantages is False
    # GRPO's defaults also apply through the CLI.
    assert cfg.temperature == 1.0 and cfg.beta == 0.0


def test_trl_version_window():
    from mcadvantage.trainer.trl_compat import check_trl_version

    with pytest.raises(ImportError, match=r"supports TRL >=1.16,<1.17 but TRL 1.15.2 is installed"):
        check_trl_version("1.15.2")
    with pytest.raises(ImportError, match=r"TRL 2.0.0 is installed"):
        check_trl_version("2.0.0")
    # One range, stated once: an untested minor release is refused like any other version outside it.
    with pytest.raises(ImportError, match=r"TRL 1.17.0 is installed.*pip install 'trl>=1.16,<1.17'"):
        check_trl_version("1.17.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_trl_version("1.16.3")
        check_trl_version()  # the installed TRL is in the tested window


@pytest.mark.parametrize("option", [dict(mc_reuse_samples=True), dict(mc_allocation="variance")])
def test_hybrid_refuses_pooled_values(option):
    # Its responses are chosen because their group's outcomes are all equal: pooled, they would bias the values.
    ((name, value),) = option.items()
    with pytest.raises(
        ValueError,
        match=rf"^{name}={value!r} is not supported by advantage_estimator='hybrid'.*"
        "mc_reuse_samples=False",
    ):
        make(advantage_estimator="hybrid", **option)
    make(advantage_estimator="vineppo", **option)
