"""benchmarks/lm_agent_map.py's bookkeeping: the token ledger and its budget fractions, the tuning rule, resumable
runs (a finished run is skipped, an interrupted one reruns), the summary's paired comparison with Holm, and the
collapse rule. No model is trained here (a fake runner stands in for training)."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import lm_agent_map as lm  # noqa: E402
from benchmarks._runs import append_run  # noqa: E402


def test_ledger_evaluates_each_fraction_before_the_predicted_next_step_would_pass_it():
    ledger = lm.Ledger(1000, charge_mc=True)
    ledger.start_success = 0.2
    due = []
    for step, (own, mc) in enumerate(
        [(100, 50), (100, 50), (100, 50), (100, 50), (100, 50), (100, 50)], start=1
    ):
        ledger.add_batch(own, mc)
        for fraction in ledger.due(step):
            ledger.record(fraction, step, 0.1 * step)
            due.append((fraction, step, ledger.spent))
    # 150 tokens a step: after step 3 (450) the next would reach 600 > 500; after step 6 (900) the next 1050 > 1000.
    assert due == [(0.5, 3, 450), (1.0, 6, 900)]
    assert ledger.finished


def test_uncharged_monte_carlo_tokens_do_not_count():
    ledger = lm.Ledger(1000, charge_mc=False)
    ledger.add_batch(100, 5000)
    assert ledger.spent == 100
    assert lm.Ledger(1000, charge_mc=True).spent == 0


def test_a_fraction_the_first_step_cannot_afford_is_the_start_marked_unaffordable():
    ledger = lm.Ledger(1000, charge_mc=True)
    ledger.start_success = 0.25
    ledger.add_batch(200, 400)  # 600 > 500: the half budget cannot hold one step
    due = ledger.due(1)
    assert due == [1.0]  # 600 + 600 > 1000: the full budget is due now too
    [half] = [p for p in ledger.points if p["fraction"] == 0.5]
    assert half == {"fraction": 0.5, "steps": 0, "tokens": 0, "success": 0.25, "affordable": False}


def _tuning_record(lr: float, prompts: int, seed: int, success: dict[float, float]) -> dict:
    return {
        "lr": lr,
        "prompts": prompts,
        "seed": seed,
        "checkpoints": [
            {"fraction": f, "success": s, "steps": 1, "tokens": 1, "affordable": True}
            for f, s in success.items()
        ],
    }


def test_choose_takes_the_best_mean_and_breaks_ties_toward_small_steps():
    records = []
    for lr, prompts in lm.GRID:
        for seed in lm.TUNING_SEEDS:
            best_full = lr == 1e-3 and prompts == 4
            records.append(_tuning_record(lr, prompts, seed, {0.5: 0.3, 1.0: 0.6 if best_full else 0.4}))
    assert lm.choose(records, 1.0) == (1e-3, 4)
    assert lm.choose(records, 0.5) == (min(lm.GRID_LRS), min(lm.GRID_PROMPTS))  # every point ties at 0.3
    with pytest.raises(ValueError, match="tuning is incomplete"):
        lm.choose(records[1:], 1.0)


def test_run_all_skips_finished_runs_and_reruns_interrupted_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(lm, "start_success", lambda setting: 0.2)
    monkeypatch.setattr(lm, "provenance", lambda: {"commit": "abc"})
    specs = [lm.RunSpec("chain_H2", "grpo", 1e-3, 2, seed, "tune") for seed in (1000, 1001, 1002)]
    append_run(tmp_path, specs[0].key, {"run": "done before"})  # specs[1] was interrupted: no record
    ran = []

    def runner(spec, *, start_success):
        ran.append(spec.seed)
        return {"run": spec.name, "start_success": start_success}

    assert lm.run_all(specs, root=tmp_path, runner=runner) == 2
    assert ran == [1001, 1002]
    assert lm.read_record(specs[0], tmp_path)["run"] == "done before"
    rerun = lm.read_record(specs[1], tmp_path)
    assert (
        rerun["run"] == specs[1].name and rerun["machine"] == {"commit": "abc"} and rerun["wall_seconds"] >= 0
    )
    assert lm.run_all(specs, root=tmp_path, runner=runner) == 0  # everything done: nothing runs


def _write_eval(root: Path, arm: str, lr: float, prompts: int, successes: list[float], start: float) -> None:
    for seed, s in zip(lm.EVAL_SEEDS, successes, strict=True):
        spec = lm.RunSpec("chain_H2", arm, lr, prompts, seed, "eval")
        append_run(
            root,
            spec.key,
            {
                "start_success": start,
                "checkpoints": [
                    {"fraction": f, "success": s, "steps": 3, "tokens": 100, "affordable": True}
                    for f in lm.FRACTIONS
                ],
            },
        )


def test_summary_pairs_each_arm_with_tuned_grpo_and_adjusts_with_holm(tmp_path):
    for arm in ("grpo", "vineppo_k1"):
        for lr, prompts in lm.GRID:
            for seed in lm.TUNING_SEEDS:
                good = (lr, prompts) == (1e-3, 2)
                spec = lm.RunSpec("chain_H2", arm, lr, prompts, seed, "tune")
                append_run(
                    tmp_path,
                    spec.key,
                    _tuning_record(lr, prompts, seed, {f: 0.5 if good else 0.1 for f in lm.FRACTIONS}),
                )
    grpo = [0.30 + 0.01 * (i % 3) for i in range(12)]
    vine = [g + 0.1 + 0.01 * (i % 2) for i, g in enumerate(grpo)]
    _write_eval(tmp_path, "grpo", 1e-3, 2, grpo, start=0.3)
    _write_eval(tmp_path, "vineppo_k1", 1e-3, 2, vine, start=0.3)
    # the untuned oracle runs at tuned GRPO's full-budget point; two of its runs collapse
    oracle = [0.9] * 10 + [0.0, 0.05]
    _write_eval(tmp_path, "oracle_k16", 1e-3, 2, oracle, start=0.3)
    summary = lm.summarize(["chain_H2"], ["grpo", "vineppo_k1", "oracle_k16", "gae_warm"], root=tmp_path)
    rows = {(r["arm"], r["budget_fraction"]): r for r in summary["records"]}
    assert set(rows) == {(a, f) for a in ("grpo", "vineppo_k1", "oracle_k16") for f in lm.FRACTIONS}
    row = rows[("vineppo_k1", 1.0)]
    assert row["chosen"] == {"lr": 1e-3, "prompts": 2, "episodes_per_step": 8}
    assert row["success"] == vine and row["seeds"] == list(lm.EVAL_SEEDS)
    assert row["vs_grpo"]["mean"] == pytest.approx(0.105)
    low, high = row["vs_grpo"]["ci95"]
    assert 0 < low < 0.105 < high
    assert rows[("oracle_k16", 1.0)]["tuned_on"] == "grpo"
    assert rows[("oracle_k16", 1.0)]["collapse_rate"] == pytest.approx(2 / 12)
    # Holm over the setting's 4 comparisons (2 arms x 2 fractions): the adjusted p is never below the raw one
    ps = [r["vs_grpo"] for r in summary["records"] if "vs_grpo" in r]
    assert len(ps) == 4 and all(p["p_holm"] >= p["p"] for p in ps)
    smallest = min(ps, key=lambda p: p["p"])
    assert smallest["p_holm"] == pytest.approx(min(1.0, 4 * smallest["p"]))
    assert "vs_grpo" not in rows[("grpo", 1.0)]


def test_collapse_needs_a_drop_beyond_two_standard_errors():
    se = math.sqrt(2 * 0.3 * 0.7 / lm.EVAL_EPISODES)
    assert not lm.collapsed(0.3, 0.3 - 1.9 * se)
    assert lm.collapsed(0.3, 0.3 - 2.1 * se)
    assert lm.collapsed(0.0 + 1e-9, 0.0) is False  # from a start at 0 nothing can collapse


def test_every_tuned_arm_has_the_same_grid_and_the_oracle_is_not_charged_nor_tuned():
    specs = lm.tuning_specs("chain_H8", ["grpo", "vineppo_k1", "gae_warm", "oracle_k16"])
    by_arm: dict[str, set] = {}
    for spec in specs:
        by_arm.setdefault(spec.arm, set()).add((spec.lr, spec.prompts, spec.seed))
    assert set(by_arm) == {"grpo", "vineppo_k1", "gae_warm"}
    assert all(
        points == {(lr, p, s) for lr, p in lm.GRID for s in lm.TUNING_SEEDS} for points in by_arm.values()
    )
    assert not set(lm.TUNING_SEEDS) & set(lm.EVAL_SEEDS)
    assert lm.ARMS["oracle_k16"].charge_mc is False and lm.ARMS["oracle_k16"].tuned is False


def test_the_oracle_runs_at_h2_only():
    assert lm.runs_in("oracle_k16", "chain_H2") and not lm.runs_in("oracle_k16", "chain_H8")
    assert all(lm.runs_in("grpo", s) for s in lm.SETTINGS)


def test_frozenlake_runs_after_the_chain_settings_with_the_adapter_and_its_own_start():
    assert list(lm.SETTINGS)[-1] == "frozenlake_4x4" and list(lm.SETTINGS)[:2] == ["chain_H2", "chain_H8"]
    setting = lm.SETTINGS["frozenlake_4x4"]
    assert (
        setting.env == "frozenlake" and setting.horizon == 8 and setting.budget_tokens == lm.FROZENLAKE_BUDGET
    )
    pytest.importorskip("gymnasium")
    from mcadvantage.envs import GymnasiumEnvironment

    parts = lm.environment_parts(setting, eval_episodes=3)
    assert issubclass(parts.factory, GymnasiumEnvironment) and len(parts.eval_rows) == 3
    assert {"prompt", "seed"} <= set(parts.train_rows[0]) and len(parts.train_rows) == 512
    eval_seeds = {r["seed"] for r in lm.environment_parts(setting).eval_rows}
    assert not eval_seeds & {r["seed"] for r in parts.train_rows}  # held-out rows
    env = parts.factory()
    env.reset(**parts.eval_rows[0])
    env.act("down")
    assert env.state_key == 4 and parts.calls(env) == 1  # anchor's key: the adapter's state_key, the cell
    # every tuned arm runs there on the same grid; the oracle does not (its steps cost minutes at 8 turns)
    arms = sorted({s.arm for s in lm.tuning_specs("frozenlake_4x4", list(lm.ARMS))})
    assert arms == sorted(a for a, arm in lm.ARMS.items() if arm.tuned)
    assert not lm.runs_in("oracle_k16", "frozenlake_4x4")


@pytest.mark.slow
def test_a_frozenlake_run_spends_within_its_budget_and_evaluates_both_fractions(monkeypatch):
    """One GRPO run on FrozenLake through the real trainer, at a budget of a few steps and 8 held-out episodes."""
    pytest.importorskip("gymnasium")
    import dataclasses

    setting = dataclasses.replace(lm.SETTINGS["frozenlake_4x4"], budget_tokens=400)
    monkeypatch.setitem(lm.SETTINGS, "frozenlake_4x4", setting)
    monkeypatch.setattr(lm, "EVAL_EPISODES", 8)
    record = lm.run_one(lm.RunSpec("frozenlake_4x4", "grpo", 1e-3, 1, 0, "tune"), start_success=0.2)
    assert record["env"] == "frozenlake" and record["steps"] >= 1
    assert [p["fraction"] for p in record["checkpoints"]] == list(lm.FRACTIONS)
    assert 0 < record["sampled_tokens"] <= 400 and record["own_tokens"] == record["sampled_tokens"]
    assert all(0.0 <= p["success"] <= 1.0 for p in record["checkpoints"])


def _committed() -> dict:
    return json.loads(lm.SUMMARY.read_text())


def test_the_page_block_and_the_readme_bullet_are_the_committed_summary():
    """docs/where-credit-pays.md's language-model block and the README's bullet are regenerated from
    benchmarks/results/lm_agent_map.json exactly (``--report`` writes them; nothing is edited by hand)."""
    from benchmarks.credit_map_tuned import LM_BEGIN, LM_END, PAGE

    summary = _committed()
    page = PAGE.read_text()
    assert LM_BEGIN + page.split(LM_BEGIN, 1)[1].split(LM_END, 1)[0] + LM_END == lm.render_block(summary)
    readme = lm.README.read_text()
    block = readme.split(lm.README_BEGIN, 1)[1].split(lm.README_END, 1)[0]
    assert " ".join(block.split()) == " ".join(lm.readme_bullet(summary).split())


def test_the_committed_summary_is_the_records_summary():
    """benchmarks/results/lm_agent_map.json recomputes from the committed run records (counts exact; success,
    tokens and the tests' statistics within relative 1e-9)."""
    summary = _committed()
    again = lm.summarize(list(summary["settings"]), list(lm.ARMS))
    assert len(again["records"]) == len(summary["records"])
    for old, new in zip(summary["records"], again["records"], strict=True):
        assert (old["setting"], old["arm"], old["budget_fraction"], old["chosen"]) == (
            new["setting"], new["arm"], new["budget_fraction"], new["chosen"]
        )  # fmt: skip
        assert old["steps"] == new["steps"] and old["collapsed"] == new["collapsed"]
        assert new["success"] == pytest.approx(old["success"], rel=1e-9)
        if "vs_grpo" in old:
            assert new["vs_grpo"]["p_holm"] == pytest.approx(old["vs_grpo"]["p_holm"], rel=1e-9)


def test_verdicts_need_holm_and_an_interval_on_one_side():
    row = {"vs_grpo": {"p_holm": 0.01, "ci95": [0.1, 0.3]}}
    assert lm.verdict(row) == "pays"
    assert lm.verdict({"vs_grpo": {"p_holm": 0.01, "ci95": [-0.3, -0.1]}}) == "loses"
    assert lm.verdict({"vs_grpo": {"p_holm": 0.2, "ci95": [0.1, 0.3]}}) == "level"
    assert lm.verdict({}) == "-"


def test_the_oracle_is_labelled_an_untuned_uncharged_reference_with_its_continuation_tokens():
    """The README bullet and the page block call the oracle an untuned, uncharged reference, and the block shows its
    continuation tokens beside its charged ones, from the run records."""
    from benchmarks._runs import load_runs

    summary = _committed()
    block, bullet = lm.render_block(summary), lm.readme_bullet(summary)
    assert lm.ORACLE_LABEL == "an untuned, uncharged reference"
    assert f"oracle ({lm.ORACLE_LABEL})" in bullet and f"`oracle_k16` ({lm.ORACLE_LABEL})" in block
    full = next(r for r in summary["records"] if r["arm"] == "oracle_k16" and r["budget_fraction"] == 1.0)
    runs = load_runs(lm.RUNS, "chain_H2/eval/oracle_k16_*.json")
    assert sorted(full["mc_tokens"]) == sorted(r["mc_tokens"] for r in runs.values())
    mean, ratio = lm.uncharged_ratio([full])
    assert ratio == pytest.approx(sum(full["mc_tokens"]) / sum(full["sampled_tokens"]))
    assert f"{mean:,.0f} tokens a run at 1x, {ratio:.0f}x its charged tokens" in block
    assert f"{statistics.fmean(full['mc_tokens']):.0f} uncharged continuation tokens" in block
    assert all(r["mc_tokens"] is None for r in summary["records"] if r["budget_fraction"] != 1.0)


def test_the_toy_answer_in_the_block_is_the_tuned_maps_summary():
    """The block's "does the toy's answer carry over" cites the tuned toy map's summary, not fixed words."""
    from benchmarks.credit_map_tuned import toy_answer

    toy = lm.toy_summary()
    assert toy_answer(toy) in lm.render_block(_committed(), toy)
    assert "paid where tuned GRPO collapsed under a tight budget" not in lm.render_block(_committed(), toy)
