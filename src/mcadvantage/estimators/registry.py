"""The names behind ``advantage_estimator=``: the one table of built-in estimators, registration, and the
lookup that ``VinePPOConfig``, the trainer and other RL loops share.

:data:`BUILTIN_ESTIMATORS` is the one table of built-ins: each name, the module that registers it, and a one-line
summary. The config's help, its error messages and the docs' estimator tables are all produced from it
(:func:`estimator_choices_text`, ``docs/_hooks/estimators.py``), so a new built-in is one module, one table entry and
its tests. Third-party estimators register with :func:`register_advantage_estimator`, or from an installed package's
``mcadvantage.advantage_estimators`` entry points, so ``accelerate launch`` and ``HfArgumentParser`` scripts can name
them without an import line.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, NamedTuple

from mcadvantage.estimators.base import AdvantageEstimator

__all__ = [
    "BUILTIN_ESTIMATORS",
    "ENTRY_POINT_GROUP",
    "BuiltinEstimator",
    "as_advantage_estimator",
    "available_advantage_estimators",
    "build_advantage_estimator",
    "estimator_choices_text",
    "estimators_reading",
    "get_advantage_estimator",
    "register_advantage_estimator",
]

logger = logging.getLogger(__name__)


class BuiltinEstimator(NamedTuple):
    """One row of :data:`BUILTIN_ESTIMATORS`."""

    module: str  #: the module (relative to ``mcadvantage.estimators``) that registers it when imported
    summary: str  #: what it computes, in a few words (config help, error messages, docs tables)


#: The built-in estimators: the one table the registry loads them from and every list of them is made from.
BUILTIN_ESTIMATORS: dict[str, BuiltinEstimator] = {
    "vineppo": BuiltinEstimator(
        ".vineppo", "Monte Carlo step values from K continuations per state (the default)"
    ),
    "grpo": BuiltinEstimator(".baselines", "GRPO's group-normalised advantage, as TRL computes it"),
    "rloo": BuiltinEstimator(".baselines", "RLOO's leave-one-out advantage"),
    "gae": BuiltinEstimator(".critic", "PPO's learned critic with GAE, the paper's main baseline"),
    "hybrid": BuiltinEstimator(
        ".hybrid",
        "GRPO, plus Monte Carlo step credit for groups whose rewards all tie, within a token budget",
    ),
    "tree": BuiltinEstimator(
        ".tree", "groups drawn as trees of shared prefixes, step credit from their own leaves"
    ),
    "anchor": BuiltinEstimator(
        ".anchor",
        "GRPO plus per-turn credit from the batch's turns that start from the same state (GiGPO), no extra samples",
    ),
}

#: The entry-point group an installed package registers estimators under: ``name = "package.module:Class"``.
ENTRY_POINT_GROUP = "mcadvantage.advantage_estimators"

_REGISTRY: dict[str, type[AdvantageEstimator]] = {}
_ENTRY_POINTS_LOADED = False


_ADAPTED: dict[type, type[AdvantageEstimator]] = {}


def _adapted_class(cls: type) -> type[AdvantageEstimator]:
    """``cls`` itself when it subclasses :class:`AdvantageEstimator`; else (a class written to the 0.1 protocol)
    a subclass of both, the same name, whose hooks ``cls`` leaves out take the contract's defaults (``cls``'s own
    attributes come first). One adapted class per ``cls``."""
    if issubclass(cls, AdvantageEstimator):
        return cls
    adapted = _ADAPTED.get(cls)
    if adapted is None:
        namespace = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "_adapted_from": cls,
        }
        if not hasattr(
            cls, "uses_rollouts"
        ):  # the 0.1 protocol's default: evaluation batches skip the estimator
            namespace["uses_rollouts"] = True
        adapted = _ADAPTED[cls] = type(cls.__name__, (cls, AdvantageEstimator), namespace)
    return adapted


def as_advantage_estimator(estimator: Any) -> AdvantageEstimator:
    """``estimator`` as an :class:`AdvantageEstimator`: itself when it is one; for an instance of a class written
    to the 0.1 protocol (``estimate`` without the base class), a view of it through its adapted class (see
    :func:`register_advantage_estimator`) that shares its attributes, so state it keeps (``last_rows``, a model)
    is the instance's own and the hooks it leaves out take the contract's defaults.

    Raises:
        TypeError: when ``estimator`` has no ``estimate`` method, or keeps its attributes in ``__slots__`` (then
            subclass :class:`AdvantageEstimator`).
    """
    if isinstance(estimator, AdvantageEstimator):
        return estimator
    if isinstance(estimator, type) or not callable(getattr(estimator, "estimate", None)):
        raise TypeError(
            f"advantage_estimator={estimator!r} is neither a registered name nor an estimator instance (an object "
            "with estimate(batch, context)); subclass mcadvantage.AdvantageEstimator."
        )
    if not hasattr(estimator, "__dict__"):
        raise TypeError(
            f"advantage_estimator={estimator!r}: {type(estimator).__name__} keeps its attributes in __slots__, so it "
            "cannot be adapted to the estimator contract; subclass mcadvantage.AdvantageEstimator."
        )
    view = object.__new__(_adapted_class(type(estimator)))
    view.__dict__ = estimator.__dict__  # one attribute dict: the view and the instance are the same estimator
    return view


def _qualified(cls: type) -> str:
    """``module.QualName`` of the class a user wrote (the 0.1-protocol class behind an adapted one)."""
    origin = cls.__dict__.get("_adapted_from", cls)
    return f"{origin.__module__}.{origin.__qualname__}"


def register_advantage_estimator(name: str, *, replace: bool = False) -> Callable[[type], type]:
    """Class decorator: make an estimator class available as ``advantage_estimator=name`` (case-insensitive).

    The class should subclass :class:`AdvantageEstimator`. A class written to the 0.1 protocol (``from_config`` and
    ``estimate`` only) is adapted: the decorator returns a subclass of it and of :class:`AdvantageEstimator`, of the
    same name, so the hooks it leaves out take the contract's defaults.

    Registration is by identity: registering the same class again under its name does nothing; another class under
    a taken name raises, unless ``replace=True`` (e.g. re-running a notebook cell that defines the class).

    Raises:
        TypeError: when the class does not implement ``estimate``.
        ValueError: when ``name`` is registered to another class and ``replace`` is False.
    """
    key = name.lower()

    def decorate(cls: type) -> type:
        if not isinstance(cls, type):
            raise TypeError(f"register_advantage_estimator({name!r}) decorates a class, not {cls!r}.")
        adapted = _adapted_class(cls)
        if adapted.estimate is AdvantageEstimator.estimate:
            raise TypeError(
                f"register_advantage_estimator({name!r}): {cls.__qualname__} has no estimate(); an advantage "
                "estimator implements estimate(batch, context) (and from_config(config) when it has settings)."
            )
        builtin = BUILTIN_ESTIMATORS.get(key)
        if (
            builtin is not None
        ):  # a built-in name is taken by the built-in, whether or not it was imported yet
            importlib.import_module(builtin.module, __package__)
        existing = _REGISTRY.get(key)
        if existing is adapted:
            return adapted
        if existing is not None and not replace:
            same_name = _qualified(existing) == _qualified(cls)
            raise ValueError(
                f"advantage estimator {name!r} is already registered to {_qualified(existing)}; {_qualified(cls)} is "
                "a different class"
                + (
                    " of the same name (its definition ran twice: a re-run notebook cell, a module imported under "
                    "two names)"
                    if same_name
                    else ""
                )
                + f". Register {cls.__name__} under another name, or pass "
                f"register_advantage_estimator({name!r}, replace=True) to replace the registered class on purpose."
            )
        adapted.name = key
        _REGISTRY[key] = adapted
        return adapted

    return decorate


def _load_builtins() -> None:
    for module in sorted({row.module for row in BUILTIN_ESTIMATORS.values()}):
        importlib.import_module(module, __package__)


def _load_entry_points() -> None:
    """Register the estimators installed packages declare under :data:`ENTRY_POINT_GROUP` (once per process).

    Each entry point names a class (``"my_pkg.estimators:MyEstimator"``) registered under the entry point's name,
    unless that module's own decorator already registered it. A broken entry point is reported and skipped, so one
    bad package does not stop training with the others."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        key = point.name.lower()
        try:
            cls = point.load()
            if _REGISTRY.get(key) is not _adapted_class(cls):
                register_advantage_estimator(key)(cls)
        except Exception as err:  # a third-party package's import error must name the package, not crash
            logger.warning(
                "advantage estimator entry point %r (%s, group %s) could not be registered: %s: %s",
                point.name,
                point.value,
                ENTRY_POINT_GROUP,
                type(err).__name__,
                err,
            )


def _load_all() -> None:
    _load_builtins()
    _load_entry_points()


def available_advantage_estimators() -> list[str]:
    """Names accepted by ``VinePPOConfig.advantage_estimator``: the built-ins, the installed packages' entry points
    and every registered one."""
    _load_all()
    return sorted(_REGISTRY)


def get_advantage_estimator(name: str) -> type[AdvantageEstimator]:
    """The estimator class registered as ``name`` (case-insensitive).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"advantage_estimator={name!r} must be a registered name (a string).")
    key = name.lower()
    if key not in _REGISTRY:
        _load_all()
    if key not in _REGISTRY:
        raise ValueError(
            f"advantage_estimator={name!r} is not registered. Known: {available_advantage_estimators()}; register "
            "your own with @mcadvantage.register_advantage_estimator('name'), or from your package's "
            f"{ENTRY_POINT_GROUP!r} entry points."
        )
    return _REGISTRY[key]


def build_advantage_estimator(spec: str | Any, config: Any) -> AdvantageEstimator:
    """An estimator instance from a registered name (built with ``from_config(config)``) or an instance
    (through :func:`as_advantage_estimator`)."""
    if isinstance(spec, str):
        return get_advantage_estimator(spec).from_config(config)
    return as_advantage_estimator(spec)


def estimators_reading(field_name: str) -> list[str]:
    """The registered estimators whose ``config_fields`` include ``field_name``, sorted (for error messages)."""
    return [name for name in available_advantage_estimators() if field_name in _REGISTRY[name].config_fields]


def estimator_choices_text() -> str:
    """The built-ins as one sentence for help texts: ``'vineppo' (Monte Carlo ...), 'grpo' (...), ...``; made
    from :data:`BUILTIN_ESTIMATORS`."""
    return ", ".join(f"{name!r} ({row.summary})" for name, row in BUILTIN_ESTIMATORS.items())
