"""docs/paper-claims.md against benchmarks/results/paper_claims.json: the page is the JSON rendered, every number on
the page is in the JSON, every claim has a verdict, and the protocol's statistics behave on hand-made records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import load_benchmark

from benchmarks._runs import append_run, append_runs, has_run, read_run

ROOT = Path(__file__).resolve().parents[2]
VERDICTS = {"holds", "does not hold", "holds partly", "inconclusive", "not measurable here", "not measured yet",
            "descriptive"}  # fmt: skip
ALPHA = 0.05
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def _bench():
    return load_benchmark("paper_claims")


def _result() -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / "paper_claims.json").read_text())


def test_the_page_is_the_results_file_rendered():
    bench = _bench()
    page = (ROOT / "docs" / "paper-claims.md").read_text()
    assert page == bench.render_page(_result()), (
        "run `python benchmarks/paper_claims.py` to regenerate the page"
    )


def test_every_number_on_the_page_is_in_the_results_file():
    result = _result()
    page = (ROOT / "docs" / "paper-claims.md").read_text()
    # The JSON as text, with numbers also in the forms the page prints them (fixed decimals, thousands separators).
    haystack = json.dumps(result)
    lines = page.splitlines()
    # Table body rows: a header is the row just above a |---| separator.
    table_rows = [
        line
        for i, line in enumerate(lines)
        if line.startswith("| ") and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))
    ]
    assert table_rows
    claim_text = " ".join(" ".join(str(v) for v in row.values()) for row in result["claims"])
    for line in table_rows:
        for number in NUMBER.findall(line):
            if number in claim_text or number in haystack:
                continue
            value = float(number.replace(",", ""))
            assert _printed_from(value, number, result), (
                f"{number!r} on the page is not in paper_claims.json: {line}"
            )


def _printed_from(value: float, printed: str, obj) -> bool:
    """Whether some number in ``obj`` prints as ``printed`` with the page's precision."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            if abs(round(float(item), decimals) - value) < 10 ** (-decimals) / 2 + 1e-12:
                return True
    return False


def test_every_claim_has_a_verdict_and_the_ppo_rows_exist():
    claims = _result()["claims"]
    assert len({c["id"] for c in claims}) == len(claims)
    for c in claims:
        assert c["verdict"] in VERDICTS, c
        assert c["claim"] and c["paper"] and c["where"], c
        if c["verdict"] not in ("not measurable here",):
            assert c["ours"], c
    measured = {c["id"] for c in claims}
    for needed in (
        "ppo_accuracy",
        "ppo_steps_to_peak",
        "ppo_wallclock_to_peak",
        "ppo_kl_frontier",
        "ppo_temperature",
        "ppo_accuracy_sign",
        "sft_start_ppo_accuracy",
        "sft_start_ppo_steps",
        "sft_start_ppo_wallclock",
        "sft_start_ppo_kl",
        "sft_start_grpo_equal_compute",
    ):
        assert needed in measured


def test_sign_test_is_exact():
    bench = _bench()
    assert bench.sign_test(0, 0) == 1.0
    assert bench.sign_test(6, 6) == 1.0
    assert bench.sign_test(12, 0) == pytest.approx(2 / 4096)
    assert bench.sign_test(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert bench.sign_test(2, 10) == bench.sign_test(10, 2)


def _write_run(
    root: Path, seed: int, arm: str, curve: list[tuple[int, float, float, float]], task: str = "demo_plateau"
) -> None:
    rows = [
        {"arm": arm, "seed": seed, "step": s, "accuracy": a, "sampled_tokens": 100.0 * s, "train_seconds": t,
         "task": task, "kl_to_start": kl}
        for s, a, t, kl in curve
    ]  # fmt: skip
    logs = [{"step": float(s), "reward": 0.5, "completions/mean_length": 10.0} for s in range(1, 11)]
    done = {"task": task, "seed": seed, "arm": arm, "steps": 10, "sampled_tokens": 1000.0,
            "prompts_per_step": 4, "logs": logs}  # fmt: skip
    append_runs(
        root, [(f"{task}/seed{seed}/{arm}.jsonl", rows), (f"{task}/seed{seed}/{arm}.done.json", done)]
    )


def test_stage1_reads_nothing_until_complete_and_then_decides_by_the_protocol(tmp_path, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "REGIME_RUNS", tmp_path / "none")
    for seed in range(11):
        _write_run(tmp_path, seed, "grpo", [(0, 0.5, 0, 0), (5, 0.6, 5, 0.1), (10, 0.7, 10, 0.2)])
        _write_run(tmp_path, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 9, 0.05), (10, 0.8, 18, 0.1)])
        _write_run(
            tmp_path, seed, "ppo", [(0, 0.5, 0, 0), (5, 0.6, 8, 0.2), (10, 0.7 + 0.001 * seed, 16, 0.3)]
        )
    retimed = tmp_path / "retime"  # the quiet re-timing's records (none yet)
    partial = bench.stage1(tmp_path, retimed)
    assert partial["complete"] is False and partial["finished"] == {"grpo": 11, "vineppo_k4": 11, "ppo": 11}
    row = bench.new_study_row("stage1:accuracy", {"stage1": partial})
    assert row["verdict"] == "not measured yet" and "33 of 36" in row["ours"]
    seed = 11
    _write_run(tmp_path, seed, "grpo", [(0, 0.5, 0, 0), (5, 0.6, 5, 0.1), (10, 0.7, 10, 0.2)])
    _write_run(tmp_path, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 9, 0.05), (10, 0.8, 18, 0.1)])
    _write_run(tmp_path, seed, "ppo", [(0, 0.5, 0, 0), (5, 0.6, 8, 0.2), (10, 0.7 + 0.001 * seed, 16, 0.3)])
    full = bench.stage1(tmp_path, retimed)
    assert full["complete"] and not full["retime"]["complete"] and full["load_note"] == bench.UNDER_LOAD
    # VinePPO reaches PPO's peak (0.70x at step 10, below 0.75) at step 5 in every seed: 12-0 on steps; in seconds 9 < 16.
    m2 = full["m2_steps_to_ppo_peak"]
    assert (m2["fast_first"], m2["slow_first"], m2["ties"]) == (12, 0, 0)
    assert full["m1_accuracy"]["mean"] == pytest.approx(
        0.8 - statistics_mean([0.7 + 0.001 * s for s in range(12)])
    )
    assert full["m4_kl"]["mean"] == pytest.approx(-0.2)
    assert all(
        full[m]["rejects"] for m in ("m1_accuracy", "m2_steps_to_ppo_peak", "m3_seconds_to_ppo_peak", "m4_kl")
    )
    rows = {k: bench.new_study_row(k, {"stage1": full})
            for k in ("stage1:accuracy", "stage1:steps", "stage1:seconds", "stage1:kl")}  # fmt: skip
    assert {r["verdict"] for r in rows.values()} == {"holds"}
    page = bench.render_page({"claims": [], "studies": {"stage1": full}})
    assert "| `ppo` | 10 | 0.705 ± 0.001 | 0.300 ± 0.000 | 0.500 | 16 | 1,000 |" in page
    assert "Quiet re-timing" not in page
    assert bench.plot_stage1(full, tmp_path / "stage1.png").stat().st_size > 0
    # The quiet re-timing: the same runs (accuracy, KL, tokens), VinePPO and PPO in half the seconds.
    for seed in range(12):
        _write_run(retimed, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 4.5, 0.05), (10, 0.8, 9, 0.1)])
        _write_run(retimed, seed, "ppo", [(0, 0.5, 0, 0), (5, 0.6, 4, 0.2), (10, 0.7 + 0.001 * seed, 8, 0.3)])
    quiet = bench.stage1(tmp_path, retimed)
    assert quiet["retime"]["identical"] and quiet["load_note"] == bench.RETIMED_UNDER_LOAD
    assert quiet["retime"]["train_seconds"]["ppo"][0] == pytest.approx(8.0)
    assert quiet["retime"]["decision_train_seconds"]["ppo"][0] == pytest.approx(16.0)
    seconds = bench.new_study_row("stage1:seconds", {"stage1": quiet})
    assert seconds["verdict"] == "holds"  # M3 keeps the decision records' verdict
    assert (
        seconds["ours"].count("Re-timed on a quiet machine") == 1 and "re-timed on a quiet" in seconds["why"]
    )
    cost = bench.new_study_row("stage1:cost", {"stage1": quiet})
    assert "1.12x; re-timed on a quiet machine (post hoc, descriptive): 1.12x" in cost["ours"]
    grpo = bench.new_study_row("stage1:grpo_peak_seconds", {"stage1": quiet})
    assert "GRPO's were not re-timed" in grpo["why"]
    page = bench.render_page({"claims": [], "studies": {"stage1": quiet}})
    assert "| `ppo` | 16.0 ± 0.0 | 8.0 ± 0.0 |" in page and "amendment of 2026-11-28 13:55 UTC" in page
    # A re-timing whose runs are not the decision's (here one evaluation fewer) is reported and not used.
    _write_run(retimed, 3, "ppo", [(0, 0.5, 0, 0), (5, 0.6, 4, 0.2)])
    broken = bench.stage1(tmp_path, retimed)
    assert (
        broken["retime"]["mismatches"] == ["ppo seed 3 evaluations"]
        and broken["load_note"] == bench.UNDER_LOAD
    )


def statistics_mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.record
def test_the_results_file_regenerates_from_the_committed_records():
    bench = _bench()
    compare_tree = load_benchmark("_records").compare_tree
    rebuilt = json.loads(json.dumps(bench.build(), allow_nan=True))
    # within float64's tolerance (another CPU's last bits), every string and count exact
    assert compare_tree(rebuilt, _result()) == [], (
        "benchmarks/results/paper_claims.json is stale: run `python benchmarks/paper_claims.py`"
    )


def test_stage2_decides_at_the_hottest_temperature_and_counts_divergences(tmp_path):
    bench = _bench()
    for seed in range(12):
        for t in bench.TEMPERATURES:
            # PPO ends below the start (0.5 - 0.04) at T = 1.0 in every seed; VinePPO gains a little everywhere.
            ppo_end = 0.40 + 0.001 * seed if t == 1.0 else 0.55
            _write_run(
                tmp_path, seed, f"ppo_t{t}", [(0, 0.5, 0, 0), (7, 0.5, 5, 0.1), (14, ppo_end, 10, 0.2)]
            )
            _write_run(
                tmp_path, seed, f"vineppo_k4_t{t}", [(0, 0.5, 0, 0), (7, 0.55, 9, 0.1), (14, 0.6, 18, 0.1)]
            )
    s2 = bench.stage2(tmp_path)
    assert s2["complete"] and s2["last_step"] == 14
    hot = s2["rows"][-1]
    assert hot["diverged"] == {"vineppo": 0, "ppo": 12} and hot["test"]["p_holm"] < 0.05
    row = bench.new_study_row("stage2:temperature", {"stage2": s2})
    assert row["verdict"] == "holds" and "T = 1.0, step 14" in row["ours"] and "PPO 12/12" in row["ours"]
    page = "\n".join(bench.render_later_stages({"stage2": s2}))
    assert "| 1.0 | 0.600 | 0.406 | +0.194 |" in page and "| 0 / 12 |" in page
    # Nobody diverges and the two end level: the interval excludes the gap a diverged PPO run would leave.
    for seed in range(12):
        _write_run(
            tmp_path,
            seed,
            "ppo_t1.0",
            [(0, 0.5, 0, 0), (7, 0.55, 5, 0.1), (14, 0.6 + (0.001 if seed % 2 else -0.001), 10, 0.2)],
        )
    level = bench.new_study_row("stage2:temperature", {"stage2": bench.stage2(tmp_path)})
    assert level["verdict"] == "does not hold" and "PPO diverged in 0 of 12 seeds" in level["why"]
    assert "gap of at least 0.140" in level["why"]  # VinePPO 0.600 less (0.5 - 0.04)


def _stage1_done(m1_p: float) -> dict:
    return {"complete": True, "m1_accuracy": {"p": m1_p}, "ppo_minus_grpo": {"p": 0.5}}


def test_stage3_checks_the_start_and_holms_over_the_two_tasks(tmp_path, monkeypatch):
    bench = _bench()
    regime, check = tmp_path / "regime", tmp_path / "check"
    monkeypatch.setattr(bench, "REGIME_RUNS", regime)
    for seed in range(12):
        for arm, end in (("vineppo_k4", 0.80), ("grpo", 0.79), ("grpo_matched", 0.81)):
            _write_run(
                regime,
                seed,
                arm,
                [(0, 0.5, 0, 0), (20, 0.7, 9, 0), (40, end + 0.001 * seed, 18, 0)],
                "sign_plateau",
            )
    _write_run(check, 0, "grpo", [(0, 0.5, 0, 0), (20, 0.7, 3, 0), (40, 0.79, 7, 0)], "sign_plateau")
    for seed in range(11):
        _write_run(regime, seed, "ppo", [(0, 0.5, 0, 0), (20, 0.7, 9, 0), (40, 0.75, 18, 0)], "sign_plateau")
    partial = bench.stage3(_stage1_done(0.8), regime, check)
    assert not partial["complete"] and partial["start_check"] == {"checked": 2, "identical": 2}
    _write_run(regime, 11, "ppo", [(0, 0.5, 0, 0), (20, 0.7, 9, 0), (40, 0.75, 18, 0)], "sign_plateau")
    s3 = bench.stage3(_stage1_done(0.8), regime, check)
    m1 = s3["m1_accuracy"]
    assert m1["mean"] == pytest.approx(0.0555) and m1["holm_family"] == ["demo_plateau", "sign_plateau"]
    assert m1["p_holm"] == pytest.approx(min(1.0, 2 * m1["p"]))  # the smaller of two p-values, doubled
    row = bench.new_study_row("stage3:accuracy", {"stage3": s3})
    assert row["verdict"] == "holds" and "PPO 0.750" in row["ours"]
    # A start that does not reproduce the regime's records leaves VinePPO without comparable runs.
    _write_run(check, 0, "grpo", [(0, 0.5, 0, 0), (20, 0.7, 3, 0), (40, 0.78, 7, 0)], "sign_plateau")
    differs = bench.stage3(_stage1_done(0.8), regime, check)
    assert differs["start_is_the_regimes"] is False and "m1_accuracy" not in differs
    assert bench.new_study_row("stage3:accuracy", {"stage3": differs})["verdict"] == "not measurable here"


def test_stage4_applies_the_regime_rule_and_stage1s_measures(tmp_path, monkeypatch):
    bench = _bench()
    tests = tmp_path / "credit.json"
    regime_row = {
        "arm": "vineppo_k4",
        "final_accuracy_vs_grpo_matched": {"p": 0.001},
        "final_accuracy_vs_grpo": {"p": 0.9},
    }
    tests.write_text(json.dumps({"learning": {"demo_plateau": [regime_row], "sign_plateau": [regime_row]}}))
    monkeypatch.setattr(bench, "REGIME_TESTS", tests)
    ends = {"grpo": 0.70, "vineppo_k4": 0.72, "grpo_matched": 0.74, "grpo_matched_cost": 0.73, "hybrid_b50": 0.71,
            "tree_d12": 0.70, "ppo": 0.69}  # fmt: skip
    for seed in range(12):
        for arm, end in ends.items():
            if arm == "ppo" and seed == 11:
                continue
            _write_run(
                tmp_path,
                seed,
                arm,
                [(0, 0.6, 0, 0), (20, 0.65, 9, 0.1), (40, end + 0.001 * (seed % 3), 18, 0.2)],
                "demo_sft",
            )
    retimed = tmp_path / "retime"
    assert not bench.stage4({}, tmp_path, retimed)["complete"]
    _write_run(
        tmp_path, 11, "ppo", [(0, 0.6, 0, 0), (20, 0.65, 9, 0.1), (40, 0.69 + 0.002, 18, 0.2)], "demo_sft"
    )
    append_run(tmp_path, "demo_sft/start.json", {"accuracy": 0.6})
    for seed in range(12):  # the quiet re-timing of VinePPO and PPO: the same runs, in fewer seconds
        for arm in bench.RETIME_ARMS:
            curve = bench.load_curves(tmp_path, "demo_sft", arm, [seed])[seed]
            rows = [(r["step"], r["accuracy"], r["train_seconds"] / 2, r["kl_to_start"]) for r in curve]
            _write_run(retimed, seed, arm, rows, "demo_sft")
    s4 = bench.stage4({}, tmp_path, retimed)
    assert s4["retime"]["identical"]
    regime = {(r["arm"], r["base"]): r["test"] for r in s4["regime"]}
    assert len(regime) == 12  # 7 arms x 2 bases, less each base against itself
    v = regime[("vineppo_k4", "grpo_matched")]
    assert v["mean"] == pytest.approx(-0.02) and v["holm_family"] == [
        "demo_plateau",
        "sign_plateau",
        "demo_sft",
    ]
    assert regime[("ppo", "grpo")]["holm_family"] == ["demo_sft"]  # no earlier PPO study was passed in
    assert s4["m1_accuracy"]["mean"] == pytest.approx(0.72 - 0.69 + (0.001 * (11 % 3) - 0.002) / 12)
    # Evaluated every 20 steps: VinePPO reaches PPO's peak (0.69 + a bit, at step 40) at step 40 too: ties.
    assert s4["m2_steps_to_ppo_peak"]["ties"] == 12
    studies = {"stage4": s4}
    assert bench.new_study_row("stage4:regime", studies)["verdict"] == "does not hold"
    accuracy = bench.new_study_row("stage4:accuracy", studies)
    assert accuracy["verdict"] == "holds" and "supervised start (`demo_sft`)" in accuracy["why"]
    assert "every 20 steps" in bench.new_study_row("stage4:steps", studies)["why"]
    seconds = bench.new_study_row("stage4:seconds", studies)
    assert seconds["ours"].count("Re-timed on a quiet machine") == 1 and "under load" not in seconds["why"]
    page = "\n".join(bench.render_later_stages(studies))
    assert (
        "| `vineppo_k4` | `grpo_matched` | -0.020 |" in page
        and "demo_plateau, sign_plateau, demo_sft" in page
    )


def test_the_quiet_retiming_is_used_only_when_it_reproduces_the_decision_records(tmp_path):
    bench = _bench()
    decision = {arm: {} for arm in bench.RETIME_ARMS}
    for seed in range(12):
        for arm, seconds in (("vineppo_k4", 30.0), ("ppo", 20.0)):
            curve = [(0, 0.6, 0, 0), (20, 0.65, seconds / 2, 0.1), (40, 0.7, seconds, 0.2)]
            _write_run(tmp_path, seed, arm, curve, "demo_sft")
            decision[arm][seed] = bench.load_curves(tmp_path, "demo_sft", arm, [seed])[seed]
            # the decision run was slowed by load; the re-timed one is not
            decision[arm][seed] = [dict(r, train_seconds=3 * r["train_seconds"]) for r in decision[arm][seed]]
    r = bench.retime(decision, "stage4", "demo_sft", tmp_path)
    assert r["complete"] and r["identical"]
    assert r["seconds_per_run_ratio"]["ratio"] == pytest.approx(1.5)
    assert r["train_seconds"]["ppo"][0] == pytest.approx(20.0)
    assert r["seconds_to_ppo_peak"]["slow_first"] == 12  # both reach 0.7 at step 40; PPO in fewer seconds
    section = "\n".join(bench._retime_section(r))
    assert "1.50x" in section and "| `ppo` | 60.0 ± 0.0 | 20.0 ± 0.0 |" in section
    assert "amendment of 2026-11-26 06:23 UTC" in section
    decision["ppo"][5][2] = dict(decision["ppo"][5][2], accuracy=0.71)  # a re-run that is not the same run
    differs = bench.retime(decision, "stage4", "demo_sft", tmp_path)
    assert not differs["identical"] and differs["mismatches"] == ["ppo seed 5 step 40"]
    assert "seconds_per_run_ratio" not in differs and "not used" in bench._retime_text(differs)


def test_the_summary_quotes_the_studies_once_all_four_are_complete():
    bench = _bench()
    result = _result()
    summary = "\n".join(bench._summary(result))
    s4 = result["studies"]["stage4"]["m1_accuracy"]
    assert (
        f"{s4['mean']:+.3f} [{s4['ci95'][0]:+.3f}, {s4['ci95'][1]:+.3f}] from the paper's kind of start"
        in summary
    )
    unfinished = json.loads(json.dumps(result))
    unfinished["studies"]["stage4"]["complete"] = False
    assert bench._summary(unfinished) == []


# ---- the one verdict rule (docs/paper-claims-protocol.md, amendment of 2026-11-27) --------------------------------


def _rule(e: dict) -> str:
    """The protocol's verdict rule, written here a second time from the protocol's text (not from the benchmark), so
    a row whose verdict disagrees with its numbers fails whichever side is wrong."""
    if e["kind"] == "not measurable":
        return "not measurable here"
    if e["kind"] in ("descriptive", "not measured yet"):
        return e["kind"]
    if e["kind"] == "arithmetic":
        return "holds" if abs(e["stated"] - e["computed"]) <= 0.10 * abs(e["computed"]) else "does not hold"
    assert e["kind"] == "test", e
    lo, hi = e["ci"]
    null, direction = e["null"], e["direction"]
    if direction == 0:
        inside = null - e["margin"] < lo and hi < null + e["margin"]
        outside = hi <= null - e["margin"] or lo >= null + e["margin"]
        return "holds" if inside else ("does not hold" if outside else "inconclusive")
    p = e.get("p_holm", e.get("p"))
    rejects = (p < ALPHA) if p is not None else not (lo <= null <= hi)
    above, below = e["estimate"] > null, e["estimate"] < null
    paper_side = (above or below) if direction == "nonzero" else (above if direction == 1 else below)
    other_side = (above or below) and not paper_side
    effect = e.get("paper_effect")
    short = effect is not None and ((hi < effect) if direction == 1 else (lo > effect))
    if rejects and paper_side:
        return "holds partly" if short else "holds"
    if rejects and other_side:
        return "does not hold"
    return "does not hold" if short else "inconclusive"


def test_every_rows_verdict_follows_the_rule_from_its_own_numbers():
    """Walk every row of the results file: its verdict must be what the protocol's rule gives for its evidence, a
    test row's printed interval must be its evidence's, and the post-hoc family's Holm p-values must be Holm's."""
    result = _result()
    claims = result["claims"]
    assert len(claims) >= 60
    for row in claims:
        e = row["evidence"]
        assert row["verdict"] == _rule(e), (row["id"], row["verdict"], e)
        if e["kind"] == "test":
            lo, hi = e["ci"]
            assert lo <= hi, row["id"]
            bracket = re.search(r"\[([^\]]+)\]", row["ci"])
            if bracket:  # the printed interval is the evidence's, at its printed precision
                printed = NUMBER.findall(bracket.group(1))
                for text, value in zip(printed, (lo, hi), strict=True):
                    decimals = len(text.split(".")[1]) if "." in text else 0
                    assert abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-9, (row["id"], text, value)
    family = [row["evidence"] for row in claims if row["evidence"].get("family") == "posthoc-2026-11-27"]
    assert family and all("p_holm" in e for e in family)
    ps = [e["p"] for e in family]
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    running = 0.0
    for rank, i in enumerate(order):  # Holm step-down, written out: (m - rank) p, running maximum, at most 1
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        assert family[i]["p_holm"] == pytest.approx(running)


def test_no_catalogue_row_sets_its_own_verdict():
    catalogue = json.loads((ROOT / "benchmarks" / "paper_claims_catalogue.json").read_text())
    assert not [entry["id"] for entry in catalogue["claims"] if "verdict" in entry]


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        ({"estimate": 0.02, "ci": [0.01, 0.03], "direction": 1, "p": 0.001}, "holds"),
        ({"estimate": 0.02, "ci": [0.01, 0.03], "direction": 1, "p": 0.001, "p_holm": 0.2}, "inconclusive"),
        ({"estimate": -0.02, "ci": [-0.03, -0.01], "direction": 1, "p": 0.001}, "does not hold"),
        (
            {"estimate": 0.02, "ci": [0.01, 0.03], "direction": 1, "p": 0.001, "paper_effect": 0.1},
            "holds partly",
        ),
        (
            {"estimate": 0.0, "ci": [-0.01, 0.01], "direction": 1, "p": 0.9, "paper_effect": 0.1},
            "does not hold",
        ),
        (
            {"estimate": 0.0, "ci": [-0.01, 0.2], "direction": 1, "p": 0.9, "paper_effect": 0.1},
            "inconclusive",
        ),
        ({"estimate": -0.3, "ci": [-0.4, -0.2], "direction": "nonzero", "p": 1e-5}, "holds"),
        ({"estimate": -0.3, "ci": [-0.4, -0.2], "direction": -1}, "holds"),  # no p: the interval decides
        ({"estimate": 0.01, "ci": [-0.02, 0.04], "direction": 0, "margin": 0.05}, "holds"),
        ({"estimate": 0.01, "ci": [-0.02, 0.07], "direction": 0, "margin": 0.05}, "inconclusive"),
        ({"estimate": 0.1, "ci": [0.06, 0.14], "direction": 0, "margin": 0.05}, "does not hold"),
    ],
)
def test_the_verdict_rule_on_hand_made_evidence(evidence, expected):
    bench = _bench()
    e = bench.tested_evidence(
        evidence["estimate"], evidence["ci"], 0.0, evidence["direction"], p=evidence.get("p"),
        p_holm=evidence.get("p_holm"), paper_effect=evidence.get("paper_effect"), margin=evidence.get("margin"),
    )  # fmt: skip
    assert bench.verdict(e) == expected == _rule(e)


def test_the_papers_own_arithmetic_is_read_within_ten_percent():
    bench = _bench()
    assert bench.verdict(bench.arithmetic_evidence(3.0, 9 * 80 / 380)) == "does not hold"  # Table 4: 1.89x
    assert bench.verdict(bench.arithmetic_evidence(1.51, 2.8 * 312 / 583)) == "holds"  # 1.50x
    with pytest.raises(ValueError, match="margin"):
        bench.tested_evidence(0.0, [-1.0, 1.0], 0.0, 0)


def test_the_exact_interval_excludes_a_share_exactly_when_the_binomial_test_rejects_it():
    bench = _bench()
    assert bench.clopper_pearson(0, 12)[1] == pytest.approx(1 - 0.025 ** (1 / 12))
    assert bench.clopper_pearson(12, 12)[0] == pytest.approx(0.025 ** (1 / 12))
    for n in (7, 12):
        for k in range(n + 1):
            lo, hi = bench.clopper_pearson(k, n)
            for p0 in (0.25, 0.5):
                assert (not lo <= p0 <= hi) == (bench.binomial_test(k, n, p0) < ALPHA), (k, n, p0)
        assert bench.binomial_test(n, n, 0.5) == pytest.approx(bench.sign_test(n, 0))


def test_times_to_a_peak_count_the_runs_that_never_get_there():
    """Three seeds; VinePPO reaches PPO's peak at step 5 in two and never in the third (run ends at step 20), PPO at
    step 10 in each. Survivors only would say VinePPO takes 5 steps (2x faster); counted fairly the mean is at least
    (5 + 5 + 20) / 3 = 10 steps, and the paired comparison is 2 against 1."""
    bench = _bench()

    def curve(points: list[tuple[int, float]]) -> list[dict]:
        return [
            {"step": s, "accuracy": a, "train_seconds": 3.0 * s, "kl_to_start": 0.01 * s} for s, a in points
        ]

    curves = {
        "ppo": {s: curve([(0, 0.5), (10, 0.7), (20, 0.69)]) for s in range(3)},
        "vineppo_k4": {
            0: curve([(0, 0.5), (5, 0.7), (20, 0.7)]),
            1: curve([(0, 0.5), (5, 0.71), (20, 0.7)]),
            2: curve([(0, 0.5), (5, 0.6), (20, 0.68)]),
        },  # fmt: skip
    }
    r = bench.race(curves, "vineppo_k4", "ppo", "ppo", "step")
    assert (r["fast_first"], r["slow_first"], r["ties"], r["fast_reached"]) == (2, 1, 0, 2)
    assert r["fast_restricted_mean"] == pytest.approx(10.0) and r["slow_restricted_mean"] == pytest.approx(
        10.0
    )
    assert not [key for key in r if "where_reached" in key]
    text = bench._race_text(r, "steps")
    assert "at least 10 steps" in text and "at most 1.00x" in text and " 5 steps" not in text
    e = bench.race_evidence(r)
    assert e["estimate"] == pytest.approx(2 / 3) and e["ci"] == bench.clopper_pearson(2, 3)
    kl = bench.kl_at_peak(curves, "vineppo_k4", "ppo")
    assert (kl["fast_first"], kl["slow_first"]) == (
        2,
        1,
    )  # less KL where it got there; the third seed counts for PPO


def test_a_further_ppo_arm_is_read_with_stage_1s_measures(tmp_path, monkeypatch):
    """A new PPO arm (e.g. the critic with warm-up) needs only its entry in PPO_ARM_STUDIES and catalogue rows."""
    bench = _bench()
    for seed in range(12):
        _write_run(tmp_path, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 9, 0.05), (10, 0.8, 18, 0.1)])
        _write_run(
            tmp_path, seed, "ppo_warm", [(0, 0.5, 0, 0), (5, 0.6, 8, 0.2), (10, 0.7 + 0.001 * seed, 16, 0.3)]
        )
        done = f"demo_plateau/seed{seed}/ppo_warm.done.json"
        info = read_run(tmp_path, done)
        for i, log in enumerate(info["logs"]):
            log.update({"critic/explained_variance": 0.3 + 0.01 * ((seed + i) % 3), "critic/mean_value": 0.5})
        append_run(tmp_path, done, info)
    spec = ("demo_plateau", "ppo_warm", tmp_path, tmp_path, "the command")
    monkeypatch.setattr(bench, "PPO_ARM_STUDIES", {"warm": spec})
    retimed = tmp_path / "retime"  # its quiet re-timing's records (none yet)
    studies = {"ppo_arms": {"warm": bench.ppo_arm_study(*spec, retime_root=retimed)}}
    assert studies["ppo_arms"]["warm"]["load_note"] == bench.WARM_UNDER_LOAD
    accuracy = bench.catalogue_row({"measure": "ppo_arm:warm:accuracy"}, studies)
    assert accuracy[1] == "the command" and accuracy[0]["verdict"] == "holds"
    assert "`ppo_warm`" in accuracy[0]["ours"] and accuracy[0]["evidence"]["family"] == "warm M1-M4 (Holm)"
    ev = bench.catalogue_row({"measure": "ppo_arm:warm:explained_variance"}, studies)[0]
    assert ev["verdict"] == "holds" and ev["evidence"]["estimate"] == pytest.approx(0.31, abs=0.01)
    # Re-timed quietly, VinePPO and the arm in half the seconds: read beside the arm's M3, which keeps its verdict.
    for seed in range(12):
        _write_run(retimed, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 4.5, 0.05), (10, 0.8, 9, 0.1)])
        _write_run(
            retimed, seed, "ppo_warm", [(0, 0.5, 0, 0), (5, 0.6, 4, 0.2), (10, 0.7 + 0.001 * seed, 8, 0.3)]
        )
    study = bench.ppo_arm_study(*spec, retime_root=retimed)
    assert study["retime"]["identical"] and study["load_note"] == bench.WARM_RETIMED
    assert study["retime"]["seconds_per_run_ratio"]["ratio"] == pytest.approx(9 / 8)
    before = bench.catalogue_row({"measure": "ppo_arm:warm:seconds"}, studies)[0]
    seconds = bench.catalogue_row({"measure": "ppo_arm:warm:seconds"}, {"ppo_arms": {"warm": study}})[0]
    assert (
        seconds["verdict"] == before["verdict"] and seconds["ours"].count("Re-timed on a quiet machine") == 1
    )
    assert "both were re-timed" in seconds["why"] and "Re-timed" not in before["ours"]
    _write_run(
        retimed, 4, "ppo_warm", [(0, 0.5, 0, 0), (5, 0.61, 4, 0.2), (10, 0.7 + 0.001 * 4, 8, 0.3)]
    )  # not the same run
    differs = bench.ppo_arm_study(*spec, retime_root=retimed)
    assert differs["retime"]["mismatches"] == ["ppo_warm seed 4 step 5"]
    assert differs["load_note"] == bench.WARM_UNDER_LOAD


def test_a_warmed_up_arm_reads_running_until_its_12_seeds_are_in_then_stage_3s_rule_and_its_critic(tmp_path):
    """The warmed-up critic's arms (amendment of 2026-11-28): a stage with 11 of 12 seeds is "running" and not measured
    yet; stage 3's arm is read by M1 alone with Holm over the arm's two tasks; the critic row describes the policy
    steps' fresh explained variance (the warm-up's logs at steps <= 0 left out) and counts the seeds whose critic beat
    the running mean."""
    bench = _bench()

    def write_warm(seed: int, task: str) -> None:
        """A ppo_warm run: two warm-up logs (steps -1 and 0) that must not count, then the policy's 10 steps."""
        _write_run(tmp_path, seed, "ppo_warm", [(0, 0.5, 0, 0), (20, 0.6, 8, 0), (40, 0.7 + 0.001 * seed, 16, 0)],
                   task)  # fmt: skip
        done = f"{task}/seed{seed}/ppo_warm.done.json"
        info = read_run(tmp_path, done)
        warmup = [{"step": float(s), "reward": 0.5, "critic/explained_variance": -9.0,
                   "critic/explained_variance_fresh": -9.0, "critic/mean_value": 0.5} for s in (-1, 0)]  # fmt: skip
        for log in info["logs"]:
            log.update({"critic/explained_variance": -1.0, "critic/explained_variance_fresh": 0.2 + 0.01 * (seed % 3),
                        "critic/mean_value": 0.5, "critic/value_error_fresh": 0.1,
                        "critic/value_error_constant": 0.2 if seed < 8 else 0.05})  # fmt: skip
        info["logs"] = warmup + info["logs"]
        append_run(tmp_path, done, info)

    for seed in range(12):
        for task in ("demo_plateau", "sign_plateau"):
            _write_run(
                tmp_path, seed, "vineppo_k4", [(0, 0.5, 0, 0), (20, 0.7, 9, 0), (40, 0.8, 18, 0)], task
            )
            if not (seed == 11 and task == "sign_plateau"):
                write_warm(seed, task)
    specs = {"warm_stage1": ("demo_plateau", "ppo_warm", tmp_path, tmp_path, "c1"),
             "warm_stage3": ("sign_plateau", "ppo_warm", tmp_path, tmp_path, "c3", "m1")}  # fmt: skip
    arms = {name: bench.ppo_arm_study(*spec, retime_root=tmp_path / "none") for name, spec in specs.items()}
    bench.holm_arms_over_two_tasks(arms)
    studies = {"ppo_arms": arms}
    running = bench.catalogue_row({"measure": "ppo_arm:warm_stage3:accuracy"}, studies)[0]
    assert running["verdict"] == "not measured yet" and "running, 11 of 12 seeds finished" in running["ours"]
    critic = bench.catalogue_row({"measure": "ppo_arm:warm_stage1:critic"}, studies)[0]
    assert critic["verdict"] == "descriptive" and "+0.21 over 12 seeds" in critic["ours"]
    assert "below the running mean's in 8 of 12 seeds" in critic["ours"]
    write_warm(11, "sign_plateau")
    arms["warm_stage3"] = bench.ppo_arm_study(*specs["warm_stage3"], retime_root=tmp_path / "none")
    assert (
        has_run(tmp_path, "sign_plateau/seed11/ppo_warm.done.json")
        and "m2_steps_to_ppo_peak" not in arms["warm_stage3"]
    )
    bench.holm_arms_over_two_tasks(arms)
    m1, first = arms["warm_stage3"]["m1_accuracy"], arms["warm_stage1"]["m1_accuracy"]
    assert m1["holm_family"] == ["demo_plateau", "sign_plateau"]
    assert m1["p_holm"] == pytest.approx(bench._stats().holm_adjust([first["p"], m1["p"]])[1])
    row = bench.catalogue_row({"measure": "ppo_arm:warm_stage3:accuracy"}, studies)[0]
    assert row["verdict"] == "holds" and row["evidence"]["p_holm"] == m1["p_holm"]
    assert row["evidence"]["family"] == "ppo_warm M1 over demo_plateau and sign_plateau (Holm)"


def test_the_warmed_up_arms_are_read_on_three_stages_and_the_old_ppo_rows_say_their_critic_had_no_warm_up():
    bench = _bench()
    stages = {spec[0] for spec in bench.PPO_ARM_STUDIES.values()}
    assert stages == {"demo_plateau", "sign_plateau", "demo_sft"} and len(bench.PPO_ARM_STUDIES) == 6
    assert (
        "--arms ppo_warm_l0.95 --eval_every 20 --threads 1"
        in bench.PPO_ARM_STUDIES["ppo_warm_l0.95_stage3"][4]
    )
    claims = {c["id"]: c for c in _result()["claims"]}
    assert "critic without warm-up" in claims["ppo_accuracy"]["claim"]
    for arm in ("ppo_warm", "ppo_warm_l095"):
        for suffix in ("", "_sign", "_sft"):
            assert claims[f"{arm}_accuracy{suffix}"]["verdict"] in VERDICTS


def test_value_states_group_by_prompt_and_the_report_must_describe_the_same_responses(tmp_path):
    """Two prompts, two responses each: states start at position 0 per response; the implied GRPO values have one state
    per response. A report whose values-before differ from the metrics' truth is refused."""
    bench = _bench()
    points = [[0, 0.5, 0.4], [1, 0.9, 1.0], [0, 0.4, 0.4], [0, 0.1, 0.0], [1, 0.0, 0.0], [0, 0.2, 0.0]]
    metrics = {
        "settings": {"responses_per_prompt": 2},
        "value_points": {"vineppo_k9": points, "grpo (implied)": [[0, 0.5, 0.4]] * 2 + [[0, 0.0, 0.0]] * 2},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    states = bench.value_states(tmp_path / "metrics.json")
    k9 = states["vineppo_k9"]
    assert [(x["prompt"], x["response"], x["position"]) for x in k9] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 2, 0), (1, 2, 1), (1, 3, 0)
    ]  # fmt: skip
    assert [x["prompt"] for x in states["grpo (implied)"]] == [0, 0, 1, 1]

    def report(values_before: list[list[float]], rewards: list[int]) -> str:
        responses = [{"values": [*vs, float(r)], "advantages": [0.1] * len(vs), "reward": r}
                     for vs, r in zip(values_before, rewards, strict=True)]  # fmt: skip
        return json.dumps({"responses": responses})

    (tmp_path / "responses.json").write_text(report([[0.4, 1.0], [0.4], [0.0, 0.0], [0.0]], [1, 0, 0, 0]))
    responses = bench.step_advantages(tmp_path / "responses.json", k9)
    assert [(r["prompt"], r["reward"], r["first_state"]) for r in responses] == [
        (0, 1, 0), (0, 0, 2), (1, 0, 3), (1, 0, 5)
    ]  # fmt: skip
    (tmp_path / "responses.json").write_text(report([[0.4, 0.9], [0.4], [0.0, 0.0], [0.0]], [1, 0, 0, 0]))
    with pytest.raises(ValueError, match="does not match the metrics' ground truth"):
        bench.step_advantages(tmp_path / "responses.json", k9)
    with pytest.raises(ValueError, match="paper_effect"):
        bench.tested_evidence(0.1, [0.0, 0.2], 0.0, "nonzero", paper_effect=0.3)


def test_the_readme_quotes_the_warmed_up_critics_stage_one_from_the_results():
    """The README's sentence on PPO with a warmed-up critic reads the rows of `ppo_warm` (stages 1, 3, 4) and of
    `ppo_warm_l0.95` (stage 1)."""
    studies = _result()["studies"]["ppo_arms"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    for name in ("ppo_warm_stage1", "ppo_warm_l0.95_stage1", "ppo_warm_stage3", "ppo_warm_stage4"):
        study = studies[name]
        assert study["complete"], name
        m1 = study["m1_accuracy"]
        assert f"{m1['mean']:+.3f} [{m1['ci95'][0]:+.3f}, {m1['ci95'][1]:+.3f}]" in readme, name
    logs = studies["ppo_warm_stage1"]["critic_logs"]
    assert f"median {logs['explained_variance_last_step_median']:+.2f}" in readme
    tail = logs["last_steps"]["ev_tail"]
    assert (
        f"averaged over the last 10 steps {tail['mean']:+.2f} [{tail['ci95'][0]:+.2f}, {tail['ci95'][1]:+.2f}], "
        f"above the 0.3 we aimed for in {logs['last_steps']['seeds_tail_above_goal']} of 12 seeds" in readme
    )
    assert f"in {logs['seeds_below_constant']} of {logs['seeds']} seeds" in readme


def test_the_readme_quotes_stage_ones_cost_as_timed_and_re_timed_from_the_results():
    """The README's wall-clock sentence on stage 1 reads M3 and the per-run ratio, under load and re-timed quietly."""
    s1 = _result()["studies"]["stage1"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    quiet = s1["retime"]
    assert quiet["identical"]
    m3, quiet_race = s1["m3_seconds_to_ppo_peak"], quiet["seconds_to_ppo_peak"]
    assert f"first in {m3['fast_first']} seed of {m3['seeds']}, Holm p = {m3['p_holm']:.1g}" in readme
    assert (
        f"re-timed on a quiet machine, first in {quiet_race['fast_first']} of {quiet_race['seeds']}" in readme
    )

    def ratio(r: dict) -> str:
        return f"{r['ratio']:.2f}x [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"

    assert f"costs {ratio(quiet['seconds_per_run_ratio'])} a PPO run on a quiet machine" in readme
    assert f"({ratio(s1['seconds_per_run_ratio'])} as first timed, under load)" in readme
