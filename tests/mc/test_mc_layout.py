"""The Monte Carlo pipeline stays in small steps: :meth:`MCValueEstimator.estimate` reads in one screen and no
function of :mod:`mcadvantage.mc` takes more than a handful of parameters (group them in a record instead), checked
on the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

MC = Path(__file__).resolve().parents[2] / "src" / "mcadvantage" / "mc"
MAX_ESTIMATE_LINES = 60
MAX_PARAMETERS = 8


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters, positional and keyword-only, without ``self``/``cls``. A ``*args``/``**kwargs`` catch-all
    is not counted: ``MCValueEstimator(**setting_values)`` is a way to spell fields of one record (MCSettings)."""
    args = node.args
    names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def too_many_parameters(source: str) -> list[str]:
    return [
        f"{f.name} ({parameter_count(f)})" for f in functions(source) if parameter_count(f) > MAX_PARAMETERS
    ]


def method_lines(source: str, cls: str, name: str) -> int:
    """Lines of ``cls.name``, from its ``def`` line to its last line (docstring included)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item.end_lineno - item.lineno + 1  # type: ignore[operator]
    raise AssertionError(f"{cls}.{name} not found")


def test_the_checks_have_power():
    planted = (
        "class A:\n"
        "    def ok(self, a, b, c, d, e, f, g, h, *rest, **more): pass\n"
        "    def wide(self, a, b, c, d, e, f, g, *, h, i): pass\n"
        "def long(a):\n" + "    x = 1\n" * 70
    )
    assert too_many_parameters(planted) == ["wide (9)"]
    assert method_lines("class A:\n    def f(self):\n        x = 1\n        return x\n", "A", "f") == 3


def test_estimate_reads_in_one_screen():
    lines = method_lines((MC / "estimator.py").read_text(encoding="utf-8"), "MCValueEstimator", "estimate")
    assert lines <= MAX_ESTIMATE_LINES, (
        f"MCValueEstimator.estimate is {lines} lines (at most {MAX_ESTIMATE_LINES}); move a step into a function"
    )


def test_no_mc_function_takes_more_than_eight_parameters():
    wide = {
        path.name: found
        for path in sorted(MC.glob("*.py"))
        if (found := too_many_parameters(path.read_text(encoding="utf-8")))
    }
    assert not wide, f"group these parameters into a record (at most {MAX_PARAMETERS}): {wide}"
