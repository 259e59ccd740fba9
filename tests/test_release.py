"""Release readiness: the package builds into an sdist and a wheel that install and import in a fresh virtual
environment, the version lives in one place, the code is ruff-clean, and the public API has docstrings and
type-hinted signatures.

The build runs without network (``--no-isolation``) with the setuptools of the running environment, and the
wheel is installed with ``--no-deps --no-index`` into a venv that inherits no site-packages: ``import
mcadvantage`` must work there because it imports neither torch, TRL nor vLLM (public names load lazily).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Files the build needs: everything else (tests, docs, benchmarks, examples) stays out of the distributions.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "src")
# PEP 639 metadata (`license = "Apache-2.0"`, `license-files`) needs setuptools >= 77.
MIN_SETUPTOOLS = (77, 0)


def _version() -> str:
    text = (ROOT / "src" / "mcadvantage" / "_version.py").read_text(encoding="utf-8")
    match = re.fullmatch(r'__version__ = "([^"]+)"\n', text)
    assert match, (
        f'src/mcadvantage/_version.py must hold exactly one line `__version__ = "X.Y.Z"`, got {text!r}'
    )
    return match.group(1)


def _run(cmd: list[str], cwd: Path | None = None, timeout: int = 600) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def _build(source: Path, outdir: Path, *kinds: str) -> None:
    _run(
        [
            sys.executable,
            "-m",
            "build",
            *kinds,
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(outdir),
            str(source),
        ]
    )


# --------------------------------------------------------------------------------------------------------------
# Version in one place
# --------------------------------------------------------------------------------------------------------------


def test_version_is_defined_only_in_version_py():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    version = _version()
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", version), version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project and "version" in project["dynamic"], (
        "pyproject.toml must not pin a version"
    )
    others = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "src").rglob("*.py")
        if p.name != "_version.py" and re.search(r"^__version__\s*=", p.read_text(encoding="utf-8"), re.M)
    ]
    assert not others, f"__version__ is assigned outside _version.py: {others}"

    import mcadvantage

    assert mcadvantage.__version__ == version


def test_changelog_has_the_current_version():
    """CHANGELOG.md is in keep-a-changelog form and its newest release is the package version."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog") and "keepachangelog.com" in text
    assert re.search(r"^## \[Unreleased\]$", text, re.M), "keep an `## [Unreleased]` section on top"
    releases = re.findall(r"^## \[(\d[^\]]*)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)
    assert releases, "no `## [X.Y.Z] - YYYY-MM-DD` release heading"
    assert releases[0][0] == _version(), (
        f"newest CHANGELOG release {releases[0][0]} != package version {_version()}"
    )
    sections = set(re.findall(r"^### (\w+)$", text, re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections


# --------------------------------------------------------------------------------------------------------------
# Build, install in a fresh venv, import
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("build")
    setuptools = pytest.importorskip("setuptools")
    have = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    if have < MIN_SETUPTOOLS:
        pytest.skip(
            f"setuptools {setuptools.__version__} is too old for this pyproject: pip install 'setuptools>=77'"
        )
    # Build from a copy of just the build inputs, so the build writes nothing into the checkout and cannot
    # depend on files outside them.
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(
                src, source / name, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(src, source / name)
    out = tmp_path_factory.mktemp("dist")
    _build(source, out, "--sdist", "--wheel")
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return {"sdist": sdists[0], "wheel": wheels[0], "tmp": out}


@pytest.mark.slow
def test_wheel_contents_and_metadata(dists):
    version = _version()
    wheel = dists["wheel"]
    assert wheel.name == f"mcadvantage-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"mcadvantage-{version}.dist-info/METADATA").decode()
    for required in (
        "mcadvantage/__init__.py",
        "mcadvantage/_version.py",
        "mcadvantage/py.typed",
        "mcadvantage/trainer/vineppo_trainer.py",
        "mcadvantage/samplers/vllm_weights.py",
        "mcadvantage/demo/__main__.py",
        "mcadvantage/demo/warmup_policy/model.safetensors",
        "mcadvantage/demo/warmup_policy/warmup.json",
        "mcadvantage/demo/warmup_plateau/model.safetensors",
        "mcadvantage/demo/warmup_plateau/warmup.json",
        f"mcadvantage-{version}.dist-info/licenses/LICENSE",
    ):
        assert required in names, f"{required} missing from the wheel"
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples", "docs", "scripts")]
    assert f"Version: {version}" in metadata
    assert "License-Expression: Apache-2.0" in metadata
    assert re.search(r"^Requires-Dist: trl<1\.17,>=1\.16$", metadata, re.M), "the TRL range must be pinned"
    assert re.search(r"^Requires-Python: >=3\.10$", metadata, re.M)
    assert "VinePPO" in metadata  # the README is the long description


@pytest.mark.slow
def test_sdist_is_complete(dists, tmp_path):
    """The sdist holds everything needed to rebuild the same wheel."""
    version = _version()
    with tarfile.open(dists["sdist"]) as tf:
        # The "data" filter refuses links and absolute paths (Python >= 3.10.12 / 3.11.4 have it).
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(tmp_path, **kwargs)
    unpacked = tmp_path / f"mcadvantage-{version}"
    for name in ("pyproject.toml", "README.md", "LICENSE", "src/mcadvantage/py.typed"):
        assert (unpacked / name).is_file(), f"{name} missing from the sdist"
    rebuilt = tmp_path / "rebuilt"
    _build(unpacked, rebuilt, "--wheel")
    (wheel,) = rebuilt.glob("*.whl")
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(dists["wheel"]) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())


@pytest.mark.slow
def test_wheel_installs_and_imports_in_a_fresh_venv(dists, tmp_path):
    venv = tmp_path / "venv"
    # A venv that inherits nothing: only the standard library and pip (installed offline by ensurepip).
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            str(dists["wheel"]),
        ]
    )
    out = _run(
        [
            str(python),
            "-c",
            "import sys, mcadvantage; print(mcadvantage.__version__); "
            "print(sorted(m for m in ('torch', 'trl', 'transformers', 'vllm') if m in sys.modules)); "
            "print(mcadvantage.__file__)",
        ],
        cwd=tmp_path,  # not the checkout: the import must resolve to the installed wheel
    )
    version, heavy, location = out.splitlines()
    assert version == _version()
    assert heavy == "[]", f"import mcadvantage pulled in {heavy}"
    assert str(venv) in location and str(ROOT) not in location
    # The dependency-free parts work on the bare install: segmenters and the GSM8K grader.
    out = _run(
        [
            str(python),
            "-c",
            "from mcadvantage import GSM8KSegmenter, GSM8KVerifier; "
            "steps = GSM8KSegmenter()('1+1=2\\n2*3=6\\n#### 6'); "
            "print(len(steps), GSM8KVerifier().score(''.join(steps), '6'))",
        ],
        cwd=tmp_path,
    )
    assert out.split() == ["2", "1.0"]


# --------------------------------------------------------------------------------------------------------------
# Lint and format
# --------------------------------------------------------------------------------------------------------------

LINTED = ["src", "tests", "benchmarks", "examples"]


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install ruff, or the [test] extra)")
    return [exe]


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if (ROOT / p).exists()]


def test_ruff_check_passes():
    proc = subprocess.run([*_ruff(), "check", *_existing(LINTED)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"ruff check failed:\n{proc.stdout}\n{proc.stderr}"


def test_ruff_format_is_clean():
    proc = subprocess.run(
        [*_ruff(), "format", "--check", *_existing(LINTED)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, (
        f"ruff format --check failed (run `ruff format {' '.join(LINTED)}`):\n{proc.stdout}"
    )


# --------------------------------------------------------------------------------------------------------------
# Public API: docstrings and type hints
# --------------------------------------------------------------------------------------------------------------


def _public_objects() -> dict[str, object]:
    pytest.importorskip("trl")  # VinePPOTrainer / VinePPOConfig import TRL
    import mcadvantage

    return {name: getattr(mcadvantage, name) for name in mcadvantage.__all__ if name != "__version__"}


def _unannotated(func: object, label: str) -> list[str]:
    sig = inspect.signature(func)
    problems = [
        f"{label}: parameter {p.name!r} has no type hint"
        for p in sig.parameters.values()
        if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if sig.return_annotation is inspect.Signature.empty:
        problems.append(f"{label}: no return type hint")
    return problems


def _methods(cls: type) -> list[tuple[str, object]]:
    """Public methods (plus ``__init__`` and ``__call__``) that mcadvantage defines for ``cls``, inherited ones
    included; members inherited from other packages (TRL, typing) are theirs to document."""
    out = []
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("mcadvantage"):
            continue
        for name, member in vars(klass).items():
            if name in seen or (name.startswith("_") and name not in ("__init__", "__call__")):
                continue
            if name == "__init__" and getattr(klass, "_is_protocol", False):
                continue  # typing.Protocol's placeholder __init__
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if inspect.isfunction(member):
                seen.add(name)
                out.append((f"{cls.__name__}.{name}", member))
    return out


def test_public_api_has_docstrings_and_type_hints():
    problems: list[str] = []
    for name, obj in _public_objects().items():
        own_doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        if not (own_doc or "").strip():
            problems.append(f"{name}: no docstring")
        if inspect.isclass(obj):
            for label, method in _methods(obj):
                if not label.endswith(("__init__", "__call__")) and not (method.__doc__ or "").strip():
                    problems.append(f"{label}: no docstring")
                problems += _unannotated(method, label)
        else:
            problems += _unannotated(obj, name)
    assert not problems, "public API gaps:\n" + "\n".join(problems)
