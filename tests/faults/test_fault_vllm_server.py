"""Faults of a vLLM server: down when the trainer starts (``vllm_mode="server"``), and SIGKILLed mid-run.

What is lost: with the server down at start, nothing (the trainer refuses to start within ``vllm_server_timeout``).
With the server killed mid-run, the unfinished optimizer step: training stops with a ``ConnectionError`` naming the
server before that step's update, and the checkpoint saved before is intact and resumes.

The mid-run case runs a real ``vllm serve`` of the tiny model on CPU (started once for the module, ~30-60 s on two
cores) and the trainer's Monte Carlo rollouts on it through :class:`~mcadvantage.samplers.VLLMServerSampler`, which
is what ``vllm_mode="server"`` samples rollouts with. The responses themselves are generated with transformers:
``vllm_mode="server"`` cannot train on a CPU-only machine, because TRL 1.16 pushes weights to the server over
NCCL, which needs CUDA (``VLLMClient.init_communicator`` raises ``NotImplementedError`` on a CPU device).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("trl")

from _fault_training import make_trainer  # noqa: E402
from _helpers import free_port  # noqa: E402
from _helpers import vllm_server as serve_vllm  # noqa: E402

pytestmark = pytest.mark.slow


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


def test_server_down_at_start_is_a_clear_error_within_the_timeout(tiny_model_dir, tmp_path, record_property):
    pytest.importorskip("vllm")
    import requests

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    # TRL's VLLMClient raises it (requests' ConnectionError, an OSError), naming the URL, the timeout and the fix.
    with pytest.raises(requests.ConnectionError, match=f"can't be reached at {url} after 3 seconds"):
        make_trainer(
            tiny_model_dir,
            tmp_path / "out",
            estimator="vineppo",
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=url,
            vllm_server_timeout=3,
        )
    seconds = time.monotonic() - start  # loading the tiny model, then 3 s of retries
    record_property("seconds", round(seconds, 2))
    assert 3 <= seconds < 3 + 20, seconds
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """A real `vllm serve` of the tiny model on loopback: (url, process). The test may kill it."""
    pytest.importorskip("vllm")
    with serve_vllm(tiny_model_dir, tmp_path_factory.mktemp("vllm-serve"), stop=_stop) as (url, proc):
        yield url, proc


def test_server_killed_mid_run_stops_training_with_a_clear_error(
    vllm_server, tiny_model_dir, tmp_path, record_property
):
    from transformers import TrainerCallback

    from mcadvantage.samplers import VLLMServerSampler
    from mcadvantage.trainer.checkpoints import verify_checkpoint

    url, proc = vllm_server
    killed_at: list[float] = []

    class KillServerAfterFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 1:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                killed_at.append(time.monotonic())

    out = tmp_path / "out"
    trainer = make_trainer(
        tiny_model_dir,
        out,
        estimator="vineppo",
        max_steps=3,
        trainer_kwargs={
            "mc_sampler": VLLMServerSampler(url),
            "callbacks": [KillServerAfterFirstCheckpoint()],
        },
    )
    with pytest.raises(ConnectionError) as info:
        trainer.train()
    seconds = time.monotonic() - killed_at[0]
    record_property("seconds", round(seconds, 2))
    message = str(info.value)
    assert f"vLLM server at {url} is down" in message and "resume_from_checkpoint" in message, message
    assert seconds < 30, seconds  # step 2's responses are generated, then its first rollout request fails
    assert trainer.state.global_step == 1  # step 2's update was not taken

    # The checkpoint saved before the server died is whole, and training resumes from it (here without a server:
    # rollouts on the policy itself).
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    verify_checkpoint(out / "checkpoint-1")
    resumed = make_trainer(tiny_model_dir, out, estimator="vineppo", max_steps=2)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert resumed.state.global_step == 2
