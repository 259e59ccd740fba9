"""The machine record, for the studies' sibling imports (``from _machine import machine_info``): it lives in
``testbed/machine.py``, where the testbed's record writers use it too without importing a study (issue 60)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a script has only benchmarks/ on the path; the testbed is at the root
    sys.path.insert(0, str(ROOT))

from testbed.machine import (  # noqa: E402
    PACKAGES,
    THREAD_AND_DISPATCH_VARIABLES,
    cpu_model,
    environments_text,
    machine_info,
    numpy_cpu_features,
    project_commit,
    uptime,
)

__all__ = [
    "PACKAGES",
    "THREAD_AND_DISPATCH_VARIABLES",
    "cpu_model",
    "environments_text",
    "machine_info",
    "numpy_cpu_features",
    "project_commit",
    "uptime",
]
