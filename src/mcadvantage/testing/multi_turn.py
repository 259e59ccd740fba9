"""The multi-turn part of the estimator contract check (:func:`~mcadvantage.testing.check_advantage_estimator`): a
hand-built batch of agent episodes, and the rules such a batch makes checkable (:data:`MULTI_TURN_RULES`).

The batch (:func:`multi_turn_batch`) is what GRPO's tool loop hands an estimator: two prompt groups of episodes with
one to three model turns, tool results inside the completions (``tool_mask`` 0 there), padding, rewards that differ
within each group, and ``turn_keys``: the state before each model turn, recurring across the episodes of a group and
at different turn indices (a state revisited later), as anchor states do. The tool results spell the next state's
name, so observation-keyed credit sees the same recurrences. For an estimator that draws trees
(:class:`~mcadvantage.estimators.base.DrawsTrees`) each group is a tree of its schedule, branching inside the first
model turn as the trainer draws it for agents.

Which estimators it covers: every estimator that reads the batch only (``uses_rollouts=False``), since those are
the ones handed multi-turn batches as they are. Estimators that sample continuations (``uses_rollouts=True``:
``"vineppo"``, ``"hybrid"``) are skipped, with the reason in the report: their multi-turn credit continues each
episode through its tool calls, which needs ``EstimatorContext.episodes`` (a live environment, parser and policy)
that a hand-built batch cannot give, and one without ``check_agent_support`` is refused agent episodes by the
trainer. Their turn credit is tested against live environments in the project's own suite.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = [
    "MULTI_TURN_RULES",
    "MultiTurnRuleBroken",
    "RenamedKey",
    "check_multi_turn",
    "multi_turn_batch",
    "multi_turn_skip_reason",
    "reads_turn_keys",
    "rename_keys",
    "reorder_within_groups",
    "with_unhashable_key",
]

#: The rules of the multi-turn part, in the order they are checked (each result first keeps the rules every result
#: keeps: shape, finite on the token mask, zero on padding, float metrics).
MULTI_TURN_RULES = (
    "accepts multi-turn episodes",
    "tool-result tokens: zero and outside the token mask",
    "finite on the model's tokens",
    "the same batch twice, the same advantages",
    "episodes reordered within a group, advantages reordered alike",
    "unhashable state keys refused with TypeError",
    "state keys renamed one-to-one, the same advantages",
)

#: Relative and absolute tolerance of the comparisons (a reordered batch sums in another order; a GPU critic may
#: differ in the last bits).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

# Per episode within a group (position j % 4): the states before its model turns. "start" recurs in every episode,
# r0 in two, r1 at turn 1 of one episode and turn 2 of another (a revisited state), e2 nowhere else.
_STATE_PLAN = (("start", "r0", "r1"), ("start", "r1"), ("start", "r0", "e2"), ("start",))
_REWARDS = (1.0, 0.0, 0.5, 0.25)


class RenamedKey:
    """A state key renamed by the check: equal (and hashing equal) exactly when its index is, every instance a new
    object, and every one printing alike, so an estimator that compares keys by identity, by ``str``/``repr`` or by
    type instead of by value gives other advantages."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RenamedKey) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("RenamedKey", self.index))

    def __repr__(self) -> str:
        return "RenamedKey"


def multi_turn_skip_reason(estimator: Any) -> str | None:
    """Why the multi-turn part does not apply to ``estimator`` (None: it applies)."""
    from mcadvantage.estimators.base import ContinuesEpisodes

    if not estimator.uses_rollouts:
        return None
    if isinstance(estimator, ContinuesEpisodes):
        return (
            "it samples continuations (uses_rollouts=True): its multi-turn credit continues each episode through "
            "its tool calls, which needs EstimatorContext.episodes (a live environment and policy) that a "
            "hand-built batch does not have"
        )
    return (
        "it samples continuations (uses_rollouts=True) and cannot continue episodes (no check_agent_support), so "
        "VinePPOTrainer refuses it agent episodes: it is never handed a multi-turn batch"
    )


def reads_turn_keys(estimator: Any) -> bool:
    """Whether ``estimator`` reads ``batch.turn_keys``: it matches
    :class:`~mcadvantage.estimators.base.ReadsStateKeys` with a source other than ``"observation"`` (which keys turns
    by their tool results' tokens and needs no keys)."""
    from mcadvantage.estimators import ReadsStateKeys

    return isinstance(estimator, ReadsStateKeys) and estimator.state_source != "observation"


def _episode_tokens(
    encode: Callable[[str], list[int]],
    eos: int,
    group: int,
    path: Sequence[int],
    levels: Sequence[tuple[int, int]],
    plan: Sequence[str],
) -> tuple[list[int], list[int]]:
    """One episode's completion ids and tool mask. The first turn's token ``p`` depends only on the tree path's
    children above it (``levels``: each position with its tree level; leaves of one node share their prefix); each
    tool result spells the next state."""
    letters = encode("abcdefghijklmnopqrstuvwxyz")
    first = [
        letters[(7 * group + 5 * sum(c * 3**k for k, c in enumerate(path[:level])) + 3 * level + p) % 26]
        for p, level in levels
    ]
    ids, mask = list(first), [1] * len(first)
    for state in plan[1:]:
        tool = encode(f"<{state}>")
        turn = encode(f"go{state[-1]}")
        ids += tool + turn
        mask += [0] * len(tool) + [1] * len(turn)
    return ids + [eos], mask + [1]


def _tree(estimator: Any, group_size: int, max_completion_length: int) -> tuple[Any, int]:
    """The tree schedule a group is drawn with (a one-level tree when the estimator draws none) and the length
    of the first model turn (past the last branch point: agents' trees branch in the first turn)."""
    from mcadvantage.estimators import DrawsTrees
    from mcadvantage.mc.tree import TreeSchedule

    if isinstance(estimator, DrawsTrees):
        schedule = estimator.tree_schedule(max_completion_length)
    else:
        schedule = TreeSchedule((group_size,), (0,))
    return schedule, max(4, schedule.depths[-1] + 3)


def multi_turn_batch(
    estimator: Any, tokenizer: Any, group_size: int, max_completion_length: int, device: Any
) -> Any:
    """The check's batch of agent episodes for ``estimator`` (see the module docstring): an
    :class:`~mcadvantage.estimators.AdvantageBatch` with ``tool_mask``, ``turn_keys`` and, for an estimator that
    draws trees, ``tree_paths``."""
    import torch

    from mcadvantage.estimators import AdvantageBatch, DrawsTrees
    from mcadvantage.mc.tree import TreePath

    schedule, first_len = _tree(estimator, group_size, max_completion_length)
    size = schedule.group_size

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    levels = [(p, sum(1 for d in schedule.depths if d <= p)) for p in range(first_len)]
    rows: list[dict[str, Any]] = []
    for group, j in itertools.product(range(2), range(size)):
        digits, rest = [], j
        for width in reversed(schedule.branching):
            digits.append(rest % width)
            rest //= width
        path = tuple(reversed(digits))
        plan = _STATE_PLAN[j % len(_STATE_PLAN)]
        ids, mask = _episode_tokens(encode, tokenizer.eos_token_id, group, path, levels, plan)
        prompt = f"{group}+{group}="
        rows.append(
            dict(
                prompt=prompt, ids=ids, mask=mask, reward=_REWARDS[j % 4] + 0.1 * group, path=path, keys=plan
            )
        )
    width = max(len(r["ids"]) for r in rows) + 1  # every row padded at least once
    completion_mask = torch.zeros(len(rows), width, dtype=torch.long)
    tool_mask = torch.ones(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        completion_mask[i, : len(r["ids"])] = 1
        tool_mask[i, : len(r["mask"])] = torch.tensor(r["mask"])
    return AdvantageBatch(
        prompt_ids=[encode(r["prompt"]) for r in rows],
        completion_ids=[r["ids"] for r in rows],
        completion_mask=completion_mask.to(device),
        rewards_per_func=torch.tensor([[r["reward"]] for r in rows], device=device),
        reward_weights=torch.tensor([1.0], device=device),
        local_slice=slice(0, len(rows)),
        group_size=size,
        prompts=[r["prompt"] for r in rows],
        rows=[{"prompt": r["prompt"]} for r in rows],
        tree_paths=(
            [TreePath(r["path"], schedule.depths, schedule.branching) for r in rows]
            if isinstance(estimator, DrawsTrees)
            else None
        ),
        tool_mask=tool_mask.to(device),
        turn_keys=[[("state", name) for name in r["keys"]] for r in rows],
    )


def reorder_within_groups(batch: Any) -> tuple[Any, list[int]]:
    """``batch`` with each group's episodes in reverse order (everything of an episode moves with it), and for each
    new row the old row it holds."""
    import torch

    n, size = len(batch.completion_ids), batch.group_size
    order = [g + size - 1 - k for g in range(0, n, size) for k in range(size)]
    index = torch.tensor(order)

    def pick(seq: Sequence[Any] | None) -> list[Any] | None:
        return None if seq is None else [seq[i] for i in order]

    moved = copy.copy(batch)
    moved.prompt_ids, moved.completion_ids = pick(batch.prompt_ids), pick(batch.completion_ids)
    moved.completion_mask = batch.completion_mask[index.to(batch.completion_mask.device)]
    moved.rewards_per_func = batch.rewards_per_func[index.to(batch.rewards_per_func.device)]
    moved.tool_mask = batch.tool_mask[index.to(batch.tool_mask.device)]
    moved.prompts, moved.rows = pick(batch.prompts), pick(batch.rows)
    moved.tree_paths, moved.turn_keys = pick(batch.tree_paths), pick(batch.turn_keys)
    return moved, order


def rename_keys(batch: Any) -> Any:
    """``batch`` with every state key replaced one-to-one by a :class:`RenamedKey` (a new object per turn)."""
    names: dict[Hashable, int] = {}
    renamed = copy.copy(batch)
    renamed.turn_keys = [[RenamedKey(names.setdefault(k, len(names))) for k in ks] for ks in batch.turn_keys]
    return renamed


def with_unhashable_key(batch: Any) -> Any:
    """``batch`` with one state key (the second turn of the first episode that has one) turned into a list."""
    broken = copy.copy(batch)
    broken.turn_keys = [list(ks) for ks in batch.turn_keys]
    row = next(i for i, ks in enumerate(broken.turn_keys) if len(ks) > 1)
    broken.turn_keys[row][1] = list(broken.turn_keys[row][1])
    return broken


# ---------------------------------------------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------------------------------------------


class MultiTurnRuleBroken(Exception):
    """A rule of :data:`MULTI_TURN_RULES` broken (the contract check turns it into an ``EstimatorContractError``)."""

    def __init__(self, rule: str, detail: str) -> None:
        self.rule, self.detail = rule, detail
        super().__init__(f"{rule}: {detail}")


def check_multi_turn(
    estimator: Any, context: Any, batch: Any, check_result: Callable[[Any, Any], Any]
) -> tuple[str, ...]:
    """Check ``estimator`` on the multi-turn ``batch`` (:func:`multi_turn_batch`): every call on a copy of it
    (``copy.deepcopy``: the estimator itself is left as it was), each result through ``check_result`` (the rules
    every result keeps) and then the rules of :data:`MULTI_TURN_RULES`.

    Returns:
        the rules checked (the state-key rules only for an estimator that reads ``turn_keys``).

    Raises:
        MultiTurnRuleBroken: naming the broken rule and what was found.
    """
    first = _copy(estimator)
    snapshot = copy.deepcopy(batch)
    base = _run(first, batch, context, check_result)
    _check_tool_tokens(batch, base)
    _check_model_tokens(batch, base)
    changed = _changed_field(snapshot, batch)
    rule = MULTI_TURN_RULES[3]
    if changed is not None:
        raise MultiTurnRuleBroken(
            rule, f"estimate() changed the batch's {changed} in place; leave the batch as given."
        )
    # A stateless estimator answers the same batch the same twice; one with state, from the same state.
    again = _run(_copy(estimator) if estimator.has_state else first, batch, context, check_result)
    _compare(
        rule, base, again, list(range(len(batch.completion_ids))), "on a second call with the same batch"
    )
    rule = MULTI_TURN_RULES[4]
    moved, order = reorder_within_groups(batch)
    result = _run(_copy(estimator), moved, context, check_result)
    _compare(
        rule,
        result,
        base,
        order,
        "with each group's episodes in reverse order (row k holds old row order[k])",
    )
    if not reads_turn_keys(estimator):
        return MULTI_TURN_RULES[:5]
    _check_unhashable(_copy(estimator), with_unhashable_key(batch), context)
    renamed = _run(_copy(estimator), rename_keys(batch), context, check_result)
    _compare(
        MULTI_TURN_RULES[6], renamed, base, list(range(len(batch.completion_ids))), "with the keys renamed"
    )
    return MULTI_TURN_RULES


def _copy(estimator: Any) -> Any:
    try:
        return copy.deepcopy(estimator)
    except Exception as err:
        raise MultiTurnRuleBroken(
            MULTI_TURN_RULES[0],
            f"the check runs each multi-turn batch on a copy of the estimator and copy.deepcopy raised "
            f"{type(err).__name__}: {err}. Make it deep-copyable (or define __deepcopy__), or pass multi_turn=False.",
        ) from err


def _run(estimator: Any, batch: Any, context: Any, check_result: Callable[[Any, Any], Any]) -> Any:
    try:
        result = estimator.estimate(batch, context)
    except Exception as err:
        raise MultiTurnRuleBroken(
            MULTI_TURN_RULES[0],
            f"estimate() raised {type(err).__name__}: {err} on a batch of multi-turn episodes (batch.tool_mask 0 on "
            "tool results inside the completions, batch.turn_keys per model turn), which VinePPOTrainer hands every "
            "estimator that reads the batch only under tools=, environment_factory= and rollout_func=.",
        ) from err
    check_result(batch, result)
    return result


def _check_tool_tokens(batch: Any, result: Any) -> None:
    mask = batch.completion_mask.bool()
    tool = mask & ~batch.tool_mask.to(mask.device).bool()
    advantages = result.advantages.to(mask.device)
    credited = tool & (advantages != 0)
    rule = MULTI_TURN_RULES[1]
    if bool(credited.any()):
        rows = sorted({int(r) for r in credited.nonzero()[:, 0]})
        raise MultiTurnRuleBroken(
            rule,
            f"{int(credited.sum())} of {int(tool.sum())} tool-result tokens (tool_mask 0; rows {rows}) have a "
            "non-zero advantage: the model did not choose them. Multiply by "
            "mcadvantage.core.advantages.loss_token_mask(completion_mask, tool_mask).",
        )
    if result.token_mask is None:
        raise MultiTurnRuleBroken(
            rule,
            f"token_mask is None, so the {int(tool.sum())} tool-result tokens count in the whitening statistics; "
            "return token_mask=loss_token_mask(completion_mask, tool_mask).bool() (the model's tokens).",
        )
    inside = tool & result.token_mask.to(mask.device).bool()
    if bool(inside.any()):
        raise MultiTurnRuleBroken(
            rule,
            f"{int(inside.sum())} tool-result tokens are inside token_mask and would count in the whitening "
            "statistics; leave tool_mask 0 out of token_mask.",
        )


def _check_model_tokens(batch: Any, result: Any) -> None:
    import torch

    mask = batch.completion_mask.bool()
    model = mask & batch.tool_mask.to(mask.device).bool()
    bad = model & ~torch.isfinite(result.advantages.to(mask.device))
    if bool(bad.any()):
        rows = sorted({int(r) for r in bad.nonzero()[:, 0]})
        raise MultiTurnRuleBroken(
            MULTI_TURN_RULES[2],
            f"{int(bad.sum())} of the model's tokens (completion_mask * tool_mask; rows {rows}) have non-finite "
            "advantages, inside or outside token_mask: the loss multiplies them by a mask, and NaN * 0 is NaN. Give "
            "tokens you cannot credit 0.",
        )


def _check_unhashable(estimator: Any, batch: Any, context: Any) -> None:
    rule = MULTI_TURN_RULES[5]
    try:
        estimator.estimate(batch, context)
    except TypeError:
        return
    except Exception as err:
        raise MultiTurnRuleBroken(
            rule, f"a list among batch.turn_keys raised {type(err).__name__} ({err}), not TypeError."
        ) from err
    raise MultiTurnRuleBroken(
        rule,
        "a list among batch.turn_keys was accepted. A state key identifies a state by value and must be hashable: "
        "refuse one that is not with a TypeError naming the fix (mcadvantage.core.anchors.check_state_keys does).",
    )


def _changed_field(before: Any, after: Any) -> str | None:
    """The first field of the batch that differs between ``before`` (a deep copy) and ``after``, or None."""
    import torch

    for name in ("completion_mask", "tool_mask", "rewards_per_func", "reward_weights"):
        if not torch.equal(getattr(before, name), getattr(after, name)):
            return name
    for name in ("prompt_ids", "completion_ids", "turn_keys", "tree_paths"):
        if getattr(before, name) != getattr(after, name):
            return name
    return None


def _compare(rule: str, got: Any, expected: Any, order: Sequence[int], how: str) -> None:
    """Raise ``rule`` unless ``got`` row ``k`` equals ``expected`` row ``order[k]`` (advantages within
    :data:`TOLERANCE`, token masks exactly)."""
    import torch

    index = torch.tensor(list(order), device=expected.advantages.device)
    want = expected.advantages[index].float()
    have = got.advantages.to(want.device).float()
    close = torch.isclose(have, want, **TOLERANCE) | (have == want)
    if not bool(close.all()):
        rows = sorted({int(r) for r in (~close).nonzero()[:, 0]})
        gap = float((have - want).abs()[~close].max())
        raise MultiTurnRuleBroken(
            rule, f"the advantages differ {how}: rows {rows}, by up to {gap:.3g} (tolerance {TOLERANCE})."
        )
    masks = (got.token_mask, expected.token_mask)
    if (masks[0] is None) != (masks[1] is None) or (
        masks[0] is not None
        and not torch.equal(masks[0].to(index.device).bool(), masks[1].to(index.device)[index].bool())
    ):
        raise MultiTurnRuleBroken(rule, f"token_mask differs {how}.")
