"""Segmenters on the real reference solutions (GSM8K train+test, MATH-500); skipped without ../shared."""

from __future__ import annotations

import re

import pytest
from conftest import load_jsonl, shared_file

from mcadvantage.tasks import GSM8KSegmenter, MathSegmenter


@pytest.fixture(scope="module")
def gsm8k_answers() -> list[str]:
    rows = load_jsonl(shared_file("data/gsm8k/train.jsonl")) + load_jsonl(
        shared_file("data/gsm8k/test.jsonl")
    )
    return [r["answer"] for r in rows]


@pytest.fixture(scope="module")
def math_solutions() -> list[str]:
    return [r["solution"] for r in load_jsonl(shared_file("data/math/test.jsonl"))]


def test_gsm8k_reference_solutions(gsm8k_answers):
    assert len(gsm8k_answers) == 8792
    seg = GSM8KSegmenter()
    for text in gsm8k_answers:
        steps = seg(text)
        assert "".join(steps) == text
        lines = [line for line in text.split("\n") if line.strip()]
        # one step per non-blank line, the "####" line folded into the last one
        assert len(steps) == len(lines) - 1
        assert all(step.endswith("\n") for step in steps[:-1])
        assert not any(step.lstrip().startswith("####") for step in steps)
        assert steps[-1].split("\n")[-1].startswith("####")


def test_gsm8k_with_math_segmenter_and_caps(gsm8k_answers):
    segs = [MathSegmenter(), GSM8KSegmenter(max_steps=3), MathSegmenter(max_steps=2)]
    for text in gsm8k_answers:
        for seg in segs:
            steps = seg(text)
            assert "".join(steps) == text
            assert all(steps)
            assert seg.max_steps is None or len(steps) <= seg.max_steps


def test_math_solutions_reconstruct(math_solutions):
    assert len(math_solutions) == 500
    for seg in (MathSegmenter(), GSM8KSegmenter(), MathSegmenter(max_part_length=50, min_part_length=0)):
        for text in math_solutions:
            steps = seg(text)
            assert "".join(steps) == text
            assert all(steps)


# An independent definition of math spans for this test (regular expressions, not the segmenter's
# scanner): escaped dollars first, then $$..$$, $..$, \(..\), \[..\], \begin{env}..\end{env}.
_SPAN = re.compile(
    r"\\\$"
    r"|(?P<dd>\$\$(?:\\.|[^$\\])+?\$\$)"
    r"|(?P<d>\$(?:\\.|[^$\\])+?\$)"
    r"|(?P<paren>\\\((?:\\[^)]|[^\\])*?\\\))"
    r"|(?P<bracket>\\\[(?:\\[^\]]|[^\\])*?\\\])"
    r"|(?P<env>\\begin\{(?P<name>[A-Za-z*]+)\}.*?\\end\{(?P=name)\})",
    re.S,
)


def _reference_spans(text: str) -> list[tuple[int, int, bool]]:
    spans = []
    for m in _SPAN.finditer(text):
        if m.lastgroup is None or m.group(0) == "\\$":
            continue
        display = m.group("d") is None and m.group("paren") is None
        spans.append((m.start(), m.end(), display))
    return spans


def _brace_depth(s: str) -> int:
    s = s.replace("\\{", "").replace("\\}", "")
    return s.count("{") - s.count("}") + s.count("\\left") - s.count("\\right")


_SIZED_DELIMITER = re.compile(r"\\(?:left|right)\s*(?:\\[A-Za-z]+|\\.|.)")
_INNERMOST_GROUP = re.compile(r"\{[^{}]*\}")


def _open_brackets(s: str) -> int:
    """Round/square brackets left open in ``s``, outside braces: ``(`` and ``[`` against ``)`` and
    ``]`` (one kind, so ``[0, 1)`` is closed); a closer with nothing open is ignored."""
    s = _SIZED_DELIMITER.sub("", s.replace("\\{", "").replace("\\}", ""))
    while True:  # drop brace groups, innermost first
        s, n = _INNERMOST_GROUP.subn("", s)
        if n == 0:
            break
    open_ = 0
    for c in s:
        if c in "([":
            open_ += 1
        elif c in ")]" and open_:
            open_ -= 1
    return open_


# amsmath environments that only align rows inside \[..\] / $$..$$: their rows may be cut.
_ROW_ENVS = re.compile(r"\\(begin|end)\{(?:aligned|alignedat|gathered|split)\}")


def test_math_no_boundary_inside_math(math_solutions):
    """No step boundary inside inline math; inside display math only between whole sides of an
    equation chain: after a row break ``\\\\``, before a top-level ``=`` / ``+``, or after a
    top-level ``,`` (depth 0 in braces, ``\\left..\\right``, environments other than the row
    layouts ``aligned``/``gathered``/``split``, and round/square brackets)."""
    seg = MathSegmenter()
    inside_display = 0
    checked_spans = 0
    for text in math_solutions:
        steps = seg(text)
        cuts, acc = [], 0
        for s in steps[:-1]:
            acc += len(s)
            cuts.append(acc)
        spans = _reference_spans(text)
        checked_spans += len(spans)
        for cut in cuts:
            for start, end, display in spans:
                if not start < cut < end:
                    continue
                assert display, f"cut inside inline math: {text[start:end]!r} at {cut - start}"
                inside_display += 1
                before, after = text[start:cut], text[cut:end]
                ok = (
                    before.rstrip("\n \t").endswith("\\\\")
                    or after.lstrip(" \t").startswith(("=", "&=", "+", "<=", ">=", "&"))
                    or before.endswith(",")
                )
                assert ok, f"cut at an unexpected place in display math: {before[-30:]!r} | {after[:30]!r}"
                # content before the cut, without the opening delimiter, must be balanced
                if before.startswith("\\begin{"):
                    inner_before = before[before.index("}") + 1 :]
                else:
                    inner_before = before[2:] if before.startswith(("\\[", "$$")) else before
                env_text = _ROW_ENVS.sub("", inner_before)
                env_depth = env_text.count("\\begin{") - env_text.count("\\end{")
                assert _brace_depth(inner_before) == 0 and env_depth == 0, (before[-40:], after[:20])
                # before brackets were tracked, MathSegmenter cut inside them 26 times in 15 solutions
                assert _open_brackets(inner_before) == 0, f"cut inside brackets: {before[-40:]!r}"
    assert checked_spans > 2000  # the reference definition finds the math
    assert inside_display > 0  # long display blocks really are cut (rule 3), and checked above


def test_math_long_parts_are_split(math_solutions):
    """Most parts respect the 100-character limit; the rest have no allowed cut point."""
    seg = MathSegmenter()
    lengths = [len(s) for text in math_solutions for s in seg(text)]
    over = sum(1 for n in lengths if n > 100)
    assert over / len(lengths) < 0.10
    raw = MathSegmenter(max_part_length=10**6)  # no re-splitting at all
    raw_over = sum(1 for text in math_solutions for s in raw(text) if len(s) > 100)
    assert over < raw_over / 2
