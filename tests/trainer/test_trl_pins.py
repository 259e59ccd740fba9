"""Pins on every TRL behaviour ``VinePPOTrainer`` relies on, so a new TRL minor fails here, by name, before it
fails (or silently trains wrong) anywhere else.

TRL's maintainers wrote (huggingface/trl PR #7331, 2026-09-22) that fine-grained advantages are not on their
roadmap and removed every in-tree user of ``(B, T)`` advantages: the ``(B, T)`` branch of
``GRPOTrainer._compute_loss`` now serves only subclasses like ours, so nothing in TRL's own tests would notice if
it went. Each pin below calls TRL's real code (on tiny tensors, or on a tiny CPU ``GRPOTrainer``) rather than
reading its source, and fails with a message naming what changed in TRL and where mcadvantage must follow (file
and function). ``docs/design.md`` ("Moving to a new TRL minor") says in which order to work through them.
"""

from __future__ import annotations

import inspect

import pytest

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from mcadvantage.trainer.trl_compat import GRPOTrainerHooks  # noqa: E402

COMPAT = "src/mcadvantage/trainer/trl_compat.py"
TRL_VERSION = trl.__version__


def trl_changed(change: str, follow: str) -> str:
    """The failure message of a pin: what TRL changed, and where mcadvantage must follow."""
    return (
        f"TRL {TRL_VERSION} changed {change}. mcadvantage must follow in {follow}; then run the steps of "
        "docs/design.md 'Moving to a new TRL minor'."
    )


# --------------------------------------------------------------------------------------------------------------
# A tiny GRPOTrainer (TRL's own class, not ours) that records what TRL calls and returns
# --------------------------------------------------------------------------------------------------------------


def vowel_share(completions, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]


class RecordingGRPO(GRPOTrainer):
    """``GRPOTrainer`` recording its ``_calculate_rewards`` and ``_generate_single_turn`` calls (the two methods
    mcadvantage wraps) without changing them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reward_calls: list[dict] = []
        self.generation_calls: list[dict] = []

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        result = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.reward_calls.append(
            dict(inputs=inputs, prompts=prompts, completion_ids=completion_ids_list, result=result)
        )
        return result

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        result = super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
        )
        self.generation_calls.append(dict(prompt_ids=prompt_ids, result=result))
        return result


@pytest.fixture(scope="module")
def grpo(tiny_model_dir, tmp_path_factory):
    torch.manual_seed(0)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("pins")),
        report_to="none",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        beta=0.0,
        save_strategy="no",
        seed=0,
    )
    return RecordingGRPO(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=vowel_share,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1=", "2+2="]}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    )


@pytest.fixture(scope="module")
def generated(grpo):
    """One real ``_generate_and_score_completions`` call (training mode) and what it logged."""
    grpo.model.train()
    logged_before = len(grpo._logs["advantages"])
    inputs = [{"prompt": "1+1="}] * 4
    output = grpo._generate_and_score_completions(inputs)
    return dict(inputs=inputs, output=output, logged_before=logged_before)


# --------------------------------------------------------------------------------------------------------------
# _compute_loss: the (B, T) branch
# --------------------------------------------------------------------------------------------------------------


def _loss_inputs(grpo, advantages: torch.Tensor) -> dict:
    """Loss inputs for 2 responses of 4 completion tokens, the second with one padded position."""
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return dict(
        prompt_ids=torch.tensor([[5, 6], [5, 6]]),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=torch.tensor([[7, 8, 9, 10], [11, 12, 13, 0]]),
        completion_mask=completion_mask,
        advantages=advantages,
        num_items_in_batch=completion_mask.sum(),
    )


def _loss(grpo, advantages: torch.Tensor) -> float:
    # Evaluation mode: the loss is normalised by num_items_in_batch alone (no gradient-accumulation factor), and
    # without old log-probabilities the PPO ratio is exactly 1, so (beta=0, loss_type="dapo") the loss is
    # -sum(advantage * mask) / tokens.
    grpo.model.eval()
    try:
        with torch.no_grad():
            return float(grpo._compute_loss(grpo.model, _loss_inputs(grpo, advantages)))
    except (
        Exception
    ) as err:  # a TRL that no longer takes (B, T) advantages may raise instead of mis-weighting
        raise AssertionError(
            trl_changed(
                f"GRPOTrainer._compute_loss: advantages of shape {tuple(advantages.shape)} now raise "
                f"{type(err).__name__}: {err}",
                f"{COMPAT} GRPOTrainerHooks._generate_and_score_completions (it hands GRPO (B, T) advantages): "
                "override _compute_loss there, or use TRL's advantage hook if one has landed",
            )
        ) from err
    finally:
        grpo.model.train()


def test_compute_loss_weights_each_token_by_its_own_advantage(grpo):
    assert grpo.loss_type == "dapo" and grpo.beta == 0.0  # what the expected values below assume
    tokens = 7
    follow = f"{COMPAT} GRPOTrainerHooks._generate_and_score_completions (it hands GRPO (B, T) advantages)"
    for row, column, counted in [(0, 0, True), (0, 3, True), (1, 2, True), (1, 3, False)]:
        one_hot = torch.zeros(2, 4)
        one_hot[row, column] = 1.0
        expected = -1.0 / tokens if counted else 0.0
        assert _loss(grpo, one_hot) == pytest.approx(expected, abs=1e-6), trl_changed(
            f"GRPOTrainer._compute_loss: (B, T) advantages no longer weight each completion token by its own "
            f"entry (advantage 1 on token ({row}, {column}) gave loss {_loss(grpo, one_hot)}, expected {expected}; "
            "TRL PR #7331 removed every in-tree user of (B, T) advantages, so this branch serves only subclasses)",
            follow
            + ": override _compute_loss there (or use TRL's advantage hook, if one has landed) so that "
            "per-token advantages reach the PPO surrogate token by token",
        )
    mixed = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, -3.0, 9.0]])
    expected = -float((mixed * _loss_inputs(grpo, mixed)["completion_mask"]).sum()) / tokens
    assert _loss(grpo, mixed) == pytest.approx(expected, abs=1e-6), trl_changed(
        "GRPOTrainer._compute_loss: the loss of (B, T) advantages is no longer -sum(advantage * mask) / tokens at "
        "ratio 1",
        follow,
    )


def test_compute_loss_still_takes_one_advantage_per_response(grpo):
    # GRPO's own (B,) advantages are unsqueezed to (B, 1) and broadcast: equal to the same value on every token.
    per_response = torch.tensor([0.7, -0.4])
    assert _loss(grpo, per_response) == pytest.approx(
        _loss(grpo, per_response[:, None].expand(2, 4)), abs=1e-6
    ), trl_changed(
        "GRPOTrainer._compute_loss's conditional unsqueeze: (B,) advantages no longer equal the same value "
        "on every token",
        f"{COMPAT} GRPOTrainerHooks._generate_and_score_completions and the 'grpo'/'rloo' estimators "
        "(src/mcadvantage/estimators/baselines.py), whose (B, T) rows must equal TRL's own advantages",
    )


# --------------------------------------------------------------------------------------------------------------
# get_off_policy_mask with (B, T) advantages (off_policy_mask_threshold)
# --------------------------------------------------------------------------------------------------------------


def _off_policy_case():
    """Two responses of 4 tokens: response 0 far off-policy (mean KL 1.0 to the sampling policy), response 1 on
    policy (KL 0); response 0's steps differ in sign, as VinePPO's do."""
    per_token_logps = torch.zeros(2, 4)
    sampling_per_token_logps = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.ones(2, 4)
    advantages = torch.tensor([[0.8, 0.8, -0.5, -0.5], [-1.0, -1.0, 0.3, 0.3]])
    return advantages, per_token_logps, sampling_per_token_logps, mask


def test_off_policy_mask_is_token_wise_with_step_advantages():
    """The decision (docs/howto/grpo-to-vineppo.md, "off_policy_mask_threshold"): with per-step advantages,
    TRL's sequence mask is kept token-wise. An off-policy response keeps its steps of non-negative advantage
    and drops those of negative advantage; an on-policy response keeps everything."""
    advantages, logps, sampling, mask = _off_policy_case()
    keep = GRPOTrainer.get_off_policy_mask(
        advantages=advantages,
        per_token_logps=logps,
        sampling_per_token_logps=sampling,
        mask=mask,
        off_policy_threshold=0.5,
    )
    expected = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert keep.shape == advantages.shape and torch.equal(keep, expected), trl_changed(
        f"GRPOTrainer.get_off_policy_mask: with (B, T) advantages it returned {keep.tolist()} (shape "
        f"{tuple(keep.shape)}) instead of the token-wise mask {expected.tolist()} (keep a token when its advantage "
        ">= 0 or its sequence's mean KL <= the threshold)",
        f"{COMPAT}: override get_off_policy_mask on GRPOTrainerHooks to keep the token-wise rule (the decision in "
        "docs/howto/grpo-to-vineppo.md), or revise that decision and this test together",
    )


def test_off_policy_mask_of_constant_rows_equals_grpo_sequence_mask():
    # The "grpo" estimator's (B, T) rows are constant: token-wise, the mask equals TRL's own (B, 1) mask broadcast.
    _, logps, sampling, mask = _off_policy_case()
    per_response = torch.tensor([[-0.2], [-0.2]])
    common = dict(
        per_token_logps=logps, sampling_per_token_logps=sampling, mask=mask, off_policy_threshold=0.5
    )
    sequence = GRPOTrainer.get_off_policy_mask(advantages=per_response, **common)
    tokens = GRPOTrainer.get_off_policy_mask(advantages=per_response.expand(2, 4), **common)
    assert sequence.shape == (2, 1) and torch.equal(tokens, sequence.expand(2, 4)), trl_changed(
        "GRPOTrainer.get_off_policy_mask: its (B, 1) result for one advantage per response no longer equals the "
        "token-wise result of the same advantage on every token",
        "src/mcadvantage/estimators/baselines.py (the 'grpo' estimator must keep equal to TRL's GRPO) and "
        f"{COMPAT} GRPOTrainerHooks",
    )


def test_compute_loss_applies_the_off_policy_mask_token_by_token(grpo, monkeypatch):
    # Threshold -1: no response is "on policy" (KL >= 0), so only the advantage's sign decides, token by token.
    monkeypatch.setattr(grpo, "off_policy_mask_threshold", -1.0)
    advantages = torch.tensor([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert _loss(grpo, advantages) == pytest.approx(-1.0 / 7, abs=1e-6), trl_changed(
        "GRPOTrainer._compute_loss with off_policy_mask_threshold: the mask no longer drops exactly the "
        "negative-advantage tokens of an off-policy response",
        f"{COMPAT}: override get_off_policy_mask on GRPOTrainerHooks (docs/howto/grpo-to-vineppo.md's decision)",
    )


# --------------------------------------------------------------------------------------------------------------
# _generate_and_score_completions: its output, _logs["advantages"], and the calls mcadvantage wraps
# --------------------------------------------------------------------------------------------------------------


def test_generate_and_score_returns_the_keys_mcadvantage_reads(generated):
    output = generated["output"]
    needed = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"}
    follow = (
        f"{COMPAT} GRPOTrainerHooks._generate_and_score_completions (it builds the AdvantageBatch from them)"
    )
    assert needed <= set(output), trl_changed(
        f"GRPOTrainer._generate_and_score_completions's output: {sorted(needed - set(output))} missing "
        f"(keys now {sorted(output)})",
        follow,
    )
    rows, width = output["completion_ids"].shape
    assert rows == 4 and output["completion_mask"].shape == (rows, width), trl_changed(
        "the completion mask's shape in _generate_and_score_completions's output", follow
    )
    assert output["prompt_mask"].shape == output["prompt_ids"].shape, trl_changed(
        "the prompt mask's shape in _generate_and_score_completions's output", follow
    )
    assert output["advantages"].shape == (rows,), trl_changed(
        f"GRPO's own advantages: shape {tuple(output['advantages'].shape)}, no longer one per local response",
        follow + " (the (B, T) advantages it writes replace output['advantages'])",
    )


def test_logs_advantages_are_extended_once_with_every_process_advantages(generated, grpo):
    logged = grpo._logs["advantages"]
    follow = (
        f"{COMPAT} GRPOTrainerHooks._replace_logged_advantages (it replaces the entries GRPO just appended)"
    )
    grown = len(logged) - generated["logged_before"]
    assert grown == 4, trl_changed(
        f'where _logs["advantages"] is filled: one call appended {grown} entries, not 4', follow
    )
    tail = list(logged)[-4:]
    assert tail == pytest.approx(generated["output"]["advantages"].tolist()), trl_changed(
        '_logs["advantages"]: its last entries are no longer the advantages of this call (all processes, in order)',
        follow,
    )
    assert callable(getattr(logged, "pop", None)) and callable(getattr(logged, "extend", None)), trl_changed(
        f'_logs["advantages"]\'s type ({type(logged).__name__}): no pop/extend', follow
    )


def test_calculate_rewards_is_called_once_with_what_mcadvantage_keeps(generated, grpo):
    follow = f"{COMPAT} GRPOTrainerHooks._calculate_rewards (it keeps GRPO's grading for the estimator)"
    assert len(grpo.reward_calls) == 1, trl_changed(
        f"how GRPOTrainer grades: _calculate_rewards was called {len(grpo.reward_calls)} times for one batch",
        follow + " and GRPOTrainerHooks._generate_and_score_completions",
    )
    call = grpo.reward_calls[0]
    completion_ids = generated["output"]["completion_ids"]
    mask = generated["output"]["completion_mask"].bool()
    assert call["inputs"] == generated["inputs"] and len(call["prompts"]) == 4, trl_changed(
        "_calculate_rewards's inputs/prompts arguments (no longer the batch's rows)", follow
    )
    unpadded = [ids[m].tolist() for ids, m in zip(completion_ids, mask, strict=True)]
    assert [list(ids) for ids in call["completion_ids"]] == unpadded, trl_changed(
        "_calculate_rewards's completion_ids_list: no longer each response's unpadded token ids (EOS included)",
        follow,
    )
    result = call["result"]
    assert isinstance(result, torch.Tensor) and result.shape == (4, 1), trl_changed(
        "_calculate_rewards's result: no longer an (all-process responses, reward functions) tensor", follow
    )


def test_generate_single_turn_returns_ids_and_logprobs(generated, grpo):
    follow = f"{COMPAT} GRPOTrainerHooks._generate_single_turn (tree draws return the same pair)"
    assert grpo.generation_calls, trl_changed("_generate_single_turn is no longer called to generate", follow)
    call = grpo.generation_calls[-1]
    result = call["result"]
    assert isinstance(result, tuple) and len(result) == 2, trl_changed(
        "_generate_single_turn's return value: no longer (completion ids, logprobs)", follow
    )
    completions, logprobs = result
    assert len(completions) == len(call["prompt_ids"]) and all(isinstance(t, int) for t in completions[0]), (
        trl_changed(
            "_generate_single_turn: no longer one list of token ids per prompt id list it is given", follow
        )
    )
    assert logprobs is None, trl_changed(
        "_generate_single_turn's logprobs without vLLM (no longer None)", follow
    )


def test_vllm_weight_sync_bookkeeping_in_generate_single_turn(grpo, monkeypatch):
    """GRPO pushes the weights into vLLM when ``state.global_step != _last_loaded_step`` and then records the
    step: ``sync_weights_if_stale`` uses the same bookkeeping so neither side pushes twice."""

    class FakeVLLM:
        syncs = 0

        def sync_weights(self):
            FakeVLLM.syncs += 1

        def generate(self, prompts, images, num_generations, profiler):
            return None, [[3, 4] for _ in prompts], [[[-0.5], [-0.25]] for _ in prompts], None

    monkeypatch.setattr(grpo, "use_vllm", True, raising=False)
    monkeypatch.setattr(grpo, "vllm_generation", FakeVLLM(), raising=False)
    monkeypatch.setattr(grpo, "_last_loaded_step", -1, raising=False)
    follow = "src/mcadvantage/trainer/trl_compat.py sync_weights_if_stale and vllm_awake"
    for _ in range(2):
        ids, logprobs = GRPOTrainer._generate_single_turn(grpo, [[5, 6]], None, None, 1)
    assert (FakeVLLM.syncs, grpo._last_loaded_step) == (1, grpo.state.global_step), trl_changed(
        "GRPOTrainer's vLLM weight-sync bookkeeping (_last_loaded_step): "
        f"{FakeVLLM.syncs} syncs for two generations at one step",
        follow,
    )
    assert (ids, logprobs) == ([[3, 4]], [[-0.5, -0.25]]), trl_changed(
        "what _generate_single_turn returns with vLLM", f"{COMPAT} GRPOTrainerHooks._generate_single_turn"
    )


def test_vllm_generation_sync_wakes_sleeping_weights(grpo):
    """``VLLMGeneration.sync_weights`` in colocate sleep mode wakes the weights and clears
    ``_llm_weights_sleeping``; ``vllm_awake`` and the CPU layerwise sync rely on both."""
    from trl.generation.vllm_generation import VLLMGeneration

    class FakeLLM:
        def __init__(self):
            self.calls = []

        def wake_up(self, tags):
            self.calls.append(("wake_up", tags))

        def reset_prefix_cache(self):
            self.calls.append(("reset_prefix_cache",))

    generation = VLLMGeneration.__new__(VLLMGeneration)  # no engine: only the bookkeeping runs
    generation.mode, generation.enable_sleep_mode, generation.accelerator = "colocate", True, grpo.accelerator
    generation.llm, generation._llm_weights_sleeping = FakeLLM(), True
    generation._iter_named_params = lambda: iter(())
    generation.sync_weights()
    follow = f"{COMPAT} install_layerwise_weight_sync and vllm_awake"
    assert generation.llm.calls[0] == ("wake_up", ["weights"]), trl_changed(
        f"VLLMGeneration.sync_weights in sleep mode (calls: {generation.llm.calls})", follow
    )
    assert generation._llm_weights_sleeping is False, trl_changed(
        "VLLMGeneration._llm_weights_sleeping bookkeeping in sync_weights", follow
    )


# --------------------------------------------------------------------------------------------------------------
# Every private method trl_compat overrides or calls, and every attribute it reads
# --------------------------------------------------------------------------------------------------------------

#: TRL method -> (its parameters mcadvantage relies on, in order; the function of trl_compat that depends on them).
METHODS = {
    "_calculate_rewards": (
        ["self", "inputs", "prompts", "completions", "completion_ids_list"],
        "GRPOTrainerHooks._calculate_rewards",
    ),
    "_generate_and_score_completions": (
        ["self", "inputs"],
        "GRPOTrainerHooks._generate_and_score_completions",
    ),
    "_generate_single_turn": (
        ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"],
        "GRPOTrainerHooks._generate_single_turn",
    ),
    "_tool_call_loop": (
        [
            "self",
            "prompts",
            "prompt_ids",
            "completion_ids",
            "completions",
            "logprobs",
            "images",
            "multimodal_fields",
        ],
        "GRPOTrainerHooks._tool_call_loop",
    ),
    "_load_optimizer_and_scheduler": (
        ["self", "checkpoint"],
        "GRPOTrainerHooks._load_optimizer_and_scheduler",
    ),
    "_save_checkpoint": (["self", "model", "trial"], "GRPOTrainerHooks._save_checkpoint"),
    "_get_output_dir": (["self", "trial"], "GRPOTrainerHooks._save_checkpoint"),
    "_tokenize_prompts": (["self", "prompts"], "GRPOTrainerHooks.tokenize_prompt_ids"),
    "_get_tool_suffix_ids": (["self", "tool_messages"], "GRPOTrainerHooks.tool_result_ids"),
    "training_step": (["self", "model", "inputs", "num_items_in_batch"], "GRPOTrainerHooks.training_step"),
    "train": (["self", "resume_from_checkpoint", "trial"], "GRPOTrainerHooks.train"),
    "get_off_policy_mask": (
        ["advantages", "per_token_logps", "sampling_per_token_logps", "mask", "off_policy_threshold"],
        "the decision pinned by test_off_policy_mask_is_token_wise_with_step_advantages",
    ),
}


def _parameter_names(function) -> list[str]:
    return [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def test_every_override_of_trl_compat_is_pinned():
    overridden = {n for n, v in vars(GRPOTrainerHooks).items() if callable(v) and hasattr(GRPOTrainer, n)}
    assert overridden <= set(METHODS), (
        f"GRPOTrainerHooks overrides {sorted(overridden - set(METHODS))} of GRPOTrainer without a pin: add the "
        "method's parameters to METHODS in tests/trainer/test_trl_pins.py"
    )


@pytest.mark.parametrize("name", sorted(METHODS))
def test_private_method_signatures(name):
    expected, ours = METHODS[name]
    trl_method = inspect.getattr_static(GRPOTrainer, name, None)
    assert trl_method is not None, trl_changed(f"GRPOTrainer: {name} was removed", f"{COMPAT} {ours}")
    trl_function = getattr(GRPOTrainer, name)
    actual = _parameter_names(trl_function)
    assert actual[: len(expected)] == expected, trl_changed(
        f"the signature of GRPOTrainer.{name}: parameters {actual}, mcadvantage calls it with {expected}",
        f"{COMPAT} {ours}",
    )
    own = vars(GRPOTrainerHooks).get(name)
    if own is not None:  # our override must accept what TRL's callers pass
        assert _parameter_names(own)[: len(expected)] == expected, (
            f"{COMPAT} {ours} drifted from TRL's {name}"
        )


def test_vllm_generation_methods_mcadvantage_calls():
    from trl.generation.vllm_generation import VLLMGeneration

    follow = f"{COMPAT} install_layerwise_weight_sync, sync_weights_if_stale and vllm_awake"
    for name in ("_iter_named_params", "sync_weights"):
        method = getattr(VLLMGeneration, name, None)
        assert callable(method) and _parameter_names(method) == ["self"], trl_changed(
            f"VLLMGeneration.{name} (missing or takes arguments now)", follow
        )
    init = _parameter_names(VLLMGeneration.__init__)
    assert {"mode", "enable_sleep_mode"} <= set(init), trl_changed(
        "VLLMGeneration's mode / enable_sleep_mode settings", follow
    )


def test_trainer_attributes_mcadvantage_reads(grpo):
    follow = f"{COMPAT} GRPOTrainerHooks (the accessor named in the message)"
    metrics = grpo._metrics
    assert set(metrics) >= {"train", "eval"}, trl_changed(
        "GRPOTrainer._metrics's modes", follow + ": log_metric_values"
    )
    metrics["train"]["pins/probe"].append(1.0)  # a new key must be appendable (a defaultdict of lists)
    assert metrics["train"].pop("pins/probe") == [1.0], trl_changed(
        "GRPOTrainer._metrics: no longer a defaultdict(list) per mode", follow + ": log_metric_values"
    )
    assert isinstance(grpo._is_vlm, bool), trl_changed(
        "GRPOTrainer._is_vlm", follow + ": is_vision_language_model"
    )
    prompt_ids, *_ = grpo._tokenize_prompts(["1+1="])
    assert [list(ids) for ids in prompt_ids] == [grpo.processing_class("1+1=")["input_ids"]], trl_changed(
        "GRPOTrainer._tokenize_prompts's result (first item: one list of token ids per prompt)",
        follow + ": tokenize_prompt_ids",
    )
    with grpo._dist.summon_full_params(grpo.model_wrapped, recurse=False):
        pass
    public = {
        "eos_token_ids": "stop_token_ids",
        "reward_func_names": "_calculate_rewards, synchronous_reward_funcs",
        "reward_funcs": "synchronous_reward_funcs",
        "reward_weights": "_generate_and_score_completions",
        "reward_processing_classes": "(VinePPOTrainer.__init__'s rollout graders)",
        "num_generations": "_generate_and_score_completions",
        "num_generations_eval": "_generate_and_score_completions",
        "use_vllm": "vllm_engine",
        "vllm_mode": "vllm_engine",
        "tools": "_generate_single_turn",
        "chat_template_kwargs": "(VinePPOTrainer.__init__'s rollout graders)",
        "off_policy_mask_threshold": "(test_compute_loss_applies_the_off_policy_mask_token_by_token)",
    }
    missing = {name: user for name, user in public.items() if not hasattr(grpo, name)}
    assert not missing, trl_changed(
        f"GRPOTrainer's attributes: {sorted(missing)} gone", f"{COMPAT} {missing}"
    )
    # GRPO counts a response as truncated when its last token is neither one of eos_token_ids nor padding
    # (mask_truncated_completions); truncated_completion_reward must count the same responses.
    assert grpo.processing_class.eos_token_id in list(grpo.eos_token_ids), trl_changed(
        "GRPOTrainer.eos_token_ids (no longer the end-of-sequence ids a response ends with)",
        f"{COMPAT} GRPOTrainerHooks.stop_token_ids",
    )
    assert isinstance(GRPOTrainer._tag_names, list) and isinstance(GRPOTrainer._name, str), trl_changed(
        "GRPOTrainer's _tag_names / _name class attributes (model-card tags)",
        f"{COMPAT} GRPOTrainerHooks._tag_names",
    )


# --------------------------------------------------------------------------------------------------------------
# Agents: tools, environments, rollout_func (what GRPOTrainerHooks passes through under "grpo"/"rloo"/"gae")
# --------------------------------------------------------------------------------------------------------------


class PinAdder:
    """A tool environment that owns its reward (TRL's environment contract: reset, public tool methods, get_reward)."""

    def reset(self, **row):
        self.total = 0
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.total = a + b
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


@pytest.fixture(scope="module")
def grpo_with_environments(tmp_path_factory):
    """TRL's GRPOTrainer with a dict of environments and no reward function (the environment owns the reward)."""
    from mcadvantage.testing import build_tiny_llama, build_tool_calling_tokenizer

    tok = build_tool_calling_tokenizer()
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("pins-env")), report_to="none", use_cpu=True, bf16=False,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=8, save_strategy="no",
    )  # fmt: skip
    return GRPOTrainer(
        model=build_tiny_llama(tok, hidden_size=64, num_heads=2, head_dim=32, max_position_embeddings=1024),
        reward_funcs=None,
        args=args,
        train_dataset=Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": "1+2?"}]], "environment": ["a"]}
        ),
        processing_class=tok,
        environment_factory={"a": PinAdder},
    )


def test_environment_attributes_mcadvantage_reads(grpo_with_environments):
    trainer = grpo_with_environments
    follow = f"{COMPAT} GRPOTrainerHooks.tokenize_prompt_ids / environment_route_column / reward_call_kwargs"
    assert trainer.environment_factories == {"a": PinAdder} and trainer._multi_environment is True, (
        trl_changed(
            "GRPOTrainer.environment_factories / _multi_environment (a dict factory, routed by rows' 'environment')",
            follow,
        )
    )
    assert trainer.environments is None and not hasattr(trainer, "_batch_environments"), trl_changed(
        "when GRPOTrainer sets environments / _batch_environments (per batch, in _generate_and_score_completions)",
        follow,
    )
    with pytest.raises(AttributeError):  # why tokenize_prompt_ids sets _batch_environments for its call
        trainer._tokenize_prompts([[{"role": "user", "content": "1+2?"}]])
    trainer._batch_environments = ["a"]
    try:
        prompt_ids, *_ = trainer._tokenize_prompts([[{"role": "user", "content": "1+2?"}]])
    finally:
        del trainer._batch_environments
    expected = trainer.processing_class.apply_chat_template(
        [{"role": "user", "content": "1+2?"}], tools=trainer._env_tools["a"], chat_template=trainer.chat_template,
        add_generation_prompt=True, tokenize=True, return_dict=True,
    )["input_ids"]  # fmt: skip
    assert [list(ids) for ids in prompt_ids] == [list(expected)], trl_changed(
        "GRPOTrainer._tokenize_prompts with environments (no longer each prompt with its environment's tools, "
        "read from _batch_environments)",
        follow,
    )
    tools_follow = (
        f"{COMPAT} GRPOTrainerHooks.episode_tools / text_tokenizer / standalone_tools / tool_result_ids"
    )
    assert [t.__name__ for t in trainer._env_tools["a"]] == ["add"] and trainer._standalone_tools == [], (
        trl_changed(
            "GRPOTrainer._env_tools / _standalone_tools (the tools per environment, the tools= given)",
            tools_follow,
        )
    )
    assert trainer._tokenizer is trainer.processing_class, trl_changed(
        "GRPOTrainer._tokenizer (the tokenizer parse_response reads)", tools_follow
    )


def test_get_reward_is_a_reward_function_of_environments(grpo_with_environments):
    trainer = grpo_with_environments
    follow = (
        f"{COMPAT} GRPOTrainerHooks.reward_call_kwargs (it passes environments=) and VinePPOTrainer's graders"
    )
    assert trainer.reward_func_names == ["PinAdder"] and len(trainer.reward_funcs) == 1, trl_changed(
        "how GRPOTrainer adds an environment's get_reward to reward_funcs (named after the class)", follow
    )
    envs = [PinAdder(), PinAdder()]
    for env, (a, b) in zip(envs, [(1, 2), (3, 4)], strict=True):
        env.reset()
        env.add(a, b)
    rewards = trainer.reward_funcs[0](prompts=["p", "p"], completions=["c", "c"], environments=envs)
    assert rewards == [3.0, 7.0], trl_changed(
        "the get_reward reward function: no longer get_reward(environments, **kw) -> one reward per environment",
        follow,
    )


def test_loss_leaves_tool_tokens_out_through_tool_mask(grpo):
    # GRPO's loss uses completion_mask * tool_mask: an advantage on a tool token (tool_mask 0) changes nothing.
    base = torch.tensor([[0.5, 0.0, 0.0, -1.0], [1.0, 1.0, -3.0, 0.0]])
    spiked = base.clone()
    spiked[0, 1:3] = 50.0
    inputs = _loss_inputs(grpo, base)
    tool_mask = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1]])

    def loss(advantages):
        grpo.model.eval()
        try:
            with torch.no_grad():
                return float(
                    grpo._compute_loss(
                        grpo.model, {**inputs, "advantages": advantages, "tool_mask": tool_mask}
                    )
                )
        finally:
            grpo.model.train()

    assert loss(spiked) == pytest.approx(loss(base), abs=1e-6), trl_changed(
        "GRPOTrainer._compute_loss: inputs['tool_mask'] no longer removes tool-result tokens from the loss",
        f"{COMPAT} GRPOTrainerHooks._generate_and_score_completions (AdvantageBatch.tool_mask) and "
        "src/mcadvantage/core/advantages.py loss_token_mask",
    )


def test_rollout_func_env_mask_becomes_the_tool_mask(tiny_model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def rollout(prompts, trainer):
        ids = tok(text=list(prompts))["input_ids"]
        return {
            "prompt_ids": ids,
            "completion_ids": [[10, 11, 12, tok.eos_token_id]] * len(prompts),
            "logprobs": None,
            "env_mask": [[1, 0, 0, 1]] * len(prompts),
        }

    args = GRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=8, save_strategy="no",
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=vowel_share, args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1+1="]}), processing_class=tok, rollout_func=rollout,
    )  # fmt: skip
    output = trainer._generate_and_score_completions([{"prompt": "1+1="}] * 2)
    assert torch.equal(output.get("tool_mask"), torch.tensor([[1, 0, 0, 1]] * 2)), trl_changed(
        "a rollout_func's env_mask: no longer output['tool_mask'] of _generate_and_score_completions",
        f"{COMPAT} GRPOTrainerHooks._generate_and_score_completions (AdvantageBatch.tool_mask)",
    )


# --------------------------------------------------------------------------------------------------------------
# The pins catch a planted change (they are not checks that cannot fail)
# --------------------------------------------------------------------------------------------------------------


def _per_response_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
    """A plausible TRL change: the sign judged on each response's mean advantage, as a (B, 1) mask."""
    kl = ((sampling_per_token_logps - per_token_logps) * mask).sum(1, keepdim=True) / mask.sum(
        1, keepdim=True
    )
    mean_advantage = (advantages * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    return ((mean_advantage >= 0) | (kl <= off_policy_threshold)).to(mask.dtype)


def test_the_off_policy_pin_fails_on_a_per_response_mask(monkeypatch):
    monkeypatch.setattr(GRPOTrainer, "get_off_policy_mask", staticmethod(_per_response_mask))
    with pytest.raises(
        AssertionError, match=r"changed GRPOTrainer\.get_off_policy_mask: .* mcadvantage must follow"
    ):
        test_off_policy_mask_is_token_wise_with_step_advantages()


def test_the_signature_pin_fails_on_a_renamed_parameter(monkeypatch):
    def renamed(self, inputs, prompts, completions, completion_ids):  # TRL renaming completion_ids_list
        raise AssertionError("never called")

    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", renamed)
    with pytest.raises(AssertionError, match=r"GRPOTrainerHooks\._calculate_rewards"):
        test_private_method_signatures("_calculate_rewards")
