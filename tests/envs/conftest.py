"""A real OpenEnv server (slippery FrozenLake) in a subprocess, shared by the module's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def frozen_lake_server():
    pytest.importorskip("gymnasium")
    pytest.importorskip("openenv.core")
    from mcadvantage.envs import LocalOpenEnvServer

    with LocalOpenEnvServer("FrozenLake-v1", env_kwargs={"is_slippery": True}, start_timeout_s=120) as server:
        yield server
