"""One definition of every setting's validity: the Monte Carlo settings and the sampling settings.

``VinePPOConfig``, ``MCValueEstimator`` and the three samplers all validate through these functions, so a
setting is accepted or refused the same way wherever it is given; only the parameter names in the messages
differ (``num_mc_rollouts`` in the config, ``num_rollouts`` in the estimator).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = [
    "ALLOCATIONS",
    "ROLLOUT_BUDGETS",
    "STEPS_AFTER_CAP",
    "needed_completion_room",
    "validate_mc_settings",
    "validate_sampling_settings",
]

#: How a Monte Carlo continuation's token budget is set (see ``VinePPOConfig.mc_rollout_budget``).
ROLLOUT_BUDGETS = ("remaining", "fixed")

# Canonical setting -> the name a caller exposes (the estimator's own names are the canonical ones).
_CONFIG_NAMES = {
    "num_rollouts": "num_mc_rollouts",
    "rollout_budget": "mc_rollout_budget",
    "fixed_rollout_budget": "mc_fixed_rollout_budget",
    "max_estimated_steps": "mc_max_estimated_steps",
    "truncated_reward": "mc_truncated_reward",
    "steps_after_cap": "mc_steps_after_cap",
    "max_completion_length": "max_completion_length",
    "reuse_samples": "mc_reuse_samples",
    "allocation": "mc_allocation",
    "min_rollouts": "mc_min_rollouts",
    "min_step_tokens": "mc_min_step_tokens",
}

#: How Monte Carlo rollouts are spread over states (see ``VinePPOConfig.mc_allocation``).
ALLOCATIONS = ("uniform", "variance")
#: What steps past ``max_estimated_steps`` get (see ``VinePPOConfig.mc_steps_after_cap``).
STEPS_AFTER_CAP = ("merge", "zero", "spread")


def validate_mc_settings(
    *,
    num_rollouts: int,
    rollout_budget: str,
    fixed_rollout_budget: int | None,
    max_completion_length: int | None,
    max_estimated_steps: int | None,
    truncated_reward: float | None,
    steps_after_cap: str = "merge",
    reuse_samples: bool = False,
    allocation: str = "uniform",
    min_rollouts: int = 1,
    min_step_tokens: int | None = None,
    names: Mapping[str, str] | str | None = None,
) -> None:
    """Refuse invalid or contradictory Monte Carlo settings, naming the parameter, its value and the fix.

    Args:
        names: the caller's parameter names: ``"config"`` for ``VinePPOConfig``'s field names, a mapping from
            the canonical names above, or None for the canonical (``MCValueEstimator``) names.
    Raises:
        TypeError: ``num_rollouts`` is not an int.
        ValueError: any other invalid value.
    """
    table = _CONFIG_NAMES if names == "config" else dict(names or {})

    def n(key: str) -> str:
        return table.get(key, key)

    if isinstance(num_rollouts, bool) or not isinstance(num_rollouts, int):
        raise TypeError(
            f"{n('num_rollouts')} must be an int, got {num_rollouts!r}. Set it to the number of continuations "
            f"per state, e.g. {n('num_rollouts')}=9."
        )
    if num_rollouts < 1:
        raise ValueError(
            f"{n('num_rollouts')}={num_rollouts} is invalid: every state needs at least one Monte Carlo "
            f"continuation. Set {n('num_rollouts')} >= 1 (the paper uses 9)."
        )
    if rollout_budget not in ROLLOUT_BUDGETS:
        raise ValueError(
            f"{n('rollout_budget')}={rollout_budget!r} is invalid. Use 'remaining' (continuations get what is "
            f"left of {n('max_completion_length')}) or 'fixed' (with {n('fixed_rollout_budget')})."
        )
    if rollout_budget == "fixed":
        if fixed_rollout_budget is None:
            raise ValueError(
                f"{n('rollout_budget')}='fixed' needs {n('fixed_rollout_budget')} (tokens per continuation), which "
                f"is None. Set {n('fixed_rollout_budget')}, e.g. 1024 (the official code), or use "
                f"{n('rollout_budget')}='remaining'."
            )
        if fixed_rollout_budget < 1:
            raise ValueError(
                f"{n('fixed_rollout_budget')}={fixed_rollout_budget} is invalid: a continuation needs at least one "
                f"token. Set {n('fixed_rollout_budget')} >= 1."
            )
    else:
        if fixed_rollout_budget is not None:
            raise ValueError(
                f"{n('fixed_rollout_budget')}={fixed_rollout_budget} is set but {n('rollout_budget')}="
                f"{rollout_budget!r} ignores it. Set {n('rollout_budget')}='fixed' to use it, or drop "
                f"{n('fixed_rollout_budget')}."
            )
        if max_completion_length is None or max_completion_length < 1:
            raise ValueError(
                f"{n('rollout_budget')}='remaining' needs {n('max_completion_length')} >= 1 (the budget "
                f"continuations share with the response), got {max_completion_length!r}. Set it, or use "
                f"{n('rollout_budget')}='fixed'."
            )
    if max_estimated_steps is not None and max_estimated_steps < 1:
        raise ValueError(
            f"{n('max_estimated_steps')}={max_estimated_steps} is invalid: at least the prompt state S_0 must be "
            f"estimated. Set {n('max_estimated_steps')} >= 1, or None to estimate every step."
        )
    if steps_after_cap not in STEPS_AFTER_CAP:
        raise ValueError(
            f"{n('steps_after_cap')}={steps_after_cap!r} is invalid. Use 'merge' (steps past the cap form one final "
            "step, R - V(S_{m-1})), 'zero' (they get advantage 0, as the official VinePPO code on GSM8K) or "
            "'spread' (keep the cap's number of states, spread evenly over the response)."
        )
    if steps_after_cap == "spread" and max_estimated_steps is None:
        raise ValueError(
            f"{n('steps_after_cap')}='spread' spreads {n('max_estimated_steps')} states over each response, but "
            f"{n('max_estimated_steps')} is None. Set it (e.g. 8), or use {n('steps_after_cap')}='merge'."
        )
    if allocation not in ALLOCATIONS:
        raise ValueError(
            f"{n('allocation')}={allocation!r} is invalid. Use 'uniform' ({n('num_rollouts')} samples per state) "
            f"or 'variance' (the same rollout tokens, spent where they reduce advantage error most)."
        )
    if isinstance(min_rollouts, bool) or not isinstance(min_rollouts, int) or min_rollouts < 1:
        raise ValueError(
            f"{n('min_rollouts')}={min_rollouts!r} is invalid: every state needs at least one sample besides the "
            f"response's own. Set {n('min_rollouts')} to an int >= 1 (default 1)."
        )
    if allocation == "variance" and min_rollouts > num_rollouts:
        raise ValueError(
            f"{n('min_rollouts')}={min_rollouts} exceeds {n('num_rollouts')}={num_rollouts}: the first wave "
            f"would spend more than the whole budget. Set {n('min_rollouts')} <= {n('num_rollouts')}."
        )
    if reuse_samples and rollout_budget != "remaining":
        raise ValueError(
            f"{n('reuse_samples')}=True needs {n('rollout_budget')}='remaining', got {rollout_budget!r}: a "
            "response is a draw of a state's value only when rollouts from that state get the budget the response "
            f"had left. Set {n('rollout_budget')}='remaining' or {n('reuse_samples')}=False."
        )
    if min_step_tokens is not None and (
        isinstance(min_step_tokens, bool) or not isinstance(min_step_tokens, int) or min_step_tokens < 1
    ):
        raise ValueError(
            f"{n('min_step_tokens')}={min_step_tokens!r} is invalid. Set it to an int >= 1 (steps shorter than "
            "this many tokens are merged into the next one) or None to keep every step."
        )
    if truncated_reward is not None and not math.isfinite(float(truncated_reward)):
        raise ValueError(
            f"{n('truncated_reward')}={truncated_reward} is invalid: it must be a finite reward (e.g. 0.0, the "
            "official code's) or None to grade truncated continuations normally."
        )


def needed_completion_room(
    max_completion_length: int | None, rollout_budget: str, fixed_rollout_budget: int | None
) -> tuple[int, str]:
    """Positions a prompt must leave free in the context (a full response, and a full fixed-budget rollout), and
    the name of the setting that decides it (for error messages)."""
    room, name = int(max_completion_length or 0), "max_completion_length"
    if rollout_budget == "fixed" and fixed_rollout_budget is not None and fixed_rollout_budget > room:
        room, name = int(fixed_rollout_budget), "mc_fixed_rollout_budget"
    return room, name


def validate_sampling_settings(
    owner: str,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> None:
    """The one rule every sampler applies: ``temperature >= 0`` (0 = greedy: every continuation of a request is
    the policy's mode), ``top_p`` in (0, 1], ``top_k`` None (off) or >= 1, ``min_p`` None or in [0, 1],
    ``repetition_penalty > 0`` (1 = off). Raises ``ValueError`` naming ``owner``, the parameter and the fix."""
    if not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(
            f"{owner}: temperature={temperature!r} is invalid; it must be >= 0 (0 means greedy). Use the "
            "training responses' temperature so Monte Carlo values estimate the current policy."
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"{owner}: top_p={top_p!r} must be in (0, 1]; use 1.0 to disable nucleus sampling.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(
            f"{owner}: top_k={top_k!r} must be None (no top-k filtering) or an int >= 1; TRL's top_k=0 means "
            "None."
        )
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueError(f"{owner}: min_p={min_p!r} must be None (off) or in [0, 1].")
    if not repetition_penalty > 0:
        raise ValueError(
            f"{owner}: repetition_penalty={repetition_penalty!r} must be > 0 (1.0 means no penalty)."
        )
