"""benchmarks/agent_turn_credit.py on one short horizon: the record's fields, and its token counts against counts
made by hand from the episodes and the estimates (the engine returns exactly the sampled model tokens; every
continuation stays within its state's remaining budget)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def bench():
    # Registered in sys.modules while it loads: its dataclasses look their module up.
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "agent_turn_credit.py"
    spec = importlib.util.spec_from_file_location("agent_turn_credit_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def harness(bench, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer, model, losses = bench.teach_policy([2], steps=30, seed=0)
    assert len(losses) == 2 and losses[1] < losses[0]  # the format is being learnt
    return bench.build_harness(tokenizer, model, str(tmp_path_factory.mktemp("agent-bench")), 96)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_token_counts_match_the_episodes_and_the_budgets(bench, harness):
    rows = bench.agent_rows("delayed", 2, 2, 7)
    episodes, grpo = bench.generate_episodes(harness, rows, 2, seed=0)
    assert grpo.engine_tokens == sum(
        sum(ep.tool_mask) for ep in episodes
    )  # GRPO's sampled tokens: the model's
    k = 2
    credits, stats, timing = bench.estimate(harness, episodes, 2, k, seed=1)
    assert timing.engine_tokens == stats.generated_tokens
    assert (
        timing.replays == stats.rollouts == k * stats.unique_states
    )  # one rebuilt environment per continuation
    states = [b for credit in credits for b in credit.boundaries[:-1]]
    remaining = [harness.max_completion_length - b for b in states]
    # Each continuation's new tokens (model and tool results) fit in its state's remaining budget.
    assert 0 < stats.generated_tokens + stats.tool_result_tokens <= k * sum(remaining)
    # A continuation samples at least one token (every state opens or continues a model turn).
    assert stats.generated_tokens >= stats.rollouts
    for episode, credit in zip(episodes, credits, strict=True):
        assert credit.rollouts == k * (len(credit.boundaries) - 1)
        assert credit.values[-1] == episode.reward
    assert 0.0 < timing.engine < timing.wall and timing.tools >= 0.0


def test_the_record_on_one_horizon(bench, harness):
    record = bench.measure_horizon(harness, 2, ks=[1, 2], n_episodes=2, repeats=1, seed=0)
    json.dumps(record)  # what the script writes
    g = record["grpo"]
    assert record["horizon"] == 2 and record["episodes"] == 2 and set(record["vineppo"]) == {"1", "2"}
    assert g["engine_tokens"] == pytest.approx(2 * g["model_tokens_per_episode"])
    assert (
        len(g["wall_per_episode_s"]) == 1
        and g["overhead_ratio"]["n"] == 1
        and g["overhead_ratio"]["low"] is None
    )
    for k, v in record["vineppo"].items():
        assert v["k"] == int(k)
        assert v["engine_tokens"] == pytest.approx(2 * v["model_tokens_per_episode"])
        # Identical states (the episodes' shared first state) are estimated once: K rollouts per unique state.
        assert v["rollouts_per_episode"] == pytest.approx(v["k"] * v["unique_states"] / 2)
        assert v["unique_states"] < 2 * v["states_per_episode"]
        assert v["replays"] == 2 * v["rollouts_per_episode"]
        assert v["model_tokens_vs_grpo"] == pytest.approx(
            v["model_tokens_per_episode"] / g["model_tokens_per_episode"]
        )
        assert v["same_values_every_repeat"] and len(v["values_sha256"]) == 64
        ratio = v["overhead_ratio"]["mean"]
        assert math.isfinite(ratio) and ratio > 0
        assert v["replay_per_continuation_ms"] > 0 and v["fork_per_continuation_ms"] > 0
    table = bench.table([record])
    assert len(table.splitlines()) == 2 + 3  # header and rule; GRPO, K = 1 and K = 2


def test_t_interval_by_hand(bench):
    # mean 1.1, sd 0.1, t(0.975, 2) = 4.302653: half-width 0.248414.
    out = bench.t_interval([1.0, 1.1, 1.2])
    assert out["mean"] == pytest.approx(1.1)
    assert out["low"] == pytest.approx(1.1 - 0.248414, abs=1e-5)
    assert out["high"] == pytest.approx(1.1 + 0.248414, abs=1e-5)


def _settings_section() -> str:
    page = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    start = page.index("### What each Monte Carlo setting saves on agents")
    return page[start : page.index("\n### ", start + 1)]


def test_the_settings_tables_on_the_page_are_the_records():
    # docs/benchmarks.md's per-setting cost tables, row by row, rendered here from the committed record as the page
    # prints them (no model runs).
    root = Path(__file__).resolve().parents[2]
    record = json.loads((root / "benchmarks" / "results" / "agent_turn_credit_settings.json").read_text())
    section = _settings_section()
    assert record["command"] in " ".join(section.split())
    arms = set(record["settings"]["setting_arms"])
    for rec in record["horizons"]:
        assert f"H = {rec['horizon']}, K = {rec['k']}, {rec['episodes']} episodes:" in section
        assert set(rec["arms"]) == arms  # every arm reported at every horizon, losses like wins
        for name, arm in rec["arms"].items():
            wall = arm["wall_vs_default"]
            assert arm["same_work_every_repeat"] and wall["n"] == record["settings"]["repeats"]
            ratio = f"{wall['ratio']:.2f} [{wall['low']:.2f}, {wall['high']:.2f}]"
            walls = sorted(arm["wall_per_episode_s"])
            median = (
                walls[len(walls) // 2]
                if len(walls) % 2
                else (walls[len(walls) // 2 - 1] + walls[len(walls) // 2]) / 2
            )
            row = (
                f"| {name} | {arm['states_per_episode']:.1f} | {arm['rollouts_per_episode']:.1f} "
                f"| {arm['rollouts_vs_default']:.2f} | {arm['sampled_tokens_per_episode']:.0f} "
                f"| {arm['sampled_tokens_vs_default']:.2f} | {arm['tool_result_tokens_per_episode']:.0f} "
                f"| {arm['tool_result_tokens_vs_default']:.2f} | {median:.3f} | {ratio} |"
            )
            assert row in section, row


def test_every_setting_against_the_default_interleaved(bench, harness, monkeypatch):
    calls = []
    estimate = bench.estimate

    def logged(harness, episodes, horizon, k, seed, settings=None):
        calls.append(next(n for n, s in bench.SETTING_ARMS.items() if s == (settings or {})))
        return estimate(harness, episodes, horizon, k, seed, settings)

    monkeypatch.setattr(bench, "estimate", logged)
    record = bench.measure_settings(harness, 2, k=2, n_episodes=2, repeats=2, seed=0)
    json.dumps(record)  # what the script writes
    names = list(bench.SETTING_ARMS)
    assert calls == names + names[1:] + names[:1]  # each repeat runs every arm, the order rotated by one
    arms = record["arms"]
    assert list(arms) == names and record["episodes"] == 2
    for arm in arms.values():
        assert arm["same_work_every_repeat"] and len(arm["wall_per_episode_s"]) == 2
        assert (
            arm["wall_vs_default"]["n"] == 2
            and arm["wall_vs_default"]["low"] <= arm["wall_vs_default"]["high"]
        )
    assert arms["default"]["wall_vs_default"]["ratio"] == pytest.approx(1.0)
    assert arms["default"]["sampled_tokens_vs_default"] == 1.0
    # The truncated-reward rule changes values, never what is sampled.
    fixed, truncated = arms["fixed_budget_32"], arms["fixed_budget_32_truncated_0"]
    assert fixed["sampled_tokens_per_episode"] == truncated["sampled_tokens_per_episode"]
    assert fixed["rollouts_per_episode"] == truncated["rollouts_per_episode"]
    assert arms["max_estimated_steps_2"]["states_per_episode"] <= 2
    assert arms["min_step_tokens_64"]["states_per_episode"] <= arms["default"]["states_per_episode"]
    assert len(bench.settings_table([record]).splitlines()) == 4 + len(names)  # heading, blank, header, rule


def test_ratio_interval_by_hand(bench):
    # log ratios ln(1.1), ln(0.9): mean -0.005025, sd 0.141897, t(0.975, 1) = 12.706205.
    out = bench.ratio_interval([1.1, 0.9])
    logs = [math.log(1.1), math.log(0.9)]
    centre, half = sum(logs) / 2, 12.706205 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    assert out["ratio"] == pytest.approx(math.sqrt(0.99))
    assert (out["low"], out["high"]) == pytest.approx(
        (math.exp(centre - half), math.exp(centre + half)), rel=1e-5
    )
    assert bench.ratio_interval([1.25])["low"] is None
