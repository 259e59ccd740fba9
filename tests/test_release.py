"""Release readiness: the package builds into an sdist and a wheel that install and import in a fresh virtual
environment, the version lives in one place, the code is ruff-clean, and the public API has docstrings and
type-hinted signatures.

The build runs without network (``--no-isolation``) with the setuptools of the running environment, and the
wheel is installed with ``--no-deps --no-index`` into a venv that inherits no site-packages: ``import
mcadvantage`` must work there because it imports neither torch, TRL nor vLLM (public names load lazily).

A user's install is tested too: the wheel goes into a fresh venv that sees the running environment's packages
(torch, TRL, ...: nothing is downloaded) but not the repository, and the README's quickstart runs there on the
tiny policy the wheel ships, as does ``python -m mcadvantage.demo --help``. The metadata a package index shows is
checked field by field (``twine check`` too, when twine is installed).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import sysconfig
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


def _run(
    cmd: list[str], cwd: Path | None = None, timeout: int = 600, env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
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
        # The tiny policy the demo and the README quickstart test start from.
        "mcadvantage/demo/warmup_plateau/model.safetensors",
        "mcadvantage/demo/warmup_plateau/warmup.json",
        f"mcadvantage-{version}.dist-info/licenses/LICENSE",
    ):
        assert required in names, f"{required} missing from the wheel"
    # Every package-data pattern of pyproject.toml ships something.
    tomllib = pytest.importorskip("tomllib")
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    for pattern in package_data["package-data"]["mcadvantage"]:
        assert fnmatch.filter(names, f"mcadvantage/{pattern}"), (
            f"package-data {pattern!r} matches nothing in the wheel"
        )
    assert not [
        n
        for n in names
        if n.split("/")[0] in ("tests", "benchmarks", "examples", "docs", "scripts", "testbed")
    ]
    # The wheel holds the library and the demo: one checkpoint (the demo's), no warm-up making, no study tasks.
    assert [n for n in names if n.endswith(".safetensors")] == [
        "mcadvantage/demo/warmup_plateau/model.safetensors"
    ]
    assert "mcadvantage/demo/make_warmup.py" not in names
    with zipfile.ZipFile(wheel) as zf:
        unpacked = sum(info.file_size for info in zf.infolist())
        library = b"".join(zf.read(n) for n in names if n.endswith(".py"))
    assert unpacked <= 6_000_000, f"the wheel unpacks to {unpacked:,} bytes"
    assert b"TASK_PRESETS" not in library and b"toy_gradient_task" not in library
    # ... and none of the studies' hooks: their flaws and lead-ins, arms without RL, warm-up resuming (testbed/).
    for hook in (b"lead_ins", b"def register_flaw", b"class Flaw", b"def resumable_step", b'"dpo_plus"'):
        assert hook not in library, f"{hook!r} ships in the wheel: it belongs in testbed/"
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
        ],
        env=_user_environment(venv),  # a PYTHONPATH at src/ would make pip think it is installed already
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
        env=_user_environment(venv),  # nor PYTHONPATH (a developer's shell may point it at src/)
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
        env=_user_environment(venv),
    )
    assert out.split() == ["2", "1.0"]


# --------------------------------------------------------------------------------------------------------------
# As a user gets it: the README quickstart from the installed wheel, the demo's entry point, the index's metadata
# --------------------------------------------------------------------------------------------------------------

#: What the quickstart test changes in the README's snippet, and nothing else: the model becomes the tiny policy the
#: wheel ships, and the config gets a one-step CPU run sized for it. ``dataset`` (the snippet's only free name) is
#: four of the demo's arithmetic problems.
README_MODEL = 'model="realtreetune/rho-1b-sft-GSM8K"'
README_CONFIG = "VinePPOConfig("
QUICKSTART_PREAMBLE = """\
from datasets import Dataset
from mcadvantage.demo.config import shipped_warmup_dir

SHIPPED_POLICY = str(shipped_warmup_dir("plateau"))
TINY_RUN = dict(
    max_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=48,
    use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", seed=0,
)
dataset = Dataset.from_list([
    {"prompt": "Start with 12. Subtract 3, then double it. What is the result?\\n", "answer": "18"},
    {"prompt": "Start with 7. Add 5, then halve it. What is the result?\\n", "answer": "6"},
])
"""


def readme_quickstart() -> str:
    """The README's first Python block: the quickstart a user reads on the package index."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^```python\n(.*?)^```", text, re.M | re.S)
    assert match, "README.md has no ```python block"
    assert text[: match.start()].count("\n") < 40, (
        "the quickstart is not on the README's first screen (40 lines)"
    )
    return match.group(1)


def runnable_quickstart() -> str:
    """The README's quickstart with the tiny policy and a one-step run swapped in (see :data:`README_MODEL`)."""
    snippet = readme_quickstart()
    assert snippet.count(README_MODEL) == 1, (
        f"the README quickstart no longer has {README_MODEL}; update this test"
    )
    assert snippet.count(README_CONFIG) == 1 and "trainer.train()" in snippet, snippet
    snippet = snippet.replace(README_MODEL, "model=SHIPPED_POLICY").replace(
        README_CONFIG, "VinePPOConfig(**TINY_RUN, "
    )
    return QUICKSTART_PREAMBLE + snippet + "print('steps', trainer.state.global_step)\n"


def test_the_readme_quickstart_is_the_snippet_the_wheel_test_runs():
    """The substitution touches only the model and the run's size: everything else is the README's text."""
    runnable = runnable_quickstart()
    readme = readme_quickstart()
    for line in readme.splitlines():
        if README_MODEL not in line and README_CONFIG not in line:
            assert line in runnable, line
    assert "num_mc_rollouts=9" in runnable and 'step_segmenter="gsm8k"' in runnable


def _user_environment(venv: Path) -> dict[str, str]:
    """The environment of a user's shell: the venv first on PATH, nothing of this checkout on the import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), OMP_NUM_THREADS="1"
    )
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # nothing to download
    return env


@pytest.fixture(scope="module")
def user_venv(dists, tmp_path_factory) -> dict[str, Path]:
    """A fresh venv holding the wheel; the running environment's packages (torch, TRL, ...) are visible through
    a ``.pth`` line, as ``--system-site-packages`` would show a system Python's (this environment is itself a
    venv, which ``--system-site-packages`` skips). Its ``.pth`` files are not run, so an editable install of this
    checkout stays invisible."""
    pytest.importorskip("trl")
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    env = _user_environment(venv)
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=home
        ).strip()
    )
    inherited = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_inherited_packages.pth").write_text(
        "".join(f"{path}\n" for path in inherited), encoding="utf-8"
    )
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q",
         str(dists["wheel"])],
        capture_output=True, text=True, env=env, cwd=home, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"python": python, "home": home, "env": env, "venv": venv}


def _run_as_user(user_venv: dict[str, Path], *args: str, timeout: int = 600) -> str:
    proc = subprocess.run(
        [str(user_venv["python"]), *args],
        capture_output=True,
        text=True,
        env=user_venv["env"],
        cwd=user_venv["home"],  # not the checkout
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{' '.join(args)[:200]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


@pytest.mark.slow
def test_readme_quickstart_runs_from_the_installed_wheel(user_venv):
    out = _run_as_user(
        user_venv,
        "-c",
        "import mcadvantage, sys; print(mcadvantage.__file__); print(mcadvantage.__version__); "
        "print(any(p.rstrip('/').endswith('/src') for p in sys.path))",
    )
    location, version, repo_on_path = out.splitlines()
    assert location.startswith(str(user_venv["venv"])), f"mcadvantage imported from {location}, not the wheel"
    assert str(ROOT) not in location and version == _version() and repo_on_path == "False"
    script = user_venv["home"] / "quickstart.py"
    script.write_text(runnable_quickstart(), encoding="utf-8")
    out = _run_as_user(user_venv, str(script))
    assert out.strip().splitlines()[-1] == "steps 1", out[-2000:]


#: The README's agent quickstart, made runnable offline the same way: the model id becomes a tiny random Llama with
#: a real tool-calling chat template (both shipped in ``mcadvantage.testing``), the config gets a short CPU run.
README_AGENT_MODEL = 'model="Qwen/Qwen3-0.6B",'
AGENT_PREAMBLE = """\
from datasets import Dataset
from mcadvantage.testing import build_tiny_llama, build_tool_calling_tokenizer

tok = build_tool_calling_tokenizer()
TINY_AGENT = build_tiny_llama(
    tok, hidden_size=64, num_layers=1, num_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=1024
)
TINY_RUN = dict(
    max_steps=2, per_device_train_batch_size=2, num_generations=2, max_completion_length=24,
    use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", seed=0,
)
dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 1 + 2?"}]] * 2})
"""


def readme_agent_quickstart() -> str:
    """The README's Python block that passes ``environment_factory=``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [
        b for b in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S) if "environment_factory=" in b
    ]
    assert len(blocks) == 1, (
        "README.md should hold one agent quickstart (a python block with environment_factory=)"
    )
    return blocks[0]


def runnable_agent_quickstart() -> str:
    snippet = readme_agent_quickstart()
    assert snippet.count(README_AGENT_MODEL) == 1 and snippet.count(README_CONFIG) == 1, snippet
    assert "trainer.train()" in snippet
    snippet = snippet.replace(README_AGENT_MODEL, "model=TINY_AGENT, processing_class=tok,").replace(
        README_CONFIG, "VinePPOConfig(**TINY_RUN, "
    )
    report = (
        "est = trainer.last_advantage_result\n"
        "print('estimator', trainer.args.advantage_estimator, 'rollouts', trainer.advantage_estimator.num_rollouts)\n"
        "print('steps', trainer.state.global_step, 'values', est is not None and len(est.values))\n"
    )
    return AGENT_PREAMBLE + snippet + report


def test_the_readme_agent_quickstart_is_the_snippet_the_wheel_test_runs():
    runnable, readme = runnable_agent_quickstart(), readme_agent_quickstart()
    for line in readme.splitlines():
        if README_AGENT_MODEL not in line and README_CONFIG not in line:
            assert line in runnable, line
    assert "environment_factory=Adder" in runnable and "num_mc_rollouts=4" in runnable


@pytest.mark.slow
def test_readme_agent_quickstart_trains_from_the_installed_wheel(user_venv):
    """Issue 53: the agent quickstart, from a directory outside the checkout with the installed wheel, trains two
    steps under the default estimator ("vineppo": Monte Carlo credit per turn)."""
    script = user_venv["home"] / "agent_quickstart.py"
    script.write_text(runnable_agent_quickstart(), encoding="utf-8")
    out = _run_as_user(user_venv, str(script), timeout=300)
    lines = out.strip().splitlines()
    assert lines[-2] == "estimator vineppo rollouts 4", out[-2000:]
    assert lines[-1].startswith("steps 2 values ") and lines[-1] != "steps 2 values False", out[-2000:]


@pytest.mark.slow
def test_demo_entry_point_runs_from_the_installed_wheel(user_venv):
    out = _run_as_user(user_venv, "-m", "mcadvantage.demo", "--help", timeout=300)
    assert out.startswith("usage:") and "--seed" in out, out[:500]


def _metadata(wheel: Path) -> tuple[dict[str, list[str]], str]:
    """The wheel's METADATA: ``field -> values`` and the long description (the body after the headers)."""
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(name).decode("utf-8")
    headers, _, body = text.partition("\n\n")
    fields: dict[str, list[str]] = {}
    for line in headers.splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    return fields, body


@pytest.mark.slow
def test_package_index_metadata(dists):
    """What a package index shows: the README as Markdown, the license, project links, classifiers whose Python
    versions agree with requires-python."""
    fields, body = _metadata(dists["wheel"])
    assert fields["Description-Content-Type"] == ["text/markdown"]
    assert body.strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip(), (
        "the long description is the README"
    )
    assert fields["License-Expression"] == ["Apache-2.0"] and fields["License-File"] == ["LICENSE"]
    assert float(fields["Metadata-Version"][0]) >= 2.4  # PEP 639's license fields
    urls = dict(value.split(", ", 1) for value in fields.get("Project-URL", []))
    assert "Paper" in urls and all(url.startswith("https://") for url in urls.values()), urls
    classifiers = fields["Classifier"]
    versions = sorted(
        tuple(map(int, c.rsplit(" ", 1)[1].split(".")))
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    (minimum,) = re.fullmatch(r">=(3\.\d+)", fields["Requires-Python"][0]).groups()
    assert versions and versions[0] == tuple(map(int, minimum.split("."))), (versions, minimum)
    assert versions == [(3, minor) for minor in range(versions[0][1], versions[-1][1] + 1)], (
        "a gap in the versions"
    )
    assert not [c for c in classifiers if c.startswith("License ::")], (
        "PEP 639: the license expression replaces it"
    )
    if importlib.util.find_spec("twine") is not None:
        _run([sys.executable, "-m", "twine", "check", "--strict", str(dists["wheel"]), str(dists["sdist"])])


@pytest.mark.slow
def test_distribution_sizes(dists, record_property):
    """The sizes a user downloads (printed with ``-rA``/``-s``, recorded as test properties): the wheel ships one tiny
    checkpoint at most, so it stays small."""
    sizes = {kind: dists[kind].stat().st_size for kind in ("wheel", "sdist")}
    for kind, size in sizes.items():
        record_property(f"{kind}_bytes", size)
    print(
        f"wheel {dists['wheel'].name}: {sizes['wheel']} bytes; sdist {dists['sdist'].name}: {sizes['sdist']} bytes"
    )
    assert sizes["wheel"] < 12 * 2**20 and sizes["sdist"] < 12 * 2**20, sizes


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
