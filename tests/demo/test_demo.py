"""The offline CPU demo: task generation, flawed demonstrations, the HTML report, flag parsing, and an
end-to-end run in quick mode (every stage and output file, on a model too small to learn the task)."""

from __future__ import annotations

import html
import json
import os
import random
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mcadvantage.demo.config import DemoConfig, build_data, parse_args
from mcadvantage.demo.report import ScoredResponse, advantage_colour, render_responses_html
from mcadvantage.demo.run import _html_problems, accuracy_by_num_steps
from mcadvantage.demo.task import Operation, generate_problems, make_problem, skip_last_solution, to_rows
from mcadvantage.tasks.gsm8k import GSM8KSegmenter, GSM8KVerifier
from testbed.tasks import (
    FLAWS,
    TASK_PRESETS,
    StudyConfig,
    random_slip,
    sign_flip_solution,
    slip_solution,
    with_lead_ins,
)
from testbed.tasks import build_data as study_data

REPO = Path(__file__).resolve().parents[2]
EQUATION = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)$")

# --------------------------------------------------------------------------------------------------
# Task generation
# --------------------------------------------------------------------------------------------------


def test_problems_are_deterministic_in_the_seed():
    a = generate_problems(50, seed=7)
    assert a == generate_problems(50, seed=7)
    assert [p.prompt for p in a] != [p.prompt for p in generate_problems(50, seed=8)]
    # A longer run starts with the same problems: n only decides where to stop.
    assert generate_problems(80, seed=7)[:50] == a


def test_problems_have_2_to_5_exact_steps_in_gsm8k_format():
    problems = generate_problems(400, seed=3)
    assert len({p.prompt for p in problems}) == 400
    assert {p.num_steps for p in problems} == {2, 3, 4, 5}
    for p in problems:
        lines = p.solution.split("\n")
        assert lines[-1] == f"#### {p.answer}"
        assert len(lines) == p.num_steps + 1
        value = p.start
        for line, op in zip(lines[:-1], p.operations, strict=True):
            m = EQUATION.match(line)
            assert m, line
            left, symbol, operand, result = int(m[1]), m[2], int(m[3]), int(m[4])
            assert left == value and operand == op.operand
            assert symbol == {"add": "+", "sub": "-", "mul": "*", "half": "/"}[op.kind]
            expected = {"+": left + operand, "-": left - operand, "*": left * operand, "/": left // operand}[
                symbol
            ]
            if symbol == "/":
                assert operand == 2 and left % 2 == 0  # halving is exact
            assert result == expected and 0 <= result <= 99
            value = result
        assert str(value) == p.answer == str(p.values[-1])
        assert p.prompt.startswith(f"Start with {p.start}. ") and p.prompt.endswith("What is the result?\n")


def test_verifier_grades_reference_solutions_and_segmenter_splits_operation_lines():
    verifier, segmenter = GSM8KVerifier(), GSM8KSegmenter()
    for p in generate_problems(100, seed=11):
        assert verifier.score(p.solution, p.answer) == 1.0
        steps = segmenter(p.solution)
        assert "".join(steps) == p.solution
        assert len(steps) == p.num_steps  # one step per operation; "#### N" joins the last one
        for step, line in zip(steps, p.solution.split("\n"), strict=False):
            assert step.startswith(line)
            assert len(EQUATION.findall(step.replace("\n#### " + p.answer, "").strip())) == 1
        assert steps[-1].endswith(f"#### {p.answer}")


def test_make_problem_words_and_solves_the_operations():
    p = make_problem(
        12, [Operation("sub", 3), Operation("mul", 2), Operation("half", 2), Operation("add", 4)]
    )
    assert (
        p.prompt
        == "Start with 12. Subtract 3, then double it, then halve it, then add 4. What is the result?\n"
    )
    assert p.solution == "12-3=9\n9*2=18\n18/2=9\n9+4=13\n#### 13"
    assert p.answer == "13" and p.values == [12, 9, 18, 9, 13]
    assert to_rows([p]) == [{"prompt": p.prompt, "answer": "13", "solution": p.solution}]


def test_skip_last_solution_forgets_the_last_operation():
    p = make_problem(12, [Operation("sub", 3), Operation("mul", 3), Operation("add", 1)])
    flawed = skip_last_solution(p)
    assert flawed == "12-3=9\n9*3=27\n#### 27"
    assert GSM8KVerifier().score(flawed, p.answer) == 0.0
    with pytest.raises(ValueError, match="needs a problem with >= 2 operations"):
        skip_last_solution(make_problem(5, [Operation("add", 1)]))


def test_slip_solution_hand_computed():
    p = make_problem(
        12, [Operation("sub", 3), Operation("mul", 2), Operation("half", 2), Operation("add", 4)]
    )
    # 12-3=9, 9*2=18, 18/2=9, 9+4=13; a slip of +2 on the second operation carries 20 on.
    assert slip_solution(p, 1, 2) == "12-3=9\n9*2=20\n20/2=10\n10+4=14\n#### 14"
    assert slip_solution(p, 3, -1) == "12-3=9\n9*2=18\n18/2=9\n9+4=12\n#### 12"
    with pytest.raises(ValueError, match="delta must be a multiple of 2 when 1 later operation"):
        slip_solution(p, 0, 1)
    with pytest.raises(ValueError, match="step must be in"):
        slip_solution(p, 4, 2)
    rng = random.Random(0)
    for q in generate_problems(2000, seed=2):
        text = random_slip(q, rng)
        assert GSM8KVerifier().score(text, q.answer) == 0.0  # the final answer is always wrong
        wrong = [line for line in text.split("\n")[:-1] if not _line_is_right(line)]
        assert len(wrong) == 1  # exactly one wrong line


def _line_is_right(line: str) -> bool:
    # A wrong value carried on can go below zero ("0-3=-3"): this check allows negative numbers.
    m = re.match(r"^(-?\d+)([-+*/])(\d+)=(-?\d+)$", line)
    left, symbol, operand, result = int(m[1]), m[2], int(m[3]), int(m[4])
    return result == {"+": left + operand, "-": left - operand, "*": left * operand, "/": left // operand}[
        symbol
    ] and (symbol != "/" or left % 2 == 0)


def test_slip_flaw_changes_only_the_flawed_demonstrations():
    base = build_data(DemoConfig(warmup_problems=400, rl_problems=10, eval_problems=10))
    slip = study_data(StudyConfig(warmup_problems=400, rl_problems=10, eval_problems=10, flaw="slip"))
    assert base.flawed == slip.flawed > 0
    assert [p for p, _ in base.warmup] == [p for p, _ in slip.warmup]
    changed = [(a, b) for (_, a), (_, b) in zip(base.warmup, slip.warmup, strict=True) if a != b]
    assert len(changed) == base.flawed  # the flawed ones, and only they, differ
    for skipped, slipped in changed:
        assert skipped.count("\n") + 1 == slipped.count("\n")  # a slip keeps every operation line


def test_sign_flip_solution_hand_computed():
    p = make_problem(
        12, [Operation("add", 2), Operation("sub", 4), Operation("half", 2), Operation("sub", 1)]
    )
    # 12+2=14, 14-4=10, 10/2=5, 5-1=4; the first subtraction before the last operation adds: 14+4=18, 18/2=9, 9-1=8.
    assert sign_flip_solution(p) == "12+2=14\n14+4=18\n18/2=9\n9-1=8\n#### 8"
    # No subtraction before the last operation, or a later halving of an odd value: left correct (None).
    assert sign_flip_solution(make_problem(12, [Operation("add", 2), Operation("sub", 4)])) is None
    assert sign_flip_solution(make_problem(12, [Operation("sub", 3), Operation("half", 2)])) is None
    rng = random.Random(0)
    flipped = 0
    for q in generate_problems(2000, seed=3):
        text = sign_flip_solution(q)
        if text is None:
            continue
        flipped += 1
        assert GSM8KVerifier().score(text, q.answer) == 0.0  # the final answer is always wrong
        lines = text.split("\n")[:-1]
        assert all(_line_is_right(line) for line in lines)  # right arithmetic, wrong operation
        first_sub = next(i for i, op in enumerate(q.operations) if op.kind == "sub")
        assert [line.count("+") for line in lines][first_sub] == 1 and "-" not in lines[first_sub]
        assert [
            op.equation(v) for op, v in zip(q.operations[:first_sub], q.values[:first_sub], strict=True)
        ] == lines[:first_sub]
        leads = with_lead_ins(text, rng)
        assert leads.endswith(text.split("\n")[-1])  # the answer line keeps no lead-in
        assert [
            line.removeprefix("so ").removeprefix("then ").removeprefix("now ") for line in leads.split("\n")
        ] == text.split("\n")
    assert flipped > 500


def test_sign_task_data_flaws_are_systematic_and_lead_ins_harmless():
    config = replace(
        StudyConfig(warmup_problems=600, rl_problems=10, eval_problems=10), **TASK_PRESETS["sign"]
    )
    data = study_data(config)
    base = build_data(DemoConfig(warmup_problems=600, rl_problems=10, eval_problems=10))
    assert [p for p, _ in data.warmup] == [p for p, _ in base.warmup]  # the same problems as the demo
    # The warm-up problems, drawn as build_data draws them (seed 0), to know each demonstration's problem.
    problems = generate_problems(600, seed=2_000_003, exclude={q.prompt for q in base.eval_set})
    by_prompt = {p.prompt: p for p in problems}
    flawed = 0
    for prompt, text in data.warmup:
        bare = "\n".join(re.sub(r"^(so |then |now )", "", line) for line in text.split("\n"))
        problem = by_prompt[prompt]
        if bare != problem.solution:
            flawed += 1
            assert bare == sign_flip_solution(problem) and problem.num_steps >= 3
    assert flawed == data.flawed > 0
    assert any(
        line.startswith(("so ", "then ", "now ")) for _, text in data.warmup for line in text.split("\n")
    )
    # Lead-ins never change the grade: correct demonstrations score 1, flipped ones 0.
    scores = [GSM8KVerifier().score(text, by_prompt[p].answer) for p, text in data.warmup]
    assert scores.count(0.0) == data.flawed and scores.count(1.0) == len(data.warmup) - data.flawed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": -1}, "n must be >= 0"),
        ({"n": 3, "min_steps": 4, "max_steps": 2}, "min_steps <= max_steps"),
        ({"n": 3, "max_value": 5}, "max_value must be >= 10"),
    ],
)
def test_generate_problems_rejects_bad_arguments(kwargs, message):
    n = kwargs.pop("n")
    with pytest.raises(ValueError, match=message):
        generate_problems(n, seed=0, **kwargs)


def test_generate_problems_respects_exclude_and_reports_exhaustion():
    first = generate_problems(30, seed=1)
    again = generate_problems(30, seed=1, exclude={p.prompt for p in first})
    assert not {p.prompt for p in first} & {p.prompt for p in again}
    with pytest.raises(ValueError, match="could only find"):
        generate_problems(10_000, seed=0, min_steps=1, max_steps=1, max_value=10)
    with pytest.raises(ValueError, match="at least one operation"):
        make_problem(3, [])


def test_demo_data_sets_are_disjoint_and_flaws_only_hit_long_problems():
    config = DemoConfig(warmup_problems=3000, rl_problems=300, eval_problems=200, seed=4)
    data = build_data(config)
    eval_prompts = {p.prompt for p in data.eval_set}
    warm_prompts = {prompt for prompt, _ in data.warmup}
    rl_prompts = {p.prompt for p in data.rl_set}
    assert len(eval_prompts) == 200 and len(warm_prompts) == 3000 and len(rl_prompts) == 300
    assert not eval_prompts & warm_prompts and not eval_prompts & rl_prompts and not warm_prompts & rl_prompts
    verifier = GSM8KVerifier()
    long_total = flawed = 0
    for prompt, demo in data.warmup:
        n_ops = prompt.count(", then ") + 1
        wrong = demo.count("\n") == n_ops - 1  # one equation line short
        assert not (wrong and n_ops < config.flawed_demo_min_steps)
        if n_ops >= config.flawed_demo_min_steps:
            long_total += 1
            flawed += wrong
    assert flawed == data.flawed
    assert 0.5 < flawed / long_total < 0.7  # flawed_demo_rate = 0.6
    # Same config, same data; the flaw pattern is part of the seeded data.
    assert build_data(config).warmup == data.warmup
    clean = build_data(
        DemoConfig(warmup_problems=300, rl_problems=10, eval_problems=10, flawed_demo_rate=0.0)
    )
    assert clean.flawed == 0
    for prompt, demo in clean.warmup:
        assert demo.count("\n") == prompt.count(", then ") + 1  # every operation, then "#### N"
    assert verifier.score(data.eval_set[0].solution, data.eval_set[0].answer) == 1.0


def test_accuracy_by_num_steps_groups_scores():
    problems = [make_problem(2, [Operation("add", 1)] * k) for k in (2, 2, 3, 5)]
    assert accuracy_by_num_steps(problems, [1.0, 0.0, 1.0, 0.0]) == {"2": 0.5, "3": 1.0, "5": 0.0}


def test_html_problems_mix_long_and_short_problems():
    problems = generate_problems(40, seed=5)
    chosen = _html_problems(problems, 6)
    assert len(chosen) == 6 and len({p.prompt for p in chosen}) == 6
    assert sum(p.num_steps == 5 for p in chosen) == 3
    assert _html_problems(problems, 0) == []


def test_warmup_learns_only_the_completion(char_tokenizer):
    from mcadvantage.demo.warmup import encode_example, supervised_warmup

    ids, labels = encode_example(char_tokenizer, "Q?\n", "1+1=2")
    assert char_tokenizer.decode(ids, skip_special_tokens=True) == "Q?\n1+1=2"
    assert ids[-1] == char_tokenizer.eos_token_id
    assert labels == [-100] * 3 + ids[3:]
    with pytest.raises(ValueError, match="examples is empty"):
        supervised_warmup(None, char_tokenizer, [], steps=1)
    with pytest.raises(ValueError, match="steps must be >= 0, got -1"):
        supervised_warmup(None, char_tokenizer, [("a", "b")], steps=-1)


# --------------------------------------------------------------------------------------------------
# Report: colours and HTML
# --------------------------------------------------------------------------------------------------


def _alpha(colour: str) -> float:
    return float(colour.rsplit(",", 1)[1].rstrip(")"))


def test_advantage_colour_maps_sign_to_hue_and_magnitude_to_opacity():
    assert advantage_colour(0.5).startswith("rgba(22, 163, 74,")  # green
    assert advantage_colour(-0.5).startswith("rgba(220, 38, 38,")  # red
    assert _alpha(advantage_colour(0.0)) == 0.0  # no credit: no colour
    assert _alpha(advantage_colour(0.1)) < _alpha(advantage_colour(0.5)) < _alpha(advantage_colour(1.0))
    assert _alpha(advantage_colour(-0.5)) == _alpha(advantage_colour(0.5))
    assert _alpha(advantage_colour(3.0)) == _alpha(advantage_colour(1.0)) == 0.85  # capped
    assert _alpha(advantage_colour(0.5, scale=0.5)) == 0.85


def test_html_escapes_text_and_colours_every_step():
    evil = ScoredResponse(
        prompt="Start with <b>1</b> & go\n",
        steps=["1+1=2\n", "<script>alert(1)</script>\n#### 2"],
        values=[0.25, 0.75, 1.0],
        advantages=[0.5, 0.25],
        reward=1.0,
        gold="2",
    )
    wrong = ScoredResponse("p\n", ["7\n#### 7"], [0.5, 0.0], [-0.5], 0.0, "9")
    page = render_responses_html(
        {"Before <x>": [wrong], "After": [evil]}, title="T & <t>", summary={"a<b": "c&d"}
    )
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Start with &lt;b&gt;1&lt;/b&gt; &amp; go" in page
    assert "<title>T &amp; &lt;t&gt;</title>" in page and "<h2>Before &lt;x&gt;</h2>" in page
    assert "<b>a&lt;b</b>: c&amp;d" in page
    spans = re.findall(
        r'<span class="step" style="background:(rgba\([^)]*\))"[^>]*data-advantage="([-0-9.]+)"', page
    )
    assert [(c, float(a)) for c, a in spans] == [
        (advantage_colour(-0.5), -0.5),
        (advantage_colour(0.5), 0.5),
        (advantage_colour(0.25), 0.25),
    ]
    assert 'class="response wrong"' in page and 'class="response correct"' in page
    assert "V(before)=0.25, V(after)=0.75, A=+0.50" in page
    assert render_responses_html([evil], title="one list").count('class="step"') == 2
    with pytest.raises(ValueError, match="2 steps need 3 values"):
        render_responses_html([ScoredResponse("p", ["a", "b"], [0.0, 1.0], [1.0], 1.0, "1")], title="t")


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


def test_quick_flag_shrinks_the_run_and_explicit_flags_win():
    config = parse_args(["--quick", "--rl_steps", "5", "--seed", "3"])
    assert config.quick and config.rl_steps == 5 and config.seed == 3
    assert config.warmup_steps == 60 and config.hidden_size == 64
    default = parse_args([])
    # The demo starts from the plateau warm-up; --quick (which trains its own) and DemoConfig keep the fixed recipe.
    assert default == DemoConfig(warmup_schedule="plateau") and not default.quick
    assert parse_args(["--quick"]).warmup_schedule == "fixed" == DemoConfig().warmup_schedule
    assert parse_args(["--warmup_schedule", "fixed"]) == DemoConfig()


def _summary(ahead: bool):
    test = {
        "mean": 0.03 if ahead else -0.01,
        "ci95": [0.01, 0.05] if ahead else [-0.03, 0.01],
        "p": 0.01 if ahead else 0.4,
    }
    return {
        "cost_ratio": 1.5,
        "grpo_budgets": [{"estimator": "grpo_p4", "cost_model": 100.0, "cosine": 0.5, "cosine_ci": [0.4, 0.6]},
                         {"estimator": "grpo_p8", "cost_model": 200.0, "cosine": 0.6, "cosine_ci": [0.5, 0.7]}],
        "gradient": [{"estimator": "tree_p8", "cost_model": 150.0, "gradient_cosine": 0.62,
                      "gradient_cosine_ci": [0.55, 0.7], "grpo_cosine_at_equal_cost_model": 0.558},
                     {"estimator": "vineppo_k4_p4", "cost_model": 400.0, "gradient_cosine": 0.5,
                      "gradient_cosine_ci": [0.4, 0.6], "grpo_cosine_at_equal_cost_model": None}],
        "learning": [{"arm": "grpo_matched", "seeds": list(range(12)), "final_accuracy": 0.9},
                     {"arm": "tree_d12", "seeds": list(range(12)), "final_accuracy": 0.91,
                      "final_accuracy_vs_grpo_matched": test, "sampled_tokens_vs_grpo": 0.84}],
    }  # fmt: skip


@pytest.mark.parametrize("ahead", [False, True])
def test_the_demo_states_the_equal_cost_answer_and_plots_it(tmp_path, ahead):
    from mcadvantage.demo.equal_cost import equal_cost_lines, plot_equal_cost

    lines = equal_cost_lines(_summary(ahead))
    if ahead:
        assert (
            lines[0].startswith("Ahead of GRPO given the same sampled tokens")
            and "tree_d12 (+0.030" in lines[0]
        )
    else:
        assert lines[0].startswith("No arm is ahead of GRPO") and "12 seeds" in lines[0]
    assert any("tree_d12" in line and "0.84x GRPO's" in line for line in lines)
    assert any("tree_p8" in line and "0.558 (+0.062)" in line for line in lines)
    assert any("vineppo_k4_p4" in line and "outside GRPO's measured budgets" in line for line in lines)
    png = plot_equal_cost(_summary(ahead), tmp_path / "g.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_shipped_plateau_checkpoint_carries_its_equal_cost_answer():
    from mcadvantage.demo.config import shipped_warmup_dir
    from mcadvantage.demo.equal_cost import equal_cost_lines, load_equal_cost

    summary = load_equal_cost(shipped_warmup_dir("plateau"))
    assert summary is not None and summary["gradient"] and summary["grpo_budgets"]
    assert len(equal_cost_lines(summary)) >= len(summary["gradient"]) + 1
    assert load_equal_cost(shipped_warmup_dir("fixed")) is None  # the 0.1 checkpoint has none


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num_generations", "1"], "--num_generations must be >= 2"),
        (["--curve_problems", "700"], "--curve_problems \\(700\\) must be <= --eval_problems"),
        (["--flawed_demo_rate", "1.5"], "--flawed_demo_rate must be in \\[0, 1\\]"),
        (["--arms", "grpo,ppo_k3"], "--arms: unknown arm 'ppo_k3'"),
        (["--arms", "sft"], "--arms: unknown arm 'sft': use 'grpo'"),  # the demo runs RL arms only
        (["--arms", ","], "--arms is empty"),
        (["--rl_steps", "0"], "--rl_steps must be >= 1, got 0"),
        (["--min_steps", "4", "--max_steps", "3"], "need 1 <= --min_steps <= --max_steps"),
    ],
)
def test_bad_flags_name_the_flag(argv, message):
    with pytest.raises(SystemExit, match=message):
        parse_args(argv)


def test_demo_script_is_valid_bash_and_runs_the_module():
    script = REPO / "scripts" / "demo.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert 'setup_venv "$VENV" demo' in text
    assert "-m mcadvantage.demo --output_dir demo_output" in text


# --------------------------------------------------------------------------------------------------
# End to end (quick mode)
# --------------------------------------------------------------------------------------------------


def test_quick_demo_writes_every_output(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "mcadvantage.demo", "--quick", "--output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stdout = proc.stdout
    # --quick trains its own warm-up (the shipped checkpoint only fits the default sizes), then both arms.
    assert "warm-up (SFT)" in stdout and "GRPO: 100%" in stdout and "VinePPO (K=2): 100%" in stdout
    before = re.search(r"accuracy of the starting policy: ([01]\.\d{3})", stdout)
    after = dict(
        re.findall(
            r"\[demo\] (GRPO|VinePPO \(K=2\)): held-out greedy accuracy [01]\.\d{3} -> ([01]\.\d{3})", stdout
        )
    )
    assert before and set(after) == {"GRPO", "VinePPO (K=2)"}, stdout[-3000:]
    assert "{'loss'" not in stdout  # transformers' PrinterCallback is removed

    png = (out / "learning_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

    metrics = json.loads((out / "metrics.json").read_text())
    config = DemoConfig()
    config.apply_quick()
    assert metrics["starting_policy"] == "trained warm-up"
    assert metrics["accuracy_before"] == pytest.approx(float(before[1]), abs=5e-4)
    assert list(metrics["arms"]) == ["grpo", "vineppo_k2"]
    for name, label in (("grpo", "GRPO"), ("vineppo_k2", "VinePPO (K=2)")):
        arm = metrics["arms"][name]
        assert arm["accuracy_after"] == pytest.approx(float(after[label]), abs=5e-4)
        assert arm["improvement"] == pytest.approx(arm["accuracy_after"] - metrics["accuracy_before"])
        assert set(arm["accuracy_after_by_num_steps"]) <= {"2", "3", "4", "5"}
        assert [s for s, _ in arm["curve"]] == [0.0, 3.0]  # rl_evals=1: the start and the end
        assert [r["step"] for r in arm["logs"]] == [1.0, 2.0, 3.0]
        assert all(0.0 <= r["reward"] <= 1.0 for r in arm["logs"])
        assert arm["train_seconds"] > 0 and arm["sampled_tokens"] > 0
        assert (out / f"{name}_policy" / "config.json").exists()
    # Monte Carlo rollouts are sampled tokens too: VinePPO samples more than GRPO on the same prompts.
    assert metrics["arms"]["vineppo_k2"]["sampled_tokens"] > metrics["arms"]["grpo"]["sampled_tokens"]
    assert (
        metrics["arms"]["vineppo_k2"]["mean_rollouts_per_step"]
        > 0
        == metrics["arms"]["grpo"]["mean_rollouts_per_step"]
    )
    assert metrics["eval_problems"] == config.eval_problems
    assert [s for s, _ in metrics["warmup_curve"]] == [0.0, 30.0, 60.0]
    assert 0 < metrics["warmup_seconds"] < metrics["total_seconds"]
    assert metrics["config"]["quick"] is True and metrics["threads"] >= 1

    page = (out / "responses.html").read_text()
    for heading in (
        "The starting policy (after the supervised warm-up)",
        "After GRPO",
        "After VinePPO (K=2)",
    ):
        assert f"<h2>{html.escape(heading)}</h2>" in page
    assert page.count('class="response ') == 3 * config.html_responses
    assert len(re.findall(r'<span class="step" style="background:rgba\(', page)) >= 3 * config.html_responses
    shown = _html_problems(build_data(DemoConfig(**metrics["config"])).eval_set, config.html_responses)
    for p in shown:  # the responses to these held-out prompts: starting policy and each arm
        assert page.count(html.escape(p.prompt)) == 3
    assert (out / "warmup_policy" / "config.json").exists()


def test_validation_set_is_disjoint_and_leaves_the_other_sets_unchanged():
    """The plateau rule's validation split shares no prompt with any other set, and adding it changed none of
    them (drawn last, from its own seed)."""
    config = DemoConfig(
        warmup_problems=2000, rl_problems=200, eval_problems=200, validation_problems=150, seed=3
    )
    data = build_data(config)
    validation = {p.prompt for p in data.validation_set}
    assert len(validation) == 150
    others = {p.prompt for p in data.eval_set} | {p for p, _ in data.warmup} | {p.prompt for p in data.rl_set}
    assert not validation & others
    without = build_data(
        DemoConfig(warmup_problems=2000, rl_problems=200, eval_problems=200, validation_problems=0, seed=3)
    )
    assert (without.eval_set, without.warmup, without.rl_set) == (data.eval_set, data.warmup, data.rl_set)


@pytest.mark.parametrize(
    ("scores", "patience", "n", "expected"),
    [
        # best earlier 0.5 on 100 problems: SE = 0.05; the last two (0.52, 0.55) stay within it -> plateau
        ([0.1, 0.5, 0.52, 0.55], 2, 100, True),
        # 0.56 beats 0.5 + 0.05 -> still rising
        ([0.1, 0.5, 0.52, 0.56], 2, 100, False),
        # too few evaluations to judge
        ([0.1, 0.2], 2, 100, False),
        # best earlier 0.0 (SE 0): any gain counts as rising, none as a plateau
        ([0.0, 0.0, 0.01], 1, 600, False),
        ([0.0, 0.0, 0.0], 2, 600, True),
        # a drop is a plateau too: the best is in the past
        ([0.3, 0.6, 0.4, 0.45], 2, 600, True),
    ],
)
def test_plateau_rule_hand_computed(scores, patience, n, expected):
    from mcadvantage.demo.warmup import plateau_reached

    assert plateau_reached(scores, patience=patience, num_problems=n) is expected


def test_plateau_rule_rejects_bad_arguments():
    from mcadvantage.demo.warmup import plateau_reached

    with pytest.raises(ValueError, match="patience must be >= 1"):
        plateau_reached([0.1, 0.2], patience=0, num_problems=10)
    with pytest.raises(ValueError, match="num_problems must be >= 1"):
        plateau_reached([0.1, 0.2], patience=1, num_problems=0)


def test_plateau_schedule_flags_are_checked():
    with pytest.raises(SystemExit, match="--warmup_schedule must be 'fixed' or 'plateau'"):
        parse_args(["--warmup_schedule", "cosine"])
    with pytest.raises(SystemExit, match="--warmup_min_steps .* must be <= --warmup_max_steps"):
        parse_args(["--warmup_schedule", "plateau", "--warmup_min_steps", "900", "--warmup_max_steps", "800"])


def test_shipped_fixed_warmup_still_matches_and_plateau_settings_select_their_own():
    """A warmup.json written before the schedule setting existed is the fixed schedule's; the plateau schedule
    never takes it, and fixed-schedule runs ignore the plateau-only settings."""
    from mcadvantage.demo.config import usable_shipped_warmup, warmup_settings

    meta = usable_shipped_warmup(DemoConfig())
    assert meta is not None
    if meta["config"].get("warmup_schedule", "fixed") == "fixed":
        assert usable_shipped_warmup(DemoConfig(warmup_patience=7)) is not None
        plateau_meta = usable_shipped_warmup(DemoConfig(warmup_schedule="plateau"))
        # the plateau schedule takes its own checkpoint (or none), never the fixed one
        assert plateau_meta is None or "plateau" in plateau_meta
        assert usable_shipped_warmup(DemoConfig(warmup_schedule="plateau", warmup_patience=3)) is None
    assert "warmup_steps" in warmup_settings(DemoConfig())
    plateau = warmup_settings(DemoConfig(warmup_schedule="plateau"))
    assert "warmup_steps" not in plateau and plateau["warmup_patience"] == 8


def test_quick_plateau_warmup_writes_its_evidence(tmp_path):
    """``make_warmup --warmup_schedule plateau`` end to end at the quick sizes: the validation curve, the stop and
    best steps, the running log and the SFT plateau check land in warmup.json."""
    out = tmp_path / "warm"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.make_warmup",
            "--quick",
            "--warmup_schedule",
            "plateau",
            "--sft_check_steps",
            "5",
            "--output_dir",
            str(out),
        ],
        cwd=REPO,  # python -m finds the research testbed at the repository's root
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "warmup.json").read_text())
    plateau = meta["plateau"]
    assert meta["config"]["warmup_schedule"] == "plateau"
    steps = [step for step, _ in plateau["validation_curve"]]
    assert steps[0] == 0 and steps == sorted(steps) and all(s % 20 == 0 for s in steps)
    assert 40 <= plateau["stop_step"] <= 200 and plateau["best_step"] <= plateau["stop_step"]
    assert set(meta["sft_check"]) >= {"gain", "one_se", "plateaued", "held_out_before", "held_out_after"}
    assert json.loads((out / "plateau_log.json").read_text())["validation"] == plateau["validation_curve"]


class _Killed(Exception):
    pass


def _tiny_plateau_config() -> StudyConfig:
    """The quick sizes and smaller still: a one-layer model, evaluations every 10 steps on 8 problems, from step 30
    on, 200 demonstrations in batches of 4, greedy answers of at most 8 tokens (so every validation score is 0). A
    study config (the demo's task), as ``python -m testbed.make_warmup`` makes one."""
    config = StudyConfig(warmup_schedule="plateau", threads=1)
    config.apply_quick()
    config.quick = True
    config.hidden_size, config.num_layers, config.num_heads = 32, 1, 2
    config.head_dim, config.intermediate_size = 16, 64
    config.validation_problems, config.warmup_eval_every, config.warmup_min_steps = 8, 10, 30
    config.warmup_batch_size, config.warmup_problems, config.max_completion_length = 4, 200, 8
    return config


def test_plateau_warmup_without_decay_keeps_the_best_checkpoint_as_it_is(tmp_path, capsys, monkeypatch):
    """``--warmup_decay_steps 0`` (the paper's SFT selection: the best validation checkpoint, appendix C.3) saves the
    best checkpoint's weights unchanged; with a decay they move. At these sizes every validation score is 0, so the
    best checkpoint is the step-0 one, the initial weights. The flag is recorded in the command, and bad values are
    refused naming it."""
    import torch

    from mcadvantage.demo.arms import initial_policy, load_policy
    from testbed.make_warmup import main as make_warmup_main
    from testbed.make_warmup import make_warmup

    config = _tiny_plateau_config()
    initial = initial_policy(config)[0].state_dict()
    saved = {}
    for decay in (0, 5):
        meta = make_warmup(replace(config, warmup_decay_steps=decay), tmp_path / str(decay), progress=False)
        assert meta["plateau"]["best_step"] == 0 and meta["plateau"]["stop_step"] == 30
        saved[decay] = load_policy(tmp_path / str(decay))[0].state_dict()
    assert all(torch.equal(saved[0][k], initial[k]) for k in initial)
    assert not all(torch.equal(saved[5][k], initial[k]) for k in initial)
    no_decay = json.loads((tmp_path / "0" / "warmup.json").read_text())
    assert (
        "--warmup_decay_steps 0" in no_decay["command"]
        and "as it is (no decay)" in no_decay["plateau"]["rule"]
    )
    assert no_decay["config"]["warmup_decay_steps"] == 0
    # Without a decay the final policy is the best step's: no extra curve point after the stop step.
    assert no_decay["curve_on_first_problems"][-1][0] <= no_decay["plateau"]["stop_step"]
    # The CLI hands the flag on, after the quick sizes (which would set 10) and only when given.
    import testbed.make_warmup as make_warmup_module

    seen = []

    def capture(config, output_dir, **kwargs):
        seen.append(config.warmup_decay_steps)
        return {"held_out_accuracy": 0.0, "eval_problems": 1, "seconds": 0.0}

    monkeypatch.setattr(make_warmup_module, "make_warmup", capture)
    for extra in ([], ["--quick"]):
        for decay in ([], ["--warmup_decay_steps", "0"], ["--warmup_decay_steps", "100"]):
            make_warmup_main(
                ["--warmup_schedule", "plateau", *extra, *decay, "--output_dir", str(tmp_path / "cli")]
            )
    assert seen == [100, 0, 100, 10, 0, 100]
    for argv, message in (
        (
            ["--warmup_schedule", "plateau", "--warmup_decay_steps", "-1"],
            "--warmup_decay_steps must be >= 0, got -1",
        ),
        (["--warmup_decay_steps", "0"], "--warmup_decay_steps belongs to the plateau schedule"),
        (["--warmup_decay_steps", "100"], "--warmup_decay_steps belongs to the plateau schedule"),
    ):
        with pytest.raises(SystemExit):
            make_warmup_main([*argv, "--output_dir", str(tmp_path / "refused")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_an_interrupted_plateau_warmup_resumes_exactly(tmp_path, capsys):
    """A plateau warm-up killed mid-way (here after its step 25, between the evaluations at 20 and 30) and resumed
    from its last saved evaluation reaches the stop step with bit-identical weights, AdamW state and data order, and
    the same record, as one that ran through; make_warmup refuses to start over an interrupted run without --resume.
    (At these sizes every validation score is 0, so the *final* policy is the step-0 one plus the decay: the saved
    states at the stop step are what shows the resumed steps are the same.)"""
    import torch

    from mcadvantage.demo.arms import RESUME_FILE, train_warmup_policy
    from testbed.make_warmup import main as make_warmup_main
    from testbed.make_warmup import resumable_step

    config = _tiny_plateau_config()
    data = study_data(config)
    whole: dict = {}
    train_warmup_policy(config, data, tmp_path / "whole", schedule_record=whole, keep_resume_state=True)
    assert whole["stop_step"] == 30  # the kill below happens before the rule stops

    def kill_at_25(step: int, loss: float) -> None:
        if step == 25:
            raise _Killed

    with pytest.raises(_Killed):
        train_warmup_policy(config, data, tmp_path / "cut", on_step=kill_at_25)
    assert resumable_step(tmp_path / "cut") == 20
    at_20 = torch.load(tmp_path / "cut" / RESUME_FILE, weights_only=False)
    resumed: dict = {}
    train_warmup_policy(
        config, data, tmp_path / "cut", schedule_record=resumed, resume=True, keep_resume_state=True
    )
    assert resumed.pop("resumed_from_step") == 20 and resumed == whole

    def tensors(state: dict) -> list:
        optimizer = state["training"].optimizer["state"]
        return list(state["model"].values()) + [t for k in sorted(optimizer) for t in optimizer[k].values()]

    ran, cut = (torch.load(tmp_path / d / RESUME_FILE, weights_only=False) for d in ("whole", "cut"))
    assert ran["training"].step == cut["training"].step == 30
    assert (
        ran["training"].order == cut["training"].order
        and ran["training"].data_rng == cut["training"].data_rng
    )
    assert all(torch.equal(a, b) for a, b in zip(tensors(ran), tensors(cut), strict=True))
    assert not torch.equal(tensors(at_20)[0], tensors(cut)[0])  # steps 21-30 did change the weights
    # Without keep_resume_state the state goes once the policy is saved; make_warmup refuses to start over one.
    train_warmup_policy(config, data, tmp_path / "cut", resume=True)
    assert not (tmp_path / "cut" / RESUME_FILE).exists()
    with pytest.raises(_Killed):
        train_warmup_policy(config, data, tmp_path / "cli", on_step=kill_at_25)
    with pytest.raises(SystemExit):
        make_warmup_main(["--quick", "--warmup_schedule", "plateau", "--output_dir", str(tmp_path / "cli")])
    assert "holds an interrupted warm-up: pass --resume" in capsys.readouterr().err


def test_make_warmup_trains_a_study_task_from_its_preset(tmp_path):
    """``make_warmup --task long`` takes the long task's problems from ``TASK_PRESETS`` (5-8 operations, every
    demonstration eligible for the flaw) and records the command that made it."""
    out = tmp_path / "long"
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.make_warmup", "--quick", "--task", "long", "--warmup_steps", "4",
         "--sft_check_steps", "0", "--output_dir", str(out)],
        cwd=REPO,  # python -m finds the research testbed at the repository's root
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((out / "warmup.json").read_text())
    full = meta["full_config"]
    assert (full["min_steps"], full["max_steps"], full["flawed_demo_min_steps"]) == (5, 8, 5)
    assert (
        full["flaw"] == "skip_last" and "--task long" in meta["command"] and "--flaw" not in meta["command"]
    )
    assert all(
        full[k] == v for k, v in TASK_PRESETS["long"].items() if k != "max_completion_length"
    )  # --quick: 48


def test_each_schedule_has_its_own_shipped_checkpoint_dir():
    """The plateau checkpoint (the demo's default start) ships in the package; the fixed one is the research
    testbed's, beside src/ in the repository, and kept out of the wheel (pyproject.toml's package-data)."""
    from mcadvantage.demo.config import shipped_warmup_dir

    assert shipped_warmup_dir() == shipped_warmup_dir("fixed") == REPO / "testbed" / "warmup_policy"
    assert shipped_warmup_dir("plateau") == REPO / "src" / "mcadvantage" / "demo" / "warmup_plateau"
    assert (shipped_warmup_dir("fixed") / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="schedule must be one of"):
        shipped_warmup_dir("cosine")
    package_data = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"demo/warmup_plateau/*"' in package_data and "warmup_policy" not in package_data


def test_fixed_schedule_without_the_testbed_trains_its_warmup_and_says_so(tmp_path, monkeypatch, capsys):
    """An installed package has no testbed/warmup_policy: ``--warmup_schedule fixed`` then trains the warm-up (as
    for any settings without a checkpoint) and says why, instead of failing or starting from something else."""
    import mcadvantage.demo.config as demo_config
    import mcadvantage.demo.run as demo_run

    monkeypatch.setitem(demo_config.SHIPPED_WARMUP_DIRS, "fixed", tmp_path / "absent")
    config = parse_args(["--warmup_schedule", "fixed", "--output_dir", str(tmp_path / "out")])
    assert demo_config.usable_shipped_warmup(config) is None

    class Stop(Exception):
        pass

    def stop_at_training(*args, **kwargs):
        raise Stop

    monkeypatch.setattr("mcadvantage.demo.arms.train_warmup_policy", stop_at_training)
    with pytest.raises(Stop):
        demo_run.run_demo(config)
    assert f"no fixed-schedule warm-up checkpoint at {tmp_path / 'absent'}" in capsys.readouterr().out


def test_switch_flags_reach_the_config():
    """``--train_warmup`` (and every other bool flag) sets its field; they were parsed and then dropped."""
    assert parse_args(["--train_warmup"]).train_warmup is True
    assert parse_args([]).train_warmup is False
    assert parse_args(["--quick", "--train_warmup"]).train_warmup is True


def test_demo_help_says_where_each_warmup_checkpoint_lives():
    proc = subprocess.run(
        [sys.executable, "-m", "mcadvantage.demo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "mcadvantage/demo/warmup_plateau" in text and "testbed/warmup_policy" in text


def test_the_demo_has_no_study_settings_and_the_testbed_names_its_flaws(capsys):
    """The studies' flaws and lead-ins are the testbed's settings (``StudyConfig``), not the demo's: the demo has no
    such flags or fields, and the testbed refuses an unknown flaw by name."""
    for flag in (["--flaw", "sign"], ["--lead_ins"]):
        with pytest.raises(SystemExit):
            parse_args(flag)
        # --flaw is refused as a prefix of two real flags (--flawed_demo_rate, --flawed_demo_min_steps)
        assert re.search(
            rf"error: (unrecognized arguments|ambiguous option): {flag[0]}\b", capsys.readouterr().err
        )
    with pytest.raises(TypeError, match="flaw"):
        DemoConfig(flaw="slip")
    with pytest.raises(
        ValueError, match=r"build_data: flaw must be one of \['sign', 'skip_last', 'slip'\], got 'slpi'"
    ):
        study_data(StudyConfig(flaw="slpi"))
    # A study config of the demo's own task builds the demo's data.
    small = {"warmup_problems": 300, "rl_problems": 10, "eval_problems": 10, "validation_problems": 10}
    assert study_data(StudyConfig(**small)) == build_data(DemoConfig(**small))
    assert FLAWS["skip_last"].description == "the last operation forgotten"


def test_shipped_plateau_checkpoint_passed_its_plateau_check():
    """The shipped plateau warm-up is the one the protocol's evidence is about: trained by the plateau rule with the
    default settings, and 400 more supervised steps gained at most one SE (docs/regime-protocol.md)."""
    from mcadvantage.demo.config import shipped_warmup_dir, usable_shipped_warmup

    meta = usable_shipped_warmup(DemoConfig(warmup_schedule="plateau"))
    assert meta is not None, f"no plateau checkpoint in {shipped_warmup_dir('plateau')}"
    check = meta["sft_check"]
    assert check["plateaued"] and check["gain"] <= check["one_se"]
    assert meta["plateau"]["best_step"] <= meta["plateau"]["stop_step"]
    assert meta["config"]["warmup_patience"] == DemoConfig().warmup_patience


def _demo_names() -> tuple[dict[str, str], dict[str, set[str]]]:
    """Every top-level name defined in ``src/mcadvantage/demo/*.py`` (-> its module), and the names each demo module
    uses (loaded, called, imported or attribute-read), its ``__all__`` list left out."""
    import ast

    defined: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for path in sorted((REPO / "src" / "mcadvantage" / "demo").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined[node.name] = path.stem
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and target.id != "__all__":
                        defined[target.id] = path.stem
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                names.update(alias.name for alias in node.names)
        used[path.stem] = names
    return defined, used


def test_the_demo_keeps_only_what_it_runs():
    """Every function, class and constant of the shipped demo is used by the demo itself (another of its modules, or
    its own module beyond the definition), or is the task API the package exports (``mcadvantage.demo.__all__``):
    what only the studies use lives in the research testbed (``testbed/``), outside the wheel."""
    import ast

    import mcadvantage.demo

    defined, used = _demo_names()
    unused = []
    for name, module in defined.items():
        elsewhere = any(name in names for other, names in used.items() if other != module)
        path = REPO / "src" / "mcadvantage" / "demo" / f"{module}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = sum(
            isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)
            for node in ast.walk(tree)
        )
        if not (elsewhere or own or name in mcadvantage.demo.__all__):
            unused.append(f"{module}.{name}")
    assert not unused, f"only the studies use these: move them to testbed/ (or delete them): {unused}"


def test_a_critic_warmup_comes_on_top_of_the_policys_steps_and_records_count_policy_steps(tiny_model_dir):
    """``run_rl_arm`` with a 2-step critic warm-up and 2 policy steps: the trainer takes 4 steps; the logs say which
    were the warm-up's (policy steps -1 and 0); evaluations fall on policy steps 1 and 2 only, and their sampled tokens
    include the warm-up's."""
    from mcadvantage.demo.arms import run_rl_arm
    from mcadvantage.demo.config import ArmSpec, DemoData

    config = DemoConfig()
    config.apply_quick()
    config = replace(config, rl_steps=2, prompts_per_step=2, num_generations=2, max_completion_length=12)
    arm = ArmSpec("ppo_warm", "gae", mc_options=(("critic_learning_rate", 3e-3), ("critic_warmup_steps", 2)))
    data = DemoData(
        eval_set=[], warmup=[], flawed=0, rl_set=generate_problems(8, seed=3, min_steps=2, max_steps=2)
    )
    evaluated: list[int] = []
    _, records, logs = run_rl_arm(
        config,
        arm,
        tiny_model_dir,
        data,
        tiny_model_dir.parent / "warm_trainer",
        evaluate=lambda model: evaluated.append(1) or 0.5,
        eval_every=1,
    )
    assert [r.step for r in records] == [1, 2] and len(evaluated) == 2
    assert [(row["step"], row["trainer_step"], row["critic_warmup"]) for row in logs] == [
        (-1, 1, 1), (0, 2, 1), (1, 3, 0), (2, 4, 0)
    ]  # fmt: skip
    assert records[0].sampled_tokens == pytest.approx(sum(row["sampled_tokens"] for row in logs[:3]))
    assert records[1].sampled_tokens == pytest.approx(sum(row["sampled_tokens"] for row in logs))
    assert all("critic/mean_value" in row for row in logs)  # the critic's metrics, warm-up steps included
