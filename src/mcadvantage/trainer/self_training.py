"""The paper's RL-free baselines on our samplers and verifiers: RestEM and DPO+ (DPO-Positive) data.

Both start by sampling responses from the current policy and grading them with a verifier; they differ in
what they train on, and the training itself is TRL's (``trl.SFTTrainer``, ``trl.DPOTrainer``):

- **RestEM** (Singh et al., 2024): keep the verified-correct responses and fine-tune on them
  (:func:`restem_examples`). Maximum likelihood on correct responses is REINFORCE without a baseline on a
  0/1 reward: the whole response is one action, no credit assignment.
- **DPO+** (DPO-Positive, Pal et al., 2024): pairs of a correct (chosen) and an incorrect (rejected)
  response to the same prompt (:func:`preference_pairs`), trained with DPO plus a term that keeps the
  chosen response likely.

Sampling and grading (:func:`sample_and_grade`) go through the library's :class:`~mcadvantage.Sampler`
protocol (transformers, colocated vLLM or a vLLM server) and any TRL-style reward function, so the
baselines see exactly the policy samples and rewards VinePPO sees. Pairing and filtering are small pure
functions, tested by hand.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GradedPrompt", "preference_pairs", "restem_examples", "sample_and_grade"]


@dataclass
class GradedPrompt:
    """The responses sampled for one prompt and their rewards (``rewards[i]`` grades ``completions[i]``);
    ``extra`` holds the prompt's dataset columns (e.g. ``answer``)."""

    prompt: str
    completions: list[str]
    rewards: list[float]
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.rewards):
            raise ValueError(
                f"GradedPrompt: {len(self.completions)} completions but {len(self.rewards)} rewards; pass one each."
            )


def _check_threshold(name: str, threshold: float) -> None:
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"{name}: correct_threshold must be in (0, 1], got {threshold}.")


def restem_examples(
    graded: Sequence[GradedPrompt],
    *,
    correct_threshold: float = 1.0,
    max_per_prompt: int | None = None,
    deduplicate: bool = True,
) -> list[dict[str, str]]:
    """RestEM's training set: ``{"prompt", "completion"}`` rows of the responses whose reward is at least
    ``correct_threshold``, in sampling order.

    ``deduplicate`` drops repeats of the same completion for the same prompt (a low-temperature policy
    repeats itself, and RestEM would otherwise weight those answers by how often they were sampled);
    ``max_per_prompt`` caps the rows per prompt (the paper's sweep tried fewer correct responses per
    question to reduce overfitting).
    """
    _check_threshold("restem_examples", correct_threshold)
    if max_per_prompt is not None and max_per_prompt < 1:
        raise ValueError(f"restem_examples: max_per_prompt must be >= 1 or None, got {max_per_prompt}.")
    rows: list[dict[str, str]] = []
    for g in graded:
        seen: set[str] = set()
        kept = 0
        for completion, reward in zip(g.completions, g.rewards, strict=True):
            if reward < correct_threshold or (deduplicate and completion in seen):
                continue
            seen.add(completion)
            rows.append({"prompt": g.prompt, "completion": completion})
            kept += 1
            if max_per_prompt is not None and kept >= max_per_prompt:
                break
    return rows


def preference_pairs(
    graded: Sequence[GradedPrompt],
    *,
    pairs_per_prompt: int,
    correct_threshold: float = 1.0,
    seed: int = 0,
) -> list[dict[str, str]]:
    """DPO+'s training set: ``{"prompt", "chosen", "rejected"}`` rows, each a correct and an incorrect
    response to the same prompt.

    Per prompt, up to ``pairs_per_prompt`` distinct (correct, incorrect) pairs are drawn uniformly without
    replacement from all such pairs (the paper: 64 responses, 64 pairs per prompt); a prompt whose
    responses are all correct or all incorrect gives no pair. Deterministic in ``seed``.
    """
    _check_threshold("preference_pairs", correct_threshold)
    if pairs_per_prompt < 1:
        raise ValueError(f"preference_pairs: pairs_per_prompt must be >= 1, got {pairs_per_prompt}.")
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    for g in graded:
        good = list(
            dict.fromkeys(c for c, r in zip(g.completions, g.rewards, strict=True) if r >= correct_threshold)
        )
        bad = list(
            dict.fromkeys(c for c, r in zip(g.completions, g.rewards, strict=True) if r < correct_threshold)
        )
        total = len(good) * len(bad)
        if total == 0:
            continue
        # Sample pair indices, not the pairs themselves: 64 x 64 candidates need not be built to pick 64.
        for index in rng.sample(range(total), min(pairs_per_prompt, total)):
            chosen, rejected = good[index // len(bad)], bad[index % len(bad)]
            rows.append({"prompt": g.prompt, "chosen": chosen, "rejected": rejected})
    return rows


def grade_completions(
    reward_func: Callable[..., list[float]], prompt: Any, completions: list[str], fields: Mapping[str, Any]
) -> list[float]:
    """Rewards of ``completions`` to one ``prompt``: calls a TRL-style reward function with the prompt and each
    dataset column (``fields``) repeated once per completion, as TRL passes them."""
    n = len(completions)
    rewards = reward_func(
        prompts=[prompt] * n, completions=completions, **{k: [v] * n for k, v in fields.items()}
    )
    return [float(r) for r in rewards]


def sample_and_grade(
    sampler: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    reward_func: Callable[..., list[float]],
    *,
    num_samples: int,
    max_new_tokens: int,
) -> list[GradedPrompt]:
    """Sample ``num_samples`` responses per row (``row["prompt"]`` is the text prompt; the other columns are
    passed to ``reward_func`` as keyword lists, as TRL passes dataset columns) with a
    :class:`~mcadvantage.Sampler`, and grade them. Returns one :class:`GradedPrompt` per row, in order."""
    from mcadvantage.core.text import decode_batch
    from mcadvantage.samplers.base import RolloutRequest

    if num_samples < 1:
        raise ValueError(f"sample_and_grade: num_samples must be >= 1, got {num_samples}.")
    if max_new_tokens < 1:
        raise ValueError(f"sample_and_grade: max_new_tokens must be >= 1, got {max_new_tokens}.")
    for i, row in enumerate(rows):
        if not isinstance(row.get("prompt"), str):
            raise ValueError(
                f"sample_and_grade: row {i} needs a text 'prompt' column, got {row.get('prompt')!r}."
            )
    requests = [
        RolloutRequest(
            tuple(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]),
            num_samples,
            max_new_tokens,
        )
        for row in rows
    ]
    continuations = sampler.sample(requests)
    graded: list[GradedPrompt] = []
    for row, conts in zip(rows, continuations, strict=True):
        texts = decode_batch(tokenizer, [list(c.token_ids) for c in conts])
        extra = {k: v for k, v in row.items() if k != "prompt"}
        graded.append(
            GradedPrompt(
                row["prompt"], texts, grade_completions(reward_func, row["prompt"], texts, extra), extra
            )
        )
    return graded
