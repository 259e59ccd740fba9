"""VinePPOTrainer on CPU with a tiny offline Llama: init-time errors, and end-to-end training runs (slow) that
check the advantages GRPO's loss receives are the Monte Carlo estimator's, token for token."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from _helpers import settings_it_reads, tiny_config  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from mcadvantage import VinePPOConfig, VinePPOTrainer  # noqa: E402
from mcadvantage.tasks import GSM8KVerifier, MathVerifier  # noqa: E402
from mcadvantage.tasks.segmentation import segment_completion  # noqa: E402

# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def vowel_reward(completions, **kwargs):
    """Deterministic reward in [0, 1] with variance on random text: the share of vowels."""
    return [sum(ch in "aeiou" for ch in _text(c)) / max(len(_text(c)), 1) for c in completions]


def chunk5(text: str) -> list[str]:
    """Steps of 5 characters: several steps per short random response (module level, so picklable)."""
    return [text[i : i + 5] for i in range(0, len(text), 5)] or [text]


def config(tmp_path, **overrides) -> VinePPOConfig:
    settings = dict(
        max_completion_length=16,
        num_mc_rollouts=2,
        step_segmenter=chunk5,
        beta=0.0,
        max_steps=2,
        logging_steps=1,
    )
    settings = settings_it_reads(settings, overrides.get("advantage_estimator", "vineppo"))
    return tiny_config(tmp_path / "out", **(settings | overrides))


def arithmetic(n: int = 8) -> Dataset:
    return Dataset.from_dict(
        {"prompt": [f"{a}+{a}=" for a in range(n)], "answer": [str(2 * a) for a in range(n)]}
    )


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


# --------------------------------------------------------------------------------------------------------------
# Errors at init
# --------------------------------------------------------------------------------------------------------------


def test_plain_grpo_config_rejected(model, tok, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    with pytest.raises(
        TypeError, match="args is a GRPOConfig, but VinePPOTrainer needs a mcadvantage.VinePPOConfig"
    ):
        VinePPOTrainer(
            model=model,
            reward_funcs=vowel_reward,
            args=args,
            train_dataset=arithmetic(),
            processing_class=tok,
        )


@pytest.mark.parametrize("reward_funcs,why", [(None, "reward_funcs is None"), ([], "reward_funcs is empty")])
def test_missing_reward_funcs_keep_grpos_words(model, tok, tmp_path, reward_funcs, why):
    """Our check runs before the model is loaded; its message starts with GRPOTrainer's own for the same input
    (issue 53: an error TRL raises keeps TRL's words), then says what VinePPO needs."""
    from trl import GRPOConfig, GRPOTrainer

    grpo_args = GRPOConfig(output_dir=str(tmp_path / "grpo"), report_to="none", use_cpu=True, bf16=False)
    with pytest.raises(ValueError) as grpo_error:
        GRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=grpo_args,
            train_dataset=arithmetic(),
            processing_class=tok,
        )
    with pytest.raises(ValueError, match=rf"^No reward source provided\. .*\({why}\.\)") as ours:
        VinePPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=config(tmp_path),
            train_dataset=arithmetic(),
            processing_class=tok,
        )
    assert str(ours.value).startswith(str(grpo_error.value)), (str(grpo_error.value), str(ours.value))


def test_reward_funcs_are_optional_in_the_signature_as_in_grpo(model, tok, tmp_path):
    # GRPOTrainer(model=...) is valid Python; so is ours, with an error that says what is missing.
    with pytest.raises(ValueError, match=r"^No reward source provided\. .*\(reward_funcs is None\.\)"):
        VinePPOTrainer(model=model, args=config(tmp_path), train_dataset=arithmetic(), processing_class=tok)

    # With an environment, the environment may own the reward (get_reward); one that does not gets GRPO's error.
    from mcadvantage.testing import build_tool_calling_tokenizer

    class Env:
        def reset(self, **kwargs):
            return None

    with pytest.raises(
        ValueError, match="No reward source provided. Pass `reward_funcs`, or an `environment_factory`"
    ):
        VinePPOTrainer(
            model=model,
            args=config(tmp_path, advantage_estimator="grpo"),
            processing_class=build_tool_calling_tokenizer(),
            environment_factory=Env,
            train_dataset=arithmetic(),
        )


def test_tools_refused_under_an_estimator_that_cannot_continue_episodes(model, tok, tmp_path):
    """Every built-in estimator takes tools=; one of your own that samples continuations without continuing an
    episode through its tool calls (no check_agent_support) is refused before training."""
    from mcadvantage.estimators import AdvantageEstimator

    class PlainTextRollouts(AdvantageEstimator):
        uses_rollouts = True

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    with pytest.raises(
        NotImplementedError,
        match="advantage_estimator='PlainTextRollouts' does not support tools=: it samples Monte Carlo",
    ):
        VinePPOTrainer(
            model=model,
            reward_funcs=vowel_reward,
            args=config(tmp_path, advantage_estimator="grpo"),
            train_dataset=arithmetic(),
            processing_class=tok,
            tools=[add],
            advantage_estimator=PlainTextRollouts(),
        )


def test_dataset_missing_the_verifier_column(model, tok, tmp_path):
    data = Dataset.from_dict({"prompt": ["1+1="], "gold": ["2"]})
    with pytest.raises(
        ValueError, match=r"'gsm8k_verifier' needs the dataset column 'answer'.*\['gold', 'prompt'\]"
    ):
        VinePPOTrainer(
            model=model,
            reward_funcs=GSM8KVerifier(),
            args=config(tmp_path),
            train_dataset=data,
            processing_class=tok,
        )
    # The fix named in the message works: point the verifier at the column.
    trainer = VinePPOTrainer(
        model=model,
        reward_funcs=GSM8KVerifier(answer_field="gold"),
        args=config(tmp_path),
        train_dataset=data,
        processing_class=tok,
    )
    assert trainer.reward_funcs[0].answer_field == "gold"


def test_eval_dataset_missing_the_verifier_column(model, tok, tmp_path):
    with pytest.raises(
        ValueError, match=r"needs the dataset column 'answer', but eval_dataset has only \['prompt'\]"
    ):
        VinePPOTrainer(
            model=model,
            reward_funcs=GSM8KVerifier(),
            args=config(tmp_path),
            train_dataset=arithmetic(),
            eval_dataset=Dataset.from_dict({"prompt": ["1+1="]}),
            processing_class=tok,
        )


def test_math_verifier_accepts_a_solution_column(model, tok, tmp_path):
    with pytest.raises(ValueError, match=r"needs the dataset column one of 'answer', 'solution'"):
        VinePPOTrainer(
            model=model,
            reward_funcs=MathVerifier(),
            args=config(tmp_path),
            train_dataset=Dataset.from_dict({"prompt": ["x"], "reference": ["$2$"]}),
            processing_class=tok,
        )
    VinePPOTrainer(
        model=model,
        reward_funcs=MathVerifier(),
        args=config(tmp_path),
        train_dataset=Dataset.from_dict({"prompt": ["x"], "solution": ["so \\boxed{2}"]}),
        processing_class=tok,
    )


def test_dataset_without_prompt_column(model, tok, tmp_path):
    with pytest.raises(ValueError, match="train_dataset has no 'prompt' column"):
        VinePPOTrainer(
            model=model,
            reward_funcs=vowel_reward,
            args=config(tmp_path),
            train_dataset=Dataset.from_dict({"question": ["1+1="]}),
            processing_class=tok,
        )


def test_prompt_leaving_no_room_for_a_completion(model, tok, tmp_path):
    context = model.config.max_position_embeddings  # 512 for the tiny Llama
    data = Dataset.from_dict(
        {"prompt": ["1+1=", "x" * (context - 10), "2+2="]}
    )  # char tokenizer: 1 token/char
    with pytest.raises(
        ValueError,
        match=rf"train_dataset row 1 has {context - 10} tokens; with max_completion_length=16 .* context is {context}"
        r".*lower max_completion_length to at most 10",
    ):
        VinePPOTrainer(
            model=model,
            reward_funcs=vowel_reward,
            args=config(tmp_path),
            train_dataset=data,
            processing_class=tok,
        )
    # The suggested fix is accepted.
    VinePPOTrainer(
        model=model,
        reward_funcs=vowel_reward,
        args=config(tmp_path, max_completion_length=10),
        train_dataset=data,
        processing_class=tok,
    )


def test_fixed_rollout_budget_also_needs_room(model, tok, tmp_path):
    context = model.config.max_position_embeddings
    data = Dataset.from_dict({"prompt": ["x" * (context - 100)]})
    args = config(tmp_path, mc_rollout_budget="fixed", mc_fixed_rollout_budget=200)
    with pytest.raises(ValueError, match=r"with mc_fixed_rollout_budget=200 a response needs"):
        VinePPOTrainer(
            model=model, reward_funcs=vowel_reward, args=args, train_dataset=data, processing_class=tok
        )


def test_vllm_tensor_parallel_colocate_not_supported(model, tok, tmp_path):
    args = config(tmp_path, use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2)
    with pytest.raises(NotImplementedError, match="vllm_tensor_parallel_size=2 is not supported"):
        VinePPOTrainer(
            model=model,
            reward_funcs=vowel_reward,
            args=args,
            train_dataset=arithmetic(),
            processing_class=tok,
        )


# --------------------------------------------------------------------------------------------------------------
# End to end (slow)
# --------------------------------------------------------------------------------------------------------------


class RecordingTrainer(VinePPOTrainer):
    """Records every generation batch (with the estimator's output) and every ``inputs`` GRPO's loss receives."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not hasattr(self, "generations"):
            self.generations, self.loss_inputs = [], []
        self.generations.append(
            {
                "prompts": [x["prompt"] for x in inputs],
                **{
                    k: output[k].detach().clone()
                    for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
                },
                "advantages": output["advantages"].detach().clone(),
                "estimate": self.last_mc_estimate,
                "rows": list(self.last_mc_rows),
            }
        )
        return output

    def _compute_loss(self, model, inputs):
        if self.model.training:
            self.loss_inputs.append(
                {
                    "generation": len(self.generations) - 1,
                    **{
                        k: inputs[k].detach().clone()
                        for k in (
                            "prompt_ids",
                            "prompt_mask",
                            "completion_ids",
                            "completion_mask",
                            "advantages",
                        )
                    },
                }
            )
        return super()._compute_loss(model, inputs)


def _row_key(prompt_ids, prompt_mask, completion_ids, completion_mask):
    return (
        tuple(prompt_ids[prompt_mask.bool()].tolist()),
        tuple(completion_ids[completion_mask.bool()].tolist()),
    )


def _expected_advantages(gen, tok, reward_fn) -> torch.Tensor:
    """Independent re-computation from the recorded values: hand-built step -> token advantages, then plain
    token-weighted whitening (unbiased variance, eps 1e-8) over every estimated token of the generation batch."""
    est, rows = gen["estimate"], gen["rows"]
    raw = torch.zeros(gen["completion_mask"].shape, dtype=torch.float64)
    valid = torch.zeros(gen["completion_mask"].shape, dtype=torch.bool)
    for j, i in enumerate(rows):
        ids = gen["completion_ids"][i][gen["completion_mask"][i].bool()].tolist()
        values = est.values[j]
        bounds = segment_completion(chunk5, tok, ids)
        assert len(values) == len(bounds)  # V(S_0..S_{n-1}) and R
        # V(S_n) is the response's own reward, recomputed here from its text.
        text = tok.decode(ids, skip_special_tokens=True)
        prompt = gen["prompts"][i]
        completion = text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]
        assert values[-1] == pytest.approx(reward_fn(completions=[completion])[0], abs=1e-6)
        for k in range(1, len(bounds)):
            raw[i, bounds[k - 1] : bounds[k]] = values[k] - values[k - 1]
        valid[i, : len(ids)] = True
    x = raw[valid]
    mean, var = x.mean(), x.var(unbiased=True)
    return torch.where(valid, (raw - mean) / torch.sqrt(var + 1e-8), torch.zeros_like(raw)).float()


@pytest.mark.slow
def test_loss_receives_the_estimators_advantages_token_for_token(model, tok, tmp_path):
    # Gradient accumulation (2 micro-batches per generation batch, shuffled by GRPO) and two PPO epochs.
    args = config(
        tmp_path,
        gradient_accumulation_steps=2,
        num_iterations=2,
        max_steps=4,
        log_completions=True,
        num_completions_to_print=0,
    )
    trainer = RecordingTrainer(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    trainer.train()
    assert trainer.state.global_step == 4
    # steps_per_generation=2 micro-batches x num_iterations=2 epochs -> 4 loss calls per generation batch.
    assert len(trainer.generations) == 2
    assert len(trainer.loss_inputs) == 8

    checked_rows = 0
    for g, gen in enumerate(trainer.generations):
        assert gen["rows"] == list(range(8))  # every response was estimated
        expected = _expected_advantages(gen, tok, vowel_reward)
        assert expected.abs().max() > 0.1  # non-trivial credit
        # Several steps per response, and S_0 shared by the 4 responses of a prompt.
        est = gen["estimate"]
        assert sum(len(v) - 1 for v in est.values) > 8
        for a in range(0, 8, 4):
            assert len({est.values[j][0] for j in range(a, a + 4)}) == 1
        torch.testing.assert_close(gen["advantages"], expected, rtol=1e-5, atol=1e-5)
        by_key = {
            _row_key(
                gen["prompt_ids"][i],
                gen["prompt_mask"][i],
                gen["completion_ids"][i],
                gen["completion_mask"][i],
            ): i
            for i in range(8)
        }
        for seen in (s for s in trainer.loss_inputs if s["generation"] == g):
            assert seen["advantages"].dim() == 2  # per-token (B, T), not GRPO's (B,)
            for r in range(seen["advantages"].shape[0]):
                key = _row_key(
                    seen["prompt_ids"][r],
                    seen["prompt_mask"][r],
                    seen["completion_ids"][r],
                    seen["completion_mask"][r],
                )
                i = by_key[key]
                width = seen["completion_mask"].shape[1]
                torch.testing.assert_close(seen["advantages"][r], expected[i, :width], rtol=1e-5, atol=1e-5)
                assert expected[i, width:].abs().sum() == 0
                checked_rows += 1
    assert checked_rows == 2 * 4 * 4

    # mc/* metrics are logged, and the completions table holds one float per response: the mean of its
    # whitened token advantages.
    logged = [entry for entry in trainer.state.log_history if "mc/rollouts" in entry]
    assert logged and all(entry["mc/rollouts"] > 0 and entry["mc/steps_per_response"] > 1 for entry in logged)
    for key in (
        "mc/generated_tokens",
        "mc/seconds",
        "mc/dedup_ratio",
        "mc/mean_value",
        "mc/mean_abs_advantage",
    ):
        assert all(math.isfinite(entry[key]) for entry in logged)
    last = trainer.generations[-1]
    mask = last["completion_mask"].float()
    per_response = ((last["advantages"] * mask).sum(1) / mask.sum(1)).tolist()
    assert list(trainer._logs["advantages"]) == pytest.approx(per_response, abs=1e-6)
    assert list((tmp_path / "out" / "completions").glob("completions_*.parquet"))


@pytest.mark.slow
def test_free_samples_and_variance_allocation_reach_the_loss(model, tok, tmp_path):
    # The cheaper Monte Carlo options through the trainer: the loss gets the estimator's (leave-one-out) values,
    # and mc/* reports the free samples, the rollouts saved and the token budget.
    args = config(
        tmp_path,
        mc_reuse_samples=True,
        mc_allocation="variance",
        num_mc_rollouts=2,
        gradient_accumulation_steps=2,
        max_steps=2,
    )
    trainer = RecordingTrainer(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    trainer.train()
    gen = trainer.generations[0]
    assert gen["rows"] == list(range(8))
    torch.testing.assert_close(
        gen["advantages"], _expected_advantages(gen, tok, vowel_reward), rtol=1e-5, atol=1e-5
    )
    est = gen["estimate"]
    # Leave-one-out: the 4 responses to a prompt see the other 3 (plus rollouts) at S_0, so they differ in V(S_0)
    # exactly by their own rewards: V_j(S_0) = (total - R_j) / (n - 1).
    for a in range(0, 8, 4):
        n = est.sample_counts[a][0] + 1
        totals = {round(est.values[j][0] * (n - 1) + est.values[j][-1], 9) for j in range(a, a + 4)}
        assert len(totals) == 1
    logged = [entry for entry in trainer.state.log_history if "mc/free_samples" in entry]
    assert logged and logged[0]["mc/free_samples"] >= 2 * 3  # S_0 alone: 3 other responses per prompt
    assert logged[0]["mc/budget_tokens"] > 0 and "mc/rollouts_saved" in logged[0]


@pytest.mark.slow
def test_conversational_data_with_kl_reference_and_eval(tiny_model_dir, tok, tmp_path):
    seen_completion_types = []

    def chat_vowel_reward(completions, **kwargs):
        seen_completion_types.extend(type(c).__name__ for c in completions)
        return vowel_reward(completions)

    chat = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"{a}+{a}="}] for a in range(8)],
            "answer": [str(2 * a) for a in range(8)],
        }
    )
    args = config(
        tmp_path,
        beta=0.05,  # > 0: a reference model is loaded from the saved directory
        gradient_accumulation_steps=2,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
    )
    trainer = RecordingTrainer(
        model=str(tiny_model_dir),
        reward_funcs=chat_vowel_reward,
        args=args,
        train_dataset=chat,
        eval_dataset=chat.select(range(2)),
        processing_class=tok,
    )
    assert trainer.ref_model is not None
    trainer.train()
    assert trainer.state.global_step == 2
    # Responses and Monte Carlo rollouts were all graded as assistant messages.
    assert set(seen_completion_types) == {"list"}
    assert len(seen_completion_types) > 16  # responses plus rollouts
    train_logs = [e for e in trainer.state.log_history if "loss" in e]
    assert all("kl" in e and math.isfinite(e["kl"]) for e in train_logs)
    assert any(e["mc/rollouts"] > 0 for e in trainer.state.log_history if "mc/rollouts" in e)
    # Evaluation ran without Monte Carlo estimation: zero advantages, no eval mc/* metrics.
    eval_logs = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert eval_logs and not any(k.startswith("eval_mc/") for k in eval_logs[0])
    assert torch.count_nonzero(trainer.generations[-1]["advantages"]) == 0


@pytest.mark.slow
def test_peft_lora_adapter_trains(model, tok, tmp_path):
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = config(tmp_path, beta=1e-3, learning_rate=1e-2, max_steps=2, num_iterations=1)
    trainer = RecordingTrainer(
        model=model,
        reward_funcs=vowel_reward,
        args=args,
        train_dataset=arithmetic(),
        processing_class=tok,
        peft_config=lora,
    )
    assert peft.PeftModel is not None and hasattr(trainer.model, "peft_config")
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(gen["rows"] == list(range(4)) for gen in trainer.generations)
    # lora_B starts at zero; the MC advantages produced a gradient that moved it.
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


@pytest.mark.slow
def test_checkpoint_save_and_resume(tiny_model_dir, tok, tmp_path):
    from mcadvantage.tasks.gsm8k import GSM8KSegmenter

    # A segmenter instance in the config must survive checkpointing (the config is pickled).
    args = config(
        tmp_path,
        step_segmenter=GSM8KSegmenter(),
        save_strategy="steps",
        save_steps=1,
        max_steps=2,
        num_iterations=1,
    )
    trainer = VinePPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=vowel_reward,
        args=args,
        train_dataset=arithmetic(),
        processing_class=tok,
    )
    trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / "trainer_state.json").exists() and (checkpoint / "training_args.bin").exists()
    saved_args = torch.load(checkpoint / "training_args.bin", weights_only=False)
    assert isinstance(saved_args, VinePPOConfig) and isinstance(saved_args.step_segmenter, GSM8KSegmenter)

    resumed = VinePPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=vowel_reward,
        args=config(
            tmp_path, step_segmenter=GSM8KSegmenter(), save_strategy="no", max_steps=3, num_iterations=1
        ),
        train_dataset=arithmetic(),
        processing_class=tok,
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    steps = [e["step"] for e in resumed.state.log_history if "loss" in e]
    assert steps == [1, 2, 3]  # steps 1-2 restored from the checkpoint, only step 3 trained
    new_logs = [e for e in resumed.state.log_history if e.get("step") == 3 and "mc/rollouts" in e]
    assert new_logs and new_logs[0]["mc/rollouts"] > 0


class TreeRecordingTrainer(RecordingTrainer):
    """Also records the tree paths the trainer drew for each generation batch."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.generations[-1]["tree_paths"] = list(self.drawn_paths)
        return output

    def draw_group_trees(self, prompt_ids, num_generations):
        completions, self.drawn_paths = super().draw_group_trees(prompt_ids, num_generations)
        return completions, self.drawn_paths


@pytest.mark.slow
def test_tree_sampling_draws_each_group_as_a_tree_and_its_credit_reaches_the_loss(model, tok, tmp_path):
    # advantage_estimator="tree" on the transformers engine: every group of 4 is a 2 x 2 tree branching at token 4
    # (the two leaves of a branch share their first 4+ tokens), the logged sampled tokens count shared prefixes
    # once, and GRPO's loss receives the tree credit, whitened.
    from mcadvantage.core.advantages import masked_whiten
    from mcadvantage.mc.tree import tree_advantages

    args = config(
        tmp_path, advantage_estimator="tree", tree_branching=[2, 2], tree_depths=[0, 4], max_steps=2
    )
    trainer = TreeRecordingTrainer(
        model=model, reward_funcs=vowel_reward, args=args, train_dataset=arithmetic(), processing_class=tok
    )
    trainer.train()
    assert trainer.state.global_step == 2
    for gen in trainer.generations:
        paths = gen["tree_paths"]
        completions = [
            ids[mask.bool()].tolist()
            for ids, mask in zip(gen["completion_ids"], gen["completion_mask"], strict=True)
        ]
        assert len(paths) == len(completions) == 4
        for a, b in ((i, j) for i in range(4) for j in range(i + 1, 4)):
            pa, pb = paths[a], paths[b]
            if len(pa.children) > 1 and pa.children[0] == pb.children[0]:  # same branch: a shared prefix
                cut = pa.offsets[1]
                assert cut == pb.offsets[1] >= 4 and completions[a][:cut] == completions[b][:cut]
        rewards = [
            vowel_reward(completions=[tok.decode(c, skip_special_tokens=True)])[0] for c in completions
        ]
        raw, _ = tree_advantages(paths, rewards, [len(c) for c in completions])
        expected = torch.zeros(gen["completion_mask"].shape)
        for i, adv in enumerate(raw):
            expected[i, : len(adv)] = adv
        mask = gen["completion_mask"].bool()
        torch.testing.assert_close(
            gen["advantages"], masked_whiten(expected * mask, mask), rtol=1e-4, atol=1e-5
        )
    logged = [entry for entry in trainer.state.log_history if "tree/generated_tokens" in entry]
    assert len(logged) == 2
    assert all(0 < e["tree/generated_tokens"] <= e["tree/leaf_tokens"] for e in logged)
    assert any(e["tree/generated_tokens"] < e["tree/leaf_tokens"] for e in logged)  # prefixes were shared
