"""Serve a TRL-style environment class (one :func:`~mcadvantage.envs.gymnasium_environment` game, the testbed's
``AgentEnv``, or any class with ``reset(**row)`` and one public tool method) as an OpenEnv server.

:func:`openenv_app` wraps the class in an ``openenv.core.Environment`` (one instance per WebSocket session) and
returns openenv-core's FastAPI app: the action model has the tool's parameters as fields, the observation carries
the tool's text, the per-step reward (the change of ``get_reward()``) and ``done``, and ``state()`` carries the
class's ``state_key``. ``reset`` takes the episode's ``seed``, and for Monte Carlo rebuilds ``replay`` (the
arguments of the episode's calls so far) and ``reseed`` (fresh randomness afterwards, echoed in the observation's
``reseeded``). A refused action raises in ``step``, which the server answers as an execution error.

:class:`LocalOpenEnvServer` runs such a server in a subprocess on a free local port (``python -m
mcadvantage.envs.openenv_server``), waits until it answers, and stops it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from mcadvantage.envs._common import RESERVED, require

__all__ = ["LocalOpenEnvServer", "openenv_app", "served_tool"]


def served_tool(factory: type) -> Callable[..., Any]:
    """The one public tool method of an environment class (as TRL lists them), or ValueError naming the fix."""
    names = [
        n
        for n, _ in inspect.getmembers(factory, predicate=inspect.isfunction)
        if not n.startswith("_") and n not in RESERVED
    ]
    if len(names) != 1:
        raise ValueError(
            f"openenv_app: {factory.__name__} has the public tool methods {names}; an OpenEnv server maps one tool to "
            "its action. Give the class exactly one public method besides reset and get_reward (make helpers "
            "underscore names)."
        )
    return getattr(factory, names[0])


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def _models(factory: type) -> tuple[Any, Any, Any, Callable[..., Any]]:
    """The pydantic action, observation and state models for ``factory``'s tool, and the tool."""
    pydantic = require("pydantic", "mcadvantage.envs.openenv_app")
    types = require("openenv.core.env_server.types", "mcadvantage.envs.openenv_app")
    tool = served_tool(factory)
    signature = inspect.signature(tool)
    hints = {k: v for k, v in getattr(tool, "__annotations__", {}).items() if k != "return"}
    try:  # the tool's schema as TRL renders it: argument descriptions and allowed values travel in /schema
        from transformers.utils import get_json_schema

        described = get_json_schema(tool)["function"]["parameters"]["properties"]
    except Exception:  # an undocumented tool still serves; its fields go without descriptions
        described = {}
    builtin = {"str": str, "int": int, "float": float, "bool": bool}
    fields = {}
    for name, param in list(signature.parameters.items())[1:]:
        kind = hints.get(name, str)
        kind = builtin.get(kind, str) if isinstance(kind, str) else kind
        info = described.get(name, {})
        extra = {"enum": info["enum"]} if "enum" in info else None  # shown, not enforced: the tool validates
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (
            kind,
            pydantic.Field(default, description=info.get("description"), json_schema_extra=extra),
        )
    doc = inspect.getdoc(tool) or tool.__name__
    action = pydantic.create_model(f"{factory.__name__}Action", __base__=types.Action, __doc__=doc, **fields)
    observation = pydantic.create_model(
        f"{factory.__name__}Observation",
        __base__=types.Observation,
        text=(str, ""),
        reseeded=(Optional[int], None),  # noqa: UP045 (pydantic builds the schema from it)
    )
    state = pydantic.create_model(f"{factory.__name__}State", __base__=types.State, key=(Any, None))
    return action, observation, state, tool


def _environment_class(factory: type) -> tuple[type, Any, Any]:
    """An ``openenv.core.Environment`` subclass serving ``factory``: (class, action model, observation model)."""
    core = require("openenv.core", "mcadvantage.envs.openenv_app")
    action_model, observation_model, state_model, tool = _models(factory)

    class Served(core.Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # one inner instance per session, nothing shared

        def __init__(self) -> None:
            super().__init__()
            self._inner = factory()
            self._return = 0.0
            self._steps = 0
            self._episode: str | None = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Any:
            replay, reseed = kwargs.pop("replay", None) or [], kwargs.pop("reseed", None)
            row = {**kwargs, **({"seed": seed} if seed is not None else {})}
            text = self._inner.reset(**row)
            self._return, self._steps, self._episode = 0.0, 0, episode_id
            observation = self._observation(text) if text is not None else observation_model()
            for arguments in replay:  # a Monte Carlo rebuild: the episode's calls so far
                observation = self.step(action_model(**arguments))
            if reseed is not None:
                hook = getattr(self._inner, "_reseed", None)
                if not callable(hook):
                    raise ValueError(
                        f"{factory.__name__} has no _reseed hook: its randomness cannot be refreshed."
                    )
                hook(int(reseed))
                observation.reseeded = int(reseed)
            return observation

        def _observation(self, text: Any) -> Any:
            total = float(self._inner.get_reward()) if hasattr(self._inner, "get_reward") else 0.0
            reward, self._return = total - self._return, total
            done = bool(getattr(self._inner, "done", getattr(self._inner, "finished", False)))
            return observation_model(text=str(text), reward=reward, done=done)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            arguments = action.model_dump(exclude={"metadata"})
            text = tool(self._inner, **arguments)  # a refused action raises: the server sends it as an error
            self._steps += 1
            return self._observation(text)

        @property
        def state(self) -> Any:
            key = getattr(self._inner, "state_key", None)
            return state_model(episode_id=self._episode, step_count=self._steps, key=_jsonable(key))

        def get_metadata(self) -> Any:
            return core.env_server.types.EnvironmentMetadata(
                name=factory.__name__,
                description=(inspect.getdoc(tool) or "").split("\n")[0],
                readme_content=getattr(factory, "_instructions", None),
            )

    Served.__name__ = Served.__qualname__ = f"Served{factory.__name__}"
    return Served, action_model, observation_model


def openenv_app(
    factory: type, *, max_concurrent_envs: int = 256, session_timeout_s: float | None = 600.0
) -> Any:
    """openenv-core's FastAPI app serving ``factory`` (an environment class with one tool), one instance per
    session. ``max_concurrent_envs`` bounds the open sessions: a training run holds one per episode of the batch
    plus, under ``"vineppo"``, one per Monte Carlo continuation being rebuilt; ``session_timeout_s`` closes sessions
    idle that long (a client that vanished)."""
    server = require("openenv.core.env_server.http_server", "mcadvantage.envs.openenv_app")
    types = require("openenv.core.env_server.types", "mcadvantage.envs.openenv_app")
    served, action_model, observation_model = _environment_class(factory)
    config = types.ConcurrencyConfig(
        max_concurrent_envs=max_concurrent_envs, session_timeout=session_timeout_s
    )
    return server.create_fastapi_app(served, action_model, observation_model, concurrency_config=config)


def load_factory(spec: str, env_kwargs: Mapping[str, Any] | None = None) -> type:
    """``"module:Class"`` (an environment class) or a gymnasium id (through :func:`gymnasium_environment`)."""
    if ":" in spec:
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)
    from mcadvantage.envs.gym_adapter import gymnasium_environment

    return gymnasium_environment(spec, env_kwargs=dict(env_kwargs or {}))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalOpenEnvServer:
    """An OpenEnv server for ``spec`` (a gymnasium id or ``"module:Class"``) in a subprocess on a free local port;
    a context manager (``with LocalOpenEnvServer("FrozenLake-v1") as server: server.url``).

    Raises:
        RuntimeError: the server exited or did not answer ``/health`` within ``start_timeout_s`` (with its output).
    """

    def __init__(
        self,
        spec: str,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_concurrent_envs: int = 256,
        start_timeout_s: float = 60.0,
        extra_paths: Sequence[str] = (),
    ) -> None:
        self.spec, self.port = spec, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "mcadvantage.envs.openenv_server", spec, "--port", str(self.port)]
        command += [
            "--env-kwargs",
            json.dumps(dict(env_kwargs or {})),
            "--max-concurrent-envs",
            str(max_concurrent_envs),
        ]
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join([*extra_paths, *sys.path])
        # The server's output goes to a file, not a pipe nobody reads: a full pipe would block the server.
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(command, env=environ, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait(start_timeout_s)

    def output(self) -> str:
        """What the server printed so far (its last 3000 characters)."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def _wait(self, timeout_s: float) -> None:
        import requests

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the OpenEnv server for {self.spec!r} exited ({self._process.returncode}):\n{self.output()}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=1.0).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"the OpenEnv server for {self.spec!r} did not answer {self.url}/health in {timeout_s:g} s:\n{self.output()}"
        )

    def stop(self) -> None:
        """Stop the server process (terminate, then kill after 10 s)."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def __enter__(self) -> LocalOpenEnvServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m mcadvantage.envs.openenv_server SPEC --port N``: serve SPEC (a gymnasium id or ``module:Class``)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "spec", help="a gymnasium id (FrozenLake-v1, Taxi-v4, CliffWalking-v1, ...) or module:Class"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--env-kwargs",
        default="{}",
        help='JSON keyword arguments for gymnasium.make, e.g. {"is_slippery": true}',
    )
    parser.add_argument("--max-concurrent-envs", type=int, default=256)
    args = parser.parse_args(argv)
    import uvicorn

    app = openenv_app(
        load_factory(args.spec, json.loads(args.env_kwargs)), max_concurrent_envs=args.max_concurrent_envs
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
