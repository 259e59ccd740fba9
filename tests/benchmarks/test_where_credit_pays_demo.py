"""benchmarks/where_credit_pays_demo.py, the offline demo's crossover mode: the crossover is found by the rule on the
committed map, the demo's runs equal the committed records within tolerance, and the printed gaps are the paired tests of its runs."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import horizon_sweep as hs  # noqa: E402
import where_credit_pays_demo as demo  # noqa: E402
from _records import FLOAT64  # noqa: E402
from _runs import read_run  # noqa: E402

from mcadvantage.evaluation.stats import paired_t_test  # noqa: E402


@pytest.fixture(scope="module")
def summary() -> dict:
    return json.loads(hs.SUMMARY.read_text())


def test_the_crossover_is_a_credit_arm_losing_at_one_end_and_paying_at_the_other(summary):
    found = demo.find_crossover(summary)
    assert found is not None
    rows = demo.records_by_key(summary)
    key = (found["parameterization"], found["structure"])
    at = {h: rows[(*key, h, found["start_rate"], found["arm"])]["vs_best_grpo"] for h in (2, 16)}
    assert at[found["pays_at"]]["verdict"] == "pays" and at[found["loses_at"]]["verdict"] == "loses"
    assert found["arm"] in hs.PRACTICAL  # never a GRPO arm, the oracle or the exploratory arm
    # the largest paying gap among every crossover on the map
    for r in summary["records"]:
        v = r["vs_best_grpo"]
        if r["arm"] in hs.PRACTICAL and v and v["verdict"] == "pays" and r["horizon"] in (2, 16):
            other_end = {2: 16, 16: 2}[r["horizon"]]
            other = rows[(r["parameterization"], r["structure"], other_end, r["start_rate"], r["arm"])]
            if (other["vs_best_grpo"] or {}).get("verdict") == "loses":
                assert v["mean"] <= found["gap_where_it_pays"]


def test_no_crossover_when_no_arm_changes_sides(summary):
    flat = copy.deepcopy(summary)
    for r in flat["records"]:
        if r["vs_best_grpo"] and r["vs_best_grpo"]["verdict"] == "loses":
            r["vs_best_grpo"]["verdict"] = "level"
    assert demo.find_crossover(flat) is None


@pytest.mark.record
def test_demo_runs_equal_the_committed_records_and_print_their_paired_gaps(tmp_path, capsys, summary):
    out = tmp_path / "wcp.json"
    assert demo.main(["--seeds", "3", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    found = demo.find_crossover(summary)
    assert result["crossover"] == found
    assert [r["cell"][2] for r in result["results"]] == sorted((found["pays_at"], found["loses_at"]))
    for res in result["results"]:
        names = list(res["arms"])
        cell = tuple(res["cell"])
        assert names == [demo.best_grpo_arm(summary, cell), found["arm"], *demo.REFERENCE_ARMS]
        for arm, a in res["arms"].items():
            # deterministic per seed: every run equals the study's committed record of the same settings, within
            # the exact toy's tolerance (another CPU moves a float64 in its last bits; benchmarks/_records.py)
            c = a["committed"]
            assert (c["found"], c["within"], c["outside"]) == (3, 3, []), (cell, arm, c)
            assert 0.0 <= c["largest"] <= 1e-9
            assert f"{arm:<18}" in printed and a["committed_summary"] in printed
            assert a["committed_summary"].startswith("3/3 within tolerance (largest difference ")
            committed = [
                read_run(hs.RUNS, hs.record_key(cell, arm, s))["success_at_budget"] for s in range(3)
            ]
            assert all(FLOAT64.allows(x, y) for x, y in zip(a["success"], committed, strict=True))
        base = res["arms"][names[0]]["success"]
        gap = paired_t_test([x - y for x, y in zip(res["arms"][found["arm"]]["success"], base, strict=True)])
        assert f"{gap['mean']:+.3f} [{gap['ci95'][0]:+.3f}, {gap['ci95'][1]:+.3f}]" in printed
    assert f"pays at H = {found['pays_at']}" in printed
    assert "outside tolerance" not in printed and result["environment"]["cpu"]


def test_one_seed_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit):
        demo.main(["--seeds", "1", "--output", str(tmp_path / "x.json")])


def test_demo_script_dispatches_the_crossover_mode():
    script = (ROOT / "scripts" / "demo.sh").read_text()
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "demo.sh")], check=True)
    assert '"--where_credit_pays"' in script and "benchmarks/where_credit_pays_demo.py" in script


def test_the_untuned_crossover_stays_on_the_page_and_its_demo_in_the_readme(summary):
    """The README leads with the tuned map (tests/benchmarks/test_credit_map_tuned.py); the untuned crossover's
    numbers stay on the page below the tuned map, and the README names the flag that retrains it."""
    found = demo.find_crossover(summary)
    rows = demo.records_by_key(summary)
    key = (found["parameterization"], found["structure"])
    pays = rows[(*key, found["pays_at"], found["start_rate"], found["arm"])]["vs_best_grpo"]
    loses = rows[(*key, found["loses_at"], found["start_rate"], found["arm"])]["vs_best_grpo"]
    untuned = (ROOT / "docs" / "where-credit-pays.md").read_text().split(hs.UNTUNED_MARKER)[1]
    assert f"{pays['mean']:+.3f}" in untuned and f"{loses['mean']:+.3f}" in untuned
    assert "--where_credit_pays_untuned" in (ROOT / "README.md").read_text()
