"""An OpenEnv server as TRL's ``environment_factory``: :func:`openenv_environment` builds a class whose instances
each hold one WebSocket session (openenv-core's ``GenericEnvClient``) per episode.

- ``reset(**row)`` opens a session and resets the server's environment with ``seed=row["seed"]``; the first
  observation's text is the prompt's tail;
- one tool: the server's action schema (``/schema``) as the tool's parameters (JSON string, integer, number or
  boolean fields; allowed values from an ``enum``); a refused action (the server's validation or execution error)
  comes back to the model as a tool error (``ValueError``), counted in ``invalid_actions``;
- ``get_reward()``: the sum of the server's step rewards; it raises :class:`OpenEnvError` when the session broke
  mid-episode (the server died or timed out), so a dead server stops the run with its URL instead of training on
  error messages;
- ``state_key``: a field of the server's ``state()`` the user names, or the observation text;
- rebuild for Monte Carlo continuations: reset with the episode's seed and replay of its calls (the library's
  replay), then ``_reseed(seed)``: one reset that replays the calls server-side and reseeds, for servers that echo
  ``reseeded`` (those :func:`~mcadvantage.envs.openenv_app` serves); others are refused unless ``reseed=False``.

Sessions are pooled per class (:class:`_SessionPool`): the episodes and every Monte Carlo continuation share at most
``env_max_sessions`` open sessions (``VinePPOConfig``; the trainer sets it on the class, default in
:data:`~mcadvantage.core.settings.ENVIRONMENT_SETTINGS`). An instance that needs a session when all are taken takes
the least recently used one from another instance, which is rebuilt by replay (reset with its seed, its calls, its
reseed) on a session when it acts again, so the open sessions never grow with batch x K.

Every network wait has a timeout (connect, each message, ``/schema``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

from mcadvantage.core.settings import ENVIRONMENT_SETTINGS
from mcadvantage.envs._common import check_tool_name, class_name, hashable, make_tool, require, seed_from_row
from mcadvantage.envs.openenv_sessions import _Refused, _Session, _SessionPool

__all__ = ["OpenEnvEnvironment", "OpenEnvError", "openenv_environment"]

_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}
#: Server error codes that mean the action was refused (the model's mistake), not that the session broke.
_REFUSED = ("VALIDATION_ERROR", "EXECUTION_ERROR")


class OpenEnvError(RuntimeError):
    """The OpenEnv server cannot be used: unreachable, out of sessions, or gone mid-episode (the message names the
    URL and what to do)."""


def _server_hint(url: str) -> str:
    return (
        f"Start the server (e.g. python -m mcadvantage.envs.openenv_server FrozenLake-v1 --port 8000 for "
        f"http://127.0.0.1:8000) or fix the URL {url!r}."
    )


class OpenEnvEnvironment:
    """Base of the classes :func:`openenv_environment` builds; not used directly."""

    _url: ClassVar[str]
    _fields: ClassVar[tuple[str, ...]]
    _timeouts: ClassVar[tuple[float, float]]
    _render: ClassVar[Callable[[dict[str, Any]], str]]
    _key_field: ClassVar[str | None]
    _seed_column: ClassVar[str]
    _can_reseed: ClassVar[bool]
    _tool_name: ClassVar[str]
    _instructions: ClassVar[str]
    _pool: ClassVar[_SessionPool]

    def __init__(self) -> None:
        self._client: Any = None  # opened by reset: TRL builds a probe instance it never resets
        self._begin(None)

    def _begin(self, seed: int | None) -> None:
        self._seed, self._total, self._over, self._broken = seed, 0.0, False, ""
        self._invalid, self._text, self._key = 0, "", None
        self._actions: list[dict[str, Any]] = []
        self._state_keys: list[Hashable] = []
        # The continuation's reseed and the calls before it: what a rebuild on another session replays.
        self._reseeded: int | None = None
        self._reseed_at = 0

    @classmethod
    def _limit_sessions(cls, limit: int) -> None:
        """Hold at most ``limit`` sessions open for this class's instances (``VinePPOConfig.env_max_sessions``,
        which the trainer sets here; default :data:`~mcadvantage.core.settings.ENVIRONMENT_SETTINGS`'s)."""
        from mcadvantage.core.settings import validate_environment_settings

        validate_environment_settings(env_max_sessions=limit)
        with cls._pool.lock:
            cls._pool.limit = int(limit)

    def __del__(self) -> None:
        if (
            not sys.is_finalizing()
        ):  # at interpreter exit the socket closes with the process (websockets is gone)
            self._close()

    @classmethod
    def _close_sessions(cls) -> None:
        """Close every session the class's pool holds open (e.g. when a run ends; an instance that acts again is
        rebuilt by replay on a new one)."""
        with cls._pool.lock:
            cls._pool.close_all()

    def _close(self, keep: bool = True) -> None:
        """Give the instance's session back to the class's pool: kept open for the next instance (``keep``), or
        closed (a broken session)."""
        pool = getattr(type(self), "_pool", None)
        if pool is not None and getattr(self, "_client", None) is not None:
            with pool.lock:
                pool.release(self, keep=keep)

    def _call(self, what: str, *, rebuild: bool = True, **data: Any) -> dict[str, Any]:
        """One request on a session leased from the class's pool; a session that was another instance's is first
        brought to this instance's state (``rebuild``: :meth:`_rebuild_on`). Connection loss, timeouts and a full
        server become :class:`OpenEnvError`; a refused action stays :class:`_Refused`."""
        pool = type(self)._pool
        with pool.lock:
            try:
                session, fresh = pool.lease(self, lambda: _Session(self._url, *self._timeouts))
                if fresh and rebuild:
                    self._rebuild_on(session)
                return session.request(what, data)
            except _Refused as err:
                if err.code in _REFUSED:
                    raise
                if err.code == "CAPACITY_REACHED":
                    opened = pool.open_sessions()
                    self._close(keep=False)
                    raise OpenEnvError(self._capacity_message(err, opened, pool.limit)) from None
                raise self._lost(what, err) from None
            except OpenEnvError:
                raise
            except Exception as err:  # refused connections, timeouts, a closed socket (websockets' errors)
                raise self._lost(what, err) from None

    def _rebuild_on(self, session: _Session) -> None:
        """Bring a leased session to this instance's state: reset with its seed and replay its calls (server-side
        where the server takes ``replay=``), its reseed and the calls after it; the observation must come back."""
        if self._seed is None:
            return
        cut = self._reseed_at if self._reseeded is not None else len(self._actions)
        data: dict[str, Any] = {"seed": self._seed}
        if self._can_reseed:  # a server that replays (openenv_app's): one message
            data["replay"] = self._actions[:cut]
            if self._reseeded is not None:
                data["reseed"] = self._reseeded
        tail = self._actions[cut:] if self._can_reseed else self._actions
        try:
            result = session.request("reset", data)
            for arguments in tail:
                result = session.request("step", dict(arguments))
        except _Refused as err:
            raise OpenEnvError(
                f"the OpenEnv server at {self._url} refused replaying an episode's calls on a pooled session ({err}):"
                " its environment must replay deterministically from the seed (and the reseed)."
            ) from None
        if self._render(result.get("observation", {})) != self._text:
            raise OpenEnvError(
                f"the OpenEnv server at {self._url} did not rebuild an episode's state on a pooled session (reset "
                f"with seed {self._seed} and {len(self._actions)} calls replayed): its environment must be "
                "deterministic given the seed, the calls and the reseed."
            )

    def _capacity_message(self, err: Exception, opened: int, limit: int) -> str:
        """A full server's error: what the pool needs (``limit`` sessions) and the two ways to set it."""
        return (
            f"the OpenEnv server at {self._url} has no free session ({err}): it refused session {opened} of the "
            f"{limit} that {type(self).__name__} may hold open (env_max_sessions={limit}; the batch's episodes and "
            "every Monte Carlo continuation share them, a continuation is rebuilt by replay when a session frees). "
            f"The pool needs the server to allow {limit} sessions: start it with max_concurrent_envs >= {limit} "
            f"(python -m mcadvantage.envs.openenv_server ... --max-concurrent-envs {limit}), or set "
            f"VinePPOConfig(env_max_sessions=N) to what the server allows (N >= 1; fewer sessions, more replays)."
        )

    def _lost(self, what: str, err: Exception) -> OpenEnvError:
        self._close(keep=False)
        self._broken = f"{what} failed: {type(err).__name__}: {err}"
        return OpenEnvError(
            f"the OpenEnv server at {self._url} did not answer {what}() ({type(err).__name__}: {err}); the episode's "
            f"session is lost. {_server_hint(self._url)} Timeouts: connect {self._timeouts[0]:g} s, each message "
            f"{self._timeouts[1]:g} s (openenv_environment's connect_timeout_s / message_timeout_s)."
        )

    def reset(self, **row: Any) -> str:
        """Open a session for the episode and reset the server's environment with the row's seed."""
        seed = seed_from_row(row, self._seed_column, type(self).__name__)
        self._close()  # one session per episode (the pool keeps it open for the next)
        self._begin(seed)
        self._observe(self._call("reset", rebuild=False, seed=seed))
        return self._text

    def _observe(self, result: dict[str, Any]) -> None:
        self._text = self._render(result.get("observation", {}))
        self._over = bool(result.get("done"))
        if self._key_field is None:
            self._key = self._text
        else:
            state = self._call("state")
            if self._key_field not in state:
                raise OpenEnvError(
                    f"state_key_field={self._key_field!r}: the state() of the server at {self._url} has the fields "
                    f"{sorted(state)}; name one of them."
                )
            self._key = hashable(state[self._key_field])
        self._state_keys.append(self._key)

    def get_reward(self) -> float:
        """The sum of the server's rewards this episode (raises :class:`OpenEnvError` if the session broke)."""
        if self._broken:
            raise OpenEnvError(
                f"the episode's session with the OpenEnv server at {self._url} broke ({self._broken}), so its reward "
                f"is unknown. {_server_hint(self._url)}"
            )
        return float(self._total)

    @property
    def state_key(self) -> Hashable | None:
        """The state key after the last reset or step: the named ``state()`` field, or the observation text."""
        return self._key

    @property
    def done(self) -> bool:
        """Whether the server said the episode is over."""
        return self._over

    @property
    def invalid_actions(self) -> int:
        """Tool calls of this episode the server (or the adapter) refused."""
        return self._invalid

    def _act(self, **arguments: Any) -> str:
        if self._seed is None:
            raise RuntimeError(f"{type(self).__name__}: call reset(**row) before {self._tool_name}.")
        if self._broken:
            raise OpenEnvError(
                f"the session with {self._url} is lost ({self._broken}); the episode cannot go on."
            )
        if self._over:
            self._invalid += 1
            raise ValueError(f"the episode is over; do not call {self._tool_name} again: give your answer.")
        try:
            result = self._call("step", **arguments)
        except _Refused as err:
            self._invalid += 1
            raise ValueError(f"{self._tool_name}({json.dumps(arguments)}) was refused: {err}") from None
        self._actions.append(dict(arguments))
        self._total += float(result.get("reward") or 0.0)
        self._observe(result)
        return self._text + (
            f"\nThe episode is over. Do not call {self._tool_name} again." if self._over else ""
        )

    def _reseed(self, seed: int) -> None:
        """Fresh randomness for a Monte Carlo continuation: reset with the episode's seed, replay its calls on the
        server and reseed there (the server must echo ``reseeded``); the state must come back unchanged."""
        if not self._can_reseed:
            return
        before = self._text
        result = self._call("reset", rebuild=False, seed=self._seed, replay=self._actions, reseed=int(seed))
        self._reseeded, self._reseed_at = int(seed), len(self._actions)
        if result.get("observation", {}).get("reseeded") != int(seed):
            raise OpenEnvError(
                f"the OpenEnv server at {self._url} ignored the reseed of a Monte Carlo continuation (its reset does "
                "not take replay= and reseed=), so every continuation would repeat the episode's random draws. Serve "
                "the environment with mcadvantage.envs.openenv_app, or pass reseed=False to openenv_environment if "
                "its transitions are deterministic."
            )
        if self._render(result.get("observation", {})) != before:
            raise OpenEnvError(
                f"the server at {self._url} did not rebuild the same state on the reseeding reset."
            )


def _schema(url: str, timeout_s: float) -> dict[str, Any]:
    requests = require("requests", "mcadvantage.envs.openenv_environment")
    try:
        response = requests.get(f"{url.rstrip('/')}/schema", timeout=timeout_s)
        response.raise_for_status()
        return response.json()
    except requests.RequestException as err:
        raise OpenEnvError(
            f"no OpenEnv server answers at {url} ({type(err).__name__}: {err}). {_server_hint(url)}"
        ) from None


def _metadata(url: str, timeout_s: float) -> dict[str, Any]:
    """The server's ``/metadata`` (its ``readme_content`` is the prompt's instructions when set); {} if absent."""
    import requests

    try:
        response = requests.get(f"{url}/metadata", timeout=timeout_s)
        return response.json() if response.ok else {}
    except (requests.RequestException, ValueError):
        return {}


def _tool_parameters(action: dict[str, Any], url: str) -> tuple[list[tuple[str, type]], list[str]]:
    """The tool's parameters and their docstring lines from the server's action schema."""
    parameters, lines = [], []
    required = set(action.get("required", []))
    for name, field in action.get("properties", {}).items():
        if name == "metadata":
            continue
        kind = _TYPES.get(field.get("type"))
        if kind is None or name not in required:
            raise ValueError(
                f"openenv_environment: the action field {name!r} of the server at {url} is "
                f"{field.get('type', field)!r}{'' if name in required else ' and optional'}; the adapter maps "
                "required string, integer, number and boolean fields to the tool's parameters. Write your own "
                "environment class for this server (docs/howto/bring-your-environment.md)."
            )
        choices = f" (choices: {json.dumps(field['enum'])})" if "enum" in field else ""
        parameters.append((name, kind))
        lines.append(f"    {name}: {field.get('description') or field.get('title') or name}{choices}")
    if not parameters:
        raise ValueError(
            f"openenv_environment: the action schema of the server at {url} has no fields: {action}."
        )
    return parameters, lines


def openenv_environment(
    base_url: str,
    *,
    tool_name: str = "act",
    state_key_field: str | None = None,
    observation_field: str | None = "text",
    render: Callable[[dict[str, Any]], str] | None = None,
    seed_column: str = "seed",
    reseed: bool = True,
    connect_timeout_s: float = 10.0,
    message_timeout_s: float = 30.0,
    name: str | None = None,
) -> type[OpenEnvEnvironment]:
    """An ``environment_factory`` class for the OpenEnv server at ``base_url`` (``http://host:port``).

    Args:
        tool_name: the tool's name; its parameters are the server's action fields.
        state_key_field: the field of the server's ``state()`` that ``state_key`` returns (None: the observation text).
        observation_field: the observation field whose text the model sees (None or absent: the observation as JSON).
        render: ``render(observation_dict) -> str``, instead of ``observation_field``.
        seed_column: the dataset column ``reset(**row)`` reads the episode's seed from.
        reseed: refresh the server's randomness per Monte Carlo continuation (needs a server that echoes
            ``reseeded``, as :func:`~mcadvantage.envs.openenv_app`'s do); False for deterministic servers.
        connect_timeout_s: the timeout of opening a session and of ``/schema`` (seconds).
        message_timeout_s: the timeout of every reply on a session (seconds): nothing waits longer.
        name: the class name (TRL logs the reward as ``rewards/<name>/mean``).

    Raises:
        OpenEnvError: no server answers at ``base_url`` (naming it and how to start one).
        ValueError: an action schema the tool cannot express, or a reserved ``tool_name``.
    """
    check_tool_name(tool_name)
    url = base_url.rstrip("/")
    schema = _schema(url, connect_timeout_s)
    parameters, lines = _tool_parameters(schema.get("action", {}), url)
    description = (schema.get("action", {}).get("description") or f"Act in the environment at {url}.").split(
        "\n"
    )[0]
    doc = (
        f"{description}\n\nArgs:\n" + "\n".join(lines) + "\n\nReturns:\n    The observation after the action."
    )

    def text_of(observation: dict[str, Any]) -> str:
        if render is not None:
            return str(render(observation))
        if observation_field is not None and observation_field in observation:
            return str(observation[observation_field])
        return json.dumps(observation, sort_keys=True)

    readme = _metadata(url, connect_timeout_s).get("readme_content")
    cls_name = name or class_name(
        f"OpenEnv {schema.get('action', {}).get('title', 'Env').removesuffix('Action')}"
    )
    tool = make_tool(tool_name, cls_name, doc, parameters, lambda self, **arguments: self._act(**arguments))
    argument = ", ".join(n for n, _ in parameters)
    return type(
        cls_name,
        (OpenEnvEnvironment,),
        {
            tool_name: tool,
            "_url": url,
            "_fields": tuple(n for n, _ in parameters),
            "_timeouts": (float(connect_timeout_s), float(message_timeout_s)),
            "_render": staticmethod(text_of),
            "_key_field": state_key_field,
            "_seed_column": seed_column,
            "_can_reseed": bool(reseed),
            "_pool": _SessionPool(ENVIRONMENT_SETTINGS["env_max_sessions"][0]),
            "_tool_name": tool_name,
            "_instructions": readme
            or f"{description}\nCall the tool {tool_name}({argument}), one call per turn. When the "
            f"episode is over, answer without calling {tool_name}.\nThe start:\n",
            "__doc__": f"The OpenEnv server at {url} as a TRL environment (mcadvantage.envs.openenv_environment).",
            "__module__": __name__,
        },
    )
