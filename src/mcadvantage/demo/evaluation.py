"""Held-out evaluation for the demo: greedy (or sampled) decoding with transformers, graded by a
verifier (``GSM8KVerifier`` in the demo)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from mcadvantage.demo.task import ArithmeticProblem

__all__ = ["generate_responses", "evaluate_accuracy"]


@torch.no_grad()
def generate_responses(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 64,
    batch_size: int = 256,
    do_sample: bool = False,
    temperature: float = 1.0,
) -> list[str]:
    """Decode a response for every prompt (left-padded batches; greedy unless ``do_sample``)."""
    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only generation continues from the right edge
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            chunk = list(prompts[i : i + batch_size])
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            kwargs: dict[str, Any] = {"do_sample": do_sample}
            if do_sample:
                kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **kwargs,
            )
            completions = gen[:, enc["input_ids"].shape[1] :]
            out.extend(tokenizer.batch_decode(completions, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)
    return out


def evaluate_accuracy(
    model: Any,
    tokenizer: Any,
    problems: Sequence[ArithmeticProblem],
    grade: Callable[[str, str], float],
    *,
    max_new_tokens: int = 64,
    batch_size: int = 256,
) -> tuple[float, list[str], list[float]]:
    """Greedy accuracy on ``problems``: the mean of ``grade(response, gold_answer)``. Returns the
    accuracy, the responses and their scores."""
    if not problems:
        raise ValueError("evaluate_accuracy: problems is empty; pass at least one problem.")
    responses = generate_responses(
        model, tokenizer, [p.prompt for p in problems], max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    scores = [grade(r, p.answer) for r, p in zip(responses, problems, strict=True)]
    return sum(scores) / len(scores), responses, scores
