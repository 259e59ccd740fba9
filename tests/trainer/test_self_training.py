"""RestEM and DPO+ data (mcadvantage.trainer.self_training): hand-computed filtering and pairing, sampling and grading
through the Sampler protocol, and one training round of each through TRL's own trainers on a tiny offline model."""

from __future__ import annotations

import pytest

from mcadvantage.testing import FakeSampler, OutcomeReward, build_char_tokenizer
from mcadvantage.trainer.self_training import (
    GradedPrompt,
    preference_pairs,
    restem_examples,
    sample_and_grade,
)


def _graded():
    return [
        GradedPrompt("p1", ["a", "b", "a", "c", "d"], [1.0, 0.0, 1.0, 1.0, 0.0]),
        GradedPrompt("p2", ["x", "y"], [0.0, 0.0]),  # nothing correct
        GradedPrompt("p3", ["z", "z"], [1.0, 1.0]),  # nothing incorrect
    ]


def test_restem_keeps_correct_responses_in_order():
    assert restem_examples(_graded()) == [
        {"prompt": "p1", "completion": "a"},
        {"prompt": "p1", "completion": "c"},
        {"prompt": "p3", "completion": "z"},
    ]
    rows = restem_examples(_graded(), deduplicate=False)
    assert [r["completion"] for r in rows] == ["a", "a", "c", "z", "z"]
    assert [r["completion"] for r in restem_examples(_graded(), max_per_prompt=1)] == ["a", "z"]
    # A partial-credit reward counts as correct only at or above the threshold.
    partial = [GradedPrompt("q", ["s", "t"], [0.5, 0.4])]
    assert restem_examples(partial, correct_threshold=0.5) == [{"prompt": "q", "completion": "s"}]


def test_preference_pairs_pair_correct_with_incorrect_of_the_same_prompt():
    pairs = preference_pairs(_graded(), pairs_per_prompt=100)
    # p1: distinct correct {a, c} x distinct incorrect {b, d} = 4 pairs; p2 and p3 give none.
    assert sorted((p["chosen"], p["rejected"]) for p in pairs) == [
        ("a", "b"),
        ("a", "d"),
        ("c", "b"),
        ("c", "d"),
    ]
    assert {p["prompt"] for p in pairs} == {"p1"}
    two = preference_pairs(_graded(), pairs_per_prompt=2, seed=3)
    assert len(two) == 2 and len({(p["chosen"], p["rejected"]) for p in two}) == 2  # without replacement
    assert two == preference_pairs(_graded(), pairs_per_prompt=2, seed=3)  # deterministic in the seed


def test_preference_pairs_are_uniform_over_all_pairs():
    """Each of the 4 candidate pairs of p1 is drawn with probability 1/4 when one pair is kept: over 4000 seeds
    every count is within 4 standard deviations (sd = sqrt(4000 * 1/4 * 3/4) = 27) of 1000."""
    counts: dict[tuple[str, str], int] = {}
    for seed in range(4000):
        (p,) = preference_pairs(_graded()[:1], pairs_per_prompt=1, seed=seed)
        counts[(p["chosen"], p["rejected"])] = counts.get((p["chosen"], p["rejected"]), 0) + 1
    assert len(counts) == 4
    assert all(abs(c - 1000) < 4 * 27.4 for c in counts.values()), counts


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: restem_examples(_graded(), correct_threshold=0.0),
            "correct_threshold must be in \\(0, 1\\]",
        ),
        (lambda: restem_examples(_graded(), max_per_prompt=0), "max_per_prompt must be >= 1"),
        (lambda: preference_pairs(_graded(), pairs_per_prompt=0), "pairs_per_prompt must be >= 1"),
        (lambda: GradedPrompt("p", ["a"], []), "1 completions but 0 rewards"),
    ],
)
def test_bad_arguments_name_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_sample_and_grade_through_the_sampler_protocol():
    tok = build_char_tokenizer()
    y, n = tok.convert_tokens_to_ids("Y"), tok.convert_tokens_to_ids("N")
    # Prompts ending in "1" always succeed, prompts ending in "0" never do.
    sampler = FakeSampler(
        lambda prefix: float(prefix[-1] == tok.convert_tokens_to_ids("1")),
        success_token_id=y,
        failure_token_id=n,
        eos_token_id=tok.eos_token_id,
    )
    reward = OutcomeReward("Y")
    graded = sample_and_grade(
        sampler,
        tok,
        [{"prompt": "q1", "answer": "7"}, {"prompt": "q0", "answer": "8"}],
        reward,
        num_samples=3,
        max_new_tokens=4,
    )
    assert [g.prompt for g in graded] == ["q1", "q0"]
    assert graded[0].completions == ["Y"] * 3 and graded[0].rewards == [1.0] * 3
    assert graded[1].completions == ["N"] * 3 and graded[1].rewards == [0.0] * 3
    assert graded[0].extra == {"answer": "7"}
    # The dataset columns reach the reward function as TRL passes them: one value per completion.
    assert reward.calls[0]["answer"] == ["7", "7", "7"]
    assert [len(r.prefix_ids) for r in sampler.calls[0]] == [2, 2] and sampler.calls[0][0].n == 3
    with pytest.raises(ValueError, match="row 0 needs a text 'prompt' column"):
        sample_and_grade(sampler, tok, [{"question": "q"}], reward, num_samples=1, max_new_tokens=2)


@pytest.fixture
def tiny(tmp_path):
    from mcadvantage.testing import build_tiny_llama

    tok = build_char_tokenizer(chat_template=False)
    model = build_tiny_llama(
        tok, hidden_size=32, num_layers=1, num_heads=1, head_dim=32, intermediate_size=64, seed=0
    )
    path = tmp_path / "tiny"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok


@pytest.mark.slow
def test_one_restem_round_with_trl_sft_trainer(tiny, tmp_path):
    """A RestEM round: the correct responses become an SFT dataset that trl.SFTTrainer trains on (loss on the
    completion only), and the loss falls."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    path, tok = tiny
    graded = [GradedPrompt("Start with 3. Add 1.\n", ["3+1=4\n#### 4", "#### 3"], [1.0, 0.0])] * 4
    rows = restem_examples(graded, deduplicate=False)
    assert len(rows) == 4
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=8,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        completion_only_loss=True,
    )
    trainer = SFTTrainer(
        model=str(path), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_one_dpo_plus_round_with_trl_dpo_trainer(tiny, tmp_path):
    """A DPO+ round: correct/incorrect pairs through trl.DPOTrainer with the NLL term on the chosen response
    (loss_type ["sigmoid", "sft"]); the chosen response's margin over the rejected one grows."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    path, tok = tiny
    graded = [GradedPrompt("Start with 3. Add 1.\n", ["3+1=4\n#### 4", "3+1=5\n#### 5"], [1.0, 0.0])]
    rows = preference_pairs(graded, pairs_per_prompt=4) * 4
    args = DPOConfig(
        output_dir=str(tmp_path / "dpo"),
        max_steps=8,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        beta=0.3,
        loss_type=["sigmoid", "sft"],
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    trainer = DPOTrainer(
        model=str(path), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    trainer.train()
    margins = [log["rewards/margins"] for log in trainer.state.log_history if "rewards/margins" in log]
    assert margins[-1] > margins[0]
