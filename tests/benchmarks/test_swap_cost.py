"""benchmarks/swap_cost.py: the interleaving order, the paired-ratio interval (hand-computed), the token count from a
step's logs, and a ``--quick`` run end to end (its JSON holds what docs/benchmarks.md reports)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("swap_cost")


def test_the_order_rotates_so_every_arm_takes_every_position(bench):
    baton = bench.Baton(["a", "b", "c"])
    order = []
    for _ in range(9):
        order.append(baton.whose_turn())
        baton.release()
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_the_baton_runs_one_arm_at_a_time_and_a_failure_stops_the_others(bench):
    baton = bench.Baton(["a", "b"])
    seen: list[str] = []

    def arm(name: str, steps: int) -> None:
        for _ in range(steps):
            baton.acquire(name)
            seen.append(name)
            baton.release()

    threads = [threading.Thread(target=arm, args=(name, 3)) for name in ("b", "a")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert seen == ["a", "b", "b", "a", "a", "b"]

    stuck = bench.Baton(["a", "b"])
    stuck.fail(ValueError("arm a broke"))
    with pytest.raises(RuntimeError, match="another arm failed"):
        stuck.acquire("b")


def test_ratio_interval_by_hand(bench):
    # log ratios ln(1.1), ln(0.9), ln(1.0): mean -0.001741, sd 0.100335, t(0.975, 2) = 4.302653.
    out = bench.ratio_interval([1.1, 0.9, 1.0])
    logs = [math.log(1.1), math.log(0.9), 0.0]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert out["ratio"] == pytest.approx(math.exp(mean))
    assert (out["low"], out["high"]) == pytest.approx(
        (math.exp(mean - half), math.exp(mean + half)), rel=1e-5
    )
    assert out["n"] == 3 and out["level"] == 0.95
    single = bench.ratio_interval([1.25])
    assert single["ratio"] == pytest.approx(1.25) and single["low"] is None and single["high"] is None


def test_sampled_tokens_count_responses_and_rollouts(bench):
    logs = {"completions/mean_length": 20.0, "mc/generated_tokens": 300.0, "loss": 0.1}
    assert bench.sampled_tokens(logs, responses=8) == 20.0 * 8 + 300.0
    assert bench.sampled_tokens({"completions/mean_length": 12.5}, responses=4) == 50.0


@pytest.mark.slow
def test_quick_run_writes_the_reported_fields(tmp_path):
    out = tmp_path / "swap_cost.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "swap_cost.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["command"] == f"python benchmarks/swap_cost.py --quick --out {out}"
    assert "load average" in result["uptime_before"] and result["machine"]["torch_threads"] == 1
    arms = result["summary"]["arms"]
    assert set(arms) == {"grpo", "swap", "vineppo", "grpo_matched"}
    # Every arm ran every step, with its wall and CPU time and the tokens it sampled; the swap sampled exactly what
    # GRPO sampled (its own random streams, the same prompts), so the pair times identical work.
    assert {len(steps) for steps in result["steps"].values()} == {result["config"]["steps"]}
    assert all(s["sampled_tokens"] > 0 for steps in result["steps"].values() for s in steps)
    assert [s["sampled_tokens"] for s in result["steps"]["swap"]] == [
        s["sampled_tokens"] for s in result["steps"]["grpo"]
    ]
    assert all(0 < s["cpu_seconds"] and 0 < s["seconds"] for steps in result["steps"].values() for s in steps)
    assert (
        arms["grpo_matched"]["prompts_per_step"]
        == result["calibration"]["grpo_matched_prompts_per_step"]
        >= 1
    )
    for comparison in result["summary"]["comparisons"]:
        assert comparison["n"] == result["config"]["steps"] - result["config"]["warmup_steps"]
        for measured in (comparison, comparison["cpu"]):
            assert 0 < measured["low"] <= measured["ratio"] <= measured["high"]
    assert "the swap" in result["table"] and "95% CI" in proc.stdout
