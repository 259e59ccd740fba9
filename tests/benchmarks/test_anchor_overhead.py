"""benchmarks/anchor_overhead.py on a tiny batch: every arm is timed every round, the overheads are paired by round
and the record names its command, machine and settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import anchor_overhead as ao  # noqa: E402


def test_a_small_run_writes_every_arm_and_the_paired_overheads(tmp_path):
    out = tmp_path / "overhead.json"
    argv = ["--rounds", "3", "--horizon", "3", "--prompts", "2", "--group", "2", "--turn-tokens", "2",
            "--tool-tokens", "1", "--out", str(out)]  # fmt: skip
    assert ao.main(argv) == 0
    record = json.loads(out.read_text())
    assert set(record["median_s"]) == {"grpo", "anchor", "anchor_pooled", "anchor_observation", "step"}
    assert record["batch"] == {"episodes": 4, "completion_tokens": 4 * (4 * 2 + 3 * 1), "model_turns": 16}
    for overhead in record["overhead_over_grpo"].values():
        low, high = overhead["ci95_s"]
        assert low <= overhead["mean_s"] <= high
        assert overhead["share_of_step"] == pytest.approx(overhead["mean_s"] / record["median_s"]["step"])
    assert record["command"].startswith("python benchmarks/anchor_overhead.py --rounds 3")
    assert record["machine"]["cpu_count"] >= 1
