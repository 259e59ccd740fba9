"""Checks ``VinePPOTrainer`` runs on its arguments before loading a model, so a bad input fails at once with the
parameter, the value and the fix, not mid-training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

__all__ = ["check_dataset_columns", "check_reward_funcs", "check_unsupported_kwargs", "reward_func_name"]


def reward_func_name(func: Any) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def check_unsupported_kwargs(kwargs: dict[str, Any]) -> None:
    for unsupported in ("tools", "rollout_func", "environment_factory"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(
                f"VinePPOTrainer does not support {unsupported}=: Monte Carlo continuations are plain generations "
                "from a prefix, so tool calls or environment steps inside a response could not be replayed. Use "
                f"trl.GRPOTrainer for {unsupported}, or drop it."
            )


def check_reward_funcs(reward_funcs: Any) -> list[Any]:
    """The reward functions as a list (reward models and async functions included: they grade rollouts through
    :func:`~mcadvantage.rewards.models.as_rollout_reward_func`)."""
    if reward_funcs is None:
        raise ValueError(
            "No reward source provided (reward_funcs is None; GRPOTrainer's message): VinePPO grades every response and Monte Carlo continuation with reward functions "
            "or reward models. Pass e.g. mcadvantage.GSM8KVerifier(), a function f(prompts, completions, **kw), or "
            "a reward model id."
        )
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError(
            "No reward source provided (reward_funcs is empty; GRPOTrainer's message): pass at least one reward "
            "function or reward model."
        )
    for func in funcs:
        if not (isinstance(func, (str, nn.Module)) or callable(func)):
            raise TypeError(
                f"reward function {func!r} is neither callable, a reward model (nn.Module) nor a model id; pass a "
                "function f(prompts, completions, **kw) -> list[float]."
            )
    return funcs


def _required_column_options(func: Any) -> list[tuple[str, ...]]:
    """Columns a reward function needs, as groups of alternatives (each tuple needs one of its columns): its
    ``required_columns`` when declared (mcadvantage verifiers do), else the ``answer_field`` /
    ``solution_field`` convention; plain functions declare nothing."""
    declared = getattr(func, "required_columns", None)
    if declared is not None:
        if isinstance(declared, str):
            return [(declared,)]
        return [tuple(group) if isinstance(group, (tuple, list)) else (group,) for group in declared]
    fields = tuple(
        f
        for f in (getattr(func, "answer_field", None), getattr(func, "solution_field", None))
        if isinstance(f, str)
    )
    return [fields] if fields else []  # reward models and plain functions declare nothing


def check_dataset_columns(dataset: Any, reward_funcs: Sequence[Any], dataset_name: str) -> None:
    """Fail when a dataset (or each dataset of a dict) lacks ``prompt`` or a column a reward function needs."""
    if isinstance(dataset, dict):
        for key, part in dataset.items():
            check_dataset_columns(part, reward_funcs, f"{dataset_name}[{key!r}]")
        return
    columns = getattr(dataset, "column_names", None)
    if (
        dataset is None or columns is None
    ):  # e.g. an IterableDataset without features: the verifier checks rows
        return
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(
            f"{dataset_name} has 0 rows, so there is nothing to train or evaluate on (a filter or split may have removed "
            "every row). Pass a dataset with at least one prompt."
        )
    columns = set(columns)
    if "prompt" not in columns:
        raise ValueError(
            f"{dataset_name} has no 'prompt' column (columns: {sorted(columns)}). VinePPOTrainer, like GRPOTrainer, "
            "needs prompts in a 'prompt' column: rename yours with dataset.rename_column(...)."
        )
    for func in reward_funcs:
        for group in _required_column_options(func):
            if not columns.intersection(group):
                need = repr(group[0]) if len(group) == 1 else "one of " + ", ".join(repr(c) for c in group)
                raise ValueError(
                    f"Reward function {reward_func_name(func)!r} needs the dataset column {need}, but {dataset_name} "
                    f"has only {sorted(columns)}. Add the column, rename it (e.g. dataset.rename_column('gold', "
                    "'answer')), or build the verifier with answer_field=<your column>."
                )
