"""benchmarks/critic_learning.py: the committed JSON is what the report computes from the committed records."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import critic_learning as cl  # noqa: E402
from _records import compare_tree  # noqa: E402


@pytest.mark.record
def test_report_regenerates_the_committed_json_from_the_records(tmp_path, monkeypatch, capsys):
    committed = json.loads((ROOT / "benchmarks" / "results" / "critic_learning.json").read_text())
    monkeypatch.setattr(cl, "RESULTS", tmp_path)
    summary = cl.report(cl.DEFAULT_ROOT)
    regenerated = json.loads((tmp_path / "critic_learning.json").read_text())
    assert compare_tree(regenerated, committed) == []  # within float64's tolerance: another CPU's last bits
    # Every online arm of the script has its three seeds on record, and the warm-up's end is read where it exists.
    assert set(summary["online"]) == set(cl.ONLINE)
    for arm, record in summary["online"].items():
        assert sorted(record["seeds"]) == [0, 1, 2], arm
    warm = summary["online"]["warmup40"]["seeds"]
    assert all(not math.isnan(s["fresh_ev_pooled_warmup_last_10"]) for s in warm.values())
    assert "Online PPO 'warmup40'" in capsys.readouterr().out
