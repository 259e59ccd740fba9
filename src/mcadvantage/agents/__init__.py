"""Agents: multi-turn episodes of TRL's tool loop (``tools=`` / ``environment_factory=``, a ``rollout_func``'s
``env_mask``), in one place. Nothing here imports TRL; the trainer reads TRL's data through its compatibility module
(:mod:`mcadvantage.trainer.trl_compat`) and hands it over.

- :mod:`~mcadvantage.agents.turns`: where an episode's turns and states are (pure functions on a tool mask);
- :mod:`~mcadvantage.agents.tool_loop`: the episodes as the trainer hands them over (:class:`Episode`,
  :class:`AgentEpisodes`) and GRPO's tool loop resumed from a prefix (:func:`continue_episodes`);
- :mod:`~mcadvantage.agents.rebuild`: an episode's environment rebuilt at a state (a fork, else reset and replay,
  checked: :class:`EnvironmentReplayError`);
- :mod:`~mcadvantage.agents.env_checks`: the environment contract where a replay cannot check it (``state_key``,
  ``_fork``, ``_reseed``: :class:`EnvironmentContractError`);
- :mod:`~mcadvantage.agents.episode_sampler`: :class:`EpisodeSampler`, the engine with the episodes' environments
  behind the :class:`~mcadvantage.samplers.base.Sampler` interface (what Monte Carlo credit per turn samples from);
- :mod:`~mcadvantage.agents.state_keys`: the episodes' state keys, before each turn and after each tool round;
- :mod:`~mcadvantage.agents.trainer_episodes`: :class:`TrainerEpisodes`, the trainer's agent side (it records the
  keys during generation, builds a batch's episodes and what continuing them needs, checks the environment classes
  and counts dropped tool results).

The names below import from here too (nothing here is heavy: no TRL, no engine).
"""

from __future__ import annotations

from mcadvantage.agents.env_checks import EnvironmentContractError
from mcadvantage.agents.episode_sampler import EpisodeSampler
from mcadvantage.agents.rebuild import EnvironmentReplayError, rebuild_environment, replay_environment
from mcadvantage.agents.tool_loop import AgentEpisodes, Episode, ToolLoop, continue_episodes
from mcadvantage.agents.trainer_episodes import TrainerEpisodes
from mcadvantage.agents.turns import episode_step_boundaries

__all__ = [
    "AgentEpisodes",
    "EnvironmentContractError",
    "EnvironmentReplayError",
    "Episode",
    "EpisodeSampler",
    "ToolLoop",
    "TrainerEpisodes",
    "continue_episodes",
    "episode_step_boundaries",
    "rebuild_environment",
    "replay_environment",
]
