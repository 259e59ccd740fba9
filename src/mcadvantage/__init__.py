"""mcadvantage: VinePPO-style Monte Carlo credit assignment for the Hugging Face RL stack.

Public names are imported lazily, so ``import mcadvantage`` is cheap and never imports TRL or vLLM;
the segmenters, verifiers, advantage math and estimator can be used from any RL code base (verl,
OpenRLHF, ...) without them. ``VinePPOTrainer`` / ``VinePPOConfig`` import TRL on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> submodule that defines it
_LAZY: dict[str, str] = {
    # segmentation
    "StepSegmenter": "segmenters",
    "GSM8KSegmenter": "segmenters",
    "MathSegmenter": "segmenters",
    "NewlineSegmenter": "segmenters",
    "get_segmenter": "segmenters",
    "segment_completion": "segmenters",
    "step_token_boundaries": "segmenters",
    # grading
    "Verifier": "verifiers",
    "GSM8KVerifier": "verifiers",
    "MathVerifier": "verifiers",
    "get_verifier": "verifiers",
    "RewardFunctionError": "reward_errors",
    # checkpoints: checked before a resume
    "CheckpointError": "checkpoints",
    "verify_checkpoint": "checkpoints",
    # advantage math
    "step_advantages": "advantages",
    "token_advantages": "advantages",
    "masked_whiten": "advantages",
    # sampling
    "Sampler": "samplers",
    "RolloutRequest": "samplers",
    "Continuation": "samplers",
    "TransformersSampler": "samplers",
    "VLLMSampler": "samplers",
    "VLLMServerSampler": "samplers",
    # advantage estimators (the seam)
    "AdvantageEstimator": "estimators",
    "AdvantageBatch": "estimators",
    "AdvantageResult": "estimators",
    "EstimatorContext": "estimators",
    "register_advantage_estimator": "estimators",
    "get_advantage_estimator": "estimators",
    "available_advantage_estimators": "estimators",
    "VinePPOEstimator": "estimators",
    "GRPOEstimator": "estimators",
    "RLOOEstimator": "estimators",
    "CriticEstimator": "estimators",
    "HybridEstimator": "estimators",
    # sampling from a trainer's current policy (imports TRL)
    "policy_sampler": "policy",
    # Pass@1 evaluation (the trainer's engine through policy_sampler, or a saved checkpoint)
    "PassAt1Settings": "evaluation",
    "PassAt1Result": "evaluation",
    "score_samples": "evaluation",
    "evaluate_pass_at_1": "evaluation",
    "evaluate_checkpoint": "evaluation",
    # estimation
    "MCValueEstimator": "estimator",
    "Trajectory": "estimator",
    "MCEstimate": "estimator",
    # TRL trainer (imports TRL)
    "VinePPOConfig": "config",
    "VinePPOTrainer": "trainer",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mcadvantage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # static type checkers and IDEs see the real names
    from .advantages import masked_whiten, step_advantages, token_advantages
    from .config import VinePPOConfig
    from .estimator import MCEstimate, MCValueEstimator, Trajectory
    from .estimators import (
        AdvantageBatch,
        AdvantageEstimator,
        AdvantageResult,
        CriticEstimator,
        EstimatorContext,
        GRPOEstimator,
        RLOOEstimator,
        VinePPOEstimator,
        available_advantage_estimators,
        get_advantage_estimator,
        register_advantage_estimator,
    )
    from .evaluation import (
        PassAt1Result,
        PassAt1Settings,
        evaluate_checkpoint,
        evaluate_pass_at_1,
        score_samples,
    )
    from .policy import policy_sampler
    from .samplers import (
        Continuation,
        RolloutRequest,
        Sampler,
        TransformersSampler,
        VLLMSampler,
        VLLMServerSampler,
    )
    from .segmenters import (
        GSM8KSegmenter,
        MathSegmenter,
        NewlineSegmenter,
        StepSegmenter,
        get_segmenter,
        segment_completion,
        step_token_boundaries,
    )
    from .trainer import VinePPOTrainer
    from .verifiers import GSM8KVerifier, MathVerifier, Verifier, get_verifier
