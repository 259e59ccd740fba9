"""docs/paper-claims.md against benchmarks/results/paper_claims.json: the page is the JSON rendered, every number on
the page is in the JSON, every claim has a verdict, and the protocol's statistics behave on hand-made records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
VERDICTS = {"holds", "does not hold", "holds partly", "inconclusive", "not measurable here", "not measured yet",
            "see the curve"}  # fmt: skip
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
    ):
        assert needed in measured


def test_sign_test_is_exact():
    bench = _bench()
    assert bench.sign_test(0, 0) == 1.0
    assert bench.sign_test(6, 6) == 1.0
    assert bench.sign_test(12, 0) == pytest.approx(2 / 4096)
    assert bench.sign_test(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert bench.sign_test(2, 10) == bench.sign_test(10, 2)


def _write_run(root: Path, seed: int, arm: str, curve: list[tuple[int, float, float, float]]) -> None:
    seed_dir = root / "demo_plateau" / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {"arm": arm, "seed": seed, "step": s, "accuracy": a, "sampled_tokens": 100.0 * s, "train_seconds": t,
         "task": "demo_plateau", "kl_to_start": kl}
        for s, a, t, kl in curve
    ]  # fmt: skip
    (seed_dir / f"{arm}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    logs = [{"step": float(s), "reward": 0.5, "completions/mean_length": 10.0} for s in range(1, 11)]
    done = {"task": "demo_plateau", "seed": seed, "arm": arm, "steps": 10, "sampled_tokens": 1000.0,
            "prompts_per_step": 4, "logs": logs}  # fmt: skip
    (seed_dir / f"{arm}.done.json").write_text(json.dumps(done))


def test_stage1_reads_nothing_until_complete_and_then_decides_by_the_protocol(tmp_path, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "REGIME_RUNS", tmp_path / "none")
    for seed in range(11):
        _write_run(tmp_path, seed, "grpo", [(0, 0.5, 0, 0), (5, 0.6, 5, 0.1), (10, 0.7, 10, 0.2)])
        _write_run(tmp_path, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 9, 0.05), (10, 0.8, 18, 0.1)])
        _write_run(
            tmp_path, seed, "ppo", [(0, 0.5, 0, 0), (5, 0.6, 8, 0.2), (10, 0.7 + 0.001 * seed, 16, 0.3)]
        )
    partial = bench.stage1(tmp_path)
    assert partial["complete"] is False and partial["finished"] == {"grpo": 11, "vineppo_k4": 11, "ppo": 11}
    row = bench.new_study_row(
        "stage1:accuracy", partial, {"complete": False, "finished": {}, "runs_expected": 1}
    )
    assert row["verdict"] == "not measured yet" and "33 of 36" in row["ours"]
    seed = 11
    _write_run(tmp_path, seed, "grpo", [(0, 0.5, 0, 0), (5, 0.6, 5, 0.1), (10, 0.7, 10, 0.2)])
    _write_run(tmp_path, seed, "vineppo_k4", [(0, 0.5, 0, 0), (5, 0.75, 9, 0.05), (10, 0.8, 18, 0.1)])
    _write_run(tmp_path, seed, "ppo", [(0, 0.5, 0, 0), (5, 0.6, 8, 0.2), (10, 0.7 + 0.001 * seed, 16, 0.3)])
    full = bench.stage1(tmp_path)
    assert full["complete"]
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
    rows = {k: bench.new_study_row(k, full, {"complete": False, "finished": {}, "runs_expected": 1})
            for k in ("stage1:accuracy", "stage1:steps", "stage1:seconds", "stage1:kl")}  # fmt: skip
    assert {r["verdict"] for r in rows.values()} == {"holds"}
    page = bench.render_page({"claims": [], "studies": {"stage1": full}})
    assert "| `ppo` | 10 | 0.705 ± 0.001 | 0.300 ± 0.000 | 0.500 | 16 | 1,000 |" in page
    assert bench.plot_stage1(full, tmp_path / "stage1.png").stat().st_size > 0


def statistics_mean(xs):
    return sum(xs) / len(xs)


def test_the_results_file_regenerates_from_the_committed_records():
    bench = _bench()
    rebuilt = json.loads(json.dumps(bench.build(), allow_nan=True))
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(_result(), sort_keys=True), (
        "benchmarks/results/paper_claims.json is stale: run `python benchmarks/paper_claims.py`"
    )
