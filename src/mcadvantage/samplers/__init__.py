"""Samplers: engines that draw Monte Carlo continuations for the estimator.

Engine-specific classes are imported lazily so that importing this package needs neither
transformers nor vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

from mcadvantage.samplers.base import Continuation, RolloutRequest, Sampler

_LAZY = {
    "TransformersSampler": ".hf",
    "VLLMSampler": ".vllm",
    "VLLMServerSampler": ".vllm",
}

__all__ = ["Continuation", "RolloutRequest", "Sampler", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mcadvantage.samplers' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
