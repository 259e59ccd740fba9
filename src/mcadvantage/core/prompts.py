"""Prompt-length checks shared by the trainer, the evaluation and the examples.

TRL 1.16 does not truncate prompts, so a prompt that leaves no room for a full-length response (or a full
fixed-budget Monte Carlo rollout) in the model's context would make generation run past the context mid-training.
The trainer refuses such datasets at init (:func:`check_prompt_lengths`); the examples drop such problems first
(:func:`filter_long_prompts`). Both measure prompts the same way and compare against :func:`context_length`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["check_prompt_fits", "check_prompt_lengths", "context_length", "filter_long_prompts"]

logger = logging.getLogger(__name__)


def context_length(model_config: Any, vllm_max_model_length: int | None = None) -> int | None:
    """Longest prompt + response the policy can take: ``max_position_embeddings`` of the (text) config, capped
    by a vLLM engine's ``max_model_len`` when one is given; None when neither is known.

    Args:
        model_config: a transformers ``PretrainedConfig`` (multimodal configs use their text config).
        vllm_max_model_length: ``VinePPOConfig.vllm_max_model_length`` when vLLM generates, else None.
    """
    limits = []
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    max_positions = getattr(text_config, "max_position_embeddings", None)
    if isinstance(max_positions, int) and max_positions > 0:
        limits.append(max_positions)
    if vllm_max_model_length:
        limits.append(int(vllm_max_model_length))
    return min(limits) if limits else None


def check_prompt_fits(
    prompt_length: int, context: int, room: int, *, where: str, room_name: str = ""
) -> None:
    """Raise ``ValueError`` when a ``prompt_length``-token prompt plus ``room`` completion tokens exceed
    ``context``, naming the row, the numbers and the fix."""
    if prompt_length + room <= context:
        return
    budget = room_name or "max_completion_length / mc_fixed_rollout_budget"
    raise ValueError(
        f"The prompt of {where} has {prompt_length} tokens; with {budget}={room} a response needs "
        f"{prompt_length + room} positions but the model's context is {context} (max_position_embeddings, or "
        "vllm_max_model_length with vLLM). Shorten or drop long prompts (mcadvantage.core.prompts.filter_long_prompts), "
        f"or lower {budget} to at most {context - prompt_length}."
    )


def check_prompt_lengths(
    dataset: Any,
    tokenize: Callable[[list[Any]], Sequence[Sequence[int]]],
    *,
    context: int | None,
    room: int,
    dataset_name: str,
    room_name: str = "",
    chunk: int = 256,
    route_column: str | None = None,
    routes: Sequence[Any] | None = None,
) -> None:
    """Check every prompt of a sized dataset (iterable datasets are checked batch by batch during training).

    Args:
        tokenize: prompts -> token ids, exactly as the trainer tokenises them (chat template included); with
            ``route_column``, ``tokenize(prompts, routes)``.
        route_column: a column whose value per row ``tokenize`` also needs (e.g. ``"environment"``: each row's
            prompt is rendered with its own environment's tools). A dataset without a ``prompt`` column (an
            environment supplies the prompt at ``reset``, so its length is known only then) is not checked.
        routes: with ``route_column``, the values ``tokenize`` knows (the environments' names); a row naming
            another is left unchecked here: ``GRPOTrainer`` refuses it at ``train()``, in its own words, and so
            does ``VinePPOTrainer`` (it fails where the same script fails with ``GRPOTrainer``).
    """
    if dataset is None or context is None or not hasattr(dataset, "__len__"):
        return
    if "prompt" not in (getattr(dataset, "column_names", None) or ["prompt"]):
        return
    for start in range(0, len(dataset), chunk):
        rows = dataset[start : start + chunk]
        prompts = list(rows["prompt"])
        offsets = list(range(len(prompts)))
        if route_column is None:
            ids_list = tokenize(prompts)
        else:
            names = list(rows[route_column])
            if routes is not None:
                offsets = [i for i in offsets if names[i] in routes]
            ids_list = tokenize([prompts[i] for i in offsets], [names[i] for i in offsets]) if offsets else []
        for offset, ids in zip(offsets, ids_list, strict=True):
            check_prompt_fits(
                len(ids), context, room, where=f"{dataset_name} row {start + offset}", room_name=room_name
            )


def filter_long_prompts(
    dataset: Any,
    tokenizer: Any,
    max_prompt_tokens: int,
    *,
    tokenize: Callable[[list[Any]], Sequence[Sequence[int]]] | None = None,
) -> Any:
    """Drop the rows of a ``datasets.Dataset`` whose ``prompt`` is longer than ``max_prompt_tokens`` tokens,
    logging how many were dropped.

    Args:
        tokenizer: the policy's tokenizer (plain-text prompts are tokenised with it).
        max_prompt_tokens: usually ``context_length(...) - max_completion_length``.
        tokenize: prompts -> token ids, to measure chat-formatted prompts exactly as the trainer will.
    Raises:
        ValueError: ``max_prompt_tokens < 1``, or no row is left.
    """
    if max_prompt_tokens < 1:
        raise ValueError(
            f"max_prompt_tokens={max_prompt_tokens}: the model's context leaves no room for a prompt next to a "
            "max_completion_length-token response. Lower max_completion_length."
        )
    measure = tokenize or (lambda prompts: tokenizer(text=list(prompts))["input_ids"])
    keep = dataset.map(
        lambda batch: {
            "_mcadvantage_fits": [len(ids) <= max_prompt_tokens for ids in measure(batch["prompt"])]
        },
        batched=True,
        desc="Measuring prompt lengths",
    )
    before = len(keep)
    keep = keep.filter(lambda row: row["_mcadvantage_fits"]).remove_columns("_mcadvantage_fits")
    if len(keep) < before:
        logger.warning(
            "Dropped %d of %d problems whose prompt exceeds %d tokens.",
            before - len(keep),
            before,
            max_prompt_tokens,
        )
    if len(keep) == 0:
        raise ValueError(
            f"Every prompt is longer than {max_prompt_tokens} tokens. Raise the model's context or lower "
            "max_completion_length."
        )
    return keep
