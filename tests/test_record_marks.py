"""Every test that compares with a committed record or pin carries ``@pytest.mark.record`` (issue 57).

CI (``scripts/test_portable.sh``) reruns the marked tests as another machine would: torch's portable kernels, numpy's
dispatch off, and the newest versions the requirements allow. A record test without the mark would escape that pass,
so this module finds them by what they call: a test compares with a record when its body, a helper of its own module
it calls, or a fixture of its own module it asks for uses one of :data:`RECORD_COMPARISONS` (the tolerance module's
comparisons, the studies' re-run drivers and the behaviour pins' checks).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: Names whose use means "compared with a committed record or pin".
RECORD_COMPARISONS = frozenset(
    {
        # benchmarks/_records.py: the one way a re-run is compared with a record
        "compare_record", "compare_tree", "Comparison", "FLOAT64", "EXACT_TOY_RUN", "float32_training",
        # the studies' re-run drivers (credit_map_tuned.rerun / compare_runs, its demo's retrain)
        "rerun", "compare_runs", "retrain",
        # behaviour pins (tests/estimators/test_vineppo_agent_pin.py)
        "assert_reproduces",
    }
)  # fmt: skip


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute name used inside ``node``, less the names it assigns itself (a local variable
    called ``rerun`` is not the driver)."""
    used: set[str] = set()
    local: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (local if isinstance(n.ctx, ast.Store) else used).add(n.id)
        elif isinstance(n, ast.Attribute):
            used.add(n.attr)
    return used - local


def _is_record_marked(decorators: list[ast.expr]) -> bool:
    return any("record" in _names(d) and "mark" in _names(d) for d in decorators)


def unmarked_record_tests(path: Path) -> list[str]:
    """The test functions of ``path`` that compare with a record (directly or through a helper or fixture of the
    module) and carry no ``record`` mark, the module's ``pytestmark`` included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    module_marked = any(
        isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
        and "record" in _names(s.value)
        for s in tree.body
    )  # fmt: skip

    def compares(name: str, seen: set[str]) -> bool:
        f = functions[name]
        used = _names(f) | {a.arg for a in f.args.args}  # a fixture of this module, asked for by name
        if used & RECORD_COMPARISONS:
            return True
        seen.add(name)
        return any(compares(other, seen) for other in used & set(functions) - seen)

    return [
        f"{path.relative_to(TESTS.parent)}::{name}"
        for name, f in functions.items()
        if name.startswith("test_") and not module_marked and not _is_record_marked(f.decorator_list)
        and compares(name, set())
    ]  # fmt: skip


def test_every_test_that_compares_with_a_committed_record_is_marked():
    unmarked = [t for path in sorted(TESTS.rglob("test_*.py")) for t in unmarked_record_tests(path)]
    assert not unmarked, "compare with a committed record; mark them @pytest.mark.record:\n" + "\n".join(
        unmarked
    )


def test_the_finder_sees_a_comparison_through_a_helper_and_a_fixture(tmp_path):
    source = """
import pytest

@pytest.fixture
def rerun_result():
    return rerun()

def _helper():
    return compare_record({}, {}, {})

def test_direct():
    compare_tree(1, 2)

def test_through_helper():
    _helper()

def test_through_fixture(rerun_result):
    assert rerun_result

@pytest.mark.record
def test_marked():
    _helper()

def test_unrelated():
    assert 1 + 1 == 2
"""
    path = TESTS / "_record_marks_probe_test.py"
    try:
        path.write_text(source, encoding="utf-8")
        found = {t.split("::")[1] for t in unmarked_record_tests(path)}
    finally:
        path.unlink()
    assert found == {"test_direct", "test_through_helper", "test_through_fixture"}


def test_ci_runs_the_readme_command_then_the_record_pass_with_switched_kernels():
    root = TESTS.parent
    ci = [line.strip() for line in (root / ".ci" / "run").read_text().splitlines()]
    assert ci.index("bash scripts/test.sh") < ci.index("bash scripts/test_portable.sh")
    portable = (root / "scripts" / "test_portable.sh").read_text()
    for needed in ("ATEN_CPU_CAPABILITY=default", 'NPY_DISABLE_CPU_FEATURES="$off"', "-m record", "--check",
                   'pip install -q --upgrade -e ".[test]"'):  # fmt: skip
        assert needed in portable, needed


def test_the_switches_take_effect_and_the_check_sees_when_they_do_not():
    import os
    import subprocess
    import sys

    script = str(TESTS.parent / "scripts" / "_dispatch_features.py")
    features = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, check=True
    ).stdout.split()
    base = {
        k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES")
    }
    switched = {**base, "ATEN_CPU_CAPABILITY": "default", "NPY_DISABLE_CPU_FEATURES": " ".join(features)}
    ok = subprocess.run([sys.executable, script, "--check"], env=switched, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    native = subprocess.run([sys.executable, script, "--check"], env=base, capture_output=True, text=True)
    import torch

    if (
        torch.backends.cpu.get_cpu_capability().upper() != "DEFAULT"
    ):  # a CPU with vector kernels: not switched
        assert native.returncode == 1 and "did not take effect" in native.stdout
