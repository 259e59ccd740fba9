"""benchmarks/horizon_sweep.py: the runner resumes per record, the confirm rule follows the protocol, and the
committed page and summary are what the committed records give."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import horizon_sweep as hs  # noqa: E402
from _records import compare_tree  # noqa: E402
from _runs import RUNS_FILE, append_run, read_run  # noqa: E402

TINY = ["--params", "shared", "--structures", "delayed", "--horizons", "2", "--rates", "0.5",
        "--arms", "grpo", "oracle", "vineppo_k1", "--budget", "32"]  # fmt: skip


def _ran(capsys) -> int:
    out = capsys.readouterr().out
    return int(out.strip().splitlines()[-1].split()[1])


def test_runs_resume_per_record_and_rerun_torn_or_changed_ones(tmp_path, capsys):
    root = tmp_path / "runs"
    assert hs.main(["run", "--root", str(root), "--seeds", "0", "1", *TINY]) == 0
    assert _ran(capsys) == 6
    cell = ("shared", "delayed", 2, 0.5)
    key = hs.record_key(cell, "oracle", 1)
    first = read_run(root, key)
    assert first["settings"]["seed"] == 1 and first["steps"] >= 1
    assert hs.main(["run", "--root", str(root), "--seeds", "0", "1", *TINY]) == 0
    assert _ran(capsys) == 0  # everything recorded: nothing runs again
    append_run(root, key, {"settings": {**first["settings"], "budget_episodes": 33}})  # a foreign record
    assert hs.main(["run", "--root", str(root), "--seeds", "0", "1", "2", *TINY]) == 0
    assert _ran(capsys) == 1 + 3  # the foreign record and seed 2 of each arm
    assert read_run(root, key) == {**first, "seconds": read_run(root, key)["seconds"]}
    assert [p.name for p in root.iterdir()] == [RUNS_FILE]  # the records are one archive, nothing else
    # the report reads the records back: one row per arm, paired against the best GRPO arm
    summary = hs.report(root, tmp_path / "s.json", tmp_path / "page.md", tmp_path / "fig.png", budget=32)
    assert [r["arm"] for r in summary["records"]] == ["grpo", "vineppo_k1", "oracle"]
    assert summary["records"][2]["vs_best_grpo"]["n"] == 3 and summary["cells"][0]["stage"] == "scout"
    page = (tmp_path / "page.md").read_text()
    assert page == hs.UNTUNED_MARKER + "\n" + hs.untuned_section(
        json.loads((tmp_path / "s.json").read_text()), "fig.png"
    )
    assert f"grpo ({summary['cells'][0]['best_grpo_success']:.3f})" in page
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"


def _fake(success: float) -> dict:
    return {"success_at_budget": success}


def test_confirm_rule_takes_both_ends_and_interior_sign_changes():
    def cell_records(gap: float) -> dict:
        return {"grpo": {s: _fake(0.5) for s in hs.SCOUT_SEEDS}, "oracle": {s: _fake(0.9) for s in hs.SCOUT_SEEDS},
                "tree": {s: _fake(0.5 + gap) for s in hs.SCOUT_SEEDS}}  # fmt: skip

    gaps = {2: -0.1, 4: -0.05, 8: 0.02, 16: 0.1}  # crosses between 4 and 8; the oracle's lead is ignored
    records = {("turn", "delayed", h, 0.15): cell_records(g) for h, g in gaps.items()}
    records |= {("turn", "recovery", h, 0.15): cell_records(-0.1) for h in gaps}
    chosen = hs.confirm_cells(records)
    assert [c for c in chosen if c[1] == "delayed"] == [("turn", "delayed", h, 0.15) for h in (2, 4, 8, 16)]
    assert [c for c in chosen if c[1] == "recovery"] == [("turn", "recovery", h, 0.15) for h in (2, 16)]


@pytest.mark.record
def test_committed_summary_and_page_regenerate_from_the_committed_records():
    committed = json.loads(hs.SUMMARY.read_text())
    regenerated = json.loads(
        json.dumps(
            hs.summarize(
                hs.load_records(hs.RUNS),
                committed["budget_episode_equivalents"],
                hs.horizon_gradient.load(hs.GRADIENT_RUNS),
            )
        )
    )
    assert compare_tree(regenerated, committed) == []  # within float64's tolerance: another CPU's last bits
    lead, below = hs.PAGE.read_text().split(hs.UNTUNED_MARKER)
    assert below == "\n" + hs.untuned_section(committed, figure="figures/where_credit_pays.png")
    assert lead.startswith(
        "# Where does turn credit pay?"
    )  # the tuned map leads (tests/benchmarks/test_credit_map_tuned.py)
    confirmed = [c for c in committed["cells"] if c["stage"] == "confirmed"]
    assert confirmed and all(c["seeds"] >= 12 for c in confirmed)


def test_at_twice_the_largest_horizon_the_matched_arms_cannot_take_one_step():
    """The page's reason for stopping at H = 16, checked against real runs: at H = 32 a batch of vineppo K = 1 and
    of grpo_prompts costs more than the whole budget, so training makes no update; plain GRPO still does."""
    from testbed.agent_credit import train_arm

    horizon = 2 * max(hs.HORIZONS)
    budget_tokens = hs.BUDGET_EPISODES * horizon
    for arm in ("vineppo_k1", "vineppo_k1_reuse", "grpo_prompts"):
        assert hs.batch_tokens(arm, horizon) > budget_tokens
        run = train_arm(
            "delayed", horizon, 0.15, arm, 0, budget_episodes=hs.BUDGET_EPISODES, parameterization="shared"
        )
        assert run.steps == 0 and run.sampled_tokens == 0
    for arm in (
        "vineppo_k1",
        "grpo_prompts",
    ):  # at H = 16 the same arms fit: the closed form is the runs' cost
        assert hs.batch_tokens(arm, max(hs.HORIZONS)) <= hs.BUDGET_EPISODES * max(hs.HORIZONS)
    assert train_arm("delayed", horizon, 0.15, "grpo", 0, budget_episodes=hs.BUDGET_EPISODES).steps > 0
    with pytest.raises(ValueError, match="no closed form"):
        hs.batch_tokens("tree", horizon)


def test_the_page_says_which_zero_rollout_cells_never_updated_and_which_trained_as_grpo():
    rows = [
        {"arm": "vineppo_k4", "horizon": 16, "rollout_tokens_per_episode": 0.0, "steps": 0.0},
        {"arm": "vineppo_k4", "horizon": 2, "rollout_tokens_per_episode": 4.6, "steps": 15.0},
        {"arm": "hybrid", "horizon": 16, "rollout_tokens_per_episode": 0.0, "steps": 15.0},
        {"arm": "hybrid", "horizon": 2, "rollout_tokens_per_episode": 0.5, "steps": 15.0},
    ]
    never, fallback = hs._zero_rollout_notes(rows, ["vineppo_k4", "hybrid"], [2, 16])
    assert "No update at all:** `vineppo_k4` at H = 16." in never and "hybrid" not in never
    assert "No rollout, so GRPO:** `hybrid` at H = 16." in fallback and "vineppo" not in fallback
    assert hs._zero_rollout_notes(rows[1:2], ["vineppo_k4"], [2]) == []
