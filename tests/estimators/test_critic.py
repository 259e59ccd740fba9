"""PPO's learned critic (``advantage_estimator="gae"``): its advantages, that it learns, checkpoints, LoRA, and a
2-process run that matches one process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from _helpers import free_port, tiny_config  # noqa: E402

from mcadvantage.estimators import AdvantageBatch, CriticEstimator, EstimatorContext  # noqa: E402
from mcadvantage.testing import OutcomeReward  # noqa: E402

SCRIPT = Path(__file__).with_name("_critic_distributed_script.py")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def toy_batch(tok, mode="train") -> AdvantageBatch:
    """8 responses to "Q:": "a..." (reward 1) or "b..." (reward 0), each 4 tokens + EOS. True values: V(Q:) = 0.5,
    and 1 or 0 once the first token is written."""
    texts = ["aaaY", "abaY", "aabY", "abbY", "bbbN", "babN", "bbaN", "baaN"]
    completions = [ids(tok, t) + [tok.eos_token_id] for t in texts]
    rewards = torch.tensor([[1.0] if t.startswith("a") else [0.0] for t in texts])
    return AdvantageBatch(
        prompt_ids=[ids(tok, "Q:")] * 8,
        completion_ids=completions,
        completion_mask=torch.ones(8, 5, dtype=torch.long),
        rewards_per_func=rewards,
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, 8),
        group_size=8,
        prompts=["Q:"] * 8,
        mode=mode,
    )


def context(tok, policy) -> EstimatorContext:
    return EstimatorContext.single_process(
        None, [OutcomeReward("Y")], tok, policy_model=policy, segmenter="newline"
    )


def test_advantages_are_reward_minus_the_critics_values(tok, policy):
    critic = CriticEstimator(learning_rate=1e-3, minibatch_size=4)
    batch = toy_batch(tok)
    out = critic.estimate(batch, context(tok, policy))
    # gamma = lambda = 1: A_t = R - V(s_t), with V the critic's values before this batch's update.
    critic2 = CriticEstimator(learning_rate=1e-3, minibatch_size=4)
    critic2.ensure_value_model(context(tok, policy))
    values = critic2.token_values(batch.prompt_ids, batch.completion_ids, 5, grad=False)
    expected = batch.rewards.unsqueeze(1) - values
    torch.testing.assert_close(out.advantages, expected, rtol=1e-5, atol=1e-5)
    assert out.token_mask.all() and "value_loss" in out.metrics
    # Step values for the diagnostics: one step per line here, so [V(S_0), R].
    assert critic.last_rows == list(range(8)) and all(len(v) == 2 for v in critic.last_values)


def test_the_value_head_learns_toward_the_true_values(tok, policy):
    critic = CriticEstimator(learning_rate=3e-3, minibatch_size=4, epochs=2, seed=0)
    ctx = context(tok, policy)
    batch = toy_batch(tok)
    states = [ids(tok, "a"), ids(tok, "b"), []]
    truth = [1.0, 0.0, 0.5]
    prompt = [ids(tok, "Q:")] * 3

    def mae() -> float:
        return sum(abs(v - t) for v, t in zip(critic.predict_values(prompt, states), truth, strict=True)) / 3

    losses = [critic.estimate(batch, ctx).metrics["value_loss"]]
    before = mae()
    for _ in range(25):
        losses.append(critic.estimate(batch, ctx).metrics["value_loss"])
    # The value loss falls by far more than its noise (a fixed batch: no sampling noise at all) and the values of
    # the states that decide the outcome approach their Monte Carlo truth (1 after "a", 0 after "b").
    assert losses[-1] < 0.3 * losses[0], losses
    after = mae()
    assert after < 0.5 * before and after < 0.2, (before, after)


def test_fresh_metrics_are_measured_before_the_update_on_that_batch(tok, policy):
    ctx = context(tok, policy)
    critic = CriticEstimator(learning_rate=1e-2, minibatch_size=4, seed=0)
    batch = toy_batch(tok)
    rewards = batch.rewards.unsqueeze(1).expand(8, 5)
    mask = torch.ones(8, 5, dtype=torch.bool)

    def expected(values: torch.Tensor) -> tuple[float, float]:
        error = (rewards - values).double()
        return float(1 - error.var() / rewards.double().var()), float((error**2).mean())

    critic.ensure_value_model(ctx)
    for call in range(3):
        before = critic.token_values(batch.prompt_ids, batch.completion_ids, 5, grad=False).cpu()
        out = critic.estimate(batch, ctx).metrics
        ev, mse = expected(before)
        # The values the metrics score are those before this batch's update (the update changes them: below).
        assert out["explained_variance_fresh"] == pytest.approx(ev, abs=1e-5)
        assert out["value_error_fresh"] == pytest.approx(mse, abs=1e-6)
        assert out["explained_variance"] == pytest.approx(ev, abs=1e-5)  # the old name: the same number
        after = critic.token_values(batch.prompt_ids, batch.completion_ids, 5, grad=False).cpu()
        assert not torch.allclose(before, after)
        # The constant predictor is the mean reward of the earlier training batches (none before the first).
        if call == 0:
            assert math.isnan(out["value_error_constant"])
        else:
            assert out["value_error_constant"] == pytest.approx(float(((rewards - 0.5) ** 2).mean()))
    assert mask.all()
    # Evaluation batches are measured but do not count toward the constant predictor's mean.
    critic.estimate(toy_batch(tok, mode="eval"), ctx)
    assert critic.state_dict()["reward_count"] == 24 and critic.state_dict()["reward_sum"] == 12.0


def test_warmup_holds_the_policy_for_its_steps_only():
    critic = CriticEstimator(warmup_steps=2)
    assert [critic.updates_policy(step) for step in range(4)] == [False, False, True, True]
    assert all(CriticEstimator().updates_policy(step) for step in range(3))
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        CriticEstimator(warmup_steps=-1)


def test_eval_batches_do_not_train_the_critic(tok, policy):
    critic = CriticEstimator(learning_rate=1e-2, minibatch_size=4)
    ctx = context(tok, policy)
    critic.estimate(toy_batch(tok, mode="eval"), ctx)
    before = [p.detach().clone() for p in critic.value_model.parameters()]
    out = critic.estimate(toy_batch(tok, mode="eval"), ctx)
    assert "value_loss" not in out.metrics
    assert all(torch.equal(a, b) for a, b in zip(before, critic.value_model.parameters(), strict=True))


def test_state_dict_round_trip_is_deferred_until_the_critic_exists(tok, policy):
    ctx = context(tok, policy)
    trained = CriticEstimator(learning_rate=1e-2, minibatch_size=4)
    trained.estimate(toy_batch(tok), ctx)
    state = trained.state_dict()
    fresh = CriticEstimator(learning_rate=1e-2, minibatch_size=4)
    fresh.load_state_dict(state)  # no critic yet: kept until the first batch builds it
    assert fresh.value_model is None
    fresh.ensure_value_model(ctx)
    for a, b in zip(trained.value_model.parameters(), fresh.value_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh.updates == trained.updates == 1


def test_missing_policy_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="no policy_model"):
        CriticEstimator().estimate(
            toy_batch(tok), EstimatorContext.single_process(None, [OutcomeReward("Y")], tok)
        )


def test_config_is_validated_and_reaches_the_estimator(tmp_path):
    from mcadvantage import VinePPOConfig

    with pytest.raises(ValueError, match="scale_rewards='group'"):
        VinePPOConfig(
            output_dir=str(tmp_path), advantage_estimator="gae", scale_rewards="group", report_to="none"
        )
    with pytest.raises(ValueError, match="gae_lambda=1.5"):
        VinePPOConfig(output_dir=str(tmp_path), advantage_estimator="gae", gae_lambda=1.5, report_to="none")
    cfg = VinePPOConfig(
        output_dir=str(tmp_path),
        advantage_estimator="gae",
        learning_rate=3e-6,
        num_iterations=2,
        report_to="none",
    )
    est = CriticEstimator.from_config(cfg)
    assert (est.gamma, est.lam, est.value_clip, est.learning_rate, est.epochs) == (1.0, 1.0, 0.2, 3e-6, 2)
    assert est.warmup_steps == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"critic_warmup_steps": -1}, "critic_warmup_steps=-1 is invalid: it must be an integer >= 0"),
        ({"critic_warmup_steps": 1.5}, "critic_warmup_steps=1.5 is invalid"),
        (
            {"critic_warmup_steps": 10, "max_steps": 10},
            "critic_warmup_steps=10 leaves the policy no step of max_steps=10",
        ),
    ],
)
def test_critic_warmup_setting_is_validated(tmp_path, settings, message):
    from mcadvantage import VinePPOConfig

    with pytest.raises(ValueError, match=message):
        VinePPOConfig(output_dir=str(tmp_path), advantage_estimator="gae", report_to="none", **settings)


def test_critic_warmup_setting_reaches_the_estimator(tmp_path):
    from mcadvantage import VinePPOConfig

    cfg = VinePPOConfig(
        output_dir=str(tmp_path),
        advantage_estimator="gae",
        critic_warmup_steps=5,
        max_steps=20,
        report_to="none",
    )
    assert CriticEstimator.from_config(cfg).warmup_steps == 5


# ----------------------------------------------------------------------------- in the trainer (slow)


def _trainer_args(tmp_path, **overrides):
    settings = dict(
        max_completion_length=12,
        advantage_estimator="gae",
        critic_learning_rate=1e-3,
        beta=0.0,
        max_steps=2,
        num_iterations=1,
        logging_steps=1,
    )
    return tiny_config(tmp_path / "out", **(settings | overrides))


def _vowels(completions, **kwargs):
    text = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in text]


def _data():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{a}+{a}=" for a in range(8)]})


@pytest.mark.slow
def test_trainer_saves_and_resumes_the_critic(tiny_model_dir, tok, tmp_path):
    from mcadvantage import VinePPOTrainer

    args = _trainer_args(tmp_path, save_strategy="steps", save_steps=1)
    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=_vowels,
        args=args,
        train_dataset=_data(),
        processing_class=tok,
    )
    trainer.train()
    logged = [e for e in trainer.state.log_history if "critic/value_loss" in e]
    assert len(logged) == 2 and all(e["critic/value_loss"] >= 0 for e in logged)
    saved = tmp_path / "out" / "checkpoint-1" / VinePPOTrainer.ESTIMATOR_STATE_FILE
    assert saved.exists()
    state = torch.load(saved, weights_only=True)
    assert state["updates"] == 1

    resumed = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=_vowels,
        args=_trainer_args(tmp_path, max_steps=2),
        train_dataset=_data(),
        processing_class=tok,
    )
    loaded: list[dict] = []
    original = resumed.advantage_estimator.load_state_dict
    resumed.advantage_estimator.load_state_dict = lambda s: (loaded.append(s), original(s))[1]
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    assert loaded and loaded[0]["updates"] == 1
    # Resumed at step 1, it trained once more on top of the restored critic.
    assert resumed.advantage_estimator.updates == 2


def test_trainer_warmup_trains_the_critic_and_leaves_the_policy_untouched(tiny_model_dir, tok, tmp_path):
    from transformers import TrainerCallback

    from mcadvantage import VinePPOTrainer

    snapshots: list[dict] = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            critic = trainer.advantage_estimator
            snapshots.append(
                {
                    "policy": [p.detach().clone() for p in model.parameters()],
                    "policy_optimizer_state": len(optimizer.state),
                    "critic_updates": critic.updates,
                    "critic_optimizer_state": len(critic.optimizer.state),
                }
            )

    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=_vowels,
        # A large policy learning rate: any step it took would show.
        args=_trainer_args(
            tmp_path, critic_warmup_steps=1, max_steps=2, learning_rate=1e-2, max_completion_length=6
        ),
        train_dataset=_data(),
        processing_class=tok,
        callbacks=[Snapshot()],
    )
    start = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    warm, moved = snapshots
    # The warm-up step: the critic trained on its batch (an AdamW step: its optimizer has state), the policy kept
    # every weight and its optimizer has no state (no moments, no step count: its first real step is a first step).
    assert warm["critic_updates"] == 1 and warm["critic_optimizer_state"] > 0
    assert all(torch.equal(a, b) for a, b in zip(start, warm["policy"], strict=True))
    assert warm["policy_optimizer_state"] == 0
    # The step after the warm-up trains both.
    assert moved["critic_updates"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(start, moved["policy"], strict=True))
    assert moved["policy_optimizer_state"] > 0


@pytest.mark.slow
def test_trainer_with_lora_policy(tiny_model_dir, tok, tmp_path):
    peft = pytest.importorskip("peft")
    from mcadvantage import VinePPOTrainer

    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=_vowels,
        args=_trainer_args(tmp_path, learning_rate=1e-2),
        train_dataset=_data(),
        processing_class=tok,
        peft_config=lora,
    )
    trainer.train()
    critic = trainer.advantage_estimator.value_model
    # The critic is a plain model (adapters merged into its copy), separate from the LoRA policy.
    assert not any("lora" in n for n, _ in critic.named_parameters())
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)


@pytest.mark.slow
def test_two_processes_match_one_process(tiny_model_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    one = tmp_path / "one.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(tiny_model_dir), str(one)], env=env, check=True, capture_output=True
    )
    two = tmp_path / "two.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(SCRIPT),
            str(tiny_model_dir),
            str(two),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    # Same critic after two training batches, whether one process saw all 8 responses or two saw 4 each.
    assert len(a["values"]) == len(b["values"]) == 3
    for x, y in zip(a["values"], b["values"], strict=True):
        assert x == pytest.approx(y, abs=1e-5)
    flat_a = [x for row in a["advantages"] for x in row]
    flat_b = [x for row in b["advantages"] for x in row]
    assert flat_a == pytest.approx(flat_b, abs=1e-5)
    # ... and the critic moved: the second batch's advantages are not the first's (R - V with the initial head).
    assert a["moved"] > 1e-3
