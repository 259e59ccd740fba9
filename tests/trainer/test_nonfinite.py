"""Issue 18 finding 1: no input may destroy the model.

A reward function that returned ``inf`` for some completions used to turn all weights of the policy NaN in one
``"vineppo"`` step, silently (the logged loss was 0.0). The rule now (``mcadvantage.rewards.errors``):

- ``inf`` / ``-inf`` from a reward function or a reward model, for a training response or a Monte Carlo rollout:
  :class:`~mcadvantage.RewardFunctionError` naming the function and the row, raised before any optimizer step
  (the weights are untouched);
- NaN (or None): TRL's "unscorable": the response gets advantage 0, an unscorable rollout counts 0, training
  goes on with finite weights;
- a non-finite advantage, loss or gradient from anywhere else: ``FloatingPointError`` before the optimizer step.

Every estimator is run (``vineppo`` with each cheaper option and the step budget, ``hybrid``, ``grpo``, ``rloo``,
``gae``, ``tree``), with each bad value, from a reward function and (except the step budget and ``hybrid``) from a reward
model, on the responses and (for the estimators that sample) on the rollouts. On main before the fix, the ``inf``
cases of ``vineppo`` ended with every weight non-finite.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from _helpers import settings_it_reads, tiny_config  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from mcadvantage import RewardFunctionError, VinePPOConfig, VinePPOTrainer  # noqa: E402
from mcadvantage.rewards.errors import call_reward_func  # noqa: E402

ESTIMATORS = {
    "vineppo": dict(advantage_estimator="vineppo"),
    "vineppo_reuse": dict(advantage_estimator="vineppo", mc_reuse_samples=True),
    "vineppo_variance": dict(advantage_estimator="vineppo", mc_allocation="variance", num_mc_rollouts=2),
    # The step budget: 4-token steps merged to >= 6 tokens, then states spread over a cap of 2 per response.
    "vineppo_step_budget": dict(
        advantage_estimator="vineppo",
        mc_min_step_tokens=6,
        mc_max_estimated_steps=2,
        mc_steps_after_cap="spread",
    ),
    # GRPO plus Monte Carlo credit for degenerate groups: a budget every response of the group fits.
    "hybrid": dict(advantage_estimator="hybrid", hybrid_budget=10.0),
    "grpo": dict(advantage_estimator="grpo"),
    "rloo": dict(advantage_estimator="rloo"),
    "gae": dict(advantage_estimator="gae"),
    # Groups of 4 drawn as 2 x 2 trees branching at token 4: no rollouts, the leaves are the responses.
    "tree": dict(advantage_estimator="tree", tree_branching=[2, 2], tree_depths=[0, 4]),
}
SAMPLING = ("vineppo", "vineppo_reuse", "vineppo_variance", "vineppo_step_budget", "hybrid")
#: Run with a reward function only: they differ from "vineppo" in which states are sampled, not in how a reward
#: model grades (that path is covered by the others).
FUNCTION_ONLY = ("vineppo_step_budget", "hybrid")
#: The hybrid samples only for degenerate groups (all rewards equal): its training responses all score 0.
DEGENERATE = ("hybrid",)
BAD_VALUES = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def chunk4(text: str) -> list[str]:
    """Steps of 4 characters: several states per short response (module level, so picklable)."""
    return [text[i : i + 4] for i in range(0, len(text), 4)] or [text]


class PhasedReward:
    """A reward function that returns ``bad`` on row 0 of the calls of one phase: the first call of the step grades
    the training responses (TRL's call), every later one Monte Carlo rollouts (the estimator's calls). With
    ``degenerate``, every training response otherwise scores 0 (one degenerate group); rollouts always score by
    their share of vowels."""

    def __init__(self, bad: float, phase: str, degenerate: bool = False) -> None:
        self.bad, self.phase, self.degenerate, self.calls = bad, phase, degenerate, 0
        self.__name__ = "phased_reward"

    def __call__(self, prompts, completions, **kwargs):
        self.calls += 1
        phase = "responses" if self.calls == 1 else "rollouts"
        rewards = [sum(ch in "aeiou" for ch in _text(c)) / max(len(_text(c)), 1) for c in completions]
        if phase == "responses" and self.degenerate:
            rewards = [0.0] * len(completions)
        if phase == self.phase:
            rewards[0] = self.bad
        return rewards


def _config(tmp_path, **overrides) -> VinePPOConfig:
    settings = dict(
        max_completion_length=12,
        num_mc_rollouts=2,
        step_segmenter=chunk4,
        max_steps=1,
        learning_rate=1e-2,
        disable_tqdm=True,
    )
    settings = settings_it_reads(settings, overrides.get("advantage_estimator", "vineppo"))
    return tiny_config(tmp_path / "out", **(settings | overrides))


def _dataset() -> Dataset:
    return Dataset.from_dict(
        {"prompt": [f"{a}+{a}=" for a in range(4)], "answer": [str(2 * a) for a in range(4)]}
    )


def _phased_reward_model(path, bad: float, phase: str):
    """A real reward model whose first-row logit is ``bad`` in one phase: TRL's one forward over the responses
    comes first, the rollouts' forwards (``RewardModelScorer``) after it."""
    model = AutoModelForSequenceClassification.from_pretrained(path)
    calls = {"n": 0}

    def hook(module, args, output):
        calls["n"] += 1
        if ("responses" if calls["n"] == 1 else "rollouts") == phase:
            logits = output.logits.clone()
            logits[0, 0] = bad
            output.logits = logits
        return output

    model.register_forward_hook(hook)
    return model


def _run(tmp_path, tiny_model_dir, reward, estimator: str, reward_tokenizer=None, **trainer_kwargs):
    """A trainer on the tiny model for ``ESTIMATORS[estimator]``, and a copy of its weights before training."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=reward,
        args=_config(tmp_path, **ESTIMATORS[estimator]),
        train_dataset=_dataset(),
        processing_class=tok,
        reward_processing_classes=reward_tokenizer,
        **trainer_kwargs,
    )
    return trainer, before


def _cases():
    for estimator in ESTIMATORS:
        for phase in ("responses", "rollouts"):
            if phase == "rollouts" and estimator not in SAMPLING:
                continue
            for value in BAD_VALUES:
                for source in ("function",) if estimator in FUNCTION_ONLY else ("function", "model"):
                    yield pytest.param(
                        estimator, phase, value, source, id=f"{estimator}-{phase}-{value}-{source}"
                    )


@pytest.mark.slow
@pytest.mark.parametrize("estimator,phase,value,source", list(_cases()))
def test_bad_reward_never_reaches_the_weights(
    tmp_path, tiny_model_dir, reward_model_dir, estimator, phase, value, source
):
    bad = BAD_VALUES[value]
    if source == "function":
        reward, reward_tok, name = PhasedReward(bad, phase, estimator in DEGENERATE), None, "phased_reward"
    else:
        reward = _phased_reward_model(reward_model_dir, bad, phase)
        reward_tok, name = AutoTokenizer.from_pretrained(reward_model_dir), reward_model_dir.name
    trainer, before = _run(tmp_path, tiny_model_dir, reward, estimator, reward_tok)
    if math.isinf(bad):
        with pytest.raises(
            RewardFunctionError, match=rf"reward function '{name}' returned {bad} for row 0"
        ) as info:
            trainer.train()
        assert info.value.func_name == name and info.value.row == 0
        where = "training batch" if phase == "responses" else "Monte Carlo rollouts"
        assert where in str(info.value)
        # Nothing was stepped: every weight is exactly what it was.
        for pname, p in trainer.model.named_parameters():
            assert torch.equal(p.detach(), before[pname]), pname
    else:  # NaN: unscorable, as in TRL; training goes on and the weights stay finite
        trainer.train()
        assert trainer.state.global_step == 1
        for pname, p in trainer.model.named_parameters():
            assert torch.isfinite(p).all(), pname
        changed = any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
        assert changed  # the step was taken
        result = trainer.last_advantage_result
        assert result is not None and torch.isfinite(result.advantages).all()
        if phase == "responses":
            # The unscorable response (row 0 of the batch) has no credit: advantage 0 on every token.
            assert float(result.advantages[0].abs().sum()) == 0.0


# ----------------------------------------------------------------------------------------------------------------
# The last line of defence: nothing non-finite reaches the optimizer, whatever produced it
# ----------------------------------------------------------------------------------------------------------------


def vowels(completions, **kwargs):
    return [sum(ch in "aeiou" for ch in _text(c)) / max(len(_text(c)), 1) for c in completions]


class NaNAdvantages:
    """An estimator that returns NaN advantages (a buggy user estimator)."""

    whiten_by_default = False
    uses_rollouts = False

    @classmethod
    def from_config(cls, config):
        return cls()

    def estimate(self, batch, context):
        from mcadvantage import AdvantageResult

        advantages = torch.full(batch.completion_mask.shape, math.nan) * batch.completion_mask
        return AdvantageResult(advantages=advantages)


def test_non_finite_advantages_stop_training_before_the_loss(tmp_path, tiny_model_dir):
    trainer, before = _run(tmp_path, tiny_model_dir, vowels, "grpo", advantage_estimator=NaNAdvantages())
    with pytest.raises(
        FloatingPointError, match=r"NaNAdvantages returned non-finite advantages for local batch rows"
    ):
        trainer.train()
    assert all(torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())


@pytest.mark.parametrize("what", ["loss", "gradient"])
def test_a_non_finite_loss_or_gradient_is_never_stepped(tmp_path, tiny_model_dir, monkeypatch, what):
    """The divergence of issue 18 finding 4 (cispo at lr 0.1 ended in a sampling error on NaN weights) is now
    reported at the step that produced it, before the optimizer step."""
    trainer, before = _run(tmp_path, tiny_model_dir, vowels, "grpo")
    original = type(trainer).compute_loss

    def poisoned(self, model, inputs, *args, **kwargs):
        loss = original(self, model, inputs, *args, **kwargs)
        if what == "loss":
            return loss * math.nan
        # A finite loss whose gradient is not: sqrt at 0 has an infinite derivative.
        return loss + torch.sqrt(next(model.parameters()).sum() * 0.0)

    monkeypatch.setattr(type(trainer), "compute_loss", poisoned)
    with pytest.raises(
        FloatingPointError,
        match=r"Training diverged at global step 0: (the loss is nan|a gradient is not finite)",
    ):
        trainer.train()
    assert all(torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())


# ----------------------------------------------------------------------------------------------------------------
# RewardFunctionError in isolation
# ----------------------------------------------------------------------------------------------------------------


def test_a_reward_function_that_raises_on_one_row_is_named_with_the_row():
    def picky(prompts, completions, answer, **kwargs):
        return [1.0 / (len(c) - 3) for c in completions]  # ZeroDivisionError on a 3-character completion

    kwargs = dict(prompts=["p0", "p1", "p2"], completions=["abcd", "xyz", "abcdef"], answer=["1", "2", "3"])
    with pytest.raises(
        RewardFunctionError, match=r"'picky' raised ZeroDivisionError: .* on row 1 of the rollouts"
    ) as info:
        call_reward_func(picky, "picky", kwargs, where="rollouts")
    assert (info.value.func_name, info.value.row) == ("picky", 1)
    assert "'xyz'" in str(info.value)  # the row's completion is quoted


def test_none_and_nan_are_unscorable_and_inf_is_refused():
    assert [
        math.isnan(r)
        for r in call_reward_func(
            lambda **kw: [None, math.nan, 1.0], "f", dict(completions=["a", "b", "c"]), where="x"
        )
    ] == [True, True, False]
    with pytest.raises(RewardFunctionError, match=r"'f' returned -inf for row 2 of the x it graded"):
        call_reward_func(
            lambda **kw: [0.0, 1.0, -math.inf], "f", dict(completions=["a", "b", "c"]), where="x"
        )


def test_an_empty_training_dataset_is_refused_at_init(tmp_path, tiny_model_dir):
    """Issue 18 finding 3: an empty dataset used to train 0 steps silently."""
    empty = Dataset.from_dict({"prompt": [], "answer": []})
    with pytest.raises(ValueError, match=r"train_dataset has 0 rows"):
        VinePPOTrainer(
            model=str(tiny_model_dir), reward_funcs=vowels, args=_config(tmp_path), train_dataset=empty
        )


def test_a_reward_function_that_raises_on_one_training_row_is_named_with_the_row(tmp_path, tiny_model_dir):
    """TRL calls reward functions on the whole batch; the error names the function and the first row it fails on
    (found by calling it row by row)."""
    seen: dict[str, str] = {}

    def reward(prompts, completions, **kwargs):
        if len(completions) > 1 and "poison" not in seen:
            seen["poison"] = completions[2]  # the batch's third completion cannot be scored
        if seen.get("poison") in completions:
            raise ZeroDivisionError("cannot score this one")
        return [0.0] * len(completions)

    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=reward,
        args=_config(tmp_path, advantage_estimator="grpo"),
        train_dataset=_dataset(),
    )
    with pytest.raises(
        RewardFunctionError, match=r"'reward' raised ZeroDivisionError: cannot score this one"
    ) as info:
        trainer.train()
    assert info.value.func_name == "reward"
    assert info.value.row is not None and info.value.row <= 2  # row 2, or an earlier row with the same text
    assert f"on row {info.value.row} of the training responses" in str(info.value)
    assert repr(seen["poison"])[:20] in str(info.value)
