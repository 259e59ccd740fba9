"""Multi-turn episodes on the credit side: where their states are (pure functions on a tool mask).

An episode of TRL's tool loop (``tools=`` / ``environment_factory=``, or a ``rollout_func``'s ``env_mask``) is one
completion whose tokens alternate between the model's own turns (``tool_mask`` 1) and tool or environment results
(``tool_mask`` 0). **States** sit at turn boundaries (the first token of each model turn, i.e. right after a tool
result) and, through the step segmenter, at step boundaries inside the model's own turns
(:func:`episode_step_boundaries`). A tool result never starts a state and never forms a step: the last step of a turn
runs from its last boundary through the tool result to the next turn, so its value change includes what the
environment answered; its tokens get no credit (the estimator zeroes them).

What touches environments (their rebuild at a state, the tool loop that continues an episode) is in
:mod:`mcadvantage.agents.rebuild` and :mod:`mcadvantage.agents.tool_loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["episode_step_boundaries", "model_spans", "tool_spans", "tool_turns_before", "turn_spans"]


def _runs(tool_mask: Sequence[int], value: int) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate(tool_mask):
        if int(m) == value and start is None:
            start = i
        elif int(m) != value and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(tool_mask)))
    return spans


def model_spans(tool_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of the model's own turns: the maximal runs of ``tool_mask`` 1."""
    return _runs(tool_mask, 1)


def tool_spans(tool_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of the tool results: the maximal runs of ``tool_mask`` 0 (one per tool-calling round)."""
    return _runs(tool_mask, 0)


def turn_spans(tool_mask: Sequence[int] | None, length: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each model turn of a completion of ``length`` tokens: the runs of ``tool_mask`` 1
    (:func:`model_spans`), or the whole completion for a single-turn response."""
    if tool_mask is None:
        return [(0, length)] if length else []
    return model_spans(list(tool_mask)[:length])


def tool_turns_before(tool_mask: Sequence[int], position: int) -> int:
    """How many tool results the episode holds before token ``position`` (the tool rounds a state there has seen)."""
    return sum(1 for _, end in tool_spans(tool_mask) if end <= position)


def episode_step_boundaries(
    tool_mask: Sequence[int], turn_step_boundaries: Callable[[int, int], Sequence[int]] | None = None
) -> list[int]:
    """Step boundaries ``0 = b_0 < ... < b_n = len(tool_mask)`` of an episode, as
    :class:`~mcadvantage.mc.trajectory.Trajectory` takes them.

    Args:
        tool_mask: TRL's tool mask of the completion (1: the model's token, 0: a tool result's).
        turn_step_boundaries: ``(start, end) -> boundaries`` of the step segmenter inside one model turn, absolute
            positions strictly inside ``(start, end)`` (None: one step per turn).

    Returns:
        The first token of every model turn (the states after each tool result; the first turn starts at 0), the
        segmenter's boundaries inside the turns, and the episode's end. Never a position inside or at the start of a
        tool result.

    Raises:
        ValueError: an episode that starts with a tool result (a completion must start with the model's turn), or a
            segmenter boundary outside its turn.
    """
    length = len(tool_mask)
    if length == 0:
        return [0]
    if int(tool_mask[0]) != 1:
        raise ValueError(
            "episode_step_boundaries: the completion starts with a tool result (tool_mask[0] = 0); an episode starts "
            "with the model's turn. Pass TRL's tool_mask of the whole completion."
        )
    bounds = set()
    for start, end in model_spans(tool_mask):
        bounds.add(start)
        for b in turn_step_boundaries(start, end) if turn_step_boundaries is not None else ():
            if not start < b < end:
                raise ValueError(
                    f"episode_step_boundaries: segmenter boundary {b} lies outside its turn [{start}, {end}); "
                    "boundaries inside a turn must be absolute positions strictly inside it."
                )
            bounds.add(int(b))
    bounds.discard(length)
    return sorted(bounds) + [length]
