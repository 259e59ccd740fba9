"""Reasoning tasks: how a response splits into steps (segmenters) and how an answer is graded (verifiers), for
GSM8K, MATH and plain newline-separated steps; the grading process that keeps math-verify out of the trainer's
process. Nothing here imports TRL or torch (nor math-verify, until a MATH answer needs it).

Modules, lowest layer first (each imports only from modules listed before it, also inside functions):

* :mod:`~mcadvantage.tasks.segmentation` -- the :class:`StepSegmenter` protocol, :func:`get_segmenter` and its
  name registry, and the token alignment (:func:`step_token_boundaries`, :func:`segment_completion`);
* :mod:`~mcadvantage.tasks.verifier` -- the :class:`Verifier` protocol, the TRL reward-function plumbing the
  verifiers share, :func:`get_verifier` and its name registry;
* :mod:`~mcadvantage.tasks.math_latex` -- LaTeX scanning for the MATH segmenter (math spans, cut points);
* :mod:`~mcadvantage.tasks.math_equivalence` -- when two MATH answers are equal (cheap in-process verdicts;
  math-verify under an eval guard, in the grading process only);
* :mod:`~mcadvantage.tasks.supervisor` -- inside the grading process: the supervisor loop and its grading
  children; :mod:`~mcadvantage.tasks._grading_worker` -- the grading process' entry point;
* :mod:`~mcadvantage.tasks.grading` -- the grading process from the caller's side (start, send, restart);
* the tasks: :mod:`~mcadvantage.tasks.newline`, :mod:`~mcadvantage.tasks.gsm8k` (segmenter, answer parsing,
  verifier), :mod:`~mcadvantage.tasks.math` (segmenter, answer extraction, verifier).

Each task module adds its segmenter and verifier to the registries of ``segmentation`` and ``verifier`` when
imported; this package imports them all (below), and Python runs it before any module in it, so
``get_segmenter("gsm8k")`` and ``get_verifier("math")`` work whichever module was imported first. The public
names of all modules are re-exported here.
"""

from mcadvantage.tasks.gsm8k import GSM8KSegmenter, GSM8KVerifier, extract_gsm8k_answer
from mcadvantage.tasks.math import MathSegmenter, MathVerifier, extract_boxed
from mcadvantage.tasks.math_latex import MathSpan, find_math_spans
from mcadvantage.tasks.newline import NewlineSegmenter
from mcadvantage.tasks.segmentation import (
    SEGMENTER_NAMES,
    StepSegmenter,
    get_segmenter,
    segment_completion,
    step_token_boundaries,
    token_char_offsets,
)
from mcadvantage.tasks.verifier import Verifier, completion_text, get_verifier

__all__ = [
    # segmentation
    "StepSegmenter",
    "GSM8KSegmenter",
    "MathSegmenter",
    "NewlineSegmenter",
    "get_segmenter",
    "segment_completion",
    "step_token_boundaries",
    "token_char_offsets",
    "find_math_spans",
    "MathSpan",
    "SEGMENTER_NAMES",
    # verification
    "Verifier",
    "GSM8KVerifier",
    "MathVerifier",
    "get_verifier",
    "completion_text",
    "extract_gsm8k_answer",
    "extract_boxed",
]
