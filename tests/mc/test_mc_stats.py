"""The one typed record of what Monte Carlo estimation cost (:class:`~mcadvantage.mc.stats.MCStats`): combining parts
by each field's reduction, the mapping view ``MCEstimate.stats`` has always offered, and the training metrics made
from it at the edge."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from mcadvantage.estimators.base import reduce_metrics
from mcadvantage.mc.stats import MCStats


def part(**kw) -> MCStats:
    base = dict(requests=2, rollouts=6, generated_tokens=30, truncated_rollouts=1, trajectories=4, states=8)
    return MCStats(**{**base, **kw})


def test_every_field_declares_its_reduction():
    assert {f.name: f.metadata["reduce"] for f in dataclasses.fields(MCStats)} == {
        **{f.name: "sum" for f in dataclasses.fields(MCStats)},
        "rollout_rewards": "concat",
        "seconds": "max",
    }


def test_add_combines_each_field_by_its_reduction():
    total = part(sampling_seconds=1.5, rollout_rewards=[1.0, 0.0], seconds=2.0)
    total.add(part(sampling_seconds=0.25, rollout_rewards=[0.5], seconds=3.0, budget_tokens=40.0))
    assert (total.requests, total.rollouts, total.generated_tokens, total.states) == (4, 12, 60, 16)
    assert total.sampling_seconds == 1.75
    assert total.rollout_rewards == [1.0, 0.0, 0.5]  # in order
    assert total.seconds == 3.0  # parts side by side: the longest
    assert total.budget_tokens == 40.0 and total.free_samples is None  # an unset option stays unset
    total.add(part(budget_tokens=2.0))
    assert total.budget_tokens == 42.0


def test_the_reward_mean_is_the_running_sum_in_order():
    stats = MCStats(rollout_rewards=[1e16, 1.0, -1e16])
    assert stats.rollout_reward_count == 3
    assert stats.rollout_reward_sum == (1e16 + 1.0) - 1e16 == 0.0  # not math.fsum's 1.0
    assert math.isnan(MCStats().rollout_reward_mean)


def test_the_mapping_view_has_the_logged_names_as_floats():
    stats = part(unique_states=6, rollout_rewards=[1.0, 0.0], seconds=0.5)
    assert list(stats) == [
        "requests",
        "unsampled_states",
        "rollouts",
        "generated_tokens",
        "truncated_rollouts",
        "unscorable_rollouts",
        "sampling_seconds",
        "grading_seconds",
        "trajectories",
        "states",
        "unique_states",
        "dedup_ratio",
        "rollout_reward_mean",
        "seconds",
    ]
    assert stats["rollouts"] == 6.0 and isinstance(stats["rollouts"], float)
    assert stats["dedup_ratio"] == 1 - 6 / 8 and stats["rollout_reward_mean"] == 0.5
    assert "free_samples" not in stats and stats.get("free_samples", -1.0) == -1.0
    with pytest.raises(KeyError):
        _ = stats["rollout_rewards"]  # the list is no statistic of its own
    stats.free_samples, stats.rollouts_saved = 3.0, 1.0
    assert list(stats)[8:10] == ["free_samples", "rollouts_saved"] and len(stats) == 16
    assert json.loads(json.dumps(dict(stats))) == stats.as_dict() == dict(stats.items())


def test_metrics_at_the_edge():
    stats = part(unique_states=6, seconds=0.5)
    assert stats.metrics() == {
        "rollouts": 6.0,
        "generated_tokens": 30.0,
        "states": 8.0,
        "seconds": 0.5,
        "dedup_ratio": 1 - 6 / 8,
        "truncated_rollout_ratio": 1 / 6,
    }
    assert MCStats().metrics()["truncated_rollout_ratio"] == 0.0 and MCStats().metrics()["dedup_ratio"] == 0.0
    stats.budget_tokens = 50.0
    assert stats.metrics()["budget_tokens"] == 50.0 and "free_samples" not in stats.metrics()


def test_metric_reductions_come_from_the_fields_and_reduce_like_adding_the_records():
    reductions = MCStats.metric_reductions()
    assert reductions == {
        "rollouts": "sum",
        "generated_tokens": "sum",
        "states": "sum",
        "seconds": "max",
        "free_samples": "sum",
        "rollouts_saved": "sum",
        "budget_tokens": "sum",
        "tool_result_tokens": "sum",
        "tool_calls": "sum",
        "dropped_tool_results": "sum",
    }
    a = part(seconds=1.0, free_samples=2.0, rollouts_saved=1.0)
    b = part(rollouts=10, generated_tokens=7, states=3, seconds=4.0, free_samples=5.0, rollouts_saved=-2.0)
    reduced = reduce_metrics(
        [a.metrics(), b.metrics()], reductions
    )  # what the trainer logs over two processes
    a.add(b)
    combined = a.metrics()
    assert {k: reduced[k] for k in reductions if k in reduced} == {
        k: combined[k] for k in reductions if k in combined
    }
    with pytest.raises(KeyError, match="no field 'nope'"):
        MCStats.reduction("nope")
