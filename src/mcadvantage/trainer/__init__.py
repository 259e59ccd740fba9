"""The TRL side: :class:`~mcadvantage.trainer.vineppo_trainer.VinePPOTrainer` (thin wiring over
``trl.GRPOTrainer``), its config, the checks it runs on its inputs, the one module that touches TRL internals
(:mod:`~mcadvantage.trainer.trl_compat`, with the supported TRL range), sampling from the trained policy
(:mod:`~mcadvantage.trainer.policy`), checkpoint verification, and the data of the RL-free baselines RestEM and DPO+
(:mod:`~mcadvantage.trainer.self_training`, trained by TRL's own trainers).

Importing this package imports nothing heavy; ``VinePPOTrainer`` and ``VinePPOConfig`` import TRL on first access.
The 0.1 layout's ``mcadvantage.trainer`` module held the trainer; both names stay importable from here.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"VinePPOTrainer": ".vineppo_trainer", "VinePPOConfig": ".config"}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mcadvantage.trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
