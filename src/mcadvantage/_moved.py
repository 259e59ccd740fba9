"""Old module paths of the 0.1 layout, still importable: ``import mcadvantage.estimator`` gives
:mod:`mcadvantage.mc.estimator` itself (the same module object, so ``monkeypatch`` and ``isinstance`` agree).

The package was reorganised into one folder per concern (see ``docs/design.md``, "Package map"). Code written
against the old flat layout keeps working through :class:`MovedModuleFinder`, a meta-path finder that maps each
old name in :data:`MOVED` to its new home; ``python -m mcadvantage.diagnostics`` keeps working too (the finder
hands ``runpy`` the new module's code). New code should import the new paths.

Written by hand because no library re-exports a moved *module* (a re-exporting stub module would be a second,
different module object, which ``monkeypatch.setattr("mcadvantage.estimator.X", ...)`` would patch in vain).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "MovedModuleFinder", "install"]

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
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names in :data:`MOVED` and loads them as the new module (one module object, two names)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
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
        spec = importlib.util.find_spec(MOVED[fullname])
        return spec.loader.get_code(spec.name)  # type: ignore[union-attr]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import mcadvantage`` calls this)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
