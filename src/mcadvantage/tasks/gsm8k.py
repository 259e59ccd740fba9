"""GSM8K: its step segmenter, its answer parsing and its verifier (``"gsm8k"`` for both registries).

* :class:`GSM8KSegmenter` -- one step per line (paper Appendix B); the final ``#### N`` answer line joins the
  step before it. Built on :class:`~mcadvantage.tasks.newline.NewlineSegmenter`.
* :func:`extract_gsm8k_answer` -- the number after the last ``####``, as an exact fraction.
* :class:`GSM8KVerifier` -- that number must equal the gold number exactly; pure regular expressions, no
  worker process.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from mcadvantage.tasks.newline import NewlineSegmenter
from mcadvantage.tasks.segmentation import SEGMENTER_NAMES
from mcadvantage.tasks.verifier import _MAX_NUMBER_CHARS, _VERIFIERS, _VerifierBase

logger = logging.getLogger(__name__)

__all__ = ["GSM8KSegmenter", "GSM8KVerifier", "extract_gsm8k_answer"]


# --------------------------------------------------------------------------------------------------
# Segmenter
# --------------------------------------------------------------------------------------------------


class GSM8KSegmenter(NewlineSegmenter):
    """GSM8K steps (paper Appendix B): one step per line, the ``#### N`` answer line joins the step
    before it, blank lines merge forward into the next step.

    Difference from the official VinePPO code (McGill-NLP/VinePPO, ``split_solution_into_
    intermediate_steps`` of the GSM8K task), which splits on ``"\\n"`` and keeps each newline at the
    *start* of the following step: by default the newline here *ends* the line's own step, so a
    value state ``S_i`` ends just after a newline rather than just before one.
    ``newline_placement="start"`` reproduces the official placement. The official code also makes
    every blank line a step of its own (``"\\n"``), which gets a value estimate but carries no
    reasoning; here blank lines always merge into the next step. With ``newline_placement="start"``
    the step lists equal the official ones on 8,786 of the 8,792 GSM8K train+test reference answers
    (the other 6 have a blank line); with the default they have the same cut points on all 8,792 once
    whitespace is ignored (``benchmarks/segmenter_fidelity.py``).

    Args:
        max_steps: cap on the number of steps (the official code estimated values for the first 25
            steps only); the tail is merged into the last allowed step. ``None`` means no cap.
        answer_marker: prefix of the final-answer line (``"####"`` in GSM8K).
        newline_placement: ``"end"`` (default, ``["a\\n", "b\\n#### 5"]``) or ``"start"`` (official,
            ``["a", "\\nb\\n#### 5"]``); see :class:`NewlineSegmenter`.
    """

    def __init__(
        self, max_steps: int | None = None, *, answer_marker: str = "####", newline_placement: str = "end"
    ) -> None:
        super().__init__(max_steps, newline_placement=newline_placement)
        if not isinstance(answer_marker, str) or not answer_marker.strip():
            raise ValueError(
                f"answer_marker must be a non-empty string such as '####', got {answer_marker!r}"
            )
        self.answer_marker = answer_marker

    def __repr__(self) -> str:
        return (
            f"GSM8KSegmenter(max_steps={self.max_steps!r}, answer_marker={self.answer_marker!r}"
            f"{self._placement_repr()})"
        )


# --------------------------------------------------------------------------------------------------
# Answers and verifier
# --------------------------------------------------------------------------------------------------


# A number: optional sign (ASCII or Unicode minus), digits with optional thousands commas and a
# decimal part, or a bare decimal part. A trailing period is not consumed ("18." -> 18).
_NUMBER = r"[-+\u2212]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_BARE_NUMBER_RE = re.compile(r"\$?\s*(" + _NUMBER + r")\s*\.?")


def _to_fraction(number: str) -> Fraction | None:
    digits = number.replace(",", "").replace("\u2212", "-")
    if len(digits) > _MAX_NUMBER_CHARS:
        return None
    try:
        return Fraction(digits)
    except (ValueError, ZeroDivisionError):
        return None


def extract_gsm8k_answer(text: str) -> Fraction | None:
    """The first number after the last ``####`` in ``text``, as an exact fraction, or ``None``.

    Tolerates ``$``, thousands commas, a trailing period and whitespace (``"#### $1,000."`` -> 1000).
    Only the rest of the line after ``####`` is searched, so a number further down never counts.
    """
    at = text.rfind("####")
    if at < 0:
        return None
    line = text[at + 4 :].lstrip().split("\n", 1)[0]
    match = _NUMBER_RE.search(line)
    return _to_fraction(match.group(0)) if match else None


def _gsm8k_gold(gold: Any) -> Fraction | None:
    if isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return Fraction(gold)
    if isinstance(gold, float):
        return Fraction(repr(gold)) if gold == gold and abs(gold) != float("inf") else None
    if not isinstance(gold, str):
        return None
    if "####" in gold:  # a full reference solution "...\n#### 72"
        return extract_gsm8k_answer(gold)
    match = _BARE_NUMBER_RE.fullmatch(gold.strip())
    return _to_fraction(match.group(1)) if match else None


class GSM8KVerifier(_VerifierBase):
    """GSM8K grader: the number after the last ``####`` must equal the gold number exactly.

    The gold may be a bare number (``"72"``, ``"1,000"``) or a full GSM8K reference solution ending in
    ``#### N``. Comparison is exact (``Fraction``), so ``"5.0"`` equals ``5`` but ``4.9999`` does not.
    A response without ``####`` scores 0.0 (the paper's format requirement).

    Args:
        answer_field: dataset column holding the gold answer (default ``"answer"``).
    """

    def __init__(self, answer_field: str = "answer") -> None:
        if not isinstance(answer_field, str) or not answer_field:
            raise ValueError(f"answer_field must be a non-empty column name, got {answer_field!r}.")
        self.answer_field = answer_field
        self.__name__ = "gsm8k_verifier"

    def score_batch(self, responses: Sequence[str | None], golds: Sequence[Any]) -> list[float]:
        """Rewards for ``responses[i]`` against ``golds[i]``."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers; pass one each.")
        rewards = []
        for response, gold in zip(responses, golds, strict=True):
            target = _gsm8k_gold(gold)
            if target is None:
                logger.warning("GSM8KVerifier: gold answer %r has no number; scoring 0.0", gold)
            pred = extract_gsm8k_answer(response) if isinstance(response, str) else None
            rewards.append(1.0 if pred is not None and pred == target else 0.0)
        return rewards


SEGMENTER_NAMES["gsm8k"] = GSM8KSegmenter
_VERIFIERS["gsm8k"] = GSM8KVerifier
