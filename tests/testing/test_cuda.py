"""On a CUDA device (skipped elsewhere, CI included): the library's training paths run on the GPU, not only on the CPU
every other test pins with ``use_cpu=True``.

- Every registered estimator passes its contract check (:func:`mcadvantage.testing.check_advantage_estimator`: a tiny
  offline training run, advantages on real padding, a checkpoint round trip) with the model on the GPU, in float32 and
  in bf16 mixed precision.
- ``examples/agent.py --quick`` trains its tool-calling environment on the GPU under ``"grpo"`` and under
  ``"vineppo"`` (Monte Carlo credit per turn, whose continuations replay the environment).

Run on a GPU machine with ``pytest tests/testing/test_cuda.py -m "slow or not slow"``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from mcadvantage.estimators import available_advantage_estimators  # noqa: E402
from mcadvantage.testing import check_advantage_estimator  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("name", available_advantage_estimators())
def test_every_registered_estimator_keeps_the_contract_on_the_gpu(name, bf16, tmp_path):
    torch.cuda.reset_peak_memory_stats()
    report = check_advantage_estimator(
        name, workdir=tmp_path, config_overrides={"use_cpu": False, "bf16": bf16}
    )
    assert report.estimator == name and report.batches >= 1 and report.padding_tokens > 0
    assert torch.cuda.max_memory_allocated() > 0, "the tiny run put nothing on the GPU"


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "vineppo"])
def test_the_agent_example_trains_on_the_gpu(estimator, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    command = [sys.executable, str(ROOT / "examples" / "agent.py"), "--quick", "--use_cpu", "false",
               "--estimator", estimator, "--output_dir", str(out)]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"agent example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert f"Trained 4 steps with --estimator {estimator}" in proc.stderr
    steps = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(steps) == 4 and all(math.isfinite(e["loss"]) for e in steps)
    if estimator == "vineppo":
        assert sum(e["mc/rollouts"] for e in steps) > 0  # turn credit sampled continuations on the GPU
