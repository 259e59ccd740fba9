"""What the RestEM and DPO+ examples (``restem.py``, ``dpo_plus.py``) share besides the library: their arguments
(the task's data as in ``math.py``, plus sampling), and sampling graded responses from a checkpoint with the
library's samplers and the task's verifier (:func:`mcadvantage.trainer.self_training.sample_and_grade`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from _common import PAPER_PROMPT_TEMPLATE, TASKS

__all__ = ["SelfTrainingArguments", "sample_graded", "task_defaults"]


@dataclass
class SelfTrainingArguments:
    """The task, its problems (the same flags and loading as ``math.py``) and how responses are sampled."""

    task: str = field(default="math", metadata={"help": "'math' or 'gsm8k'.", "choices": sorted(TASKS)})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Starting (SFT) checkpoint. Default: the task's official one."}
    )
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset of training problems."})
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration of --dataset_name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split of --dataset_name."})
    train_file: str | None = field(default=None, metadata={"help": "Local JSONL of training problems."})
    eval_file: str | None = field(default=None, metadata={"help": "Unused; accepted like math.py's."})
    problem_column: str | None = field(default=None, metadata={"help": "Column with the problem text."})
    prompt_template: str = field(default=PAPER_PROMPT_TEMPLATE, metadata={"help": "'{problem}' is replaced."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N problems."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Unused."})
    samples_per_prompt: int = field(default=8, metadata={"help": "Responses sampled per problem."})
    sampling_temperature: float = field(
        default=0.6, metadata={"help": "Temperature of the samples (paper: 0.6)."}
    )
    max_new_tokens: int = field(default=1024, metadata={"help": "Token budget of a sampled response."})
    engine: str = field(
        default="auto",
        metadata={"help": "'vllm' (a fresh vllm.LLM), 'transformers', or 'auto' (vLLM when installed)."},
    )


def task_defaults(args: SelfTrainingArguments) -> SelfTrainingArguments:
    """Fill the task's checkpoint, dataset and problem column where the command line left them unset."""
    spec = TASKS[args.task]
    args.model_name_or_path = args.model_name_or_path or spec.model_name_or_path
    if args.train_file is None and args.dataset_name is None:
        args.dataset_name, args.dataset_config = spec.dataset_name, spec.dataset_config
    args.problem_column = args.problem_column or spec.problem_column
    return args


def sample_graded(
    model_path: str, rows: list[dict[str, Any]], args: SelfTrainingArguments, verifier: Any
) -> list:
    """``args.samples_per_prompt`` responses per row from the checkpoint at ``model_path``, graded by ``verifier``."""
    import importlib.util

    from mcadvantage.trainer.self_training import sample_and_grade

    use_vllm = args.engine == "vllm" or (
        args.engine == "auto" and importlib.util.find_spec("vllm") is not None
    )
    if use_vllm:
        from vllm import LLM

        from mcadvantage import VLLMSampler

        llm = LLM(model=model_path)
        sampler = VLLMSampler(llm, temperature=args.sampling_temperature)
        tokenizer = llm.get_tokenizer()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mcadvantage import TransformersSampler

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path)
        sampler = TransformersSampler(model, tokenizer, temperature=args.sampling_temperature)
    graded = sample_and_grade(
        sampler,
        tokenizer,
        rows,
        verifier,
        num_samples=args.samples_per_prompt,
        max_new_tokens=args.max_new_tokens,
    )
    del sampler
    if use_vllm:  # free the engine's GPU memory before training
        import gc

        import torch

        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return graded
