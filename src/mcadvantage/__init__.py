"""mcadvantage: VinePPO-style Monte Carlo credit assignment for the Hugging Face RL stack.

Public names are imported lazily, so ``import mcadvantage`` is cheap and never imports TRL or vLLM;
the segmenters, verifiers, advantage math and estimator can be used from any RL code base (verl,
OpenRLHF, ...) without them. ``VinePPOTrainer`` / ``VinePPOConfig`` import TRL on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mcadvantage import _moved
from mcadvantage._version import __version__

_moved.install()  # the 0.1 layout's module paths (mcadvantage.estimator, ...) stay importable

# public name -> submodule that defines it
_LAZY: dict[str, str] = {
    # segmentation
    "StepSegmenter": "tasks.segmentation",
    "GSM8KSegmenter": "tasks.gsm8k",
    "MathSegmenter": "tasks.math",
    "NewlineSegmenter": "tasks.newline",
    "get_segmenter": "tasks.segmentation",
    "segment_completion": "tasks.segmentation",
    "step_token_boundaries": "tasks.segmentation",
    # grading
    "Verifier": "tasks.verifier",
    "GSM8KVerifier": "tasks.gsm8k",
    "MathVerifier": "tasks.math",
    "get_verifier": "tasks.verifier",
    "completion_text": "tasks.verifier",
    "RewardFunctionError": "rewards.errors",
    # checkpoints: checked before a resume
    "CheckpointError": "trainer.checkpoints",
    "verify_checkpoint": "trainer.checkpoints",
    "complete_checkpoints": "trainer.checkpoints",
    # advantage math
    "step_advantages": "core.advantages",
    "token_advantages": "core.advantages",
    "masked_whiten": "core.advantages",
    "gae_advantages": "core.advantages",
    "loss_token_mask": "core.advantages",
    "pooled_anchor_advantages": "core.anchors",
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
    "TreeEstimator": "estimators",
    "AnchorEstimator": "estimators",
    # sampling from a trainer's current policy (imports TRL)
    "policy_sampler": "trainer.policy",
    # Pass@1 evaluation (the trainer's engine through policy_sampler, or a saved checkpoint)
    "PassAt1Settings": "evaluation.pass_at_1",
    "PassAt1Result": "evaluation.pass_at_1",
    "score_samples": "evaluation.pass_at_1",
    "evaluate_pass_at_1": "evaluation.pass_at_1",
    "evaluate_checkpoint": "evaluation.pass_at_1",
    # estimation: the Monte Carlo settings (one definition behind the config, the estimator and verl's section)
    "MCSettings": "core.settings",
    "MCValueEstimator": "mc.estimator",
    "Trajectory": "mc.estimator",
    "MCEstimate": "mc.estimator",
    # agent episodes: what a continuation_func is asked, the episodes, their sampler and the environment's replay
    "ContinuationRequest": "trainer.continuation",
    "Episode": "agents.tool_loop",
    "AgentEpisodes": "agents.tool_loop",
    "EpisodeSampler": "agents.episode_sampler",
    "ToolTurn": "agents.rebuild",
    "execute_tool_calls": "agents.rebuild",
    "replay_environment": "agents.rebuild",
    "EnvironmentReplayError": "agents.rebuild",
    "episode_step_boundaries": "agents.turns",
    # credit-assignment diagnostics (estimators against a large-K ground truth)
    "diagnose_credit": "evaluation.diagnostics",
    # the gradient-quality instrument (an estimator's gradient against the exact one)
    "GradientTask": "evaluation.gradient_instrument",
    "estimator_gradient": "evaluation.gradient_instrument",
    "gradient_metrics": "evaluation.gradient_instrument",
    # training data for the RL-free baselines (ReST-EM, DPO+)
    "GradedPrompt": "trainer.self_training",
    "restem_examples": "trainer.self_training",
    "preference_pairs": "trainer.self_training",
    # TRL trainer (imports TRL)
    "VinePPOConfig": "trainer.config",
    "VinePPOTrainer": "trainer.vineppo_trainer",
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
    from mcadvantage.agents.episode_sampler import EpisodeSampler
    from mcadvantage.agents.rebuild import (
        EnvironmentReplayError,
        ToolTurn,
        execute_tool_calls,
        replay_environment,
    )
    from mcadvantage.agents.tool_loop import AgentEpisodes, Episode
    from mcadvantage.agents.turns import episode_step_boundaries
    from mcadvantage.core.advantages import (
        gae_advantages,
        loss_token_mask,
        masked_whiten,
        step_advantages,
        token_advantages,
    )
    from mcadvantage.core.anchors import pooled_anchor_advantages
    from mcadvantage.core.settings import MCSettings
    from mcadvantage.estimators import (
        AdvantageBatch,
        AdvantageEstimator,
        AdvantageResult,
        AnchorEstimator,
        CriticEstimator,
        EstimatorContext,
        GRPOEstimator,
        HybridEstimator,
        RLOOEstimator,
        TreeEstimator,
        VinePPOEstimator,
        available_advantage_estimators,
        get_advantage_estimator,
        register_advantage_estimator,
    )
    from mcadvantage.evaluation.diagnostics import diagnose_credit
    from mcadvantage.evaluation.gradient_instrument import GradientTask, estimator_gradient, gradient_metrics
    from mcadvantage.evaluation.pass_at_1 import (
        PassAt1Result,
        PassAt1Settings,
        evaluate_checkpoint,
        evaluate_pass_at_1,
        score_samples,
    )
    from mcadvantage.mc.estimator import MCEstimate, MCValueEstimator, Trajectory
    from mcadvantage.samplers import (
        Continuation,
        RolloutRequest,
        Sampler,
        TransformersSampler,
        VLLMSampler,
        VLLMServerSampler,
    )
    from mcadvantage.tasks.gsm8k import GSM8KSegmenter, GSM8KVerifier
    from mcadvantage.tasks.math import MathSegmenter, MathVerifier
    from mcadvantage.tasks.newline import NewlineSegmenter
    from mcadvantage.tasks.segmentation import (
        StepSegmenter,
        get_segmenter,
        segment_completion,
        step_token_boundaries,
    )
    from mcadvantage.tasks.verifier import Verifier, completion_text, get_verifier
    from mcadvantage.trainer.checkpoints import CheckpointError, complete_checkpoints, verify_checkpoint
    from mcadvantage.trainer.config import VinePPOConfig
    from mcadvantage.trainer.continuation import ContinuationRequest
    from mcadvantage.trainer.policy import policy_sampler
    from mcadvantage.trainer.self_training import GradedPrompt, preference_pairs, restem_examples
    from mcadvantage.trainer.vineppo_trainer import VinePPOTrainer
