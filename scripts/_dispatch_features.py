"""numpy's dispatchable CPU features, for ``NPY_DISABLE_CPU_FEATURES`` (scripts/test_portable.sh).

``python scripts/_dispatch_features.py`` prints every feature this numpy build dispatches to, space-separated (numpy
names them per release: 2.3 ``AVX2 AVX512F ...``, 2.4 ``X86_V3 X86_V4 ...``), so setting them all off leaves numpy
its baseline. ``--check`` exits non-zero unless the switches took effect: torch runs its portable kernels and numpy
uses none of its dispatched features.
"""

from __future__ import annotations

import sys


def _umath():
    try:
        from numpy._core import _multiarray_umath as umath  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as umath
    return umath


def dispatch_features() -> list[str]:
    """The features numpy was built to dispatch to at run time (beyond its baseline); empty where this numpy has
    no such table (then ``--check`` says the switch cannot be confirmed)."""
    return list(getattr(_umath(), "__cpu_dispatch__", []))


def check() -> int:
    """0 when torch's kernels are the portable ones and numpy dispatches to nothing beyond its baseline."""
    import torch

    umath = _umath()
    if not hasattr(umath, "__cpu_features__"):
        print("this numpy has no CPU feature table: cannot confirm NPY_DISABLE_CPU_FEATURES took effect")
        return 1
    used = [f for f in dispatch_features() if umath.__cpu_features__.get(f)]
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch CPU capability {capability}; numpy dispatched features in use: {used or 'none'}")
    if capability.upper() != "DEFAULT" or used:
        print("the kernel switches did not take effect (ATEN_CPU_CAPABILITY, NPY_DISABLE_CPU_FEATURES)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(check() if "--check" in sys.argv[1:] else print(" ".join(dispatch_features())))
