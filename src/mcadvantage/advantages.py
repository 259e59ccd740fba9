"""Advantage math for Monte Carlo credit assignment (pure functions, no I/O).

VinePPO (arXiv 2410.01679, section 3) uses gamma = lambda = 1, so the advantage of reasoning step
``i`` is the change in estimated value it causes, ``A_i = V(S_i) - V(S_{i-1})``, with the terminal
value ``V(S_n) = R`` (the response's own reward). Every token of step ``i`` carries ``A_i``; the
per-token advantages are then whitened over all tokens of the batch (and of all data-parallel ranks).

These functions are written by hand because neither TRL nor transformers exposes step-level
advantages: TRL's GRPO computes one scalar advantage per completion inside its trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["step_advantages", "token_advantages", "masked_whiten", "check_boundaries"]


def step_advantages(values: Sequence[float]) -> list[float]:
    """Step advantages from state values.

    Args:
        values: ``[V(S_0), ..., V(S_{n-1}), R]``: the estimated value before each of the ``n`` steps,
            followed by the response's own reward ``R = V(S_n)``.

    Returns:
        ``[A_1, ..., A_n]`` with ``A_i = values[i] - values[i-1]``. Their sum telescopes to
        ``R - V(S_0)``. ``values == [R]`` (an empty completion, no step) gives ``[]``.

    Raises:
        ValueError: if ``values`` is empty (the reward ``R`` is always needed).
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError(
            "step_advantages(values=[]): values must hold at least the final reward R, i.e. "
            "[V(S_0), ..., V(S_{n-1}), R]."
        )
    return [vals[i] - vals[i - 1] for i in range(1, len(vals))]


def check_boundaries(
    boundaries: Sequence[int], length: int | None = None, *, name: str = "boundaries"
) -> None:
    """Validate step boundaries ``0 = b_0 < b_1 < ... < b_n`` (and ``b_n == length`` when given).

    Raises:
        ValueError: naming ``name``, the offending value and the expected form.
    """
    b = list(boundaries)
    if not b or b[0] != 0:
        raise ValueError(
            f"{name}={b!r} must start with 0: step boundaries are token indices 0 = b_0 < b_1 < ... < b_n "
            "(use segmenters.step_token_boundaries to compute them)."
        )
    for i in range(1, len(b)):
        if b[i] <= b[i - 1]:
            raise ValueError(
                f"{name}={b!r} is not strictly increasing at position {i} ({b[i - 1]} -> {b[i]}): "
                "every step must own at least one token (merge empty steps)."
            )
    if length is not None and b[-1] != length:
        raise ValueError(
            f"{name}={b!r} must end at the completion length {length} (b_n = len(completion_ids)); "
            f"got b_n = {b[-1]}."
        )


def token_advantages(
    step_advs: Sequence[float], boundaries: Sequence[int], length: int | None = None
) -> torch.Tensor:
    """Spread step advantages over tokens.

    Args:
        step_advs: ``[A_1, ..., A_n]``.
        boundaries: ``[0 = b_0 < ... < b_n]`` (``n + 1`` entries); step ``i`` covers tokens
            ``b_{i-1} .. b_i - 1`` (the EOS token, being the last token, belongs to the last step).
        length: output length (e.g. the padded completion length). Defaults to ``b_n``; tokens
            ``b_n .. length - 1`` (padding) get advantage 0.

    Returns:
        A float32 tensor of shape ``(length,)``.

    Raises:
        ValueError: if the boundaries are malformed, their count does not match ``step_advs``, or
            ``length < b_n``.
    """
    check_boundaries(boundaries, name="boundaries")
    if len(boundaries) != len(step_advs) + 1:
        raise ValueError(
            f"token_advantages: got {len(step_advs)} step advantages but boundaries={list(boundaries)!r} "
            f"describe {len(boundaries) - 1} steps; pass n advantages and n + 1 boundaries."
        )
    end = int(boundaries[-1])
    if length is None:
        length = end
    if length < end:
        raise ValueError(
            f"token_advantages(length={length}) is shorter than the last boundary b_n={end}; pass "
            "length >= b_n (tokens past b_n are padding and get 0)."
        )
    out = torch.zeros(length, dtype=torch.float32)
    for i, adv in enumerate(step_advs):
        out[int(boundaries[i]) : int(boundaries[i + 1])] = float(adv)
    return out


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    group: Any = None,
    unbiased: bool = True,
) -> torch.Tensor:
    """Whiten ``values`` to zero mean and unit variance over the tokens where ``mask`` is set.

    The statistics are token-weighted (every unmasked token counts once, so long responses weigh
    more), as in TRL's ``masked_whiten`` and the official VinePPO code. When ``torch.distributed``
    is initialised, the token count, sum and sum of squares are all-reduced over ``group`` (the
    default process group when ``None``), so every rank whitens with the statistics of the
    concatenated data of all ranks. The variance is unbiased (Bessel-corrected, divided by
    ``count - 1``) by default, as TRL's ``masked_var``; pass ``unbiased=False`` for the biased one.

    Args:
        values: any shape.
        mask: same shape; truthy entries are real tokens.
        shift_mean: when False, the result keeps the original mean (``(v - mean) / std + mean``,
            TRL's convention) instead of being centred.
        eps: added to the variance before the square root.
        group: process group for the all-reduce (``None`` = default group when initialised).
        unbiased: Bessel correction of the variance (needs at least 2 tokens overall).

    Returns:
        A tensor like ``values`` (float) with masked-out entries set to 0.

    Raises:
        ValueError: on a shape mismatch, or when there are no unmasked tokens (or only one with
            ``unbiased=True``) across all ranks.
    """
    if values.shape != mask.shape:
        raise ValueError(
            f"masked_whiten: values.shape={tuple(values.shape)} and mask.shape={tuple(mask.shape)} differ; "
            "pass a mask with one entry per value."
        )
    m = mask.to(dtype=torch.bool)
    # Accumulate in float64: sums of squares over a large batch lose precision in float32.
    v = values.to(torch.float64)
    mf = m.to(torch.float64)
    stats = torch.stack([mf.sum(), (v * mf).sum(), (v * v * mf).sum()])
    if _dist_ready():
        # One all-reduce of (count, sum, sum of squares) gives the global token-weighted moments.
        stats = stats.to(_collective_device(group))
        torch.distributed.all_reduce(stats, op=torch.distributed.ReduceOp.SUM, group=group)
        stats = stats.to(v.device)
    count, total, total_sq = stats[0], stats[1], stats[2]
    n = float(count)
    if n < (2 if unbiased else 1):
        raise ValueError(
            f"masked_whiten: {int(n)} unmasked token(s) across all ranks; the "
            f"{'unbiased' if unbiased else 'biased'} variance needs at least {2 if unbiased else 1}. "
            "Check the mask (or pass unbiased=False for a single token)."
        )
    mean = total / count
    # E[v^2] - E[v]^2 can dip below 0 by rounding; clamp before the square root.
    var = torch.clamp(total_sq / count - mean * mean, min=0.0)
    if unbiased:
        var = var * (count / (count - 1))
    whitened = (v - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    whitened = torch.where(m, whitened, torch.zeros_like(whitened))
    out_dtype = values.dtype if values.is_floating_point() else torch.float32
    return whitened.to(out_dtype)


def _collective_device(group: Any) -> torch.device:
    """NCCL collectives need CUDA tensors; gloo (and others) take CPU tensors."""
    backend = torch.distributed.get_backend(group)
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
