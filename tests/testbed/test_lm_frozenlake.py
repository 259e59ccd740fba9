"""testbed.lm_frozenlake: the FrozenLake start of the LM agent map (the scripted noisy optimal policy, its
demonstrations through the gymnasium adapter, the warm-up recipe) and the committed warm-up's success check through
the trainer's own tool loop."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

from testbed.lm_frozenlake import (  # noqa: E402
    EPISODE_LIMIT,
    FrozenLakeWarmup,
    build_frozenlake_tokenizer,
    episode_ids,
    frozenlake_check,
    frozenlake_environment,
    frozenlake_rows,
    load_frozenlake_warmup,
    make_frozenlake_trainer,
    optimal_actions,
    optimal_plan,
    policy_success,
)

WARMUP = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "lm_agent_map_warmup" / "frozenlake"


@pytest.fixture(scope="module")
def tokenizer():
    return build_frozenlake_tokenizer()


def test_the_plan_is_a_shortest_way_and_noise_lowers_success_as_computed():
    optimal = optimal_actions()
    assert optimal[0] == (1, 2)  # from the start: down or right
    assert 5 not in optimal and 15 not in optimal  # a hole and the goal have no move
    assert optimal_plan() == (1, 1, 2, 1, 2, 2)  # down down right down right right: 6 moves, the shortest
    assert policy_success(0.0, limit=6) == pytest.approx(1.0)
    assert policy_success(0.0, limit=5) == 0.0
    assert policy_success(0.3) == pytest.approx(0.2401, abs=1e-3)
    assert policy_success(0.4) < policy_success(0.3) < policy_success(0.2)


def test_demonstrations_end_in_done_and_succeed_at_the_computed_rate(tokenizer):
    rng = random.Random(0)
    rows = frozenlake_rows(160, 5)
    demos = [episode_ids(tokenizer, row, 0.3, rng) for row in rows]
    assert all(sum(mask) > 0 and len(ids) == len(mask) for ids, mask, _ in demos)
    ids, mask, _ = demos[0]
    assert tokenizer.decode(ids[-3:], skip_special_tokens=False).endswith("<|im_end|>\n")
    assert "done" in tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m][-3:])
    rate, expected = sum(r for *_, r in demos) / len(demos), policy_success(0.3)
    assert abs(rate - expected) < 4 * (expected * (1 - expected) / len(demos)) ** 0.5
    assert max(len(ids) for ids, _, _ in demos) < 1024  # fits the model's positions


def test_the_environment_is_the_adapters_with_the_cell_as_state_key_and_the_episode_limit():
    env = frozenlake_environment()()
    env.reset(**frozenlake_rows(1, 0)[0])
    assert env.state_key == 0
    for _ in range(EPISODE_LIMIT):
        env.act("left")  # into the wall: the player stays at the start
    assert env.done and env.get_reward() == 0.0 and env.state_key == 0
    with pytest.raises(ValueError, match="episode is over"):
        env.act("down")


def test_bad_warmup_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="wrong_rate=0"):
        FrozenLakeWarmup(wrong_rate=0.0)
    with pytest.raises(ValueError, match="steps=0"):
        FrozenLakeWarmup(steps=0)


def test_a_missing_warmup_names_the_command_that_trains_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m testbed.lm_frozenlake --output_dir"):
        load_frozenlake_warmup(tmp_path)


def test_committed_warmup_has_low_nonzero_success_and_calls_the_tool(tmp_path):
    """The FrozenLake start (benchmarks/results/lm_agent_map_warmup/frozenlake): its recorded success on 512 held-out
    episodes lies in the protocol's band; here 96 episodes under another seed land within about 3 SEs of it, every
    episode moves, and the environment ends nearly all of them (goal, hole or the move limit)."""
    random.seed(0)
    tokenizer, model, meta = load_frozenlake_warmup(WARMUP)
    recorded = meta["check"]["success"]
    assert 0.1 <= recorded <= 0.3 and meta["check"]["episodes"] == 512
    check = frozenlake_check(make_frozenlake_trainer(model, tokenizer, tmp_path), n=96, seed=5)
    assert abs(check["success"] - recorded) <= 3 * (recorded * (1 - recorded) / 96) ** 0.5 + 0.01
    assert check["tool_calls_per_episode"] >= 2.0 and check["ended_share"] >= 0.8
