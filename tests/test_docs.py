"""The documentation cannot rot: the site builds with ``mkdocs build --strict``, every runnable snippet
runs, and every other Python snippet (docs and README) uses names and keyword arguments the API has.

Snippet conventions (in ``docs/**/*.md``): a ```` ```python ```` block preceded by the line
``<!-- runnable -->`` is executed; ``<!-- runnable: slow -->`` marks a page whose snippets take long
(a training run), so its test is ``slow``. The runnable blocks of one page run in order in one
namespace, in a temporary working directory, like a reader pasting them into one session.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

_FENCE_RE = re.compile(
    r"^(?P<marker><!-- runnable(?P<slow>: slow)? -->\n)?```python\n(?P<code>.*?)^```", re.M | re.S
)


def _pages() -> list[Path]:
    # docs/benchmarks/ holds fragments of benchmarks.md, not pages.
    return sorted(p for p in DOCS.rglob("*.md") if "benchmarks" not in p.relative_to(DOCS).parts[:-1])


def _blocks(path: Path) -> list[tuple[int, str, bool, bool]]:
    """``(first code line number, code, runnable, slow)`` for every Python block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _FENCE_RE.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        out.append((line, m.group("code"), m.group("marker") is not None, m.group("slow") is not None))
    return out


def _runnable_pages() -> list[Any]:
    params = []
    for page in _pages():
        blocks = [b for b in _blocks(page) if b[2]]
        if blocks:
            marks = [pytest.mark.slow] if any(b[3] for b in blocks) else []
            params.append(pytest.param(page, marks=marks, id=str(page.relative_to(DOCS))))
    return params


# --------------------------------------------------------------------------------------------------------------
# The site builds
# --------------------------------------------------------------------------------------------------------------


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"

    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [
        f"{package}.{name}"
        for package, names in _public_names().items()
        for name in names
        if not re.search(rf'id="mcadvantage\.[\w.]*\.{name}"', api)
    ]
    assert not missing, f"public names without a rendered entry in the API reference (docs/api.md): {missing}"
    # Sphinx roles in docstrings are turned into links by docs/_hooks/rst_roles.py; none may leak through.
    leaked = re.findall(r":(?:class|func|meth|mod|data|attr):<code>[^<]*", api)
    assert not leaked, f"unrendered Sphinx roles on the API page: {leaked[:5]}"
    # The concepts page shows the figure, and the figure ships with the site.
    assert "figures/vineppo.svg" in (site / "concepts" / "index.html").read_text(encoding="utf-8")
    assert (site / "figures" / "vineppo.svg").is_file()
    # The Changelog page is CHANGELOG.md as it is now (included at build time by docs/_hooks/changelog.py).
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    page = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    for heading in re.findall(r"^## \[([^\]]+)\]", changelog, re.M)[:3]:
        assert f"[{heading}]" in page, (
            f"CHANGELOG.md's section [{heading}] is not on the site's Changelog page"
        )


# --------------------------------------------------------------------------------------------------------------
# What a user navigates: the site's order, the changelog, an API entry for every public name
# --------------------------------------------------------------------------------------------------------------

#: The site's top-level navigation, in a reader's order.
NAV_SECTIONS = ["Get started", "How-to guides", "Concepts", "Results", "API reference", "Changelog"]


def _nav() -> list[Any]:
    yaml = pytest.importorskip("yaml")

    class _Loader(yaml.SafeLoader):
        """Accepts the ``!!python/name:`` tags some mkdocs.yml options use, without importing anything."""

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)["nav"]


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return [page for item in nav for page in _nav_pages(item)]


def test_navigation_reads_in_a_users_order():
    nav = _nav()
    assert [next(iter(item)) for item in nav] == NAV_SECTIONS, "mkdocs.yml's top-level nav"
    pages = _nav_pages(nav)
    assert pages[0] == "index.md" and pages[-2:] == ["api.md", "changelog.md"]
    assert len(pages) == len(set(pages)), "a page is listed twice in mkdocs.yml's nav"
    # Every page is reachable from the navigation (mkdocs only warns about the others).
    on_disk = {str(p.relative_to(DOCS)) for p in _pages()}
    assert on_disk <= set(pages), f"pages missing from mkdocs.yml's nav: {sorted(on_disk - set(pages))}"


def test_migration_page_lists_every_moved_path_and_the_release_that_removes_them():
    """The old module paths and their removal release are defined once, in ``mcadvantage._moved``; the migration
    page states them, and must say the same (every old path with its new home, one removal release)."""
    from mcadvantage._moved import MOVED, REMOVED_IN

    page = (DOCS / "migration-0.2.md").read_text(encoding="utf-8")
    missing = [
        old for old, new in MOVED.items() if not re.search(rf"^\| `{old}` \| `{new}`", page, re.MULTILINE)
    ]
    assert not missing, f"docs/migration-0.2.md has no table row '| `old` | `new` ...' for {missing}"
    releases = re.findall(r"(?:removed in|until) (\d+\.\d+)", page)
    assert releases and set(releases) == {REMOVED_IN}, (
        f"docs/migration-0.2.md names the removal release as {releases}; mcadvantage._moved.REMOVED_IN is "
        f"{REMOVED_IN!r}: write that"
    )


def test_migration_page_from_02_names_every_config_difference():
    """docs/migration-0.3.md lists the GRPOConfig defaults that differ (defined once in the code); the page must name
    every entry. (It listed the Monte Carlo settings refused for agents too, until every setting worked there.)"""
    pytest.importorskip("trl")
    from mcadvantage.trainer.config import GRPO_DEFAULT_DIFFERENCES

    page = (DOCS / "migration-0.3.md").read_text(encoding="utf-8")
    missing = [n for n in GRPO_DEFAULT_DIFFERENCES if f"`{n}" not in page]
    assert not missing, f"docs/migration-0.3.md does not name {missing}"
    assert "migration-0.3.md" in _nav_pages(_nav())


def test_readme_first_screen_has_what_why_install_quickstart_and_results():
    """What a visitor of the package index sees without scrolling (the first 40 lines of README.md)."""
    screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "drop-in" in screen and "TRL" in screen, "what the library is"
    assert "**Why.**" in screen, "why it exists"
    assert re.search(r"^pip install mcadvantage\b", screen, re.M), "how to install it"
    assert re.search(r'^pip install "mcadvantage\[\w+\]"', screen, re.M) and "extras" in screen, "its extras"
    assert "```python" in screen and "trainer.train()" in screen, "the quickstart"
    assert "(docs/benchmarks.md" in screen and "**Results:**" in screen, "a link to the results"


def _changelog_hook() -> Any:
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("_changelog_hook", DOCS / "_hooks" / "changelog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_changelog_page_includes_the_changelog_without_copying_it():
    hook = _changelog_hook()
    page = (DOCS / "changelog.md").read_text(encoding="utf-8")
    assert page.strip() == hook.MARKER, "docs/changelog.md holds only the include marker; edit CHANGELOG.md"
    # Repository-relative links work on the site: into docs/ relative to the page, other files as their path.
    text = (
        "See [the design](docs/design.md#the-seam-advantage-estimators), [examples](examples/README.md), "
        "[TRL](https://github.com/huggingface/trl), [below](#fixed) and ![a figure](docs/figures/vineppo.svg)."
    )
    assert hook.include_changelog(f"{hook.MARKER}\n", text) == (
        "See [the design](design.md#the-seam-advantage-estimators), examples (`examples/README.md`), "
        "[TRL](https://github.com/huggingface/trl), [below](#fixed) and ![a figure](docs/figures/vineppo.svg).\n"
    )
    with pytest.raises(Exception, match="must contain the line"):
        hook.include_changelog("no marker here", text)


def _public_names() -> dict[str, list[str]]:
    """Every public name: ``mcadvantage.__all__`` and the ``__all__`` of each subpackage that declares one."""
    import pkgutil

    import mcadvantage

    packages = ["mcadvantage"] + [
        f"mcadvantage.{info.name}" for info in pkgutil.iter_modules(mcadvantage.__path__) if info.ispkg
    ]
    names = {}
    for package in packages:
        exported = getattr(importlib.import_module(package), "__all__", None)
        if exported is not None:
            names[package] = [name for name in exported if name != "__version__"]
    return names


def _resolve(identifier: str) -> Any:
    """The object a ``::: identifier`` directive of docs/api.md documents (the longest importable module prefix,
    then attributes)."""
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(identifier)


def _api_entries() -> dict[str, Any]:
    """``identifier -> object`` for every entry of docs/api.md: each ``::: identifier`` directive and, where its
    options list ``members``, each listed member (a module directive without a list documents its ``__all__``)."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    entries: dict[str, Any] = {}
    for match in re.finditer(r"^::: ([\w.]+)\n((?:[ \t]+\S.*\n)*)", text, re.M):
        identifier, options = match.groups()
        entries[identifier] = obj = _resolve(identifier)
        listed = re.search(r"members:\s*\[([^\]]*)\]", options)
        members = [m.strip() for m in listed.group(1).split(",") if m.strip()] if listed else []
        if not listed and inspect.ismodule(obj):
            members = list(getattr(obj, "__all__", []))
        for member in members:
            entries[f"{identifier}.{member}"] = _resolve(f"{identifier}.{member}")
    return entries


def test_every_public_name_has_an_api_entry():
    """Each name of ``mcadvantage.__all__`` and of every subpackage's ``__all__`` is documented on the API page
    (docs/api.md), as the object it is (a re-export counts once), and every entry there exists."""
    pytest.importorskip("trl")  # VinePPOTrainer / VinePPOConfig import TRL
    try:
        entries = _api_entries()
    except (ImportError, AttributeError) as err:
        pytest.fail(f"docs/api.md documents something that does not exist: {err!r}")
    documented = {id(obj) for obj in entries.values()}
    public = _public_names()
    assert "mcadvantage" in public and len(public) >= 4, sorted(public)
    missing = [
        f"{package}.{name}"
        for package, names in public.items()
        for name in names
        if id(getattr(importlib.import_module(package), name)) not in documented
    ]
    assert not missing, (
        "public names without an entry in docs/api.md (add a `::: module.Name` line under the right heading):\n"
        + "\n".join(missing)
    )


# --------------------------------------------------------------------------------------------------------------
# Runnable snippets run
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", _runnable_pages())
def test_runnable_snippets(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets may write files (a saved tiny model, trainer output)
    rel = page.relative_to(ROOT)
    # The blocks run in a registered module, as code in a user's script would: functions they define can
    # then be pickled by reference (a trainer config pickles its step_segmenter).
    module = types.ModuleType("docs_snippets_" + re.sub(r"\W", "_", str(page.relative_to(DOCS))))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for line, code, runnable, _slow in _blocks(page):
        if not runnable:
            continue
        # Pad with newlines so tracebacks point at the line of the Markdown file.
        exec(compile("\n" * (line - 1) + code, str(rel), "exec"), module.__dict__)


def test_every_page_with_a_how_to_snippet_runs_something():
    """The pages whose examples are meant to be executable keep at least one runnable block."""
    for name in (
        "concepts.md",
        "howto/custom-segmenter-verifier.md",
        "howto/estimator-outside-trl.md",
        "howto/verl.md",
    ):
        assert any(b[2] for b in _blocks(DOCS / name)), f"docs/{name} has no <!-- runnable --> block"


# --------------------------------------------------------------------------------------------------------------
# Every Python snippet matches the API
# --------------------------------------------------------------------------------------------------------------


def _accepted_keywords(obj: Any) -> set[str] | None:
    """Keyword names a call to ``obj`` accepts; None when it takes any (``**kwargs`` all the way down)."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if inspect.isclass(obj):
        names: set[str] = set()
        # Follow **kwargs up the MRO: VinePPOTrainer(**kwargs) forwards to GRPOTrainer.__init__.
        for klass in obj.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            params = list(inspect.signature(init).parameters.values())
            names |= {p.name for p in params if p.kind in named}
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
                return names
        return None
    params = list(inspect.signature(obj).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in named}


def _check_snippet(code: str, where: str) -> list[str]:
    """Problems in one snippet: mcadvantage names that do not exist, unknown keyword arguments in calls to
    them (or to methods of instances built from them), unknown methods."""
    tree = ast.parse(code, filename=where)
    known: dict[str, Any] = {}  # local name -> mcadvantage object
    instances: dict[str, type] = {}  # variable -> mcadvantage class it was built from
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mcadvantage":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"{where}: `from {node.module} import {alias.name}`: no such name")
                else:
                    known[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and inspect.isclass(known.get(node.value.func.id))
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    instances[target.id] = known[node.value.func.id]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, label = None, None
        if isinstance(node.func, ast.Name) and node.func.id in known:
            func, label = known[node.func.id], node.func.id
        elif (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in instances
        ):
            cls = instances[node.func.value.id]
            label = f"{cls.__name__}.{node.func.attr}"
            func = getattr(cls, node.func.attr, None)
            if func is None:
                problems.append(f"{where}: {label}: no such method")
                continue
        if func is None or not callable(func):
            continue
        accepted = _accepted_keywords(func)
        if accepted is None:
            continue
        for kw in node.keywords:
            if kw.arg is not None and kw.arg not in accepted:
                problems.append(f"{where} line {node.lineno}: {label}(... {kw.arg}=...): no such parameter")
    return problems


def test_python_snippets_match_the_api():
    pytest.importorskip("trl")  # the snippets use VinePPOConfig / VinePPOTrainer
    problems = []
    checked = 0
    for path in [*_pages(), ROOT / "README.md"]:
        for line, code, _runnable, _slow in _blocks(path):
            problems += _check_snippet(code, f"{path.relative_to(ROOT)}:{line}")
            checked += 1
    assert checked >= 10, f"only {checked} Python snippets found; did the fence syntax change?"
    assert not problems, "snippets out of date with the API:\n" + "\n".join(problems)


def test_snippet_checker_catches_a_wrong_keyword():
    """The checker itself works: a misspelt config field and an unknown method are reported."""
    pytest.importorskip("trl")
    code = (
        "from mcadvantage import MCValueEstimator, VinePPOConfig\n"
        "args = VinePPOConfig(output_dir='x', num_mc_rolouts=9)\n"
        "est = MCValueEstimator(sampler, reward, tok, num_rollouts=3)\n"
        "est.estimate(batch, reward_kwargs={})\n"
        "est.estimat(batch)\n"
    )
    problems = _check_snippet(code, "example")
    assert len(problems) == 2, problems
    assert "num_mc_rolouts" in problems[0]
    assert "MCValueEstimator.estimat: no such method" in problems[1]


# --------------------------------------------------------------------------------------------------------------
# Every import the README and the docs show works
# --------------------------------------------------------------------------------------------------------------

_IMPORT_RE = re.compile(
    r"\bfrom\s+(?P<module>mcadvantage(?:\.\w+)*)\s+import\s+(?P<names>\([^)]*\)|[\w ,]+)"
    r"|\bimport\s+(?P<plain>mcadvantage(?:\.\w+)*)"
)
_FENCED_RE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def _code_texts(path: Path) -> list[str]:
    """The code a reader may paste from a Markdown file: every fenced block (any language: a ``python -c`` in a
    bash block counts) and every inline code span outside them."""
    text = path.read_text(encoding="utf-8")
    blocks = _FENCED_RE.findall(text)
    prose = _FENCED_RE.sub("", text)
    return blocks + re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", prose)


def _shown_imports(code: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for each ``from mcadvantage... import name`` in ``code`` and ``(module, None)`` for each
    ``import mcadvantage...``; placeholders such as ``import ...`` are not names and are skipped."""
    found: list[tuple[str, str | None]] = []
    for match in _IMPORT_RE.finditer(code):
        if match.group("plain"):
            found.append((match.group("plain"), None))
            continue
        for item in match.group("names").strip("()").replace("\n", ",").split(","):
            name = item.split(" as ")[0].strip()
            if name.isidentifier():
                found.append((match.group("module"), name))
    return found


def _import_problem(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (or ``import module``) fails, or None; a module that needs an extra that is
    not installed here (verl, vLLM, ...) is not a problem of the docs."""
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and not err.name.startswith("mcadvantage"):
            return None
        return f"import {module}: {err}"
    if name is not None and not hasattr(imported, name):
        return f"from {module} import {name}: no such name"
    return None


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "examples" / "README.md", *_pages()]


def test_every_import_in_the_readme_and_docs_works():
    """Issue 53: the README listed names that ``from mcadvantage import ...`` did not give. Every import statement
    in a code block or code span of the README, examples/README.md and docs/**/*.md is run."""
    pytest.importorskip("trl")  # VinePPOTrainer / VinePPOConfig import TRL
    shown = {
        (module, name, str(path.relative_to(ROOT)))
        for path in _doc_files()
        for code in _code_texts(path)
        for module, name in _shown_imports(code)
    }
    assert len(shown) >= 50, f"only {len(shown)} imports found; did the pattern break?"
    problems = sorted(
        f"{where}: {problem}"
        for module, name, where in shown
        if (problem := _import_problem(module, name)) is not None
    )
    assert not problems, "imports in the docs that fail:\n" + "\n".join(problems)


#: Where the docs may import from a module that is not public, and why (issue 60: otherwise only public paths).
INTERNAL_DOC_IMPORTS = {
    # the 0.1 -> 0.2 guide maps each old module path to its new one
    "docs/migration-0.2.md": "the table of moved modules",
    # the design page shows a contributor the one class that touches TRL's internals
    "docs/design.md": "the TRL seam (mcadvantage.trainer.trl_compat)",
}


def _public_path(module: str) -> bool:
    """``mcadvantage`` itself, a subpackage (its ``__init__`` is its public face), ``mcadvantage.testing`` or an
    integration's module (``mcadvantage.integrations.<framework>``, each an optional framework's entry point)."""
    if module == "mcadvantage" or module == "mcadvantage.testing":
        return True
    if module.startswith("mcadvantage.integrations.") and module.count(".") == 2:
        return True
    spec = importlib.util.find_spec(module) if module.startswith("mcadvantage.") else None
    return spec is not None and spec.submodule_search_locations is not None


def test_the_docs_import_only_public_paths():
    """Issue 60: every estimator, ``ContinuationRequest`` and the agent types come ``from mcadvantage``; a doc
    imports from the package, a subpackage, ``mcadvantage.testing`` or an integration, never a module inside."""
    deep = sorted(
        f"{path.relative_to(ROOT)}: from {module} import {name}"
        for path in _doc_files()
        if str(path.relative_to(ROOT)) not in INTERNAL_DOC_IMPORTS
        for code in _code_texts(path)
        for module, name in _shown_imports(code)
        if module.startswith("mcadvantage") and not _public_path(module)
    )
    assert not deep, "docs importing from a module path that is not public:\n" + "\n".join(deep)
    assert not _public_path("mcadvantage.agents.rebuild") and _public_path("mcadvantage.agents")


def test_every_name_the_readmes_box_lists_is_importable_from_the_package():
    """The README's "What is in the box" table names public pieces by their import name: each plain name comes
    ``from mcadvantage import ...``, each dotted one is a module that imports."""
    pytest.importorskip("trl")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    box = readme.split("## What is in the box", 1)[1].split("\n## ", 1)[0]
    cells = re.findall(r"^\| ([^|]+) \|", box, re.M)
    names = [n for cell in cells for n in re.findall(r"`([\w.]+)`", cell)]
    assert len(names) >= 15, names
    problems = [
        problem
        for name in names
        if (problem := _import_problem(name, None) if "." in name else _import_problem("mcadvantage", name))
    ]
    assert not problems, problems


def test_the_import_finder_sees_every_form():
    code = (
        "from mcadvantage import A, B as C\nfrom mcadvantage.x.y import (\n    D,\n    E,\n)\n"
        'python -c "import mcadvantage.z"\nfrom mcadvantage import ...\n'
    )
    assert _shown_imports(code) == [
        ("mcadvantage", "A"),
        ("mcadvantage", "B"),
        ("mcadvantage.x.y", "D"),
        ("mcadvantage.x.y", "E"),
        ("mcadvantage.z", None),
    ]
    assert (
        _import_problem("mcadvantage", "no_such_name") == "from mcadvantage import no_such_name: no such name"
    )
    assert _import_problem("mcadvantage", "VinePPOTrainer") is None


# --------------------------------------------------------------------------------------------------------------
# Every command-line flag in the docs exists
# --------------------------------------------------------------------------------------------------------------


def _bash_commands(path: Path) -> list[list[str]]:
    """Each command of the ```bash blocks of a page, as shell tokens (continuation lines joined)."""
    text = path.read_text(encoding="utf-8")
    commands = []
    for block in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S):
        for line in block.group(1).replace("\\\n", " ").splitlines():
            tokens = shlex.split(line, comments=True)
            while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):  # leading VAR=value
                tokens.pop(0)
            if tokens:
                commands.append(tokens)
    return commands


def _flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


def _options(parser: Any) -> set[str]:
    return set(parser._option_string_actions)  # argparse keeps every spelling of every option here


def test_command_line_flags_in_docs_exist(monkeypatch):
    """Flags of `trl vllm-serve`, `accelerate launch` and the example scripts used in the docs are real."""
    pytest.importorskip("trl")
    from accelerate.commands.launch import launch_command_parser
    from trl.scripts.vllm_serve import make_parser as vllm_serve_parser

    spec = importlib.util.spec_from_file_location("_docs_examples_common", ROOT / "examples" / "_common.py")
    common = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, common)  # dataclasses look their module up while it executes
    spec.loader.exec_module(common)
    # examples/agent.py imports its neighbour _common as a script does (its folder first on sys.path).
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    agent_spec = importlib.util.spec_from_file_location(
        "_docs_examples_agent", ROOT / "examples" / "agent.py"
    )
    agent = importlib.util.module_from_spec(agent_spec)
    monkeypatch.setitem(sys.modules, agent_spec.name, agent)
    agent_spec.loader.exec_module(agent)
    parsers = {
        "vllm-serve": _options(vllm_serve_parser()),
        "accelerate": _options(launch_command_parser()),
        "script": _options(common.make_parser()),  # VinePPOConfig + trl.ModelConfig + the examples' flags
        "agent": _options(agent.make_parser()),  # examples/agent.py: its task flags, --estimator, --model
    }

    def script_kind(path: str) -> str:
        return "agent" if path.endswith("agent.py") else "script"

    problems = []
    checked = 0
    for page in _pages():
        for tokens in _bash_commands(page):
            where = f"{page.relative_to(ROOT)}: {' '.join(tokens)[:80]}"
            if tokens[:2] == ["trl", "vllm-serve"]:
                groups = [("vllm-serve", tokens[2:])]
            elif tokens[:2] == ["accelerate", "launch"]:
                script = next((i for i, t in enumerate(tokens) if t.endswith(".py")), len(tokens))
                kind = script_kind(tokens[script]) if script < len(tokens) else "script"
                groups = [("accelerate", tokens[2:script]), (kind, tokens[script + 1 :])]
            elif tokens[:2] == ["python", "examples/agent.py"]:
                groups = [("agent", tokens[2:])]
            else:
                continue
            for kind, part in groups:
                for flag in _flags(part):
                    checked += 1
                    if flag not in parsers[kind]:
                        problems.append(f"{where}: {kind} has no flag {flag}")
    assert checked >= 10, f"only {checked} flags found in the docs' bash blocks"
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------------------------------
# The verl how-to's commands
# --------------------------------------------------------------------------------------------------------------


def _pip_installs(commands: list[list[str]]) -> list[tuple[list[str], list[str]]]:
    """``(options, requirements)`` of every ``pip install`` among ``commands`` (``-q`` dropped: output only)."""
    out = []
    for tokens in commands:
        if "pip" in tokens and tokens[tokens.index("pip") + 1 : tokens.index("pip") + 2] == ["install"]:
            args = tokens[tokens.index("pip") + 2 :]
            out.append(
                (
                    sorted(a for a in args if a.startswith("-") and a != "-q"),
                    [a for a in args if not a.startswith("-")],
                )
            )
    return out


def test_verl_howto_commands_are_checked_offline():
    """Every bash line of docs/howto/verl.md is checked here, or the test fails until it is: the install commands
    are CI's (``install_verl_cpu`` in scripts/_setup_venv.sh, same verl pin and packages, torch left to the
    reader), the extra exists, ``python -c`` lines run, scripts exist and parse. Not run: the installs (they need
    the network) and the GPU script."""
    import tomllib

    setup = (ROOT / "scripts" / "_setup_venv.sh").read_text(encoding="utf-8")
    version = re.search(r'^VERL_VERSION="\$\{VERL_VERSION:-([^}]+)\}"', setup, re.M).group(1)
    body = re.search(r"^install_verl_cpu\(\) \{.*?^\}", setup, re.M | re.S).group(0)
    ci_lines = [shlex.split(line, comments=True) for line in body.replace("\\\n", " ").splitlines()]
    ci = [
        (options, [r.replace("${VERL_VERSION}", version) for r in reqs if not r.startswith("torch==")])
        for options, reqs in _pip_installs(ci_lines)
    ]
    assert len(ci) == 2 and ci[0][1][0] == f"verl=={version}", ci  # the layout this test reads

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    page_installs, snippets, checked = [], [], 0
    for tokens in _bash_commands(DOCS / "howto" / "verl.md"):
        if tokens[:2] == ["pip", "install"]:
            page_installs.append(_pip_installs([tokens])[0])
        elif tokens[:2] == ["python", "-c"]:
            snippets.append(tokens[2])
        elif tokens[0] == "bash" and tokens[1].endswith(".sh"):
            script = ROOT / tokens[1]
            assert script.is_file(), f"docs/howto/verl.md runs {tokens[1]}, which does not exist"
            assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script
        else:
            raise AssertionError(f"docs/howto/verl.md: no check for `{' '.join(tokens)}`; add one here")
        checked += 1
    assert checked >= 5, checked
    # `pip install 'mcadvantage[verl]'`, then CI's two installs exactly.
    assert page_installs[0] == ([], ["mcadvantage[verl]"])
    assert "verl" in pyproject["project"]["optional-dependencies"]
    assert page_installs[1:] == ci, f"docs/howto/verl.md installs {page_installs[1:]}, CI installs {ci}"
    # `python -c "import mcadvantage.integrations.verl"` runs (in this venv, where verl is installed as the page
    # says).
    assert snippets
    pytest.importorskip("verl", reason="verl is installed by scripts/_setup_venv.sh (install_verl_cpu)")
    for code in snippets:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"python -c {code!r} failed:\n{proc.stderr[-2000:]}"


def test_tinker_howto_installs_are_cis():
    """docs/howto/tinker.md installs the extra, then exactly what CI's ``install_tinker`` installs (the torch and
    transformers pins left to the reader's environment)."""
    import tomllib

    setup = (ROOT / "scripts" / "_setup_venv.sh").read_text(encoding="utf-8")
    pins = dict(re.findall(r'^(TINKER(?:_COOKBOOK)?_VERSION)="\$\{\w+:-([^}]+)\}"', setup, re.M))
    body = re.search(r"^install_tinker\(\) \{.*?^\}", setup, re.M | re.S).group(0)
    lines = [shlex.split(line, comments=True) for line in body.replace("\\\n", " ").splitlines()]
    ci = []
    for options, reqs in _pip_installs(lines):
        for name, value in pins.items():
            reqs = [r.replace("${" + name + "}", value) for r in reqs]
        ci.append((options, [r for r in reqs if not r.startswith(("torch==", "transformers"))]))
    page = _pip_installs(_bash_commands(DOCS / "howto" / "tinker.md"))
    assert page[0] == ([], ["mcadvantage[tinker]"])
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["optional-dependencies"]["tinker"] == ["tinker>=0.38,<0.39"]
    assert page[1:] == ci and len(ci) == 2, f"docs/howto/tinker.md installs {page[1:]}, CI installs {ci}"
