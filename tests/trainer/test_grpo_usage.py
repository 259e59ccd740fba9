"""GRPO's own usage patterns, run through ``VinePPOTrainer`` / ``VinePPOConfig``, so drop-in compatibility with
``trl.GRPOTrainer`` cannot regress silently.

Modelled on how TRL's ``tests/test_grpo_trainer.py`` exercises ``GRPOTrainer`` (evaluation, streaming data, PEFT,
several PPO epochs, KL, off-policy masking, entropy options, data-loader workers, loss types, truncation masking,
GRPO's reward scaling), each pattern on a tiny offline Llama for one or two steps, each asserting what the feature
does (its metric, its mask, its loss value, which parameters moved), not only that nothing raised.

The second half is the supported/refused table of ``docs/howto/grpo-to-vineppo.md`` ("GRPO settings: supported and
refused") as tests: every GRPO setting ``VinePPOConfig`` refuses, under each advantage estimator, raises
``ValueError`` naming the field, the value and a fix; every other one is accepted.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from _helpers import settings_it_reads, tiny_config  # noqa: E402
from datasets import Dataset, IterableDataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from mcadvantage import VinePPOConfig, VinePPOTrainer  # noqa: E402

# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------

EOS_ID = 2  # mcadvantage.testing's character tokenizer: <pad>=0, <s>=1, </s>=2
MAX_LEN = 16


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def vowel_reward(completions, **kwargs):
    """Deterministic reward in [0, 1] with variance on random text: the share of vowels."""
    return [sum(ch in "aeiou" for ch in _text(c)) / max(len(_text(c)), 1) for c in completions]


def digit_reward(completions, **kwargs):
    """A second objective on another scale: the number of digits."""
    return [float(sum(ch.isdigit() for ch in _text(c))) for c in completions]


def chunk5(text: str) -> list[str]:
    """Steps of 5 characters: several steps per short random response (module level, so picklable)."""
    return [text[i : i + 5] for i in range(0, len(text), 5)] or [text]


def config(tmp_path, **overrides) -> VinePPOConfig:
    settings = dict(
        max_completion_length=MAX_LEN,
        num_mc_rollouts=2,
        step_segmenter=chunk5,
        beta=0.0,
        num_iterations=1,
        max_steps=2,
        learning_rate=1e-2,  # tiny random model: a large step makes "the parameters moved" unambiguous
        logging_steps=1,
    )
    settings = settings_it_reads(settings, overrides.get("advantage_estimator", "vineppo"))
    return tiny_config(tmp_path / "out", **(settings | overrides))


def arithmetic(n: int = 8) -> Dataset:
    return Dataset.from_dict(
        {"prompt": [f"{a}+{a}=" for a in range(n)], "answer": [str(2 * a) for a in range(n)]}
    )


class Recorder(VinePPOTrainer):
    """Records every generation batch (what the estimator produced) and every batch GRPO's loss receives."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not hasattr(self, "generations"):
            self.generations, self.loss_inputs = [], []
        self.generations.append(
            {
                "mode": "train" if self.model.training else "eval",
                "prompts": [x["prompt"] for x in inputs],
                "completion_ids": output["completion_ids"].detach().clone(),
                "completion_mask": output["completion_mask"].detach().clone(),
                "advantages": output["advantages"].detach().clone(),
                "rows": list(self.last_mc_rows),
                "estimate": self.last_mc_estimate,
            }
        )
        return output

    def _compute_loss(self, model, inputs):
        if self.model.training:
            self.loss_inputs.append(
                {
                    "step": self.state.global_step,
                    "keys": set(inputs),
                    "advantages": inputs["advantages"].detach().clone(),
                    "completion_mask": inputs["completion_mask"].detach().clone(),
                }
            )
        return super()._compute_loss(model, inputs)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def snapshot(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def changed_params(trainer, before) -> set[str]:
    return {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())}


def train_logs(trainer) -> list[dict]:
    return [e for e in trainer.state.log_history if "loss" in e]


def assert_trained(trainer, before, steps: int) -> None:
    """The steps ran, every loss is finite and every parameter moved (full fine-tuning)."""
    assert trainer.state.global_step == steps
    logs = train_logs(trainer)
    assert len(logs) == steps and all(math.isfinite(e["loss"]) for e in logs)
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert changed_params(trainer, before) == set(before)


def assert_grouped(prompts: list, group: int) -> None:
    """GRPO's layout: the responses to one prompt are consecutive, ``group`` of them."""
    assert len(prompts) % group == 0
    for start in range(0, len(prompts), group):
        assert len({str(p) for p in prompts[start : start + group]}) == 1, prompts


# --------------------------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_eval_steps_with_num_generations_eval_and_mc_on_eval(model, tok, tmp_path):
    # GRPO: eval_dataset + eval_strategy="steps" (+ num_generations_eval). With mc_estimate_on_eval the eval batches
    # get Monte Carlo advantages too, over groups of num_generations_eval responses.
    args = config(
        tmp_path,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
        num_generations_eval=2,
        mc_estimate_on_eval=True,
    )
    trainer = Recorder(
        model=model,
        reward_funcs=vowel_reward,
        args=args,
        train_dataset=arithmetic(),
        eval_dataset=arithmetic(2),
        processing_class=tok,
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 2)

    eval_logs = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert [e["step"] for e in eval_logs] == [2]
    for entry in eval_logs:
        assert math.isfinite(entry["eval_loss"])
        assert 0.0 <= entry["eval_reward"] <= 1.0
        assert entry["eval_mc/rollouts"] > 0  # the eval batches were estimated
    evals = [g for g in trainer.generations if g["mode"] == "eval"]
    assert len(evals) == 1  # one eval batch: 2 prompts x num_generations_eval=2
    for gen in evals:
        assert_grouped(gen["prompts"], 2)  # groups of num_generations_eval, not num_generations
        assert gen["rows"] == [0, 1, 2, 3]
        assert gen["advantages"].abs().sum() > 0
        # Both responses to a prompt share the estimate of the prompt state S_0.
        values = gen["estimate"].values
        assert values[0][0] == values[1][0] and values[2][0] == values[3][0]


@pytest.mark.slow
def test_eval_on_start_with_grpo_loss_type(model, tok, tmp_path):
    # TRL regression pattern: evaluation before the first optimizer step with loss_type="grpo" (which reads
    # current_gradient_accumulation_steps). Without mc_estimate_on_eval, eval advantages are 0, so with beta=0
    # the eval loss is exactly 0 (documented) while the train loss is not.
    args = config(
        tmp_path,
        loss_type="grpo",
        eval_strategy="steps",
        eval_steps=10,
        eval_on_start=True,
        per_device_eval_batch_size=4,
        max_steps=1,
    )
    trainer = Recorder(
        model=model,
        reward_funcs=vowel_reward,
        args=args,
        train_dataset=arithmetic(),
        eval_dataset=arithmetic(1),
        processing_class=tok,
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 1)
    eval_logs = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert eval_logs[0]["step"] == 0  # before any training (transformers also evaluates after the last step)
    assert all(e["eval_loss"] == 0.0 and math.isfinite(e["eval_reward"]) for e in eval_logs)
    assert not any(k.startswith("eval_mc/") for e in eval_logs for k in e)
    assert all(g["advantages"].abs().sum() == 0 for g in trainer.generations if g["mode"] == "eval")
    assert train_logs(trainer)[0]["loss"] != 0.0


# --------------------------------------------------------------------------------------------------------------
# Data: streaming datasets, data-loader workers
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_iterable_dataset_with_max_steps(model, tok, tmp_path):
    data = arithmetic().to_iterable_dataset()
    assert isinstance(data, IterableDataset)
    # GRPO forces dataloader_num_workers=0 and dispatch_batches=False for streams; the same happens here.
    args = config(tmp_path, max_steps=2, dataloader_num_workers=2)
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=data, processing_class=tok
    )
    assert trainer.args.dataloader_num_workers == 0
    assert trainer.args.accelerator_config.dispatch_batches is False
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 2)
    assert len(trainer.generations) == 2
    for gen in trainer.generations:
        assert_grouped(gen["prompts"], 4)
        assert gen["rows"] == [0, 1, 2, 3]
    # One prompt of the stream per generation batch, a different one each time.
    firsts = [g["prompts"][0] for g in trainer.generations]
    assert len(set(firsts)) == 2 and set(firsts) <= set(arithmetic()["prompt"])
    assert all(e["mc/rollouts"] > 0 for e in train_logs(trainer))


@pytest.mark.slow
def test_iterable_dataset_prompt_too_long_fails_at_its_batch(model, tok, tmp_path):
    # Sized datasets are checked at init; a stream is checked batch by batch, with the same message.
    context = model.config.max_position_embeddings
    data = Dataset.from_dict({"prompt": ["x" * (context - 4)]}).to_iterable_dataset()
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=vowel_reward,
        args=config(tmp_path, max_steps=1),
        train_dataset=data,
        processing_class=tok,
    )
    with pytest.raises(
        ValueError, match=rf"local batch row 0 has {context - 4} tokens.*max_completion_length"
    ):
        trainer.train()


@pytest.mark.slow
def test_dataloader_workers(model, tok, tmp_path):
    args = config(tmp_path, dataloader_num_workers=2, max_steps=2)
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    assert trainer.args.dataloader_num_workers == 2
    assert trainer.get_train_dataloader().base_dataloader.num_workers == 2
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 2)
    # Workers must not split a prompt's group: each generation batch is 4 responses to one prompt, estimated from
    # one shared prompt state.
    for gen in trainer.generations:
        assert_grouped(gen["prompts"], 4)
        assert len({v[0] for v in gen["estimate"].values}) == 1


# --------------------------------------------------------------------------------------------------------------
# Model: PEFT, KL to a reference model
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_peft_lora_with_kl_uses_the_adapter_free_model_as_reference(model, tok, tmp_path):
    peft = pytest.importorskip("peft")
    base_names = {f"base_model.model.{n}" for n, _ in model.named_parameters()}
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = config(tmp_path, beta=0.05, max_steps=2)
    trainer = Recorder(
        model=model,
        reward_funcs=vowel_reward,
        args=args,
        train_dataset=arithmetic(),
        processing_class=tok,
        peft_config=lora,
    )
    assert isinstance(trainer.model, peft.PeftModel)
    assert trainer.ref_model is None  # GRPO's PEFT path: the reference is the base model, adapters disabled
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    changed = changed_params(trainer, before)
    lora_names = {n for n in before if "lora_" in n}
    assert lora_names and changed == lora_names  # the adapters moved (A and B), the base model did not
    assert not (changed & base_names)
    kl = [e["kl"] for e in train_logs(trainer)]
    assert kl[0] == pytest.approx(0.0, abs=1e-7)  # step 1: adapters are zero, policy == reference
    assert kl[1] > 0  # step 2: the trained adapters moved the policy away from the base model
    assert all(g["rows"] == [0, 1, 2, 3] for g in trainer.generations)


@pytest.mark.slow
def test_kl_with_reference_model_loaded_from_a_saved_dir(tiny_model_dir, tok, tmp_path):
    args = config(tmp_path, beta=0.05, max_steps=2)
    trainer = Recorder(
        model=str(tiny_model_dir),
        reward_funcs=vowel_reward,
        args=args,
        train_dataset=arithmetic(),
        processing_class=tok,
    )
    assert trainer.ref_model is not None
    ref_before = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 2)
    assert all(torch.equal(ref_before[n], p) for n, p in trainer.ref_model.named_parameters())  # frozen
    kl = [e["kl"] for e in train_logs(trainer)]
    assert kl[0] == pytest.approx(0.0, abs=1e-7)  # the policy starts as the reference
    assert kl[1] > 0


# --------------------------------------------------------------------------------------------------------------
# PPO epochs, off-policy masking, entropy
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_multiple_iterations_reuse_one_generation_batch(model, tok, tmp_path):
    # steps_per_generation=2 micro-batches x num_iterations=2 epochs: one generation batch (2 prompts x 4) feeds 4
    # optimizer steps, with old log-probs for the PPO ratio.
    args = config(tmp_path, num_iterations=2, steps_per_generation=2, max_steps=4)
    assert args.generation_batch_size == 8
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 4)
    assert len(trainer.generations) == 1 and trainer.generations[0]["rows"] == list(range(8))
    assert len(trainer.loss_inputs) == 4
    assert all("old_per_token_logps" in seen["keys"] for seen in trainer.loss_inputs)
    # Every micro-batch carries the estimator's per-token advantages, the same in both epochs.
    gen_adv = trainer.generations[0]["advantages"]
    for seen in trainer.loss_inputs:
        assert seen["advantages"].dim() == 2
        width = seen["advantages"].shape[1]
        for r in range(4):  # each row is one of the generation batch's rows, token for token
            assert any(
                torch.equal(seen["advantages"][r], gen_adv[i, :width]) and not gen_adv[i, width:].any()
                for i in range(8)
            )
    epoch1 = sorted(round(x, 6) for s in trainer.loss_inputs[:2] for x in s["advantages"].sum(1).tolist())
    epoch2 = sorted(round(x, 6) for s in trainer.loss_inputs[2:] for x in s["advantages"].sum(1).tolist())
    assert epoch1 == epoch2
    for entry in train_logs(trainer):
        for key in ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"):
            assert 0.0 <= entry[key] <= 1.0


@pytest.mark.slow
def test_off_policy_mask_acts_per_token_on_mc_advantages(model, tok, tmp_path):
    args = config(tmp_path, off_policy_mask_threshold=0.5, num_iterations=2, max_steps=2)
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    calls = []
    original = trainer.get_off_policy_mask

    def recording_mask(**kwargs):
        mask = original(**kwargs)
        calls.append((kwargs["advantages"].detach().clone(), kwargs["mask"].detach().clone(), mask.detach()))
        return mask

    trainer.get_off_policy_mask = recording_mask
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 2)
    assert len(calls) == 2
    for (advantages, completion_mask, keep), seen in zip(calls, trainer.loss_inputs, strict=True):
        # GRPO's sequence mask meets VinePPO's (B, T) advantages: it becomes a token mask.
        assert torch.equal(advantages, seen["advantages"]) and advantages.dim() == 2
        assert keep.shape == advantages.shape
        assert set(keep.unique().tolist()) <= {0.0, 1.0}
        assert (keep[advantages >= 0] == 1).all()  # tokens with non-negative credit are never dropped
        assert (advantages[completion_mask.bool()] < 0).any()  # ...and the rule had negative ones to judge


@pytest.mark.slow
def test_entropy_filter_and_entropy_bonus(model, tok, tmp_path):
    args = config(tmp_path, top_entropy_quantile=0.2, entropy_coef=0.01, max_steps=2)
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    kept = []
    original = trainer.get_high_entropy_mask

    def recording_entropy_mask(entropies, mask, threshold):
        out = original(entropies, mask, threshold)
        kept.append((out.float().sum().item(), mask.float().sum().item(), threshold))
        return out

    trainer.get_high_entropy_mask = recording_entropy_mask
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 2)
    assert len(kept) == 2
    for n_kept, n_tokens, threshold in kept:
        assert threshold == pytest.approx(0.8)
        assert 1 <= n_kept <= 0.3 * n_tokens  # about the top 20% of completion tokens train
    for entry in train_logs(trainer):
        assert entry["entropy"] > 0 and entry["entropy_coef"] == pytest.approx(0.01)
        assert math.isfinite(entry["policy_loss"])
        assert entry["mc/rollouts"] > 0


# --------------------------------------------------------------------------------------------------------------
# Loss types and truncation masking
# --------------------------------------------------------------------------------------------------------------


def _expected_on_policy_loss(loss_type: str, adv: torch.Tensor, mask: torch.Tensor) -> float:
    """GRPO's loss at ratio 1 (first step, one micro-batch, beta=0): per-token loss is -A, aggregated per type."""
    per_token = -adv.double() * mask.double()
    if loss_type in ("dapo", "bnpo"):  # over the tokens of the (single micro-) batch
        return (per_token.sum() / mask.sum()).item()
    if loss_type == "dr_grpo":  # over batch size x max_completion_length
        return (per_token.sum() / (mask.shape[0] * MAX_LEN)).item()
    if loss_type == "grpo":  # mean over responses of the per-response token mean
        return (per_token.sum(1) / mask.double().sum(1)).mean().item()
    raise AssertionError(loss_type)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "dr_grpo", "grpo"])
def test_loss_types_aggregate_the_mc_advantages(model, tok, tmp_path, loss_type):
    # Raw (unwhitened) step advantages, so the token sum differs from 0 and the four aggregations differ.
    args = config(tmp_path, loss_type=loss_type, whiten_advantages=False, max_steps=1)
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 1)
    gen = trainer.generations[0]
    # Per-step credit: the advantages vary inside a response.
    assert any(
        len(set(row[m.bool()].tolist())) > 1
        for row, m in zip(gen["advantages"], gen["completion_mask"], strict=True)
    )
    expected = _expected_on_policy_loss(loss_type, gen["advantages"], gen["completion_mask"])
    assert abs(expected) > 1e-4
    entry = train_logs(trainer)[0]
    assert entry["loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert entry["clip_ratio/region_mean"] == 0.0  # on-policy: nothing clipped


@pytest.mark.slow
def test_mask_truncated_completions_excludes_them_from_the_estimate(model, tok, tmp_path):
    # A bias on EOS (in the responses and, through generation_kwargs, in the rollouts) gives a mix of finished and
    # truncated responses; truncated ones are masked by GRPO and never estimated or credited by VinePPO.
    args = config(
        tmp_path,
        mask_truncated_completions=True,
        per_device_train_batch_size=8,
        max_steps=1,
        generation_kwargs={"sequence_bias": {(EOS_ID,): 1.0}},  # about 40% finish
    )
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 1)
    gen = trainer.generations[0]
    finished = [i for i, ids in enumerate(gen["completion_ids"]) if EOS_ID in ids.tolist()]
    truncated = [i for i in range(8) if i not in finished]
    assert finished and truncated  # the batch holds both kinds
    assert gen["rows"] == finished
    assert all(gen["completion_mask"][i].sum() == 0 for i in truncated)
    assert all(gen["advantages"][i].abs().sum() == 0 for i in truncated)
    assert all(gen["advantages"][i].abs().sum() > 0 for i in finished)


@pytest.mark.slow
def test_mask_truncated_completions_all_truncated_leaves_the_model_unchanged(model, tok, tmp_path):
    # TRL's "all masked" pattern: EOS suppressed, every response truncated -> no credit, no update.
    args = config(
        tmp_path,
        mask_truncated_completions=True,
        max_steps=1,
        generation_kwargs={"suppress_tokens": [EOS_ID]},
    )
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    before = snapshot(trainer)
    trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.generations[0]["rows"] == []
    assert train_logs(trainer)[0]["loss"] == pytest.approx(0.0, abs=1e-12)
    assert changed_params(trainer, before) == set()


# --------------------------------------------------------------------------------------------------------------
# The "grpo" and "rloo" estimators with GRPO's reward scaling options
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def grpo_own_advantages(monkeypatch):
    """Records the advantages ``trl.GRPOTrainer`` itself computed for each batch (before the estimator's replace
    them), so the "grpo" estimator can be checked against GRPO in the middle of training."""
    from trl import GRPOTrainer

    seen = []
    original = GRPOTrainer._generate_and_score_completions

    def recording(self, inputs):
        output = original(self, inputs)
        seen.append(output["advantages"].detach().clone())
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", recording)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings, funcs",
    [
        ({"scale_rewards": "batch"}, [vowel_reward]),
        ({"multi_objective_aggregation": "normalize_then_sum"}, [vowel_reward, digit_reward]),
    ],
    ids=["scale_rewards=batch", "normalize_then_sum"],
)
def test_grpo_estimator_with_grpo_reward_scaling(model, tok, tmp_path, grpo_own_advantages, settings, funcs):
    args = config(
        tmp_path,
        advantage_estimator="grpo",
        gradient_accumulation_steps=2,  # 2 micro-batches of 4 per generation batch of 2 prompts x 4
        max_steps=1,
        reward_weights=[1.0] * len(funcs),
        **settings,
    )
    trainer = Recorder(
        model=model, reward_funcs=funcs, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 1)
    assert len(grpo_own_advantages) == len(trainer.generations) == 1
    gen, theirs = trainer.generations[0], grpo_own_advantages[0]
    assert theirs.shape == (8,) and len(trainer.loss_inputs) == 2
    mask = gen["completion_mask"].bool()
    assert theirs.abs().sum() > 0
    # Every token of a response carries exactly GRPO's advantage for it; padding carries 0.
    assert torch.allclose(gen["advantages"], theirs.unsqueeze(1) * mask, atol=1e-6, rtol=0)
    logs = train_logs(trainer)
    assert 0.0 <= logs[0]["advantage/frac_groups_zero_std"] <= 1.0
    assert not any(k.startswith("mc/") for k in logs[0])  # no Monte Carlo work under "grpo"


@pytest.mark.slow
def test_rloo_estimator_leave_one_out(model, tok, tmp_path):
    rewards = []

    def recording_reward(completions, **kwargs):
        out = vowel_reward(completions)
        rewards.extend(out)
        return out

    args = config(tmp_path, advantage_estimator="rloo", per_device_train_batch_size=8, max_steps=1)
    assert args.scale_rewards == "none" and args.whiten_advantages is False
    trainer = Recorder(
        model=model,
        reward_funcs=recording_reward,
        args=args,
        train_dataset=arithmetic(),
        processing_class=tok,
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 1)
    assert len(rewards) == 8  # graded once: no Monte Carlo rollouts under "rloo"
    r = torch.tensor(rewards, dtype=torch.float64).view(2, 4)
    expected = (r - (r.sum(1, keepdim=True) - r) / 3).view(-1)
    gen = trainer.generations[0]
    mask = gen["completion_mask"].bool()
    assert expected.abs().sum() > 0
    assert torch.allclose(gen["advantages"].double(), expected.unsqueeze(1) * mask, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "estimator, settings, metric",
    [
        ("grpo", {"loss_type": "cispo"}, "cispo_clip_ratio"),
        ("grpo", {"loss_type": "sapo"}, None),
        ("grpo", {"loss_type": "luspo", "importance_sampling_level": "sequence"}, "clip_ratio/region_mean"),
        ("rloo", {"loss_type": "vespo", "importance_sampling_level": "sequence"}, "vespo/phi_seq_mean"),
    ],
    ids=["grpo-cispo", "grpo-sapo", "grpo-luspo-sequence", "rloo-vespo-sequence"],
)
def test_sequence_level_losses_train_under_the_baselines(model, tok, tmp_path, estimator, settings, metric):
    # Refused under "vineppo", accepted (and working) under the reward-only baselines.
    args = config(tmp_path, advantage_estimator=estimator, max_steps=1, **settings)
    trainer = Recorder(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    before = snapshot(trainer)
    trainer.train()
    assert_trained(trainer, before, 1)
    assert trainer.generations[0]["advantages"].abs().sum() > 0
    if metric is not None:
        assert math.isfinite(train_logs(trainer)[0][metric])


# --------------------------------------------------------------------------------------------------------------
# Supported and refused GRPO settings (docs/howto/grpo-to-vineppo.md, "GRPO settings: supported and refused")
# --------------------------------------------------------------------------------------------------------------

ESTIMATORS = ("vineppo", "grpo", "rloo")


def build(estimator: str, **settings) -> VinePPOConfig:
    kwargs = dict(
        output_dir="unused",
        report_to="none",
        use_cpu=True,
        bf16=False,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=MAX_LEN,
        advantage_estimator=estimator,
    )
    kwargs.update(settings)
    return VinePPOConfig(**kwargs)


# (estimator, settings, the field and value the message must name, the fix it must give)
REFUSED = [
    *[
        (
            "vineppo",
            {"loss_type": loss},
            f"loss_type={loss!r}",
            "Use one of ['dapo', 'bnpo', 'dr_grpo', 'grpo']",
        )
        for loss in ("cispo", "sapo", "luspo", "vespo")
    ],
    (
        "vineppo",
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        "loss_type='luspo'",
        "Use one of ['dapo', 'bnpo', 'dr_grpo', 'grpo']",
    ),
    (
        "vineppo",
        {"importance_sampling_level": "sequence"},
        "importance_sampling_level='sequence'",
        "Set importance_sampling_level='token'",
    ),
    *[
        ("vineppo", {"scale_rewards": value}, f"scale_rewards={shown!r}", "Set scale_rewards='none'")
        for value, shown in (
            ("group", "group"),
            ("batch", "batch"),
            (True, "group"),
        )  # GRPO maps True -> "group"
    ],
    (
        "vineppo",
        {"multi_objective_aggregation": "normalize_then_sum"},
        "multi_objective_aggregation='normalize_then_sum'",
        "Set multi_objective_aggregation='sum_then_normalize'",
    ),
    *[
        ("rloo", {"scale_rewards": value}, f"scale_rewards={shown!r}", "Set scale_rewards='none'")
        for value, shown in (("group", "group"), ("batch", "batch"), (True, "group"))
    ],
    (
        "rloo",
        {"multi_objective_aggregation": "normalize_then_sum"},
        "multi_objective_aggregation='normalize_then_sum'",
        "multi_objective_aggregation='sum_then_normalize'",
    ),
    (
        "vineppo",
        {"max_completion_length": None},
        "max_completion_length >= 1",
        "Set it, or use mc_rollout_budget='fixed'",
    ),
]


@pytest.mark.parametrize(
    "estimator, settings, names, fix",
    REFUSED,
    ids=[f"{e}-{'-'.join(f'{k}={v}' for k, v in s.items())}" for e, s, _, _ in REFUSED],
)
def test_refused_setting_names_field_value_and_fix(estimator, settings, names, fix):
    with pytest.raises(ValueError) as info:
        build(estimator, **settings)
    message = str(info.value)
    assert names in message
    assert fix in message
    # The fix works: the same config with the named value replaced is accepted.
    repaired = dict(settings)
    for key in settings:
        repaired[key] = {
            "loss_type": "dapo",
            "importance_sampling_level": "token",
            "scale_rewards": "none",
            "multi_objective_aggregation": "sum_then_normalize",
            "max_completion_length": MAX_LEN,
        }[key]
    build(estimator, **repaired)


# Accepted everywhere (value kept as given); resolved values are checked below.
ACCEPTED_EVERYWHERE = [{"loss_type": loss} for loss in ("dapo", "bnpo", "dr_grpo", "grpo")] + [
    {"scale_rewards": "none"},
    {"scale_rewards": False},
    {"off_policy_mask_threshold": 0.5},
    {"top_entropy_quantile": 0.2},
    {"entropy_coef": 0.01},
    {"use_adaptive_entropy": True},
    {"mask_truncated_completions": True},
    {"num_iterations": 2, "steps_per_generation": 2},
    {"epsilon_high": 0.28},
    {"delta": 1.5},
    {"beta": 0.04, "sync_ref_model": True},
    {"use_bias_correction_kl": False},
    {"num_generations_eval": 2},
]
# Accepted by the reward-only baselines only.
ACCEPTED_BY_BASELINES = {
    "grpo": [{"loss_type": loss} for loss in ("cispo", "sapo", "luspo", "vespo")]
    + [
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"importance_sampling_level": "sequence"},
        {"scale_rewards": "group"},
        {"scale_rewards": "batch"},
        {"scale_rewards": True},
        {"multi_objective_aggregation": "normalize_then_sum"},
        {"multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "batch"},
    ],
    "rloo": [{"loss_type": loss} for loss in ("cispo", "sapo", "luspo", "vespo")]
    + [
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"importance_sampling_level": "sequence"},
    ],
}
ACCEPTED = [(e, s) for e in ESTIMATORS for s in ACCEPTED_EVERYWHERE] + [
    (e, s) for e, settings in ACCEPTED_BY_BASELINES.items() for s in settings
]


@pytest.mark.parametrize(
    "estimator, settings",
    ACCEPTED,
    ids=[f"{e}-{'-'.join(f'{k}={v}' for k, v in s.items())}" for e, s in ACCEPTED],
)
def test_accepted_setting(estimator, settings):
    args = build(estimator, **settings)
    for key, value in settings.items():
        if key == "scale_rewards":
            value = {True: "group", False: "none"}.get(value, value)  # GRPO's own bool mapping
        assert getattr(args, key) == value


@pytest.mark.parametrize("estimator, resolved", [("vineppo", "none"), ("grpo", "group"), ("rloo", "none")])
def test_scale_rewards_left_unset_resolves_per_estimator(estimator, resolved):
    assert build(estimator).scale_rewards == resolved


# The Monte Carlo settings are validated by the estimator that uses them, so the baselines accept GRPO's
# max_completion_length=None.
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_baselines_accept_grpo_max_completion_length_none(estimator):
    assert build(estimator, max_completion_length=None).max_completion_length is None
