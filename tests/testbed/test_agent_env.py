"""The agent testbed environment (``testbed/agent_env.py``): its exact values against brute-force enumeration of the
environment itself and against Monte Carlo play, its exact advantages, deterministic replay, and its errors.

Pure Python (no model, no torch): seconds.
"""

from __future__ import annotations

import copy
import itertools
import math
import random

import pytest

from testbed.agent_env import (
    BAD,
    GOOD,
    PROMPT_TEXT,
    AgentEnv,
    AgentTask,
    KeyPolicy,
    agent_rows,
    credit_report,
    exact_advantages,
    exact_q_values,
    exact_values,
    make_agent_dataset,
    path_values,
    read_progress,
    replay_states,
    simulate_episode,
    success_probability,
    turn_spans,
    view_of,
)

# A policy that depends on the turn and the state and sometimes stops: every branch of the exact values is used.
STATEFUL = KeyPolicy(
    key_prob=lambda turn, state: 0.2 + 0.1 * (turn % 3) + 0.25 * (state == BAD),
    stop_prob=lambda turn, state: 0.05 * (turn == 1),
)
TASKS = [
    AgentTask("delayed", horizon=1, key=0, choices=2),
    AgentTask("delayed", horizon=4, key=2, choices=3, decisive_turn=0),
    AgentTask("delayed", horizon=4, key=1, choices=3, decisive_turn=2),
    AgentTask("recovery", horizon=2, key=1, choices=2),
    AgentTask("recovery", horizon=4, key=0, choices=3, decisive_turn=1),
    AgentTask("recovery", horizon=5, key=2, choices=3, decisive_turn=0, repair_turn=2),
    AgentTask("chain", horizon=2, key=1, choices=2),
    AgentTask("chain", horizon=5, key=2, choices=3, decisive_turn=2),
]


def _brute_force_success(env: AgentEnv, policy: KeyPolicy) -> float:
    """P(reward 1) from the environment's current state, by enumerating every future decision on forked copies of
    the environment itself (its own ``act`` and ``get_reward``, not the task's transition table)."""
    if env.finished:
        return env.get_reward()
    task = env.task
    probs = policy.action_probs(view_of(task, env.turn, env.state))
    total = 0.0
    for choice, p in enumerate(probs):
        if p > 0:
            branch = copy.deepcopy(env)
            branch.act(choice)
            total += p * _brute_force_success(branch, policy)
    return total  # the remaining mass (stopping) ends unfinished: reward 0


@pytest.mark.parametrize("task", TASKS, ids=lambda t: f"{t.structure}-H{t.horizon}-d{t.decisive_turn}")
def test_exact_values_match_brute_force_enumeration_from_every_prefix(task):
    values = exact_values(task, STATEFUL)
    for k in range(task.horizon + 1):
        for prefix in itertools.product(range(task.choices), repeat=k):
            env = AgentEnv()
            env.reset(**task.row())
            for choice in prefix:
                env.act(choice)
            assert values[k][env.state] == pytest.approx(_brute_force_success(env, STATEFUL), abs=1e-12)
    assert success_probability(task, STATEFUL) == values[0][task.initial_state()]


def test_known_values_in_closed_form():
    """The two structures' values with a constant policy, by hand: delayed succeeds iff the decisive choice is the
    key (p); recovery iff the mistake turn is right or the repair turn mends it (p + (1 - p) p)."""
    p = 0.3
    delayed = AgentTask("delayed", horizon=6, key=1, decisive_turn=2)
    recovery = AgentTask("recovery", horizon=6, key=1, decisive_turn=2, repair_turn=4)
    assert success_probability(delayed, KeyPolicy(p)) == pytest.approx(p)
    assert success_probability(recovery, KeyPolicy(p)) == pytest.approx(p + (1 - p) * p)
    values = exact_values(recovery, KeyPolicy(p))
    assert values[3][BAD] == pytest.approx(p) and values[3][GOOD] == pytest.approx(1.0)
    assert values[5][BAD] == 0.0 and values[5][GOOD] == 1.0
    q = exact_q_values(recovery, KeyPolicy(p), turn=2, state=GOOD)
    assert q[1] == pytest.approx(1.0) and q[0] == pytest.approx(p)


def _tolerance(p: float, n: int) -> float:
    """Five standard errors of a mean of ``n`` Bernoulli(p) draws (a floor of 1/n for p at 0 or 1)."""
    return 5 * math.sqrt(max(p * (1 - p), 1 / n) / n)


@pytest.mark.parametrize("task", TASKS[1:], ids=lambda t: f"{t.structure}-H{t.horizon}-d{t.decisive_turn}")
def test_monte_carlo_play_of_the_environment_is_unbiased_for_the_exact_values(task):
    """Rollouts of the environment itself from a state average to that state's exact value, and the Monte Carlo
    advantage of each decision (value after minus value before) to its exact advantage. The tolerance is five
    standard errors of the sample size (the seeds are fixed, so the test is deterministic)."""
    rng = random.Random(0)
    n = 2000
    prefix = [task.key if t % 2 else (task.key + 1) % task.choices for t in range(task.horizon - 1)]
    values = path_values(task, STATEFUL, prefix)
    means = []
    for k in range(len(prefix) + 1):
        means.append(
            sum(simulate_episode(task, STATEFUL, rng, prefix=prefix[:k]).reward for _ in range(n)) / n
        )
        assert abs(means[k] - values[k]) <= _tolerance(values[k], n), (k, means[k], values[k])
    advantages = exact_advantages(task, STATEFUL, prefix)
    for k in range(len(prefix)):
        tol = _tolerance(values[k], n) + _tolerance(values[k + 1], n)
        assert abs((means[k + 1] - means[k]) - advantages[k]) <= tol, (
            k,
            means[k + 1] - means[k],
            advantages[k],
        )


def test_exact_advantages_are_zero_on_turns_that_do_not_matter_and_sum_to_the_return():
    policy = KeyPolicy(0.25)
    for task in TASKS:
        rng = random.Random(1)
        for _ in range(50):
            episode = simulate_episode(task, policy, rng)
            advantages = exact_advantages(task, policy, episode.choices)
            assert len(advantages) == len(episode.choices)
            assert sum(advantages) == pytest.approx(episode.reward - success_probability(task, policy))
            for turn, advantage in enumerate(advantages):
                if turn not in task.relevant_turns():
                    assert advantage == 0.0
            # The decisive turn's sign tells right from wrong (delayed: always; recovery: from a good state).
            d = task.decisive_turn
            if task.structure == "delayed" or episode.states[d] == GOOD:
                assert (advantages[d] > 0) == (episode.choices[d] == task.key)


def test_a_stopped_episode_fails_and_its_stop_gets_the_lost_value():
    task = AgentTask("delayed", horizon=3, key=0)
    policy = KeyPolicy(0.5, stop_prob=0.5)
    rng = random.Random(0)
    stopped = [e for e in (simulate_episode(task, policy, rng) for _ in range(200)) if e.stopped]
    assert stopped and all(e.reward == 0.0 and len(e.choices) < task.horizon for e in stopped)
    for e in stopped:
        path = path_values(task, policy, e.choices)
        assert path[-1] == 0.0 and len(path) == len(e.choices) + 2
        assert exact_advantages(task, policy, e.choices)[-1] == -path[-2]
    # The exact values count the stopping mass as failure: V0 = P(reach and pick the key at turn 0 ...).
    assert success_probability(task, policy) == pytest.approx(0.5 * 0.5 * 0.5)


# --------------------------------------------------------------------------------------------------------------
# Deterministic replay, forking, and what the agent sees
# --------------------------------------------------------------------------------------------------------------
def test_reset_and_replay_reproduce_a_prefix_exactly():
    """What a Monte Carlo continuation relies on: a new instance reset with the same row and given the prefix's tool
    calls returns the same tool results and ends in the same state; the row's extra columns are ignored."""
    row = agent_rows("recovery", 6, 1, seed=3)[0]
    rng = random.Random(0)
    task = AgentTask.from_row(row)
    episode = simulate_episode(task, KeyPolicy(0.4), rng)
    for k in range(len(episode.choices) + 1):
        env = AgentEnv()
        observation = env.reset(**row, some_other_column="ignored")
        assert observation == AgentEnv().reset(**row)
        results = [env.act(c) for c in episode.choices[:k]]
        assert results == list(episode.tool_results[:k])
        assert env.state == episode.states[k] and env.turn == k
    assert replay_states(task, episode.choices) == list(episode.states)


def test_a_deep_copy_forks_an_episode_without_sharing_state():
    env = AgentEnv()
    env.reset(**AgentTask("delayed", horizon=3, key=1).row())
    env.act(0)  # the decisive turn, wrong: bad
    fork = copy.deepcopy(env)
    fork.reset(**AgentTask("delayed", horizon=3, key=1).row())
    fork.act(1)
    assert (env.turn, env.state, fork.turn, fork.state) == (1, BAD, 1, GOOD)
    env.act(1)
    env.act(1)
    assert env.get_reward() == 0.0 and not fork.finished


def test_read_progress_reads_what_the_environment_wrote():
    row = agent_rows("recovery", 4, 1, seed=0)[0]
    env = AgentEnv()
    text = PROMPT_TEXT + env.reset(**row)
    view = read_progress(text)
    assert view == view_of(env.task, 0, GOOD)
    wrong = (env.task.key + 1) % env.task.choices
    text += " " + env.act(wrong) + " {'error': 'choice=9 must be an integer'} "
    assert read_progress(text) == view_of(env.task, 1, BAD)
    text += env.act(env.task.key) + env.act(env.task.key)
    assert read_progress(text).turn == 3
    with pytest.raises(ValueError, match="not an episode"):
        read_progress("no observation here")


# --------------------------------------------------------------------------------------------------------------
# Datasets, TRL's environment conventions, and errors
# --------------------------------------------------------------------------------------------------------------
def test_dataset_rows_carry_the_task_and_a_conversational_prompt():
    ds = make_agent_dataset("recovery", 5, 16, seed=7, choices=3, decisive_turn=1)
    assert set(ds.column_names) == {
        "prompt",
        "structure",
        "horizon",
        "key",
        "choices",
        "decisive_turn",
        "repair_turn",
    }
    assert ds[0]["prompt"] == [{"role": "user", "content": PROMPT_TEXT}]
    assert set(ds["repair_turn"]) == {4} and set(ds["decisive_turn"]) == {1}
    assert len(set(ds["key"])) > 1 and set(ds["key"]) <= {0, 1, 2}
    assert ds["key"] == make_agent_dataset("recovery", 5, 16, seed=7, choices=3, decisive_turn=1)["key"]
    assert ds["key"] != make_agent_dataset("recovery", 5, 16, seed=8, choices=3, decisive_turn=1)["key"]
    delayed = make_agent_dataset("delayed", 3, 2, seed=0)
    assert delayed["repair_turn"] == [None, None]
    env = AgentEnv()
    for row in (ds[0], delayed[1]):  # a datasets row, as TRL passes it to reset(**row)
        assert env.reset(**row).startswith("\nkey=") and env.task == AgentTask.from_row(row)


def test_only_act_is_a_tool_under_trl_conventions():
    """TRL turns every public function of the class except ``reset`` and ``get_reward`` into a tool."""
    import inspect

    public = [
        name
        for name, _ in inspect.getmembers(AgentEnv, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]
    assert public == ["act"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(structure="maze", horizon=3, key=0), "structure='maze'"),
        (dict(structure="delayed", horizon=0, key=0), "horizon=0"),
        (dict(structure="delayed", horizon=3, key=4), "key=4"),
        (dict(structure="delayed", horizon=3, key=0, choices=1), "choices=1"),
        (dict(structure="delayed", horizon=3, key=0, decisive_turn=3), "decisive_turn=3"),
        (dict(structure="delayed", horizon=3, key=0, repair_turn=2), "repair_turn=2"),
        (dict(structure="recovery", horizon=1, key=0), "repair_turn=None"),
        (dict(structure="recovery", horizon=4, key=0, decisive_turn=2, repair_turn=1), "repair_turn=1"),
        (dict(structure="delayed", horizon=2.0, key=0), "horizon=2.0"),
        (dict(structure="chain", horizon=3, key=0, repair_turn=2), "repair_turn=2"),
        (dict(structure="chain", horizon=3, key=0, decisive_turn=3), "decisive_turn=3"),
    ],
)
def test_bad_task_parameters_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AgentTask(**kwargs)


def test_bad_calls_are_refused_and_use_no_turn():
    env = AgentEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.act(0)
    with pytest.raises(ValueError, match="lacks the column"):
        env.reset(prompt=[], horizon=3)
    env.reset(**AgentTask("delayed", horizon=1, key=1, choices=2).row())
    for bad in (2, -1, "1", True):
        with pytest.raises(ValueError, match="choice="):
            env.act(bad)
    assert env.turn == 0
    env.act(1)
    with pytest.raises(ValueError, match="episode is over"):
        env.act(1)
    assert env.get_reward() == 1.0
    with pytest.raises(ValueError, match="key_prob"):
        KeyPolicy(0.8, stop_prob=0.3).action_probs(view_of(env.task, 0, BAD))


# --------------------------------------------------------------------------------------------------------------
# Reading an estimator's credit per turn
# --------------------------------------------------------------------------------------------------------------
def test_turn_spans_are_the_runs_of_the_models_own_tokens():
    assert turn_spans([1, 1, 0, 0, 1, 0, 1, 1, 1]) == [(0, 2), (4, 5), (6, 9)]
    assert turn_spans([1, 1, 1]) == [(0, 3)]
    assert turn_spans([0, 1, 0]) == [(1, 2)] and turn_spans([]) == []


def test_credit_report_scores_exact_outcome_and_misplaced_credit():
    task = AgentTask("delayed", horizon=4, key=1, decisive_turn=0)
    policy = KeyPolicy(0.25)
    right, wrong = [1, 0, 3, 2], [2, 1, 1, 1]
    exact = exact_advantages(task, policy, right)
    assert exact == [0.75, 0.0, 0.0, 0.0]
    perfect = credit_report(task, policy, right, exact)
    assert perfect.irrelevant_share == 0.0 and perfect.decisive_sign_agrees is True
    # Outcome credit (GRPO's): the episode's reward minus the mean on every turn and on the final answer.
    outcome = credit_report(task, policy, wrong, [-0.25] * 5)
    assert outcome.irrelevant_share == pytest.approx(4 / 5) and outcome.decisive_sign_agrees is True
    flipped = credit_report(task, policy, wrong, [0.5, 0.0, 0.0, 0.0])
    assert flipped.decisive_sign_agrees is False and flipped.irrelevant_share == 0.0
    # Recovery after a right decisive choice: the repair turn did not matter in this episode.
    recovery = AgentTask("recovery", horizon=3, key=0)
    report = credit_report(recovery, policy, [0, 1, 1], [0.1, 0.0, 0.3])
    assert report.exact[2] == 0.0 and report.irrelevant_share == pytest.approx(0.75)
    with pytest.raises(ValueError, match="turn_credits has 2 entries"):
        credit_report(task, policy, right, [0.1, 0.2])


def test_chain_has_several_decisive_turns_and_succeeds_with_p_to_their_number():
    """chain: every turn from decisive_turn on must pick the key (p ** m for m such turns); earlier turns change
    nothing, and a mistake is never mended."""
    p = 0.6
    task = AgentTask("chain", horizon=8, key=3, decisive_turn=5)
    assert task.relevant_turns() == (5, 6, 7)
    assert success_probability(task, KeyPolicy(p)) == pytest.approx(p**3)
    assert replay_states(task, [0, 0, 0, 0, 0, 3, 3, 3]) == [GOOD] * 9
    assert replay_states(task, [3, 3, 3, 3, 3, 3, 0, 3])[-1] == BAD
    advantages = exact_advantages(task, KeyPolicy(p), [0, 1, 2, 0, 1, 3, 3, 3])
    assert advantages[:5] == [0.0] * 5 and all(a > 0 for a in advantages[5:])
