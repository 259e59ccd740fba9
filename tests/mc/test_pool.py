"""The free-sample pool (:mod:`mcadvantage.mc.pool`) on a hand-made batch whose every count, sum and value is
worked out below.

Token ids are plain integers (no tokenizer). The batch: two responses to prompt ``[100]`` that share the states
``S_0`` and ``[1]``, and one response to prompt ``[200]``::

    t0: [1, 2, 3]  steps [0, 1, 2, 3]  R = 1   states u0 = [], u1 = [1], u2 = [1, 2]
    t1: [1, 5, 6]  steps [0, 1, 3]     R = 0   states u0, u1
    t2: [1, 2]     steps [0, 2]        R = 1   state  u3 = [] (prompt [200])
"""

from __future__ import annotations

import math

import pytest

from mcadvantage.core.settings import MCSettings
from mcadvantage.mc import pool as mc_pool
from mcadvantage.mc.planning import plan_states
from mcadvantage.mc.trajectory import Trajectory


def _batch() -> list[Trajectory]:
    return [
        Trajectory(prompt_ids=[100], completion_ids=[1, 2, 3], step_boundaries=[0, 1, 2, 3], reward=1.0),
        Trajectory(prompt_ids=[100], completion_ids=[1, 5, 6], step_boundaries=[0, 1, 3], reward=0.0),
        Trajectory(prompt_ids=[200], completion_ids=[1, 2], step_boundaries=[0, 2], reward=1.0),
    ]


#: The first wave of the worked example, per unique state: (full completion ids, reward). u0's rollout passes
#: through u1 and u2, so it is a sample of all three; u1's leaves every deeper state at its first token.
WAVE = [
    [([1, 2, 7], 1.0)],
    [([1, 5], 0.0)],
    [([1, 2, 8], 0.0), ([1, 2, 9], 1.0)],
    [([4], 1.0), ([5], 0.0)],
]


@pytest.fixture
def batch_plan_pool():
    batch = _batch()
    plan = plan_states(batch, MCSettings())
    assert plan.unique == [(0, 0), (0, 1), (0, 2), (2, 0)]  # the worked example's u0..u3
    pool = mc_pool.SamplePool(batch, plan)
    pool.add_responses(batch)
    return batch, plan, pool


def test_responses_count_for_the_states_they_go_beyond(batch_plan_pool):
    _, _, pool = batch_plan_pool
    # t0 passes u0, u1, u2; t1 passes u0, u1 (it leaves u2's prefix at its second token); t2 only u3.
    assert pool.count == [2, 2, 1, 1]
    assert pool.total == [1.0, 1.0, 1.0, 1.0]
    assert pool.remaining == [6.0, 4.0, 1.0, 2.0]  # tokens each path had left beyond the state
    assert pool.rewards == [[1.0, 0.0], [1.0, 0.0], [1.0], [1.0]]
    assert pool.others == [1, 1, 0, 0]  # besides one response's own outcome


def test_a_path_that_ends_at_a_state_or_changes_prompt_is_no_sample_of_it(batch_plan_pool):
    batch, _, pool = batch_plan_pool
    pool.add_path(batch[0], [1], 1.0)  # ends exactly at u1: counts for u0 only
    assert pool.count == [3, 2, 1, 1]
    pool.add_path(batch[0], [9, 9], 0.0)  # leaves every deeper state at once: u0 only
    assert pool.count == [4, 2, 1, 1]
    pool.add_path(Trajectory([300], [1, 2, 3], [0, 3], 1.0), [1, 2, 3], 1.0)  # another prompt: no state of it
    assert pool.count == [4, 2, 1, 1]
    pool.add_path(batch[0], [1, 2, 3], 1.0, start=1)  # sampled from u1: not a draw of the shallower u0
    assert pool.count == [4, 3, 2, 1]


def test_rows_with_other_fields_do_not_share_a_state():
    batch = _batch()
    batch[1].fields = {"answer": "7"}  # same tokens as t0's prefix, graded otherwise
    plan = plan_states(batch, MCSettings())
    pool = mc_pool.SamplePool(batch, plan)
    pool.add_responses(batch)
    assert len(plan.unique) == 6
    assert pool.count == [1, 1, 1, 1, 1, 1]  # each response counts only for its own grading group's states


def test_a_wave_counts_for_its_state_and_every_deeper_state_it_passes(batch_plan_pool):
    batch, _, pool = batch_plan_pool
    assert mc_pool.first_wave_counts(pool, [True] * 4, 2) == [1, 1, 2, 2]  # 2 - others
    assert mc_pool.first_wave_counts(pool, [True, False, True, False], 2) == [1, 0, 2, 0]
    pool.add_wave(batch, WAVE)
    assert pool.count == [3, 4, 4, 3]
    assert pool.total == [2.0, 2.0, 3.0, 2.0]
    assert [pool.mean_remaining(u) for u in range(4)] == [9 / 3, 7 / 4, 4 / 4, 4 / 3]
    assert pool.others == [2, 3, 3, 2]


def test_an_unsampled_states_own_prefix_counts_for_that_state_only(batch_plan_pool):
    batch, _, pool = batch_plan_pool
    pool.add_wave(batch, [[], [], [([1, 2], 0.5)], []])  # u2 had no budget: its prefix was graded directly
    assert pool.count == [2, 2, 2, 1] and pool.total[2] == 1.5 and pool.remaining[2] == 1.0


def test_leave_one_out_values_never_use_a_responses_own_outcome(batch_plan_pool):
    batch, plan, pool = batch_plan_pool
    pool.add_wave(batch, WAVE)
    values = mc_pool.leave_one_out_values(batch, plan, pool, None, [1.0] * 4)
    # (pool total - own reward) / (pool count - 1), state by state
    assert values == [[(2 - 1) / 2, (2 - 1) / 3, (3 - 1) / 3], [2 / 2, 2 / 3], [(2 - 1) / 2]]
    assert mc_pool.samples_used(pool, None, [1.0] * 4) == [2, 3, 3, 2]


def test_a_state_with_no_other_sample_has_no_leave_one_out_value(batch_plan_pool):
    batch, plan, pool = batch_plan_pool  # u2 and u3 hold only their own response
    with pytest.raises(ValueError, match="no sample left"):
        mc_pool.leave_one_out_values(batch, plan, pool, None, [1.0] * 4)


def test_the_second_wave_is_averaged_apart_by_the_fixed_share(batch_plan_pool):
    batch, plan, pool = batch_plan_pool
    pool.add_wave(batch, WAVE)
    shares = mc_pool.first_wave_shares(pool, [True, True, True, False], 4)
    assert shares == [2 / 4, 3 / 4, 3 / 4, 1.0]  # min(1, others / K); an unsampled state keeps all of it
    second = pool.empty_like()
    assert second.count == [0, 0, 0, 0] and second.tries is pool.tries
    second.add_wave(batch, [[([1, 7], 1.0)], [([1, 5], 1.0)], [([1, 2, 8], 0.0)], [([6], 0.0)]])
    assert second.count == [1, 2, 1, 1]  # u0's rollout [1, 7] goes beyond u1 as well
    values = mc_pool.leave_one_out_values(batch, plan, pool, second, shares)
    first_means = [[1 / 2, 1 / 3, 2 / 3], [2 / 2, 2 / 3], [1 / 2]]
    second_means = [[1.0, 1.0, 0.0], [1.0, 1.0], [0.0]]
    mixed = [
        [
            a * f + (1 - a) * s
            for a, f, s in zip([0.5, 0.75, 0.75], first_means[0], second_means[0], strict=True)
        ],
        [a * f + (1 - a) * s for a, f, s in zip([0.5, 0.75], first_means[1], second_means[1], strict=True)],
        first_means[2],  # share 1: the second wave's sample is not used
    ]
    assert values == mixed
    assert mc_pool.samples_used(pool, second, shares) == [2 + 1, 3 + 2, 3 + 1, 2]


def test_second_wave_counts_spend_the_budget_where_the_value_uses_the_second_wave(batch_plan_pool):
    batch, plan, pool = batch_plan_pool
    pool.add_wave(batch, WAVE)
    sampled = [True, True, True, False]
    shares = mc_pool.first_wave_shares(pool, sampled, 4)
    costs = [pool.mean_remaining(u) for u in range(4)]
    generated = 6.0
    counts, budget = mc_pool.second_wave_counts(pool, plan, sampled, shares, 4, generated)
    assert budget == 4 * math.fsum(costs[:3])  # K rollouts per sampled state, at their expected length
    assert all(
        n >= 1 for n, a in zip(counts, shares, strict=True) if a < 1
    )  # every mixed value gets a second-wave mean
    assert counts[3] == 0  # share 1: a second-wave rollout would change nothing
    spent = math.fsum(c * n for c, n in zip(costs, counts, strict=True))
    assert spent <= budget - generated
    # With no budget left, only the one rollout each mixed value needs.
    assert mc_pool.second_wave_counts(pool, plan, sampled, shares, 4, 1e9)[0] == [1, 1, 1, 0]


def test_advantage_weights_are_the_tokens_each_state_value_enters(batch_plan_pool):
    _, plan, _ = batch_plan_pool
    # u0: t0's first step (1 token) + t1's (1); u1: t0's steps 1 and 2 (1 + 1) + t1's (1 + 2); u2: 1 + 1; u3: 2.
    assert mc_pool.advantage_weights(plan) == [2.0, 5.0, 2.0, 2.0]


def test_variances_shrink_toward_the_parent_state(batch_plan_pool):
    batch, plan, pool = batch_plan_pool
    pool.add_wave(batch, WAVE)
    assert plan.parent == [None, 0, 1, None]
    plain = pool.variances(plan.parent, 0.0)  # no prior weight: each state's plug-in variance
    assert plain == pytest.approx([2 / 9, 0.25, 3 / 16, 2 / 9])
    everything = [r for rs in pool.rewards for r in rs]
    root = sum((r - sum(everything) / len(everything)) ** 2 for r in everything) / len(everything)
    shrunk = pool.variances(plan.parent, 2.0)
    assert shrunk[0] == pytest.approx((3 * plain[0] + 2 * root) / 5)
    assert shrunk[1] == pytest.approx((4 * plain[1] + 2 * shrunk[0]) / 6)
    assert shrunk[2] == pytest.approx((4 * plain[2] + 2 * shrunk[1]) / 6)
