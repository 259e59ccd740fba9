"""The exact toy gradient task: the gradient instrument's toy with a closed-form true gradient, used by the tests of
the estimators and the instrument and by ``python benchmarks/gradient_quality.py --tasks toy``.

Built from the public fakes of :mod:`mcadvantage.testing` (:class:`~mcadvantage.testing.TabularStepPolicy`, the
character tokenizer, :class:`~mcadvantage.testing.OutcomeReward`) and the instrument's
:class:`~mcadvantage.evaluation.gradient_instrument.GradientTask`; kept beside the package, not in it, so the
package's test helpers need nothing from its evaluation code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcadvantage.testing import OutcomeReward, TabularStepPolicy, build_char_tokenizer

__all__ = ["TOY_LOGITS", "characters", "toy_gradient_task"]


def characters(text: str) -> list[str]:
    """One step per character: the segmenter of the toys, whose steps are one token each."""
    return list(text) or [text]


#: The toys' logits (3 positions x 3 step tokens): no step is uniform, so the exact gradient has no zero coordinate.
TOY_LOGITS = [[0.4, -0.2, 0.1], [-0.3, 0.5, 0.0], [0.2, 0.2, -0.6]]


def toy_gradient_task(pass_rates: Sequence[float], *, seed: int = 0, prompts: int = 64) -> tuple[Any, Any]:
    """An exact-toy :class:`~mcadvantage.evaluation.gradient_instrument.GradientTask` and its policy: ``TabularStepPolicy`` with 3
    one-token steps (``a``/``b``/``c``), success with probability ``pass_rates[(2 * step_0 + step_1) % 4]`` (the
    third step is harmless variation), ``prompts`` distinct prompts, the character tokenizer, ``OutcomeReward("Y")``."""
    from mcadvantage.evaluation.gradient_instrument import GradientTask

    tok = build_char_tokenizer()

    def tid(ch: str) -> int:
        return tok(ch, add_special_tokens=False)["input_ids"][0]

    rates = list(pass_rates)
    policy = TabularStepPolicy(
        step_token_ids=[tid(c) for c in "abc"],
        depth=3,
        success_prob=lambda steps: rates[(2 * steps[0] + steps[1]) % 4],
        success_token_id=tid("Y"),
        failure_token_id=tid("N"),
        eos_token_id=tok.eos_token_id,
        logits=TOY_LOGITS,
        seed=seed,
    )
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    texts = [f"{a}{b}:" for a in letters for b in letters][:prompts]
    task = GradientTask(
        oracle=policy,
        sampler=policy,
        prompt_ids=[tok(t, add_special_tokens=False)["input_ids"] for t in texts],
        prompts=texts,
        rows=[{} for _ in texts],
        reward_funcs=[OutcomeReward("Y")],
        tokenizer=tok,
        segmenter=characters,
        max_completion_length=8,
    )
    return task, policy
