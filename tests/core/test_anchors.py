"""Anchor-state credit's pure functions (mcadvantage.core.anchors) against recomputations written here."""

from __future__ import annotations

import math
import statistics

import pytest

from mcadvantage.core.anchors import (
    anchor_stats,
    anchor_step_advantages,
    check_state_keys,
    pooled_anchor_advantages,
    step_groups,
    turn_returns,
)

# Two prompt groups of two episodes each; one final reward per episode.
KEYS = [["s0", "a", "b"], ["s0", "a", "c"], ["s0", "x"], ["s0", "x"]]
REWARDS = [[0, 0, 1.0], [0, 0, 0.0], [0, 1.0], [0, 0.0]]
SCOPES = [0, 0, 1, 1]


def test_turn_returns_discount_from_each_turn():
    assert turn_returns([0, 0, 1.0]) == [1.0, 1.0, 1.0]
    assert turn_returns([1.0, 0.0, 2.0], gamma=0.5) == [1.0 + 0.5 * (0.0 + 0.5 * 2.0), 0.0 + 0.5 * 2.0, 2.0]
    assert turn_returns([]) == []


def test_step_groups_key_on_scope_and_state_not_turn_index():
    groups = step_groups([["s", "t"], ["t", "s"]], [0, 0])
    assert groups[(0, "s")] == [(0, 0), (1, 1)]
    assert groups[(0, "t")] == [(0, 1), (1, 0)]
    assert len(step_groups([["s"], ["s"]], [0, 1])) == 2  # another scope: another group


def test_step_advantages_equal_a_recomputation():
    got = anchor_step_advantages(KEYS, REWARDS, SCOPES)
    # group (0, s0) and (0, a): returns [1, 0] -> mean 0.5, sample std sqrt(0.5)
    z = 0.5 / (statistics.stdev([1.0, 0.0]) + 1e-4)
    assert got[0] == pytest.approx([z, z, 0.0])  # "b": a singleton
    assert got[1] == pytest.approx([-z, -z, 0.0])
    assert got[2] == pytest.approx([z, z])  # scope 1: its own groups
    unscaled = anchor_step_advantages(KEYS, REWARDS, SCOPES, scale=False)
    assert unscaled[0] == pytest.approx([0.5, 0.5, 0.0])


def test_a_tied_group_and_a_singleton_get_zero():
    got = anchor_step_advantages([["s"], ["s"], ["u"]], [[1.0], [1.0], [0.0]], [0, 0, 0])
    assert got == [[0.0], [0.0], [0.0]]


def test_unscorable_episode_is_left_out_and_gets_zero():
    got = anchor_step_advantages([["s"], ["s"], ["s"]], [[1.0], [0.0], [math.nan]], [0, 0, 0])
    z = 0.5 / (statistics.stdev([1.0, 0.0]) + 1e-4)
    assert got == [[pytest.approx(z)], [pytest.approx(-z)], [0.0]]


def test_pooled_values_are_group_means_and_advantages_telescope():
    adv, values = pooled_anchor_advantages(KEYS, REWARDS, SCOPES)
    assert values[0] == pytest.approx(
        [0.5, 0.5, 1.0, 1.0]
    )  # V(s0), V(a), V(b) (singleton: its own return), R
    assert adv[0] == pytest.approx([0.0, 0.5, 0.0])  # credit lands where the episodes diverged
    assert adv[1] == pytest.approx([0.0, -0.5, 0.0])
    for i, episode in enumerate(adv):  # sum over turns = R - V(s_0)
        assert sum(episode) == pytest.approx(REWARDS[i][-1] - values[i][0])


def test_pooled_with_discount_is_td():
    keys, rewards = [["a", "b"], ["a", "c"]], [[1.0, 2.0], [0.0, 0.0]]
    adv, _ = pooled_anchor_advantages(keys, rewards, [0, 0], gamma=0.5)
    v_a = statistics.mean([1.0 + 0.5 * 2.0, 0.0])
    assert adv[0] == pytest.approx([1.0 + 0.5 * 2.0 - v_a, 2.0 - 2.0])
    assert adv[1] == pytest.approx([0.0 + 0.0 - v_a, 0.0])


def test_stats_report_singletons_and_group_sizes():
    stats = anchor_stats(KEYS, SCOPES, anchor_step_advantages(KEYS, REWARDS, SCOPES))
    assert stats["singleton_turn_share"] == pytest.approx(2 / 10)
    assert stats["grouped_turn_share"] == pytest.approx(8 / 10)
    assert stats["mean_step_group_size"] == pytest.approx((2 * 4 + 2 * 4 + 1 + 1) / 10)


def test_unhashable_keys_and_ragged_inputs_are_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"episode 1, turn 0 .*unhashable.*tuple\(board\)"):
        check_state_keys([["s"], [["list"]]])
    with pytest.raises(ValueError, match="one entry per model turn"):
        anchor_step_advantages([["s", "t"]], [[1.0]], [0])
