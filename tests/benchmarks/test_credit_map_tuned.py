"""benchmarks/credit_map_tuned.py: the tuning rule, the resumable runner, Holm only on complete families, and the
committed summary, page lead and README bullet regenerate from the committed records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import credit_map_tuned as cmt  # noqa: E402
from _runs import append_run, append_runs, load_runs, read_run, run_keys  # noqa: E402


def _rec(success: float, steps: int = 3) -> dict:
    return {
        "budgets": {
            f"{f:g}": {"success": success, "steps": steps, "sampled_tokens": 10} for f in cmt.FRACTIONS
        }
    }


def test_the_rule_takes_the_best_tuning_mean_ties_to_the_smaller_lr_and_skips_points_without_updates():
    records = {(lr, p, s): _rec(0.5) for lr, p in cmt.GRID for s in cmt.TUNING_SEEDS}
    for s in cmt.TUNING_SEEDS:
        records[(1.0, 2, s)] = _rec(0.9)
        records[(0.3, 4, s)] = _rec(0.9)  # tie on the mean: the smaller lr wins
        records[(3.0, 1, s)] = _rec(1.0, steps=0)  # never updates: not eligible however good
    assert cmt.choose(records, 1.0) == {"lr": 0.3, "prompts": 4, "group": cmt.GROUP, "tuning_mean": 0.9}
    none_update = {k: _rec(0.5, steps=0) for k in records}
    assert cmt.choose(none_update, 0.25) is None  # "cannot afford"
    del records[(0.03, 1, cmt.TUNING_SEEDS[0])]
    assert cmt.choose(records, 1.0) is None  # tuning not finished: no choice yet


def test_runner_resumes_and_reruns_a_foreign_record(tmp_path, monkeypatch):
    monkeypatch.setattr(cmt, "GRID", ((1.0, 1), (0.1, 2)))
    monkeypatch.setattr(cmt, "TUNING_SEEDS", (1000,))
    monkeypatch.setattr(cmt, "EVAL_SEEDS", (0, 1))
    cell = {**cmt.MAP_CELLS[-2], "horizon": 2, "budget_episodes": 16, "name": "tiny"}
    runner = cmt.Runner(tmp_path, 10, quiet=True)
    cmt.run_cell(runner, cell, ["grpo", "oracle"])
    expected = sum(
        2 + 2 * len(cmt.tuned_points(cmt.load_arm(tmp_path, "tiny", a))) for a in ("grpo", "oracle")
    )
    assert runner.ran == expected  # 2 grid points x 1 tuning seed, then 2 seeds at each chosen point
    line = next(iter(load_runs(tmp_path, "tiny/grpo/*.json").values()))
    assert set(line["budgets"]) == {"0.25", "0.5", "1"} and line["machine"]["torch_threads"] >= 1
    assert line["budgets"]["1"]["steps"] >= line["budgets"]["0.25"]["steps"]
    again = cmt.Runner(tmp_path, 10, quiet=True)
    cmt.run_cell(again, cell, ["grpo", "oracle"])
    assert again.ran == 0
    key = run_keys(tmp_path, "tiny/oracle/*.json")[0]
    append_run(tmp_path, key, {"settings": None})  # a foreign record: run again
    third = cmt.Runner(tmp_path, 10, quiet=True)
    cmt.run_cell(third, cell, ["grpo", "oracle"])
    assert third.ran == 1


def test_holm_waits_for_a_complete_family():
    def arm(name: str, success: list[float], status: str = "complete") -> dict:
        return {"arm": name, "status": status, "success": success}

    grpo = arm("grpo", [0.5] * 24)
    group = [grpo, arm("oracle", [0.9] * 12 + [0.8] * 12), arm("rloo", [0.5] * 20, "partial")]
    assert cmt.decide(group) is False and group[1]["vs_best_grpo"]["verdict"] == "pending"
    group = [grpo, arm("oracle", [0.9] * 12 + [0.8] * 12), arm("vineppo_k4", [], "cannot afford")]
    assert cmt.decide(group) is True
    assert group[1]["vs_best_grpo"]["verdict"] == "pays" and "vs_best_grpo" not in group[2]


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(cmt.SUMMARY.read_text())


@pytest.mark.record
def test_committed_summary_page_and_readme_regenerate_from_the_committed_records(committed):
    assert json.loads(json.dumps(cmt.summarize(cmt.RUNS))) == committed
    page = cmt.PAGE.read_text()
    assert page.split(cmt.MARKER)[0] == cmt.render_lead(committed, cmt.lm_block()) + "\n"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert " ".join(cmt.readme_bullet(committed).split()) in readme
    for r in committed["records"]:
        assert {"arm", "budget_fraction", "chosen", "tuning_seeds", "seeds", "success", "sampled_tokens",
                "collapsed"} <= set(r)  # fmt: skip
        assert len(r["success"]) == len(r["seeds"]) == len(r["collapsed"])


def test_the_hard_cell_is_the_scouts_choice_by_the_rule(committed):
    scout = committed["hard_scout"]
    first = next(c for c in scout["candidates"] if c["tuned_grpo"]["tuning_mean"] <= cmt.HARD_CEILING)
    assert scout["chosen"] == first["cell"] == json.loads(cmt.HARD_CHOICE.read_text())["chosen"]
    assert [c["cell"] for c in scout["candidates"]] == list(cmt.HARD_CANDIDATES)


@pytest.mark.record
def test_committed_anchor_runs_reproduce_through_the_librarys_estimator():
    """The tuned map's anchor arms now go through AnchorEstimator; re-running committed runs of the cheapest cell
    (H = 2) reproduces their records within benchmarks/_records.py's toy rule. How many re-runs match to the bit is
    reported, not asserted: on another CPU the last bits differ (issue 57: 1.1e-16 on an AVX-512 Xeon)."""
    cell = next(c for c in cmt.MAP_CELLS if c["name"] == "shared_delayed_H2_r0.15")
    result = cmt.rerun(cmt.RUNS, [cell], ["anchor_pool_state", "anchor_norm_state"], per_cell=1, seed=3)
    assert result["comparison"]["found"] >= 4 and not result["comparison"]["outside"], result["comparison"]
    for arm in ("anchor_pool_state", "anchor_norm_state"):
        tally = result["per_arm"][arm]
        assert tally["runs"] >= 2 and tally["within"] == tally["runs"], (arm, tally)


@pytest.mark.record
def test_compare_runs_and_summaries_see_a_changed_run(tmp_path):

    cell = "shared_delayed_H2_r0.15"
    append_runs(tmp_path, list(load_runs(cmt.RUNS, f"{cell}/*/*.json").items()))
    same = cmt.compare_runs(tmp_path, cmt.RUNS, ["anchor_pool_state"])
    assert same["runs"] == same["identical"] == same["within"] > 0 and same["counts_equal"]
    key = run_keys(tmp_path, f"{cell}/anchor_pool_state/*.json")[0]
    first = read_run(tmp_path, key)
    first["budgets"]["1"]["success"] += 0.01
    first["budgets"]["1"]["steps"] += 1
    append_run(tmp_path, key, first)
    moved = cmt.compare_runs(tmp_path, cmt.RUNS, ["anchor_pool_state"])
    assert moved["within"] == moved["runs"] - 1 and not moved["counts_equal"]
    assert moved["largest"] == pytest.approx(1.0)  # the step count's difference is the largest


@pytest.mark.record
def test_a_last_bit_difference_is_within_the_rule_though_not_identical(tmp_path):
    """What issue 57's Xeon saw (a re-run 1.1e-16 from its record, which switching kernels does not reproduce on
    our CPU): one run's success moved by one unit in the last place is within the toy rule, and only the count of
    identical runs, which is reported and never asserted across machines, sees it."""
    import math

    cell = "shared_delayed_H2_r0.15"
    append_runs(tmp_path, list(load_runs(cmt.RUNS, f"{cell}/*/*.json").items()))
    key = run_keys(tmp_path, f"{cell}/anchor_pool_state/*.json")[0]
    first = read_run(tmp_path, key)
    success = first["budgets"]["1"]["success"]
    first["budgets"]["1"]["success"] = math.nextafter(success, -math.inf if success > 0 else math.inf)
    append_run(tmp_path, key, first)
    nudged = cmt.compare_runs(tmp_path, cmt.RUNS, ["anchor_pool_state"])
    assert nudged["within"] == nudged["runs"] > 0 and nudged["counts_equal"]
    assert nudged["identical"] == nudged["runs"] - 1


def test_a_difference_below_the_minimum_effect_is_level_whatever_its_p():
    """The protocol's amendment of 2026-12-07: Holm's p alone does not make a verdict; a paired difference of 1e-5 in
    success with a p far below 0.05 is level."""

    def arm(name: str, success: list[float]) -> dict:
        return {"arm": name, "status": "complete", "success": success}

    grpo = [0.5 + 0.01 * (i % 4) for i in range(24)]
    tiny = arm("rloo", [g + 1e-5 + 1e-9 * (i % 3) for i, g in enumerate(grpo)])
    large = arm("oracle", [g + 0.2 + 0.01 * (i % 2) for i, g in enumerate(grpo)])
    group = [arm("grpo", grpo), large, tiny]
    assert cmt.decide(group) is True
    assert tiny["vs_best_grpo"]["p_holm"] < 1e-6 and tiny["vs_best_grpo"]["verdict"] == "level"
    assert large["vs_best_grpo"]["verdict"] == "pays"
    assert cmt.MIN_EFFECT == 0.05
    assert cmt.verdict(-1e-5, 1e-12) == "level" and cmt.verdict(-0.06, 0.01) == "loses"
    assert cmt.verdict(0.3, 0.2) == "level"


def test_a_run_read_at_three_budgets_is_one_run_in_the_collapse_counts():
    """One run gives the 1/4, 1/2 and 1x readings: seed 0's run is below its start at all three, seed 1's only at
    1/4; that is 1 of 2 runs ended below the start (2 below it at some reading), not 4 of 6 readings."""
    setting = {"name": "s", "structure": "recovery", "horizon": 16, "start_rate": 0.15}
    chosen = {"lr": 3.0, "prompts": 4, "group": 4}
    below = {0.25: [True, True], 0.5: [True, False], 1.0: [True, False]}
    tested = [
        (
            setting,
            f,
            [{"arm": "grpo", "status": "complete", "chosen": chosen, "seeds": [0, 1], "collapsed": c}],
        )
        for f, c in below.items()
    ]
    assert cmt.run_collapses(tested, "grpo") == (1, 2, 2)
    assert cmt.collapse_totals(tested) == "`grpo` 1/2"
    assert "in 1 of its 2 evaluation runs" in cmt.grpo_collapse_sentence(tested)
    other = dict(chosen, lr=1.0)  # a different point chosen at 1/2: its runs are other runs
    tested[1][2][0]["chosen"] = other
    assert cmt.run_collapses(tested, "grpo") == (2, 3, 4)


def test_the_oracle_is_labelled_a_reference_in_the_readme_bullet_and_the_page(committed):
    """The toy's oracle is tuned on the grid like every arm, but its exact values cost nothing: the README bullet, the
    page's lead and its tables say so."""
    assert cmt.ORACLE_LABEL[1:] in cmt.readme_bullet(committed)
    lead = cmt.render_lead(committed)
    assert cmt.ORACLE_LABEL[1:] in lead and f"| {cmt.ORACLE_CELL} |" in lead
    assert "| `oracle` |" not in lead
    assert f"under {cmt.MIN_EFFECT:g} in success is level" in cmt.readme_bullet(committed)


def test_where_the_wins_lie_is_computed_from_the_summary(committed):
    """The sentence the language-model map cites follows the summary: with the gauntlet's oracle wins made level,
    it names one family."""
    import copy

    assert "in 4 of 21 families" in cmt.toy_answer(committed)
    changed = copy.deepcopy(committed)
    for r in changed["records"]:
        if r["arm"] == "oracle" and r["setting"].startswith("gauntlet"):
            r["vs_best_grpo"]["verdict"] = "level"
    text = cmt.toy_answer(changed)
    assert (
        "in 1 of 21 families (shared/recovery H=16 start=0.15 at 0.25x)" in text
        and "below its start in 17% of its runs" in text
    )
