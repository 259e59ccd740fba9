"""Checks ``VinePPOTrainer`` runs on its arguments before loading a model, so a bad input fails at once with the
parameter, the value and the fix, not mid-training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from mcadvantage.estimators.base import AdvantageEstimator
    from mcadvantage.trainer.config import VinePPOConfig

__all__ = [
    "AGENT_KWARGS",
    "check_agent_kwargs",
    "check_dataset_columns",
    "check_engine_settings",
    "check_reward_funcs",
    "check_rewards_and_datasets",
    "check_trainer_args",
    "reward_func_name",
]


def reward_func_name(func: Any) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


#: The ``GRPOTrainer`` arguments that make an episode more than one generation: a tool loop, environments, or the
#: user's own rollout. GRPO's own advantages pass them through (VinePPOTrainer keeps GRPO's loop); ``"vineppo"`` and
#: ``"hybrid"`` continue tool and environment episodes through their tool calls (Monte Carlo credit per turn);
#: ``"tree"`` branches inside the first model turn and lets GRPO's tool loop finish every leaf. Only ``rollout_func``
#: stays refused by those three (its episodes cannot be resumed from a prefix, and its rollout never reaches the
#: generation a tree is drawn in).
AGENT_KWARGS = ("tools", "environment_factory", "rollout_func")


def check_agent_kwargs(
    kwargs: dict[str, Any], estimator: AdvantageEstimator, max_completion_length: int | None
) -> None:
    """Check ``tools=`` / ``environment_factory=`` / ``rollout_func=`` against the estimator before a model is
    loaded.

    - An estimator that continues episodes through their tool calls
      (:class:`~mcadvantage.estimators.base.ContinuesEpisodes`: ``"vineppo"``, ``"hybrid"``) checks what it supports
      itself (``rollout_func``, its Monte Carlo settings).
    - An estimator that draws its groups as trees (:class:`~mcadvantage.estimators.base.DrawsTrees`: ``"tree"``)
      takes tools and environments (the tree branches inside the first model turn) and refuses ``rollout_func``.
    - Another estimator that samples continuations (``uses_rollouts``) refuses all three: it would continue a
      multi-turn episode as plain text.
    - Estimators that only read the batch (``"grpo"``, ``"rloo"``, ``"gae"``) take them as ``GRPOTrainer`` does.
    """
    given = [name for name in AGENT_KWARGS if kwargs.get(name) is not None]
    if not given:
        return
    from mcadvantage.estimators.base import ContinuesEpisodes, DrawsTrees

    name = estimator.name or type(estimator).__name__
    if isinstance(estimator, ContinuesEpisodes):
        estimator.check_agent_support(given)
        return
    if isinstance(estimator, DrawsTrees):
        if "rollout_func" in given:
            raise NotImplementedError(
                f"advantage_estimator={name!r} does not support rollout_func= yet: the trainer draws each group as a "
                "tree in its own first model turn, which a rollout_func replaces, so no tree would be drawn. Use "
                "advantage_estimator='grpo', 'rloo' or 'gae' (they train rollout_func episodes exactly as "
                "trl.GRPOTrainer does), advantage_estimator='vineppo' with continuation_func= for Monte Carlo credit "
                "on them, or pass tools= / environment_factory= instead of rollout_func (the tree then branches "
                "inside the first model turn)."
            )
        return
    if estimator.uses_rollouts:
        raise NotImplementedError(
            f"advantage_estimator={name!r} does not support {', '.join(f'{g}=' for g in given)}: it samples Monte "
            "Carlo continuations from token prefixes, which would continue a multi-turn episode without its tool "
            "calls and environment steps. Use advantage_estimator='grpo', 'rloo' or 'gae' (they train tool and "
            "environment episodes exactly as trl.GRPOTrainer does), or drop "
            f"{' / '.join(given)}."
            + (
                " For Monte Carlo credit on rollout_func episodes, use advantage_estimator='vineppo' with "
                "continuation_func= (docs/howto/turn-credit-for-agents.md)."
                if "rollout_func" in given
                else " For Monte Carlo credit per turn, use advantage_estimator='vineppo' or 'hybrid' (or give "
                "your estimator a check_agent_support method: mcadvantage.estimators.base.ContinuesEpisodes)."
            )
        )


def check_trainer_args(args: Any, model: Any) -> VinePPOConfig:
    """``VinePPOTrainer``'s ``args``: a :class:`~mcadvantage.trainer.config.VinePPOConfig` as given, or the default
    ``VinePPOConfig("<model name>-VinePPO")`` for None.

    Raises:
        TypeError: anything else (a plain ``GRPOConfig`` among them), naming how to build a ``VinePPOConfig``.
    """
    from trl import GRPOConfig

    from mcadvantage.trainer.config import VinePPOConfig

    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        return VinePPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-VinePPO")
    if not isinstance(args, VinePPOConfig):
        kind = "a GRPOConfig" if isinstance(args, GRPOConfig) else type(args).__name__
        raise TypeError(
            f"args is {kind}, but VinePPOTrainer needs a mcadvantage.VinePPOConfig (it adds the Monte Carlo "
            "settings; every GRPO field keeps GRPOConfig's default but those in GRPO_DEFAULT_DIFFERENCES). Build one with VinePPOConfig(**your_kwargs), or "
            "VinePPOConfig.from_paper(task, **overrides) for the paper's settings."
        )
    return args


def check_engine_settings(args: Any) -> None:
    """Refuse engine settings the Monte Carlo rollouts cannot run with: colocated vLLM with tensor parallelism."""
    if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size > 1:
        raise NotImplementedError(
            f"vllm_tensor_parallel_size={args.vllm_tensor_parallel_size} is not supported by VinePPOTrainer in "
            "colocate mode (every rank of a tensor-parallel group would have to submit the same rollout "
            "requests). Use vllm_tensor_parallel_size=1 or vllm_mode='server'."
        )


#: GRPOTrainer's words when no reward source is given (TRL raises them after loading the model); the earlier check
#: here starts with them, so a user or a test that reads TRL's message finds it.
TRL_NO_REWARD_SOURCE = (
    "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment defines a "
    "`get_reward` method."
)


def check_reward_funcs(reward_funcs: Any, *, environment_factory: Any = None) -> list[Any]:
    """The reward functions as a list (reward models and async functions included: they grade rollouts through
    :func:`~mcadvantage.rewards.models.as_rollout_reward_func`).

    With an ``environment_factory``, none is needed here: an environment that defines ``get_reward`` owns the
    reward, and ``GRPOTrainer`` (which builds one instance of each environment to find out) raises its own "No
    reward source provided" when no environment does."""
    if environment_factory is not None and (reward_funcs is None or reward_funcs == []):
        return []
    if reward_funcs is None:
        raise ValueError(
            f"{TRL_NO_REWARD_SOURCE} (reward_funcs is None.) VinePPO grades every response and Monte Carlo "
            "continuation with reward functions or reward models: pass e.g. mcadvantage.GSM8KVerifier(), a function "
            "f(prompts, completions, **kw), or a reward model id."
        )
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError(
            f"{TRL_NO_REWARD_SOURCE} (reward_funcs is empty.) Pass at least one reward function or reward model."
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


def check_dataset_columns(
    dataset: Any, reward_funcs: Sequence[Any], dataset_name: str, *, environment_factory: Any = None
) -> None:
    """Fail when a dataset (or each dataset of a dict) lacks ``prompt`` or a column a reward function needs.

    With an ``environment_factory`` the ``prompt`` column is optional (an environment's ``reset`` may supply the
    prompt, as ``GRPOTrainer`` allows); with a dict of environments every row needs an ``environment`` column
    naming its environment."""
    if isinstance(dataset, dict):
        for key, part in dataset.items():
            check_dataset_columns(
                part, reward_funcs, f"{dataset_name}[{key!r}]", environment_factory=environment_factory
            )
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
    if isinstance(environment_factory, dict) and "environment" not in columns:
        raise ValueError(
            f"{dataset_name} has no 'environment' column (columns: {sorted(columns)}), but environment_factory is a "
            f"dict of environments ({sorted(map(str, environment_factory))}): each row names its environment there, as "
            "for GRPOTrainer. Add the column (dataset.add_column('environment', [...])) or pass one factory."
        )
    if "prompt" not in columns and environment_factory is None:
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


def check_rewards_and_datasets(
    reward_funcs: Any, train_dataset: Any, eval_dataset: Any, environment_factory: Any = None
) -> list[Any]:
    """:func:`check_reward_funcs`, then :func:`check_dataset_columns` on both datasets: the reward functions as a
    list, or the error that names what is missing."""
    funcs = check_reward_funcs(reward_funcs, environment_factory=environment_factory)
    check_dataset_columns(train_dataset, funcs, "train_dataset", environment_factory=environment_factory)
    check_dataset_columns(eval_dataset, funcs, "eval_dataset", environment_factory=environment_factory)
    return funcs
