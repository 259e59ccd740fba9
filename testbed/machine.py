"""Where a record was made, written the same way by every benchmark, study and testbed tool that writes one.

:func:`machine_info` is the one function every record writer calls: the project's commit, the versions of Python and
the numerical libraries, the CPU model and the vector instruction sets numpy and torch dispatch on, and the threads.
Two records made on different CPUs can differ in the last bits of a float (a vector instruction set changes the order
of a sum and the kernel of an ``exp``), so a re-run is compared with a record within a tolerance
(``benchmarks/_records.py``), and when it falls outside, both environments are printed side by side
(:func:`environments_text`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Packages whose versions a record names (``None`` when one is not installed).
PACKAGES = ("mcadvantage", "numpy", "torch", "trl", "transformers")
#: Environment variables that set a numerical library's threads or its instruction-set dispatch.
THREAD_AND_DISPATCH_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "ATEN_CPU_CAPABILITY",
    "NPY_DISABLE_CPU_FEATURES",
)


@functools.lru_cache(maxsize=1)
def project_commit() -> dict[str, Any]:
    """The repository's ``HEAD`` and whether tracked files differ from it (``None`` outside a git checkout)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(dirty)}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """``/proc/cpuinfo``'s ``model name`` where there is one, else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            return names[0]
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_cpu_features() -> list[str] | None:
    """The instruction sets numpy was built for (baseline and dispatch) that this CPU has and numpy uses: its CPU
    feature table (``numpy.show_runtime()``'s "SIMD Extensions"), less any ``NPY_DISABLE_CPU_FEATURES`` turned off."""
    try:
        from numpy._core import _multiarray_umath as umath  # numpy >= 2
    except ImportError:
        try:
            from numpy.core import _multiarray_umath as umath  # numpy 1.x
        except ImportError:
            return None
    try:  # private tables: a numpy that drops them gives None, not an error in every record writer
        table = umath.__cpu_features__
        built = list(umath.__cpu_baseline__) + list(umath.__cpu_dispatch__)
    except AttributeError:
        return None
    return [f for f in built if table.get(f)]


@functools.lru_cache(maxsize=1)
def _static() -> dict[str, Any]:
    """What does not change within a process (computed once: a sweep writes thousands of records)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "numpy_cpu_features": numpy_cpu_features(),
        **project_commit(),
    }
    info.update({name: _version(name) for name in PACKAGES})
    return info


def machine_info(**extra: Any) -> dict[str, Any]:
    """Where a record is made: platform, Python, CPU model and count, the CPUs this process may use, numpy's and
    torch's instruction sets, the versions of :data:`PACKAGES`, the project's commit (and whether the checkout had
    uncommitted changes), torch's thread count and the environment variables that set threads or dispatch, plus
    ``extra`` (a benchmark's own fields, which win on a clash)."""
    info = dict(_static())
    info["cpus_usable"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info["thread_variables"] = {k: os.environ[k] for k in THREAD_AND_DISPATCH_VARIABLES if k in os.environ}
    if "torch" in sys.modules or info["torch"] is not None:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info.update(extra)
    return info


def environments_text(recorded: Mapping[str, Any] | None, here: Mapping[str, Any]) -> str:
    """Both environments, one field a line: the record's and this run's (marking the fields that differ), for a
    comparison that fell outside its tolerance. A record made before records named their environment says so."""
    if not recorded:
        recorded = {}
        lines = ["the record names no environment (made before records carried one); this run's:"]
    else:
        lines = [f"{'field':<22} {'record':<40} this run"]
    for key in sorted(set(recorded) | set(here)):
        old, new = recorded.get(key, "-"), here.get(key, "-")
        mark = "  " if old == new else "* "
        lines.append(f"{mark}{key:<20} {str(old):<40} {new}")
    return "\n".join(lines)


def uptime() -> str:
    """``uptime``'s line (the load of the shared machine), or the load averages where the command is absent (a slim
    container without procps)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
