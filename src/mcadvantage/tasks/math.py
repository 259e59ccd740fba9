"""MATH: its step segmenter, its answer extraction and its verifier (``"math"`` for both registries).

* :class:`MathSegmenter` -- the paper's Appendix B rules for LaTeX prose: cut at newlines and sentence ends,
  never inside math; long parts cut again at logical points; short parts merged (the LaTeX scanning it relies
  on is in :mod:`mcadvantage.tasks.math_latex`).
* :func:`extract_boxed` -- the content of the last brace-matched ``\\boxed{...}`` / ``\\fbox{...}``.
* :class:`MathVerifier` -- that content must be equivalent to the gold answer: cheap cases decided
  in-process, the rest by math-verify in a grading process with a time budget per answer
  (:mod:`mcadvantage.tasks.math_equivalence`, :mod:`mcadvantage.tasks.grading`); verdicts are cached.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from mcadvantage.tasks.grading import _GradingService, _service_for
from mcadvantage.tasks.math_equivalence import _BOX_COMMAND_RE, _quick_verdict
from mcadvantage.tasks.math_latex import MathSpan, _logical_cuts, find_math_spans
from mcadvantage.tasks.segmentation import SEGMENTER_NAMES, _cap_steps, _check_max_steps, _pieces
from mcadvantage.tasks.verifier import _VERIFIERS, _gold_column, _VerifierBase

__all__ = ["MathSegmenter", "MathVerifier", "extract_boxed"]


# --------------------------------------------------------------------------------------------------
# Segmenter
# --------------------------------------------------------------------------------------------------


# Words whose trailing period is not a sentence end.
_ABBREVIATIONS = frozenset(
    {"e.g", "i.e", "vs", "cf", "etc", "mr", "mrs", "ms", "dr", "fig", "eq", "approx", "resp"}
)
# Sentence end: ., ! or ? (repeats allowed), optional closing quotes/brackets, then horizontal
# whitespace and more text on the same line (a newline after it is handled by the newline rule).
_SENTENCE_END = re.compile(r"[.!?]+[\"')’”]*(?=[^\S\n]+\S)")
# A run of whitespace that contains newlines: the cut goes after its last newline.
_NEWLINE_RUN = re.compile(r"\n(?:[^\S\n]*\n)*")
# After inline math whose content ends with a period: optional closing quotes/brackets, then (as
# for prose) horizontal whitespace and more text on the line. The cut goes after the closers.
_INLINE_SENTENCE_TAIL = re.compile(r"[\"')’”]*(?=[^\S\n]+\S)")
# After display math whose content ends with a period: optional closers, then more text on the line,
# whitespace or not ("= 25.\\]This simplifies"). The lookahead needs a character that is not a
# closer, so that ")" right before a newline is never pushed to the start of the next step.
_DISPLAY_SENTENCE_TAIL = re.compile(r"[\"')’”]*(?=[^\S\n]*[^\s\"')’”])")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")


class MathSegmenter:
    """MATH steps (paper Appendix B, official rules reconstructed).

    1. Cut at natural boundaries outside math: after every newline (a run of blank lines stays with
       the line before it) and at sentence ends (``.``/``!``/``?`` followed by a space and more text;
       abbreviations such as ``e.g.`` excepted). A math span whose content ends with a period also
       ends a sentence, and the cut goes right after its closer (after any closing ``)``/quotes):

       * display math (``$$..$$``, ``\\[..\\]``, ``\\begin{..}..\\end{..}``) whenever more text
         follows on the line, with or without a space: ``= 25.\\]This simplifies`` and
         ``= 5.$$Multiplying`` are cut before ``This`` / ``Multiplying``. A display block is typeset
         on its own line, so the source needs no space there (MATH-500 has 300 such places; the
         official code cuts after ``.$$`` and ``.\\]`` too, but not after ``\\end{..}``);
       * inline math (``$..$``, ``\\(..\\)``) only when a space and more text follow
         (``$r = 3.$  Also``), as for a prose period: in running text ``$3.$5`` is no sentence end.
         The official code cuts after any ``.$`` or ``.\\)``, even before a ``)``.
    2. Never cut inside inline math (``$..$``, ``\\(..\\)``). Display math is never cut by rule 1
       either.
    3. A part longer than ``max_part_length`` characters is cut again at logical points, into as few
       balanced pieces as the limit needs, trying three levels in turn on the pieces still too long:
       (a) prose ``,``/``;``/``:`` and row breaks ``\\\\`` of *display* math; (b) prose `` and `` and
       top-level ``=`` in display math (cut before the relation, so the next piece reads
       ``= ...``); (c) top-level ``+`` and ``,`` in display math. "Top level" means outside braces,
       ``\\left..\\right`` pairs, round and square brackets and nested environments, so neither
       ``\\frac{a=b}{c}`` nor ``f(1, 2)`` nor a matrix is ever cut; the row layouts ``aligned``,
       ``alignedat``, ``gathered`` and ``split`` inside ``\\[..\\]`` count as top level, like the
       rows of a top-level ``align*``. Inline math is never cut, so a long inline formula stays one
       (long) step. This is how the paper's "split long math at ``=``" and "never split inside a
       math expression" are reconciled: a display block is only cut between whole sides of an
       equation chain. (The official code cuts at a raw ``,$``/``=``/``+`` wherever it is, inside
       brackets and inline math included.)
    4. Parts with fewer than ``min_part_length`` non-whitespace-stripped characters merge into the
       next part (a lead-in like ``"Therefore,\\n"`` joins the formula it introduces); a short last
       part merges into the previous one.
    5. ``max_steps`` caps the number of steps, merging the tail into the last allowed step.

    Args:
        max_part_length: parts longer than this (characters) are cut again (rule 3). Default 100,
            the paper's threshold.
        min_part_length: parts shorter than this after stripping whitespace are merged (rule 4).
            0 disables merging.
        max_steps: cap on the number of steps, or ``None``.
    """

    def __init__(
        self, max_part_length: int = 100, min_part_length: int = 12, max_steps: int | None = None
    ) -> None:
        if isinstance(max_part_length, bool) or not isinstance(max_part_length, int) or max_part_length < 1:
            raise ValueError(
                f"max_part_length must be an integer >= 1 (characters), got {max_part_length!r}; "
                "the paper uses 100."
            )
        if isinstance(min_part_length, bool) or not isinstance(min_part_length, int) or min_part_length < 0:
            raise ValueError(
                f"min_part_length must be an integer >= 0 (0 disables merging), got {min_part_length!r}"
            )
        if min_part_length > max_part_length:
            raise ValueError(
                f"min_part_length ({min_part_length}) must not exceed max_part_length ({max_part_length}); "
                "lower min_part_length or raise max_part_length."
            )
        self.max_part_length = max_part_length
        self.min_part_length = min_part_length
        self.max_steps = _check_max_steps(max_steps)

    def __repr__(self) -> str:
        return (
            f"MathSegmenter(max_part_length={self.max_part_length}, min_part_length={self.min_part_length}, "
            f"max_steps={self.max_steps!r})"
        )

    def __call__(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise TypeError(f"MathSegmenter expects a str, got {type(text).__name__}")
        return _cap_steps(_pieces(text, self.cut_points(text)), self.max_steps)

    # -- the rules ---------------------------------------------------------------------------------

    def cut_points(self, text: str) -> list[int]:
        """Sorted character positions where steps start (0 and ``len(text)`` excluded), before the
        ``max_steps`` cap."""
        n = len(text)
        if n == 0:
            return []
        spans = find_math_spans(text)
        starts = [s.start for s in spans]

        def inside(p: int) -> MathSpan | None:
            k = bisect.bisect_right(starts, p - 1) - 1  # last span with start < p
            if k >= 0 and spans[k].start < p < spans[k].end:
                return spans[k]
            return None

        cuts: set[int] = set()
        for m in _NEWLINE_RUN.finditer(text):
            p = m.end()
            if 0 < p < n and inside(p) is None:
                cuts.add(p)
        for m in _SENTENCE_END.finditer(text):
            p = m.end()
            if inside(m.start() + 1) is None and inside(p) is None and not _is_abbreviation(text, m.start()):
                cuts.add(p)
        for s in spans:  # "$r = 3.$  Also", "= 25.\\]This": the sentence ends inside the math
            if not text[s.content_start : s.content_end].rstrip().endswith("."):
                continue
            # Display math is typeset on its own line, so the word after its closer starts a new
            # line whether or not the source has a space there (MATH writes "\\]This" 215 times in
            # MATH-500). Inline math sits in running text, where "$3.$5" without a space is not a
            # sentence end, so inline math needs the space that a prose sentence end needs.
            tail = _DISPLAY_SENTENCE_TAIL if s.display else _INLINE_SENTENCE_TAIL
            m = tail.match(text, s.end)
            if m is not None:
                cuts.add(m.end())

        bounds = self._merge_short(text, sorted(cuts))
        bounds = self._split_long(text, bounds, spans, inside)
        return self._merge_short(text, bounds)

    def _merge_short(self, text: str, cuts: list[int]) -> list[int]:
        if self.min_part_length == 0 or not cuts:
            return cuts
        bounds = [0, *cuts, len(text)]
        kept = [0]
        for k in range(1, len(bounds) - 1):
            if len(text[kept[-1] : bounds[k]].strip()) >= self.min_part_length:
                kept.append(bounds[k])
            # else: the part is short: drop this cut so it merges into the next part
        if len(kept) > 1 and len(text[kept[-1] :].strip()) < self.min_part_length:
            kept.pop()  # a short last part merges into the previous one
        return kept[1:]

    def _split_long(self, text: str, cuts: list[int], spans: list[MathSpan], inside) -> list[int]:
        bounds = [0, *cuts, len(text)]
        if all(b - a <= self.max_part_length for a, b in pairwise(bounds)):
            return cuts
        levels = _logical_cuts(text, spans, inside)
        out = list(bounds)
        for candidates in levels:  # each level refines only the pieces still too long
            refined = [0]
            for a, b in pairwise(out):
                if b - a > self.max_part_length:
                    refined.extend(self._fill(a, b, candidates))
                refined.append(b)
            out = refined
        return out[1:-1]

    def _fill(self, a: int, b: int, candidates: list[int]) -> list[int]:
        """Cuts in ``(a, b)`` from ``candidates``: as few pieces as the limit needs, each cut the
        candidate nearest to an even split (balanced pieces read better than a 100-character piece
        followed by a 4-character one); no piece shorter than ``min_part_length``, and a piece
        longer than ``max_part_length`` only when no candidate allows otherwise."""
        lo_len, hi_len = max(self.min_part_length, 1), self.max_part_length
        cuts: list[int] = []
        cur = a
        while b - cur > hi_len:
            lo = bisect.bisect_left(candidates, cur + lo_len)
            hi = bisect.bisect_right(candidates, b - lo_len)
            if lo >= hi:
                break
            k = bisect.bisect_right(candidates, cur + hi_len, lo, hi)  # candidates[lo:k] fit the limit
            if k > lo:
                remaining = b - cur
                target = cur + remaining / -(-remaining // hi_len)
                best = min(candidates[lo:k], key=lambda p: abs(p - target))
            else:
                best = candidates[lo]
            cuts.append(best)
            cur = best
        return cuts


def _is_abbreviation(text: str, dot: int) -> bool:
    if text[dot] != ".":
        return False
    m = _WORD_BEFORE.search(text, 0, dot)
    return m is not None and m.group(1).lower().rstrip(".") in _ABBREVIATIONS


# --------------------------------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------------------------------


_BRACE_OR_ESCAPE_RE = re.compile(r"\\.|[{}]", re.DOTALL)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (brace-matched), or ``None``.

    Escaped braces (``\\{``, ``\\}``) do not count, so ``\\boxed{\\{1,2\\}}`` gives ``\\{1,2\\}``. The
    space form ``\\boxed 5`` gives the text up to the next ``$`` or line end. An unclosed last box
    (a truncated response) gives ``None``.
    """
    last = None
    for match in _BOX_COMMAND_RE.finditer(text):
        last = match
    if last is None:
        return None
    start = last.end()
    rest = text[start:]
    stripped = rest.lstrip(" ")
    if stripped.startswith("{"):
        open_at = start + (len(rest) - len(stripped))
        depth = 0
        for token in _BRACE_OR_ESCAPE_RE.finditer(text, open_at):
            char = token.group(0)
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[open_at + 1 : token.start()]
        return None
    if rest.startswith(" ") and last.group(0) == "\\boxed":
        content = re.split(r"[$\n]", stripped, maxsplit=1)[0].strip()
        return content or None
    return None


# --------------------------------------------------------------------------------------------------
# Verifier
# --------------------------------------------------------------------------------------------------


# Guards every MathVerifier's verdict cache (a module lock keeps verifiers picklable; holds are brief).
_CACHE_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _CACHE_LOCK
    _CACHE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class MathVerifier(_VerifierBase):
    """MATH grader: the last ``\\boxed{}`` of a response must be equivalent to the gold answer.

    Equivalence is math-verify's (``math_verify.parse`` + ``math_verify.verify``), with bare answers
    wrapped in ``$...$`` so that math-verify extracts them, plus three in-process rules applied first:
    identical strings (up to spacing, ``$`` delimiters, ``\\left``/``\\right``, ``\\dfrac``) are equal;
    two plain decimal numbers are compared exactly; answers containing an ellipsis are equal only when
    identical. Two exact rationals (e.g. ``\\frac{1}{2^{99}}``) are compared exactly, not to 6 decimals.

    Every answer that needs math-verify is checked in a separate process and gets at most
    ``timeout_seconds`` of wall-clock time, whichever thread calls; slower answers score 0.0.

    Args:
        answer_field: dataset column holding the gold final answer (default ``"answer"``).
        solution_field: column holding a reference solution; used, via its last ``\\boxed{}``, when
            ``answer_field`` is absent from the dataset (default ``"solution"``).
        timeout_seconds: wall-clock budget per answer (default 1.5 s; MATH-500's reference answers
            grade in well under 0.1 s each).
        max_answer_chars: extracted answers (or golds) longer than this score 0.0 without parsing.
        memory_limit_mb: extra address space the grading child may allocate before ``MemoryError``
            (Linux only; ``None`` disables the limit).
        startup_timeout: seconds to wait for the grading process to import math-verify.
        interrupt_in_child: stop a slow answer with ``SIGALRM`` inside the grading child at 75% of
            the budget (cheap: the child survives). Answers stuck in C code ignore it and are stopped by
            killing the child at the full budget, which always applies; ``False`` leaves only the kill.
        num_workers: grading child processes working in parallel on one batch (default 1; raise it
            when grading many distinct hard answers, e.g. Monte Carlo rollouts on a many-core node).
        cache_size: verdicts of up to this many distinct ``(answer, gold)`` pairs are remembered, so
            the many identical answers of Monte Carlo rollouts are graded once (0 disables).
        python_executable: the Python interpreter that runs the grading process (default
            ``sys.executable``); it needs mcadvantage and math-verify. Set it when ``sys.executable`` is
            not a Python interpreter (embedded Python, some application servers).

    The grading process is a fresh interpreter started with :mod:`subprocess`, so the verifier works
    from any entry point (a script without an ``if __name__ == "__main__":`` guard, ``python -c``, a
    notebook, pytest, ``accelerate launch``) and from several threads at once. If it cannot start, the
    call raises a ``RuntimeError`` that names the cause.
    """

    def __init__(
        self,
        answer_field: str = "answer",
        solution_field: str | None = "solution",
        timeout_seconds: float = 1.5,
        *,
        max_answer_chars: int = 2000,
        memory_limit_mb: int | None = 2048,
        startup_timeout: float = 120.0,
        interrupt_in_child: bool = True,
        num_workers: int = 1,
        cache_size: int = 65536,
        python_executable: str | None = None,
    ) -> None:
        if not isinstance(answer_field, str) or not answer_field:
            raise ValueError(f"answer_field must be a non-empty column name, got {answer_field!r}.")
        if not (isinstance(timeout_seconds, (int, float)) and timeout_seconds > 0):
            raise ValueError(
                f"timeout_seconds must be a positive number of seconds per answer, got {timeout_seconds!r}."
            )
        if max_answer_chars < 1:
            raise ValueError(f"max_answer_chars must be >= 1, got {max_answer_chars}.")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1 (grading processes), got {num_workers!r}.")
        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(
                f"cache_size must be an integer >= 0 (0 disables the cache), got {cache_size!r}."
            )
        if python_executable is not None and (
            not isinstance(python_executable, str) or not python_executable
        ):
            raise ValueError(
                "python_executable must be the path of a Python interpreter (or None for sys.executable), "
                f"got {python_executable!r}."
            )
        self.num_workers = num_workers
        self.cache_size = cache_size
        self.python_executable = python_executable
        self._verdicts: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self.answer_field = answer_field
        self.solution_field = solution_field
        self.timeout_seconds = float(timeout_seconds)
        self.max_answer_chars = max_answer_chars
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout = startup_timeout
        self.interrupt_in_child = interrupt_in_child
        self.__name__ = "math_verifier"

    def __repr__(self) -> str:
        return (
            f"MathVerifier(answer_field={self.answer_field!r}, solution_field={self.solution_field!r}, "
            f"timeout_seconds={self.timeout_seconds}, num_workers={self.num_workers})"
        )

    @property
    def _service(self) -> _GradingService:
        return _service_for(
            self.timeout_seconds,
            self.memory_limit_mb,
            self.startup_timeout,
            self.interrupt_in_child,
            self.num_workers,
            self.python_executable,
        )

    def warmup(self) -> None:
        """Start the grading process now (about a second) instead of on the first hard answer."""
        self._service.warmup()

    def _golds(self, kwargs: dict[str, Any], n: int) -> list[Any]:
        alternatives = (self.solution_field,) if self.solution_field else ()
        name, values = _gold_column(kwargs, self.answer_field, n, alternatives)
        if name == self.answer_field:
            return values
        # Only a reference solution is available: its last box is the gold answer.
        return [extract_boxed(v) if isinstance(v, str) else None for v in values]

    def is_equivalent(self, pred: str, gold: str) -> bool:
        """Whether two bare answers (e.g. ``"\\frac{1}{2}"`` and ``"0.5"``) are equivalent."""
        return self.equivalent_batch([(pred, gold)])[0]

    def equivalent_batch(self, pairs: Sequence[tuple[str | None, Any]]) -> list[bool]:
        """:meth:`is_equivalent` for many ``(pred, gold)`` pairs, sent to the grading process at once."""
        verdicts: list[bool | None] = []  # None: to be graded by the grading process
        keys: list[tuple[Any, Any]] = []
        for pred, gold in pairs:
            if isinstance(gold, (int, float)) and not isinstance(gold, bool):
                gold = str(gold)
            verdict: bool | None
            if not isinstance(pred, str) or not isinstance(gold, str) or not pred.strip() or not gold.strip():
                verdict = False
            elif len(pred) > self.max_answer_chars or len(gold) > self.max_answer_chars:
                verdict = False
            else:
                verdict = _quick_verdict(pred, gold)
            if verdict is None:
                verdict = self._cached_verdict((pred, gold))
            verdicts.append(verdict)
            keys.append((pred, gold))
        # Identical pairs in one batch (common among rollouts) go to the grading process once.
        unique = list(dict.fromkeys(k for v, k in zip(verdicts, keys, strict=True) if v is None))
        graded = dict(zip(unique, self._service.grade(unique), strict=True)) if unique else {}
        if self.cache_size:
            with _CACHE_LOCK:
                for pair, ok in graded.items():
                    self._verdicts[pair] = ok
                while len(self._verdicts) > self.cache_size:
                    self._verdicts.popitem(last=False)
        return [graded[k] if v is None else v for v, k in zip(verdicts, keys, strict=True)]

    def _cached_verdict(self, pair: tuple[str, str]) -> bool | None:
        # Under a lock: another thread's eviction between the lookup and move_to_end would raise.
        with _CACHE_LOCK:
            verdict = self._verdicts.get(pair)
            if verdict is not None:
                self._verdicts.move_to_end(pair)
            return verdict

    def score_batch(self, responses: Sequence[str | None], golds: Sequence[Any]) -> list[float]:
        """Rewards for ``responses[i]`` (full responses; their last box is graded) against ``golds[i]``."""
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers; pass one each.")
        preds = [extract_boxed(r) if isinstance(r, str) else None for r in responses]
        return [1.0 if ok else 0.0 for ok in self.equivalent_batch(list(zip(preds, golds, strict=True)))]

    def grading_process_info(self) -> dict[str, Any]:
        """Diagnostics from the grading process.

        Keys: ``guard`` (the eval guard is installed), ``kills`` (answers that hit the time limit and
        cost a grading child), ``refusals`` (answers during which the guard refused to evaluate text)
        ``refused_samples`` (up to 20 refused strings), ``workers`` (grading children) and ``pid``
        (the grading process' id).
        """
        return self._service.info()

    def close(self) -> None:
        """Stop the grading process (it restarts on the next call). Also done at interpreter exit."""
        self._service.close()


SEGMENTER_NAMES["math"] = MathSegmenter
_VERIFIERS["math"] = MathVerifier
