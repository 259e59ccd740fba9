"""LaTeX structure for the MATH segmenter: where the math spans are, and where a long part may be cut.

* :func:`find_math_spans` locates ``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]`` and
  ``\\begin{env}..\\end{env}`` regions (:class:`MathSpan`).
* ``_logical_cuts`` lists the candidate cut points of a part that is too long, in three levels: prose
  ``,;:`` and display-math row breaks; prose `` and `` and top-level ``=``; top-level ``+`` and ``,``
  (``_display_cuts`` finds the top-level ones inside display math).

Pure text scanning with no step rules of its own; the rules are :class:`~mcadvantage.tasks.math.MathSegmenter`'s.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MathSpan", "find_math_spans"]


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


_ROW_BREAK_NEWLINES = re.compile(r"[^\S\n]*\n(?:[^\S\n]*\n)*")
_PROSE_CLAUSE = re.compile(r"[,;:](?=\s)")  # cut after the punctuation
_PROSE_AND = re.compile(r"\s+and\s")  # cut before the whitespace in front of "and"


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


def _back_over(text: str, p: int, start: int, chars: str = " \t") -> int:
    """``p`` moved back over the ``chars`` before it, not before ``start``."""
    while p > start and text[p - 1] in chars:
        p -= 1
    return p


def _command(text: str, i: int, end: int, depth: int, rows: list[int] | None) -> tuple[int, int]:
    """At the backslash ``text[i]`` of a display span: the position after the command and the new depth (a
    ``\\left``/``\\right`` pair or a nested environment other than an alignment's counts one). A row break ``\\\\``
    goes into ``rows`` when given (at top level)."""
    if text.startswith("\\\\", i):
        if rows is not None:
            run = _ROW_BREAK_NEWLINES.match(text, i + 2, end)
            rows.append(run.end() if run is not None else i + 2)
        return i + 2, depth
    if text.startswith("\\left", i) and not text[i + 5 : i + 6].isalpha():
        return _skip_delimiter(text, i + 5, end), depth + 1  # "\left(" is one opener, not two
    if text.startswith("\\right", i) and not text[i + 6 : i + 7].isalpha():
        return _skip_delimiter(text, i + 6, end), max(depth - 1, 0)  # also "\right." closing a "\left\{"
    env = _ENV_BOUNDARY.match(text, i, end)
    if env is not None:
        # An alignment environment inside \[..\] or $$..$$ only lays out rows, like a top-level align*: its rows
        # stay cut points. Any other environment (a matrix, a table, cases) is one object and is never cut inside.
        if env.group(2) not in _ROW_ENVIRONMENTS:
            depth = depth + 1 if env.group(1) == "begin" else max(depth - 1, 0)
        return env.end(), depth
    return i + 2, depth  # also skips escaped braces "\{" "\}"


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
            i, depth = _command(text, i, end, depth, rows if top else None)
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
            eqs.append(
                _back_over(
                    text, _back_over(text, i, span.content_start, _RELATION_PREFIX), span.content_start
                )
            )
        elif top and c == "+":
            others.append(_back_over(text, i, span.content_start))
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
