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

__all__ = [
    "step_advantages",
    "token_advantages",
    "masked_whiten",
    "check_boundaries",
    "gae_advantages",
    "clipped_value_loss",
    "loss_token_mask",
]


def loss_token_mask(completion_mask: torch.Tensor, tool_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The completion tokens that enter the policy loss: ``completion_mask * tool_mask`` as TRL's ``GRPOTrainer``
    computes it (``tool_mask`` is 0 on the tokens of tool results and environment responses that a multi-turn
    episode appends inside the completion: the model did not choose them). Without a ``tool_mask``, the
    completion mask itself. Same dtype as ``completion_mask``."""
    if tool_mask is None:
        return completion_mask
    if tool_mask.shape != completion_mask.shape:
        raise ValueError(
            f"loss_token_mask: tool_mask {tuple(tool_mask.shape)} must have completion_mask's shape "
            f"{tuple(completion_mask.shape)} (one entry per completion token)."
        )
    return completion_mask * tool_mask.to(device=completion_mask.device, dtype=completion_mask.dtype)


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
            "(use mcadvantage.step_token_boundaries to compute them)."
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


def gae_advantages(
    values: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) for responses rewarded at their end, as PPO's
    critic baseline uses it (the paper's Appendix A.2, with the paper's gamma = lambda = 1 by default).

    Token ``t`` of a response is the action taken in state ``s_t`` (the prompt and tokens ``< t``); the only reward
    is the response's ``R`` after its last token. With ``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)`` (``r_t = R`` on
    the last token, else 0, and no value after the last token) the advantage is
    ``A_t = sum_l (gamma lambda)^l delta_{t+l}`` and the return (the value target) ``A_t + V(s_t)``. With
    ``gamma = lambda = 1``: ``A_t = R - V(s_t)``.

    Args:
        values: ``(B, T)`` critic values ``V(s_t)``.
        rewards: ``(B,)`` the responses' rewards.
        mask: ``(B, T)`` completion mask; each row's ones must come first (right padding).
        gamma: the discount, in ``[0, 1]``.
        lam: the GAE parameter, in ``[0, 1]``.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` float32, zero on padding.

    Written by hand: TRL 1.16 no longer ships PPO, and its GAE lived inside the removed trainer.
    """
    if values.shape != mask.shape or rewards.shape != values.shape[:1]:
        raise ValueError(
            f"gae_advantages: values {tuple(values.shape)}, mask {tuple(mask.shape)} and rewards "
            f"{tuple(rewards.shape)} must be (B, T), (B, T) and (B,)."
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae_advantages: gamma={gamma} and lam={lam} must lie in [0, 1].")
    m = mask.to(torch.float64)
    v = values.to(torch.float64) * m
    lengths = m.sum(dim=1).long()
    batch, width = v.shape
    rows = torch.arange(batch)
    # Reward on each row's last token; the value after the last token is 0 (the episode has ended).
    r = torch.zeros_like(v)
    has_tokens = lengths > 0
    r[rows[has_tokens], lengths[has_tokens] - 1] = rewards.to(torch.float64)[has_tokens]
    next_v = torch.cat([v[:, 1:], torch.zeros(batch, 1, dtype=v.dtype)], dim=1) * torch.cat(
        [m[:, 1:], torch.zeros(batch, 1, dtype=v.dtype)], dim=1
    )
    delta = (r + gamma * next_v - v) * m
    adv = torch.zeros_like(v)
    running = torch.zeros(batch, dtype=v.dtype)
    for t in range(width - 1, -1, -1):
        running = delta[:, t] + gamma * lam * running * m[:, t]
        adv[:, t] = running
    adv = adv * m
    return adv.float(), ((adv + v) * m).float()


def clipped_value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float = 0.2,
) -> torch.Tensor:
    """PPO's clipped value loss: ``0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)``, averaged over
    the tokens where ``mask`` is set (the paper's Appendix A.1, value clip 0.2)."""
    m = mask.to(new_values.dtype)
    clipped = old_values + torch.clamp(new_values - old_values, -clip, clip)
    per_token = 0.5 * torch.maximum((new_values - returns) ** 2, (clipped - returns) ** 2)
    return (per_token * m).sum() / m.sum().clamp(min=1.0)


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
