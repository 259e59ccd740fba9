"""What a reward may be, and the error that says which reward function broke the rule on which row.

The rule, for training responses and Monte Carlo rollouts alike (one rule, so the two can never disagree):

- a finite float is a reward;
- ``None`` or NaN means *unscorable* (TRL's semantics: ``GRPOTrainer`` turns ``None`` into NaN and sums rewards
  with ``nansum``). An unscorable training response gets advantage 0 and stays out of every statistic; an
  unscorable rollout counts 0, as a failed one;
- ``+inf`` / ``-inf`` is an error. No estimator can average it (one infinite rollout makes a state's value
  infinite and, after whitening, every advantage NaN, which destroys the weights at the next optimizer step), and
  silently turning it into something finite would hide a broken reward function. :class:`RewardFunctionError`
  names the function, the row and the value.

A reward function that *raises* is re-called row by row (only on that error path) to find the first row it fails
on, so the error names that row instead of a whole batch.

Written by hand because TRL neither checks for infinite rewards nor says which row a reward function failed on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "RewardFunctionError",
    "call_reward_func",
    "check_finite_reward_table",
    "check_finite_rewards",
    "describe_row",
    "locate_reward_error",
    "reward_error",
]

# Per-row keyword arguments a reward function receives besides the dataset columns; shared (not per row) ones
# such as TRL's trainer_state or log_extra are passed unchanged when a call is repeated row by row.
_ROW_ARGUMENTS = ("prompts", "completions", "completion_ids")


class RewardFunctionError(ValueError):
    """A reward function raised, or returned ``inf`` / ``-inf``, on one row.

    Attributes:
        func_name: the reward function's name (as TRL logs it: ``rewards/<name>``).
        row: the row of the call it failed on (the position in the batch it was called with), None when unknown
            (e.g. a reward model that failed on the whole batch).
    """

    def __init__(self, message: str, *, func_name: str, row: int | None) -> None:
        super().__init__(message)
        self.func_name = func_name
        self.row = row


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)  # repr: newlines and quotes stay visible on one line
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def describe_row(prompts: Sequence[Any] | None, completions: Sequence[Any] | None, row: int) -> str:
    """``prompt ... / completion ...`` of one row, shortened, for error messages."""
    parts = []
    if prompts is not None and row < len(prompts):
        parts.append(f"prompt {_short(prompts[row])!s}")
    if completions is not None and row < len(completions):
        parts.append(f"completion {_short(completions[row])!s}")
    return "; ".join(parts)


def check_finite_rewards(
    rewards: Sequence[float],
    func_name: str,
    *,
    where: str,
    prompts: Sequence[Any] | None = None,
    completions: Sequence[Any] | None = None,
) -> None:
    """Raise :class:`RewardFunctionError` at the first ``inf`` / ``-inf`` among one function's rewards.

    Args:
        rewards: the function's rewards for one call, one per row (NaN allowed: unscorable).
        func_name: the function's name.
        where: what was graded, for the message (e.g. ``"training responses"``, ``"Monte Carlo rollouts"``).
        prompts, completions: the call's rows, quoted (shortened) in the message.
    """
    for row, reward in enumerate(rewards):
        value = float(reward)
        if math.isinf(value):
            raise RewardFunctionError(
                f"reward function {func_name!r} returned {value} for row {row} of the {where} it graded "
                f"({describe_row(prompts, completions, row)}). An infinite reward cannot be averaged into values or "
                "advantages and would turn the weights to NaN. Return a finite reward, or None (NaN) for a response "
                "that cannot be scored (it then gets advantage 0, as in TRL).",
                func_name=func_name,
                row=row,
            )


def _failing_row(
    func: Callable[..., Any], kwargs: dict[str, Any], size: int
) -> tuple[int, BaseException] | None:
    """The first row a reward function raises on when called with that row alone, and its exception."""
    for row in range(size):
        single = {
            key: value[row : row + 1]
            if (key in _ROW_ARGUMENTS or _is_column(value, size)) and not isinstance(value, str)
            else value
            for key, value in kwargs.items()
        }
        try:
            func(**single)
        except Exception as err:  # noqa: BLE001 - any exception of the user's function is what we look for
            return row, err
    return None


def _is_column(value: Any, size: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == size


def reward_error(
    func: Callable[..., Any], func_name: str, err: BaseException, kwargs: dict[str, Any], *, where: str
) -> RewardFunctionError:
    """The :class:`RewardFunctionError` for ``func`` having raised ``err`` on a call with ``kwargs``: the call is
    repeated row by row (side effects included, only on this error path) to name the first row that fails alone."""
    completions = kwargs.get("completions")
    size = len(completions) if completions is not None else 0
    found = _failing_row(func, kwargs, size) if size > 1 else None
    row, cause = found if found is not None else (0 if size == 1 else None, err)
    if row is None:
        place = f"a batch of {size} {where} (no single row fails alone)"
    else:
        place = (
            f"row {row} of the {where} it graded ({describe_row(kwargs.get('prompts'), completions, row)})"
        )
    return RewardFunctionError(
        f"reward function {func_name!r} raised {type(cause).__name__}: {cause} on {place}. Fix the function, or make "
        "it return None for rows it cannot score (they then get advantage 0, as in TRL).",
        func_name=func_name,
        row=row,
    )


def call_reward_func(
    func: Callable[..., Any], func_name: str, kwargs: dict[str, Any], *, where: str
) -> list[float]:
    """Call a TRL-style reward function and return its rewards as floats (None -> NaN), raising
    :class:`RewardFunctionError` when it raises (naming the row) or returns ``inf`` / ``-inf``."""
    try:
        out = list(func(**kwargs))
    except RewardFunctionError:
        raise
    except Exception as err:
        raise reward_error(func, func_name, err, kwargs, where=where) from err
    rewards = [math.nan if r is None else float(r) for r in out]
    check_finite_rewards(
        rewards, func_name, where=where, prompts=kwargs.get("prompts"), completions=kwargs.get("completions")
    )
    return rewards


def check_finite_reward_table(
    rewards_per_func: torch.Tensor,
    func_names: Sequence[str],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    *,
    process_index: int,
) -> None:
    """Raise :class:`RewardFunctionError` at the first ``inf`` / ``-inf`` of a training batch's rewards, reward
    functions and reward models alike. NaN stays TRL's "unscorable".

    Args:
        rewards_per_func: ``(N, F)`` rewards of every process' responses (process 0's rows first, each process
            holding ``len(prompts)`` rows), one column per reward function.
        func_names: the reward functions' names, one per column.
        prompts, completions: this process' rows, quoted when the infinite reward is one of them.
        process_index: this process' index; a row of another process is named by its process.
    """
    import torch

    infinite = torch.isinf(rewards_per_func)
    if not bool(infinite.any()):
        return
    row, column = (int(i) for i in infinite.nonzero()[0])
    name = func_names[column]
    local = len(prompts)
    process, local_row = divmod(row, local) if local else (0, row)
    where = (
        describe_row(prompts, completions, local_row) if process == process_index else f"on process {process}"
    )
    raise RewardFunctionError(
        f"reward function {name!r} returned {float(rewards_per_func[row, column])} for row {row} of the training "
        f"batch ({where}). An infinite reward cannot be averaged into values or advantages and would turn the "
        "weights to NaN. Return a finite reward, or None (NaN) for a response that cannot be scored (it then gets "
        "advantage 0, as in TRL).",
        func_name=name,
        row=row,
    )


def locate_reward_error(
    reward_funcs: Iterable[tuple[Callable[..., Any], str]], kwargs: dict[str, Any], *, where: str
) -> RewardFunctionError | None:
    """After a batched reward call raised: the :class:`RewardFunctionError` of the first of ``reward_funcs`` that
    raises when called again with ``kwargs`` (naming its first failing row, :func:`reward_error`), or None when
    none does (the error was not a reward function's own).

    Args:
        reward_funcs: ``(function, name)`` pairs, the functions that can be called again synchronously.
        kwargs: the keyword arguments the batch was graded with.
        where: what was graded, for the message (e.g. ``"training responses"``).
    """
    for func, name in reward_funcs:
        try:
            func(**kwargs)
        except Exception as err:  # noqa: BLE001 - the user's function failing is what we look for
            return reward_error(func, name, err, kwargs, where=where)
    return None
