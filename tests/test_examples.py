"""The paper-scale example (``examples/math.py``: MATH, or GSM8K with ``--task gsm8k``) and its accelerate configs.

Its arguments are parsed in-process (the defaults must be the paper's settings, from
``VinePPOConfig.from_paper``), its data loading is checked on small inputs, and each task runs end to end for one
training step and its Pass@1 evaluation on a tiny offline model on CPU, in a subprocess (slow), so the example
cannot rot. The evaluation itself is tested in
tests/evaluation/test_pass_at_1.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mcadvantage.core.prompts import filter_long_prompts

pytest.importorskip("trl")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CONFIGS = EXAMPLES / "accelerate_configs"


@pytest.fixture(scope="module")
def examples():
    """``examples/math.py`` and its ``_common``, imported as the script imports them (a script's folder is
    first on sys.path when Python runs it)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import _common

        spec = importlib.util.spec_from_file_location("math_example", EXAMPLES / "math.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        yield SimpleNamespace(script=script, common=_common)
    finally:
        sys.path.remove(str(EXAMPLES))


#: The one example named like a standard library module, as the project's card runs it (``accelerate launch
#: examples/math.py``): run as a script it moves its folder behind the standard library on sys.path before importing
#: anything that could import ``math``; imported *as* ``math`` (its folder ahead of the standard library on a path)
#: it puts the standard library's module in its place.
MOVES_ITS_FOLDER = "sys.path[:] = [*_ELSEWHERE, _HERE]"


def test_no_example_shadows_a_standard_library_module():
    """Python puts a script's folder first on sys.path, so an example named like a standard library module would
    replace that module for everything the script imports; ``math.py`` moves its folder behind the standard library
    first, and hands ``import math`` to the standard library where its folder is ahead of it anyway."""
    names = {p.stem for p in EXAMPLES.glob("*.py")}
    # the paper-scale script (both tasks), one script per RL-free method, the agent example, and their helpers
    assert names == {"math", "restem", "dpo_plus", "agent", "_common", "_self_training"}
    assert names & set(sys.stdlib_module_names) == {"math"}
    text = (EXAMPLES / "math.py").read_text(encoding="utf-8")
    before = text[: text.index(MOVES_ITS_FOLDER)]
    imports = [line for line in before.splitlines() if line.startswith(("import ", "from "))]
    assert imports == [
        "from __future__ import annotations", "import os", "import sys", "from collections.abc import Sequence",
        "from typing import Any",
    ], imports  # fmt: skip
    assert 'if __name__ == "math":' in before
    # Its folder ahead of the standard library (a PYTHONPATH holding it): every import of math is the real one.
    probe = (
        "import random, math, numpy; assert 'examples' not in (math.__file__ or ''); print(math.sqrt(4.0))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(ROOT / "src")]))
    for cwd in (ROOT, EXAMPLES):  # and `python -c` run from the folder itself
        proc = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stdout.strip() == "2.0", proc.stderr[-2000:]
    for path in EXAMPLES.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "sys.path" not in text or path.name == "math.py":
            continue
        # The one edit allowed, as in benchmarks/: a script that imports the research testbed (a package at the
        # repository's root, not installed) puts the root on sys.path, and nothing else, before that import.
        lines = [line.strip() for line in text.splitlines() if "sys.path" in line]
        assert [line.split("#")[0].strip() for line in lines] == [
            "if str(ROOT) not in sys.path:",
            "sys.path.insert(0, str(ROOT))",
        ], f"{path.name} edits sys.path beyond putting the repository's root first"
        assert text.index("sys.path.insert") < text.index("from testbed"), (
            f"{path.name} imports testbed before putting the repository's root on sys.path"
        )


def _parse(examples, name: str, tmp_path, *extra: str):
    return examples.common.parse_args(["--task", name, "--output_dir", str(tmp_path / "out"), *extra])


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------

# The paper's Table 1 and the official code's Monte Carlo choices (VinePPOConfig.from_paper), and the examples'
# engine: vLLM colocated in the training processes.
PAPER = {
    "num_mc_rollouts": 9,
    "temperature": 0.6,
    "top_p": 0.9,
    "beta": 1e-4,
    "epsilon": 0.2,
    "num_iterations": 2,
    "learning_rate": 1e-6,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "warmup_steps": 0.03,
    "num_generations": 8,
    "generation_batch_size": 512,
    "max_completion_length": 1024,
    "advantage_estimator": "vineppo",
    "mc_rollout_budget": "fixed",
    "mc_fixed_rollout_budget": 1024,
    "mc_truncated_reward": 0.0,
    "truncated_completion_reward": 0.0,
    "use_vllm": True,
    "vllm_mode": "colocate",
}


@pytest.mark.parametrize(
    "name, model, iterations, problem_column, cap",
    [
        ("math", "realtreetune/rho-1b-sft-MATH", 1000, "problem", (None, "merge")),
        # GSM8K: the official code estimated 26 states (S_0..S_25) and gave later steps advantage 0.
        ("gsm8k", "realtreetune/rho-1b-sft-GSM8K", 650, "question", (26, "zero")),
    ],
)
def test_defaults_are_the_papers_setup(examples, tmp_path, name, model, iterations, problem_column, cap):
    script, args, model_args = _parse(examples, name, tmp_path)
    assert script.task == name
    for field_name, value in PAPER.items():
        assert getattr(args, field_name) == value, field_name
    assert getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type) == "polynomial"
    assert args.step_segmenter == name
    assert (args.mc_max_estimated_steps, args.mc_steps_after_cap) == cap
    assert model_args.model_name_or_path == model
    assert script.problem_column == problem_column
    # 64 prompts x 8 responses per iteration, minibatch 64: 8 optimizer steps per epoch, 2 epochs.
    assert (script.minibatch_size, script.ppo_iterations) == (64, iterations)
    minibatch = args.per_device_train_batch_size * args.world_size * args.gradient_accumulation_steps
    assert minibatch == 64
    assert args.max_steps == iterations * (512 // 64) * 2
    # The official checkpoints' prompt template.
    assert script.prompt_template == "[MATH_TASK] Problem:\n{problem}\n\nSolution:"
    assert examples.common.build_prompt(script.prompt_template, "What is $1+{2}$?") == (
        "[MATH_TASK] Problem:\nWhat is $1+{2}$?\n\nSolution:"
    )
    # Pass@1 as in the paper: 16 samples at temperature 0.35 (top-p 0.9, 1024 tokens in the official code).
    settings = examples.common.pass_at_1_settings(script, args)
    assert (settings.num_samples, settings.temperature, settings.top_p, settings.max_tokens) == (
        16,
        0.35,
        0.9,
        1024,
    )
    assert script.run_pass_at_1 is True
    # Hub data by default.
    assert script.dataset_name and script.eval_dataset_name and script.train_file is None


@pytest.mark.parametrize("name", ["math", "gsm8k"])
def test_defaults_are_from_paper(examples, tmp_path, name):
    """The paper's settings are stated once, in the library: every field VinePPOConfig.from_paper sets is the
    example's default, and the example's geometry gives from_paper's on the same per-device batch and processes."""
    from mcadvantage import VinePPOConfig

    _, args, _ = _parse(examples, name, tmp_path)
    paper = VinePPOConfig.from_paper(name, output_dir=str(tmp_path / "paper"))
    settings = examples.common.paper_settings(name)
    assert {"minibatch_size", "ppo_iterations", "mc_rollout_budget", "step_segmenter"} <= settings.keys()
    for field_name in settings.keys() - {"minibatch_size", "ppo_iterations"}:
        assert getattr(args, field_name) == getattr(paper, field_name), field_name
    for field_name in ("gradient_accumulation_steps", "max_steps", "steps_per_generation"):
        assert getattr(args, field_name) == getattr(paper, field_name), field_name


def test_task_comes_from_the_command_line_or_the_config_file(examples, tmp_path):
    common = examples.common
    assert common.requested_task([]) == "math"
    assert common.requested_task(["--task=gsm8k"]) == "gsm8k"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("task: gsm8k\nnum_mc_rollouts: 5\n")
    script, args, _ = common.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path / "out")])
    assert (script.task, args.step_segmenter, args.mc_max_estimated_steps, args.num_mc_rollouts) == (
        "gsm8k",
        "gsm8k",
        26,
        5,
    )
    script, args, _ = _parse(examples, "math", tmp_path, "--config", str(recipe))  # the command line wins
    assert (script.task, args.step_segmenter, args.mc_max_estimated_steps) == ("math", "math", None)
    with pytest.raises(ValueError, match=re.escape("task='aime' is not one of the paper's tasks")):
        common.requested_task(["--task", "aime"])


def test_command_line_and_config_file_override_the_defaults(examples, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("num_mc_rollouts: 5\nlearning_rate: 3.0e-6\npass_at_1_samples: 4\n")
    script, args, _ = _parse(
        examples,
        "math",
        tmp_path,
        "--config",
        str(recipe),
        "--num_mc_rollouts",
        "3",  # the command line beats the config file
        "--vllm_mode",
        "server",
        "--per_device_train_batch_size",
        "16",
        "--max_steps",
        "7",
        "--train_file",
        "train.jsonl",
    )
    assert args.num_mc_rollouts == 3
    assert args.learning_rate == 3e-6
    assert script.pass_at_1_samples == 4
    assert args.vllm_mode == "server"
    assert args.gradient_accumulation_steps == 4  # 64 = 16 per device x 1 process x 4
    assert args.max_steps == 7  # an explicit max_steps wins over ppo_iterations
    assert script.train_file == "train.jsonl"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--per_device_train_batch_size", "128"], "minibatch_size=64 is not a multiple"),
        (["--gradient_accumulation_steps", "3"], "contradicts minibatch_size=64"),
        (
            ["--minibatch_size", "0", "--gradient_accumulation_steps", "3"],
            "generation_batch_size=512 is not a multiple",
        ),
        (["--prompt_template", "Solve it.\nSolution:"], "no '{problem}' placeholder"),
        (["--pass_at_1_engine", "sglang"], "pass_at_1_engine='sglang' is invalid"),
        (
            ["--pass_at_1_samples", "0"],
            "num_samples=0 is invalid; it must be an int >= 1. Set it with --pass_at_1_samples",
        ),
        (
            ["--pass_at_1_top_p", "1.5"],
            "top_p=1.5 must be in (0, 1]; use 1.0 to disable nucleus sampling. Set it with --pass_at_1_top_p",
        ),
        (["--max_eval_samples", "0"], "max_eval_samples=0 is invalid"),
        (["--max_steps", "1"], "leaving none for the polynomial decay"),
    ],
)
def test_inconsistent_arguments_fail_with_the_fix(examples, tmp_path, extra, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _parse(examples, "gsm8k", tmp_path, *extra)


def test_minibatch_without_derivation_uses_gradient_accumulation(examples, tmp_path):
    _, args, _ = _parse(
        examples,
        "gsm8k",
        tmp_path,
        "--minibatch_size",
        "0",
        "--gradient_accumulation_steps",
        "2",
        "--warmup_steps",
        "0",
    )
    assert args.gradient_accumulation_steps == 2
    # max_steps follows the real minibatch (8 x 1 x 2 = 16 episodes): 512 / 16 x 2 epochs per iteration.
    assert args.max_steps == 650 * (512 // 16) * 2


@pytest.mark.parametrize(
    "config, per_device, accumulation",
    [
        ("single_gpu.yaml", 8, 8),
        ("multi_gpu_zero2.yaml", 8, 1),
        ("multi_gpu_zero3.yaml", 8, 1),
        ("multi_node_zero2.yaml", 4, 1),
    ],
)
def test_paper_batch_geometry_fits_each_accelerate_config(examples, config, per_device, accumulation):
    """With the per-device batch the README recommends for a config, the paper's minibatch (64) and iteration
    (512 episodes) divide evenly over that config's processes."""
    processes = yaml.safe_load((CONFIGS / config).read_text())["num_processes"]
    args = SimpleNamespace(
        world_size=processes,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=1,
        generation_batch_size=512,
        num_iterations=2,
        max_steps=-1,
        warmup_steps=0.03,
        lr_scheduler_type="polynomial",
        get_warmup_steps=lambda steps: -(-steps * 3 // 100),
    )
    script = SimpleNamespace(minibatch_size=64, ppo_iterations=1000)
    examples.common._resolve_batch_geometry(script, args)
    assert args.gradient_accumulation_steps == accumulation
    assert args.max_steps == 16000


# --------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_local_problems_are_formatted_and_long_prompts_dropped(examples, tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    rows = [
        {"question": "What is 2+2?", "answer": "2+2=4\n#### 4", "extra": 1},
        {"question": "x" * 300, "answer": "#### 1", "extra": 2},
    ]
    script, _, _ = _parse(
        examples, "gsm8k", tmp_path, "--train_file", str(_write_jsonl(tmp_path / "t.jsonl", rows))
    )
    dataset = examples.common.load_problems(
        task=examples.common.TASKS["gsm8k"], script_args=script, split="train"
    )
    assert sorted(dataset.column_names) == ["answer", "prompt"]  # unused columns are dropped
    assert dataset[0]["prompt"] == "[MATH_TASK] Problem:\nWhat is 2+2?\n\nSolution:"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    kept = filter_long_prompts(dataset, tokenizer, max_prompt_tokens=100)
    assert kept["answer"] == ["2+2=4\n#### 4"]


def test_prompt_limit_leaves_room_for_a_response_as_the_trainer_checks(examples, tmp_path, tiny_model_dir):
    """The examples drop prompts longer than the model's context minus the response room: the tiny model has 512
    positions, so 512 - 16 when the preset's fixed rollout budget follows --max_completion_length 16 (as
    ``VinePPOConfig.from_paper`` does), 512 - 1024 with the paper's 1024-token budget given explicitly (no prompt
    fits), 512 - 16 with budgets from max_completion_length, 512 - 100 with a 100-token budget, and vLLM's context
    caps it."""
    common = examples.common
    base = [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--max_completion_length",
        "16",
        "--use_vllm",
        "false",
    ]

    def limit(*extra: str) -> int | None:
        return common.prompt_token_limit(*_parse(examples, "gsm8k", tmp_path, *base, *extra))

    assert limit() == 512 - 16
    assert limit("--mc_fixed_rollout_budget", "1024") == 512 - 1024
    assert limit("--mc_rollout_budget", "remaining", "--mc_fixed_rollout_budget", "None") == 512 - 16
    assert limit("--mc_fixed_rollout_budget", "16") == 512 - 16
    assert limit("--mc_fixed_rollout_budget", "100") == 512 - 100
    base += ["--mc_fixed_rollout_budget", "16"]
    assert limit("--use_vllm", "true", "--vllm_max_model_length", "128") == 128 - 16
    assert limit("--max_prompt_length", "7") == 7


def test_local_problems_without_the_needed_columns_are_refused(examples, tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"problem": "1+1?", "gold": "2"}])
    script, _, _ = _parse(examples, "math", tmp_path, "--eval_file", str(path))
    with pytest.raises(ValueError, match=r"none of the gold answer columns \['answer', 'solution'\]"):
        examples.common.load_problems(task=examples.common.TASKS["math"], script_args=script, split="eval")
    script, _, _ = _parse(
        examples, "math", tmp_path, "--eval_file", str(path), "--problem_column", "question"
    )
    with pytest.raises(ValueError, match="--problem_column"):
        examples.common.load_problems(task=examples.common.TASKS["math"], script_args=script, split="eval")


# --------------------------------------------------------------------------------------------------------------
# Accelerate configs and the README
# --------------------------------------------------------------------------------------------------------------

EXPECTED_CONFIGS = {
    "single_gpu.yaml": {"distributed_type": "NO", "num_machines": 1, "num_processes": 1, "zero_stage": None},
    "multi_gpu_zero2.yaml": {
        "distributed_type": "DEEPSPEED",
        "num_machines": 1,
        "num_processes": 8,
        "zero_stage": 2,
    },
    "multi_gpu_zero3.yaml": {
        "distributed_type": "DEEPSPEED",
        "num_machines": 1,
        "num_processes": 8,
        "zero_stage": 3,
    },
    "multi_node_zero2.yaml": {
        "distributed_type": "DEEPSPEED",
        "num_machines": 2,
        "num_processes": 16,
        "zero_stage": 2,
    },
}


@pytest.mark.parametrize("name", sorted(EXPECTED_CONFIGS))
def test_accelerate_configs_parse_and_have_the_expected_keys(name):
    from accelerate.commands.config.config_args import load_config_from_file

    expected = EXPECTED_CONFIGS[name]
    raw = yaml.safe_load((CONFIGS / name).read_text())
    for key in (
        "compute_environment",
        "distributed_type",
        "num_machines",
        "num_processes",
        "mixed_precision",
    ):
        assert key in raw, key
    assert raw["mixed_precision"] == "bf16"
    assert raw["distributed_type"] == expected["distributed_type"]
    assert raw["num_machines"] == expected["num_machines"]
    assert raw["num_processes"] == expected["num_processes"]
    if expected["zero_stage"] is None:
        assert "deepspeed_config" not in raw
    else:
        assert raw["deepspeed_config"]["zero_stage"] == expected["zero_stage"]
    if expected["zero_stage"] == 3:
        assert raw["deepspeed_config"]["zero3_init_flag"] is True
        assert raw["deepspeed_config"]["zero3_save_16bit_model"] is True  # a loadable model at the end
    if expected["num_machines"] > 1:
        assert {"main_process_ip", "main_process_port", "machine_rank"} <= raw.keys()
    # accelerate itself accepts the file (unknown keys would raise here).
    loaded = load_config_from_file(str(CONFIGS / name))
    assert loaded.num_processes == expected["num_processes"]


def test_readme_commands_point_at_files_that_exist():
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED_CONFIGS)
    for name in EXPECTED_CONFIGS:
        assert f"accelerate_configs/{name}" in readme, f"examples/README.md does not document {name}"
    assert "trl vllm-serve" in readme and "--vllm_mode server" in readme
    # Every example path in the READMEs, the docs, the example scripts and the accelerate configs exists.
    sources = [EXAMPLES / "README.md", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    sources += sorted(EXAMPLES.glob("*.py")) + sorted(CONFIGS.glob("*.yaml"))
    mentioned = 0
    for source in sources:
        for path in set(re.findall(r"examples/[\w./-]+\.(?:py|yaml)", source.read_text(encoding="utf-8"))):
            mentioned += 1
            assert (ROOT / path).is_file(), (
                f"{source.relative_to(ROOT)} mentions {path}, which does not exist"
            )
    assert mentioned >= 10


# --------------------------------------------------------------------------------------------------------------
# End to end: one training step of each task on a tiny offline model (CPU)
# --------------------------------------------------------------------------------------------------------------

TINY_RUN = [
    "--use_vllm", "false",
    "--bf16", "false",
    "--gradient_checkpointing", "false",
    "--report_to", "none",
    "--save_strategy", "no",
    "--per_device_train_batch_size", "4",
    "--num_generations", "2",
    "--generation_batch_size", "4",
    "--minibatch_size", "4",
    "--num_mc_rollouts", "2",
    "--max_completion_length", "16",
    "--mc_fixed_rollout_budget", "16",  # the paper's fixed budget (1024) does not fit the tiny model's context
    "--max_steps", "1",
    "--warmup_steps", "0",
    "--logging_steps", "1",
    "--max_eval_samples", "3",
    "--pass_at_1_samples", "2",
    "--pass_at_1_max_tokens", "8",
    "--pass_at_1_engine", "transformers",
]  # fmt: skip

TASK_PROBLEM = {"gsm8k": "question", "math": "problem"}
TASK_ROWS = {
    "gsm8k": [
        {"question": f"What is {a}+{a}?", "answer": f"{a}+{a}={2 * a}\n#### {2 * a}"} for a in range(8)
    ],
    "math": [
        {"problem": f"What is ${a}+{a}$?", "solution": f"${a}+{a}=\\boxed{{{2 * a}}}$", "answer": str(2 * a)}
        for a in range(8)
    ],
}


def test_the_cards_script_runs_and_imports_the_standard_librarys_math():
    """``python examples/math.py --help``: the script runs with its folder on sys.path, and every library it loads
    (numpy, torch, TRL: all ``import math``) gets the standard library's module, not the script."""
    env = dict(os.environ, **OFFLINE_ONE_THREAD)
    proc = subprocess.run([sys.executable, "examples/math.py", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "--task" in proc.stdout and "--num_mc_rollouts" in proc.stdout
    )  # (a shadowed math breaks numpy first)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, launcher", [("gsm8k", "accelerate"), ("math", "python")])
def test_example_trains_one_step_and_evaluates(tmp_path, tiny_model_dir, name, launcher):
    data = _write_jsonl(tmp_path / f"{name}.jsonl", TASK_ROWS[name])
    out = tmp_path / "out"
    script = str(EXAMPLES / "math.py")
    if launcher == "accelerate":
        # The shipped single-GPU config, forced onto the CPU.
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(CONFIGS / "single_gpu.yaml"), "--cpu", "--mixed_precision", "no", script]  # fmt: skip
    else:
        command = [sys.executable, script, "--use_cpu", "true"]
    command += [
        "--task", name,
        "--model_name_or_path", str(tiny_model_dir),
        "--train_file", str(data),
        "--eval_file", str(data),
        "--output_dir", str(out),
        *TINY_RUN,
    ]  # fmt: skip
    if name == "math":
        command += ["--pass_at_1_before_training", "true"]
    env = dict(os.environ, **OFFLINE_ONE_THREAD)
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"{name} example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    # The trained model and tokenizer are saved and load back.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)

    # One VinePPO step ran: the Monte Carlo rollouts happened and were logged.
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 1
    step_log = next(entry for entry in state["log_history"] if "mc/rollouts" in entry)
    assert step_log["mc/rollouts"] > 0 and step_log["mc/states"] > 0
    assert "train_runtime" in json.loads((out / "train_results.json").read_text())

    # Pass@1 was measured with the requested settings and written out.
    names = ["pass_at_1"] + (["pass_at_1_initial"] if name == "math" else [])
    for result_name in names:
        record = json.loads((out / f"{result_name}.json").read_text())
        assert (record["num_problems"], record["num_samples"], record["engine"]) == (3, 2, "transformers")
        assert record["settings"]["temperature"] == 0.35 and record["settings"]["max_tokens"] == 8
        assert len(record["per_round"]) == 2 and 0.0 <= record["pass_at_1"] <= 1.0
        assert record["eval_problems"] == str(data)
        lines = (out / f"{result_name}_responses.jsonl").read_text().splitlines()
        inspected = [json.loads(line) for line in lines]
        assert [r["prompt"] for r in inspected] == [
            "[MATH_TASK] Problem:\n" + row[TASK_PROBLEM[name]] + "\n\nSolution:"
            for row in TASK_ROWS[name][:3]
        ]
        assert all(isinstance(r["response"], str) and r["accuracy"] in (0.0, 0.5, 1.0) for r in inspected)
    final = json.loads((out / "pass_at_1.json").read_text())
    assert json.loads((out / "pass_at_1_results.json").read_text())["pass_at_1"] == final["pass_at_1"]


# ----------------------------------------------------------------------------- RestEM and DPO+ (the paper's RL-free baselines)


@pytest.fixture(scope="module")
def baselines():
    """``examples/restem.py`` and ``examples/dpo_plus.py``, imported as the scripts import their helpers."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        mods = {}
        for name in ("restem", "dpo_plus"):
            spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
            mods[name] = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mods[name]  # dataclasses look their module up there
            spec.loader.exec_module(mods[name])
        yield SimpleNamespace(**mods)
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in ("restem", "dpo_plus"):
            sys.modules.pop(f"{name}_example", None)


CPU = ("--use_cpu", "true")  # the TRL configs default to bf16, which a CPU-only machine refuses


def test_restem_and_dpo_plus_defaults_are_the_papers(baselines, tmp_path):
    script, restem, sft = baselines.restem.parse_args(
        ["--task", "gsm8k", "--output_dir", str(tmp_path), *CPU]
    )
    assert (restem.iterations, script.samples_per_prompt, script.sampling_temperature) == (10, 8, 0.6)
    assert (sft.num_train_epochs, sft.learning_rate, sft.lr_scheduler_type.value) == (8, 1e-6, "polynomial")
    assert (
        script.model_name_or_path == "realtreetune/rho-1b-sft-GSM8K" and script.problem_column == "question"
    )
    for task, beta in (("gsm8k", 0.3), ("math", 0.1)):
        script, dpo_plus, dpo = baselines.dpo_plus.parse_args(
            ["--task", task, "--output_dir", str(tmp_path), *CPU]
        )
        assert (dpo.beta, dpo.num_train_epochs, dpo.learning_rate) == (beta, 3, 1e-6)
        assert list(dpo.loss_type) == ["sigmoid", "sft"]
        assert (script.samples_per_prompt, dpo_plus.pairs_per_prompt) == (64, 64)
    # Flags override the paper's settings.
    _, _, dpo = baselines.dpo_plus.parse_args(
        ["--task", "gsm8k", "--beta", "0.05", "--output_dir", str(tmp_path), *CPU]
    )
    assert dpo.beta == 0.05


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["restem", "dpo_plus"])
def test_restem_and_dpo_plus_examples_run_one_round(tmp_path, name):
    """One round on the shipped demo warm-up policy (a tiny offline model that solves about 40% of the demo's
    problems, so some responses are correct and some are not), with the GSM8K verifier."""
    from mcadvantage.demo.config import DemoConfig, build_data, shipped_warmup_dir

    problems = build_data(DemoConfig()).rl_set[:6]
    data = _write_jsonl(
        tmp_path / "demo.jsonl", [{"question": p.prompt, "answer": p.answer} for p in problems]
    )
    out = tmp_path / "out"
    command = [
        sys.executable, str(EXAMPLES / f"{name}.py"), "--task", "gsm8k",
        "--model_name_or_path", str(shipped_warmup_dir()), "--train_file", str(data), "--prompt_template", "{problem}",
        "--samples_per_prompt", "8", "--max_new_tokens", "64", "--engine", "transformers",
        "--max_steps", "2", "--per_device_train_batch_size", "4", "--output_dir", str(out),
        "--use_cpu", "true", "--report_to", "none",
    ]  # fmt: skip
    command += ["--iterations", "1"] if name == "restem" else ["--pairs_per_prompt", "4"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    from transformers import AutoModelForCausalLM

    summary = json.loads((out / f"{name}.json").read_text())
    if name == "restem":
        (round_,) = summary["iterations"]
        assert round_["correct_responses"] > 0
        AutoModelForCausalLM.from_pretrained(round_["checkpoint"])
    else:
        assert summary["pairs"] > 0 and summary["beta"] == 0.3 and summary["loss_type"] == ["sigmoid", "sft"]
        AutoModelForCausalLM.from_pretrained(out)


def test_the_rollout_budget_follows_max_completion_length_unless_given(examples, tmp_path):
    """As ``VinePPOConfig.from_paper``: ``--max_completion_length 24`` gives rollouts 24 tokens, not the preset's
    1,024; a budget given on the command line or in ``--config`` is kept."""
    _, args, _ = _parse(examples, "gsm8k", tmp_path, "--max_completion_length", "24")
    assert (args.mc_rollout_budget, args.mc_fixed_rollout_budget) == ("fixed", 24)
    _, args, _ = _parse(
        examples, "gsm8k", tmp_path, "--max_completion_length", "24", "--mc_fixed_rollout_budget", "64"
    )
    assert args.mc_fixed_rollout_budget == 64
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("mc_fixed_rollout_budget: 48\n")
    _, args, _ = _parse(examples, "gsm8k", tmp_path, "--config", str(recipe), "--max_completion_length", "24")
    assert args.mc_fixed_rollout_budget == 48
    _, args, _ = _parse(examples, "gsm8k", tmp_path)
    assert (args.max_completion_length, args.mc_fixed_rollout_budget) == (
        1024,
        1024,
    )  # the paper's, untouched


# ----------------------------------------------------------------------------- The agent example (examples/agent.py)


@pytest.fixture(scope="module")
def agent_example():
    """``examples/agent.py``, imported as the script imports its helpers (its folder first on sys.path)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location("agent_example", EXAMPLES / "agent.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("agent_example", None)


def test_agent_example_defaults_short_flags_and_quick_settings(agent_example, tmp_path):
    out = ["--output_dir", str(tmp_path / "out")]
    script, args, model = agent_example.parse_args(out)
    # A real run: the example's model on a colocated vLLM engine, GRPO's advantages, one tool call of slack.
    assert (model.model_name_or_path, args.advantage_estimator) == ("Qwen/Qwen3-0.6B", "grpo")
    assert (args.use_vllm, args.vllm_mode, script.quick) == (True, "colocate", False)
    assert args.max_tool_calling_iterations == script.horizon + 1 == 4
    assert args.chat_template_kwargs == {"enable_thinking": False}
    # --estimator and --model are the library's --advantage_estimator and --model_name_or_path.
    script, args, model = agent_example.parse_args(
        [*out, "--estimator", "rloo", "--model", "some/model", "--horizon", "5"]
    )
    assert (args.advantage_estimator, model.model_name_or_path) == ("rloo", "some/model")
    assert args.max_tool_calling_iterations == 6
    _, args, _ = agent_example.parse_args([*out, "--max_tool_calling_iterations", "2"])
    assert args.max_tool_calling_iterations == 2
    # --quick: CPU, transformers generation, a short episode; flags still win; its own output directory.
    script, args, _ = agent_example.parse_args(["--quick"])
    assert (args.use_cpu, args.use_vllm, script.horizon, args.max_steps) == (True, False, 2, 4)
    assert args.output_dir == str(Path("outputs") / "agent-quick")
    _, args, _ = agent_example.parse_args(["--quick", "--max_steps", "2", *out])
    assert args.max_steps == 2 and args.output_dir == str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"--quick builds its own tiny offline model.*Drop --quick"):
        agent_example.parse_args(["--quick", "--model", "some/model", *out])
    with pytest.raises(ValueError, match="--horizon 0 is invalid"):
        agent_example.parse_args([*out, "--horizon", "0"])


def test_agent_example_warm_up_episodes_mask_the_models_turns_only(agent_example):
    """The format warm-up trains on the model's own turns (tool call or ``done``, through the end-of-turn token),
    never on the prompt or the tool results, and the episode's tokens start with the prompt TRL renders."""
    from trl.chat_template_utils import get_training_chat_template

    from testbed.agent_env import AgentEnv, agent_rows
    from testbed.agent_policy import FINAL_TEXT, build_agent_tokenizer, tool_call_text

    tokenizer = build_agent_tokenizer()
    row = agent_rows("delayed", 2, 1, seed=3)[0]
    ids, mask = agent_example.scripted_episode_ids(tokenizer, row, [1, 3], {})
    env = AgentEnv()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": row["prompt"][0]["content"] + env.reset(**row)}],
        tools=[env.act], chat_template=get_training_chat_template(tokenizer), add_generation_prompt=True,
        tokenize=True, return_dict=False,
    )  # fmt: skip
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append(tokenizer.decode(ids[start:i], skip_special_tokens=False))
            start = None
    assert len(runs) == 3 and all(run.endswith("<|im_end|>") for run in runs)
    assert tool_call_text(1) in runs[0] and tool_call_text(3) in runs[1] and FINAL_TEXT in runs[2]
    after_prompt = zip(ids[len(prompt) :], mask[len(prompt) :], strict=True)
    hidden = tokenizer.decode([t for t, m in after_prompt if not m], skip_special_tokens=False)
    assert re.findall(r"turn (\d)/2 state=", hidden) == ["1", "2"] and "<tool_call>" not in hidden


def test_agent_example_refuses_an_estimator_that_does_not_take_agent_episodes(
    agent_example, tmp_path, capsys, monkeypatch
):
    """An estimator the library refuses with environments ends the script with exit status 2, before any training:
    the library's reason and the flag that fixes it, on stderr. Every built-in estimator takes environments, so the
    refused one is registered here: it samples continuations but cannot continue an episode through its tool calls
    (no ``check_agent_support``)."""
    from mcadvantage.estimators import AdvantageEstimator, register_advantage_estimator, registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # registered for this test only
    name = "plain_text_rollouts"

    @register_advantage_estimator(name)
    class PlainTextRollouts(AdvantageEstimator):
        uses_rollouts = True

        def estimate(self, batch, context):
            raise AssertionError("refused before training: never estimates")

    with pytest.raises(SystemExit) as exit_:
        agent_example.main(["--quick", "--estimator", name, "--output_dir", str(tmp_path / "out")])
    assert exit_.value.code == agent_example.EXIT_REFUSED == 2
    err = capsys.readouterr().err
    assert f"--estimator {name} cannot train this environment's episodes" in err
    assert (
        f"advantage_estimator={name!r} does not support environment_factory=" in err
    )  # the library's reason
    assert err.rstrip().endswith(agent_example.REFUSAL_FIX)
    # examples/README.md quotes the same line (issue 53: it quoted a shorter one).
    readme = " ".join((EXAMPLES / "README.md").read_text(encoding="utf-8").split())
    assert f"`{agent_example.REFUSAL_FIX}`" in readme
    assert not (tmp_path / "out" / "trainer_state.json").exists()


#: What an example's subprocess run in these tests sets: one thread, no tokenizer workers, nothing downloaded.
OFFLINE_ONE_THREAD = dict(
    OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_agent_example_quick_run_trains_the_environment(tmp_path):
    """``python examples/agent.py --quick`` from the repository's root: the tiny model learns the tool-call format,
    TRL's tool loop runs the environment's ``act`` during the RL steps, the environment's reward is logged, and the
    trained model is saved with finite weights."""
    out = tmp_path / "out"
    env = dict(os.environ, **OFFLINE_ONE_THREAD)
    command = [sys.executable, str(EXAMPLES / "agent.py"), "--quick", "--output_dir", str(out)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"agent example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "Trained 4 steps with --estimator grpo" in proc.stderr

    state = json.loads((out / "trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "loss" in e]
    assert state["global_step"] == len(steps) == 4
    assert sum(e["tools/call_frequency"] for e in steps) > 0  # the taught model calls act; TRL ran the calls
    assert all(0.0 <= e["rewards/AgentEnv/mean"] <= 1.0 for e in steps)  # the environment's get_reward
    assert all(math.isfinite(e["loss"]) for e in steps)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize(("env", "estimator"), [("FrozenLake-v1", "grpo"), ("openenv", "grpo")])
def test_agent_example_quick_run_trains_a_gymnasium_game_and_an_openenv_server(tmp_path, env, estimator):
    """``python examples/agent.py --quick --env FrozenLake-v1`` (the gymnasium adapter) and ``--env openenv:<url>``
    (a real local OpenEnv server serving FrozenLake) train two steps offline; the game's reward is logged."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("openenv.core")
    from mcadvantage.envs import LocalOpenEnvServer

    out = tmp_path / "out"
    environ = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    server = LocalOpenEnvServer("FrozenLake-v1", start_timeout_s=120) if env == "openenv" else None
    try:
        flag = f"openenv:{server.url}" if server else env
        command = [sys.executable, str(EXAMPLES / "agent.py"), "--quick", "--env", flag, "--estimator", estimator,
                   "--max_steps", "2", "--output_dir", str(out)]  # fmt: skip
        proc = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=280)
    finally:
        if server:
            server.stop()
    assert proc.returncode == 0, f"agent example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert f"Trained 2 steps with --estimator {estimator}" in proc.stderr
    steps = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    name = "FrozenLakeV1" if env != "openenv" else "OpenEnvFrozenLakeV1"
    assert len(steps) == 2 and all(0.0 <= e[f"rewards/{name}/mean"] <= 1.0 for e in steps)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_agent_example_quick_run_trains_with_anchor_credit(tmp_path):
    """``python examples/agent.py --estimator anchor --quick``: the anchor credit reads ``AgentEnv.state_key`` during
    TRL's tool loop and trains; its ``anchor/*`` metrics are logged at every step."""
    out = tmp_path / "out"
    env = dict(os.environ, **OFFLINE_ONE_THREAD)
    command = [
        sys.executable,
        str(EXAMPLES / "agent.py"),
        "--estimator",
        "anchor",
        "--quick",
        "--output_dir",
        str(out),
    ]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"agent example failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "Trained 4 steps with --estimator anchor" in proc.stderr
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [e for e in state["log_history"] if "loss" in e]
    assert state["global_step"] == len(steps) == 4
    assert sum(e["tools/call_frequency"] for e in steps) > 0
    assert all(0.0 <= e["anchor/grouped_turn_share"] <= 1.0 for e in steps)
    assert all(e["anchor/mean_step_group_size"] >= 1.0 for e in steps)
    assert all(math.isfinite(e["loss"]) for e in steps)
