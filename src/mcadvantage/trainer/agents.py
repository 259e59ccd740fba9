"""What ``VinePPOTrainer`` checks and logs about agent episodes under every estimator (they are properties of the
episodes and their environments, not of Monte Carlo): an environment's ``state_key`` declared as a method is refused
at construction (TRL would offer it to the model as a tool), OpenEnv environments get the run's session limit
(``env_max_sessions``), and tool rounds whose results were dropped for the token budget are counted
(``tools/dropped_results``) and warned about. No TRL internals here: the trainer's compatibility module hands over
the environment classes and the episodes' conversations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcadvantage.samplers.env_checks import check_state_key_declared
from mcadvantage.samplers.rebuild import dropped_tool_calls, warn_dropped_tool_results

__all__ = [
    "DROPPED_RESULTS_METRIC",
    "check_environment_classes",
    "dropped_result_episodes",
    "log_dropped_tool_results",
]

#: The metric counting a batch's episodes whose last tool round's results were dropped (summed over processes).
DROPPED_RESULTS_METRIC = "tools/dropped_results"


def check_environment_classes(classes: Mapping[str | None, type], max_sessions: int) -> None:
    """Before training, under every estimator: refuse a ``state_key`` method (``@property``, naming the class), and
    give environment classes that share a bounded pool of server sessions (``mcadvantage.envs``' OpenEnv classes:
    ``_limit_sessions``) the run's ``env_max_sessions``.

    Raises:
        TypeError: a ``state_key`` that is a method (:func:`~mcadvantage.samplers.env_checks.check_state_key_declared`).
    """
    for name, cls in classes.items():
        check_state_key_declared(cls, name)
        limit = getattr(cls, "_limit_sessions", None)
        if callable(limit):
            limit(max_sessions)


def dropped_result_episodes(completions: Sequence[Any]) -> int:
    """How many of a batch's episodes (TRL's parsed conversations) ended with a tool round whose results were
    dropped for ``max_completion_length`` (the calls ran: the environment and ``get_reward`` include them, the
    messages do not), warned about once per process; 0 for completions that are not conversations."""
    count = sum(
        bool(dropped_tool_calls(messages))
        for messages in completions
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    )
    warn_dropped_tool_results(count)
    return count


def log_dropped_tool_results(trainer: Any, batch: Any) -> None:
    """For a batch of agent episodes (``batch.tool_mask`` set), under every estimator: log
    :data:`DROPPED_RESULTS_METRIC` (summed over processes; collective) and warn once per process when it is not 0."""
    if batch.tool_mask is None:
        return
    from accelerate.utils import gather_object

    dropped = sum(gather_object([dropped_result_episodes(trainer.batch_conversations)]))
    trainer.log_metric_values(batch.mode, {DROPPED_RESULTS_METRIC: float(dropped)})
