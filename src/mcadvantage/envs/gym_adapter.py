"""A gymnasium environment with a discrete action space as TRL's ``environment_factory``.

:func:`gymnasium_environment` builds a class whose instances TRL resets per episode and whose one public method is
the tool the model calls (``act(action: str)`` by default). The contract it meets (``docs/howto/
bring-your-environment.md``):

- ``reset(**row)`` resets the environment with ``seed=row["seed"]`` (so every episode of a group starts from the
  same state, and a rebuild for Monte Carlo continuations reproduces the episode's random stream) and returns the
  first observation as text;
- the tool steps the environment and returns the next observation as text; an unparsable or illegal action, or a
  call after the episode ended, raises ``ValueError`` with the allowed values, which TRL's tool loop turns into an
  ``{"error": ...}`` result for the model and counts in ``tools/failure_frequency`` (never a crash); the instance
  counts them too (``invalid_actions``);
- ``get_reward()`` is the sum of the environment's rewards (TRL's reward source; pass ``reward_funcs=None``);
- ``state_key`` (a read-only property: TRL turns only methods into tools) is the discrete observation, or a hash of
  the unwrapped environment's state the user names;
- ``_reseed(seed)``: after a rebuild, fresh environment randomness for one continuation
  (:func:`mcadvantage.agents.rebuild.reseed_environment` calls it after every rebuild).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mcadvantage.envs._common import (
    check_tool_name,
    class_name,
    hashable,
    instructions,
    make_tool,
    require,
    seed_from_row,
)
from mcadvantage.envs.render import game_text

__all__ = ["GymnasiumEnvironment", "gymnasium_environment"]


@dataclass(frozen=True)
class _GymSpec:
    make: Callable[[], Any]
    label: str
    actions: tuple[str, ...]
    render: Callable[[Any, Any], str]  # (unwrapped env, observation) -> text
    key: Callable[[Any, Any], Hashable]  # (unwrapped env, observation) -> state key
    seed_column: str
    tool_name: str


class GymnasiumEnvironment:
    """Base of the classes :func:`gymnasium_environment` builds (one per game); not used directly.

    Public surface (what TRL sees): ``reset``, ``get_reward``, the one tool, and read-only properties. Everything
    else is an underscore name.
    """

    _spec: ClassVar[_GymSpec]
    _instructions: ClassVar[str]
    _seed_column: ClassVar[str]

    def __init__(self) -> None:
        self._env: Any = None  # made at the first reset (TRL builds a probe instance it never resets)
        self._begin()

    def _begin(self) -> None:
        self._total = 0.0
        self._over = ""  # why the episode ended ("" while it runs)
        self._invalid = 0
        self._observation: Any = None
        self._state_keys: list[Hashable] = []  # the key after reset and after every step
        self._actions: list[int] = []  # the action indices stepped, in order
        self._seed: int | None = None

    def reset(self, **row: Any) -> str:
        """Start an episode from the row's seed; return the first observation as text."""
        spec = self._spec
        seed = seed_from_row(row, spec.seed_column, type(self).__name__)
        if self._env is None:
            self._env = spec.make()
        self._begin()
        self._seed = seed
        self._observation, _ = self._env.reset(seed=seed)
        self._state_keys.append(self.state_key)
        return spec.render(self._env.unwrapped, self._observation)

    def get_reward(self) -> float:
        """The episode's return: the sum of the environment's rewards so far."""
        return float(self._total)

    @property
    def state_key(self) -> Hashable | None:
        """The environment's current state as a hashable key (None before the first reset)."""
        if self._env is None or self._observation is None:
            return None
        return self._spec.key(self._env.unwrapped, self._observation)

    @property
    def done(self) -> bool:
        """Whether the episode ended (terminated or truncated by the environment)."""
        return bool(self._over)

    @property
    def invalid_actions(self) -> int:
        """Tool calls of this episode that were refused (unparsable, illegal, or after the end)."""
        return self._invalid

    def _parse(self, action: Any) -> int:
        names = self._spec.actions
        text = str(action).strip().strip("\"'").lower()
        if text in names:
            return names.index(text)
        if text.lstrip("-").isdigit() and 0 <= int(text) < len(names):
            return int(text)
        self._invalid += 1
        raise ValueError(
            f"{action!r} is not an action of {self._spec.label}: call {self._spec.tool_name}(action) with one of "
            f"{list(names)} (or its index 0-{len(names) - 1})."
        )

    def _act(self, action: Any) -> str:
        if self._env is None or self._observation is None:
            raise RuntimeError(f"{type(self).__name__}: call reset(**row) before {self._spec.tool_name}.")
        if self._over:
            self._invalid += 1
            raise ValueError(
                f"the episode is over ({self._over}); do not call {self._spec.tool_name} again: give your answer."
            )
        index = self._parse(action)
        self._observation, reward, terminated, truncated, _ = self._env.step(index)
        self._actions.append(index)
        self._total += float(reward)
        self._state_keys.append(self.state_key)
        lines = [self._spec.render(self._env.unwrapped, self._observation)]
        if reward:
            lines.append(f"Reward: {float(reward):g}.")
        if terminated or truncated:
            self._over = "it reached a terminal state" if terminated else "it hit the step limit"
            lines.append(
                f"The episode is over ({self._over}), with a total reward of {self._total:g}. Do not call "
                f"{self._spec.tool_name} again."
            )
        return "\n".join(lines)

    def _reseed(self, seed: int) -> None:
        """Fresh randomness from the current state on (a Monte Carlo continuation after its rebuild): the
        environment's ``np_random`` is replaced by a generator seeded with ``seed``; the state is untouched."""
        from gymnasium.utils.seeding import np_random

        self._env.unwrapped.np_random = np_random(int(seed))[0]


def _maker(env: str | Callable[[], Any], env_kwargs: Mapping[str, Any]) -> tuple[Callable[[], Any], str]:
    gym = require("gymnasium", "mcadvantage.envs.gymnasium_environment")
    if callable(env):
        return (lambda: env(**env_kwargs)), getattr(env, "__name__", type(env).__name__)
    if not isinstance(env, str):
        raise TypeError(
            f"gymnasium_environment: env={env!r} must be a gymnasium id or a callable returning an Env."
        )
    try:
        gym.spec(env)
    except gym.error.Error as err:
        raise ValueError(
            f"gymnasium_environment: {env!r} is not a registered gymnasium environment ({err}). Pass a registered id "
            "(e.g. 'FrozenLake-v1', 'Taxi-v4', 'CliffWalking-v1'; gymnasium.pprint_registry() lists them), or a "
            "callable that returns the Env."
        ) from None
    return (lambda: gym.make(env, **env_kwargs)), env


def _key_function(state_key: str | Callable[[Any], Any] | None, label: str) -> Callable[[Any, Any], Hashable]:
    if state_key is None:
        return lambda unwrapped, observation: hashable(observation)
    if isinstance(state_key, str):
        name = state_key

        def read(unwrapped: Any, observation: Any) -> Hashable:
            if not hasattr(unwrapped, name):
                raise AttributeError(f"state_key={name!r}: the unwrapped {label} has no attribute {name!r}.")
            return hashable(getattr(unwrapped, name))

        return read
    if callable(state_key):
        return lambda unwrapped, observation: hashable(state_key(unwrapped))
    raise TypeError(
        f"gymnasium_environment: state_key={state_key!r} must be None (the observation), the name of an attribute "
        "of the unwrapped env, or a callable unwrapped_env -> hashable."
    )


def gymnasium_environment(
    env: str | Callable[..., Any],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    render: Callable[[Any], str] | None = None,
    actions: Sequence[str] | None = None,
    state_key: str | Callable[[Any], Any] | None = None,
    seed_column: str = "seed",
    tool_name: str = "act",
    rules: str | None = None,
    name: str | None = None,
) -> type[GymnasiumEnvironment]:
    """An ``environment_factory`` class for a gymnasium environment with a discrete action space.

    Args:
        env: a registered gymnasium id (``"FrozenLake-v1"``, ``"Taxi-v4"``, ``"CliffWalking-v1"``, ...) or a callable
            returning a ``gymnasium.Env`` (called with ``env_kwargs``).
        env_kwargs: keyword arguments for ``gymnasium.make`` (e.g. ``{"is_slippery": True}``) or the callable.
        render: ``render(observation) -> str``; needed for games without a built-in text (FrozenLake, Taxi and
            CliffWalking have one: the board as characters).
        actions: the action names in action-index order (the built-in games have theirs; else ``"0"``, ``"1"``...).
        state_key: what ``state_key`` returns: None for the observation (hashable form), the name of an attribute of
            the unwrapped environment, or a callable ``unwrapped_env -> value``; the value is made hashable.
        seed_column: the dataset column ``reset(**row)`` reads the episode's seed from.
        tool_name: the tool's name (TRL shows the model ``tool_name(action)``).
        rules: the game's rules for the prompt (:func:`~mcadvantage.envs.environment_dataset`); built in for the
            known games.
        name: the class name (TRL logs the environment's reward as ``rewards/<name>/mean``); from the id by default.

    Raises:
        ValueError: an unknown id, a non-discrete action space, a game without a renderer, ``actions`` of the
            wrong length, or a reserved ``tool_name``; each names the fix.
    """
    check_tool_name(tool_name)
    make, label = _maker(env, dict(env_kwargs or {}))
    probe = make()
    try:
        space, unwrapped = probe.action_space, probe.unwrapped
    finally:
        probe.close()
    gym = require("gymnasium", "mcadvantage.envs.gymnasium_environment")
    if not isinstance(space, gym.spaces.Discrete):
        raise ValueError(
            f"gymnasium_environment: {label} has the action space {space}, not a Discrete one; the model's tool takes "
            "one discrete action. Discretise it first (e.g. gymnasium.wrappers.DiscretizeAction(env, bins) for a Box "
            "space, inside a callable you pass as env) or choose a game with discrete actions."
        )
    known = game_text(unwrapped)
    names = tuple(str(a).lower() for a in (actions or (known.actions if known else range(int(space.n)))))
    if len(names) != int(space.n) or len(set(names)) != len(names):
        raise ValueError(
            f"gymnasium_environment: actions={list(names)} must name each of {label}'s {int(space.n)} actions once, "
            "in action-index order."
        )
    if render is not None:
        renderer: Callable[[Any, Any], str] = lambda unwrapped, observation: str(render(observation))  # noqa: E731
    elif known is not None:
        renderer = known.render
    else:
        raise ValueError(
            f"gymnasium_environment: {label} has no built-in text renderer (built in: FrozenLake, Taxi, CliffWalking). "
            "Pass render=lambda observation: '...' returning the observation as text."
        )
    spec = _GymSpec(make, label, names, renderer, _key_function(state_key, label), seed_column, tool_name)
    cls_name = name or class_name(label)
    doc = (
        f"Take one action in {label} and see the result.\n\nArgs:\n    action: The action to take "
        f"(choices: [{', '.join(f'{chr(34)}{a}{chr(34)}' for a in names)}])\n\nReturns:\n    The observation after the "
        "action, and whether the episode is over."
    )
    tool = make_tool(tool_name, cls_name, doc, [("action", str)], lambda self, action: self._act(action))
    text = rules or (known.rules if known else f"{label}: choose actions to maximise the total reward.")
    return type(
        cls_name,
        (GymnasiumEnvironment,),
        {
            tool_name: tool,
            "_spec": spec,
            "_instructions": instructions(text, tool_name, "action", names),
            "_seed_column": seed_column,
            "__doc__": f"{label} as a TRL environment (mcadvantage.envs.gymnasium_environment).",
            "__module__": __name__,
        },
    )
