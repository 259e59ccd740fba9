"""Tree sampling: a prompt's group drawn as a tree, and step credit from the tree's own leaves.

Instead of ``G`` independent responses, the group is grown level by level (TreeRL / TreePO / TEMPO): ``b_1``
children are sampled from the prompt up to token depth ``d_2``, each open child gets ``b_2`` children up to ``d_3``,
and so on; the last level runs to the end. Every leaf is a training response, shared prefixes are generated once
(the group costs fewer sampled tokens than ``G`` independent responses), and every branch point's value comes from
the leaves below it, so each segment between branch points gets step credit with no extra rollouts:

    A(segment k of leaf i) = Q(node k+1) - mean of Q(c) over the other design children c of node k
    Q(node) = mean of Q(c) over the node's design children;  Q(leaf) = its reward

**Why this is unbiased.** A branch point is a fixed token depth, so whether a response reaches it depends on its
prefix only; the children of a node are independent samples from it. Every design child is therefore an unbiased
draw of the node's value, and the mean over them (equal weights, not weighted by how many leaves sit below each)
is unbiased too. A segment's baseline is made of its *siblings* only, which are independent of the segment, so it
adds no covariance with the segment's own outcome; ``Q(node k+1)`` includes the leaf's own outcome, an unbiased
estimate of the segment's action value (as REINFORCE's return is).

**Exactly ``G`` leaves.** A child that ends before the next depth (EOS, or the length limit) is a leaf at once; the
leaves it does not use are handed to its open siblings (evenly, the first ones get the remainder), and when every
child of a node ends early the node samples the missing leaves directly, as *top-up* children. A top-up child trains
and gets the node's full design-children baseline, but counts in no value: the number of top-ups depends on the
design children's outcomes, and a mean over a sample size chosen by outcome would be biased.

**What the tree changes in the gradient.** A shared segment trains once per leaf below it. When no child ends
early every node of a level has the same number of leaves, so each level's segments carry the same total weight as
``G`` independent responses do; early endings move weight between segments (a known property of tree sampling,
stated rather than corrected).

Pure functions on plain lists, with the sampling in :func:`draw_trees` (any
:class:`~mcadvantage.samplers.Sampler`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcadvantage.samplers.base import RolloutRequest

__all__ = ["TreeSchedule", "TreePath", "TreeGroup", "draw_trees", "tree_node_values", "tree_advantages"]


@dataclass(frozen=True)
class TreeSchedule:
    """How a group is drawn: ``branching[k]`` children per node of level ``k``, level ``k`` starting at token depth
    ``depths[k]`` of the completion (``depths[0] == 0``: the prompt).

    ``math.prod(branching)`` is the group size; every factor is at least 2 (a node needs a sibling to compare with).
    """

    branching: tuple[int, ...]
    depths: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.branching or any(int(b) < 2 for b in self.branching):
            raise ValueError(
                f"tree_branching={list(self.branching)!r}: every level needs at least 2 children (a branch point's "
                "baseline is its other children), e.g. [4, 2]."
            )
        if len(self.depths) != len(self.branching):
            raise ValueError(
                f"tree_depths={list(self.depths)!r} must give one token depth per level of tree_branching="
                f"{list(self.branching)!r} (the first is 0, the prompt)."
            )
        if self.depths[0] != 0 or any(b <= a for a, b in zip(self.depths, self.depths[1:], strict=False)):
            raise ValueError(
                f"tree_depths={list(self.depths)!r} must start at 0 and increase strictly (token depths where each "
                "level branches), e.g. [0, 16]."
            )

    @property
    def group_size(self) -> int:
        return math.prod(self.branching)

    @classmethod
    def build(
        cls, branching: Sequence[int], depths: Sequence[int] | None, max_completion_length: int
    ) -> TreeSchedule:
        """The schedule of the settings ``tree_branching`` / ``tree_depths``; depths ``None`` spread the branch
        points evenly over the first half of ``max_completion_length`` (``[4, 2]`` and 64 tokens: ``[0, 32]``)."""
        levels = len(branching)
        if depths is None:
            half = max_completion_length // 2
            depths = [round(k * half / max(1, levels - 1)) for k in range(levels)]
        schedule = cls(tuple(int(b) for b in branching), tuple(int(d) for d in depths))
        if schedule.depths[-1] >= max_completion_length:
            raise ValueError(
                f"tree_depths={list(schedule.depths)!r}: the last branch depth must be below max_completion_length="
                f"{max_completion_length}, or its children have no room."
            )
        return schedule


@dataclass(frozen=True)
class TreePath:
    """Where a leaf sits in its group's tree: at node ``k`` of its path (node 0 is the prompt) it took child
    ``children[k]``; node ``k`` starts at token ``offsets[k]`` of the completion and has ``widths[k]`` design
    children (children ``>= widths[k]`` are top-ups, which count in no value)."""

    children: tuple[int, ...]
    offsets: tuple[int, ...]
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (len(self.children) == len(self.offsets) == len(self.widths)) or not self.children:
            raise ValueError(
                f"TreePath: children, offsets and widths must be non-empty and equally long: {self}."
            )


@dataclass
class TreeGroup:
    """One prompt's tree: its leaves (completion token ids), their paths, and the tokens generated to draw it."""

    completions: list[list[int]]
    paths: list[TreePath]
    generated_tokens: int


@dataclass
class _Node:
    group: int
    children: tuple[int, ...]  # the path to this node
    offsets: tuple[int, ...]  # offsets of the nodes on the path, this node's last
    widths: tuple[int, ...]  # design widths of the nodes above this one
    ids: list[int]
    need: int  # leaves this node must produce


def _request(prompt_ids: Sequence[Sequence[int]], node: _Node, n: int, stop: int) -> RolloutRequest:
    """``n`` continuations of ``node`` (its prompt and the tokens down to it), ending by completion token ``stop``."""
    return RolloutRequest(
        prefix_ids=tuple(prompt_ids[node.group]) + tuple(node.ids), n=n, max_tokens=stop - len(node.ids)
    )


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if j < extra else 0) for j in range(parts)]


def draw_trees(
    sampler: Any, prompt_ids: Sequence[Sequence[int]], schedule: TreeSchedule, max_completion_length: int
) -> list[TreeGroup]:
    """Draw one tree per prompt with ``sampler`` (one ``sample`` call per level for all prompts); each tree has
    exactly ``schedule.group_size`` leaves, in depth-first order of their paths."""
    leaves: list[list[tuple[list[int], TreePath]]] = [[] for _ in prompt_ids]
    generated = [0] * len(prompt_ids)
    level_nodes = [_Node(g, (), (0,), (), [], schedule.group_size) for g in range(len(prompt_ids))]
    for level in range(len(schedule.branching)):
        last = level == len(schedule.branching) - 1
        stop = max_completion_length if last else schedule.depths[level + 1]
        # A node at its last level samples every leaf it needs; above, its design width (fewer if it needs fewer).
        widths = [node.need if last else min(schedule.branching[level], node.need) for node in level_nodes]
        requests = [_request(prompt_ids, node, n, stop) for node, n in zip(level_nodes, widths, strict=True)]
        results = sampler.sample(requests) if requests else []
        next_nodes: list[_Node] = []
        # (node, first top-up child index, count, the path widths its top-ups record)
        topups: list[tuple[_Node, int, int, tuple[int, ...]]] = []
        for node, width, conts in zip(level_nodes, widths, results, strict=True):
            path_widths = (*node.widths, min(schedule.branching[level], width))
            open_children: list[tuple[int, list[int]]] = []
            for j, cont in enumerate(conts):
                ids = node.ids + list(cont.token_ids)
                generated[node.group] += len(cont.token_ids)
                ended = last or not cont.truncated or len(ids) >= max_completion_length
                if ended:
                    leaves[node.group].append((ids, TreePath((*node.children, j), node.offsets, path_widths)))
                else:
                    open_children.append((j, ids))
            remaining = node.need - (len(conts) - len(open_children))
            if remaining <= 0:
                continue
            if not open_children:  # every child ended early: the node samples the missing leaves itself
                topups.append((node, len(conts), remaining, path_widths))
                continue
            for (j, ids), need in zip(open_children, _split(remaining, len(open_children)), strict=True):
                next_nodes.append(
                    _Node(node.group, (*node.children, j), (*node.offsets, len(ids)), path_widths, ids, need)
                )
        if topups:
            results = sampler.sample(
                [_request(prompt_ids, node, count, max_completion_length) for node, _, count, _ in topups]
            )
            for (node, first, _, path_widths), conts in zip(topups, results, strict=True):
                for j, cont in enumerate(conts, start=first):
                    generated[node.group] += len(cont.token_ids)
                    path = TreePath((*node.children, j), node.offsets, path_widths)
                    leaves[node.group].append((node.ids + list(cont.token_ids), path))
        level_nodes = next_nodes
    groups = []
    for g, found in enumerate(leaves):
        found.sort(key=lambda leaf: leaf[1].children)
        groups.append(TreeGroup([ids for ids, _ in found], [path for _, path in found], generated[g]))
    return groups


def tree_node_values(paths: Sequence[TreePath], rewards: Sequence[float]) -> dict[tuple[int, ...], float]:
    """``Q`` of every node of one tree (keyed by its path of child indexes; leaves included): a leaf's reward, an
    inner node's mean over its design children."""
    if len(paths) != len(rewards):
        raise ValueError(f"tree_node_values: {len(paths)} paths but {len(rewards)} rewards.")
    values: dict[tuple[int, ...], float] = {p.children: float(r) for p, r in zip(paths, rewards, strict=True)}
    widths: dict[tuple[int, ...], int] = {}
    for p in paths:
        for k in range(len(p.children)):
            widths[p.children[:k]] = p.widths[k]
    # Deepest nodes first, so a node's children are known before it.
    for node in sorted(widths, key=len, reverse=True):
        kids = [values[(*node, j)] for j in range(widths[node]) if (*node, j) in values]
        if len(kids) != widths[node]:
            raise ValueError(
                f"tree_node_values: node {node} has {len(kids)} of its {widths[node]} design children."
            )
        values[node] = sum(kids) / len(kids)
    return values


def tree_advantages(
    paths: Sequence[TreePath], rewards: Sequence[float], lengths: Sequence[int]
) -> tuple[list[torch.Tensor], list[list[float]]]:
    """Per-token advantages of one tree's leaves (see the module docstring) and, per leaf, the values ``Q`` of the
    nodes on its path followed by its reward (the state values a diagnostics reader expects)."""
    values = tree_node_values(paths, rewards)
    out: list[torch.Tensor] = []
    path_values: list[list[float]] = []
    for p, length in zip(paths, lengths, strict=True):
        adv = torch.zeros(length, dtype=torch.float32)
        bounds = [*p.offsets, length]
        for k in range(len(p.children)):
            node, child = p.children[:k], p.children[k]
            siblings = [values[(*node, j)] for j in range(p.widths[k]) if j != child]
            baseline = sum(siblings) / len(siblings)
            adv[bounds[k] : bounds[k + 1]] = values[p.children[: k + 1]] - baseline
        out.append(adv)
        path_values.append([values[p.children[:k]] for k in range(len(p.children))] + [values[p.children]])
    return out, path_values
