"""Reward models and async reward functions grade Monte Carlo rollouts exactly as GRPO grades responses."""

from __future__ import annotations

import asyncio
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from _helpers import tiny_config  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

from mcadvantage import VinePPOTrainer  # noqa: E402
from mcadvantage.rewards.models import RewardModelScorer, as_rollout_reward_func  # noqa: E402


def _config(tmp_path, **overrides):
    settings = dict(
        max_completion_length=8,
        num_mc_rollouts=2,
        step_segmenter="newline",
        beta=0.0,
        max_steps=1,
        save_strategy="steps",  # TrainingArguments' default
    )
    return tiny_config(tmp_path, **(settings | overrides))


def test_scorer_equals_grpos_own_reward_model_scoring(tiny_model_dir, reward_model_dir, tmp_path):
    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=str(reward_model_dir),  # a model id, loaded by GRPO
        args=_config(tmp_path),
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd"]}),
    )
    [scorer] = trainer._rollout_reward_funcs
    assert isinstance(scorer, RewardModelScorer)
    prompts = ["ab", "ab", "cd", "cd"]
    completions = ["x", "hello there", "7", "a much longer completion\\nwith two lines"]
    inputs = [{"prompt": p} for p in prompts]
    ids = [trainer.processing_class(c)["input_ids"] for c in completions]
    grpo = trainer._calculate_rewards(inputs, prompts, completions, ids)[:, 0].tolist()  # GRPO's own path
    ours = scorer(prompts=prompts, completions=completions)
    assert ours == pytest.approx(grpo, abs=1e-5)
    assert len(set(round(r, 6) for r in ours)) > 1  # distinct texts, distinct scores: not a constant


def test_scorer_batches_give_the_same_scores(reward_model_dir):
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    tok = AutoTokenizer.from_pretrained(reward_model_dir)
    prompts, completions = ["q"] * 5, ["a", "bb", "ccc", "dddd", "eeeee"]
    one = RewardModelScorer(model, tok, batch_size=1)(prompts=prompts, completions=completions)
    five = RewardModelScorer(model, tok, batch_size=5)(prompts=prompts, completions=completions)
    assert one == pytest.approx(five, abs=1e-5)  # right padding does not change a row's score


def test_conversational_texts_use_the_reward_tokenizers_chat_template(reward_model_dir):
    from trl.data_utils import apply_chat_template

    tok = AutoTokenizer.from_pretrained(reward_model_dir)
    scorer = RewardModelScorer(torch.nn.Linear(1, 1), tok)
    prompt = [{"role": "user", "content": "2+2?"}]
    completion = [{"role": "assistant", "content": "4"}]
    expected = apply_chat_template({"messages": prompt + completion}, tok)["text"]
    assert scorer.texts([prompt], [completion]) == [expected]
    assert scorer.texts(["a"], ["b"]) == ["ab"]


def test_scorer_needs_the_reward_tokenizer():
    with pytest.raises(ValueError, match="tokenizer is None"):
        RewardModelScorer(torch.nn.Linear(1, 1), None)


async def async_length(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def test_async_reward_functions_run_synchronously_also_inside_a_running_loop():
    wrapped = as_rollout_reward_func(async_length)
    assert wrapped(prompts=["p", "p"], completions=["ab", "c"]) == [2.0, 1.0]
    assert wrapped.__name__ == "async_length"

    async def inside_a_loop():  # a notebook's situation: an event loop is already running in this thread
        return wrapped(prompts=["p"], completions=["xyz"])

    assert asyncio.run(inside_a_loop()) == [3.0]

    def plain(completions, **kwargs):
        return [0.0] * len(completions)

    assert as_rollout_reward_func(plain) is plain


@pytest.mark.slow
def test_training_with_a_reward_model_and_an_async_function(tiny_model_dir, reward_model_dir, tmp_path):
    calls = []
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    tok = AutoTokenizer.from_pretrained(reward_model_dir)

    class Recording(RewardModelScorer):
        def __call__(self, prompts, completions, **kwargs):
            calls.append(len(completions))
            return super().__call__(prompts, completions, **kwargs)

    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[model, async_length],
        reward_processing_classes=[tok, None],
        args=_config(tmp_path, reward_weights=[1.0, 0.01]),
        train_dataset=Dataset.from_dict({"prompt": ["ab", "cd"]}),
    )
    trainer._rollout_reward_funcs[0] = Recording(model, tok)
    trainer.train()
    estimate = trainer.last_mc_estimate
    assert estimate is not None and estimate.stats["rollouts"] > 0
    # Every rollout (and every unsampled no-budget state) was scored by the reward model, in one call for the step.
    assert calls == [int(estimate.stats["rollouts"] + estimate.stats["unsampled_states"])]
    assert all(math.isfinite(v) for values in estimate.values for v in values)
