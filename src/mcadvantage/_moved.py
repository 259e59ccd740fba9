"""Old module paths of the 0.1 layout, still importable until :data:`REMOVED_IN`: ``import mcadvantage.estimator``
gives :mod:`mcadvantage.mc.estimator` itself (the same module object, so ``monkeypatch`` and ``isinstance`` agree)
and a ``FutureWarning`` that names the new path and the release that removes the old one.

The package was reorganised into one folder per concern (see ``docs/design.md``, "Package map"). Code written
against the old flat layout keeps working through :class:`MovedModuleFinder`, a meta-path finder that maps each
old name in :data:`MOVED` to its new home; ``python -m mcadvantage.diagnostics`` keeps working too (the finder
hands ``runpy`` the new module's code), with the same warning. New code should import the new paths.

The warning fires once per old name and process, the first time that name is imported (later imports find it in
``sys.modules`` and never reach the finder), also when the new module was imported before. It is a
``FutureWarning``, not a ``DeprecationWarning``, because the people who must act are the users of the old path,
and Python hides ``DeprecationWarning`` outside ``__main__``. It points at the line that imports the old path
(the first frame outside :mod:`importlib` and this module), so the default filter shows it once per such line.

Written by hand because no library re-exports a moved *module* (a re-exporting stub module would be a second,
different module object, which ``monkeypatch.setattr("mcadvantage.estimator.X", ...)`` would patch in vain).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import warnings
from types import FrameType, ModuleType
from typing import Any

__all__ = [
    "MOVED",
    "REMOVED_IN",
    "MovedModuleFinder",
    "install",
    "moved_message",
    "old_spelling_message",
    "warn_old_spelling",
]

#: The release that removes the old paths of :data:`MOVED` (the warning and docs/migration-0.2.md name it).
REMOVED_IN = "0.4"

#: old dotted module name -> where it lives now
MOVED: dict[str, str] = {
    "mcadvantage.advantages": "mcadvantage.core.advantages",
    "mcadvantage.settings": "mcadvantage.core.settings",
    "mcadvantage.text": "mcadvantage.core.text",
    "mcadvantage.data": "mcadvantage.core.prompts",
    "mcadvantage.reward_errors": "mcadvantage.rewards.errors",
    "mcadvantage.reward_models": "mcadvantage.rewards.models",
    "mcadvantage.vllm_weights": "mcadvantage.samplers.vllm_weights",
    # split into one module per concern; the package re-exports every public name of both
    "mcadvantage.segmenters": "mcadvantage.tasks",
    "mcadvantage.verifiers": "mcadvantage.tasks",
    "mcadvantage.estimator": "mcadvantage.mc.estimator",
    "mcadvantage.mc_budget": "mcadvantage.mc.budget",
    "mcadvantage.config": "mcadvantage.trainer.config",
    "mcadvantage.trl_compat": "mcadvantage.trainer.trl_compat",
    "mcadvantage.trainer_checks": "mcadvantage.trainer.checks",
    "mcadvantage.policy": "mcadvantage.trainer.policy",
    "mcadvantage.checkpoints": "mcadvantage.trainer.checkpoints",
    "mcadvantage.self_training": "mcadvantage.trainer.self_training",
    "mcadvantage.diagnostics": "mcadvantage.evaluation.diagnostics",
    "mcadvantage.gradient_quality": "mcadvantage.evaluation.gradient_quality",
    "mcadvantage.report": "mcadvantage.evaluation.report",
    # after 0.3.0: the agent code in one subpackage (docs/design.md, "Package map")
    "mcadvantage.samplers.episodes": "mcadvantage.agents.tool_loop",
    "mcadvantage.samplers.episode_sampler": "mcadvantage.agents.episode_sampler",
    "mcadvantage.samplers.rebuild": "mcadvantage.agents.rebuild",
    "mcadvantage.samplers.env_checks": "mcadvantage.agents.env_checks",
    "mcadvantage.mc.episodes": "mcadvantage.agents.turns",
    "mcadvantage.trainer.state_keys": "mcadvantage.agents.state_keys",
    "mcadvantage.trainer.agents": "mcadvantage.agents.trainer_episodes",
}


def moved_message(old: str, *, command: bool = False) -> str:
    """What importing (or, with ``command``, running ``python -m``) the old path ``old`` of :data:`MOVED` warns."""
    new = MOVED[old]
    if command:
        return (
            f"python -m {old}: the module moved to {new}, and the old path stops working in mcadvantage "
            f"{REMOVED_IN}: run python -m {new} instead (docs/migration-0.2.md lists every moved path)."
        )
    return (
        f"The module {old} moved to {new}, and the old path stops working in mcadvantage {REMOVED_IN}: import "
        f"{new} instead (docs/migration-0.2.md lists every moved path)."
    )


def old_spelling_message(old: str, new: str) -> str:
    """What a 0.1 spelling other than a module path (an old-style argument, the 0.1 estimator protocol, a setting
    alias, a re-exported name) warns: the old spelling, the 0.2 one and the release that removes the old."""
    return (
        f"{old} is mcadvantage 0.1's spelling, accepted until {REMOVED_IN}: write {new} instead "
        "(docs/migration-0.2.md lists every old spelling)."
    )


def warn_old_spelling(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Issue :func:`old_spelling_message` as a ``FutureWarning`` (as the old module paths warn), pointing
    ``stacklevel`` frames up from this function's caller's caller (3: the line that called the function that
    accepted the old spelling)."""
    warnings.warn(old_spelling_message(old, new), FutureWarning, stacklevel=stacklevel)


def _importing_frame() -> FrameType | None:
    """The frame that imports the old path: the first one outside the import machinery and this module."""
    importlib_dir = os.path.dirname(importlib.__file__)
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__
        or frame.f_code.co_filename.startswith("<frozen importlib")  # the frozen _bootstrap modules
        or os.path.dirname(frame.f_code.co_filename)
        == importlib_dir  # import_module, or an unfrozen _bootstrap
    ):
        frame = frame.f_back
    return frame


def _warn_moved(old: str, *, command: bool = False) -> None:
    """Issue :func:`moved_message` as a ``FutureWarning`` attributed to the importing line.

    ``warnings.warn(stacklevel=...)`` cannot say which line that is: the number of import-machinery frames in
    between differs between ``import x`` and ``importlib.import_module("x")``. So the frame is found here and the
    warning issued for it with ``warn_explicit``, with that module's registry, as ``warnings.warn`` would."""
    message = moved_message(old, command=command)
    frame = _importing_frame()
    if frame is None:  # imported from C with no Python frame above: nothing better to point at
        warnings.warn(message, FutureWarning, stacklevel=2)
        return
    module_globals = frame.f_globals
    warnings.warn_explicit(
        message,
        FutureWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__", "<string>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
        module_globals=module_globals,
    )


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names in :data:`MOVED` and loads them as the new module (one module object, two names),
    warning that the old name goes in :data:`REMOVED_IN`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        # Here, not in find_spec: importlib.util.find_spec(old) only asks, and must not warn.
        _warn_moved(spec.name)
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system overwrites __spec__ next; restored below
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The new module is already executed. Give it back its own spec (the import system set the old name's),
        # so that importlib.util.find_spec / reload and a package's submodule search see the real module.
        real = getattr(module.__spec__, "loader_state", None)
        if real is not None:
            module.__spec__ = real

    def get_code(self, fullname: str) -> Any:
        """The new module's code, for ``python -m <old name>`` (``runpy`` asks the loader for it)."""
        _warn_moved(fullname, command=True)
        spec = importlib.util.find_spec(MOVED[fullname])
        return spec.loader.get_code(spec.name)  # type: ignore[union-attr]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import mcadvantage`` calls this)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
