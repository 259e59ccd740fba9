"""benchmarks/lm_stability.py's pure pieces on tiny synthetic inputs (collapse rule, Wilson interval, censored
tokens to target and the Kaplan-Meier median, stable rate, the collapse-aware tuning rule, the verdict with its
minimum effect, the detectable difference, the strict budget, the consolidated records, the summary recomputed from
records), and ties between the committed summary and the committed records (skipped while they are absent). No model
is trained here: a fake runner stands in for training."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import lm_stability as st  # noqa: E402
from benchmarks._records import FLOAT64, compare_tree  # noqa: E402


@pytest.fixture(autouse=True)
def _small_budgets(request, monkeypatch):
    """Synthetic records spend 1,000 tokens: the study's settings get that budget here (not in the record tests)."""
    if request.node.get_closest_marker("record") is None:
        small = {n: dataclasses.replace(s, budget=1000) for n, s in st.SETTINGS.items()}
        monkeypatch.setattr(st, "SETTINGS", small)


# ---------------------------------------------------------------------------------------------- pure pieces
def test_collapse_is_two_ses_of_a_difference_below_the_start():
    se = math.sqrt(2 * 0.25 * 0.75 / 128)
    assert st.collapsed(0.25, 0.25 - 2 * se - 1e-9)
    assert not st.collapsed(0.25, 0.25 - 2 * se + 1e-9)
    assert not st.collapsed(0.25, 0.9)
    # a start at 0 floors the SE at one episode's worth, so nothing collapses below it
    assert not st.collapsed(0.0, 0.0)


def test_wilson_interval_brackets_the_share_and_stays_in_unit_range():
    low, high = st.wilson(0, 16)
    assert low == 0.0 and 0.15 < high < 0.25
    low, high = st.wilson(16, 16)
    assert high == 1.0 and 0.75 < low < 0.85
    low, high = st.wilson(8, 16)
    assert low < 0.5 < high and math.isclose(low + high, 1.0)
    assert all(math.isnan(x) for x in st.wilson(0, 0))


def _points(pairs):
    return [{"tokens": t, "success": s} for t, s in pairs]


def test_tokens_to_target_takes_the_first_evaluation_at_or_above_it_else_censors_at_the_end():
    run = _points([(0, 0.2), (100, 0.5), (200, 0.8), (300, 0.6)])
    assert st.tokens_to_target(run, 0.8) == (200, True)
    assert st.tokens_to_target(run, 0.5) == (100, True)
    assert st.tokens_to_target(run, 0.9) == (300, False)


def test_success_at_reads_the_last_evaluation_at_or_before_the_tokens():
    run = _points([(0, 0.2), (100, 0.5), (200, 0.8), (300, 0.6)])
    assert st.success_at(run, 250) == 0.8 and st.success_at(run, 200) == 0.8 and st.success_at(run, 50) == 0.2
    assert st.plateau(run) == pytest.approx(0.7)


def test_kaplan_meier_without_censoring_is_the_empirical_median():
    times, events = [10, 20, 30, 40], [True] * 4
    assert st.kaplan_meier(times, events) == [(10, 0.75), (20, 0.5), (30, 0.25), (40, 0.0)]
    assert st.km_median(times, events) == 20


def test_kaplan_meier_censoring_reduces_the_risk_set_and_hides_a_median_never_reached():
    # censored at 15: at 20 two remain at risk, one falls: S = 0.75 * 0.5
    curve = st.kaplan_meier([10, 15, 20, 30], [True, False, True, False])
    assert curve == [(10, 0.75), (20, 0.375)]
    assert st.km_median([10, 15, 20, 30], [True, False, True, False]) == 20
    # only one of four reaches the target: no median
    assert st.km_median([10, 99, 99, 99], [True, False, False, False]) is None
    with pytest.raises(ValueError):
        st.kaplan_meier([1, 2], [True])


def test_stable_rate_is_the_largest_rate_below_which_every_rate_holds_the_bound():
    # a later dip below the bound does not count
    assert st.stable_rate({1e-4: 0.0, 3e-4: 0.0625, 1e-3: 0.5, 3e-3: 0.0}) == 3e-4
    assert st.stable_rate({1e-4: 0.2, 3e-4: 0.0}) is None
    assert st.stable_rate({1e-4: 0.0, 3e-4: 0.1}) == 3e-4  # the bound itself holds


def test_tuning_rule_scores_collapsed_runs_by_their_final_success_and_ties_go_to_the_smaller_rate():
    finals = {
        1e-4: [0.40, 0.42, 0.41, 0.39],
        1e-3: [0.90, 0.92, 0.0, 0.91],  # one collapse: mean 0.6825
        3e-3: [0.93, 0.0, 0.0, 0.94],  # the best surviving runs, but half collapse
    }
    assert st.choose_rate(finals) == 1e-3
    # near-ties (within TUNING_TIE) go to the smaller, safer rate
    assert st.choose_rate({1e-3: [0.90], 3e-3: [0.91]}) == 1e-3
    assert st.choose_rate({1e-3: [0.80], 3e-3: [0.91]}) == 3e-3
    with pytest.raises(ValueError):
        st.choose_rate({1e-3: []})


def test_verdict_needs_holm_the_interval_and_the_minimum_effect():
    assert st.verdict(0.10, [0.05, 0.15], 0.01, 0.05) == "better"
    assert st.verdict(-0.10, [-0.15, -0.05], 0.01, 0.05) == "worse"
    assert st.verdict(0.01, [0.005, 0.015], 1e-6, 0.05) == "level"  # significant but below the minimum effect
    assert st.verdict(0.30, [-0.05, 0.65], 0.20, 0.05) == "level"  # large but not significant after Holm
    assert st.verdict(0.30, [0.1, 0.5], math.nan, 0.05) == "level"


def test_detectable_difference_grows_with_the_family_and_shrinks_with_seeds():
    one = st.detectable_difference(0.05, 24, 1)
    eight = st.detectable_difference(0.05, 24, 8)
    assert 0.05 * 2.7 < one < 0.05 * 3.0  # (t_0.975,23 + t_0.8,23) = 2.069 + 0.858
    assert eight > one
    assert st.detectable_difference(0.05, 48, 8) < eight
    assert math.isnan(st.detectable_difference(0.05, 1, 8))


# ---------------------------------------------------------------------------------------------- strict budget
def test_a_step_that_would_pass_the_budget_is_refused_and_nothing_is_spent_on_it():
    ledger = st.StrictLedger(1000, charge_mc=True, checkpoints=4)
    assert ledger.admit(300, 100) and ledger.spent == 400
    assert ledger.admit(300, 100) and ledger.spent == 800
    assert not ledger.admit(150, 100)  # 1050 > 1000: refused
    assert ledger.spent == 800 and ledger.refused == {"own_tokens": 150, "mc_tokens": 100}
    assert ledger.admit(100, 100) is True and ledger.spent == 1000  # exactly the budget is allowed


def test_uncharged_continuations_are_recorded_but_not_spent():
    ledger = st.StrictLedger(1000, charge_mc=False)
    assert ledger.admit(100, 50_000)
    assert ledger.spent == 100 and ledger.mc == [50_000]


def test_the_dead_run_rule_asks_for_an_evaluation_after_each_run_of_zero_reward_steps():
    ledger = st.StrictLedger(1000, charge_mc=True)
    asked = []
    for step in range(40):
        ledger.note_rewards([0.0] * 8 if step != 5 else [0.0] * 7 + [1.0])
        asked.append(ledger.dead_check_due(every=16))
    # one success at step 5 resets the streak: checks after steps 21 and 37 (16 and 32 zero steps)
    assert [i for i, a in enumerate(asked) if a] == [21, 37]


def test_checkpoints_fall_due_once_per_crossed_mark():
    ledger = st.StrictLedger(1000, charge_mc=True, checkpoints=4)  # marks 250, 500, 750
    due = []
    for own in (100, 100, 100, 400, 100):
        ledger.admit(own, 0)
        due.append(ledger.due())
    assert due == [False, False, True, True, True]  # 300 crosses 250, 700 crosses 500, 800 crosses 750
    ledger2 = st.StrictLedger(1000, charge_mc=True, checkpoints=4)
    ledger2.admit(800, 0)
    assert ledger2.due() is True and ledger2.due() is False  # three marks crossed at once give one evaluation


# ---------------------------------------------------------------------------------------------- records
def _record(
    stage, arm, lr, seed, finals, *, setting="chain_H2", model="small", budget=1000, start=0.25, ref=False
):
    """A synthetic run record: evaluations at 0, 500 and 1000 tokens with the successes ``finals``."""
    points = [{"step": i, "tokens": 500 * i, "success": s, "own_tokens": 500 * i, "mc_tokens": 0}
              for i, s in enumerate([start, *finals])]  # fmt: skip
    return {
        "stage": stage, "setting": setting, "model": model, "arm": arm, "lr": lr, "seed": seed,
        "eval_seed": 7, "budget": budget, "reference": ref, "charge_mc": not ref, "start_success": start,
        "final_success": finals[-1], "checkpoints": points, "steps": 2, "own_tokens": 1000, "mc_tokens": 0,
        "sampled_tokens": 1000, "underspend": budget - 1000, "collapsed": st.collapsed(start, finals[-1]),
    }  # fmt: skip


def test_a_run_that_stops_without_reaching_the_target_is_censored_at_its_budget_not_where_it_stopped():
    # One run reaches 0.8 at 1,000 tokens; three are stopped early by the dead-run rule at 500 (final 0). Censored
    # where they stopped, they would leave the risk set before 1,000 and the one run would make a median of 1,000;
    # their outcome is final, so they stay at risk to the budget and no median exists (1 of 4 reach the target).
    reached = _record("sweep", "grpo", 1e-3, 0, [0.5, 0.8])
    dead = [_record("sweep", "grpo", 1e-3, s, [0.0]) for s in (1, 2, 3)]
    cell = st.runs_cell([reached, *dead], target=0.8)
    assert cell["reached_share"] == 0.25
    assert cell["tokens_to_target"] == [1000, None, None, None]
    assert cell["restricted_tokens"] == [1000, 1000, 1000, 1000]
    assert cell["km_median_tokens"] is None
    # Arrivals at 500, 1,000 and 1,500 of a 1,500 budget, and three runs stopped dead at 500: half arrive, so the
    # (lower) median is the third arrival, 1,500. Censored where they stopped, the dead runs would leave the risk
    # set at 500, survival would fall to 0.42 at 1,000, and the median would read 1,000.
    arrivals = [_record("sweep", "grpo", 1e-3, s, path, budget=1500)
                for s, path in enumerate([[0.9, 0.9, 0.9], [0.5, 0.9, 0.9], [0.5, 0.5, 0.9]])]  # fmt: skip
    stopped = [_record("sweep", "grpo", 1e-3, s, [0.0], budget=1500) for s in (3, 4, 5)]
    assert st.runs_cell([*arrivals, *stopped], target=0.8)["km_median_tokens"] == 1500


def test_records_append_as_gzip_members_and_read_back_whole(tmp_path):
    path = tmp_path / "runs.jsonl.gz"
    assert st.read_records(path) == []
    a, b = _record("sweep", "grpo", 1e-3, 0, [0.5, 0.9]), _record("sweep", "grpo", 1e-3, 1, [0.5, 0.0])
    st.append_record(path, a)
    st.append_record(path, b)
    assert st.read_records(path) == [a, b]
    with gzip.open(
        path, "rt"
    ) as f:  # any gzip reader sees every member: the studies' archive lines (_runs.py)
        assert [json.loads(line) for line in f] == [{"key": st.record_key(r), "value": r} for r in (a, b)]


def test_a_member_cut_short_by_a_kill_is_dropped_and_the_rest_kept(tmp_path):
    path = tmp_path / "runs.jsonl.gz"
    a = _record("sweep", "grpo", 1e-3, 0, [0.5, 0.9])
    st.append_record(path, a)
    whole = gzip.compress(json.dumps(a).encode())
    path.write_bytes(path.read_bytes() + whole[: len(whole) // 2])
    assert st.read_records(path) == [a]


def test_a_runner_whose_record_names_another_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "provenance", lambda threads: {"commit": "abc"})
    spec = st.RunSpec("sweep", "chain_H2", "small", "grpo", 1e-3, 0, 7, 1000)
    with pytest.raises(RuntimeError, match="not sweep/chain_H2"):
        st.run_queue(
            [spec], path=tmp_path / "r.gz", runner=lambda s: _record("sweep", "grpo", 1e-3, 1, [0.5])
        )


def test_run_queue_skips_recorded_runs_and_appends_each_new_one(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "provenance", lambda threads: {"commit": "abc", "torch_threads": threads})
    path = tmp_path / "runs.jsonl.gz"
    specs = [st.RunSpec("sweep", "chain_H2", "small", "grpo", lr, 0, 7, 1000) for lr in (1e-4, 1e-3)]
    ran = []

    def fake(spec):
        ran.append(spec.key)
        return _record(spec.stage, spec.arm, spec.lr, spec.seed, [0.5, 0.6])

    assert st.run_queue(specs[:1], path=path, runner=fake) == 1
    assert st.run_queue(specs, path=path, runner=fake) == 1  # the first is skipped
    assert ran == [specs[0].key, specs[1].key]
    records = st.read_records(path)
    assert [st.record_key(r) for r in records] == [s.key for s in specs]
    assert all(r["machine"]["commit"] == "abc" and "wall_seconds" in r for r in records)


def _synthetic_study():
    """Two arms x two rates x 4 sweep seeds, then a head-to-head of 4 seeds at each arm's tuned rate."""
    records = []
    for seed in range(4):
        records.append(_record("sweep", "grpo", 1e-4, seed, [0.5, 0.8]))
        records.append(_record("sweep", "grpo", 1e-3, seed, [0.9, 0.9] if seed < 2 else [0.9, 0.0]))
        records.append(_record("sweep", "rloo", 1e-4, seed, [0.6, 0.9]))
        records.append(_record("sweep", "rloo", 1e-3, seed, [0.9, 0.0]))
    for seed in range(100, 104):
        records.append(_record("h2h", "grpo", 1e-4, seed, [0.5, 0.78 + 0.01 * (seed % 2)]))
        records.append(_record("h2h", "rloo", 1e-4, seed, [0.85, 0.90 + 0.01 * (seed % 3)]))
    return records


def test_summary_recomputes_curve_target_tuning_and_head_to_head_from_records(monkeypatch):
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    summary = st.summarize(_synthetic_study())
    cell = next(c for c in summary["curve"] if (c["arm"], c["lr"]) == ("grpo", 1e-3))
    assert cell["collapsed"] == [False, False, True, True] and cell["collapse_rate"] == 0.5
    assert (
        cell["success"] == [0.9, 0.9, 0.0, 0.0] and cell["budget"] == 1000 and cell["seeds"] == [0, 1, 2, 3]
    )
    # target: 0.9 x the best stable practical plateau (rloo at 1e-4: mean of 0.6 and 0.9 = 0.75)
    # (the larger model, which runs at chain H = 2, is scored against the same bar)
    assert summary["targets"] == [
        {"setting": "chain_H2", "model": m, "target": pytest.approx(0.675)} for m in ("large", "small")
    ]
    # the end against the last reading at or before 3/4 of the budget (the 500-token one)
    assert cell["gain_last_quarter"] == pytest.approx((0.0 - 0.9 * 2) / 4)
    assert cell["tokens_to_target"] == [500] * 4 and cell["reached_share"] == 1.0  # reached, then collapsed
    lines = {a["arm"]: a for a in summary["arms"]}
    assert lines["grpo"]["stable_rate"] == 1e-4 and lines["grpo"]["chosen_lr"] == 1e-4  # 0.8 beats 0.45
    assert lines["rloo"]["spans"] and not lines["grpo"]["spans"]
    h2h = {r["arm"]: r for r in summary["head_to_head"]}
    assert h2h["rloo"]["tuning_seeds"] == [0, 1, 2, 3] and h2h["rloo"]["seeds"] == [100, 101, 102, 103]
    vs = h2h["rloo"]["vs_grpo"]
    assert vs["success"]["mean"] == pytest.approx(
        sum(0.90 + 0.01 * (s % 3) - 0.78 - 0.01 * (s % 2) for s in range(100, 104)) / 4
    )
    assert vs["tokens_saved"]["mean"] == 500  # rloo reaches 0.675 at 500, GRPO at 1000
    assert vs["success"]["family"] == 2 and vs["success"]["verdict"] in ("better", "level")
    assert "vs_grpo" not in h2h["grpo"]


def test_runs_at_a_replaced_budget_stay_in_the_file_and_out_of_the_study(monkeypatch):
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    records = _synthetic_study()
    old = [_record("sweep", "grpo", 1e-4, s, [0.1, 0.1], budget=500) for s in range(4)]
    pilot = _record("pilot", "grpo", 1e-4, 0, [0.5, 0.6], budget=500)
    assert st.study_records([*old, pilot, *records]) == [pilot, *records]
    summary = st.summarize([*old, *records])
    assert summary["superseded_runs"] == 4 and summary["runs"] == len(records) + 4
    assert summary == {**st.summarize(records), "superseded_runs": 4, "runs": len(records) + 4}


def test_reference_arms_stay_out_of_the_holm_family(monkeypatch):
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    records = _synthetic_study()
    records += [_record("h2h", "oracle_uncharged", 1e-4, s, [0.9, 0.95], ref=True) for s in range(100, 104)]
    h2h = {r["arm"]: r for r in st.summarize(records)["head_to_head"]}
    assert "p_holm" not in h2h["oracle_uncharged"]["vs_grpo"]["success"]
    assert h2h["rloo"]["vs_grpo"]["success"]["family"] == 2


# ---------------------------------------------------------------------------------------------- committed records
def _committed():
    records = st.read_records(st.RECORDS)
    if not records or not st.SUMMARY.exists():
        pytest.skip("no committed lm_stability records and summary yet")
    return records, json.loads(st.SUMMARY.read_text(encoding="utf-8"))


@pytest.mark.record
def test_committed_summary_recomputes_from_the_committed_records():
    records, summary = _committed()
    # records are only appended, so the summary was made from the first summary["runs"] of them (workers may have
    # appended more since)
    assert len(records) >= summary["runs"]
    fresh = json.loads(json.dumps(st.summarize(records[: summary["runs"]])))
    assert compare_tree(fresh, summary, FLOAT64) == []


@pytest.mark.record
def test_committed_records_name_their_machine_and_keep_their_budget():
    records, _ = _committed()
    for r in records:
        assert r["sampled_tokens"] <= r["budget"], r
        assert r["underspend"] == r["budget"] - r["sampled_tokens"]
        for key in ("commit", "cpu", "torch", "trl", "transformers", "torch_threads"):
            assert key in r["machine"], (key, st.record_key(r))
        if not r["charge_mc"]:
            assert r["mc_tokens"] >= 0 and r["sampled_tokens"] == r["own_tokens"]
    keys = [st.record_key(r) for r in records]
    assert len(keys) == len(set(keys)), "a run is recorded twice"


def test_plot_draws_a_setting_from_a_summary(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    summary = json.loads(json.dumps(st.summarize(_synthetic_study())))
    out = tmp_path / "stability.png"
    assert "4 cells" in st.plot(summary, "chain_H2", out) and out.stat().st_size > 1000
    with pytest.raises(ValueError, match="no curve"):
        st.plot(summary, "frozenlake_4x4", out)


def test_demo_stability_flag_plots_from_the_summary_without_training(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import subprocess

    script = (ROOT / "scripts" / "demo.sh").read_text()
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "demo.sh")], check=True)
    assert "--stability" in script and "lm_stability.py --plot" in script
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    summary_path = tmp_path / "lm_stability.json"
    summary_path.write_text(json.dumps(st.summarize(_synthetic_study())))
    monkeypatch.setattr(st, "SUMMARY", summary_path)
    monkeypatch.setattr(st, "run_one", lambda spec: pytest.fail("the demo must not train"))
    out = tmp_path / "stability.png"
    assert st.main(["--plot", "chain_H2", "--output", str(out)]) == 0
    assert out.exists()


def test_a_claimed_run_is_left_to_the_worker_that_holds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "provenance", lambda threads: {"commit": "abc"})
    path = tmp_path / "runs.jsonl.gz"
    spec = st.RunSpec("sweep", "chain_H2", "small", "grpo", 1e-3, 0, 7, 1000)
    with st.Claim(spec.key, path) as mine:
        assert mine.held
        with st.Claim(spec.key, path) as other:  # a second claimant (flock is per open file) loses
            assert not other.held
        assert st.run_queue([spec], path=path, runner=lambda s: pytest.fail("claimed elsewhere")) == 0
    again = st.run_queue([spec], path=path, runner=lambda s: _record("sweep", "grpo", 1e-3, 0, [0.5, 0.6]))
    assert again == 1


def test_study_order_finishes_the_first_setting_and_the_larger_model_before_the_next():
    assert st.study_order(["frozenlake_4x4", "chain_H2"]) == [
        ("sweep", ["chain_H2"]), ("h2h", ["chain_H2"]), ("large", ["chain_H2"]),
        ("sweep", ["frozenlake_4x4"]), ("h2h", ["frozenlake_4x4"]),
    ]  # fmt: skip


def test_the_extension_rule_extends_each_end_that_does_not_hold_once_its_seeds_are_in(monkeypatch):
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    monkeypatch.setattr(st, "SWEEP_SEEDS", (0, 1))
    survive, collapse = [0.5, 0.9], [0.5, 0.0]
    records = [_record("sweep", "grpo", 1e-4, 0, survive), _record("sweep", "grpo", 1e-3, 0, collapse)]
    records.append(_record("sweep", "grpo", 1e-3, 1, survive))  # the top is whole, one of 2 survived
    assert st.rates_for("chain_H2", "grpo", records) == (1e-4, 1e-3, 3e-3)  # the bottom (1 of 2 seeds) waits
    records.append(_record("sweep", "grpo", 1e-4, 1, collapse))  # the bottom is whole: one collapsed
    assert st.rates_for("chain_H2", "grpo", records) == (3.33e-5, 1e-4, 1e-3, 3e-3)
    records += [_record("sweep", "grpo", 3e-3, s, collapse) for s in (0, 1)]  # the new top: all collapsed
    records += [_record("sweep", "grpo", 3.33e-5, s, survive) for s in (0, 1)]  # the new bottom: none
    assert st.rates_for("chain_H2", "grpo", records) == (3.33e-5, 1e-4, 1e-3, 3e-3)
    assert st.chosen_rate(records, "chain_H2", "small", "grpo", "sweep", (0, 1)) == 3.33e-5
    assert st.rates_for("chain_H2", "rloo", records) == (1e-4, 1e-3)  # per arm


def test_the_extension_rule_adds_rates_to_one_arm_and_tuning_waits_for_them(monkeypatch):
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    monkeypatch.setattr(st, "SWEEP_SEEDS", (0, 1))
    monkeypatch.setattr(st, "EXTRA_RATES", {("chain_H2", "rloo"): (1e-2,)})
    assert st.rates_for("chain_H2", "rloo") == (1e-4, 1e-3, 1e-2)
    assert st.rates_for("chain_H2", "grpo") == (1e-4, 1e-3)
    specs = st.sweep_specs(["chain_H2"], ["grpo", "rloo", "oracle_uncharged"])
    assert {(s.arm, s.lr) for s in specs} == {("grpo", 1e-4), ("grpo", 1e-3), ("rloo", 1e-4), ("rloo", 1e-3),
                                               ("rloo", 1e-2)}  # fmt: skip
    records = [_record("sweep", "rloo", lr, seed, [0.5, 0.9]) for lr in (1e-4, 1e-3) for seed in (0, 1)]
    assert st.chosen_rate(records, "chain_H2", "small", "rloo", "sweep", (0, 1)) is None  # 1e-2 is missing
    records += [_record("sweep", "rloo", 1e-2, seed, [0.5, 0.0]) for seed in (0, 1)]
    assert st.chosen_rate(records, "chain_H2", "small", "rloo", "sweep", (0, 1)) == 1e-4


def test_progress_counts_recorded_runs_against_the_plan():
    plan = st.planned()
    assert plan[("sweep", "chain_H2")] == 6 * len(st.RATES) * 16  # five practical arms and the charged oracle
    assert plan[("sweep", "frozenlake_4x4")] == 5 * len(st.RATES) * 16
    assert plan[("h2h", "chain_H2")] == 6 * 24 and plan[("large_h2h", "chain_H2")] == 24
    records = [{**_record("sweep", "grpo", 1e-3, s, [0.5, 0.6]), "cpu_seconds": 30.0} for s in range(3)]
    lines = st.progress_lines(records)
    assert lines[0].split()[:5] == ["sweep", "chain_H2", "3", "of", str(plan[("sweep", "chain_H2")])]
    assert lines[-1].startswith("about ")


def test_the_whole_study_runs_in_order_once_each_with_a_fake_trainer(tmp_path, monkeypatch):
    """--stage all on a shrunken plan: every planned run exactly once, each stage only after the one it needs, the
    larger model between the first setting and the second, tuned rates and the best credit arm read from records."""
    monkeypatch.setattr(st, "RECORDS", tmp_path / "runs.jsonl.gz")
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    monkeypatch.setattr(st, "SWEEP_SEEDS", (0, 1))
    monkeypatch.setattr(st, "H2H_SEEDS", (100, 101))
    monkeypatch.setattr(st, "LARGE_TUNE_SEEDS", (300,))
    monkeypatch.setattr(st, "LARGE_SEEDS", (200, 201))
    monkeypatch.setattr(st, "provenance", lambda threads: {"commit": "abc"})
    monkeypatch.setattr(st, "ensure_large_warmup", lambda threads: True)
    # rloo learns best and survives 1e-3 (where it ends 0.04 higher); everyone else collapses there
    quality = {"grpo": 0.8, "rloo": 0.95, "anchor_pooled": 0.85, "vineppo_k1_reuse": 0.9, "gae_warm": 0.7}

    def fake(spec):
        good = spec.lr == 1e-4 or spec.arm in ("rloo", "oracle_charged")
        final = quality.get(spec.arm, 0.9) - 0.001 * (spec.seed % 3) if good else 0.0
        final += 0.04 if (spec.arm, spec.lr) == ("rloo", 1e-3) else 0.0
        r = _record(spec.stage, spec.arm, spec.lr, spec.seed, [0.5, final], setting=spec.setting,
                    model=spec.model, budget=spec.budget, ref=st.ARMS[spec.arm].reference)  # fmt: skip
        return {**r, "eval_seed": spec.eval_seed}

    monkeypatch.setattr(st, "run_one", fake)
    st.run_stages("all", list(st.SETTINGS), list(st.ARMS), threads=1, wait_seconds=0)
    records = st.read_records()
    keys = [st.record_key(r) for r in records]
    assert len(keys) == len(set(keys))
    order = [(r["stage"], r["setting"]) for r in records]
    first = {k: order.index(k) for k in dict.fromkeys(order)}
    last = {k: len(order) - 1 - order[::-1].index(k) for k in first}
    chain, lake = "chain_H2", "frozenlake_4x4"
    assert last[("sweep", chain)] < first[("h2h", chain)]
    assert (
        last[("h2h", chain)] < first[("large_tune", chain)]
        and last[("large_h2h", chain)] < first[("sweep", lake)]
    )
    assert last[("sweep", lake)] < first[("h2h", lake)]
    counts = {k: order.count(k) for k in first}
    assert counts == {k: v for k, v in st.planned(records=records).items() if v}
    # rloo and the oracle survive the top rate, so the extension rule took each up three times (x3, capped)
    assert st.rates_for(chain, "rloo", records) == (1e-4, 1e-3, 3e-3, 9e-3, 2.7e-2)
    assert st.rates_for(chain, "grpo", records) == (1e-4, 1e-3)
    h2h = {(r["setting"], r["arm"]): r["lr"] for r in records if r["stage"] == "h2h"}
    assert h2h[(chain, "rloo")] == 1e-3 and h2h[(chain, "grpo")] == 1e-4  # tuned by the collapse-aware rule
    assert {r["arm"] for r in records if r["model"] == "large"} == {"grpo", "rloo"}  # the best credit arm
    assert all(r["eval_seed"] == st.H2H_EVAL_SEED for r in records if r["stage"].endswith("h2h"))


def test_a_worker_waits_for_a_run_another_worker_holds_instead_of_starting_a_later_stage(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(st, "RECORDS", tmp_path / "runs.jsonl.gz")
    monkeypatch.setattr(st, "RATES", (1e-4,))
    monkeypatch.setattr(st, "SWEEP_SEEDS", (0,))
    monkeypatch.setattr(st, "provenance", lambda threads: {"commit": "abc"})
    arms = ["grpo", "rloo"]
    held_spec = st.sweep_specs(["chain_H2"], arms)[0]
    other = st.Claim(held_spec.key).__enter__()  # "another worker" runs it
    waits = []

    def sleep(seconds):
        waits.append(len(st.read_records()))
        other.__exit__()  # the other worker is gone; its claim with it

    monkeypatch.setattr(st.time, "sleep", sleep)

    def fake(spec):
        record = _record(spec.stage, spec.arm, spec.lr, spec.seed, [0.5, 0.6], budget=spec.budget)
        return {**record, "eval_seed": spec.eval_seed}

    monkeypatch.setattr(st, "run_one", fake)
    st.run_stages("all", ["chain_H2"], arms, threads=1, wait_seconds=0)
    stages = [r["stage"] for r in st.read_records()]
    # it ran what it could of the sweep (rloo's run, and the rate above it that the extension rule then added), then
    # waited for the held run rather than start the head-to-head; after it, the sweep was finished first
    assert len(waits) == 1 and stages[: waits[0]] == ["sweep"] * waits[0]
    assert held_spec.key in {st.record_key(r) for r in st.read_records()}
    first_h2h = stages.index("h2h")
    assert set(stages[:first_h2h]) == {"sweep"} and set(stages[first_h2h:]) == {"h2h"}


def test_tables_show_every_cell_and_label_references_and_verdicts(monkeypatch):
    monkeypatch.setattr(st, "RATES", (1e-4, 1e-3))
    records = _synthetic_study()
    records += [_record("h2h", "oracle_charged", 1e-4, s, [0.9, 0.95], ref=True) for s in range(100, 104)]
    summary = json.loads(json.dumps(st.summarize(records)))
    curve = st.curve_table(summary, "chain_H2")
    assert sum(line.startswith("| `") for line in curve) == 4 + 2  # 2 arms x 2 rates, then 2 arm lines
    assert any("| `grpo` | 0.001 | 4 | 2/4 [" in line for line in curve)
    h2h = st.h2h_table(summary, "chain_H2")
    rloo = next(line for line in h2h if line.startswith("| `rloo`"))
    assert "better (" in rloo or "level (" in rloo
    oracle = next(line for line in h2h if line.startswith("| `oracle_charged` (reference)"))
    assert "(raw)" in oracle and "reference" in oracle


@pytest.mark.record
def test_the_demo_plot_draws_every_committed_cell_of_its_setting(tmp_path):
    pytest.importorskip("matplotlib")
    _, summary = _committed()
    cells = [c for c in summary["curve"] if (c["setting"], c["model"]) == ("chain_H2", "small")]
    if not cells:
        pytest.skip("no chain_H2 sweep runs committed yet")
    said = st.plot(summary, "chain_H2", tmp_path / "stability.png")
    assert f"({len(cells)} cells of chain_H2)" in said
