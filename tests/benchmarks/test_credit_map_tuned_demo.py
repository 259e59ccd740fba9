"""benchmarks/credit_map_tuned_demo.py, `bash scripts/demo.sh --where_credit_pays`: it shows the family where the
committed tuned map gives the oracle its largest gain, and its re-runs agree with the committed records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import credit_map_tuned as cmt  # noqa: E402
import credit_map_tuned_demo as demo  # noqa: E402


class _Bar:
    def update(self, n: int) -> None:
        pass


@pytest.mark.record
def test_the_demo_picks_the_oracles_largest_tuned_gain_and_reruns_agree_with_the_records():
    summary = json.loads(cmt.SUMMARY.read_text())
    family = demo.pick_family(summary)
    assert family is not None
    gains = [
        r["vs_best_grpo"]["mean"]
        for r in summary["records"]
        if r["arm"] == "oracle"
        and r.get("vs_best_grpo")
        and (not family["tested"] or r["vs_best_grpo"].get("p_holm") is not None)
    ]
    assert family["gain"] == max(gains)
    arms = demo.demo_arms(family["group"])
    assert [r["arm"] for r in arms][:2] == ["grpo", "oracle"]
    grpo = arms[0]
    runs = demo.retrain(family["setting"], family["fraction"], grpo, [grpo["seeds"][0]], _Bar())
    assert runs[0]["agrees"], runs  # the same run as the study's, within the stated tolerance


def test_demo_sh_runs_the_tuned_demo_and_keeps_the_untuned_one():
    script = (ROOT / "scripts" / "demo.sh").read_text()
    assert '"--where_credit_pays"' in script and "benchmarks/credit_map_tuned_demo.py" in script
    assert '"--where_credit_pays_untuned"' in script and "benchmarks/where_credit_pays_demo.py" in script


def test_the_demo_refuses_fewer_than_two_seeds(capsys):
    import pytest

    with pytest.raises(SystemExit):
        demo.main(["--seeds", "1"])
    assert "a paired interval needs 2" in capsys.readouterr().err


def test_the_demo_prints_the_language_model_answer_from_its_committed_summary():
    import lm_agent_map as lm

    lines = demo.lm_lines()
    assert lines[1:] == lm.carry_lines(json.loads(lm.SUMMARY.read_text()))
    assert any(line.startswith("- **Does the toy's answer carry over?**") for line in lines)
