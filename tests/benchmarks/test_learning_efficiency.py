"""The side-by-side comparison: arm names, the benchmark's summary on hand-computed records, a resumable
end-to-end run on the quick task, and the shipped warm-up checkpoint the demo starts from."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import load_benchmark

from benchmarks._runs import append_run, read_run, runs_file
from mcadvantage.demo.config import ArmSpec, DemoConfig, shipped_warmup_dir, usable_shipped_warmup
from testbed.arms import RLFreeArm, parse_arm
from testbed.tasks import StudyConfig

REPO = Path(__file__).resolve().parents[2]


#: ``ppo_warm``'s options, written out (the critic study's choice: docs/howto/ppo-critic.md).
WARM = (("critic_learning_rate", 3e-3), ("critic_warmup_steps", 10))


def _benchmark():
    return load_benchmark("learning_efficiency")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("grpo", ArmSpec("grpo", "grpo", None, None)),
        ("rloo", ArmSpec("rloo", "rloo", None, None)),
        ("ppo", ArmSpec("ppo", "gae", None, None)),
        ("ppo_warm", ArmSpec("ppo_warm", "gae", None, None, WARM)),
        ("ppo_warm_l0.95", ArmSpec("ppo_warm_l0.95", "gae", None, None, (*WARM, ("gae_lambda", 0.95)))),
        ("ppo_warm_l1_p8", ArmSpec("ppo_warm_l1_p8", "gae", None, 8, (*WARM, ("gae_lambda", 1.0)))),
        ("vineppo_k9", ArmSpec("vineppo_k9", "vineppo", 9, None)),
        ("grpo_p19", ArmSpec("grpo_p19", "grpo", None, 19)),
        ("vineppo_k4_p2", ArmSpec("vineppo_k4_p2", "vineppo", 4, 2)),
        (
            "vineppo_k3_reuse",
            ArmSpec("vineppo_k3_reuse", "vineppo", 3, None, (("mc_reuse_samples", True),)),
        ),
        (
            "vineppo_k2_variance_p5",
            ArmSpec(
                "vineppo_k2_variance_p5",
                "vineppo",
                2,
                5,
                (("mc_allocation", "variance"), ("mc_reuse_samples", True)),
            ),
        ),
        ("hybrid", ArmSpec("hybrid", "hybrid")),
        ("hybrid_b50", ArmSpec("hybrid_b50", "hybrid", None, None, (("hybrid_budget", 0.5),))),
        ("hybrid_b5_p8", ArmSpec("hybrid_b5_p8", "hybrid", None, 8, (("hybrid_budget", 0.05),))),
        ("tree", ArmSpec("tree", "tree")),
        ("tree_d12", ArmSpec("tree_d12", "tree", None, None, (("tree_depths", (0, 12)),))),
        ("sft", RLFreeArm("sft")),
        ("restem", RLFreeArm("restem")),
        ("dpo_plus", RLFreeArm("dpo_plus")),
    ],
)
def test_parse_arm(name, expected):
    """Every arm name of the grammar, the warmed-up critic's (``ppo_warm``: the critic study's settings) included."""
    assert parse_arm(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "ppo_k4",
        "ppo_l0.95",
        "ppo_warm_l",
        "ppo_warm_l2",
        "ppo_warm_l.5",
        "vineppo",
        "vineppo_k0",
        "grpo_p0",
        "grpo_k4",
        "sft_p2",
        "restem_p2",
        "grpo_reuse",
        "vineppo_k3_fast",
        "hybrid_k4",
        "hybrid_b",
        "hybrid_b1000",
        "tree_d0",
        "tree_k4",
        "",
    ],
)
def test_parse_arm_rejects_unknown_names_and_says_what_works(name):
    with pytest.raises(
        ValueError,
        match="use 'grpo', 'rloo', 'ppo', 'ppo_warm' or 'ppo_warm_l<L>'.*'vineppo_k<K>'.*without RL: 'sft', 'restem'",
    ):
        parse_arm(name)


@pytest.mark.parametrize("name", ["sft", "restem", "dpo_plus"])
def test_the_demo_runs_rl_arms_only(name):
    """The arms without RL are the studies' (testbed.arms): the demo's grammar and its --arms refuse them."""
    from mcadvantage.demo.config import parse_args
    from mcadvantage.demo.config import parse_arm as demo_parse_arm

    with pytest.raises(ValueError, match=f"unknown arm '{name}'"):
        demo_parse_arm(name)
    with pytest.raises(SystemExit, match=f"--arms: unknown arm '{name}'"):
        parse_args(["--arms", f"grpo,{name}"])


def test_mc_option_arms_reach_the_config():
    from mcadvantage.demo.arms import rl_training_args

    args = rl_training_args(DemoConfig(), parse_arm("vineppo_k3_variance"), "/tmp/unused")
    assert (args.num_mc_rollouts, args.mc_reuse_samples, args.mc_allocation) == (3, True, "variance")
    plain = rl_training_args(DemoConfig(), parse_arm("vineppo_k3"), "/tmp/unused")
    assert (plain.mc_reuse_samples, plain.mc_allocation) == (False, "uniform")
    hybrid = rl_training_args(DemoConfig(), parse_arm("hybrid_b50"), "/tmp/unused")
    assert (hybrid.advantage_estimator, hybrid.hybrid_budget, hybrid.num_mc_rollouts) == ("hybrid", 0.5, 4)
    warm = rl_training_args(DemoConfig(), parse_arm("ppo_warm_l0.95"), "/tmp/unused")
    assert (
        warm.advantage_estimator,
        warm.critic_learning_rate,
        warm.critic_warmup_steps,
        warm.gae_lambda,
    ) == (
        "gae",
        3e-3,
        10,
        0.95,
    )
    assert parse_arm("ppo_warm").critic_warmup_steps == 10 and parse_arm("ppo").critic_warmup_steps == 0
    tree = rl_training_args(DemoConfig(), parse_arm("tree_d12"), "/tmp/unused")
    assert (tree.advantage_estimator, tree.tree_branching, list(tree.tree_depths)) == (
        "tree",
        [4, 2],
        [0, 12],
    )


def _rec(arm, seed, step, acc, tokens, seconds, task="t"):
    return {
        "task": task,
        "arm": arm,
        "seed": seed,
        "step": step,
        "accuracy": acc,
        "sampled_tokens": tokens,
        "train_seconds": seconds,
    }


def test_summary_hand_computed():
    le = _benchmark()
    records = []
    # seed 0: GRPO 0.4 -> 0.5 -> 0.6 (best 0.6); VinePPO 0.4 -> 0.6 -> 0.7: reaches 0.6 at step 10
    records += [
        _rec("grpo", 0, 0, 0.4, 0, 0),
        _rec("grpo", 0, 10, 0.5, 100, 10),
        _rec("grpo", 0, 20, 0.6, 200, 20),
    ]
    records += [
        _rec("vineppo_k4", 0, 0, 0.4, 0, 0),
        _rec("vineppo_k4", 0, 10, 0.6, 400, 30),
        _rec("vineppo_k4", 0, 20, 0.7, 800, 60),
    ]
    # seed 1: GRPO 0.3 -> 0.5 -> 0.4 (best 0.5); VinePPO 0.3 -> 0.4 -> 0.45: never reaches 0.5
    records += [
        _rec("grpo", 1, 0, 0.3, 0, 0),
        _rec("grpo", 1, 10, 0.5, 100, 10),
        _rec("grpo", 1, 20, 0.4, 200, 20),
    ]
    records += [
        _rec("vineppo_k4", 1, 0, 0.3, 0, 0),
        _rec("vineppo_k4", 1, 10, 0.4, 600, 20),
        _rec("vineppo_k4", 1, 20, 0.45, 600, 40),
    ]
    done = {("t", s, a): {"prompts_per_step": 4} for s in (0, 1) for a in ("grpo", "vineppo_k4")}
    summary = le.summarize(records, done)["t"]
    v, g = summary["vineppo_k4"], summary["grpo"]
    assert list(summary) == ["grpo", "vineppo_k4"]
    assert v["final_accuracy"][0] == pytest.approx(0.575)
    assert v["final_accuracy"][1] == pytest.approx(0.125)  # sd of (0.7, 0.45) / sqrt(2) = 0.1768 / 1.414
    # paired differences 0.7 - 0.6 = 0.1 and 0.45 - 0.4 = 0.05
    assert v["final_minus_grpo"][0] == pytest.approx(0.075)
    assert v["final_minus_grpo"][1] == pytest.approx(0.025)
    assert v["tokens_ratio_to_grpo"][0] == pytest.approx((4.0 + 3.0) / 2)
    assert v["seconds_ratio_to_grpo"][0] == pytest.approx((3.0 + 2.0) / 2)
    assert v["steps_to_grpo_best"][0] == 10 and v["seeds_reaching_grpo_best"] == 1
    assert v["seconds_to_grpo_best"][0] == 30  # its train_seconds at step 10 of seed 0
    assert math.isnan(v["steps_to_grpo_best"][1])  # one seed reached it: no spread
    assert g["final_minus_grpo"] == (0.0, 0.0) and g["seeds_reaching_grpo_best"] == 2
    assert g["steps_to_grpo_best"][0] == pytest.approx(15.0)  # 20 in seed 0, 10 in seed 1


def test_steps_to_reach():
    le = _benchmark()
    curve = [{"step": 20, "accuracy": 0.5}, {"step": 10, "accuracy": 0.45}, {"step": 30, "accuracy": 0.6}]
    assert le.steps_to_reach(curve, 0.5) == 20
    assert le.steps_to_reach(curve, 0.61) is None


@pytest.mark.slow
def test_quick_benchmark_runs_resumes_and_writes_the_records(tmp_path):
    root, out = tmp_path / "runs", tmp_path / "le.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "learning_efficiency.py"),
        "--task",
        "quick",
        "--seeds",
        "0",
    ]
    cmd += ["--eval_every", "3", "--sft_steps", "4", "--root", str(root), "--json", str(out)]
    proc = subprocess.run(
        [*cmd, "--arms", "grpo", "vineppo_k2", "sft", "restem"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    records = result["records"]
    assert {r["arm"] for r in records} == {"grpo", "vineppo_k2", "sft", "restem"}
    # restem: 4 iterations of 3 steps x 2 prompts // 4 = 1 prompt, each counted as one step of 2 prompts (min 1)
    for arm, last in (("grpo", 3), ("vineppo_k2", 3), ("sft", 4), ("restem", 4)):
        steps = [r["step"] for r in records if r["arm"] == arm]
        assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == last
    for r in records:
        assert set(r) == {"task", "arm", "seed", "step", "accuracy", "sampled_tokens", "train_seconds"}
        assert 0.0 <= r["accuracy"] <= 1.0
    # Every arm starts from the same warm-up policy: the same step-0 accuracy.
    assert len({r["accuracy"] for r in records if r["step"] == 0}) == 1
    final = {r["arm"]: r for r in records if r["step"] == (4 if r["arm"] in ("sft", "restem") else 3)}
    assert final["restem"]["sampled_tokens"] > 0  # it samples 4 responses per prompt, 4 times
    assert (
        final["vineppo_k2"]["sampled_tokens"]
        > final["grpo"]["sampled_tokens"]
        > 0
        == final["sft"]["sampled_tokens"]
    )
    assert result["summary"]["quick"]["vineppo_k2"]["tokens_ratio_to_grpo"][0] > 1
    assert (tmp_path / "learning_efficiency_quick.png").read_bytes()[:4] == b"\x89PNG"
    # Resuming: finished arms are not rerun, and the report still holds every finished arm.
    # the records are the run directory's archive: no loose log or marker is left beside the checkpoints
    assert not [p for p in root.rglob("*") if p.name.endswith((".jsonl", ".done.json"))]
    stamp = runs_file(root).stat().st_mtime_ns
    proc = subprocess.run([*cmd, "--arms", "grpo", "sft"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        runs_file(root).stat().st_mtime_ns == stamp
        and "seed 0: grpo\n" not in proc.stdout
        and "seed 0: sft\n" not in proc.stdout
    )
    assert {r["arm"] for r in json.loads(out.read_text())["records"]} == {
        "grpo",
        "vineppo_k2",
        "sft",
        "restem",
    }


def test_warmup_is_bit_identical_on_one_machine(tmp_path):
    """What a seed fixes on one machine and torch build: the whole warm-up, bit for bit."""
    for name in ("a", "b"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "testbed.make_warmup",
                "--quick",
                "--warmup_steps",
                "8",
                "--output_dir",
                str(tmp_path / name),
            ],
            cwd=REPO,  # python -m finds the research testbed at the repository's root
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    a = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "model.safetensors").read_bytes()
    meta = json.loads((tmp_path / "a" / "warmup.json").read_text())
    assert meta["config"]["warmup_steps"] == 8 and [s for s, _ in meta["curve_on_first_problems"]][-1] == 8


def test_shipped_warmup_is_used_only_for_its_own_settings():
    meta = usable_shipped_warmup(DemoConfig())
    assert meta is not None, f"the demo's checkpoint is missing from {shipped_warmup_dir()}"
    assert meta["config"]["seed"] == 0
    assert usable_shipped_warmup(DemoConfig(seed=1)) is None
    assert usable_shipped_warmup(DemoConfig(hidden_size=64)) is None
    assert usable_shipped_warmup(DemoConfig(warmup_steps=900)) is None
    assert usable_shipped_warmup(DemoConfig(train_warmup=True)) is None
    assert usable_shipped_warmup(StudyConfig(flaw="slip")) is None
    assert usable_shipped_warmup(StudyConfig(lead_ins=True)) is None
    assert usable_shipped_warmup(StudyConfig()) is not None  # the demo's task, as a study names it
    # Settings that only affect RL keep it.
    assert usable_shipped_warmup(DemoConfig(rl_steps=10, arms="grpo")) is not None


@pytest.mark.slow
def test_shipped_warmup_reproduces_its_recorded_accuracy():
    """The shipped checkpoint scores what its warm-up.json says on the 600 held-out problems. Greedy decoding is
    deterministic on one machine; on another CPU a near-tie argmax can flip, so a few problems may differ: the
    tolerance is 0.02 (12 of 600 problems), the binomial standard error of the accuracy."""
    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.arms import load_policy
    from mcadvantage.demo.config import build_data
    from mcadvantage.demo.evaluation import evaluate_accuracy

    config = DemoConfig()
    meta = usable_shipped_warmup(config)
    model, tokenizer = load_policy(shipped_warmup_dir())
    acc, _, _ = evaluate_accuracy(
        model,
        tokenizer,
        build_data(config).eval_set,
        GSM8KVerifier().score,
        max_new_tokens=config.max_completion_length,
    )
    assert acc == pytest.approx(meta["held_out_accuracy"], abs=0.02)


def test_markdown_results_replace_only_the_marked_block(tmp_path):
    le = _benchmark()
    records = [_rec("grpo", 0, 0, 0.4, 0, 0), _rec("grpo", 0, 10, 0.5, 100, 10)]
    records += [_rec("vineppo_k4", 0, 0, 0.4, 0, 0), _rec("vineppo_k4", 0, 10, 0.45, 500, 40)]
    done = {("t", 0, a): {} for a in ("grpo", "vineppo_k4")}
    markdown = le.markdown_tables(records, le.summarize(records, done))
    assert "| `vineppo_k4` | 1 | 0.450 | -0.050 | - (0/1) | - | 5.00 | 4.00 |" in markdown
    assert "| `grpo` | 0 | 0: 0.400 / 10: 0.500 | 100 | 10 |" in markdown
    doc = tmp_path / "page.md"
    doc.write_text(
        "intro\n<!-- learning_efficiency results: start -->\nold\n<!-- learning_efficiency results: end -->\nend\n"
    )
    assert le.update_doc(doc, markdown)
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("end\n") and "old" not in text and markdown in text
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    assert not le.update_doc(plain, markdown) and plain.read_text() == "no markers\n"
    # A second task's block on the same page, under its own marker: only that block changes.
    doc.write_text(doc.read_text() + "<!-- slip results: start -->\nold slip\n<!-- slip results: end -->\n")
    assert le.update_doc(doc, "new slip\n", "slip")
    text = doc.read_text()
    assert "old slip" not in text and "new slip" in text and markdown in text


def test_matched_arms_scale_prompts_by_sampled_tokens_or_by_the_cost_model(tmp_path, monkeypatch):
    le = _benchmark()

    # GRPO: 400 sampled tokens per step, all trained; VinePPO: 1,000 sampled per step, of which 400 trained.
    seed_dir = tmp_path / "demo" / "seed0"
    append_run(tmp_path, "demo/seed0/grpo.done.json", {"sampled_tokens": 4000.0, "steps": 10, "logs": []})
    logs = [{"mc/generated_tokens": 600.0}] * 10
    append_run(
        tmp_path, "demo/seed0/vineppo_k4.done.json", {"sampled_tokens": 10000.0, "steps": 10, "logs": logs}
    )
    config = DemoConfig()  # 4 prompts per step
    assert le.resolve_arm("grpo_matched", seed_dir, config) == ("grpo_p10", {"matched_to": "vineppo_k4"})
    # Cost model with r = 1.5: VinePPO 1000 + 1.5 x 400 = 1600, GRPO 400 + 1.5 x 400 = 1000 -> 4 x 1.6 = 6.4 -> 6.
    monkeypatch.setattr(le, "measured_cost_ratio", lambda: 1.5)
    assert le.resolve_arm("grpo_matched_cost", seed_dir, config) == (
        "grpo_p6",
        {"matched_to": "vineppo_k4", "cost_ratio": 1.5},
    )
    assert le.resolve_arm("tree_d12", seed_dir, config) == ("tree_d12", {})
    append_run(tmp_path / "other", "demo/seed0/vineppo_k4.done.json", {"sampled_tokens": 1.0, "steps": 1})
    with pytest.raises(SystemExit, match="finished arms grpo and vineppo_k4"):
        le.resolve_arm("grpo_matched", tmp_path / "other" / "demo" / "seed0", config)


def test_shared_start_tasks_use_seed_0_problems_for_every_seed():
    le = _benchmark()

    zero, five = le.task_data("demo_plateau", 0), le.task_data("demo_plateau", 5)
    assert [p.prompt for p in zero.eval_set] == [p.prompt for p in five.eval_set]
    assert [p.prompt for p in zero.rl_set[:50]] == [p.prompt for p in five.rl_set[:50]]
    assert le.task_config("demo_plateau", 5).seed == 5  # the RL run's own seed still differs
    assert [p.prompt for p in le.task_data("demo", 5).eval_set] != [p.prompt for p in zero.eval_set]


def test_an_unshipped_start_is_refused_with_its_command_until_trained_and_then_used(tmp_path, monkeypatch):
    le = _benchmark()

    start = tmp_path / "warmup_slip_plateau"
    monkeypatch.setitem(le.UNSHIPPED_STARTS, "slip_plateau", (start, "python -m make_it"))
    with pytest.raises(
        SystemExit, match=r"slip_plateau .*warmup_slip_plateau: run `python -m make_it` first"
    ):
        le.shared_start_dir("slip_plateau")
    start.mkdir()
    (start / "warmup.json").write_text(json.dumps({"command": "python -m make_it --threads 1"}))
    # A fresh clone: the committed warmup.json without the git-ignored weights is refused, naming the recorded
    # command (thread count included); so is a warm-up still under way (weights saved, resume state not yet removed).
    with pytest.raises(SystemExit, match=r"run `python -m make_it --threads 1` first and let it finish"):
        le.shared_start_dir("slip_plateau")
    (start / "model.safetensors").write_bytes(b"")
    (start / "resume_state.pt").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"run `python -m make_it --threads 1` first and let it finish"):
        le.shared_start_dir("slip_plateau")
    (start / "resume_state.pt").unlink()
    assert le.shared_start_dir("slip_plateau") == start
    # A start that failed the plateau check is refused, with its numbers (the shipped slip warm-up did).
    check = {
        "plateaued": False,
        "held_out_before": 0.972,
        "held_out_after": 0.992,
        "steps": 400,
        "one_se": 0.007,
    }
    (start / "warmup.json").write_text(json.dumps({"sft_check": check}))
    with pytest.raises(SystemExit, match=r"failed the plateau check \(held-out 0.972 -> 0.992 after 400"):
        le.shared_start_dir("slip_plateau")
    (start / "warmup.json").write_text(json.dumps({"sft_check": {**check, "plateaued": True}}))
    assert le.shared_start_dir("slip_plateau") == start
    assert le.shared_start_dir("demo_plateau").name == "warmup_plateau"  # the shipped checkpoint
    config = le.task_config("slip_plateau", 3)
    assert (config.flaw, config.warmup_schedule, config.seed) == ("slip", "plateau", 3)
    # The slip task's problems are the demo's: only the flawed demonstrations differ.
    slip, demo = le.task_data("slip_plateau", 3), le.task_data("demo_plateau", 0)
    assert [p.prompt for p in slip.eval_set] == [p.prompt for p in demo.eval_set]
    assert slip.warmup != demo.warmup
    # The sign task (H2 with a systematic flaw): the demo's problems too, its own flaw, lead-ins, a longer budget.
    sign = le.task_config("sign_plateau", 3)
    assert (sign.flaw, sign.lead_ins, sign.max_completion_length, sign.seed) == ("sign", True, 88, 3)
    assert [p.prompt for p in le.task_data("sign_plateau", 3).eval_set] == [p.prompt for p in demo.eval_set]
    assert le.UNSHIPPED_STARTS["sign_plateau"][1].endswith(
        "--task sign --output_dir " + "benchmarks/results/regime/warmup_sign_plateau"
    )


def test_a_clone_resumes_a_shared_start_seed_by_copying_the_ignored_weights_again(tmp_path, monkeypatch):
    le = _benchmark()

    start = tmp_path / "warmup_sign_plateau"
    start.mkdir()
    (start / "warmup.json").write_text(json.dumps({"sft_check": {"plateaued": True}}))
    (start / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setitem(le.UNSHIPPED_STARTS, "sign_plateau", (start, "python -m make_it"))
    monkeypatch.setattr(le, "ROOT", tmp_path)
    seed_dir = tmp_path / "runs" / "sign_plateau" / "seed3"
    seed_dir.mkdir(parents=True)
    # What a clone holds: the task's start.json and the seed's warmup.json are committed, the copied weights are not.
    append_run(
        tmp_path / "runs", "sign_plateau/start.json", {"accuracy": 0.585, "policy": "warmup_sign_plateau"}
    )
    committed = {"task": "sign_plateau", "seed": 3, "accuracy": 0.585, "shared_start": "warmup_sign_plateau"}
    append_run(tmp_path / "runs", "sign_plateau/seed3/warmup.json", committed)
    assert le.ensure_warmup("sign_plateau", 3, seed_dir) == committed
    assert (seed_dir / "warmup_policy" / "model.safetensors").read_bytes() == b"weights"
    # The record is rewritten unchanged.
    assert read_run(tmp_path / "runs", "sign_plateau/seed3/warmup.json") == committed


def test_the_supervised_start_task_is_the_demo_task_without_the_final_decay():
    le = _benchmark()

    sft, plateau = le.task_config("demo_sft", 4), le.task_config("demo_plateau", 4)
    assert (sft.warmup_schedule, sft.warmup_decay_steps, plateau.warmup_decay_steps) == ("plateau", 0, 100)
    assert {k: v for k, v in vars(sft).items() if k != "warmup_decay_steps"} == {
        k: v for k, v in vars(plateau).items() if k != "warmup_decay_steps"
    }
    assert [p.prompt for p in le.task_data("demo_sft", 4).eval_set] == [
        p.prompt for p in le.task_data("demo_plateau", 0).eval_set
    ]
    path, command = le.UNSHIPPED_STARTS["demo_sft"]
    assert path.name == "warmup_demo_sft" and "--warmup_decay_steps 0" in command
    assert f"--output_dir {path.relative_to(le.ROOT)}" in command


def test_sampled_tokens_count_every_estimators_rollouts_and_a_trees_shared_prefixes_once():
    from mcadvantage.demo.arms import rollout_tokens

    le = _benchmark()
    assert (
        rollout_tokens(
            {"mc/generated_tokens": 5.0, "hybrid/generated_tokens": 7.0, "tree/generated_tokens": 9.0}
        )
        == 12.0
    )
    # Two steps of 4 prompts x 8 responses of mean length 10: 320 response tokens per step, plus the hybrid's rollouts.
    logs = [
        {"step": 1.0, "completions/mean_length": 10.0, "hybrid/generated_tokens": 30.0},
        {"step": 2.0, "completions/mean_length": 10.0, "hybrid/generated_tokens": 0.0},
    ]
    info = {"task": "demo", "seed": 0, "prompts_per_step": 4, "sampled_tokens": 640.0, "logs": logs}
    curve = [{"step": 0, "sampled_tokens": 0.0}, {"step": 2, "sampled_tokens": 640.0}]
    le.recount_sampled_tokens(info, curve)
    assert info["sampled_tokens"] == 670.0 and [r["sampled_tokens"] for r in curve] == [0.0, 670.0]
    tree_logs = [{"step": 1.0, "completions/mean_length": 10.0, "tree/generated_tokens": 250.0}]
    info = {"task": "demo", "seed": 0, "prompts_per_step": 4, "sampled_tokens": 0.0, "logs": tree_logs}
    le.recount_sampled_tokens(info, [])
    assert info["sampled_tokens"] == 250.0  # what the tree sampled, not 320


def test_a_critic_warmups_tokens_count_from_the_first_policy_step_on_and_the_start_stays_at_zero():
    """ppo_warm logs its warm-up at steps <= 0: those tokens join the first policy step's count, not the start's."""
    le = _benchmark()
    logs = [{"step": float(s), "completions/mean_length": 10.0} for s in (-1, 0, 1, 2)]  # 320 tokens each
    info = {"task": "demo", "seed": 0, "prompts_per_step": 4, "sampled_tokens": 0.0, "logs": logs}
    curve = [{"step": s, "sampled_tokens": 0.0} for s in (0, 1, 2)]
    le.recount_sampled_tokens(info, curve)
    assert info["sampled_tokens"] == 1280.0 and [r["sampled_tokens"] for r in curve] == [0.0, 960.0, 1280.0]
