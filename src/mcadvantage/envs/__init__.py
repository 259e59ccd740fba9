"""Real environments as TRL environments: gymnasium games and OpenEnv servers (the optional extra ``envs``:
``pip install 'mcadvantage[envs]'``).

- :func:`gymnasium_environment`: a gymnasium environment with discrete actions as an ``environment_factory`` class;
- :func:`openenv_environment`: a client of an OpenEnv server as an ``environment_factory`` class;
- :func:`openenv_app` / :class:`LocalOpenEnvServer`: serve a gymnasium environment (or any environment class with one
  tool) as an OpenEnv server, in this process or a subprocess;
- :func:`environment_dataset`: training rows (prompt, seed) for those classes.

Every class meets the contract of ``docs/howto/bring-your-environment.md``: ``reset(**row)`` seeded by the row, one
tool, ``get_reward``, a ``state_key`` property, rebuild by reset and replay, ``_reseed`` for fresh randomness per
Monte Carlo continuation. Importing this package imports neither gymnasium nor openenv-core.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "GymnasiumEnvironment",
    "LocalOpenEnvServer",
    "OpenEnvEnvironment",
    "OpenEnvError",
    "environment_dataset",
    "gymnasium_environment",
    "openenv_app",
    "openenv_environment",
]

_LAZY = {
    "GymnasiumEnvironment": "mcadvantage.envs.gym_adapter",
    "gymnasium_environment": "mcadvantage.envs.gym_adapter",
    "environment_dataset": "mcadvantage.envs._common",
    "OpenEnvEnvironment": "mcadvantage.envs.openenv_client",
    "OpenEnvError": "mcadvantage.envs.openenv_client",
    "openenv_environment": "mcadvantage.envs.openenv_client",
    "openenv_app": "mcadvantage.envs.openenv_server",
    "LocalOpenEnvServer": "mcadvantage.envs.openenv_server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
