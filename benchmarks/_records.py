"""How a re-run is compared with a committed record: within a stated tolerance, never bit for bit.

A record made on one CPU and a re-run on another can differ in the last bits of a float64: the vector instruction set
(AVX-512, AVX2 or none; numpy's and torch's dispatch) changes the order of sums and the kernels of ``exp``/``log``.
``tests/benchmarks/test_records.py`` shows it on the agent credit toy: with torch's kernels limited to its portable
ones (``ATEN_CPU_CAPABILITY=default``), the study's runs move by up to 1.4e-15 while their token counts and steps stay.
So every comparison of a re-run with a record goes through this module, with one of three rules:

- :data:`EXACT` for integers and counts (steps, sampled tokens, settings): a count that moves is a real change.
- :data:`FLOAT64` (relative 1e-9) for float64 results of the exact toys (``testbed/agent_credit.py``'s success at
  the budget): last-bit drift is ~1e-15 relative, a real change (another seed, or the learning rate 1% off: 0.101
  for 0.1 moves grpo seed 1 at H = 16 by 9e-3) moves the result by more than 1e-3, so 1e-9 is six orders of
  magnitude from both.
- :func:`float32_training` for float32 training runs (the learning-efficiency and paper-claims studies), where a
  last-bit difference at the first step can flip one sampled token and then grows through training, so a re-run
  elsewhere is a near copy, not a copy. What is compared, at every evaluation: the step exactly, the held-out
  accuracy within 3 problems of the evaluation set, and the sampled tokens within 0.1%. The KL to the start is not
  compared (a sampled estimate on 128 prompts: a slightly moved policy moves it by up to 19%). Evidence: the 24
  stage-1 re-timings of the warmed-up PPO arms whose float arithmetic differed from their records (10 of them) stay
  within 2 problems and 0.04% at every evaluation, while no two different seeds of the same arm (132 pairs) are within
  the rule (``tests/benchmarks/test_records.py``).

Tolerances for a study's comparisons that its protocol fixed before the runs (the paper-claims re-timings, "equal")
stay that protocol's: they compare two records made on one machine and use :data:`EXACT` through this module.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if (
    str(Path(__file__).resolve().parent) not in sys.path
):  # loaded by path (tests' load_benchmark): its sibling
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import environments_text, machine_info  # noqa: E402  (beside this file)


@dataclass(frozen=True)
class Tolerance:
    """``new`` is within ``old`` when ``|new - old| <= max(abs, rel * |old|)``; ``name`` says which rule it is.
    Non-numbers (strings, lists, None) must be equal; two NaNs are equal."""

    name: str
    rel: float = 0.0
    abs: float = 0.0

    def __post_init__(self) -> None:
        if not (self.rel >= 0 and self.abs >= 0):
            raise ValueError(
                f"Tolerance {self.name!r}: rel={self.rel} and abs={self.abs} must both be >= 0 (0 is exact)."
            )

    def allows(self, new: Any, old: Any) -> bool:
        """Whether ``new`` is within this tolerance of ``old``."""
        d = difference(new, old)
        return d == 0.0 or (math.isfinite(d) and d <= max(self.abs, self.rel * abs(old)))


EXACT = Tolerance("exact")
FLOAT64 = Tolerance("float64, relative 1e-9", rel=1e-9)
#: The exact toy's run record (``testbed.agent_credit.ArmRun``): float64 success, exact counts.
EXACT_TOY_RUN: dict[str, Tolerance] = {
    "success_at_budget": FLOAT64,
    "irrelevant_share": FLOAT64,
    "decisive_sign_accuracy": FLOAT64,
    "steps": EXACT,
    "sampled_tokens": EXACT,
    "episode_tokens": EXACT,
    "rollout_tokens": EXACT,
    "episodes": EXACT,
}
#: Problems of the held-out set an evaluation of a float32 training run may differ by (see the module docstring).
FLOAT32_PROBLEMS = 3
FLOAT32_TOKENS_REL = 1e-3


def float32_training(eval_problems: int) -> dict[str, Tolerance]:
    """The rule for one evaluation record of a float32 training run on ``eval_problems`` held-out problems: step
    exact, accuracy within :data:`FLOAT32_PROBLEMS` problems, sampled tokens within :data:`FLOAT32_TOKENS_REL`."""
    if eval_problems < 1:
        raise ValueError(
            f"float32_training: eval_problems={eval_problems} must be >= 1 (the held-out set's size)."
        )
    return {
        "step": EXACT,
        # the half problem absorbs accuracy's own rounding (k / n is not exact in binary)
        "accuracy": Tolerance(
            f"{FLOAT32_PROBLEMS} of {eval_problems} problems", abs=(FLOAT32_PROBLEMS + 0.5) / eval_problems
        ),
        "sampled_tokens": Tolerance("float32 tokens, relative 1e-3", rel=FLOAT32_TOKENS_REL),
    }


def difference(new: Any, old: Any) -> float:
    """``|new - old|`` for two numbers (booleans are numbers; 0.0 for two NaNs), 0.0 for equal non-numbers, and
    infinity for anything else (a missing value, a number against a string, unequal non-numbers)."""
    if isinstance(new, numbers.Real) and isinstance(old, numbers.Real):
        if math.isnan(new) and math.isnan(old):
            return 0.0
        if new == old:  # equal infinities too
            return 0.0
        d = abs(float(new) - float(old))
        return math.inf if math.isnan(d) else d
    return 0.0 if new == old else math.inf


def compare_record(
    new: Mapping[str, Any], old: Mapping[str, Any], rules: Mapping[str, Tolerance]
) -> tuple[list[str], float]:
    """Compare the fields ``rules`` names: the fields outside their tolerance (described with both values) and the
    largest absolute difference among the fields within. A field missing on either side is outside."""
    outside, largest = [], 0.0
    for name, rule in rules.items():
        if name not in new or name not in old:
            outside.append(f"{name}: missing in the {'re-run' if name not in new else 'record'}")
            continue
        if rule.allows(new[name], old[name]):
            largest = max(largest, difference(new[name], old[name]))
        else:
            outside.append(f"{name}: {new[name]!r} against the record's {old[name]!r} ({rule.name})")
    return outside, largest


def compare_tree(new: Any, old: Any, tolerance: Tolerance = FLOAT64, path: str = "") -> list[str]:
    """Where two JSON-like trees differ beyond ``tolerance`` (numbers) or at all (keys, lengths, strings, None): the
    paths, e.g. ``["cells[3].gap.mean: 0.1 against 0.2"]``. For a summary regenerated from committed records, whose
    arithmetic (``math``, ``scipy``) another machine may round differently in the last bits."""
    if isinstance(new, Mapping) and isinstance(old, Mapping):
        if new.keys() != old.keys():
            return [f"{path or '.'}: keys {sorted(set(new) ^ set(old))} on one side only"]
        return [d for k in new for d in compare_tree(new[k], old[k], tolerance, f"{path}.{k}")]
    if isinstance(new, list | tuple) and isinstance(old, list | tuple):
        if len(new) != len(old):
            return [f"{path}: {len(new)} items against {len(old)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(new, old, strict=True))
            for d in compare_tree(a, b, tolerance, f"{path}[{i}]")
        ]
    return [] if tolerance.allows(new, old) else [f"{path}: {new!r} against {old!r} ({tolerance.name})"]


@dataclass
class Comparison:
    """A tally of re-runs against their records: how many had a record, how many were within tolerance, the largest
    difference among those, and each one outside (its label, its fields, the record's environment)."""

    found: int = 0
    within: int = 0
    largest: float = 0.0
    outside: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self,
        label: str,
        new: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        rules: Mapping[str, Tolerance],
    ) -> bool | None:
        """Compare one re-run with its record (None: no record, nothing counted); True when within tolerance."""
        if old is None:
            return None
        self.found += 1
        fields, largest = compare_record(new, old, rules)
        if fields:
            self.outside.append({"run": label, "fields": fields, "environment": old.get("environment")})
            return False
        self.within += 1
        self.largest = max(self.largest, largest)
        return True

    @property
    def ok(self) -> bool:
        return not self.outside

    def summary(self) -> str:
        """E.g. ``3/3 within tolerance (largest difference 1.1e-16)``; ``none`` when no run had a record."""
        if not self.found:
            return "none"
        return f"{self.within}/{self.found} within tolerance (largest difference {self.largest:.1e})"

    def explain(self) -> str:
        """Every run outside tolerance, its fields, and both environments (the record's and this one's)."""
        here = machine_info()
        parts = []
        for o in self.outside:
            parts.append(f"{o['run']} is outside tolerance: {'; '.join(o['fields'])}")
            parts.append(environments_text(o["environment"], here))
        return "\n".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"found": self.found, "within": self.within, "largest": self.largest, "outside": self.outside}
