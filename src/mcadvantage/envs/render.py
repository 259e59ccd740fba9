"""Text for gymnasium's grid games: the board as characters, the action names, and a one-paragraph rule text.

Each known game (matched by its unwrapped class: ``FrozenLakeEnv``, ``TaxiEnv``, ``CliffWalkingEnv``) has a
:class:`GameText`: ``render(unwrapped_env, observation) -> str`` draws the board the observation stands for (one
line per row), ``actions`` names the discrete actions in the environment's order, and ``rules`` says what the board's
characters mean and what the goal is (it goes into the prompt once, not into every observation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GameText", "game_text", "render_cliff_walking", "render_frozen_lake", "render_taxi"]


@dataclass(frozen=True)
class GameText:
    """How one game reads as text: its board renderer, its action names (in action-index order), its rules."""

    render: Callable[[Any, Any], str]
    actions: tuple[str, ...]
    rules: str


def _cell(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def render_frozen_lake(env: Any, observation: Any) -> str:
    """FrozenLake's map (``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal) with ``P`` where the player stands."""
    rows = [[_cell(c) for c in row] for row in env.desc]
    ncol = len(rows[0])
    r, c = divmod(int(observation), ncol)
    rows[r][c] = "P"
    return "\n".join("".join(row) for row in rows)


_TAXI_STOPS = "RGYB"


def render_taxi(env: Any, observation: Any) -> str:
    """Taxi's map (walls ``|``, stops ``R G Y B``) with ``T`` for the taxi, then where the passenger and the
    destination are."""
    taxi_row, taxi_col, passenger, destination = env.decode(int(observation))
    rows = [[_cell(c) for c in row] for row in env.desc]
    rows[1 + taxi_row][2 * taxi_col + 1] = "T"
    where = "in the taxi" if passenger == 4 else f"waiting at {_TAXI_STOPS[passenger]}"
    board = "\n".join("".join(row) for row in rows)
    return f"{board}\nPassenger: {where}. Destination: {_TAXI_STOPS[destination]}."


def render_cliff_walking(env: Any, observation: Any) -> str:
    """CliffWalking's grid (``.`` ground, ``C`` cliff, ``S`` start, ``G`` goal) with ``P`` where the player stands."""
    nrow, ncol = env.shape
    rows = [["C" if env._cliff[r][c] else "." for c in range(ncol)] for r in range(nrow)]
    rows[nrow - 1][0], rows[nrow - 1][ncol - 1] = "S", "G"
    r, c = divmod(int(observation), ncol)
    rows[r][c] = "P"
    return "\n".join("".join(row) for row in rows)


_GAMES: dict[str, GameText] = {
    "FrozenLakeEnv": GameText(
        render_frozen_lake,
        ("left", "down", "right", "up"),
        "FrozenLake: walk from S to the goal G over the frozen lake without falling into a hole. The board: P you, "
        "S start, F frozen ice, H hole, G goal. The ice may be slippery: a move can slide you sideways. Reward 1 for "
        "reaching G, else 0.",
    ),
    "TaxiEnv": GameText(
        render_taxi,
        ("south", "north", "east", "west", "pickup", "dropoff"),
        "Taxi: drive the taxi T to the passenger, pick them up, drive to the destination and drop them off. The "
        "board: T taxi, R G Y B the stops, | a wall, : no wall. Reward 20 for a correct drop-off, -10 for a wrong "
        "pickup or drop-off, -1 per other step.",
    ),
    "CliffWalkingEnv": GameText(
        render_cliff_walking,
        ("up", "right", "down", "left"),
        "CliffWalking: walk from S to G. The board: P you, . ground, C cliff, S start, G goal. Each step costs -1; "
        "stepping onto the cliff costs -100 and sends you back to S.",
    ),
}


def game_text(unwrapped: Any) -> GameText | None:
    """The known game text of an environment (by its unwrapped class's name), None for other environments."""
    return _GAMES.get(type(unwrapped).__name__)


def known_games() -> Sequence[str]:
    """The unwrapped class names that have a built-in text."""
    return tuple(_GAMES)
