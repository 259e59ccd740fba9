"""What machine a benchmark ran on, recorded the same way by every benchmark that writes it."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine_info(**extra: Any) -> dict[str, Any]:
    """Platform, Python, CPU model (``/proc/cpuinfo``'s ``model name`` where there is one) and count, torch and
    transformers versions and torch's thread count, plus ``extra`` (a benchmark's own fields)."""
    import torch
    import transformers

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["cpu"] = names[0]
    except OSError:
        pass
    info.update(extra)
    return info
