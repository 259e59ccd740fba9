"""The studies' task variants (docs/learning-efficiency.md, docs/regime-protocol.md): the named task presets, the
``slip`` and ``sign`` flaws and the harmless lead-ins they add to the demo's data, and their held-out prompt sets.

The demo (``mcadvantage.demo``) generates the arithmetic task and its one flaw, ``skip_last``; the studies vary it
with the settings of :class:`StudyConfig` (a :class:`~mcadvantage.demo.config.DemoConfig` plus ``flaw`` and
``lead_ins``), whose data :func:`build_data` makes from the demo's own pieces
(:func:`~mcadvantage.demo.config.problem_sets`, :func:`~mcadvantage.demo.config.demonstrations`): the ``sign``
task's demonstrations are exactly those of before the variants left the package (same generators, same draws).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from mcadvantage.demo import config as demo_config
from mcadvantage.demo.config import DemoConfig, DemoData, demonstrations, problem_sets
from mcadvantage.demo.task import FLAW_DESCRIPTION, ArithmeticProblem, skip_last_solution

__all__ = [
    "FLAWS",
    "LEAD_INS",
    "TASK_PRESETS",
    "Flaw",
    "StudyConfig",
    "build_data",
    "held_out_problems",
    "random_slip",
    "sign_flip_solution",
    "slip_solution",
    "with_lead_ins",
]


def slip_solution(problem: ArithmeticProblem, step: int, delta: int) -> str:
    """A flawed reference solution with an arithmetic slip: the result of operation ``step`` (0-based) is
    off by ``delta``, and every later operation is applied, correctly, to the wrong value, so the final
    answer is wrong while only one line is. Where the demonstrations' mistakes sit decides how much a
    per-step credit can localise them: a slip anywhere in the middle, unlike a forgotten last operation.

    ``delta`` must be a multiple of ``2**h`` when ``h`` later operations halve (each halving halves the
    error, which must stay even for the next one to be exact) and must keep the slipped value >= 0; both
    are checked.
    """
    if not 0 <= step < problem.num_steps:
        raise ValueError(f"slip_solution: step must be in [0, {problem.num_steps}), got {step}.")
    if delta == 0:
        raise ValueError("slip_solution: delta must be non-zero (a zero slip is the correct solution).")
    unit = 2 ** sum(op.kind == "half" for op in problem.operations[step + 1 :])
    if delta % unit:
        raise ValueError(
            f"slip_solution: delta must be a multiple of {unit} when {unit.bit_length() - 1} later operation(s) "
            f"halve (got {delta}); otherwise a halving would be inexact."
        )
    values = problem.values
    lines = [op.equation(v) for op, v in zip(problem.operations[:step], values[:step], strict=True)]
    wrong = values[step + 1] + delta
    if wrong < 0:
        raise ValueError(f"slip_solution: the slipped value {wrong} is negative; pick another delta.")
    op = problem.operations[step]
    symbol = {"add": "+", "sub": "-", "mul": "*", "half": "/"}[op.kind]
    lines.append(f"{values[step]}{symbol}{2 if op.kind == 'half' else op.operand}={wrong}")
    value = wrong
    for later in problem.operations[step + 1 :]:
        lines.append(later.equation(value))
        value = later.apply(value)
    return "\n".join(lines) + f"\n#### {value}"


def random_slip(problem: ArithmeticProblem, rng: random.Random) -> str:
    """:func:`slip_solution` at a uniformly random operation with a random valid ``delta``: one of
    {-2, -1, 1, 2}, times ``2**h`` when ``h`` later operations halve."""
    step = rng.randrange(problem.num_steps)
    unit = 2 ** sum(op.kind == "half" for op in problem.operations[step + 1 :])
    candidates = (-2, 2) if unit > 1 else (-2, -1, 1, 2)
    deltas = [d * (unit if unit > 1 else 1) // (2 if unit > 1 else 1) for d in candidates]
    deltas = [d for d in deltas if problem.values[step + 1] + d >= 0]
    return slip_solution(problem, step, rng.choice(deltas))


def sign_flip_solution(problem: ArithmeticProblem) -> str | None:
    """A flawed reference solution with a *systematic* mistake mid-solution: the first subtraction that is not
    the last operation is done as an addition (``12+3=15`` where the prompt says "subtract 3"), and every later
    operation is applied, correctly, to the wrong value. Unlike :func:`random_slip`, the mistake is the same
    every time (always that subtraction, always that sign), so imitation learns to make it at the rate the
    demonstrations make it rather than averaging it away; unlike :func:`skip_last_solution`, it sits before the
    last line.

    Returns None when the problem has no subtraction before its last operation, or when a later halving would
    meet an odd value (the flipped chain would be inexact): such a problem keeps its correct solution.
    """
    step = next((i for i, op in enumerate(problem.operations[:-1]) if op.kind == "sub"), None)
    if step is None:
        return None
    values = problem.values
    lines = [op.equation(v) for op, v in zip(problem.operations[:step], values[:step], strict=True)]
    operand = problem.operations[step].operand
    value = values[step] + operand
    lines.append(f"{values[step]}+{operand}={value}")
    for later in problem.operations[step + 1 :]:
        if later.kind == "half" and value % 2:
            return None
        lines.append(later.equation(value))
        value = later.apply(value)
    return "\n".join(lines) + f"\n#### {value}"


#: Harmless variation (:func:`with_lead_ins`): words a solution line may start with; none changes the answer.
LEAD_INS = ("", "so ", "then ", "now ")


def with_lead_ins(solution: str, rng: random.Random) -> str:
    """``solution`` with a random lead-in from :data:`LEAD_INS` before every equation line (not the ``####`` answer
    line): choices that never change the outcome, over which an outcome-level reward spreads its credit."""
    lines = solution.split("\n")
    return "\n".join([rng.choice(LEAD_INS) + line for line in lines[:-1]] + lines[-1:])


@dataclass(frozen=True)
class Flaw:
    """What a flawed demonstration gets wrong (a value of :attr:`StudyConfig.flaw`)."""

    #: how messages word it
    description: str
    #: ``(problem, the flaw's own random generator) -> the flawed solution``; None when this problem cannot have the
    #: mistake (its demonstration then stays correct)
    write: Callable[[ArithmeticProblem, random.Random], str | None]


#: The flaws :attr:`StudyConfig.flaw` may name: the demo's ``skip_last`` and the studies' ``slip`` and ``sign``.
FLAWS: dict[str, Flaw] = {
    "skip_last": Flaw(FLAW_DESCRIPTION, lambda problem, _rng: skip_last_solution(problem)),
    "slip": Flaw("one arithmetic slip at a random operation", random_slip),
    "sign": Flaw(
        "the first subtraction before the last operation done as an addition",
        lambda p, _rng: sign_flip_solution(p),
    ),
}


@dataclass
class StudyConfig(DemoConfig):
    """The demo's settings plus the studies' variations of its data (what :data:`TASK_PRESETS` set)."""

    # What a flawed demonstration gets wrong (a key of FLAWS): "skip_last" forgets the last operation (the demo's);
    # "slip" makes one arithmetic slip at a random operation, the wrong value carried on; "sign" does an addition at
    # the first subtraction before the last operation.
    flaw: str = "skip_last"
    # Harmless variation: every demonstration's equation lines start with a random lead-in ("", "so ", "then ",
    # "now "), choices that never change the answer.
    lead_ins: bool = False

    # Both decide the warm-up, recorded where they always were in warmup.json (after flawed_demo_min_steps).
    warmup_fields: ClassVar[tuple[str, ...]] = (
        *DemoConfig.warmup_fields[: DemoConfig.warmup_fields.index("flawed_demo_min_steps") + 1],
        "flaw",
        "lead_ins",
        *DemoConfig.warmup_fields[DemoConfig.warmup_fields.index("flawed_demo_min_steps") + 1 :],
    )
    # The first checkpoints were recorded before lead_ins existed.
    legacy_warmup_settings: ClassVar[dict[str, Any]] = {
        **DemoConfig.legacy_warmup_settings,
        "lead_ins": False,
    }


def build_data(config: DemoConfig) -> DemoData:
    """The problem sets and warm-up demonstrations of a study task: for a plain ``DemoConfig`` the demo's own
    (``mcadvantage.demo.config.build_data``); for a :class:`StudyConfig`, the same problems with its flaw's
    demonstrations, and with ``lead_ins`` every demonstration's lines led in (the variation's own generator, drawn
    demonstration by demonstration, so the flaws and their pattern are the same with or without it)."""
    if not isinstance(config, StudyConfig):
        return demo_config.build_data(config)
    if config.flaw not in FLAWS:
        raise ValueError(f"build_data: flaw must be one of {sorted(FLAWS)}, got {config.flaw!r}.")
    sets = problem_sets(config)
    warmup, flawed = demonstrations(config, sets.warmup_set, FLAWS[config.flaw].write)
    if config.lead_ins:
        variation_rng = random.Random(7_000_003 * (config.seed + 1))
        warmup = [(prompt, with_lead_ins(solution, variation_rng)) for prompt, solution in warmup]
    return DemoData(
        eval_set=sets.eval_set,
        warmup=warmup,
        flawed=flawed,
        rl_set=sets.rl_set,
        validation_set=sets.validation_set,
    )


#: The studies' tasks as :class:`StudyConfig` settings (docs/learning-efficiency.md, docs/regime-protocol.md); the
#: benchmarks and ``python -m testbed.make_warmup --task`` read them from here.
TASK_PRESETS: dict[str, dict[str, Any]] = {
    # The demo task: 2-5 operations, 60% of the 4+ operation demonstrations forget the last operation.
    "demo": {},
    # Longer reasoning: 5-8 operations, the same flaw on 60% of all demonstrations (every problem has 5+).
    # max_completion_length 88: the longest 8-operation prompt has 166 tokens and the model's context is 256 (the
    # first run used 96, which TRL's prompt-length check refused; the longest solution is about 72 tokens).
    "long": {"min_steps": 5, "max_steps": 8, "flawed_demo_min_steps": 5, "max_completion_length": 88},
    # Where the mistakes sit: the demo's problems and flawed demonstrations (same problems, same count), but a
    # flawed demonstration makes one arithmetic slip at a random operation instead of forgetting the last one.
    "slip": {"flaw": "slip"},
    # H2 with a flaw supervised training keeps: the demo's problems, but a flawed demonstration (60% of those with 3+
    # operations) adds at its first subtraction before the last operation, and every demonstration's lines start with
    # a random harmless lead-in. max_completion_length 88: lead-ins add up to 5 characters per line.
    "sign": {"flaw": "sign", "lead_ins": True, "flawed_demo_min_steps": 3, "max_completion_length": 88},
}


def held_out_problems(config: DemoConfig, count: int, *, min_operations: int = 0) -> list[ArithmeticProblem]:
    """The first ``count`` held-out problems of ``config`` with at least ``min_operations`` operations (the
    benchmarks' prompt sets; 5 operations: the plateau policy's hard prompts)."""
    problems = [p for p in build_data(config).eval_set if p.num_steps >= min_operations][:count]
    if len(problems) < count:
        raise ValueError(
            f"held_out_problems: count={count}, but the held-out set has only {len(problems)} problems with >= "
            f"{min_operations} operations; ask for fewer."
        )
    return problems
