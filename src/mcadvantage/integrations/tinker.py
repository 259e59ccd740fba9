"""mcadvantage's per-token advantages as Tinker datums (``pip install 'mcadvantage[tinker]'``).

Tinker's RL losses (``forward_backward(data, loss_fn="importance_sampling" | "ppo")``) read three per-token
``loss_fn_inputs`` from each ``tinker.Datum``: ``target_tokens``, the sampler's ``logprobs`` and ``advantages``. A
datum holds one sequence shifted by one token: ``model_input`` is the sequence without its last token,
``target_tokens`` it without its first, so the completion token at sequence position ``p`` is target ``p - 1``.
Positions the loss must not train (the prompt, tool results) get advantage 0 and logprob 0.

- :func:`datums_from_advantages`, :func:`datums_from_result`, :func:`datums_from_estimate`: datums from any
  estimator's per-token advantages (a ``(B, T)`` tensor, an :class:`~mcadvantage.estimators.batch.AdvantageResult`
  through :func:`~mcadvantage.estimators.batch.finalize_advantages`, or an
  :class:`~mcadvantage.mc.estimator.MCEstimate`), one per response.
- tinker-cookbook's RL data path (``tinker_cookbook.rl``): the cookbook gives every action token of a trajectory
  one advantage (``trajectory_to_data(traj, traj_advantage)``). :func:`advantage_batch_from_trajectory_groups` turns
  its ``TrajectoryGroup`` s into an :class:`~mcadvantage.estimators.batch.AdvantageBatch` (one episode per
  trajectory, the observations between turns as tool tokens, state keys from a function of the transition), and
  :func:`cookbook_datums` lays the per-token advantages into the cookbook's own datums (same inputs, targets, mask
  and provenance as ``trajectory_to_data``); :func:`cookbook_training_data` does both around an estimator, in
  place of the cookbook's ``compute_advantages`` + ``assemble_training_data``.

Nothing here talks to the Tinker service; see ``docs/howto/tinker.md`` for what was and was not run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

try:
    import tinker
    from tinker import Datum, ModelInput, TensorData
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "mcadvantage.integrations.tinker needs tinker: pip install 'mcadvantage[tinker]' (tinker-cookbook too for "
        "the cookbook functions; see docs/howto/tinker.md)."
    ) from err

from mcadvantage.core.advantages import loss_token_mask
from mcadvantage.estimators.base import AdvantageEstimator
from mcadvantage.estimators.batch import (
    AdvantageBatch,
    AdvantageResult,
    EstimatorContext,
    finalize_advantages,
)

__all__ = [
    "LOSS_FN_INPUTS",
    "action_advantages",
    "advantage_batch_from_trajectory_groups",
    "cookbook_datums",
    "cookbook_training_data",
    "datum",
    "datums_from_advantages",
    "datums_from_estimate",
    "datums_from_result",
]

#: The ``loss_fn_inputs`` Tinker's ``importance_sampling`` and ``ppo`` losses read.
LOSS_FN_INPUTS = ("target_tokens", "logprobs", "advantages")


def datum(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    advantages: Sequence[float],
    logprobs: Sequence[float],
) -> Datum:
    """One response as a datum for ``importance_sampling`` / ``ppo``.

    Args:
        prompt_ids: the prompt's tokens (at least one: the first completion token is predicted from it).
        completion_ids: the response's tokens.
        advantages: one per completion token (0 on tokens the loss must leave out, e.g. tool results).
        logprobs: the sampler's log-probability of each completion token (0 on tokens it did not sample).

    Raises:
        ValueError: an empty prompt or completion, or per-token lists of another length than the completion.
    """
    n = len(completion_ids)
    if not prompt_ids or not n:
        raise ValueError(
            f"A Tinker datum needs a prompt and a completion (got {len(prompt_ids)} prompt and {n} completion tokens): "
            "the first completion token is predicted from the prompt."
        )
    if len(advantages) != n or len(logprobs) != n:
        raise ValueError(
            f"advantages ({len(advantages)}) and logprobs ({len(logprobs)}) must give one value per completion token "
            f"({n})."
        )
    sequence = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
    pad = [0.0] * (len(prompt_ids) - 1)
    return Datum(
        model_input=ModelInput.from_ints(sequence[:-1]),
        loss_fn_inputs={
            "target_tokens": TensorData.from_torch(torch.tensor(sequence[1:], dtype=torch.int64)),
            "logprobs": TensorData.from_torch(
                torch.tensor(pad + [float(x) for x in logprobs], dtype=torch.float32)
            ),
            "advantages": TensorData.from_torch(
                torch.tensor(pad + [float(a) for a in advantages], dtype=torch.float32)
            ),
        },
    )


def datums_from_advantages(
    batch: AdvantageBatch, advantages: torch.Tensor, logprobs: Sequence[Sequence[float]]
) -> list[Datum]:
    """One datum per response of ``batch`` with ``advantages[i, :len(completion_i)]`` on its tokens.

    Args:
        batch: the responses (``prompt_ids``, ``completion_ids``).
        advantages: ``(B, T)`` per-token advantages, as they enter the loss (0 outside the loss tokens).
        logprobs: per response, the sampler's log-probability of each completion token.
    """
    if len(logprobs) != len(batch.completion_ids):
        raise ValueError(
            f"logprobs holds {len(logprobs)} responses for a batch of {len(batch.completion_ids)}."
        )
    out = []
    for i, (prompt, completion) in enumerate(zip(batch.prompt_ids, batch.completion_ids, strict=True)):
        out.append(datum(prompt, completion, advantages[i, : len(completion)].tolist(), logprobs[i]))
    return out


def datums_from_result(
    batch: AdvantageBatch,
    result: AdvantageResult,
    logprobs: Sequence[Sequence[float]],
    *,
    whiten: bool,
    estimator: str = "the advantage estimator",
) -> list[Datum]:
    """Datums from an estimator's result, through
    :func:`~mcadvantage.estimators.batch.finalize_advantages` (the finite check, and token-weighted whitening when
    ``whiten``: an estimator's ``whiten_by_default`` is what ``VinePPOTrainer`` would use), the step every
    mcadvantage trainer takes between ``estimate`` and the loss. Tool tokens (``batch.tool_mask`` 0) get 0."""
    mask = loss_token_mask(batch.completion_mask, batch.tool_mask)
    advantages = finalize_advantages(result, mask, whiten=whiten, estimator=estimator)
    return datums_from_advantages(batch, advantages, logprobs)


def datums_from_estimate(
    trajectories: Sequence[Any], estimate: Any, logprobs: Sequence[Sequence[float]]
) -> list[Datum]:
    """Datums from :meth:`~mcadvantage.mc.estimator.MCValueEstimator.estimate`: each
    trajectory's ``estimate.token_advantages`` (not whitened), tool tokens (``trajectory.tool_mask`` 0) set to 0."""
    out = []
    for traj, advs, lp in zip(trajectories, estimate.token_advantages, logprobs, strict=True):
        values = [float(a) for a in advs]
        if traj.tool_mask is not None:
            values = [a if m else 0.0 for a, m in zip(values, traj.tool_mask, strict=True)]
        out.append(datum(traj.prompt_ids, traj.completion_ids, values, lp))
    return out


# -- tinker-cookbook's RL data path -------------------------------------------------------------------------------


def _text_tokens(model_input: ModelInput, where: str) -> list[int]:
    """A text-only ``ModelInput``'s tokens (image or audio chunks have no token ids to credit)."""
    if any(not isinstance(chunk, tinker.EncodedTextChunk) for chunk in model_input.chunks):
        raise NotImplementedError(
            f"{where} holds a non-text chunk: mcadvantage credits token ids, so the cookbook functions take text "
            "observations only. Build datums for multimodal trajectories with the cookbook's trajectory_to_data."
        )
    return model_input.to_ints()


def _episode(traj: Any, where: str) -> tuple[list[int], list[int], list[int]]:
    """A cookbook trajectory as ``(prompt, completion, tool_mask)``: the first observation is the prompt; each
    later observation adds its tokens beyond the sequence so far (all of them when it does not extend it) as tool
    tokens before the action; actions are the model's tokens."""
    prompt: list[int] | None = None
    completion: list[int] = []
    mask: list[int] = []
    for t, transition in enumerate(traj.transitions):
        ob = _text_tokens(transition.ob, f"{where}, transition {t}")
        if prompt is None:
            prompt = ob
        else:
            seen = prompt + completion
            new = ob[len(seen) :] if ob[: len(seen)] == seen else ob
            completion += new
            mask += [0] * len(new)
        completion += list(transition.ac.tokens)
        mask += [1] * len(transition.ac.tokens)
    return prompt or [], completion, mask


def advantage_batch_from_trajectory_groups(
    trajectory_groups: Sequence[Any], *, state_key: Callable[[Any], Hashable] | None = None
) -> AdvantageBatch:
    """tinker-cookbook ``TrajectoryGroup`` s as one :class:`AdvantageBatch`, a group per ``TrajectoryGroup``.

    Each trajectory is one episode: its first observation the prompt, its actions the model's turns, the
    observations' new tokens between them tool tokens (``tool_mask`` 0); its reward the cookbook's total
    (``get_total_rewards``: step rewards plus the group reward).

    Args:
        trajectory_groups: the cookbook's groups (equal sizes: group credit compares a prompt's trajectories).
        state_key: the state before a turn, from its ``Transition`` (e.g. ``lambda t: t.logs["board"]``), for
            ``"anchor"`` credit by state; None: no keys (``AnchorEstimator(state_source="observation")`` keys turns
            by their observation tokens).

    Raises:
        ValueError: groups of different sizes.
    """
    sizes = {len(g.trajectories_G) for g in trajectory_groups}
    if len(sizes) != 1:
        raise ValueError(
            f"trajectory_groups have sizes {sorted(sizes)}: group credit needs one size (the cookbook's group_size); "
            "drop incomplete groups first."
        )
    episodes, rewards, keys = [], [], []
    for g, group in enumerate(trajectory_groups):
        rewards += [float(r) for r in group.get_total_rewards()]
        for i, traj in enumerate(group.trajectories_G):
            episodes.append(_episode(traj, f"trajectory {i} of group {g}"))
            if state_key is not None:
                keys.append([state_key(t) for t in traj.transitions if t.ac.tokens])
    width = max(len(c) for _, c, _ in episodes)
    completion_mask = torch.zeros((len(episodes), width), dtype=torch.long)
    tool_mask = torch.zeros((len(episodes), width), dtype=torch.long)
    for i, (_, completion, mask) in enumerate(episodes):
        completion_mask[i, : len(completion)] = 1
        tool_mask[i, : len(completion)] = torch.tensor(mask, dtype=torch.long)
    return AdvantageBatch(
        prompt_ids=[p for p, _, _ in episodes],
        completion_ids=[c for _, c, _ in episodes],
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor(rewards, dtype=torch.float32).unsqueeze(1),
        reward_weights=torch.ones(1),
        local_slice=slice(0, len(episodes)),
        group_size=sizes.pop(),
        tool_mask=tool_mask,
        turn_keys=keys if state_key is not None else None,
    )


def action_advantages(batch: AdvantageBatch, advantages: torch.Tensor) -> list[list[float]]:
    """Per episode of :func:`advantage_batch_from_trajectory_groups`, the advantage of each action token in order
    (the tokens with ``tool_mask`` 1), as :func:`cookbook_datums` takes them."""
    masks = batch.tool_mask.tolist() if batch.tool_mask is not None else None
    out = []
    for i, ids in enumerate(batch.completion_ids):
        row = advantages[i, : len(ids)].tolist()
        out.append([a for j, a in enumerate(row) if masks is None or masks[i][j]])
    return out


def _marked(traj: Any, where: str) -> tuple[Any, list[float]]:
    """The trajectory with each action token's logprob replaced by a marker ``-(k + 1)`` (``k``: its index among the
    trajectory's action tokens), and the real logprobs in that order. The cookbook's ``trajectory_to_data`` carries
    the markers to the datum positions it lays the tokens at, which is how :func:`_credited` finds them."""
    real: list[float] = []
    transitions = []
    for t, transition in enumerate(traj.transitions):
        tokens = list(transition.ac.tokens)
        if tokens and transition.ac.maybe_logprobs is None:
            raise ValueError(
                f"{where}, transition {t}: the action has no logprobs; importance_sampling and ppo need the sampler's "
                "logprob of every action token (sample with logprobs, as the cookbook's completers do)."
            )
        markers = [-float(len(real) + k + 1) for k in range(len(tokens))]
        real += [float(x) for x in transition.ac.maybe_logprobs or []]
        action = dataclasses.replace(transition.ac, maybe_logprobs=markers)
        transitions.append(dataclasses.replace(transition, ac=action))
    return dataclasses.replace(traj, transitions=transitions), real


def _credited(datum_: Datum, advantages: Sequence[float], real: Sequence[float]) -> Datum:
    """The cookbook's datum with the real logprobs and the per-token advantages at the positions its markers name
    (0 where the cookbook masks the token: observations, masked parse-error turns)."""
    markers = datum_.loss_fn_inputs["logprobs"].to_torch().tolist()
    mask = datum_.loss_fn_inputs["mask"].to_torch().tolist()
    index = [int(round(-m)) - 1 if m < 0 else -1 for m in markers]
    adv = [float(advantages[k]) if k >= 0 and w > 0 else 0.0 for k, w in zip(index, mask, strict=True)]
    logprobs = [float(real[k]) if k >= 0 else 0.0 for k in index]
    inputs = dict(datum_.loss_fn_inputs)
    inputs["advantages"] = TensorData.from_torch(torch.tensor(adv, dtype=torch.float32))
    inputs["logprobs"] = TensorData.from_torch(torch.tensor(logprobs, dtype=torch.float32))
    return dataclasses.replace(datum_, loss_fn_inputs=inputs)


def cookbook_datums(
    trajectory_groups: Sequence[Any],
    advantages: Sequence[Sequence[float]],
    *,
    include_provenance: bool = True,
) -> tuple[list[Datum], list[dict[str, int]]]:
    """The cookbook's ``assemble_training_data`` with per-token advantages: ``(datums, metadata)`` as it returns
    them (``metadata``: each datum's ``group_idx`` and ``traj_idx``).

    The datums are the cookbook's own (``trajectory_to_data``: one per run of observations that extend each other,
    its inputs, targets, ``mask`` and provenance); each action token's target carries its advantage from
    ``advantages`` (per trajectory in group order, one per action token: :func:`action_advantages`) and its
    sampled logprob. The cookbook's training loop drops ``mask`` before ``forward_backward``.
    """
    from tinker_cookbook.rl.data_processing import trajectory_to_data

    data, metadata = [], []
    flat = iter(advantages)
    for g, group in enumerate(trajectory_groups):
        for i, traj in enumerate(group.trajectories_G):
            advs = list(next(flat))
            count = sum(len(t.ac.tokens) for t in traj.transitions)
            if len(advs) != count:
                raise ValueError(
                    f"trajectory {i} of group {g} has {count} action tokens but {len(advs)} advantages were given."
                )
            marked, real = _marked(traj, f"trajectory {i} of group {g}")
            for d in trajectory_to_data(marked, 0.0, include_provenance=include_provenance):
                data.append(_credited(d, advs, real))
                metadata.append({"group_idx": g, "traj_idx": i})
    return data, metadata


def cookbook_training_data(
    trajectory_groups: Sequence[Any],
    estimator: AdvantageEstimator,
    *,
    state_key: Callable[[Any], Hashable] | None = None,
    whiten: bool | None = None,
    context: EstimatorContext | None = None,
) -> tuple[list[Datum], list[dict[str, int]], dict[str, float]]:
    """An estimator's per-token credit for cookbook trajectories, in place of the cookbook's
    ``compute_advantages`` + ``assemble_training_data``: ``(datums, metadata, metrics)``.

    Args:
        trajectory_groups: the cookbook's groups.
        estimator: an estimator that samples nothing (``"anchor"``, ``"grpo"``, ``"rloo"``, your own): the
            Tinker sampler is not behind mcadvantage's ``Sampler`` here.
        state_key: see :func:`advantage_batch_from_trajectory_groups`.
        whiten: token-weighted whitening (None: the estimator's ``whiten_by_default``).
        context: the estimator's context (default: one process, no sampler, no reward functions).
    """
    if estimator.uses_rollouts:
        raise ValueError(
            f"{type(estimator).__name__} samples continuations, which cookbook_training_data cannot do (no sampler); "
            "use an estimator that credits from the drawn trajectories, e.g. AnchorEstimator for turn credit."
        )
    batch = advantage_batch_from_trajectory_groups(trajectory_groups, state_key=state_key)
    context = context if context is not None else EstimatorContext.single_process(None, [], None)
    result = estimator.estimate(batch, context)
    advantages = finalize_advantages(
        result,
        loss_token_mask(batch.completion_mask, batch.tool_mask),
        whiten=estimator.whiten_by_default if whiten is None else whiten,
        estimator=type(estimator).__name__,
    )
    data, metadata = cookbook_datums(trajectory_groups, action_advantages(batch, advantages))
    metrics = {k: float(v) for k, v in result.metrics.items() if not math.isnan(v)}
    return data, metadata, metrics
