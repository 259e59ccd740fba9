"""A synthetic multi-step arithmetic task in GSM8K format, generated deterministically from a seed.

Each problem starts from a number and applies 2-5 operations (add or subtract 1-9, double, triple,
halve); every intermediate value stays in ``[0, max_value]`` and halving only applies to even
numbers, so every step is exact integer arithmetic. The reference solution writes one equation per
line and ends with GSM8K's ``#### N`` answer line, so the library's ``GSM8KSegmenter`` splits it
into one reasoning step per operation and ``GSM8KVerifier`` grades it::

    Start with 12. Subtract 3, then double it. What is the result?
    12-3=9
    9*2=18
    #### 18

Real datasets cannot be downloaded offline; this task keeps the demo self-contained while having
the property VinePPO exploits: several reasoning steps, each of which can go wrong.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FLAW_DESCRIPTION",
    "ArithmeticProblem",
    "Operation",
    "generate_problems",
    "make_problem",
    "skip_last_solution",
    "to_rows",
]


@dataclass(frozen=True)
class Operation:
    """One operation: ``kind`` is ``"add"``, ``"sub"``, ``"mul"`` (by ``operand`` 2 or 3) or
    ``"half"``."""

    kind: str
    operand: int

    def apply(self, value: int) -> int:
        """The exact result of applying the operation to ``value``."""
        if self.kind == "add":
            return value + self.operand
        if self.kind == "sub":
            return value - self.operand
        if self.kind == "mul":
            return value * self.operand
        if self.kind == "half":
            return value // 2
        raise ValueError(f"Operation.kind must be add, sub, mul or half, got {self.kind!r}.")

    def phrase(self) -> str:
        """How the prompt words the operation."""
        if self.kind == "add":
            return f"add {self.operand}"
        if self.kind == "sub":
            return f"subtract {self.operand}"
        if self.kind == "mul":
            return "double it" if self.operand == 2 else "triple it"
        return "halve it"

    def equation(self, value: int) -> str:
        """The solution line, e.g. ``"9*2=18"``."""
        symbol = {"add": "+", "sub": "-", "mul": "*", "half": "/"}[self.kind]
        operand = 2 if self.kind == "half" else self.operand
        return f"{value}{symbol}{operand}={self.apply(value)}"


@dataclass(frozen=True)
class ArithmeticProblem:
    """A problem: the start value, its operations, the prompt, the reference solution and the
    answer (as a string, like GSM8K's gold answers)."""

    start: int
    operations: tuple[Operation, ...]
    prompt: str
    solution: str
    answer: str

    @property
    def num_steps(self) -> int:
        return len(self.operations)

    @property
    def values(self) -> list[int]:
        """The start value followed by every intermediate result."""
        out = [self.start]
        for op in self.operations:
            out.append(op.apply(out[-1]))
        return out


def make_problem(start: int, operations: Sequence[Operation]) -> ArithmeticProblem:
    """Build the prompt, solution and answer for a start value and a list of operations."""
    if not operations:
        raise ValueError("make_problem needs at least one operation, got an empty list.")
    phrases = [op.phrase() for op in operations]
    first = phrases[0][0].upper() + phrases[0][1:]
    rest = "".join(f", then {p}" for p in phrases[1:])
    prompt = f"Start with {start}. {first}{rest}. What is the result?\n"
    lines = []
    value = start
    for op in operations:
        lines.append(op.equation(value))
        value = op.apply(value)
    solution = "\n".join(lines) + f"\n#### {value}"
    return ArithmeticProblem(start, tuple(operations), prompt, solution, str(value))


def skip_last_solution(problem: ArithmeticProblem) -> str:
    """A flawed reference solution that forgets the last operation: the equations of every operation but
    the last, then ``#### <the value before the last operation>`` (wrong by construction).

    The demo's warm-up data contains such "lazy" demonstrations for long problems, as real supervised
    data contains mistakes: imitation learns to make them, a verifier's reward can unlearn them.
    """
    if problem.num_steps < 2:
        raise ValueError(
            f"skip_last_solution needs a problem with >= 2 operations, got {problem.num_steps}; a one-operation "
            "solution with its only operation skipped would have no equation line."
        )
    lines = problem.solution.split("\n")[: problem.num_steps - 1]
    return "\n".join(lines) + f"\n#### {problem.values[-2]}"


#: How the demo's messages word its one flaw (:func:`skip_last_solution`). The studies' other flaws and variations of
#: the demonstrations are the research testbed's (``testbed/tasks.py`` in a repository checkout, not in the wheel).
FLAW_DESCRIPTION = "the last operation forgotten"


def _valid_operations(value: int, max_value: int) -> list[Operation]:
    ops = [Operation("add", k) for k in range(1, 10) if value + k <= max_value]
    ops += [Operation("sub", k) for k in range(1, 10) if value - k >= 0]
    ops += [Operation("mul", k) for k in (2, 3) if value * k <= max_value]
    if value % 2 == 0 and value > 0:
        ops.append(Operation("half", 2))
    return ops


def generate_problems(
    n: int,
    *,
    seed: int,
    min_steps: int = 2,
    max_steps: int = 5,
    max_value: int = 99,
    exclude: set[str] | None = None,
) -> list[ArithmeticProblem]:
    """``n`` distinct problems, deterministic in ``seed``.

    The number of steps is uniform in ``[min_steps, max_steps]``; operations are drawn uniformly
    among the kinds (add, subtract, multiply, halve) that keep the value in ``[0, max_value]``
    (then uniformly within the kind), so multiplications and halvings are as frequent as additions.
    Problems whose prompt is in ``exclude`` are skipped (to keep evaluation sets disjoint from
    training sets).
    """
    if n < 0:
        raise ValueError(f"generate_problems: n must be >= 0, got {n}.")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(
            f"generate_problems: need 1 <= min_steps <= max_steps, got min_steps={min_steps}, "
            f"max_steps={max_steps}."
        )
    if max_value < 10:
        raise ValueError(f"generate_problems: max_value must be >= 10, got {max_value}.")
    rng = random.Random(seed)
    seen: set[str] = set(exclude or ())
    problems: list[ArithmeticProblem] = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(
                f"generate_problems could only find {len(problems)} distinct problems out of n={n}; "
                "lower n or widen min_steps/max_steps/max_value."
            )
        num_steps = rng.randint(min_steps, max_steps)
        value = rng.randint(1, max_value // 2)
        start = value
        ops: list[Operation] = []
        for _ in range(num_steps):
            valid = _valid_operations(value, max_value)
            by_kind: dict[str, list[Operation]] = {}
            for op in valid:
                by_kind.setdefault(op.kind, []).append(op)
            kind = rng.choice(sorted(by_kind))
            op = rng.choice(by_kind[kind])
            ops.append(op)
            value = op.apply(value)
        problem = make_problem(start, ops)
        if problem.prompt in seen:
            continue
        seen.add(problem.prompt)
        problems.append(problem)
    return problems


def to_rows(problems: Sequence[ArithmeticProblem]) -> list[dict[str, str]]:
    """Dataset rows for TRL: ``prompt`` (text), ``answer`` (the gold number, graded by
    ``GSM8KVerifier``) and ``solution`` (the reference solution)."""
    return [{"prompt": p.prompt, "answer": p.answer, "solution": p.solution} for p in problems]
