"""The gymnasium adapter (``mcadvantage.envs.gymnasium_environment``): text, the one tool TRL parses, refused
actions, the state key, and exact rebuilding with fresh randomness per Monte Carlo continuation."""

from __future__ import annotations

import inspect
import random
from collections import Counter

import pytest

gym = pytest.importorskip("gymnasium")

from mcadvantage.agents.rebuild import ToolTurn, execute_tool_calls, replay_environment  # noqa: E402
from mcadvantage.envs import environment_dataset, gymnasium_environment  # noqa: E402

SLIPPERY = gymnasium_environment("FrozenLake-v1", env_kwargs={"is_slippery": True})


def _call(action: str) -> dict:
    return {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}


def test_trl_sees_one_tool_with_a_schema_it_parses():
    from transformers.utils import get_json_schema

    env = SLIPPERY()
    tools = [n for n, _ in inspect.getmembers(SLIPPERY, predicate=inspect.isfunction)]
    # TRL's rule: public functions other than reset and get_reward become tools (properties are not functions).
    assert [n for n in tools if not n.startswith("_") and n not in ("reset", "get_reward")] == ["act"]
    schema = get_json_schema(env.act)["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["action"]
    assert schema["parameters"]["properties"]["action"]["enum"] == ["left", "down", "right", "up"]
    for game, enum in (("Taxi-v4", ["south", "north", "east", "west", "pickup", "dropoff"]),
                       ("CliffWalking-v1", ["up", "right", "down", "left"])):  # fmt: skip
        schema = get_json_schema(gymnasium_environment(game)().act)["function"]
        assert schema["parameters"]["properties"]["action"]["enum"] == enum


def test_boards_are_text_and_a_row_seed_fixes_the_start():
    frozen = SLIPPERY()
    assert frozen.reset(seed=1) == "PFFF\nFHFH\nFFFH\nHFFG"
    assert frozen.state_key == 0 and frozen.get_reward() == 0.0 and not frozen.done
    cliff = gymnasium_environment("CliffWalking-v1")()
    assert cliff.reset(seed=0).splitlines() == ["." * 12] * 3 + ["PCCCCCCCCCCG"]
    stepped = cliff.act("right")  # onto the cliff: -100 and back to the start
    assert stepped.splitlines()[-2] == "PCCCCCCCCCCG" and "Reward: -100." in stepped
    taxi = gymnasium_environment("Taxi-v4")
    starts = {}
    for seed in range(6):
        a, b = taxi(), taxi()
        assert a.reset(seed=seed) == b.reset(seed=seed)  # every episode of a group starts in the same state
        starts[seed] = a.state_key
        assert a.reset(seed=seed).count("T") == 1 and "Destination:" in a.reset(seed=seed)
    assert len(set(starts.values())) > 1  # and the seed matters


def test_refused_actions_reach_the_model_as_errors_and_are_counted():
    env = gymnasium_environment(
        "FrozenLake-v1", env_kwargs={"is_slippery": False}
    )()  # right x2, down x3, right wins
    env.reset(seed=0)
    for bad in ("jump", "7", ""):
        with pytest.raises(
            ValueError, match=r"is not an action of FrozenLake-v1: call act\(action\) with one of"
        ):
            env.act(bad)
    assert env.invalid_actions == 3 and env.state_key == 0
    # TRL's loop (mirrored by execute_tool_calls) turns the error into the tool result; nothing crashes.
    [(name, result)] = execute_tool_calls([_call("jump")], {"act": env.act})
    assert name == "act" and "error" in result and "one of ['left', 'down', 'right', 'up']" in result
    for action in ("right", "RIGHT", "1", "1", "1"):  # names in any case, or the index
        text = env.act(action)
    assert env.act(2).endswith("Do not call act again.") and env.done and env.get_reward() == 1.0
    with pytest.raises(
        ValueError, match=r"the episode is over \(it reached a terminal state\); do not call act"
    ):
        env.act("up")
    assert env.invalid_actions == 5 and "P" not in text.splitlines()[0]


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match=r"'FrozenLak-v1' is not a registered gymnasium environment"):
        gymnasium_environment("FrozenLak-v1")
    with pytest.raises(ValueError, match=r"action space Box.*not a Discrete one.*DiscretizeAction"):
        gymnasium_environment("Pendulum-v1")
    with pytest.raises(ValueError, match=r"Blackjack-v1 has no built-in text renderer.*render="):
        gymnasium_environment("Blackjack-v1")
    with pytest.raises(ValueError, match=r"tool_name='reset' cannot be a tool"):
        gymnasium_environment("FrozenLake-v1", tool_name="reset")
    with pytest.raises(ValueError, match=r"actions=\['a', 'b'\] must name each of FrozenLake-v1's 4 actions"):
        gymnasium_environment("FrozenLake-v1", actions=["a", "b"])
    with pytest.raises(ValueError, match=r"the dataset row has no 'seed' column.*environment_dataset"):
        SLIPPERY().reset(prompt="hi")
    with pytest.raises(ValueError, match=r"the row's 'seed' is 'x'; it must be an int"):
        SLIPPERY().reset(seed="x")


def test_other_games_take_a_renderer_and_a_named_state_key():
    blackjack = gymnasium_environment(
        "Blackjack-v1", render=lambda obs: f"sum {obs[0]}, dealer {obs[1]}", actions=["stick", "hit"]
    )
    env = blackjack()
    assert env.reset(seed=0).startswith("sum ") and isinstance(env.state_key, tuple)
    named = gymnasium_environment("FrozenLake-v1", env_kwargs={"is_slippery": False}, state_key="s")()
    named.reset(seed=0)
    named.act("down")
    assert named.state_key == 4 and named._state_keys == [0, 4]
    rows = environment_dataset(SLIPPERY, 3, seed=1)
    assert rows.column_names == ["prompt", "seed"] and len(set(rows["seed"])) == 3
    assert "act(action) with action one of left, down, right, up" in rows[0]["prompt"][0]["content"]


def _episode(env_cls, seed: int, actions: list[str]):
    """Play an episode as TRL's loop does; return the row, the recorded tool turns and the env after each turn's
    state (FrozenLake's position and the random generator's state)."""
    env = env_cls()
    row = {"prompt": [], "seed": seed}
    env.reset(**row)
    turns, states = [], [(env._env.unwrapped.s, env._env.unwrapped.np_random.bit_generator.state)]
    for action in actions:
        if env.done:
            break
        results = execute_tool_calls([_call(action)], {"act": env.act})
        turns.append(ToolTurn((_call(action),), tuple(results)))
        states.append((env._env.unwrapped.s, env._env.unwrapped.np_random.bit_generator.state))
    return row, turns, states


def test_rebuild_by_replay_is_exact_on_slippery_frozen_lake():
    """The rebuilt environment equals the episode's at every prefix: position and random stream (the slippery
    transitions are random, so only a replay of the seeded stream gets there)."""
    rng = random.Random(0)
    checked = 0
    for seed in range(5):
        row, turns, states = _episode(
            SLIPPERY, seed, [rng.choice(["left", "down", "right", "up"]) for _ in range(8)]
        )
        for n in range(len(turns) + 1):
            rebuilt = replay_environment(SLIPPERY, row, turns[:n])  # raises if a replayed result differs
            unwrapped = rebuilt._env.unwrapped
            assert (unwrapped.s, unwrapped.np_random.bit_generator.state) == states[n]
            checked += 1
    assert checked > 10


def test_each_continuation_draws_fresh_randomness_after_the_rebuild():
    """K rebuilds of one state then the same move: without ``reseed`` all K repeat the episode's luck (one
    outcome); with a seed per continuation the outcomes follow the slip probabilities (1/3 each)."""
    row, turns, _ = _episode(SLIPPERY, 3, ["right"])
    state = replay_environment(SLIPPERY, row, turns).state_key
    k = 300

    def outcomes(reseed):
        seen = Counter()
        for _ in range(k):
            env = replay_environment(SLIPPERY, row, turns, reseed=reseed)
            assert env.state_key == state  # the rebuild itself is untouched by the reseed
            env.act("down")
            seen[env.state_key] += 1
        return seen

    assert len(outcomes(None)) == 1
    seeds = random.Random(1)
    fresh = outcomes(lambda: seeds.getrandbits(63))
    assert len(fresh) == 3
    for count in fresh.values():  # binomial(300, 1/3): sd 8.2, so 5 sd is 41
        assert abs(count - k / 3) < 41, fresh
