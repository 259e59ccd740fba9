"""The environment contract, checked where a rebuild cannot check it by replay: a ``state_key`` that raises or is a
method, a ``_fork()`` whose copy shares mutable state with the environment it was forked from or is not in its
state, and a random environment whose continuations replay the episode's own random stream because it has no
``_reseed``. Pure functions on environment objects (nothing here imports TRL); each violation raises
:class:`EnvironmentContractError` naming the class, the episode and the fix, never trains on silently.

How shared state is found: the objects reachable from an instance's attributes (containers, instances with a
``__dict__``, random generators, arrays; a bounded walk) are collected for the fork and for the environment it was
forked from; a mutable object reachable from both is shared (``copy.copy(self)`` shares every list of the source).
How unreseeded randomness is found: the states of the random generators an environment holds
(``random.Random``, numpy's ``Generator`` / ``RandomState``, ``torch.Generator``) before and after a continuation
ran; a generator that moved was drawn from after the rebuild, by a continuation that replays the episode's stream.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import pickle
import random
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "NOT_RECORDED",
    "EnvironmentContractError",
    "check_fork",
    "check_environment_names",
    "check_reseeded",
    "check_state_key_declared",
    "check_state_key_property",
    "random_streams",
    "read_state_key",
    "shared_mutable_state",
]

#: Not recorded: the check is skipped (an episode without a prompt to compare, or without a recorded key).
NOT_RECORDED: Any = type("NotRecorded", (), {"__repr__": lambda self: "NOT_RECORDED"})()

#: The most objects a walk over an environment's attributes visits (environments are small; a bound on the cost).
_WALK_LIMIT = 5000
_WALK_DEPTH = 6
_ATOMIC = (str, bytes, int, float, complex, bool, type(None), range, type, enum.Enum, types.ModuleType)
_CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, property)
_CONTAINERS = (list, dict, set, bytearray, deque)
_NUMPY_MUTABLE = ("ndarray", "Generator", "RandomState", "BitGenerator")


class EnvironmentContractError(RuntimeError):
    """An environment breaks the contract Monte Carlo credit relies on (docs/howto/turn-credit-for-agents.md): a
    ``state_key`` that raises or is not a property, a ``_fork()`` that shares state, randomness after a rebuild
    without ``_reseed``. :class:`~mcadvantage.agents.rebuild.EnvironmentReplayError` (a replay that differs) is
    one.

    Attributes:
        environment: the environment's class name.
        where: which episode it was (e.g. its batch row), as the caller described it; empty when not given.
    """

    def __init__(self, message: str, *, environment: str | None = None, where: str = "") -> None:
        super().__init__(message)
        self.environment = environment
        self.where = where


# ---------------------------------------------------------------------------------------------------------------
# state_key: a read-only property, read where it exists, never defaulted when it raises
# ---------------------------------------------------------------------------------------------------------------


def _declared_state_key(cls: type) -> Any:
    """The ``state_key`` member of ``cls`` as declared (not bound), or NOT_RECORDED."""
    try:
        return inspect.getattr_static(cls, "state_key")
    except AttributeError:
        return NOT_RECORDED


def check_state_key_declared(environment_class: type, name: str | None = None) -> None:
    """Refuse an environment class whose ``state_key`` is a method: TRL turns every public method of an
    environment into a tool the model may call (under every estimator, ``"grpo"`` included), and the trainer reads
    the key as an attribute (to check rebuilds, to key turns by state).

    Raises:
        TypeError: naming the class and the fix (``@property``).
    """
    member = _declared_state_key(environment_class)
    if (
        isinstance(member, (staticmethod, classmethod))
        or inspect.isfunction(member)
        or inspect.ismethod(member)
    ):
        label = environment_class.__name__ + (f" (environment {name!r})" if name is not None else "")
        raise TypeError(
            f"{label}.state_key is a {type(member).__name__}, not a property: TRL turns every public method of an "
            "environment into a tool the model can call, so the model would be offered state_key as a tool, and "
            "the trainer reads the key as an attribute (to check every rebuild of an episode, and to key turns under "
            "'anchor'). Declare it with @property (a read-only property returning a hashable)."
        )


def check_state_key_property(environment_class: type, name: str | None = None) -> None:
    """Refuse an environment class without a read-only ``state_key`` property under ``anchor_state="state_key"``.

    Raises:
        TypeError: naming the class and the fix (add the property, or key turns by observation).
    """
    label = environment_class.__name__ + (f" (environment {name!r})" if name is not None else "")
    member = getattr(environment_class, "state_key", None)
    if member is None:
        raise TypeError(
            f"advantage_estimator='anchor' with anchor_state='state_key' reads the environment's state before each "
            f"turn from a read-only property state_key, which {label} does not have. Add one (a @property "
            "returning any hashable that is equal exactly when two states are, e.g. tuple(self.board)), or set anchor_state='observation' to key turns by the text of the last tool results."
        )
    if not isinstance(member, property):
        raise TypeError(
            f"{label}.state_key is a {type(member).__name__}, not a property: TRL turns every public method of an "
            "environment into a tool the model can call, and the anchor credit reads the key as an attribute. "
            "Declare it with @property."
        )


def check_environment_names(names: Sequence[str | None], known: Sequence[str | None]) -> None:
    """Refuse prompts routed to an environment ``environment_factory`` does not have (GRPO's own message for the same
    rows, which it raises at generation time, then what to do).

    Raises:
        ValueError: naming the first unknown name (and every one when several), the known ones and the fix.
    """
    unknown = [n for n in dict.fromkeys(names) if n not in known]
    if unknown:
        raise ValueError(
            f"Example has `environment={unknown[0]!r}`, which is not among the environments passed to "
            f"`environment_factory`. Expected one of: {list(known)}. Name each prompt's "
            "environment in the rows' 'environment' column with one of those keys (a dict environment_factory "
            "routes every row by it)" + (f"; unknown names: {unknown}." if len(unknown) > 1 else ".")
        )


def read_state_key(environment: Any, where: str = "") -> Any:
    """The environment's ``state_key`` (part of the environment contract), or NOT_RECORDED when it has none.

    A key that raises is never taken for a missing one: reading it with a default would switch the hidden-state
    check off silently (a typo in the property is an ``AttributeError``).

    Raises:
        EnvironmentContractError: the property raised (naming the class and the exception), or ``state_key`` is a
            method (naming ``@property``).
    """
    if environment is None:
        return NOT_RECORDED
    cls = type(environment)
    declared = _declared_state_key(cls) is not NOT_RECORDED
    at = f" ({where})" if where else ""
    try:
        key = environment.state_key if declared else getattr(environment, "state_key", NOT_RECORDED)
    except Exception as err:
        raise EnvironmentContractError(
            f"environment {cls.__name__}{at}: reading its state_key raised {type(err).__name__}: {err}. The trainer "
            "reads state_key after reset and after every tool round (to check each rebuild of an episode against "
            "it, and to key turns under 'anchor'); a key that raises would switch those checks off. Fix the "
            "property (a read-only @property returning a hashable), or remove it.",
            environment=cls.__name__,
            where=where,
        ) from err
    if inspect.ismethod(key):
        check_state_key_declared(cls)
    return key


# ---------------------------------------------------------------------------------------------------------------
# What an instance holds: the mutable objects reachable from its attributes
# ---------------------------------------------------------------------------------------------------------------


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """``(path step, child)`` of an object's attributes or items."""
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield f"[{key!r}]", value
    elif isinstance(obj, (list, tuple, deque)):
        for i, value in enumerate(list(obj)):
            yield f"[{i}]", value
    elif isinstance(obj, (set, frozenset)):
        for value in list(obj):
            yield "{...}", value
    elif not isinstance(obj, (random.Random, bytearray)) and hasattr(obj, "__dict__"):
        for key, value in list(vars(obj).items()):
            yield f".{key}", value
    slots = () if isinstance(obj, (tuple, list, dict)) else getattr(type(obj), "__slots__", ())
    for name in (slots,) if isinstance(slots, str) else slots:
        if isinstance(name, str) and hasattr(obj, name):
            yield f".{name}", getattr(obj, name)


def _is_mutable(obj: Any) -> bool:
    """Whether sharing ``obj`` between a fork and its source lets one move the other's state."""
    kind = type(obj)
    if isinstance(obj, _CONTAINERS) or isinstance(obj, random.Random):
        return True
    if kind.__module__.split(".")[0] in ("numpy", "torch"):
        return kind.__name__ in (*_NUMPY_MUTABLE, "Tensor")
    if dataclasses.is_dataclass(obj) and kind.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return False
    return hasattr(obj, "__dict__") and not isinstance(obj, (*_ATOMIC, *_CALLABLES))


def _reachable(root: Any) -> dict[int, tuple[str, Any]]:
    """``{id: (path, object)}`` of the objects reachable from ``root``'s attributes (a bounded walk; ``root``
    itself excluded)."""
    seen: dict[int, tuple[str, Any]] = {}
    frontier = [(path, child, 1) for path, child in _children(root)]
    while frontier and len(seen) < _WALK_LIMIT:
        path, obj, depth = frontier.pop()
        if obj is root or id(obj) in seen or isinstance(obj, (*_ATOMIC, *_CALLABLES)):
            continue
        seen[id(obj)] = (path, obj)
        if depth < _WALK_DEPTH:
            frontier.extend((path + step, child, depth + 1) for step, child in _children(obj))
    return seen


def shared_mutable_state(copy: Any, source: Any) -> list[str]:
    """The attribute paths of ``copy`` (e.g. ``".moves"``) that reach a mutable object ``source`` reaches too:
    what a shallow copy shares with its source. Empty for an independent copy (``copy.deepcopy``)."""
    if copy is source:
        return ["(the instance itself)"]
    mine = _reachable(source)
    return sorted(
        path for ident, (path, obj) in _reachable(copy).items() if ident in mine and _is_mutable(obj)
    )


# ---------------------------------------------------------------------------------------------------------------
# _fork: checked against the state it was forked from, as a replay is checked against the episode
# ---------------------------------------------------------------------------------------------------------------

_FORK_FIX = (
    "_fork() must return an independent copy in the same state: return copy.deepcopy(self) (or copy every mutable "
    "attribute), or remove _fork (every continuation is then rebuilt by reset and replay, checked)."
)


def _reward(environment: Any) -> Any:
    """``get_reward()`` where it answers (an observable result of the state), else NOT_RECORDED."""
    score = getattr(environment, "get_reward", None)
    if not callable(score):
        return NOT_RECORDED
    try:
        return score()
    except Exception:  # a reward that exists only at the episode's end: nothing to compare
        return NOT_RECORDED


def check_fork(fork: Any, source: Any, *, expected_key: Any = NOT_RECORDED, where: str = "") -> None:
    """Check a fork as a replay is checked: it shares no mutable state with the environment it was forked from,
    it is in that state (its ``state_key`` and ``get_reward()``, where the environment has them), and the source
    is still in the episode's state (``expected_key``: the key the episode recorded there; an earlier fork that
    shares state with it moves it on).

    Raises:
        EnvironmentContractError: naming ``_fork``, what differs or is shared, and the fix (``copy.deepcopy``).
    """
    name = type(source).__name__
    label = f"environment {name}{f' ({where})' if where else ''}"
    shared = shared_mutable_state(fork, source)
    if shared:
        raise EnvironmentContractError(
            f"{label}: _fork() returned a copy that shares mutable state with the environment it was forked from "
            f"({', '.join(shared[:5])}{' ...' if len(shared) > 5 else ''}): every Monte Carlo continuation of the "
            f"state would move the others' state, and the state later forks copy. {_FORK_FIX}",
            environment=name,
            where=where,
        )
    source_key, fork_key = read_state_key(source, where), read_state_key(fork, where)
    if expected_key is not NOT_RECORDED and source_key != expected_key:
        raise EnvironmentContractError(
            f"{label}: the environment kept to fork continuations from has state_key {source_key!r}, but the "
            f"episode's state there was {expected_key!r}: a fork moved it on (shared state). {_FORK_FIX}",
            environment=name,
            where=where,
        )
    differs = [
        f"{what} {got!r} where the source has {want!r}"
        for what, got, want in (
            ("state_key", fork_key, source_key),
            ("get_reward()", _reward(fork), _reward(source)),
        )
        if got is not NOT_RECORDED and want is not NOT_RECORDED and got != want
    ]
    if differs:
        raise EnvironmentContractError(
            f"{label}: _fork() returned a copy in another state than the environment it was forked from "
            f"({'; '.join(differs)}). {_FORK_FIX}",
            environment=name,
            where=where,
        )


# ---------------------------------------------------------------------------------------------------------------
# _reseed: randomness drawn after a rebuild replays the episode's stream
# ---------------------------------------------------------------------------------------------------------------


def _stream_state(obj: Any) -> Any:
    """A comparable fingerprint of a random generator's state, or None for anything else."""
    kind = type(obj)
    if isinstance(obj, random.SystemRandom):
        return None  # not seeded: nothing to replay
    if isinstance(obj, random.Random):
        state: Any = obj.getstate()
    elif kind.__module__.startswith("numpy") and kind.__name__ == "Generator":
        state = obj.bit_generator.state
    elif kind.__module__.startswith("numpy") and kind.__name__ == "RandomState":
        state = obj.get_state(legacy=False)
    elif kind.__module__.startswith("torch") and kind.__name__ == "Generator":
        state = obj.get_state()
    else:
        return None
    return hashlib.sha256(pickle.dumps(state)).hexdigest()


def random_streams(environment: Any) -> dict[str, Any]:
    """``{attribute path: state fingerprint}`` of the seeded random generators an environment holds."""
    if environment is None:
        return {}
    out = {}
    for path, obj in _reachable(environment).values():
        state = _stream_state(obj)
        if state is not None:
            out[path] = state
    return out


def check_reseeded(
    environment: Any,
    before: Mapping[str, Any],
    *,
    where: str = "",
    has_reseed: Callable[[Any], bool] | None = None,
) -> None:
    """Refuse a continuation that drew from a random generator its environment held at the rebuild (``before``:
    :func:`random_streams` then) when the class has no ``_reseed``: the rebuild replayed the episode's seeded
    stream, so every continuation from the state meets the episode's own luck and its value leans towards the
    episode's outcome.

    Raises:
        EnvironmentContractError: naming the generator, ``_reseed`` and an example.
    """
    if not before or (has_reseed or _has_reseed)(environment):
        return
    after = random_streams(environment)
    moved = sorted(path for path, state in before.items() if path in after and after[path] != state)
    if not moved:
        return
    name = type(environment).__name__
    raise EnvironmentContractError(
        f"environment {name}{f' ({where})' if where else ''}: a Monte Carlo continuation drew from the random "
        f"generator {moved[0]} after its environment was rebuilt, and {name} has no _reseed(seed). A rebuild replays "
        "the episode's seeded random stream (that is what makes it exact), so without _reseed every continuation "
        "from a state meets the episode's own luck, and the state's value leans towards the episode's outcome. "
        f"Define `def _reseed(self, seed: int): self{moved[0]} = random.Random(seed)` (or reseed it however it "
        "was made): the trainer calls it once per continuation, after the rebuild, with a seed drawn from the run's "
        "seed. If the draws must repeat the episode's, define _reseed as a no-op.",
        environment=name,
        where=where,
    )


def _has_reseed(environment: Any) -> bool:
    """Whether the environment's class defines the ``_reseed`` hook."""
    return callable(getattr(type(environment), "_reseed", None))
