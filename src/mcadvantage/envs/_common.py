"""What the gymnasium and OpenEnv adapters share: the environment contract's names, making values hashable, the
optional-dependency import, building the one tool, and the training rows."""

from __future__ import annotations

import importlib
import keyword
import random
from collections.abc import Callable, Hashable, Sequence
from typing import Any

#: TRL turns every public method of an environment into a tool except these two.
RESERVED = ("reset", "get_reward")

INSTALL_HINT = "pip install 'mcadvantage[envs]' (gymnasium==1.4.*, openenv-core==0.3.*)"


def require(module: str, what: str) -> Any:
    """Import an optional dependency of :mod:`mcadvantage.envs`, or raise ImportError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{what} needs the package '{module}', which is not installed: {INSTALL_HINT}."
        ) from err


def hashable(value: Any) -> Hashable:
    """A hashable, value-compared form of an observation or a piece of state: numpy scalars become Python numbers,
    arrays ``(shape, dtype, bytes)``, lists and tuples tuples (recursively), dicts sorted item tuples."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()
    if hasattr(value, "tobytes") and hasattr(value, "shape"):
        return (tuple(value.shape), str(value.dtype), value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), hashable(v)) for k, v in value.items()))
    hash(value)  # raises TypeError for anything else unhashable
    return value


def check_tool_name(tool_name: str) -> None:
    """A tool name TRL exposes: a public identifier other than ``reset`` and ``get_reward``."""
    if (
        not tool_name.isidentifier()
        or keyword.iskeyword(tool_name)
        or tool_name.startswith("_")
        or tool_name in RESERVED
    ):
        raise ValueError(
            f"tool_name={tool_name!r} cannot be a tool: TRL exposes public methods other than {RESERVED} as tools. "
            "Pass a public Python identifier, e.g. 'act' or 'move'."
        )


def class_name(label: str) -> str:
    """A class name from an environment id: ``"FrozenLake-v1"`` -> ``"FrozenLakeV1"``."""
    parts = [p for p in "".join(c if c.isalnum() else " " for c in label).split() if p]
    name = "".join(p[:1].upper() + p[1:] for p in parts) or "Environment"
    return name if name[0].isalpha() else f"Env{name}"


def make_tool(
    tool_name: str, owner: str, doc: str, parameters: Sequence[tuple[str, type]], body: Callable[..., str]
) -> Callable[..., str]:
    """The one tool method: ``tool_name(self, <parameters>) -> str`` calling ``body(self, **arguments)``, with a
    signature, type hints and a Google-style docstring that ``transformers.utils.get_json_schema`` parses (TRL
    renders the tool's schema from them)."""
    import inspect

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in parameters
    ]
    signature = inspect.Signature(params, return_annotation=str)

    def tool(*args: Any, **kwargs: Any) -> str:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:  # a wrong argument name: the model sees which ones the tool takes
            raise ValueError(f"{tool_name}() takes {[n for n, _ in parameters]}: {err}") from None
        arguments = dict(bound.arguments)
        return body(arguments.pop("self"), **arguments)

    tool.__signature__ = signature  # type: ignore[attr-defined]
    tool.__annotations__ = {**{n: t for n, t in parameters}, "return": str}
    tool.__name__ = tool_name
    tool.__qualname__ = f"{owner}.{tool_name}"
    tool.__doc__ = doc
    return tool


def seed_from_row(row: dict[str, Any], column: str, owner: str) -> int:
    """The episode's seed: the row's ``column``, an int (every episode of a group resets to the same state)."""
    if column not in row:
        raise ValueError(
            f"{owner}.reset(**row): the dataset row has no {column!r} column (columns: {sorted(row)}). Each row "
            f"needs an int {column!r}, the seed that puts every episode of its group in the same start state and "
            "lets Monte Carlo continuations rebuild it: build the rows with mcadvantage.envs.environment_dataset, "
            "or add the column (or pass seed_column= naming yours)."
        )
    seed = row[column]
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            if int(seed) != seed:
                raise ValueError
            seed = int(seed)
        except (TypeError, ValueError):
            raise ValueError(
                f"{owner}.reset(**row): the row's {column!r} is {seed!r}; it must be an int."
            ) from None
    return int(seed)


def environment_dataset(environment: type, n: int, seed: int = 0, *, prompt: str | None = None) -> Any:
    """``n`` training rows for an adapter's environment class as a ``datasets.Dataset``: ``prompt`` (one user message:
    the game's rules and how to call its tool; TRL appends ``reset``'s first observation to it) and ``seed`` (drawn
    with ``random.Random(seed)``), the column ``reset(**row)`` reads."""
    if n < 1:
        raise ValueError(f"environment_dataset: n={n} must be >= 1 (rows to build).")
    instructions = prompt if prompt is not None else getattr(environment, "_instructions", None)
    if instructions is None:
        raise ValueError(
            f"environment_dataset: {getattr(environment, '__name__', environment)!r} has no built-in instructions "
            "(it is not a class from mcadvantage.envs); pass prompt='...'."
        )
    column = getattr(environment, "_seed_column", "seed")
    from datasets import Dataset

    rng = random.Random(seed)
    seeds = [rng.randrange(2**31) for _ in range(n)]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": instructions}]] * n, column: seeds})


def instructions(rules: str, tool_name: str, argument: str, choices: Sequence[str] | None) -> str:
    """The prompt's text: the rules, how to call the tool, and where the first observation follows."""
    allowed = f" with {argument} one of {', '.join(choices)}" if choices else ""
    return (
        f"{rules}\nCall the tool {tool_name}({argument}){allowed}, one call per turn. When the episode is over, "
        f"answer without calling {tool_name}.\nThe start:\n"
    )
