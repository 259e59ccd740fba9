"""VinePPOConfig: the paper's defaults, validation errors naming the field and the fix, CLI parsing."""

from __future__ import annotations

import pickle
import warnings

import pytest

pytest.importorskip("trl")

from mcadvantage.config import VinePPOConfig  # noqa: E402
from mcadvantage.segmenters import GSM8KSegmenter  # noqa: E402


def make(**kwargs):
    kwargs.setdefault("output_dir", "unused-output-dir")
    kwargs.setdefault("report_to", "none")
    return VinePPOConfig(**kwargs)


def split_lines(text: str) -> list[str]:
    """A module-level (hence picklable) custom segmenter."""
    return text.splitlines(keepends=True) or [text]


def test_paper_defaults_override_grpo():
    import torch
    from trl import GRPOConfig

    cfg = make()
    grpo = GRPOConfig(output_dir="unused-output-dir", report_to="none", bf16=False)
    # The paper's Table 1 / official-code values where GRPO differs.
    assert (cfg.temperature, grpo.temperature) == (0.6, 1.0)
    assert (cfg.top_p, grpo.top_p) == (0.9, 1.0)
    assert (cfg.beta, grpo.beta) == (1e-4, 0.0)
    assert (cfg.num_iterations, grpo.num_iterations) == (2, 1)
    assert (cfg.max_completion_length, grpo.max_completion_length) == (1024, 512)
    assert (cfg.scale_rewards, grpo.scale_rewards) == ("none", "group")
    # Values GRPO already shares with the paper.
    assert cfg.epsilon == 0.2 and cfg.learning_rate == 1e-6 and cfg.num_generations == 8
    assert cfg.loss_type == "dapo"
    # Monte Carlo settings.
    assert cfg.num_mc_rollouts == 9
    assert cfg.step_segmenter == "math"
    assert cfg.mc_rollout_budget == "remaining" and cfg.mc_fixed_rollout_budget is None
    assert cfg.mc_max_estimated_steps is None and cfg.mc_truncated_reward is None
    assert cfg.whiten_advantages is True and cfg.mc_estimate_on_eval is False
    # bf16 "auto": on only with a bf16-capable CUDA device (GRPOConfig would turn it on everywhere).
    assert cfg.bf16 == bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    # An explicit value wins (bf16 on CPU needs use_cpu=True in TrainingArguments).
    assert make(bf16=True, use_cpu=True).bf16 is True
    assert make(use_cpu=True).bf16 is False


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
    with pytest.raises(ValueError, match=r"scale_rewards=.*contradicts VinePPO.*whiten_advantages"):
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
    # Paper defaults also apply through the CLI.
    assert cfg.temperature == 0.6 and cfg.beta == 1e-4


def test_trl_version_window():
    from mcadvantage.trl_compat import check_trl_version

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
