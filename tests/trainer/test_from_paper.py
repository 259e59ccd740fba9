"""``VinePPOConfig.from_paper`` respects what the user overrides: the preset's rollout budget follows a smaller
``max_completion_length`` (the paper gave responses and rollouts the same 1,024 tokens), so a run sized for a small
model starts instead of being refused for a 1,024-token rollout budget the user never asked for.

Table 1's values themselves are pinned in tests/trainer/test_fidelity.py; this file pins how overrides interact with them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

# The preset's geometry needs one process (WORLD_SIZE unset) and a per-device batch that divides the minibatch.
PRESET_OVERRIDES = dict(output_dir="unused", report_to="none", use_cpu=True, bf16=False)


@pytest.fixture(autouse=True)
def _one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.mark.parametrize("task", ["math", "gsm8k"])
def test_the_rollout_budget_follows_max_completion_length(task):
    from mcadvantage import VinePPOConfig

    paper = VinePPOConfig.from_paper(task, **PRESET_OVERRIDES)
    assert (paper.max_completion_length, paper.mc_rollout_budget, paper.mc_fixed_rollout_budget) == (
        1024,
        "fixed",
        1024,
    )
    small = VinePPOConfig.from_paper(task, max_completion_length=24, **PRESET_OVERRIDES)
    assert (small.max_completion_length, small.mc_rollout_budget, small.mc_fixed_rollout_budget) == (
        24,
        "fixed",
        24,
    )
    # Everything else of the preset stays the paper's.
    for name in ("num_mc_rollouts", "temperature", "top_p", "beta", "mc_truncated_reward", "max_steps"):
        assert getattr(small, name) == getattr(paper, name), name


def test_an_explicit_rollout_budget_wins():
    from mcadvantage import VinePPOConfig

    cfg = VinePPOConfig.from_paper(
        "gsm8k", max_completion_length=24, mc_fixed_rollout_budget=40, **PRESET_OVERRIDES
    )
    assert (cfg.max_completion_length, cfg.mc_fixed_rollout_budget) == (24, 40)
    # The official 1,024 with the official response length is what the preset gives by default.
    cfg = VinePPOConfig.from_paper("gsm8k", mc_fixed_rollout_budget=1024, **PRESET_OVERRIDES)
    assert cfg.mc_fixed_rollout_budget == 1024


def test_a_remaining_budget_gets_no_fixed_budget():
    """``mc_rollout_budget="remaining"`` takes no fixed budget (the config rejects one); the preset sets none."""
    from mcadvantage import VinePPOConfig

    cfg = VinePPOConfig.from_paper("math", mc_rollout_budget="remaining", **PRESET_OVERRIDES)
    assert (cfg.mc_rollout_budget, cfg.mc_fixed_rollout_budget) == ("remaining", None)
    # The user's own contradiction is still refused, naming the fields.
    with pytest.raises(ValueError, match=r"fixed_rollout_budget=16 is set but .*rollout_budget='remaining'"):
        VinePPOConfig.from_paper(
            "math", mc_rollout_budget="remaining", mc_fixed_rollout_budget=16, **PRESET_OVERRIDES
        )


def _trainer(model_dir, args):
    from datasets import Dataset

    from mcadvantage import GSM8KVerifier, VinePPOTrainer

    rows = [
        {"prompt": f"Start with {n}. Add 3. What is the result?\n", "answer": str(n + 3)} for n in range(4)
    ]
    return VinePPOTrainer(
        model=str(model_dir), reward_funcs=GSM8KVerifier(), args=args, train_dataset=Dataset.from_list(rows)
    )


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory):
    """The tests' tiny Llama with a 128-position context: far below the paper's 1,024-token budgets."""
    from mcadvantage.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("short-context"), max_position_embeddings=128)


@pytest.mark.slow
def test_a_small_model_starts_with_the_budget_the_user_asked_for(short_context_model, tmp_path):
    """The issue's case: ``max_completion_length=24`` on a small model used to keep a 1,024-token rollout budget
    and then refuse every prompt. Now the trainer starts, and its estimator budgets rollouts at 24 tokens."""
    from mcadvantage import VinePPOConfig

    settings = {**PRESET_OVERRIDES, "output_dir": str(tmp_path), "gradient_checkpointing": False}
    trainer = _trainer(
        short_context_model, VinePPOConfig.from_paper("gsm8k", max_completion_length=24, **settings)
    )
    assert trainer.completion_room == (24, "max_completion_length")
    assert trainer.advantage_estimator.settings.fixed_rollout_budget == 24


@pytest.mark.slow
def test_a_context_shorter_than_the_preset_names_the_length_that_fits(short_context_model, tmp_path):
    """With the preset's 1,024-token responses on a 128-position model the trainer refuses, naming
    ``max_completion_length`` and the largest value that fits; passing that value starts it, rollouts included."""
    import re

    from mcadvantage import VinePPOConfig

    settings = {**PRESET_OVERRIDES, "output_dir": str(tmp_path), "gradient_checkpointing": False}
    with pytest.raises(ValueError, match=r"max_completion_length=1024 a response needs") as refused:
        _trainer(short_context_model, VinePPOConfig.from_paper("gsm8k", **settings))
    fits = int(re.search(r"lower max_completion_length to at most (\d+)", str(refused.value)).group(1))
    assert 0 < fits < 128
    trainer = _trainer(
        short_context_model, VinePPOConfig.from_paper("gsm8k", max_completion_length=fits, **settings)
    )
    assert trainer.completion_room == (fits, "max_completion_length")
