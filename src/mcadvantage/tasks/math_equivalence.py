"""When two MATH answers are equal: cheap in-process verdicts, and math-verify's verdict under an eval guard.

* ``_quick_verdict`` decides the cheap cases in the caller's process: identical strings (up to spacing, ``$``
  delimiters, ``\\left``/``\\right``, ``\\dfrac``), two plain decimal numbers (exactly), answers with an
  ellipsis (equal only when identical). ``None`` means "ask math-verify".
* ``_math_equal`` is math-verify's equivalence (plus exact comparison of two exact rationals). It may hang or
  blow up, so it runs only inside the grading process (:mod:`mcadvantage.tasks.supervisor`), never in the
  caller's.

Why an eval guard: sympy's string parser (``parse_expr``/``sympify``) runs Python ``eval``. In
math-verify 0.9 only digit/operator strings reach it, but the grading child also replaces
``parse_expr`` with a version that refuses anything other than arithmetic characters
(``_install_eval_guard``), so model output can never be evaluated as Python even if a future math-verify
passes more text through.

math-verify and sympy are imported inside the functions that need them, never at import time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from mcadvantage.tasks.verifier import _MAX_NUMBER_CHARS

# --------------------------------------------------------------------------------------------------
# Cheap in-process verdicts
# --------------------------------------------------------------------------------------------------


_BOX_COMMAND_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_MATH_ENV_RE = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_ELLIPSIS_RE = re.compile(r"\\[lcv]?dots[cbmoi]?(?![A-Za-z])|\.\.\.|\u2026")
_SPACING_RE = re.compile(r"\\[!,;: ]|\\q?quad(?![A-Za-z])|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\s+")
_FRAC_VARIANT_RE = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_PLAIN_NUMBER_RE = re.compile(r"([-+]?)(?:([1-9]\d{0,2}(?:([, ])\d{3})(?:\3\d{3})*)|(\d*))(\.\d+)?")


def _strip_math_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def _normalized(s: str) -> str:
    """Spacing- and delimiter-insensitive form, used only for shortcuts that are safe by construction."""
    s = _strip_math_delimiters(s)
    s = _FRAC_VARIANT_RE.sub(r"\\frac", s)
    s = _SPACING_RE.sub("", s)
    return s.rstrip(".")


def _plain_number(s: str) -> Fraction | None:
    """Exact value of a plain decimal like ``-1,000.5``, ``1 000``, ``\\$10``, ``.4``; else ``None``."""
    s = _strip_math_delimiters(s).replace("\\!", "").replace("{,}", ",")
    s = s.removeprefix("\\$").removeprefix("$").strip().rstrip(".")
    if len(s) > _MAX_NUMBER_CHARS:
        return None
    match = _PLAIN_NUMBER_RE.fullmatch(s)
    if match is None or not (match.group(2) or match.group(4) or match.group(5)):
        return None
    integer = (match.group(2) or match.group(4) or "0").replace(",", "").replace(" ", "")
    return Fraction(match.group(1) + integer + (match.group(5) or ""))


def _quick_verdict(pred: str, gold: str) -> bool | None:
    """Decide the cheap cases in-process; ``None`` means "ask math-verify"."""
    norm_pred, norm_gold = _normalized(pred), _normalized(gold)
    if norm_pred and norm_pred == norm_gold:
        return True
    has_box = _BOX_COMMAND_RE.search(pred) or _BOX_COMMAND_RE.search(gold)
    if not has_box and (_ELLIPSIS_RE.search(pred) or _ELLIPSIS_RE.search(gold)):
        # Sequences with an ellipsis ("1, 3, 5, \ldots, 2n-1") are patterns sympy cannot represent;
        # math-verify drops the ellipsis and compares the leftovers (it calls "1, 2, \ldots, n" equal
        # to "1, 3, 5, \ldots, 2n-1"), so only identical patterns count as equal. With a box present
        # the answer is the box's content and an ellipsis is more likely in the working around it.
        return False
    a, b = _plain_number(pred), _plain_number(gold)
    if a is not None and b is not None:
        return a == b
    return None


# --------------------------------------------------------------------------------------------------
# math-verify, under the eval guard (inside the grading process only)
# --------------------------------------------------------------------------------------------------


# What sympy's Python-evaluating parser may see inside the grading child: numbers and arithmetic.
_SAFE_EXPR_RE = re.compile(r"[0-9\s.,+\-*/()eE%]*")


class _EvalRefused(ValueError):
    pass


# Strings the guard refused (a count and a few samples), reported through grading_process_info().
_REFUSED: list[str] = []
_REFUSED_COUNT = 0


def _make_guarded_parse_expr(parse_expr: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap sympy's ``parse_expr`` (which runs ``eval``) to refuse anything but arithmetic text."""

    def guarded_parse_expr(s: Any, *args: Any, **kwargs: Any) -> Any:
        global _REFUSED_COUNT
        if isinstance(s, str) and not _SAFE_EXPR_RE.fullmatch(s):
            _REFUSED_COUNT += 1
            if len(_REFUSED) < 20:
                _REFUSED.append(s[:200])
            raise _EvalRefused(f"refusing to evaluate non-arithmetic text as Python: {s[:80]!r}")
        return parse_expr(s, *args, **kwargs)

    guarded_parse_expr.mcadvantage_guard = True  # type: ignore[attr-defined]
    return guarded_parse_expr


# Grading answers that make math-verify/sympy import their lazily loaded modules (sympy.physics.units,
# sets, matrices, relations, ...). Some of those modules call sympify("name") at import time, which
# the guard would refuse, so they are imported once, with trusted input, before the guard goes on.
_PRELOAD_PAIRS = (
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{1}{3}", "0.3333333"),
    ("[0,1)", "\\{1, 2\\}"),
    ("x \\geq 5", "5 \\le x"),
    ("\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", "\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}"),
    ("28\\%", "28"),
    ("90^\\circ", "\\frac{\\pi}{2}"),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\sin^2 x + \\cos^2 x", "1"),
    ("y = 2x + 1", "2x - y + 1 = 0"),
    ("\\text{(C)}", "C"),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}"),
    ("\\log_2 8 + 10!", "3628803"),
)


def _install_eval_guard() -> bool:
    """Replace every reference to sympy's ``parse_expr`` that math-verify can reach (idempotent)."""
    import latex2sympy2_extended.latex2sympy2 as l2s
    import math_verify.grader as mv_grader
    import math_verify.parser as mv_parser
    import sympy.parsing
    import sympy.parsing.sympy_parser as sympy_parser

    original = sympy_parser.parse_expr
    if getattr(original, "mcadvantage_guard", False):
        return True
    # We bound time ourselves (in this process); math-verify's warning about that is noise here.
    mv_parser.TIMEOUT_WARNING_SHOWN = mv_grader.TIMEOUT_WARNING_SHOWN = True
    import sympy.physics.units  # noqa: F401  (sympify()s names at import time)

    for pred, gold in _PRELOAD_PAIRS:
        try:
            _math_equal(pred, gold)
        except Exception:  # warm-up only
            pass
    guarded = _make_guarded_parse_expr(original)
    # sympify() imports parse_expr from sympy_parser at call time, so patching the module covers it.
    for module in (sympy_parser, sympy.parsing, mv_parser, l2s):
        if hasattr(module, "parse_expr"):
            module.parse_expr = guarded
    return True


def _eval_guard_active() -> bool:
    import math_verify.parser as mv_parser
    import sympy.parsing.sympy_parser as sympy_parser

    return all(getattr(m.parse_expr, "mcadvantage_guard", False) for m in (sympy_parser, mv_parser))


_MATHRM_E_RE = re.compile(r"\\(?:mathrm|text|operatorname)\{\s*e\s*\}")


def _parse_answer(s: str) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    # math-verify's normaliser eats "\mathrm{e}" and leaves "1 - \frac{1}{" (so 1 - 1/e "equals"
    # 1 + 1/e); an upright e is Euler's number, which latex2sympy reads from a plain "e".
    s = _MATHRM_E_RE.sub("e", s)
    # An escaped dollar is a currency sign ("\\$18.90"); inside our "$...$" wrapper math-verify reads
    # it as a delimiter and extracts nothing, so drop it like any other unit.
    s = s.replace("\\$", "")
    if _MATH_ENV_RE.search(s):
        return parse(s, config, parsing_timeout=None)
    # math-verify extracts LaTeX only inside a math environment: wrap bare answers, and fall back to
    # its plain-expression extraction (e.g. "1,000.99 dollars") when that finds nothing.
    return parse(f"${s}$", config, parsing_timeout=None) or parse(s, config, parsing_timeout=None)


def _exact_number(expr: Any) -> Any:
    """An exact sympy Rational for float-free, symbol-free, non-percentage expressions, else None."""
    import sympy

    if not isinstance(expr, sympy.Basic) or not getattr(expr, "is_number", False):
        return None
    if expr.has(sympy.Float) or expr.has(sympy.UnevaluatedExpr):
        return None
    value = expr.doit()
    return value if isinstance(value, sympy.Rational) else None


def _math_equal(pred: str, gold: str) -> bool:
    """math-verify equivalence, run inside the grading child only (it may hang or blow up)."""
    from math_verify import verify

    gold_parsed = _parse_answer(gold)
    pred_parsed = _parse_answer(pred)
    if not gold_parsed or not pred_parsed:
        return False
    import sympy

    gold_expr = next((g for g in gold_parsed if isinstance(g, sympy.Basic)), None)
    pred_expr = next((p for p in pred_parsed if isinstance(p, sympy.Basic)), None)
    gold_value, pred_value = _exact_number(gold_expr), _exact_number(pred_expr)
    if gold_value is not None and pred_value is not None:
        # Two exact rationals are compared exactly: math-verify rounds to 6 decimals and would call
        # 1/2004! equal to 1/2006!.
        return bool(gold_value == pred_value)
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))
