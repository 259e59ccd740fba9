"""Which states of a response the Monte Carlo estimator estimates (stage 1 of
:meth:`~mcadvantage.mc.estimator.MCValueEstimator.estimate`).

A state is a step-boundary prefix ``S_i = x + y[:b_i]`` of a response. :func:`estimated_boundaries` applies the
step budget (merging short steps, capping or spreading the states, see :mod:`mcadvantage.mc.budget`);
:func:`plan_states` lists the states of every trajectory of a batch and deduplicates them: states with the same
prompt tokens, completion-prefix tokens and grading context (:func:`grading_key`) are estimated once. Plain
functions and dataclasses, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcadvantage._moved import warn_old_spelling
from mcadvantage.core.settings import MCSettings
from mcadvantage.mc.budget import merge_short_steps, spread_boundaries
from mcadvantage.mc.trajectory import Trajectory

__all__ = ["StatePlan", "estimated_boundaries", "grading_key", "plan_states"]


def _step_budget(caller: str, settings: MCSettings | int | None, legacy: dict[str, Any]) -> MCSettings:
    """``settings``, or the MCSettings that 0.1's loose arguments stand for (``max_estimated_steps`` in its place, the
    other settings by keyword), so 0.1 calls keep working; MCSettings itself validates the names and values."""
    if isinstance(settings, MCSettings):
        if legacy:
            raise TypeError(
                f"{caller}(): give the step budget once, in settings (settings.replace({', '.join(legacy)}=...)), "
                f"not also as {sorted(legacy)}."
            )
        return settings
    if settings is not None:  # 0.1: max_estimated_steps in settings' place
        legacy = {"max_estimated_steps": settings, **legacy}
    if legacy:
        given = ", ".join(f"{k}={v!r}" for k, v in legacy.items())
        # 4 frames up: warn_old_spelling, _step_budget, the public function, its caller.
        warn_old_spelling(f"{caller}(..., {given})", f"{caller}(..., MCSettings({given}))", stacklevel=4)
    return MCSettings().replace(**legacy)


def estimated_boundaries(
    boundaries: Sequence[int], settings: MCSettings | int | None = None, **legacy: Any
) -> list[int]:
    """Boundaries of the states that are estimated, after the step budget of ``settings`` (default: every step; 0.1's
    ``estimated_boundaries(boundaries, max_estimated_steps, min_step_tokens=..., steps_after_cap=...)`` still works).

    First steps shorter than ``settings.min_step_tokens`` are merged
    (:func:`~mcadvantage.mc.budget.merge_short_steps`). Then, with ``m = settings.max_estimated_steps`` and ``n > m``
    steps left: ``steps_after_cap="spread"`` keeps ``m`` states spread evenly by token position
    (:func:`~mcadvantage.mc.budget.spread_boundaries`); otherwise states ``S_0 .. S_{m-1}`` are kept and steps
    ``m .. n`` form one final step (boundaries ``b_0 .. b_{m-1}, b_n``), whose advantage is ``R - V(S_{m-1})``, so
    the telescoping sum ``R - V(S_0)`` is kept. (The official VinePPO code instead gave the steps past its cap 0
    advantage: ``"zero"``, applied by the estimator.)
    """
    settings = _step_budget("estimated_boundaries", settings, legacy)
    return _apply_cap(merge_short_steps(boundaries, settings.min_step_tokens), settings)


def _apply_cap(b: list[int], settings: MCSettings) -> list[int]:
    """The cap step of :func:`estimated_boundaries`, on boundaries whose short steps are already merged."""
    cap = settings.max_estimated_steps
    if cap is None or len(b) - 1 <= cap:
        return b
    if settings.steps_after_cap == "spread":
        return spread_boundaries(b, cap)
    return b[:cap] + [b[-1]]


@dataclass
class StatePlan:
    """Deduplicated states of a batch.

    Attributes:
        unique: per unique state, ``(trajectory index of its first occurrence, completion prefix
            length)``.
        state_index: per trajectory, the unique-state index of each of its states ``S_0..S_{m-1}``.
        boundaries: per trajectory, the (possibly merged, see :func:`estimated_boundaries`)
            boundaries used for the advantages.
        capped: per trajectory, whether ``max_estimated_steps`` cut its steps (what ``steps_after_cap="zero"``
            zeroes).
        first_state: per trajectory, its first estimated state (:attr:`Trajectory.first_state`; ``state_index``
            lists the states from it on).
        parent: per unique state, the unique state before it in the trajectory of its first occurrence (None
            for a prompt state).
    """

    unique: list[tuple[int, int]]
    state_index: list[list[int]]
    boundaries: list[list[int]]
    capped: list[bool] = field(default_factory=list)
    parent: list[int | None] = field(default_factory=list)
    first_state: list[int] = field(default_factory=list)

    @property
    def num_states(self) -> int:
        return sum(len(s) for s in self.state_index)


def grading_key(traj: Trajectory) -> str:
    # Two responses share a state only if they would be graded alike: same prompt and same row
    # fields (e.g. a duplicated question with another gold answer must not share a value). repr is
    # used because prompts and fields may hold unhashable lists/dicts.
    return repr((traj.prompt, sorted(traj.fields.items(), key=lambda kv: kv[0])))


def plan_states(
    trajectories: Sequence[Trajectory], settings: MCSettings | int | None = None, **legacy: Any
) -> StatePlan:
    """List the non-terminal states of every trajectory and deduplicate them.

    A state is identified by its prompt token ids, its completion-prefix token ids and its grading
    context (prompt and fields); identical states anywhere in the batch map to one unique state. The step
    budget of ``settings`` (default: ``MCSettings()``, every step a state) decides which boundaries are states
    (:func:`estimated_boundaries`; 0.1's loose arguments still work there and here).
    """
    settings = _step_budget("plan_states", settings, legacy)
    cap = settings.max_estimated_steps
    key_to_index: dict[tuple[tuple[int, ...], tuple[int, ...], str], int] = {}
    unique: list[tuple[int, int]] = []
    parent: list[int | None] = []
    state_index: list[list[int]] = []
    all_boundaries: list[list[int]] = []
    capped: list[bool] = []
    firsts: list[int] = []
    for t, traj in enumerate(trajectories):
        merged = merge_short_steps(traj.step_boundaries, settings.min_step_tokens)
        b = _apply_cap(merged, settings)
        all_boundaries.append(b)
        capped.append(cap is not None and len(merged) - 1 > cap)
        prompt_key = tuple(traj.prompt_ids)
        gkey = grading_key(traj)
        idx: list[int] = []
        first = _first_state(traj, len(b) - 1, t)
        for prefix_len in b[first:-1]:  # S_first .. S_{n-1}: the terminal state is never sampled
            key = (prompt_key, tuple(traj.completion_ids[:prefix_len]), gkey)
            if key not in key_to_index:
                key_to_index[key] = len(unique)
                unique.append((t, prefix_len))
                parent.append(idx[-1] if idx else None)
            idx.append(key_to_index[key])
        state_index.append(idx)
        firsts.append(first)
    return StatePlan(
        unique=unique,
        state_index=state_index,
        boundaries=all_boundaries,
        capped=capped,
        parent=parent,
        first_state=firsts,
    )


def _first_state(traj: Trajectory, num_states: int, t: int) -> int:
    """``traj.first_state``, checked against its ``num_states`` states after the step budget."""
    first = traj.first_state
    if not (isinstance(first, int) and (first == 0 or 0 < first < num_states)):
        raise ValueError(
            f"trajectories[{t}].first_state={first!r} is not a state of the response: it has {num_states} states "
            f"after the step budget, so first_state is an int in [0, {num_states - 1}] (0: estimate every state)."
        )
    return first
