"""benchmarks/lm_stability_report.py: the headline rule's four cases on synthetic whole studies, nothing read from a
stage that is not whole, the scale bullet's agreement check, and the committed README block, results page and
how-to advice tied to the committed summary. No model is trained here."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import lm_stability as st  # noqa: E402
from benchmarks import lm_stability_report as rep  # noqa: E402

RATES = (1e-4, 1e-3, 1e-2)
BUDGET = 1000


@pytest.fixture
def tiny(monkeypatch):
    """A study of three arms at chain H = 2 only, three rates, 4 sweep seeds, 6 paired seeds, a 1,000-token budget."""
    arms = {a: st.ARMS[a] for a in ("grpo", "rloo", "anchor_pooled")}
    monkeypatch.setattr(st, "ARMS", arms)
    monkeypatch.setattr(st, "PRACTICAL", tuple(arms))
    monkeypatch.setattr(
        st, "SETTINGS", {"chain_H2": dataclasses.replace(st.SETTINGS["chain_H2"], budget=BUDGET)}
    )
    monkeypatch.setattr(st, "RATES", RATES)
    monkeypatch.setattr(st, "SWEEP_SEEDS", tuple(range(4)))
    monkeypatch.setattr(st, "H2H_SEEDS", tuple(range(100, 106)))
    monkeypatch.setattr(st, "LARGE_TUNE_SEEDS", (300, 301))
    monkeypatch.setattr(st, "LARGE_SEEDS", tuple(range(200, 206)))


def _run(stage, arm, lr, seed, path, model="small"):
    """A run whose evaluations at 0, 500 and 1,000 tokens read ``path`` (start 0.25)."""
    points = [{"step": i, "tokens": 500 * i, "success": s, "own_tokens": 500 * i, "mc_tokens": 0}
              for i, s in enumerate([0.25, *path])]  # fmt: skip
    return {
        "stage": stage, "setting": "chain_H2", "model": model, "arm": arm, "lr": lr, "seed": seed, "eval_seed": 7,
        "budget": BUDGET, "reference": False, "charge_mc": True, "start_success": 0.25, "final_success": path[-1],
        "checkpoints": points, "steps": 2, "own_tokens": 1000, "mc_tokens": 0, "sampled_tokens": 1000,
        "underspend": 0, "collapsed": st.collapsed(0.25, path[-1]),
    }  # fmt: skip


FAST, SLOW, DEAD = [0.9, 0.9], [0.5, 0.9], [0.0, 0.0]


def _sweep():
    """grpo and rloo: stable at 1e-4 only (half collapse at 1e-3); anchor_pooled stable up to 1e-3; all collapse at
    1e-2. Tuned rates: grpo and rloo 1e-4, anchor_pooled 1e-3."""
    out = []
    for seed in range(4):
        for arm in ("grpo", "rloo", "anchor_pooled"):
            mid = FAST if arm == "anchor_pooled" or seed < 2 else DEAD
            out += [_run("sweep", arm, 1e-4, seed, SLOW), _run("sweep", arm, 1e-3, seed, mid)]
            out.append(_run("sweep", arm, 1e-2, seed, DEAD))
    return out


def _h2h(paths):
    """Head-to-head runs: ``paths[arm](seed)`` at each arm's tuned rate."""
    tuned = {"grpo": 1e-4, "rloo": 1e-4, "anchor_pooled": 1e-3}
    return [_run("h2h", a, tuned[a], s, paths[a](s)) for a in tuned for s in range(100, 106)]


def _large(paths):
    """The larger model: grpo and the best credit arm tuned on 2 seeds (1e-4 best), then 6 paired seeds."""
    out = [_run("large_tune", a, lr, s, SLOW if lr == 1e-4 else DEAD, "large")
           for a in paths for lr in RATES for s in (300, 301)]  # fmt: skip
    return out + [_run("large_h2h", a, 1e-4, s, paths[a](s), "large") for a in paths for s in range(200, 206)]


def _slow_or(seed):
    return SLOW if seed % 3 else [0.4, 0.85]


LEVEL = {"grpo": _slow_or, "rloo": _slow_or, "anchor_pooled": _slow_or}


def test_nothing_is_read_from_a_stage_that_is_not_whole(tiny):
    summary = st.summarize(_sweep()[:-1])
    assert rep.headline(summary) is None and rep.curve_bullet(summary, "chain_H2") is None
    block = rep.readme_block(summary)
    assert "being measured" in block and "chain H = 2 sweep 35 of 36" in " ".join(block.split())
    assert "draws no advice" in rep.advice_block(summary)
    assert "## chain H = 2: the stability curve" not in rep.page(summary)


def test_a_whole_sweep_is_read_before_the_head_to_head_but_answers_nothing(tiny):
    summary = st.summarize(_sweep() + _h2h(LEVEL)[:-1])
    assert rep.headline(summary) is None and rep.answer(summary) is None
    block = " ".join(rep.readme_block(summary).split())
    assert "being measured" in block and "chain H = 2 head-to-head 17 of 18" in block
    assert "- **Stability curve, chain H = 2** (4 seeds per arm and rate" in block
    assert "draws no advice" in rep.advice_block(summary)


def test_case_one_names_the_arm_that_reaches_the_target_with_fewer_tokens(tiny):
    paths = {**LEVEL, "anchor_pooled": lambda s: FAST if s != 105 else SLOW}
    summary = st.summarize(_sweep() + _h2h(paths))
    assert rep.answer(summary) == {"case": 1, "arm": "anchor_pooled", "endpoint": "tokens_saved"}
    row = rep.h2h_rows(summary, "chain_H2", "small")["anchor_pooled"]
    assert row["vs_grpo"]["tokens_saved"]["verdict"] == "better"
    sentence = rep.headline(summary)
    assert sentence.startswith("At chain H = 2, `anchor_pooled` at its tuned rate 0.001 (tuned GRPO: 0.0001)")
    assert (
        "with 500 sampled tokens against 1,000 sampled tokens for tuned GRPO (Kaplan-Meier medians"
        in sentence
    )
    assert "stays stable up to 0.001, GRPO up to 0.0001" in sentence
    assert "use `anchor_pooled` at its tuned rate" in " ".join(rep.advice_block(summary).split())


def test_case_one_says_so_when_under_half_of_grpos_runs_reach_the_target(tiny):
    paths = {**LEVEL, "grpo": lambda s: [0.3, 0.3] if s < 104 else SLOW, "anchor_pooled": lambda s: FAST}
    sentence = rep.headline(st.summarize(_sweep() + _h2h(paths)))
    assert "with 500 sampled tokens against under half of tuned GRPO's runs reaching it" in sentence


def test_case_four_says_a_wider_stable_range_buys_no_tokens(tiny):
    summary = st.summarize(_sweep() + _h2h(LEVEL))
    assert rep.answer(summary) == {
        "case": 4,
        "arm": "anchor_pooled",
        "endpoint": None,
        "wider": ["anchor_pooled"],
    }
    sentence = rep.headline(summary)
    assert (
        "one of the 2 other practical arms stayed stable at a larger learning rate than GRPO (`anchor_pooled` up to "
        "0.001, 10x GRPO's 0.0001; at 0.001 it collapsed in 0 of 4 sweep runs, GRPO in 2 of 4; not a test); but at "
        "each arm's tuned rate" in sentence
    )
    assert "6 paired seeds" in sentence
    assert "no arm is detectably ahead of tuned GRPO" in sentence
    rows = [r for a, r in rep.h2h_rows(summary, "chain_H2", "small").items() if a != "grpo"]
    low, high = (f(r["vs_grpo"]["success"]["detectable"] for r in rows) for f in (min, max))
    assert f"detectable with 80% power after Holm: {low:.3f}-{high:.3f} in success" in sentence
    advice = " ".join(rep.advice_block(summary).split())
    assert "tune GRPO's learning rate first" in advice, advice
    assert "`anchor_pooled` is the arm whose stable range reached furthest (sweep collapse counts: at 0.001 it " \
           "collapsed in 0 of 4 sweep runs, GRPO in 2 of 4; at 0.01 it collapsed in 4 of 4 sweep runs, GRPO in 4 " \
           "of 4; not a test)" in advice, advice  # fmt: skip
    # its stable rate is not its tuned rate (the tie at 0.9 went to the smaller rate): both successes are given
    assert "Its mean final success was 0.900 at 0.001 against 0.900 at its tuned rate 0.0001." in advice


def test_case_three_reports_the_arm_behind_tuned_grpo(tiny):
    paths = {**LEVEL, "grpo": lambda s: FAST if s != 105 else SLOW}
    summary = st.summarize(_sweep() + _h2h(paths))
    found = rep.answer(summary)
    assert found["case"] == 3 and found["endpoint"] == "tokens_saved"
    assert rep.headline(summary).startswith(f"At chain H = 2, no arm beats tuned GRPO, and `{found['arm']}`")


def test_the_answer_and_its_bullets_fill_the_readme_block_once_whole(tiny):
    summary = st.summarize(_sweep() + _h2h(LEVEL))
    block = rep.readme_block(summary)
    flat = " ".join(block.split())
    assert f"**{rep.headline(summary)}**" in flat
    assert "the largest rate at which at most 10% of runs collapse is `grpo` 0.0001, `rloo` 0.0001, " \
           "`anchor_pooled` 0.001" in flat  # fmt: skip
    assert "0 of 54 runs passed their budget" in flat
    assert "median sampled tokens to the target (0.810) are `grpo` 1,000 (100% reach it)" in flat
    assert "13x larger" not in flat  # the larger model is not whole
    assert all(len(line) <= rep.WIDTH for line in block.splitlines())
    assert "## chain H = 2: the head-to-head" in rep.page(summary)


@pytest.mark.parametrize(
    ("large_arm", "agrees"), [(_slow_or, False), (lambda s: FAST if s != 205 else SLOW, True)]
)
def test_the_scale_bullet_says_whether_the_larger_model_agrees(tiny, large_arm, agrees):
    paths = {**LEVEL, "anchor_pooled": lambda s: FAST if s != 105 else SLOW}
    small = _sweep() + _h2h(paths)
    best = st.best_credit_arm(st.summarize(small)["head_to_head"])
    assert best == "anchor_pooled"
    summary = st.summarize(small + _large({"grpo": _slow_or, best: large_arm}))
    bullet = " ".join(rep.scale_bullet(summary).split())
    page = rep.page(summary)
    assert (
        "## chain H = 2, the larger model: tuning" in page
        and "## chain H = 2, the larger model: head-to-head" in page
    )
    assert "`anchor_pooled` (lr 0.0001) on 6 paired seeds" in bullet
    assert ("the same verdicts as the small model's" in bullet) is agrees
    row = rep.h2h_rows(summary, "chain_H2", "large")["anchor_pooled"]
    assert f"detectable {row['vs_grpo']['success']['detectable']:.2f}" in bullet
    # _slow_or ends above the start on every seed; the tuning runs at 1e-4 are SLOW: nothing collapsed
    assert "Collapsed: `grpo` in 0 of 6 held-out runs at its tuned rate (0 of 2 tuning runs); `anchor_pooled` in 0 " \
           "of 6 held-out runs at its tuned rate (0 of 2 tuning runs)." in bullet  # fmt: skip
    assert ("different from the small model's verdicts" in bullet) is not agrees


def test_the_curve_bullet_gives_grpo_at_the_wider_rate_the_plateau_and_the_dropped_reference(
    tiny, monkeypatch
):
    arms = {**st.ARMS, "oracle_uncharged": dataclasses.replace(st.ARMS["grpo"], reference=True, settings=())}
    monkeypatch.setattr(st, "ARMS", arms)
    summary = st.summarize(_sweep() + _h2h(LEVEL))
    bullet = " ".join(rep.curve_bullet(summary, "chain_H2").split())
    # anchor_pooled is stable up to 1e-3, where GRPO collapsed in 2 of 4 sweep runs
    grpo = next(c for c in summary["curve"] if (c["arm"], c["lr"]) == ("grpo", 1e-3))
    # GRPO's median at 1e-3 (two runs reach 0.9 at 500 tokens) is below its own at 1e-4 (1,000): the rate does it
    assert (
        f"GRPO at 0.001 needs {rep.median(grpo)}, with 2 of 4 runs collapsed against `anchor_pooled`'s 0: GRPO "
        "too reaches the target sooner at that rate, and the difference there is fewer collapses." in bullet
    )
    # every arm is tuned at 1e-4 (anchor_pooled's tie with 1e-3 goes to the smaller rate), where its runs rise by 0.4
    assert "At their tuned rates none of the practical arms plateaued within the budget (mean success gained +0.400 " \
           "over the budget's last quarter; the plateau bound is 0.03), so all of their final successes are read " \
           "while still rising" in bullet  # fmt: skip
    assert "`oracle_uncharged` (reference) is not run in this setting" in bullet


@pytest.mark.parametrize("target", [0.05, 10.0])
def test_the_power_bullet_states_the_target_against_each_arms_detectable_difference(
    tiny, monkeypatch, target
):
    monkeypatch.setattr(st, "TARGET_DETECTABLE", target)
    spread = {
        **LEVEL,
        "rloo": lambda s: [0.5, 0.2 + 0.1 * (s % 4)],
        "anchor_pooled": lambda s: [0.5, 0.9 - 0.1 * (s % 3)],
    }
    summary = st.summarize(_sweep() + _h2h(spread))
    bullet = " ".join(rep.power_bullet(summary).split())
    rows = rep.h2h_rows(summary, "chain_H2", "small")
    for arm in ("rloo", "anchor_pooled"):
        assert f"`{arm}` {rows[arm]['vs_grpo']['success']['detectable']:.3f}" in bullet
    assert ("missed by 2 of 2 arms" in bullet) is (target == 0.05)
    assert ("met by every arm" in bullet) is (target == 10.0)
    assert "collapse" not in bullet  # no head-to-head run collapsed here
    assert rep.power_bullet(st.summarize(_sweep() + _h2h(spread)[:-1])) is None  # not whole
    collapsing = {**LEVEL, "grpo": lambda s: DEAD if s == 100 else _slow_or(s)}
    bullet = " ".join(rep.power_bullet(st.summarize(_sweep() + _h2h(collapsing))).split())
    assert "(collapsed runs of 6: `grpo` 1, `rloo` 0, `anchor_pooled` 0)" in bullet


def test_the_map_bullet_places_the_language_model_maps_rates_on_the_curve(tiny, monkeypatch):
    summary = st.summarize(_sweep())
    bullet = " ".join(rep.map_bullet(summary, "docs/").split())
    assert "learning rates 0.001 and 0.003 (8 or 16 episodes a step)" in bullet
    assert "GRPO collapsed in 2 of 4 at 0.001 and its largest stable rate is 0.0001, so at 8 episodes a step that " \
           "map's rates lie above GRPO's stable range." in bullet  # fmt: skip
    # a map whose smallest rate is GRPO's stable rate is not said to lie above it
    monkeypatch.setattr(rep.lm, "GRID_LRS", (1e-4, 1e-3))
    assert " ".join(rep.map_bullet(summary, "docs/").split()).endswith("its largest stable rate is 0.0001.")
    assert rep.map_bullet(st.summarize(_sweep()[:-1]), "docs/") is None  # the sweep is not whole


def test_case_four_names_every_arm_stable_past_grpo(tiny):
    sweep = [r if (r["arm"], r["lr"]) != ("rloo", 1e-3) else _run("sweep", "rloo", 1e-3, r["seed"], FAST)
             for r in _sweep()]  # fmt: skip
    summary = st.summarize(sweep + _h2h(LEVEL))
    found = rep.answer(summary)
    assert found["case"] == 4 and found["wider"] == ["anchor_pooled", "rloo"]
    other = next(a for a in found["wider"] if a != found["arm"])
    sentence = rep.headline(summary)
    assert "2 of the 2 other practical arms stayed stable at a larger learning rate than GRPO " \
           f"(`{found['arm']}` up to 0.001, 10x GRPO's 0.0001, `{other}` up to 0.001;" in sentence  # fmt: skip


def test_the_advice_reads_every_rate_up_to_the_arms_when_grpo_has_no_stable_rate(tiny, monkeypatch):
    monkeypatch.setattr(st, "MAX_EXTENSIONS", 0)  # GRPO's bottom rate collapses, and no smaller rate is added
    sweep = [r if (r["arm"], r["lr"], r["seed"]) != ("grpo", 1e-4, 0) else _run("sweep", "grpo", 1e-4, 0, DEAD)
             for r in _sweep()]  # fmt: skip
    summary = st.summarize(sweep + _h2h(LEVEL))
    assert rep.arm_line(summary, "chain_H2", "small", "grpo")["stable_rate"] is None
    assert "(GRPO: none)" in rep.headline(summary)
    advice = " ".join(rep.advice_block(summary).split())
    assert (
        "(sweep collapse counts: at 0.0001 it collapsed in 0 of 4 sweep runs, GRPO in 1 of 4; at 0.001"
        in advice
    )


def test_the_budget_bullet_reads_only_whole_stages(tiny):
    paths = {**LEVEL, "anchor_pooled": lambda s: FAST if s != 105 else SLOW}
    small = _sweep() + _h2h(paths)
    partial = _large({"grpo": _slow_or, "anchor_pooled": _slow_or})[
        :3
    ]  # three of the larger model's tuning runs
    summary = st.summarize(small + partial)
    assert not rep.whole(summary, "large_tune", "chain_H2")
    assert "## chain H = 2, the larger model" not in rep.page(summary)
    assert "0 of 54 runs passed their budget" in " ".join(rep.budget_bullet(summary).split())
    whole_large = st.summarize(small + _large({"grpo": _slow_or, "anchor_pooled": _slow_or}))
    n_large = len(_large({"grpo": _slow_or, "anchor_pooled": _slow_or}))
    assert f"0 of {54 + n_large} runs passed their budget" in " ".join(rep.budget_bullet(whole_large).split())


def test_a_missing_marker_is_an_error_that_says_where_the_block_goes():
    with pytest.raises(ValueError, match="markers .* are missing"):
        rep.replace_block("no markers here", "<!-- a -->", "<!-- b -->", "body")
    assert rep.replace_block("x<!-- a -->\nold\n<!-- b -->y", "<!-- a -->", "<!-- b -->", "new") == (
        "x<!-- a -->\nnew\n<!-- b -->y"
    )


def test_committed_readme_page_and_advice_are_what_the_committed_summary_gives():
    if not st.SUMMARY.exists():
        pytest.skip("no committed lm_stability summary yet")
    summary = json.loads(st.SUMMARY.read_text(encoding="utf-8"))
    for path, text in rep.rendered(summary).items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.name}: run python benchmarks/lm_stability_report.py"
        )
