"""What the paper-scale example (``math.py``: MATH, or GSM8K with ``--task gsm8k``) uses besides the library: the tasks
(:data:`TASKS`: checkpoint, data, verifier), the command line (TRL's ``TrlParser`` over :class:`ExampleArguments`,
:class:`mcadvantage.VinePPOConfig` and ``trl.ModelConfig``, with ``VinePPOConfig.from_paper(task)`` as defaults),
and the problems' loading and prompt formatting. Training, prompt-length filtering and Pass@1 are the library's
(:class:`mcadvantage.VinePPOTrainer`, :mod:`mcadvantage.core.prompts`, :mod:`mcadvantage.evaluation.pass_at_1`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from trl import ModelConfig, TrlParser

from mcadvantage import GSM8KVerifier, MathVerifier, PassAt1Settings, VinePPOConfig
from mcadvantage.trainer.policy import ENGINES

__all__ = [
    "PAPER_PROMPT_TEMPLATE",
    "TASKS",
    "ExampleArguments",
    "TaskSpec",
    "build_prompt",
    "eval_source",
    "load_problems",
    "make_parser",
    "paper_defaults",
    "paper_settings",
    "parse_args",
    "pass_at_1_settings",
    "prompt_token_limit",
    "requested_task",
    "setup_logging",
]

logger = logging.getLogger("mcadvantage.examples")

#: Prompt template of the official SFT checkpoints (``realtreetune/rho-1b-sft-*``,
#: ``realtreetune/deepseekmath-7b-sft-*``), for MATH and GSM8K alike. ``{problem}`` is replaced by the problem.
PAPER_PROMPT_TEMPLATE = "[MATH_TASK] Problem:\n{problem}\n\nSolution:"


# ----------------------------------------------------------------------------------------------------------------
# Tasks and command-line arguments
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """What differs between the tasks besides the training settings (those, the step segmenter included, come from
    ``VinePPOConfig.from_paper(task)``).

    Args:
        name: task name used in messages (``"MATH"``, ``"GSM8K"``).
        model_name_or_path: the official SFT checkpoint RL starts from.
        dataset_name, dataset_config, dataset_train_split: training problems on the Hub.
        eval_dataset_name, eval_dataset_config, eval_dataset_split: evaluation problems on the Hub.
        problem_column: dataset column holding the problem text.
        gold_columns: columns the verifier grades against (the first present is used by the verifier; every
            present one is kept).
        verifier: builds the reward function that grades a response against the gold answer.
    """

    name: str
    model_name_or_path: str
    dataset_name: str
    dataset_config: str | None
    dataset_train_split: str
    eval_dataset_name: str
    eval_dataset_config: str | None
    eval_dataset_split: str
    problem_column: str
    gold_columns: tuple[str, ...]
    verifier: Callable[[], Any]


#: The paper's tasks, by ``--task`` name (the names ``VinePPOConfig.from_paper`` takes).
TASKS: dict[str, TaskSpec] = {
    # MATH train (7,500 problems; the paper trained on the 11,500 of the PRM800K split, pass them with
    # --train_file), evaluated on MATH-500 (the paper's test set). Graded on the last \boxed{} (math-verify).
    "math": TaskSpec(
        name="MATH",
        model_name_or_path="realtreetune/rho-1b-sft-MATH",
        dataset_name="DigitalLearningGmbH/MATH-lighteval",
        dataset_config=None,
        dataset_train_split="train",
        eval_dataset_name="HuggingFaceH4/MATH-500",
        eval_dataset_config=None,
        eval_dataset_split="test",
        problem_column="problem",
        gold_columns=("answer", "solution"),  # the final answer, and/or a solution whose last \boxed{} is it
        verifier=MathVerifier,
    ),
    # GSM8K train (7,473 problems; the paper held 373 out for validation) and test (1,319, the paper's test set).
    # Graded on the number after the last "####".
    "gsm8k": TaskSpec(
        name="GSM8K",
        model_name_or_path="realtreetune/rho-1b-sft-GSM8K",
        dataset_name="openai/gsm8k",
        dataset_config="main",
        dataset_train_split="train",
        eval_dataset_name="openai/gsm8k",
        eval_dataset_config="main",
        eval_dataset_split="test",
        problem_column="question",
        gold_columns=("answer",),  # a reference solution ending in "#### N", or the bare number
        verifier=GSM8KVerifier,
    ),
}


@dataclass
class ExampleArguments:
    """Data and evaluation settings of the examples (training settings are :class:`mcadvantage.VinePPOConfig`
    flags, model settings ``trl.ModelConfig`` flags)."""

    task: str = field(
        default="math",
        metadata={
            "help": "The paper's task: 'math' or 'gsm8k'. Picks the checkpoint, data and verifier, and the defaults "
            "of every training flag (VinePPOConfig.from_paper(task)).",
            "choices": sorted(TASKS),
        },
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset with the training problems (ignored with --train_file)."}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration of --dataset_name."})
    dataset_train_split: str = field(
        default="train", metadata={"help": "Split of --dataset_name to train on."}
    )
    eval_dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset with the evaluation problems (ignored with --eval_file)."},
    )
    eval_dataset_config: str | None = field(
        default=None, metadata={"help": "Configuration of --eval_dataset_name."}
    )
    eval_dataset_split: str = field(
        default="test", metadata={"help": "Split of --eval_dataset_name to evaluate on."}
    )
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Local JSONL file of training problems (same columns as the Hub dataset); overrides the Hub."
        },
    )
    eval_file: str | None = field(
        default=None,
        metadata={
            "help": "Local JSONL file of evaluation problems (same columns as the Hub dataset); overrides the Hub."
        },
    )
    problem_column: str = field(default="problem", metadata={"help": "Column holding the problem text."})
    prompt_template: str = field(
        default=PAPER_PROMPT_TEMPLATE,
        metadata={
            "help": "Prompt template; '{problem}' is replaced by the problem (official SFT checkpoints' template)."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N training problems (debugging)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N evaluation problems."}
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Drop training problems whose prompt has more tokens. Default: the model's context minus "
            "max_completion_length, so every response fits."
        },
    )
    minibatch_size: int | None = field(
        default=None,
        metadata={
            "help": "Episodes per optimizer step (default: the paper's). gradient_accumulation_steps is derived "
            "from it (minibatch_size / (per_device_train_batch_size x processes)); 0 uses "
            "--gradient_accumulation_steps."
        },
    )
    ppo_iterations: int | None = field(
        default=None,
        metadata={
            "help": "PPO iterations (generation batches) to train for when --max_steps is not set (default: the "
            "paper's for --task). max_steps = ppo_iterations x generation_batch_size / minibatch x num_iterations."
        },
    )
    run_pass_at_1: bool = field(
        default=True, metadata={"help": "Measure Pass@1 on the evaluation problems after training."}
    )
    pass_at_1_before_training: bool = field(
        default=False, metadata={"help": "Also measure Pass@1 of the starting checkpoint before training."}
    )
    evaluate_only: bool = field(
        default=False,
        metadata={
            "help": "Skip training: measure Pass@1 of --model_name_or_path (e.g. the SFT checkpoint) and exit."
        },
    )
    pass_at_1_samples: int = field(
        default=16, metadata={"help": "Samples per problem; Pass@1 is their mean accuracy (paper: 16)."}
    )
    pass_at_1_temperature: float = field(
        default=0.35,
        metadata={
            "help": "Sampling temperature of the evaluation (paper: 0.35; 0 is greedy, with --pass_at_1_samples 1)."
        },
    )
    pass_at_1_top_p: float = field(
        default=0.9, metadata={"help": "Top-p of the evaluation (official code: 0.9)."}
    )
    pass_at_1_max_tokens: int | None = field(
        default=None,
        metadata={"help": "Token budget of an evaluation response (default: max_completion_length)."},
    )
    pass_at_1_seed: int = field(
        default=42, metadata={"help": "Seed of the evaluation samples (official code: 42)."}
    )
    pass_at_1_engine: str = field(
        default="auto",
        metadata={
            "help": "Evaluation engine: 'auto' (the trainer's vLLM engine when it has one, else transformers; "
            "with --evaluate_only a fresh vLLM engine when vLLM is installed), 'vllm' or 'transformers'."
        },
    )
    pass_at_1_batch_size: int = field(
        default=256, metadata={"help": "transformers engine: sequences per generate() call."}
    )


class _Recorded(VinePPOConfig):
    """``from_paper`` builds ``cls(**fields)``; on this class it returns those fields instead of a config. A real
    config would set up the devices (and the process group under ``accelerate launch``) before the command line
    is parsed, with the defaults of ``--ddp_timeout`` and the like instead of the flags given."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def paper_settings(task: str) -> dict[str, Any]:
    """The settings ``VinePPOConfig.from_paper(task)`` sets (the paper's Table 1 and the official code's Monte
    Carlo choices), with its batch geometry as the examples state it: ``minibatch_size`` (episodes per optimizer
    step) and ``ppo_iterations`` instead of ``gradient_accumulation_steps`` and ``max_steps``, which
    :func:`parse_args` derives for the real per-device batch and number of processes.
    """
    # One process with one episode per device: from_paper's accumulation is then the minibatch in episodes.
    with mock.patch.dict(os.environ, {"WORLD_SIZE": "1"}):
        fields = vars(_Recorded.from_paper(task, output_dir="unused", per_device_train_batch_size=1))
    for name in ("output_dir", "per_device_train_batch_size"):
        fields.pop(name)
    minibatch = fields.pop("gradient_accumulation_steps")
    steps_per_iteration = fields["generation_batch_size"] // minibatch * fields["num_iterations"]
    iterations = fields.pop("max_steps") // steps_per_iteration
    return {**fields, "minibatch_size": minibatch, "ppo_iterations": iterations}


def paper_defaults(task: str) -> dict[str, Any]:
    """The example's defaults for ``--task``: :func:`paper_settings`, the task's checkpoint and data, and vLLM
    colocated in the training processes (``--vllm_mode server`` for a separate server).

    Applied as parser defaults, so a ``--config`` YAML file and command-line flags override them.
    """
    spec = TASKS[task]
    return {
        **paper_settings(task),
        "model_name_or_path": spec.model_name_or_path,
        "dataset_name": spec.dataset_name,
        "dataset_config": spec.dataset_config,
        "dataset_train_split": spec.dataset_train_split,
        "eval_dataset_name": spec.eval_dataset_name,
        "eval_dataset_config": spec.eval_dataset_config,
        "eval_dataset_split": spec.eval_dataset_split,
        "problem_column": spec.problem_column,
        "output_dir": f"outputs/vineppo-{spec.model_name_or_path.rstrip('/').split('/')[-1]}",
        "use_vllm": True,
        "vllm_mode": "colocate",
        "logging_steps": 1,
    }


def make_parser() -> TrlParser:
    """The example's parser: ``ExampleArguments``, ``VinePPOConfig`` and ``trl.ModelConfig`` flags."""
    return TrlParser((ExampleArguments, VinePPOConfig, ModelConfig))


def requested_task(argv: Sequence[str]) -> str:
    """``--task`` from the command line, else ``task:`` in the ``--config`` file, else ``"math"``: the defaults of
    the other flags depend on it, so it is read before them."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--task")
    early.add_argument("--config")
    known, _ = early.parse_known_args(list(argv))
    task = known.task
    if task is None and known.config is not None:
        import yaml

        with open(known.config) as file:
            recipe = yaml.safe_load(file)
        task = recipe.get("task") if isinstance(recipe, dict) else None
    task = "math" if task is None else str(task)
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of the paper's tasks. Use --task {' or '.join(TASKS)}.")
    return task


def _given(name: str, argv: Sequence[str]) -> bool:
    """Whether flag ``--name`` is on the command line or ``name`` is a key of the ``--config`` YAML file."""
    if any(arg == f"--{name}" or arg.startswith(f"--{name}=") for arg in argv):
        return True
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--config")
    known, _ = early.parse_known_args(list(argv))
    if known.config is None:
        return False
    import yaml

    with open(known.config) as file:
        recipe = yaml.safe_load(file)
    return isinstance(recipe, dict) and name in recipe


def parse_args(argv: Sequence[str] | None = None) -> tuple[ExampleArguments, VinePPOConfig, ModelConfig]:
    """Parse ``argv`` (default: ``sys.argv[1:]``) over the paper's defaults for its ``--task``.

    Also derives ``gradient_accumulation_steps`` from ``--minibatch_size`` and ``max_steps`` from
    ``--ppo_iterations`` (unless ``--max_steps`` is given), and checks the evaluation settings.
    """
    argv = list(argv) if argv is not None else sys.argv[1:]
    parser = make_parser()
    parser.set_defaults_with_config(**paper_defaults(requested_task(argv)))
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    # As VinePPOConfig.from_paper does: the preset's fixed rollout budget follows --max_completion_length unless
    # --mc_fixed_rollout_budget is given (on the command line or in --config).
    if training_args.mc_rollout_budget == "fixed" and not _given("mc_fixed_rollout_budget", argv):
        training_args.mc_fixed_rollout_budget = training_args.max_completion_length
    _resolve_batch_geometry(script_args, training_args)
    _check_example_args(script_args, training_args)
    return script_args, training_args, model_args


def _resolve_batch_geometry(script_args: ExampleArguments, args: VinePPOConfig) -> None:
    """Turn the paper's batch description (episodes per iteration, minibatch, iterations) into Trainer steps."""
    world = args.world_size
    per_step = args.per_device_train_batch_size * world  # episodes in one micro-batch over all processes
    if script_args.minibatch_size < 0:
        raise ValueError(
            f"minibatch_size={script_args.minibatch_size} is invalid. Set it to the episodes per optimizer step "
            "(paper: 64), or 0 to use --gradient_accumulation_steps as given."
        )
    if script_args.minibatch_size:
        if script_args.minibatch_size % per_step:
            raise ValueError(
                f"minibatch_size={script_args.minibatch_size} is not a multiple of per_device_train_batch_size "
                f"({args.per_device_train_batch_size}) x processes ({world}) = {per_step}. Change "
                "--per_device_train_batch_size or --minibatch_size so that it divides."
            )
        accumulation = script_args.minibatch_size // per_step
        if args.gradient_accumulation_steps not in (1, accumulation):
            raise ValueError(
                f"gradient_accumulation_steps={args.gradient_accumulation_steps} contradicts minibatch_size="
                f"{script_args.minibatch_size}, which needs {accumulation} with {per_step} episodes per micro-batch. "
                "Drop --gradient_accumulation_steps, or pass --minibatch_size 0 to use it as given."
            )
        # Nothing in GRPOConfig derives from gradient_accumulation_steps once generation_batch_size is set, so
        # assigning it after parsing is safe.
        args.gradient_accumulation_steps = accumulation
    minibatch = per_step * args.gradient_accumulation_steps
    if args.generation_batch_size % minibatch:
        raise ValueError(
            f"generation_batch_size={args.generation_batch_size} is not a multiple of the minibatch ({minibatch} "
            "episodes per optimizer step), so a PPO iteration would not be a whole number of optimizer steps. "
            "Change --generation_batch_size or --minibatch_size."
        )
    if args.max_steps is None or args.max_steps <= 0:
        if script_args.ppo_iterations < 1:
            raise ValueError(
                f"ppo_iterations={script_args.ppo_iterations} is invalid. Set it >= 1, or set --max_steps."
            )
        steps_per_iteration = args.generation_batch_size // minibatch * args.num_iterations
        args.max_steps = script_args.ppo_iterations * steps_per_iteration
    warmup = args.get_warmup_steps(args.max_steps)
    if (
        getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type) == "polynomial"
        and warmup >= args.max_steps
    ):
        # transformers' polynomial schedule divides by the steps left after warm-up (ZeroDivisionError at 0).
        raise ValueError(
            f"warmup_steps={args.warmup_steps} gives {warmup} warm-up steps for max_steps={args.max_steps}, leaving "
            "none for the polynomial decay. Pass --warmup_steps 0 for a run this short, or raise --max_steps."
        )


def _check_example_args(script_args: ExampleArguments, training_args: VinePPOConfig) -> None:
    if "{problem}" not in script_args.prompt_template:
        raise ValueError(
            f"prompt_template={script_args.prompt_template!r} has no '{{problem}}' placeholder, so every prompt "
            "would be the same. Include '{problem}' where the problem goes."
        )
    if script_args.pass_at_1_engine not in ENGINES:
        raise ValueError(
            f"pass_at_1_engine={script_args.pass_at_1_engine!r} is invalid. Use one of {list(ENGINES)}."
        )
    for name in ("max_train_samples", "max_eval_samples", "max_prompt_length", "pass_at_1_max_tokens"):
        value = getattr(script_args, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} is invalid. Set it >= 1, or leave it unset.")
    try:
        pass_at_1_settings(script_args, training_args)
    except ValueError as err:  # the library names the PassAt1Settings field; name the flag too
        flag = next((f for name, f in _SETTINGS_FLAGS.items() if f" {name}=" in str(err)), "--pass_at_1_*")
        raise ValueError(f"{err} Set it with {flag}.") from err


# PassAt1Settings field -> the flag that sets it
_SETTINGS_FLAGS = {
    "num_samples": "--pass_at_1_samples",
    "temperature": "--pass_at_1_temperature",
    "top_p": "--pass_at_1_top_p",
    "max_tokens": "--pass_at_1_max_tokens",
    "batch_size": "--pass_at_1_batch_size",
}


def pass_at_1_settings(script_args: ExampleArguments, training_args: VinePPOConfig) -> PassAt1Settings:
    """The evaluation flags as :class:`mcadvantage.PassAt1Settings` (response budget: ``--pass_at_1_max_tokens``,
    else ``--max_completion_length``)."""
    return PassAt1Settings(
        num_samples=script_args.pass_at_1_samples,
        temperature=script_args.pass_at_1_temperature,
        top_p=script_args.pass_at_1_top_p,
        max_tokens=script_args.pass_at_1_max_tokens or training_args.max_completion_length or 1024,
        seed=script_args.pass_at_1_seed,
        batch_size=script_args.pass_at_1_batch_size,
    )


def setup_logging(training_args: VinePPOConfig) -> None:
    """Progress messages from the main process only; other libraries stay at WARNING."""
    import transformers

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logger.setLevel(logging.INFO if training_args.process_index == 0 else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def build_prompt(template: str, problem: str) -> str:
    """The model input for one problem. Plain replacement, not ``str.format``: LaTeX braces in a template or
    a problem must stay as they are."""
    return template.replace("{problem}", problem)


def load_problems(
    *,
    task: TaskSpec,
    script_args: ExampleArguments,
    split: str,
) -> Any:
    """Training (``split="train"``) or evaluation (``split="eval"``) problems as a ``datasets.Dataset`` with a
    ``prompt`` column and the task's gold column(s), from a local JSONL file when one is given, else the Hub."""
    from datasets import load_dataset

    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r} is invalid; use 'train' or 'eval'.")
    local = script_args.train_file if split == "train" else script_args.eval_file
    if local is not None:
        if not Path(local).is_file():
            flag = "--train_file" if split == "train" else "--eval_file"
            raise FileNotFoundError(
                f"{flag} {local!r} does not exist. Pass a JSONL file with one problem per line."
            )
        dataset = load_dataset("json", data_files=local, split="train")
        source = local
    else:
        if split == "train":
            name, config, hub_split = (
                script_args.dataset_name,
                script_args.dataset_config,
                script_args.dataset_train_split,
            )
        else:
            name, config, hub_split = (
                script_args.eval_dataset_name,
                script_args.eval_dataset_config,
                script_args.eval_dataset_split,
            )
        if not name:
            flag = (
                "--dataset_name or --train_file" if split == "train" else "--eval_dataset_name or --eval_file"
            )
            raise ValueError(f"No {split} problems: set {flag}.")
        dataset = load_dataset(name, config, split=hub_split)
        source = f"{name}" + (f"[{config}]" if config else "") + f":{hub_split}"

    column = script_args.problem_column
    if column not in dataset.column_names:
        raise ValueError(
            f"{source} has no problem column {column!r} (columns: {dataset.column_names}). Set --problem_column to "
            "the column holding the problem text."
        )
    golds = [c for c in task.gold_columns if c in dataset.column_names]
    if not golds:
        raise ValueError(
            f"{source} has none of the gold answer columns {list(task.gold_columns)} the {task.name} verifier "
            f"grades against (columns: {dataset.column_names}). Rename the column holding the answer."
        )
    limit = script_args.max_train_samples if split == "train" else script_args.max_eval_samples
    if limit is not None and limit < len(dataset):
        dataset = dataset.select(range(limit))
    template = script_args.prompt_template
    dataset = dataset.map(
        lambda row: {"prompt": build_prompt(template, row[column])},
        remove_columns=[c for c in dataset.column_names if c not in golds],
        desc=f"Formatting {task.name} {split} prompts",
    )
    logger.info("Loaded %d %s problems from %s", len(dataset), split, source)
    return dataset


def eval_source(script_args: ExampleArguments) -> str:
    """Where the evaluation problems came from (recorded in ``pass_at_1.json``)."""
    if script_args.eval_file:
        return script_args.eval_file
    config = f"[{script_args.eval_dataset_config}]" if script_args.eval_dataset_config else ""
    return f"{script_args.eval_dataset_name}{config}:{script_args.eval_dataset_split}"


def prompt_token_limit(
    script_args: ExampleArguments, training_args: VinePPOConfig, model_args: ModelConfig
) -> int | None:
    """Longest training prompt to keep: ``--max_prompt_length``, else what the model's context leaves next to a
    full response (and a full fixed-budget Monte Carlo rollout), measured as the trainer's init check measures it
    (:func:`mcadvantage.core.prompts.context_length`); None when the context is unknown."""
    from transformers import AutoConfig

    from mcadvantage.core.prompts import context_length
    from mcadvantage.core.settings import needed_completion_room

    if script_args.max_prompt_length is not None:
        return script_args.max_prompt_length
    config = AutoConfig.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    context = context_length(config, training_args.vllm_max_model_length if training_args.use_vllm else None)
    room, _ = needed_completion_room(
        training_args.max_completion_length,
        training_args.mc_rollout_budget,
        training_args.mc_fixed_rollout_budget,
    )
    return None if context is None else context - room
