"""Two-process (gloo, CPU) runs of VinePPOTrainer, launched with ``accelerate launch --multi_gpu --num_processes 2``.

On a machine without GPUs accelerate's multi-process launcher (torchrun underneath) starts CPU processes that
join a gloo process group; ``accelerate launch --cpu`` would start one process only (multi-CPU goes through
MPI there). The helper script is tests/trainer/_distributed_script.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from _helpers import free_port  # noqa: E402

SCRIPT = Path(__file__).with_name("_distributed_script.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    return env


def _run(cmd: list[str], timeout: int = 600) -> None:
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )


def _launch_two(mode: str, model_dir: Path, out: Path, *extra: str) -> None:
    _run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
            str(SCRIPT),
            mode,
            "--model-dir",
            str(model_dir),
            "--out",
            str(out),
            *extra,
        ]
    )


def test_two_processes_split_mc_work_and_match_one_process(tiny_model_dir, tmp_path):
    # Same fixed batch of 8 responses (2 prompts x 4), deterministic sampler: once in one process, once split
    # over two gloo processes.
    _run(
        [sys.executable, str(SCRIPT), "estimate", "--model-dir", str(tiny_model_dir), "--out", str(tmp_path)]
    )
    _launch_two("estimate", tiny_model_dir, tmp_path)
    one = json.loads((tmp_path / "estimate_world1.json").read_text())
    two = json.loads((tmp_path / "estimate_world2.json").read_text())
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert two["backend"] == "gloo"

    # Each rank's estimator handled only its own 4 responses: its rollout requests all extend its own prompt.
    rank0, rank1 = two["ranks"]
    assert rank0["rows"] == [0, 1, 2, 3] and rank1["rows"] == [4, 5, 6, 7]
    assert rank0["stats"]["trajectories"] == 4 and rank1["stats"]["trajectories"] == 4
    assert rank0["request_prompts"] == ["spell cat:"] and rank1["request_prompts"] == ["spell dog:"]
    # ... and together they did exactly the single process' work (no duplicated or missing state).
    (single,) = one["ranks"]
    assert single["stats"]["trajectories"] == 8
    assert rank0["stats"]["requests"] + rank1["stats"]["requests"] == single["stats"]["requests"]
    assert rank0["values"] + rank1["values"] == single["values"]

    # Whitening statistics are global, so the whitened advantages equal the single process' token for token.
    adv1 = torch.tensor(one["advantages"])
    adv2 = torch.tensor(two["advantages"])
    assert adv1.shape == adv2.shape == (8, 16)
    torch.testing.assert_close(adv2, adv1, rtol=0, atol=1e-6)
    # Sanity: the batch was really whitened (zero mean, unit unbiased std over the real tokens) and non-trivial.
    real = adv1 != 0
    assert real.sum() > 20
    assert abs(adv1[real].mean().item()) < 1e-5
    assert abs(adv1[real].std().item() - 1.0) < 1e-4


def test_main_process_estimation_for_server_mode_matches_one_process(tiny_model_dir, tmp_path):
    # vLLM server mode: only the main process can sample, so it estimates both ranks' responses and scatters
    # the estimates back; the advantages must still equal a single process'.
    _run(
        [sys.executable, str(SCRIPT), "estimate", "--model-dir", str(tiny_model_dir), "--out", str(tmp_path)]
    )
    _launch_two("estimate", tiny_model_dir, tmp_path, "--main-only")
    one = json.loads((tmp_path / "estimate_world1.json").read_text())
    two = json.loads((tmp_path / "estimate_world2_main_only.json").read_text())
    rank0, rank1 = two["ranks"]
    assert rank0["request_prompts"] == ["spell cat:", "spell dog:"] and rank1["request_prompts"] == []
    assert rank1["sampler_requests"] == 0
    # Each rank got back the estimates of its own responses, in order; the work is counted once (on rank 0).
    assert rank0["rows"] == [0, 1, 2, 3] and rank1["rows"] == [4, 5, 6, 7]
    assert rank0["values"] + rank1["values"] == one["ranks"][0]["values"]
    assert rank0["stats"]["requests"] == one["ranks"][0]["stats"]["requests"] and rank1["stats"] == {}
    torch.testing.assert_close(
        torch.tensor(two["advantages"]), torch.tensor(one["advantages"]), rtol=0, atol=1e-6
    )


def test_two_process_training_run(tiny_model_dir, tmp_path):
    _launch_two("train", tiny_model_dir, tmp_path)
    ranks = [json.loads((tmp_path / f"train_rank{r}.json").read_text()) for r in range(2)]
    for r, report in enumerate(ranks):
        assert report["rank"] == r and report["world_size"] == 2
        assert report["global_step"] == 2
        assert len(report["generations"]) == 2  # one generation batch per step (num_iterations=1)
        for gen in report["generations"]:
            # Every rank estimated all and only its own local responses.
            assert gen["local_batch"] == 4
            assert gen["estimated_rows"] == [0, 1, 2, 3]
            assert gen["trajectories"] == 4
            assert gen["rollouts"] >= 2  # at least the shared prompt state, K=2
    # Different ranks held different prompts (the batch was split, not duplicated).
    for g in range(2):
        assert ranks[0]["generations"][g]["local_prompts"] != ranks[1]["generations"][g]["local_prompts"]
    # The logged mc/rollouts metric is the sum over both ranks' estimators.
    logs = [entry for entry in ranks[0]["log_history"] if "mc/rollouts" in entry]
    assert len(logs) == 2
    for g, entry in enumerate(logs):
        assert entry["mc/rollouts"] == sum(rep["generations"][g]["rollouts"] for rep in ranks)
