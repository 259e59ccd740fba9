"""Split a response into reasoning steps and map the steps onto its tokens.

VinePPO estimates one value per reasoning step, so a response is first cut into *steps*: contiguous
character spans that cover the text exactly (``"".join(steps) == text``, whitespace included). The
cut rules follow the paper's Appendix B:

* :class:`GSM8KSegmenter` -- one step per line; the final ``#### N`` answer line joins the last step.
* :class:`MathSegmenter` -- cut at newlines and sentence ends, never inside math; parts longer than
  ``max_part_length`` characters are cut again at logical points; very short parts join a neighbour.
* :class:`NewlineSegmenter` -- one step per line, nothing else.

:func:`step_token_boundaries` then maps the steps onto token indices (a token belongs to the step that
contains its first character), which is what the estimator needs to build the states ``S_i``.

Conventions shared by every segmenter here:

* Empty text gives ``[]`` (no steps), so ``"".join(segmenter("")) == ""`` still holds.
* Whitespace is never dropped: a line's trailing newline stays with that line (the line segmenters
  can put it at the start of the next step instead, as the official VinePPO code does, with
  ``newline_placement="start"``); after a sentence end the following spaces start the next step
  (byte-level and SentencePiece tokenizers attach a space to the word after it, so the word's token
  then lands in the step it begins).

This module imports only the standard library at import time (no torch, TRL or vLLM).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

from mcadvantage.core.text import decode_batch

__all__ = [
    "StepSegmenter",
    "NewlineSegmenter",
    "GSM8KSegmenter",
    "MathSegmenter",
    "get_segmenter",
    "step_token_boundaries",
    "segment_completion",
    "token_char_offsets",
    "find_math_spans",
    "MathSpan",
    "SEGMENTER_NAMES",
]


@runtime_checkable
class StepSegmenter(Protocol):
    """Anything that cuts a text into reasoning steps.

    ``segmenter(text)`` returns a list of strings whose concatenation is exactly ``text``.
    """

    def __call__(self, text: str) -> list[str]: ...


def _check_max_steps(max_steps: int | None) -> int | None:
    if max_steps is None:
        return None
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(
            f"max_steps must be None (no cap) or an integer >= 1, got {max_steps!r}; "
            "pass e.g. max_steps=25 to merge everything after the 24th step into the 25th."
        )
    return max_steps


def _cap_steps(steps: list[str], max_steps: int | None) -> list[str]:
    """Merge the tail so that at most ``max_steps`` steps remain (bounds the rollout cost)."""
    if max_steps is None or len(steps) <= max_steps:
        return steps
    return steps[: max_steps - 1] + ["".join(steps[max_steps - 1 :])]


def _pieces(text: str, cuts: Sequence[int]) -> list[str]:
    """Cut ``text`` at the given sorted positions; building steps from cuts keeps the join exact."""
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in pairwise(bounds) if b > a]


# --------------------------------------------------------------------------------------------------
# Line-based segmenters (GSM8K)
# --------------------------------------------------------------------------------------------------


_NEWLINE_PLACEMENTS = ("end", "start")


def _check_newline_placement(newline_placement: str) -> str:
    if newline_placement not in _NEWLINE_PLACEMENTS:
        raise ValueError(
            f"newline_placement must be 'end' (a line's newline ends its step, the default) or "
            f"'start' (the newline starts the next step, as in the official VinePPO code), got "
            f"{newline_placement!r}"
        )
    return newline_placement


class NewlineSegmenter:
    """One step per line.

    Each step keeps its trailing ``"\\n"`` (see ``newline_placement`` for the other convention).
    Blank (whitespace-only) lines merge forward into the next step; blank lines at the very end join
    the last step. Only ``"\\n"`` separates lines (``"\\r\\n"`` stays inside its line).

    Args:
        max_steps: cap on the number of steps; the tail beyond it is merged into the last allowed
            step. ``None`` (default) means no cap.
        newline_placement: ``"end"`` (default): the newline that ends a line is the last character
            of that line's step (``["a\\n", "b"]``). ``"start"``: it is the first character of the
            next step (``["a", "\\nb"]``); the steps are the same lines, only the newline between
            two steps moves. Blank lines still merge forward (``"a\\n\\nb"`` gives ``["a",
            "\\n\\nb"]``).
    """

    #: Lines whose stripped text starts with this marker join the previous step (None: no marker).
    answer_marker: str | None = None

    def __init__(self, max_steps: int | None = None, *, newline_placement: str = "end") -> None:
        self.max_steps = _check_max_steps(max_steps)
        self.newline_placement = _check_newline_placement(newline_placement)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_steps={self.max_steps!r}{self._placement_repr()})"

    def _placement_repr(self) -> str:
        # Shown only when not the default, so the repr of a default instance stays as it was.
        return "" if self.newline_placement == "end" else f", newline_placement={self.newline_placement!r}"

    def __call__(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__} expects a str, got {type(text).__name__}")
        steps: list[str] = []
        pending = ""  # blank lines waiting for the next non-blank line
        for line in _split_lines(text):
            if not line.strip():
                pending += line
                continue
            chunk, pending = pending + line, ""
            marker = self.answer_marker
            if marker is not None and steps and line.lstrip().startswith(marker):
                steps[-1] += chunk
            else:
                steps.append(chunk)
        if pending:
            if steps:
                steps[-1] += pending
            else:
                steps.append(pending)
        if self.newline_placement == "start":
            steps = _newlines_to_next_step(steps)
        return _cap_steps(steps, self.max_steps)


def _split_lines(text: str) -> list[str]:
    # str.splitlines would also cut at "\r", "\x0b", "\u2028", ...; only "\n" ends a line here.
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _newlines_to_next_step(steps: list[str]) -> list[str]:
    """Move the newline that ends each step (but the last) to the start of the next step.

    Every step but the last ends with ``"\\n"`` (it ends a line) and holds a non-blank line, so no
    step becomes empty and the join is unchanged.
    """
    out = list(steps)
    for k in range(len(out) - 1):
        out[k], out[k + 1] = out[k][:-1], "\n" + out[k + 1]
    return out


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
# MATH segmenter
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MathSpan:
    """A math region ``text[start:end]`` (delimiters included); ``content_start:content_end`` is the
    part between the delimiters. ``display`` is True for ``$$..$$``, ``\\[..\\]`` and
    ``\\begin{env}..\\end{env}``, False for inline ``$..$`` and ``\\(..\\)``."""

    start: int
    end: int
    content_start: int
    content_end: int
    display: bool


# A backslash (escape or command) or a dollar: the only characters where a math span can open.
_SPECIAL = re.compile(r"[\\$]")
_ENV_NAME = re.compile(r"\\begin\{([A-Za-z*]{1,30})\}")


def find_math_spans(text: str) -> list[MathSpan]:
    """Locate the math regions of a LaTeX text, left to right, without nesting.

    Recognised: ``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]`` and ``\\begin{env}..\\end{env}`` (any
    environment name, nested environments of the same name counted). ``\\$`` is an escaped dollar,
    not a delimiter. A delimiter without a closing partner is ordinary text (nothing is lost, the
    text around it is segmented as prose). Except for ``\\begin`` environments, a span may not cross
    a blank line: an unclosed ``$`` in model output then cannot swallow the rest of the response.
    """
    spans: list[MathSpan] = []
    n = len(text)
    i = 0
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            break
        i = m.start()
        if text[i] == "$":
            if text.startswith("$$", i):
                close = _find_closer(text, i + 2, "$$")
                if close >= 0:
                    spans.append(MathSpan(i, close + 2, i + 2, close, True))
                    i = close + 2
                    continue
                # "$$" without partner: maybe a lone "$" opening inline math right after a "$"
            close = _find_closer(text, i + 1, "$")
            if close >= 0:
                spans.append(MathSpan(i, close + 1, i + 1, close, False))
                i = close + 1
            else:
                i += 1
            continue
        # backslash
        if text.startswith("\\(", i) or text.startswith("\\[", i):
            closer = "\\)" if text[i + 1] == "(" else "\\]"
            close = _find_closer(text, i + 2, closer)
            if close >= 0:
                spans.append(MathSpan(i, close + 2, i + 2, close, text[i + 1] == "["))
                i = close + 2
                continue
            i += 2
            continue
        env = _ENV_NAME.match(text, i)
        if env is not None:
            close_start, close_end = _find_env_end(text, env.end(), env.group(1))
            if close_start >= 0:
                spans.append(MathSpan(i, close_end, env.end(), close_start, True))
                i = close_end
                continue
            i = env.end()
            continue
        i += 2  # an escape such as "\$" or "\\", or a command: skip the escaped character
        if i >= n:
            break
    return spans


def _find_closer(text: str, pos: int, closer: str) -> int:
    """Index of the first unescaped ``closer`` at or after ``pos``, or -1 (also -1 when a blank line
    comes first: inline and ``\\[``/``$$`` math do not span paragraphs)."""
    n = len(text)
    first = closer[0]
    i = pos
    while i < n:
        c = text[i]
        if c == "\\":
            if first == "\\" and text.startswith(closer, i):
                return i
            i += 2  # escaped char or command start: "\$" is not a dollar delimiter
            continue
        if c == first and first != "\\" and text.startswith(closer, i):
            return i
        if c == "\n" and _blank_line_at(text, i):
            return -1
        i += 1
    return -1


def _blank_line_at(text: str, i: int) -> bool:
    """True when the newline at ``i`` is followed by a whitespace-only line."""
    j = i + 1
    while j < len(text) and text[j] in " \t\r":
        j += 1
    return j < len(text) and text[j] == "\n"


def _find_env_end(text: str, pos: int, name: str) -> tuple[int, int]:
    begin, end = "\\begin{" + name + "}", "\\end{" + name + "}"
    depth = 1
    i = pos
    while True:
        j = text.find("\\", i)
        if j < 0:
            return -1, -1
        if text.startswith(end, j):
            depth -= 1
            if depth == 0:
                return j, j + len(end)
            i = j + len(end)
        elif text.startswith(begin, j):
            depth += 1
            i = j + len(begin)
        else:
            i = j + 2


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
_ROW_BREAK_NEWLINES = re.compile(r"[^\S\n]*\n(?:[^\S\n]*\n)*")
_PROSE_CLAUSE = re.compile(r"[,;:](?=\s)")  # cut after the punctuation
_PROSE_AND = re.compile(r"\s+and\s")  # cut before the whitespace in front of "and"
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


def _logical_cuts(text: str, spans: list[MathSpan], inside) -> list[list[int]]:
    """Candidate cut positions for long parts, as cumulative sorted levels: (1) prose ``,;:`` and
    display-math row breaks, (2) adds prose `` and `` and top-level ``=`` in display math, (3) adds
    top-level ``+`` and ``,`` in display math."""
    level1: set[int] = set()
    level2: set[int] = set()
    level3: set[int] = set()
    for m in _PROSE_CLAUSE.finditer(text):
        if inside(m.start() + 1) is None and inside(m.start()) is None:
            level1.add(m.end())
    for m in _PROSE_AND.finditer(text):
        if inside(m.start()) is None and inside(m.start() + 1) is None:
            level2.add(m.start())
    for s in spans:
        if s.display:
            rows, eqs, others = _display_cuts(text, s)
            level1.update(rows)
            level2.update(eqs)
            level3.update(others)
    level2 |= level1
    level3 |= level2
    return [sorted(level1), sorted(level2), sorted(level3)]


_RELATION_PREFIX = "<>!:&"
_ENV_BOUNDARY = re.compile(r"\\(begin|end)\{([A-Za-z*]{1,30})\}")
# Environments used inside a display block to align rows (amsmath); rows separated by "\\" in
# them are as good a cut point as the rows of a top-level align*.
_ROW_ENVIRONMENTS = frozenset({"aligned", "alignedat", "gathered", "split"})


def _display_cuts(text: str, span: MathSpan) -> tuple[list[int], list[int], list[int]]:
    """Top-level cut points inside a display span: after row breaks ``\\\\``, before ``=``, before
    ``+`` and after ``,``. Positions are strictly inside the span's content.

    "Top level" means outside braces, ``\\left..\\right`` pairs and nested environments (``depth``)
    and outside round and square brackets (``parens``), so neither ``\\frac{a=b}{c}`` nor
    ``f(1, 2)`` nor ``[0, 1)`` is cut. Brackets are counted as one kind, opening ``(``/``[`` against
    closing ``)``/``]``, because interval notation mixes them; they are counted only outside braces
    (where cuts can happen), so a lone ``\\hphantom{)}`` cannot unbalance the rest. A stray closer
    is ignored (clamped at zero); a stray opener blocks the cuts after it in that block, which
    leaves a longer step rather than one cut inside a parenthesis.
    """
    rows: list[int] = []
    eqs: list[int] = []
    others: list[int] = []
    depth = 0  # braces, \left..\right and nested environments
    parens = 0  # ( and [ against ) and ], outside braces
    i, end = span.content_start, span.content_end
    while i < end:
        c = text[i]
        top = depth == 0 and parens == 0
        if c == "\\":
            if text.startswith("\\\\", i):
                if top:
                    run = _ROW_BREAK_NEWLINES.match(text, i + 2, end)
                    rows.append(run.end() if run is not None else i + 2)
                i += 2
                continue
            if text.startswith("\\left", i) and not text[i + 5 : i + 6].isalpha():
                depth += 1
                i = _skip_delimiter(text, i + 5, end)  # "\left(" is one opener, not two
                continue
            if text.startswith("\\right", i) and not text[i + 6 : i + 7].isalpha():
                depth = max(depth - 1, 0)
                i = _skip_delimiter(text, i + 6, end)  # also "\right." closing a "\left\{"
                continue
            env = _ENV_BOUNDARY.match(text, i, end)
            if env is not None:
                # An alignment environment inside \[..\] or $$..$$ only lays out rows, like a
                # top-level align*: its rows stay cut points. Any other environment (a matrix, a
                # table, cases) is one object and is never cut inside.
                if env.group(2) not in _ROW_ENVIRONMENTS:
                    depth = depth + 1 if env.group(1) == "begin" else max(depth - 1, 0)
                i = env.end()
                continue
            i += 2  # also skips escaped braces "\{" "\}"
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth = max(depth - 1, 0)
        elif depth == 0 and c in "([":
            parens += 1
        elif depth == 0 and c in ")]":
            parens = max(parens - 1, 0)
        elif top and c == "=":
            p = i
            while p > span.content_start and text[p - 1] in _RELATION_PREFIX:
                p -= 1
            while p > span.content_start and text[p - 1] in " \t":
                p -= 1
            eqs.append(p)
        elif top and c == "+":
            p = i
            while p > span.content_start and text[p - 1] in " \t":
                p -= 1
            others.append(p)
        elif top and c == ",":
            others.append(i + 1)
        i += 1
    lo, hi = span.content_start, span.content_end

    def keep(ps: list[int]) -> list[int]:
        return [p for p in ps if lo < p < hi and text[lo:p].strip() and text[p:hi].strip()]

    return keep(rows), keep(eqs), keep(others)


def _skip_delimiter(text: str, i: int, end: int) -> int:
    """Position after the delimiter that follows ``\\left``/``\\right`` at ``i``: one character
    (``(``, ``.``, ``|``), an escaped one (``\\{``) or a command (``\\langle``), after optional
    spaces."""
    while i < end and text[i] in " \t\n":
        i += 1
    if i >= end:
        return end
    if text[i] != "\\":
        return i + 1
    j = i + 1
    while j < end and text[j].isalpha():
        j += 1
    return max(j, min(i + 2, end))


# --------------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------------

SEGMENTER_NAMES: dict[str, type] = {
    "gsm8k": GSM8KSegmenter,
    "math": MathSegmenter,
    "newline": NewlineSegmenter,
}


class _CheckedSegmenter:
    """Wraps a user callable and verifies every output joins back to the input (no silent loss)."""

    def __init__(self, fn: Callable[[str], list[str]]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)

    def __repr__(self) -> str:
        return f"_CheckedSegmenter({self.name})"

    def __call__(self, text: str) -> list[str]:
        steps = self.fn(text)
        if isinstance(steps, str) or not isinstance(steps, (list, tuple)):
            raise ValueError(
                f"segmenter {self.name} must return a list of strings, got {type(steps).__name__}"
            )
        steps = list(steps)
        if not all(isinstance(s, str) for s in steps):
            raise ValueError(f"segmenter {self.name} returned a non-string step: {steps!r:.200}")
        if "".join(steps) != text:
            joined = "".join(steps)
            k = next(
                (i for i, (x, y) in enumerate(zip(joined, text, strict=False)) if x != y),
                min(len(joined), len(text)),
            )
            raise ValueError(
                f"segmenter {self.name} lost or changed text: its {len(steps)} steps join to "
                f"{len(joined)} characters but the input has {len(text)} (first difference at "
                f"character {k}: {text[k : k + 20]!r} vs {joined[k : k + 20]!r}). A segmenter must "
                "return contiguous pieces of its input, whitespace included, so that "
                "''.join(steps) == text."
            )
        return steps


def get_segmenter(
    spec: str | StepSegmenter | Callable[[str], list[str]], **kwargs: Any
) -> Callable[[str], list[str]]:
    """Resolve a segmenter specification.

    Args:
        spec: a name (``"gsm8k"``, ``"math"`` or ``"newline"``, case-insensitive), an instance of
            one of this module's segmenters (returned unchanged), or any callable
            ``f(text) -> list[str]``. Foreign callables are wrapped so that an output that does not
            join back to the input raises a ``ValueError`` naming the segmenter.
        **kwargs: constructor arguments when ``spec`` is a name (e.g. ``max_steps=25``).

    Raises:
        ValueError: unknown name, or keyword arguments given with a non-name ``spec``.
        TypeError: ``spec`` is neither a string nor callable.
    """
    if isinstance(spec, str):
        cls = SEGMENTER_NAMES.get(spec.strip().lower())
        if cls is None:
            raise ValueError(
                f"unknown segmenter {spec!r}; valid names are {sorted(SEGMENTER_NAMES)}, or pass a "
                "callable f(text) -> list[str]."
            )
        return cls(**kwargs)
    if kwargs:
        raise ValueError(
            f"keyword arguments {sorted(kwargs)} only apply to a segmenter name, not to {spec!r}; "
            "configure the instance yourself instead."
        )
    if isinstance(spec, (NewlineSegmenter, MathSegmenter, _CheckedSegmenter)):
        return spec
    if callable(spec):
        return _CheckedSegmenter(spec)
    raise TypeError(
        f"segmenter must be a name {sorted(SEGMENTER_NAMES)} or a callable f(text) -> list[str], "
        f"got {type(spec).__name__}"
    )


# --------------------------------------------------------------------------------------------------
# Token alignment
# --------------------------------------------------------------------------------------------------

# Context tokens decoded in front of each token. Decoders are not additive at the start of a text
# (SentencePiece strips the first token's leading space, byte-level BPE may start mid-character);
# a few tokens of context make those effects cancel in the length difference.
_CONTEXT_TOKENS = 4
_REPLACEMENT = "\ufffd"


def _decode_many(tokenizer: Any, windows: list[list[int]]) -> list[str]:
    # One Rust call for all windows where the tokenizer allows it: transformers' Python decode costs ~10-20 us
    # per call, which alone would exceed the ~20 ms budget for 3 x 1024 windows.
    return decode_batch(tokenizer, windows, clean_up_tokenization_spaces=False)


def token_char_offsets(tokenizer: Any, token_ids: Sequence[int]) -> tuple[list[int], str]:
    """Start character of each token in the decoded text, and that decoded text.

    ``offsets[t]`` is the index (in the returned text) of the character that contains token ``t``'s
    first byte, so a token that completes a multi-byte character started by the previous token has
    the same offset as that token; special tokens skipped by decoding get the offset of the next
    character. The text is the concatenation of per-token pieces, normally equal to
    ``tokenizer.decode(token_ids, skip_special_tokens=True)``.

    Cost: one batched decode of ``3 * len(token_ids)`` windows of at most ~5 tokens (linear).
    """
    ids = [int(t) for t in token_ids]
    total = len(ids)
    if total == 0:
        return [], ""
    singles = _decode_many(tokenizer, [[t] for t in ids])
    # Tokens that cannot start a window cleanly: skipped specials (empty) and continuation bytes.
    bad_start = [s == "" or s.startswith(_REPLACEMENT) for s in singles]
    starts = []
    windows: list[list[int]] = []
    for t in range(total):
        s = max(0, t - _CONTEXT_TOKENS)
        floor = max(0, t - 4 * _CONTEXT_TOKENS)
        while s > floor and bad_start[s]:
            s -= 1
        starts.append(s)
        windows.append(ids[s:t])
        windows.append(ids[s : t + 1])
    texts = _decode_many(tokenizer, windows)
    offsets = [0] * total
    pieces: list[str] = []
    pos = 0
    for t in range(total):
        before = texts[2 * t].rstrip(_REPLACEMENT)  # drop an incomplete trailing character
        after = texts[2 * t + 1].rstrip(_REPLACEMENT)
        offsets[t] = pos
        delta = max(len(after) - len(before), 0)
        if delta:
            piece = after[len(before) :] if after.startswith(before) else after[-delta:]
            pieces.append(piece)
            pos += delta
    return offsets, "".join(pieces)


def _align_positions(src: str, dst: str) -> list[int]:
    """Monotone map from positions in ``src`` (0..len) to positions in ``dst``.

    Used when the decoded pieces differ from the segmented text (decode-time space clean-up, a
    replacement character, a caller that segmented a slightly different string). Equal characters
    map one to one; extra whitespace on either side is skipped; other differences are resynchronised
    on the next matching 8-character window when one is near, else treated as substitutions. Runs in
    linear time (bounded look-ahead) where a general diff would be quadratic.
    """
    ns, nd = len(src), len(dst)
    out = [0] * (ns + 1)
    i = j = 0
    while i < ns:
        if j < nd and src[i] == dst[j]:
            out[i] = j
            i += 1
            j += 1
        elif src[i].isspace():
            out[i] = j
            i += 1
        elif j < nd and dst[j].isspace():
            j += 1
        elif j >= nd:
            out[i] = nd
            i += 1
        else:
            probe = src[i : i + 8]
            k = dst.find(probe, j, j + 64 + len(probe))
            if k > j:
                j = k  # dst has extra characters
                continue
            probe = dst[j : j + 8]
            k = src.find(probe, i, i + 64 + len(probe))
            if k > i:
                for q in range(i, k):  # src has extra characters: they map onto dst[j]
                    out[q] = j
                i = k
                continue
            out[i] = j  # substitution
            i += 1
            j += 1
    # The end of src maps to where the walk stopped: trailing characters only dst has (e.g. the
    # U+FFFD of a cut-off multi-byte character) then still own the text-less tokens at the end.
    out[ns] = min(j, nd)
    return out


def step_token_boundaries(
    tokenizer: Any,
    token_ids: Sequence[int],
    steps: Sequence[str],
    *,
    offsets: Sequence[int] | Sequence[tuple[int, int]] | None = None,
) -> list[int]:
    """Token index where each step starts: ``[0 = b_0 < b_1 < ... < b_n = len(token_ids)]``.

    Token ``t`` belongs to the step that contains its first character (for a token that continues a
    multi-byte character, the character it continues). Tokens without text of their own -- EOS and
    other special tokens at the end -- stay in the step of the token before them, i.e. the last
    step, so appending EOS never adds a boundary. Steps that own no token (all their characters lie
    inside a token that starts in an earlier step) are merged with the step before, so the result can
    have fewer than ``len(steps) + 1`` entries; it is always strictly increasing and ends at
    ``len(token_ids)``. Empty ``token_ids`` give ``[0]``.

    The text is recovered by decoding (see :func:`token_char_offsets`); when it differs from
    ``"".join(steps)`` (a decode that adds or removes spaces, an undecodable byte) character
    positions are aligned and clamped instead of raising; each token is then placed by the first
    non-whitespace character of its decoded piece, since whitespace is what such decoders change.

    Args:
        tokenizer: a Hugging Face tokenizer (fast tokenizers are decoded in one batched call). Not
            used when ``offsets`` is given.
        token_ids: the response's token ids (no prompt), EOS included if it was generated.
        steps: the response text cut into steps (e.g. ``MathSegmenter()(text)``).
        offsets: optional start character of each token in ``"".join(steps)`` (or ``(start, end)``
            pairs as from ``return_offsets_mapping``), to skip decoding. They are made
            non-decreasing (running maximum), so a special token reported at ``(0, 0)`` joins the
            step of the token before it.
    """
    total = len(token_ids)
    if total == 0:
        return [0]
    text = "".join(steps)
    ends = []
    acc = 0
    for s in steps:
        acc += len(s)
        ends.append(acc)
    n_steps = len(ends)
    if n_steps <= 1:
        return [0, total]

    if offsets is not None:
        if len(offsets) != total:
            raise ValueError(
                f"offsets has {len(offsets)} entries but token_ids has {total}; pass one start "
                "offset (or (start, end) pair) per token."
            )
        chars = [int(o[0]) if isinstance(o, (tuple, list)) else int(o) for o in offsets]
    else:
        if tokenizer is None:
            raise ValueError(
                "step_token_boundaries needs a tokenizer (or offsets=...) to map steps to tokens"
            )
        raw, decoded = token_char_offsets(tokenizer, token_ids)
        if decoded == text:
            chars = raw
        else:
            # Decoders disagree about whitespace (added, removed or changed spaces), so anchor each
            # token on the first non-whitespace character of its decoded piece.
            mapping = _align_positions(decoded, text)
            chars = []
            for a, b in zip(raw, [*raw[1:], len(decoded)], strict=True):
                k = a
                while k < b and decoded[k].isspace():
                    k += 1
                chars.append(mapping[a if k == b else k])

    bounds = [0]
    step_prev = 0
    high = 0
    last = n_steps - 1
    n_chars = len(text)
    for t in range(total):
        if chars[t] >= n_chars:
            continue  # no text of its own (EOS, trailing specials): stays with the token before
        high = max(high, chars[t])
        step = min(bisect.bisect_right(ends, high), last)
        if step > step_prev:
            if t > 0:
                bounds.append(t)
            step_prev = step
    bounds.append(total)
    return bounds


def segment_completion(
    segmenter: str | StepSegmenter | Callable[[str], list[str]], tokenizer: Any, token_ids: Sequence[int]
) -> list[int]:
    """Decode ``token_ids`` (special tokens skipped), cut the text into steps and return the step
    token boundaries (see :func:`step_token_boundaries`)."""
    seg = get_segmenter(segmenter)
    if len(token_ids) == 0:
        return [0]
    offsets, text = token_char_offsets(tokenizer, token_ids)
    # Segment the very text the offsets refer to: alignment is then exact and decoding runs once.
    return step_token_boundaries(tokenizer, token_ids, seg(text), offsets=offsets)
