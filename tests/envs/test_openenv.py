"""OpenEnv: a gymnasium game served by ``openenv_app`` in a real subprocess server, used through
``openenv_environment``'s client class exactly as through the in-process adapter; rebuilds exact with fresh
randomness per continuation; a dead, full or absent server gets a clear error naming its URL. The testbed's
``AgentEnv`` is served too (in-process app)."""

from __future__ import annotations

import random
import socket
from collections import Counter

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("openenv.core")

from mcadvantage.agents.rebuild import ToolTurn, execute_tool_calls, replay_environment  # noqa: E402
from mcadvantage.envs import (  # noqa: E402
    LocalOpenEnvServer,
    OpenEnvError,
    gymnasium_environment,
    openenv_app,
    openenv_environment,
)

pytestmark = pytest.mark.slow  # a server subprocess starts in ~15 s; the tests themselves take seconds

SLIPPERY = gymnasium_environment("FrozenLake-v1", env_kwargs={"is_slippery": True})


def _call(action: str) -> dict:
    return {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}


def test_the_client_class_plays_as_the_in_process_adapter(frozen_lake_server):
    from transformers.utils import get_json_schema

    Remote = openenv_environment(frozen_lake_server.url, state_key_field="key")
    schema = get_json_schema(Remote().act)["function"]["parameters"]["properties"]["action"]
    assert schema["enum"] == ["left", "down", "right", "up"]  # the server's schema carries the allowed values
    assert Remote._instructions == SLIPPERY._instructions  # and the game's rules (its /metadata)
    rng = random.Random(0)
    for seed in range(3):
        remote, local = Remote(), SLIPPERY()
        assert remote.reset(seed=seed) == local.reset(seed=seed)
        for _ in range(6):
            if local.done:
                break
            move = rng.choice(["left", "down", "right", "up"])
            assert remote.act(move).startswith(local.act(move).split("\nThe episode is over")[0])
            assert remote.state_key == local.state_key and remote.get_reward() == local.get_reward()
        assert remote.done == local.done
    fresh = Remote()
    fresh.reset(seed=0)
    with pytest.raises(
        ValueError, match=r"act\(\{\"action\": \"jump\"\}\) was refused: 'jump' is not an action"
    ):
        fresh.act("jump")
    assert fresh.invalid_actions == 1 and fresh.state_key == 0


def test_rebuilds_are_exact_and_each_continuation_gets_fresh_randomness(frozen_lake_server):
    Remote = openenv_environment(frozen_lake_server.url, state_key_field="key")
    env = Remote()
    row = {"prompt": [], "seed": 3}
    env.reset(**row)
    turns = [ToolTurn((_call("right"),), tuple(execute_tool_calls([_call("right")], {"act": env.act})))]
    state = env.state_key
    outcomes = {True: Counter(), False: Counter()}
    seeds = random.Random(1)
    for fresh in (False, True):
        for _ in range(24):
            rebuilt = replay_environment(
                Remote, row, turns, reseed=(lambda: seeds.getrandbits(63)) if fresh else None
            )
            assert rebuilt.state_key == state  # replay checked every result; the reseed kept the state
            rebuilt.act("down")
            outcomes[fresh][rebuilt.state_key] += 1
            rebuilt._close()
    assert len(outcomes[False]) == 1  # without reseeding: the episode's luck, every time
    assert (
        len(outcomes[True]) == 3
    )  # with it: all three slips (P(a slip missing in 24) < 3 * (2/3)^24 < 1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_absent_full_and_dead_servers_get_clear_errors():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(
        OpenEnvError, match=rf"no OpenEnv server answers at {url} .*python -m mcadvantage.envs.openenv_server"
    ):
        openenv_environment(url, connect_timeout_s=2)
    with LocalOpenEnvServer("FrozenLake-v1", max_concurrent_envs=1, start_timeout_s=120) as server:
        Remote = openenv_environment(server.url, message_timeout_s=5)
        first, second = Remote(), Remote()
        first.reset(seed=0)
        with pytest.raises(
            OpenEnvError, match=r"has no free session .*env_max_sessions=16.*--max-concurrent-envs 16"
        ):
            second.reset(seed=0)
        first.act("down")
        server.stop()  # the server dies mid-episode
        with pytest.raises(
            OpenEnvError, match=rf"the OpenEnv server at {server.url} did not answer step\(\)"
        ):
            first.act("down")
        with pytest.raises(OpenEnvError, match=r"session .* broke .*so its reward is unknown"):
            first.get_reward()


def test_the_testbed_agent_env_serves_too():
    from starlette.testclient import TestClient

    from testbed.agent_env import AgentEnv, agent_rows

    client = TestClient(openenv_app(AgentEnv))
    action = client.get("/schema").json()["action"]
    assert action["required"] == ["choice"] and action["properties"]["choice"]["type"] == "integer"
    row = {k: v for k, v in agent_rows("delayed", 2, 1, seed=0)[0].items() if k != "prompt"}
    local = AgentEnv()
    with client.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset", "data": {**row, "seed": 0}})
        assert ws.receive_json()["data"]["observation"]["text"] == local.reset(**row)
        ws.send_json({"type": "step", "data": {"choice": 1}})
        assert ws.receive_json()["data"]["observation"]["text"] == local.act(1)


def _moves(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["left", "down", "right", "up"]) for _ in range(n)]


def test_instances_share_a_bounded_pool_of_sessions_and_rebuild_by_replay(small_frozen_lake_server):
    """Issue 59: more instances than the server allows sessions, played in turn (as continuations are, one engine
    call per turn): each acts on a session from the class's pool, rebuilt by replay when another held it last, and
    every result equals the in-process game's; reseeded instances keep their own fresh randomness across the
    rebuilds. The pool never asks the server for more than ``env_max_sessions`` sessions."""
    Remote = openenv_environment(small_frozen_lake_server.url, state_key_field="key", message_timeout_s=10)
    Remote._limit_sessions(2)  # below the server's 3 and below the 5 instances
    rng = random.Random(0)
    pairs = [(Remote(), SLIPPERY()) for _ in range(5)]
    for i, (remote, local) in enumerate(pairs):
        assert remote.reset(seed=i) == local.reset(seed=i)
        if i % 2:  # a continuation: the episode's first move, then fresh randomness
            remote.act("right"), local.act("right")
            remote._reseed(100 + i), local._reseed(100 + i)
    for move in _moves(rng, 6):
        for remote, local in pairs:
            if local.done:
                continue
            assert remote.act(move).startswith(local.act(move).split("\nThe episode is over")[0])
            assert (remote.state_key, remote.get_reward()) == (local.state_key, local.get_reward())
    assert Remote._pool.open_sessions() <= 2
    for remote, _ in pairs:
        remote._close()  # back to the pool, kept open for the next instance
    assert Remote._pool.open_sessions() == 2
    Remote._close_sessions()
    assert Remote._pool.open_sessions() == 0


def test_a_pool_larger_than_the_server_allows_says_what_it_needs_and_how_to_set_it(small_frozen_lake_server):
    from conftest import SMALL_SERVER_SESSIONS

    Remote = openenv_environment(small_frozen_lake_server.url, message_timeout_s=10)
    limit = SMALL_SERVER_SESSIONS + 1
    Remote._limit_sessions(limit)
    held = [Remote() for _ in range(limit)]
    with pytest.raises(OpenEnvError) as err:
        for env in held:
            env.reset(seed=0)
    message = str(err.value)
    assert f"refused session {limit} of the {limit}" in message
    assert f"env_max_sessions={limit}" in message and f"--max-concurrent-envs {limit}" in message
    assert "VinePPOConfig(env_max_sessions=N)" in message
    Remote._close_sessions()
    assert Remote._pool.open_sessions() == 0
    with pytest.raises(ValueError, match=r"env_max_sessions=0 is invalid"):
        Remote._limit_sessions(0)


def test_a_server_without_replay_rebuilds_pooled_sessions_by_stepping():
    """``reseed=False`` (a server whose transitions are deterministic, without ``replay=``): an instance whose
    session went to another is rebuilt by a reset and its calls one by one, with the same results."""
    Deterministic = gymnasium_environment("FrozenLake-v1", env_kwargs={"is_slippery": False})
    with LocalOpenEnvServer(
        "FrozenLake-v1", env_kwargs={"is_slippery": False}, max_concurrent_envs=1
    ) as server:
        Remote = openenv_environment(server.url, state_key_field="key", reseed=False, message_timeout_s=10)
        Remote._limit_sessions(1)
        pairs = [(Remote(), Deterministic()) for _ in range(3)]
        for i, (remote, local) in enumerate(pairs):
            assert remote.reset(seed=i) == local.reset(seed=i)
        for move in ["right", "down", "down", "right"]:
            for remote, local in pairs:
                if not local.done:
                    assert remote.act(move).startswith(local.act(move).split("\nThe episode is over")[0])
                    assert remote.state_key == local.state_key
        Remote._close_sessions()
