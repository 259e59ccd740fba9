"""Answer checkers for GSM8K and MATH that double as TRL reward functions.

Two verifiers grade a model response against a gold answer and return a reward in ``[0, 1]``:

* :class:`GSM8KVerifier` reads the number after the last ``####`` and compares it exactly
  (``fractions.Fraction``) with the gold number; pure regular expressions, no worker process.
* :class:`MathVerifier` reads the last brace-matched ``\\boxed{...}`` (or ``\\fbox{...}``) and
  decides mathematical equivalence with `math-verify <https://github.com/huggingface/Math-Verify>`_
  (sympy based).

Instances are TRL reward functions::

    verifier(prompts=..., completions=..., completion_ids=..., **dataset_columns) -> list[float]

for standard (string) and conversational (message list) completions; the gold answers come from the
dataset column named by ``answer_field``. Grading never raises: a missing, truncated or unparseable
answer scores 0.0. A missing gold *column* does raise, because that is a configuration bug.

Why the MATH verifier uses a worker process: math-verify bounds its own time with
``signal.alarm``, which only works on the main thread, and some inputs (``9^{9^{9^9}}``, huge
factorials) hang inside C code where no Python-level timeout can interrupt them. Equivalence checks
therefore run in a small supervisor process that forks one grading child and kills and re-forks it
when an answer exceeds its time budget. The per-answer bound then holds in any thread of the caller,
and restarting costs a fork, not a fresh import of sympy. Cheap cases (identical strings, plain
numbers) are decided in-process first. The supervisor is a fresh interpreter started with
:mod:`subprocess` that runs only :mod:`mcadvantage.tasks._grading_worker` (see there why): multiprocessing's
``spawn`` would re-run the caller's ``__main__`` (a script without a main guard crashed) and ``fork``
is unsafe in a multi-threaded trainer.

Why an eval guard: sympy's string parser (``parse_expr``/``sympify``) runs Python ``eval``. In
math-verify 0.9 only digit/operator strings reach it, but the grading child also replaces
``parse_expr`` with a version that refuses anything other than arithmetic characters, so model
output can never be evaluated as Python even if a future math-verify passes more text through.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

__all__ = [
    "Verifier",
    "GSM8KVerifier",
    "MathVerifier",
    "get_verifier",
    "completion_text",
    "extract_gsm8k_answer",
    "extract_boxed",
]

# Keyword arguments TRL passes to every reward function besides the dataset columns.
_TRL_EXTRA_KWARGS = frozenset({"trainer_state", "log_extra", "log_metric"})


@runtime_checkable
class Verifier(Protocol):
    """A grader of final answers that is also a TRL reward function.

    ``score(response, gold)`` returns a reward in ``[0, 1]`` and never raises on bad model output.
    Calling the instance TRL-style grades a batch of completions against the gold column.
    """

    __name__: str

    def score(self, response: str, gold: str) -> float:
        """Reward in ``[0, 1]`` of one response against one gold answer; never raises on bad output."""
        ...

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]: ...


# --------------------------------------------------------------------------------------------
# Completions and gold columns (shared by both verifiers)
# --------------------------------------------------------------------------------------------


def _message_content(message: Any) -> str | None:
    content = message.get("content") if isinstance(message, dict) else None
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts)
    return None


def completion_text(completion: Any) -> str | None:
    """The text to grade from one TRL completion.

    Accepts a plain string (standard format), or a conversational completion: a list of
    ``{"role": ..., "content": ...}`` messages, of which the last assistant message is used (a single
    message dict is accepted too). Returns ``None`` when there is nothing to grade (``None``, or no
    assistant message), which scores 0.0.
    """
    if completion is None or isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _message_content(completion)
    if isinstance(completion, (list, tuple)):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                return _message_content(message)
        return None
    raise TypeError(
        f"completions must hold strings or lists of chat messages, got {type(completion).__name__}: "
        f"{completion!r:.100}. Pass the completions TRL gives reward functions."
    )


def _gold_column(
    kwargs: dict[str, Any], field: str, n: int, alternatives: Sequence[str] = ()
) -> tuple[str, list[Any]]:
    """Return ``(column name, values)`` for the first present of ``field`` and ``alternatives``."""
    for name in (field, *alternatives):
        if name in kwargs and kwargs[name] is not None:
            values = list(kwargs[name])
            if len(values) != n:
                raise ValueError(
                    f"gold column {name!r} has {len(values)} values for {n} completions; every "
                    "completion needs its own gold answer (TRL repeats dataset columns per generation)."
                )
            return name, values
    present = sorted(k for k in kwargs if k not in _TRL_EXTRA_KWARGS)
    wanted = " or ".join(repr(c) for c in (field, *alternatives))
    raise ValueError(
        f"no gold answer column {wanted} among the dataset columns passed to the reward function "
        f"(present: {present}). Add the column to the dataset or set answer_field= to the column "
        "that holds the gold answer."
    )


class _VerifierBase:
    """TRL reward-function plumbing shared by the verifiers."""

    __name__ = "verifier"
    answer_field: str

    def __call__(
        self,
        prompts: Sequence[Any] | None = None,
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """Grade a batch TRL-style; ``kwargs`` are the dataset columns (plus ignored TRL extras)."""
        if completions is None:
            raise ValueError(f"{self.__name__} needs completions=...; TRL passes them as a keyword argument.")
        texts = [completion_text(c) for c in completions]
        golds = self._golds(kwargs, len(texts))
        return self.score_batch(texts, golds)

    def _golds(self, kwargs: dict[str, Any], n: int) -> list[Any]:
        return _gold_column(kwargs, self.answer_field, n)[1]

    def score(self, response: str | None, gold: Any) -> float:
        """Reward in ``[0, 1]`` of one response against one gold answer; never raises on bad output."""
        return self.score_batch([response], [gold])[0]

    def score_batch(self, responses: Sequence[str | None], golds: Sequence[Any]) -> list[float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(answer_field={self.answer_field!r})"


# --------------------------------------------------------------------------------------------
# GSM8K
# --------------------------------------------------------------------------------------------

# A number: optional sign (ASCII or Unicode minus), digits with optional thousands commas and a
# decimal part, or a bare decimal part. A trailing period is not consumed ("18." -> 18).
_NUMBER = r"[-+\u2212]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_BARE_NUMBER_RE = re.compile(r"\$?\s*(" + _NUMBER + r")\s*\.?")
# Python refuses to convert int strings longer than 4300 digits; no real answer is that long.
_MAX_NUMBER_CHARS = 1000


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


# --------------------------------------------------------------------------------------------
# MATH: extraction and cheap in-process verdicts
# --------------------------------------------------------------------------------------------

_BOX_COMMAND_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
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


# --------------------------------------------------------------------------------------------
# MATH: the grading child (runs math-verify) and its supervisor
# --------------------------------------------------------------------------------------------

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


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside the child; a BaseException so math-verify's ``except Exception``
    blocks cannot swallow it."""


def _limit_memory(memory_limit_mb: int | None) -> None:
    if not memory_limit_mb:
        return
    try:
        import resource

        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = current + memory_limit_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):  # not Linux: rely on the supervisor's kill
        pass


def _detach_from_supervisor(supervisor: tuple[int, int]) -> None:
    """In a forked grading child: let go of the supervisor's link to the caller; die with the supervisor.

    The fork copied the supervisor's end of its socket to the caller. While a child stuck in C code held
    that copy, the caller saw no end-of-file when the supervisor died and waited out its long backstop.
    The fd is pointed at /dev/null rather than closed because the supervisor's Connection object (copied
    too) still owns the number. On Linux the child also asks to be killed when the supervisor dies (killed
    from outside, e.g. by the OOM killer), since nothing else could stop an answer stuck in C code.
    """
    supervisor_pid, caller_fd = supervisor
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, caller_fd)
    os.close(devnull)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
    except (OSError, AttributeError):  # not Linux: the caller's kill of the process group remains
        return
    if os.getppid() != supervisor_pid:  # the supervisor died before prctl took effect
        os._exit(1)


def _child_main(
    conn: Any,
    soft_timeout: float | None,
    memory_limit_mb: int | None,
    supervisor: tuple[int, int] | None = None,
) -> None:
    """Grading child: grade items in order, sending ``(index, verdict)`` after each.

    ``supervisor`` is ``(pid, fd of its connection to the caller)`` when the child was forked.
    """
    import signal

    if supervisor is not None:
        _detach_from_supervisor(supervisor)
    _install_eval_guard()
    _limit_memory(memory_limit_mb)
    use_alarm = soft_timeout is not None and hasattr(signal, "setitimer")

    def on_alarm(signum: int, frame: Any) -> None:
        raise _SoftTimeout()

    if use_alarm:
        signal.signal(signal.SIGALRM, on_alarm)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] != "grade":
            return
        for index, (pred, gold) in enumerate(message[1]):
            verdict = False
            refused_before = _REFUSED_COUNT
            try:
                try:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_REAL, soft_timeout)
                    verdict = _math_equal(pred, gold)
                finally:
                    if use_alarm:
                        signal.setitimer(signal.ITIMER_REAL, 0)
            except (_SoftTimeout, Exception, MemoryError, RecursionError):
                verdict = False
            refused = _REFUSED[-1] if _REFUSED_COUNT > refused_before and _REFUSED else None
            conn.send((index, verdict, refused))


class _Child:
    """The supervisor's handle on one grading child."""

    def __init__(
        self,
        ctx: Any,
        soft_timeout: float | None,
        memory_limit_mb: int | None,
        supervisor: tuple[int, int] | None,
    ) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=_child_main, args=(child_conn, soft_timeout, memory_limit_mb, supervisor), daemon=True
        )
        self.process.start()
        child_conn.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


def _supervisor_main(
    conn: Any,
    timeout_seconds: float,
    memory_limit_mb: int | None,
    interrupt_in_child: bool,
    num_workers: int,
) -> None:
    """Supervisor process: never grades itself, so it always answers; enforces per-answer deadlines.

    It hands answers one at a time to ``num_workers`` grading children, gives each answer
    ``timeout_seconds`` from the moment it is handed over, and kills and re-forks a child whose answer
    runs over (that answer scores False).
    """
    from multiprocessing.connection import wait

    import math_verify  # noqa: F401  (imported before forking so children start warm)

    _install_eval_guard()
    methods = multiprocessing.get_all_start_methods()
    # Forking from this single-threaded process is safe and fast (sympy is already imported).
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    # SIGALRM in the child stops most slow answers cheaply (the child survives); answers stuck in C
    # code ignore it until the supervisor's deadline kills the child.
    soft_timeout = max(0.05, 0.75 * timeout_seconds) if interrupt_in_child else None
    # What a forked child must let go of (see _detach_from_supervisor); a spawned one inherits nothing.
    supervisor = (os.getpid(), conn.fileno()) if ctx.get_start_method() == "fork" else None
    children: list[_Child | None] = [None] * num_workers
    kills = 0
    refusals: list[str] = []

    def grade(items: list[tuple[str, str]]) -> list[bool]:
        nonlocal kills
        results = [False] * len(items)
        todo = list(range(len(items) - 1, -1, -1))  # a stack, popped in order
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (item index, deadline)
        while todo or busy:
            for slot in range(num_workers):
                if slot in busy or not todo:
                    continue
                child = children[slot]
                if child is None or not child.process.is_alive():
                    child = children[slot] = _Child(ctx, soft_timeout, memory_limit_mb, supervisor)
                index = todo.pop()
                child.conn.send(("grade", [items[index]]))
                busy[slot] = (index, time.monotonic() + timeout_seconds)
            now = time.monotonic()
            first_deadline = min(deadline for _, deadline in busy.values())
            conns = {children[slot].conn: slot for slot in busy}  # type: ignore[union-attr]
            for ready in wait(list(conns), timeout=max(0.0, first_deadline - now)):
                slot = conns[ready]
                index, _ = busy.pop(slot)
                try:
                    _, verdict, refused = ready.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):  # the child died (e.g. killed by the OS): replace it
                    children[slot].kill()  # type: ignore[union-attr]
                    children[slot] = None
                    kills += 1
                    continue
                results[index] = verdict
                if refused is not None:
                    refusals.append(refused)
            now = time.monotonic()
            for slot, (_, deadline) in list(busy.items()):
                if now >= deadline:  # over budget: the answer scores False; replace the child
                    del busy[slot]
                    children[slot].kill()  # type: ignore[union-attr]
                    children[slot] = None
                    kills += 1
        return results

    if ctx.get_start_method() == "fork":
        children[0] = _Child(ctx, soft_timeout, memory_limit_mb, supervisor)
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "grade":
                conn.send(("result", grade(message[1])))
            elif message[0] == "info":
                info = {"guard": _eval_guard_active(), "kills": kills, "refusals": len(refusals)}
                info.update(refused_samples=refusals[:20], workers=num_workers, pid=os.getpid())
                conn.send(("info", info))
            else:
                break
    finally:
        for child in children:
            if child is not None:
                child.kill()


# Directory holding the imported ``mcadvantage`` package: the grading process imports the same copy
# (it may come from a sys.path entry the caller added at run time, or a source checkout).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _StderrTail:
    """Forwards the grading process' stderr to ours and keeps its tail, to name a start-up failure.

    A thread rather than an inherited stderr because a process that dies before it can report (a broken
    interpreter, a missing package) leaves its reason only there. It writes with ``os.write`` on fd 2,
    where an inherited stderr would have written, and so takes none of ``sys.stderr``'s locks (a daemon
    thread holding them at interpreter exit can abort the interpreter).
    """

    _KEEP = 4096  # bytes of tail kept for the error message

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._tail = b""
        self._thread = threading.Thread(target=self._run, name="mcadvantage-grader-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                self._tail = (self._tail + chunk)[-self._KEEP :]
                try:
                    os.write(2, chunk)
                except OSError:  # no stderr to forward to: keep only the tail
                    pass
        except OSError:
            pass
        finally:
            os.close(self._fd)

    def last_line(self, wait: float) -> str:
        """The last non-empty line written, after waiting up to ``wait`` s for the stream to end."""
        self._thread.join(wait)
        lines = [line.strip() for line in self._tail.decode(errors="replace").splitlines()]
        return next((line for line in reversed(lines) if line), "")[:300]

    def join(self, wait: float) -> None:
        self._thread.join(wait)


#: Seconds a grading call waits beyond its answers' own budgets before it gives the grading process up for hung
#: (stopped, or stuck outside its children), kills it and retries the call once in a fresh one.
_BACKSTOP_SLACK_SECONDS = 30.0


class _GradingService:
    """Parent-side client of the supervisor process; thread-safe, started lazily, restarted on failure."""

    def __init__(
        self,
        timeout_seconds: float,
        memory_limit_mb: int | None,
        startup_timeout: float,
        interrupt_in_child: bool,
        num_workers: int,
        python_executable: str | None,
    ) -> None:
        self.num_workers = num_workers
        self.timeout_seconds = timeout_seconds
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout = startup_timeout
        self.interrupt_in_child = interrupt_in_child
        self.python_executable = python_executable
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Any = None
        self._stderr: _StderrTail | None = None

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _start(self) -> None:
        from multiprocessing.connection import Connection

        from mcadvantage.tasks._grading_worker import BOOTSTRAP

        if os.name != "posix":
            raise RuntimeError(
                "MathVerifier's grading process needs a POSIX system (Linux or macOS): it hands a socket "
                f"to a subprocess and forks grading children, which {sys.platform!r} cannot. On Windows "
                "run under WSL."
            )
        executable = self.python_executable or sys.executable
        if not executable:
            raise RuntimeError(
                "MathVerifier cannot start its grading process: sys.executable is empty (embedded "
                "Python?). Pass MathVerifier(python_executable=...) the path of a Python interpreter "
                "that has mcadvantage and math-verify installed."
            )
        # A connected socket pair handed to the child by file descriptor: no listening address, and the
        # child sees end-of-file as soon as this process exits or dies.
        parent_sock, child_sock = socket.socketpair()
        err_read, err_write = os.pipe()
        try:
            process = subprocess.Popen(
                [executable, "-c", BOOTSTRAP, _PACKAGE_ROOT, str(child_sock.fileno())],
                stdin=subprocess.DEVNULL,
                stderr=err_write,
                pass_fds=(child_sock.fileno(),),
                # Its own session: a Ctrl-C in the terminal interrupts the caller, not the grader; the
                # grader still exits when the caller does (end-of-file on the socket).
                start_new_session=True,
            )
        except OSError as exc:
            parent_sock.close()
            os.close(err_read)
            raise RuntimeError(
                f"MathVerifier cannot start its grading process with python_executable={executable!r}: "
                f"{exc.strerror or exc}. Pass python_executable= the path of a Python interpreter that "
                "has mcadvantage and math-verify installed."
            ) from None
        finally:
            child_sock.close()
            os.close(err_write)
        conn = Connection(parent_sock.detach())
        self._process, self._conn, self._stderr = process, conn, _StderrTail(err_read)
        settings = {
            "sys_path": list(sys.path),
            "timeout_seconds": self.timeout_seconds,
            "memory_limit_mb": self.memory_limit_mb,
            "interrupt_in_child": self.interrupt_in_child,
            "num_workers": self.num_workers,
        }
        message: Any = None
        try:
            conn.send(settings)
            if conn.poll(self.startup_timeout):
                message = conn.recv()
        except (EOFError, OSError):  # it exited before answering; its stderr says why
            message = ("exited",)
        except BaseException:  # interrupted (Ctrl-C): an unread "ready" would answer the next request
            self._stop(graceful=False)
            raise
        if message is not None and message[0] == "ready":
            return
        stderr = self._stderr
        if message is not None:  # it reported an error or closed the socket: let it finish exiting
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._stop(graceful=False)
        if message is None:
            raise RuntimeError(
                f"MathVerifier's grading process ({executable}) did not start within "
                f"{self.startup_timeout} s; check that `{executable} -c 'import math_verify'` works, or "
                "raise MathVerifier(startup_timeout=...) on a slow file system."
            )
        if message[0] == "error":  # the process reported the exception itself
            cause = message[1]
        else:  # it died before it could: its last line of stderr is the best explanation
            line = stderr.last_line(2.0) if stderr is not None else ""
            cause = f"it exited with code {process.returncode}" + (f" ({line})" if line else "")
        raise RuntimeError(
            f"MathVerifier's grading process ({executable}) failed to start: {cause}. Check that "
            f"`{executable} -c 'import mcadvantage, math_verify'` works, or pass "
            "MathVerifier(python_executable=...) a Python interpreter that has both installed."
        )

    def _stop(self, graceful: bool = True) -> None:
        process, conn, stderr = self._process, self._conn, self._stderr
        if process is None:
            return
        self._process = self._conn = self._stderr = None
        if graceful:
            try:
                conn.send(("close",))
            except (OSError, ValueError):
                pass
        try:
            process.wait(2 if graceful else 0.2)
        except subprocess.TimeoutExpired:
            # Kill its whole process group (its own session, see _start): a grading child stuck in C
            # code would otherwise outlive the supervisor. Not yet reaped, so the group id is still ours.
            try:
                os.killpg(process.pid, 9)  # SIGKILL (signal.SIGKILL is missing on Windows)
            except OSError:
                process.kill()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:  # unkillable (e.g. stuck in the kernel): stop waiting
                pass
        conn.close()
        if stderr is not None:
            stderr.join(1.0)

    def _request(self, message: tuple[Any, ...], backstop: float) -> Any:
        for attempt in range(2):
            if not self._alive():
                self._stop(graceful=False)
                self._start()
            try:
                self._conn.send(message)
                if self._conn.poll(backstop):
                    return self._conn.recv()[1]
            except (EOFError, OSError):
                pass
            except BaseException:
                # Interrupted between request and answer (e.g. KeyboardInterrupt): the answer would
                # arrive as the reply to the next request, so drop this process; the next call restarts.
                self._stop(graceful=False)
                raise
            # The supervisor only waits on its children, so this is a should-never-happen path.
            logger.warning("math grading process stopped answering (attempt %d); restarting", attempt + 1)
            self._stop(graceful=False)
        return None

    def grade(self, items: list[tuple[str, str]]) -> list[bool]:
        if not items:
            return []
        with self._lock:
            backstop = _BACKSTOP_SLACK_SECONDS + len(items) * (self.timeout_seconds + 1.0) / self.num_workers
            results = self._request(("grade", items), backstop)
        return list(results) if results is not None else [False] * len(items)

    def info(self) -> dict[str, Any]:
        with self._lock:
            return self._request(("info",), 30.0) or {}

    def warmup(self) -> None:
        with self._lock:
            if not self._alive():
                self._stop(graceful=False)
                self._start()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's grading process without touching it.

        The child inherited the lock (possibly held by a parent thread that does not exist here) and a
        copy of the parent's socket; using that socket would interleave both processes' requests and
        answers. The child gets a fresh lock and starts its own grading process when it needs one.
        """
        self._lock = threading.Lock()
        if self._conn is not None:
            self._conn.close()  # closes this process' copy of the descriptor only
        if self._process is not None:
            # Kept referenced: collecting the Popen would try to reap a process that is not our child.
            _INHERITED_PROCESSES.append(self._process)
        self._process = self._conn = self._stderr = None


# (timeout_seconds, memory_limit_mb, startup_timeout, interrupt_in_child, num_workers, python_executable)
_SERVICES: dict[tuple[Any, ...], _GradingService] = {}
_SERVICES_LOCK = threading.Lock()
# Guards every MathVerifier's verdict cache (a module lock keeps verifiers picklable; holds are brief).
_CACHE_LOCK = threading.Lock()
_INHERITED_PROCESSES: list[Any] = []


def _service_for(
    timeout_seconds: float,
    memory_limit_mb: int | None,
    startup_timeout: float,
    interrupt_in_child: bool,
    num_workers: int,
    python_executable: str | None,
) -> _GradingService:
    # Verifiers with the same limits share one grading process (TRL may build several reward funcs).
    key = (
        timeout_seconds,
        memory_limit_mb,
        startup_timeout,
        interrupt_in_child,
        num_workers,
        python_executable,
    )
    with _SERVICES_LOCK:
        service = _SERVICES.get(key)
        if service is None:
            service = _SERVICES[key] = _GradingService(*key)
        return service


@atexit.register
def _close_services() -> None:
    # Ask each grading process to finish (it would also exit on end-of-file once we are gone, but an
    # orderly close reaps it and its grading children before the interpreter exits).
    for service in list(_SERVICES.values()):
        service.close()


def _after_fork_in_child() -> None:
    global _SERVICES_LOCK, _CACHE_LOCK
    _SERVICES_LOCK = threading.Lock()
    _CACHE_LOCK = threading.Lock()
    for service in _SERVICES.values():
        service.forget_after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------------------------
# MATH verifier
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------

_VERIFIERS: dict[str, Callable[..., _VerifierBase]] = {"gsm8k": GSM8KVerifier, "math": MathVerifier}


def get_verifier(name: str, **kwargs: Any) -> GSM8KVerifier | MathVerifier:
    """A verifier by task name: ``"gsm8k"`` or ``"math"``; ``kwargs`` go to its constructor."""
    key = name.lower().strip() if isinstance(name, str) else name
    if key not in _VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; choose one of {sorted(_VERIFIERS)}.")
    return _VERIFIERS[key](**kwargs)  # type: ignore[return-value]
