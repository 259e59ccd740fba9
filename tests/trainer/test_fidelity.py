"""The paper-reproduction switch (VinePPOConfig.from_paper) and the official code's behaviours it turns on:
rollout budgets capped by the context, advantage 0 past GSM8K's state cap, reward 0 for truncated responses."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mcadvantage import MCValueEstimator, Trajectory  # noqa: E402
from mcadvantage.testing import FakeSampler, OutcomeReward, build_char_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _sampler(tok, p=1.0):
    y, n = tok.convert_tokens_to_ids(["Y", "N"])
    return FakeSampler(p, success_token_id=y, failure_token_id=n, eos_token_id=tok.eos_token_id, seed=0)


# --------------------------------------------------------------------------------------------------------------
# Budgets capped by the context
# --------------------------------------------------------------------------------------------------------------


def test_fixed_budget_is_capped_by_the_context(tok):
    sampler = _sampler(tok)
    est = MCValueEstimator(
        sampler,
        OutcomeReward("Y"),
        tok,
        num_rollouts=2,
        rollout_budget="fixed",
        fixed_rollout_budget=16,
        context_length=20,
    )
    prompt = tok.encode("abc")  # 3 tokens
    completion = tok.encode("defgh") + [tok.eos_token_id]  # states after 0 and 5 completion tokens
    est.estimate(
        [Trajectory(prompt_ids=prompt, completion_ids=completion, step_boundaries=[0, 5, 6], reward=1.0)]
    )
    budgets = sorted(r.max_tokens for call in sampler.calls for r in call)
    # S_0: min(16, 20 - 3 - 0) = 16; S_1: min(16, 20 - 3 - 5) = 12
    assert budgets == [12, 16]
    assert est.budget(5, 3) == 12 and est.budget(5) == 16  # no prompt length: the fixed budget as such


def test_remaining_budget_is_capped_by_the_context_too(tok):
    est = MCValueEstimator(
        _sampler(tok), OutcomeReward("Y"), tok, max_completion_length=30, context_length=32
    )
    assert est.budget(4, 10) == min(30 - 4, 32 - 10 - 4) == 18


# --------------------------------------------------------------------------------------------------------------
# Steps past the state cap
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["merge", "zero"])
def test_steps_after_cap(tok, mode):
    # The policy succeeds from every state (p = 1), so every estimated value is 1 except where the prefix says
    # otherwise: here all values are 1.0, R = 0 (the response itself failed).
    est = MCValueEstimator(
        _sampler(tok, p=1.0),
        OutcomeReward("Y"),
        tok,
        num_rollouts=2,
        max_completion_length=16,
        max_estimated_steps=2,
        steps_after_cap=mode,
    )
    completion = tok.encode("abcd") + [tok.eos_token_id]  # 4 steps of 1 token + EOS in the last
    traj = Trajectory(
        prompt_ids=tok.encode("Q"), completion_ids=completion, step_boundaries=[0, 1, 2, 3, 5], reward=0.0
    )
    estimate = est.estimate([traj])
    [values], [advs], [tokens] = estimate.values, estimate.step_advantages, estimate.token_advantages
    assert values == [1.0, 1.0, 0.0]  # V(S_0), V(S_1), R: states S_2, S_3 not estimated
    expected_tail = -1.0 if mode == "merge" else 0.0  # merge: R - V(S_1) = -1; zero: the official code's 0
    assert advs == [0.0, expected_tail]
    assert tokens.tolist() == [0.0] + [expected_tail] * 4


def test_steps_after_cap_is_validated(tok):
    with pytest.raises(ValueError, match=r"steps_after_cap='drop' is invalid.*'merge'.*'zero'"):
        MCValueEstimator(
            _sampler(tok), OutcomeReward("Y"), tok, max_completion_length=8, steps_after_cap="drop"
        )


# --------------------------------------------------------------------------------------------------------------
# The preset
# --------------------------------------------------------------------------------------------------------------

pytest.importorskip("trl")


def test_from_paper_sets_table_1_and_the_official_choices(monkeypatch):
    from mcadvantage import VinePPOConfig

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = VinePPOConfig.from_paper("gsm8k", output_dir="unused", report_to="none", use_cpu=True)
    assert (cfg.learning_rate, cfg.weight_decay, cfg.max_grad_norm, cfg.warmup_steps) == (
        1e-6,
        0.0,
        1.0,
        0.03,
    )
    assert str(getattr(cfg.lr_scheduler_type, "value", cfg.lr_scheduler_type)) == "polynomial"
    assert (cfg.adam_beta1, cfg.adam_beta2) == (0.9, 0.999)
    assert (cfg.num_generations, cfg.generation_batch_size, cfg.num_iterations) == (8, 512, 2)
    # minibatch 64 = 8 per device x 1 process x 8 accumulation steps; 650 iterations x (512 / 64) x 2 epochs
    assert cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps == 64
    assert cfg.max_steps == 650 * 8 * 2
    assert (cfg.temperature, cfg.top_p, cfg.max_completion_length, cfg.beta, cfg.epsilon) == (
        0.6,
        0.9,
        1024,
        1e-4,
        0.2,
    )
    assert (cfg.num_mc_rollouts, cfg.mc_rollout_budget, cfg.mc_fixed_rollout_budget) == (9, "fixed", 1024)
    assert (cfg.mc_truncated_reward, cfg.truncated_completion_reward) == (0.0, 0.0)
    assert (cfg.step_segmenter, cfg.mc_max_estimated_steps, cfg.mc_steps_after_cap) == ("gsm8k", 26, "zero")
    math_cfg = VinePPOConfig.from_paper(
        "MATH", output_dir="unused", report_to="none", per_device_train_batch_size=16
    )
    assert math_cfg.step_segmenter == "math" and math_cfg.mc_max_estimated_steps is None
    assert math_cfg.gradient_accumulation_steps == 4 and math_cfg.max_steps == 1000 * 8 * 2
    # Overrides win, including for the derived fields.
    assert VinePPOConfig.from_paper("math", output_dir="u", max_steps=5, num_mc_rollouts=3).max_steps == 5


def test_from_paper_refuses_what_it_cannot_reproduce(monkeypatch):
    from mcadvantage import VinePPOConfig

    with pytest.raises(ValueError, match=r"task='aime' is not one of the paper's tasks"):
        VinePPOConfig.from_paper("aime", output_dir="u")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=8 x 3 processes does not divide.*64"):
        VinePPOConfig.from_paper("math", output_dir="u")


# --------------------------------------------------------------------------------------------------------------
# Reward 0 for training responses that hit the length limit
# --------------------------------------------------------------------------------------------------------------


def always_one(completions, **kwargs):
    """Rewards every response 1.0, so only the truncation rule can make a reward 0."""
    return [1.0] * len(completions)


@pytest.mark.parametrize("value", [None, 0.0])
def test_truncated_training_responses_score_the_set_reward(tiny_model_dir, tmp_path, value):
    from datasets import Dataset

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    seen = []

    class Recording(VinePPOTrainer):
        def compute_advantages(self, batch):
            seen.append((batch.completion_ids, batch.rewards.tolist()))
            return super().compute_advantages(batch)

    trainer = Recording(
        model=str(tiny_model_dir),
        reward_funcs=always_one,
        args=VinePPOConfig(
            output_dir=str(tmp_path),
            report_to="none",
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=3,  # a random tiny model rarely says EOS within 3 tokens
            temperature=1.0,
            advantage_estimator="grpo",
            truncated_completion_reward=value,
            beta=0.0,
            max_steps=1,
        ),
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd"]}),
    )
    trainer.train()
    eos = set(trainer.eos_token_ids)
    truncated = [ids[-1] not in eos for batch_ids, _ in seen for ids in batch_ids]
    rewards = [r for _, rs in seen for r in rs]
    assert any(truncated)  # the check below is not vacuous
    expected = [(0.0 if value == 0.0 and t else 1.0) for t in truncated]
    assert rewards == expected
