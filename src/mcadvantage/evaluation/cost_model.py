"""The cost model of the gradient measurements: a batch costs ``generated + r * trained`` tokens, in generated-token
units, where ``r`` is a training token's cost in generated tokens.

:func:`cost_model_tokens` applies it; :func:`measure_cost_ratio` measures ``r`` for a model on this machine
(transformers ``generate`` against a forward and backward pass). Used by
:mod:`mcadvantage.evaluation.gradient_quality` and the benchmarks to compare estimators at equal cost.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["cost_model_tokens", "measure_cost_ratio"]


def cost_model_tokens(
    sampled_tokens: float, trained_tokens: float, cost_ratio: float, *, epochs: int = 1
) -> float:
    """Cost in generated-token units: ``sampled + r * trained * epochs`` (``r``: a training token's cost in
    generated tokens, e.g. from :func:`measure_cost_ratio`; ``epochs``: PPO epochs per batch, ``num_iterations``)."""
    if cost_ratio < 0 or epochs < 1:
        raise ValueError(f"cost_model_tokens: cost_ratio={cost_ratio} must be >= 0 and epochs={epochs} >= 1.")
    return float(sampled_tokens) + cost_ratio * float(trained_tokens) * epochs


def measure_cost_ratio(
    model: Any,
    *,
    prompt_tokens: int = 16,
    new_tokens: int = 48,
    batch: int = 32,
    repeats: int = 3,
    seed: int = 0,
) -> dict[str, float]:
    """Measure ``r``: seconds per trained token (forward + backward over prompt + completion, as the loss does)
    over seconds per generated token (transformers ``generate``, sampling), for ``model`` on this machine.

    Returns ``{"cost_ratio", "generate_seconds_per_token", "train_seconds_per_token", "repeats"}`` (medians over
    ``repeats``). With vLLM the generation side is much cheaper per token, so ``r`` is larger: measure it there or
    set it by hand.
    """
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    prompt = torch.randint(3, vocab, (batch, prompt_tokens), device=device)
    gen_times, train_times = [], []
    was_training = model.training
    for _ in range(repeats):
        model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                pad_token_id=int(getattr(model.config, "pad_token_id", None) or 0),
            )
        gen_times.append((time.perf_counter() - t0) / (batch * new_tokens))
        model.train()
        t0 = time.perf_counter()
        logits = model(input_ids=out).logits
        loss = torch.log_softmax(logits.float(), dim=-1)[:, prompt_tokens - 1 : -1].mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        train_times.append((time.perf_counter() - t0) / (batch * new_tokens))
    model.train(was_training)
    gen, train = sorted(gen_times)[len(gen_times) // 2], sorted(train_times)[len(train_times) // 2]
    return {
        "cost_ratio": train / gen,
        "generate_seconds_per_token": gen,
        "train_seconds_per_token": train,
        "repeats": float(repeats),
    }
