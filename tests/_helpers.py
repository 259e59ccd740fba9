"""Helpers shared by several test modules (imported as ``from _helpers import ...``: tests/ is on ``sys.path``
under pytest, and is the folder of the scripts in it that tests run with ``python``).

Heavy imports happen inside the helpers, so importing this module costs nothing.
"""

from __future__ import annotations

import os
import socket
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


def free_port() -> int:
    """A TCP port on loopback that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
