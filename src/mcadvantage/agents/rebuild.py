"""Rebuilding an agent episode's environment at a state: the one rule (:func:`rebuild_environment`), and what it
checks (pure functions; nothing here imports TRL), with the rest of the agent code in :mod:`mcadvantage.agents`.

An episode of TRL's tool loop records its tool rounds in its messages (:func:`recorded_tool_turns`). A Monte Carlo
continuation from a state must see its environment exactly as the episode left it there, and TRL's pooled instance
ends holding only the final state, so the state is rebuilt (:func:`replay_environment`): a fresh instance from the
factory, ``reset(**row)``, then the prefix's recorded tool calls replayed in order (:func:`execute_tool_calls`, TRL's
semantics). The rebuild is checked, not trusted: ``reset``'s observation against the episode's prompt
(:func:`with_observation`), every replayed result against the recorded one, and an environment's ``state_key``
property against the keys the episode recorded (:class:`EpisodeRecord`); a mismatch raises
:class:`EnvironmentReplayError`, naming an unstable default ``repr`` as the cause when that is all that differs.
``tools=`` functions alone are replayed the same way to check that they keep no state.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcadvantage.agents.env_checks import (
    NOT_RECORDED,
    EnvironmentContractError,
    check_fork,
    read_state_key,
)

__all__ = [
    "NOT_RECORDED",
    "EnvironmentContractError",
    "EnvironmentReplayError",
    "EpisodeRecord",
    "ToolTurn",
    "dropped_tool_calls",
    "environment_tools",
    "execute_tool_calls",
    "recorded_tool_turns",
    "rebuild_environment",
    "replay_environment",
    "reseed_environment",
    "warn_dropped_tool_results",
    "with_observation",
]


# ---------------------------------------------------------------------------------------------------------------
# What the episode did: its tool rounds, and an environment brought back to a state by replaying them
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolTurn:
    """One tool-calling round of an episode, as TRL recorded it in the conversation.

    Attributes:
        calls: the assistant message's ``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``).
        results: ``(name, content)`` of the tool messages that answered them, in order (``content`` as TRL put it in
            the conversation: ``str(result)``, or the list of content blocks a multimodal tool returned).
    """

    calls: tuple[dict[str, Any], ...]
    results: tuple[tuple[str, Any], ...]


def recorded_tool_turns(messages: Sequence[Mapping[str, Any]]) -> list[ToolTurn]:
    """The tool rounds of an episode's completion messages (TRL's ``completions[i]``): each assistant message with
    ``tool_calls`` followed by tool messages. A final call whose results TRL rolled back (they would have passed
    ``max_completion_length``) has no tool messages and is no round: its results are not in the episode's tokens."""
    turns, i = [], 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        results = []
        while i < len(messages) and messages[i].get("role") == "tool":
            results.append((messages[i].get("name"), messages[i].get("content")))
            i += 1
        if results:
            turns.append(ToolTurn(tuple(message["tool_calls"]), tuple(results)))
    return turns


def environment_tools(
    environment: Any, standalone: Sequence[Callable[..., Any]] = ()
) -> dict[str, Callable[..., Any]]:
    """The tools an episode of ``environment`` can call, by name, as TRL builds them: the standalone tools, then the
    environment's public methods other than ``reset`` and ``get_reward`` (listed on the class, so properties are not
    evaluated); a method shadows a standalone tool of the same name."""
    tools = {tool.__name__: tool for tool in standalone}
    if environment is not None:
        for name in _tool_method_names(type(environment)):
            tools[name] = getattr(environment, name)
    return tools


@functools.lru_cache(maxsize=256)
def _tool_method_names(kind: type) -> tuple[str, ...]:
    # Listing a class's functions (inspect.getmembers) costs more than a short continuation's bookkeeping, and every
    # continuation gets its own instance of the same few classes: list them once per class.
    return tuple(
        name
        for name, _ in inspect.getmembers(kind, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    )


def execute_tool_calls(
    calls: Sequence[Mapping[str, Any]], tools: Mapping[str, Callable[..., Any]]
) -> list[tuple[str, Any]]:
    """Run one round of tool calls as TRL's tool loop does, returning ``(name, content)`` per call in order: the
    result as the conversation holds it (``str(result)``, or a list of content blocks as is); a call to an unknown
    tool, a non-function call or a tool that raises gives ``{"error": ...}`` (as a string) instead of raising.
    Coroutine tools are awaited together (``asyncio.gather``), as TRL runs async tools concurrently."""
    out: list[tuple[str, Any]] = []
    pending: list[tuple[int, Any]] = []
    for call in calls:
        if call.get("type") != "function":
            out.append(
                (call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"})
            )
            continue
        function = call["function"]
        name = function["name"]
        try:
            if name not in tools:
                raise ValueError(f"Tool {name} not found.")
            result = tools[name](**function.get("arguments", {}))
        except Exception as err:  # a failing tool is part of the episode, as in TRL's loop
            result = {"error": str(err)}
        if inspect.isawaitable(result):
            pending.append((len(out), result))
        out.append((name, result))
    if pending:

        async def gather() -> list[Any]:
            return await asyncio.gather(*(coro for _, coro in pending), return_exceptions=True)

        for (index, _), result in zip(pending, asyncio.run(gather()), strict=True):
            out[index] = (out[index][0], {"error": str(result)} if isinstance(result, Exception) else result)
    return [(name, result if isinstance(result, list) else str(result)) for name, result in out]


class EnvironmentReplayError(EnvironmentContractError):
    """An environment could not be brought back to an episode's state: its reset raised or returned another
    observation than the episode's, replaying the episode's tool calls gave other results than the episode recorded,
    or its ``state_key`` after a replayed round differed from the episode's.

    Attributes:
        environment: the environment's class name (``"tools="`` for standalone tools).
        round: the tool round after which the replay differed (0-based), None when ``reset`` raised or its
            observation differed.
        where: which episode it was (e.g. its batch row), as the caller described it; empty when not given.
    """

    def __init__(
        self, message: str, *, environment: str | None = None, round: int | None = None, where: str = ""
    ) -> None:
        super().__init__(message, environment=environment, where=where)
        self.round = round


# The default repr of an object names its memory address, which differs in every process and run.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _why_different(got: Any, want: Any) -> str:
    """The cause a replay mismatch message names: an unstable default ``repr`` when the two values differ only in
    memory addresses, else the contract (deterministic given the row and the calls so far)."""
    got_text, want_text = repr(got), repr(want)
    if got_text != want_text and _ADDRESS.sub("", got_text) == _ADDRESS.sub("", want_text):
        return (
            "They differ only in memory addresses (' at 0x...'): a value with Python's default repr, which changes "
            "every time, so the replay cannot be compared even if the environment is deterministic. Give its class "
            "a __repr__ (or __str__) that shows its content, or return plain data (str, numbers, dicts)."
        )
    return (
        "Make reset and the tools deterministic given the row and the calls so far (seed any randomness from a row "
        "column, keep no outside state; a tools= function keeps no state at all), or use "
        "advantage_estimator='grpo' / 'rloo' / 'gae' (no replay)."
    )


def with_observation(prompt: Any, observation: Any) -> Any:
    """``prompt`` with ``reset``'s ``observation`` appended to its last message, as GRPO's tool loop appends it (a
    string to a string content; a list of content blocks to a list, a string becoming a text block); ``prompt``
    itself when ``observation`` is None."""
    if observation is None or not isinstance(prompt, list) or not prompt:
        return prompt
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return prompt[:-1] + [{**prompt[-1], "content": content + observation}]


@dataclass(frozen=True)
class EpisodeRecord:
    """What a rebuild of an episode's environment is checked against (each part optional).

    Attributes:
        prompt: the episode's prompt after ``reset``'s observation was appended (GRPO's), with ``row_prompt`` the
            dataset's prompt before it: the rebuilt ``reset`` must give the same prompt (:func:`with_observation`).
        row_prompt: the dataset row's prompt (GRPO's default ``[{"role": "user", "content": ""}]`` when absent).
        state_keys: the environment's ``state_key`` after ``r`` tool rounds, by ``r`` (0: right after ``reset``),
            for the rounds recorded (the trainer records every round of an episode that GRPO's tool loop played).
    """

    prompt: Any = NOT_RECORDED
    row_prompt: Any = NOT_RECORDED
    state_keys: Mapping[int, Any] = field(default_factory=dict)


def _check_reset(environment: Any, observation: Any, record: EpisodeRecord, label: str, where: str) -> None:
    if record.prompt is NOT_RECORDED or record.row_prompt is NOT_RECORDED:
        return
    rebuilt = with_observation(record.row_prompt, observation)
    if rebuilt == record.prompt:
        return
    episode_content = record.prompt[-1].get("content") if isinstance(record.prompt, list) else record.prompt
    if isinstance(episode_content, str) and len(episode_content) > 120:
        episode_content = "..." + episode_content[-120:]
    raise EnvironmentReplayError(
        f"environment {label}: reset(**row) returned {_short(observation)} when rebuilt for a Monte Carlo "
        f"continuation, but the episode's prompt after reset ends {_short(episode_content)}: the rebuilt environment "
        f"would not be in the episode's state (e.g. a random target drawn in reset). {_why_different(rebuilt, record.prompt)}",
        environment=type(environment).__name__,
        where=where,
    )


def _check_state_key(environment: Any, rounds: int, record: EpisodeRecord, label: str, where: str) -> None:
    want = record.state_keys.get(rounds, NOT_RECORDED)
    if want is NOT_RECORDED:
        return
    got = read_state_key(environment, where)
    if got == want:
        return
    after = "reset(**row)" if rounds == 0 else f"replaying tool round {rounds - 1}"
    raise EnvironmentReplayError(
        f"environment {label}: state_key after {after} is {_short(got)}, but the episode's was {_short(want)}: "
        f"its hidden state differs from the episode's, so a continuation would not see the episode's state. "
        f"{_why_different(got, want)}",
        environment=type(environment).__name__,
        round=None if rounds == 0 else rounds - 1,
        where=where,
    )


def replay_environment(
    factory: Callable[[], Any] | None,
    reset_kwargs: Mapping[str, Any],
    turns: Sequence[ToolTurn],
    standalone_tools: Sequence[Callable[..., Any]] = (),
    *,
    where: str = "",
    record: EpisodeRecord | None = None,
    reseed: Callable[[], int] | None = None,
) -> Any:
    """A fresh environment in the state an episode reached after ``turns``: ``factory()``, ``reset(**reset_kwargs)``,
    then every recorded tool round replayed in order (:func:`execute_tool_calls`). The one rule for rebuilding an
    environment; the original episode's instance is never touched, and every call gets its own instance, so
    continuations share no state with each other or with the episode's reward.

    What is checked (each mismatch raises :class:`EnvironmentReplayError` naming the episode, the round and both
    values, and an unstable default ``repr`` as the cause when that is all that differs): ``reset``'s observation
    against the episode's prompt (``record.prompt``), every replayed result against the recorded one, and, for an
    environment with a ``state_key`` property, the key after reset and after every replayed round against the
    episode's (``record.state_keys``, where recorded). What cannot be checked: hidden state without a ``state_key``
    that neither the observation nor a tool result shows. ``factory=None``: ``tools=`` alone, replayed to check that
    they keep no state (their results must repeat); returns None.

    The contract this relies on: ``reset(**row)`` and the tools are deterministic functions of the row and the calls
    so far (no randomness without a seed taken from the row, no outside state). Tools with side effects outside the
    instance (files, services) are run again by every replay: make them idempotent, or keep such effects out of the
    tools.

    Args:
        where: which episode this is, for the error message (e.g. ``"batch row 3"``); the dataset row's
            columns are named in the message as well.
        record: what the episode recorded (:class:`EpisodeRecord`); None: only the tool results are checked.
        reseed: the source of a fresh seed per rebuild (:func:`reseed_environment`), called once after the replay
            when the environment has ``_reseed`` (None: the rebuilt environment goes on with the episode's random
            stream).
    """
    record = record if record is not None else EpisodeRecord()
    environment = factory() if factory is not None else None
    kind = type(environment).__name__ if factory is not None else "tools="
    # Name the episode: a replay fails for one dataset row, and the user needs that row to reproduce it.
    columns = {k: v for k, v in reset_kwargs.items() if k != "prompt"}
    label = f"{kind} ({where + ', ' if where else ''}dataset row {_short(columns)})"
    if environment is not None:
        try:
            observation = environment.reset(**reset_kwargs)
        except Exception as err:
            raise EnvironmentReplayError(
                f"environment {label}: reset(**row) raised {type(err).__name__}: {err} while rebuilding the "
                "episode's state for Monte Carlo continuations (a fresh instance from the factory, reset with the "
                "episode's row). reset must succeed again for every row it succeeded for in training: make it "
                "retry or fail over, or use advantage_estimator='grpo' / 'rloo' / 'gae' (no replay).",
                environment=kind,
                where=where,
            ) from err
        _check_reset(environment, observation, record, label, where)
        _check_state_key(environment, 0, record, label, where)
    tools = environment_tools(environment, standalone_tools)
    for round_index, turn in enumerate(turns):
        replayed = execute_tool_calls(turn.calls, tools)
        recorded = [tuple(r) for r in turn.results]
        if list(replayed) != recorded:
            stateful = " (a tools= function that keeps state between calls?)" if factory is None else ""
            raise EnvironmentReplayError(
                f"environment {label}: replaying tool round {round_index} "
                f"({[c.get('function') for c in turn.calls]}) gave {_short(replayed, 400)}, but the episode recorded "
                f"{_short(recorded, 400)}{stateful}, so a Monte Carlo continuation would not see the episode's "
                f"state. {_why_different(replayed, recorded)}",
                environment=kind,
                round=round_index,
                where=where,
            )
        _check_state_key(environment, round_index + 1, record, label, where)
    reseed_environment(environment, reseed)
    return environment


def reseed_environment(environment: Any, reseed: Callable[[], int] | None) -> None:
    """Fresh randomness for one continuation: an environment whose transitions are random replays the episode's random
    stream (seeded by ``reset`` from the row), so every rebuild would repeat the episode's luck. Such an environment
    defines the optional hook ``_reseed(seed: int)`` (an underscore name: not a tool in TRL); it is called with a
    fresh ``reseed()`` once the environment is at the state (``mcadvantage.envs``' adapters define it)."""
    hook = getattr(environment, "_reseed", None)
    if reseed is not None and callable(hook):
        hook(int(reseed()))


def rebuild_environment(
    factory: Callable[[], Any],
    reset_kwargs: Mapping[str, Any],
    turns: Sequence[ToolTurn],
    standalone_tools: Sequence[Callable[..., Any]] = (),
    *,
    where: str = "",
    record: EpisodeRecord | None = None,
    templates: dict[Any, Any] | None = None,
    key: Any = None,
    reseed: Callable[[], int] | None = None,
) -> tuple[Any, int]:
    """The one rule for an environment at an episode's state, for one continuation: returns ``(environment, tool
    calls the rebuild ran)``.

    Reset and replay (:func:`replay_environment`, checked), unless the environment opts into a cheaper fork: an
    environment whose class defines ``_fork()`` (an underscore method, so TRL does not make it a tool) returning an
    independent copy in the same state (``copy.deepcopy(self)`` for plain attributes) is rebuilt by replay once per
    state, kept in ``templates`` under ``key`` (the caller's name for the state, e.g. its episode and rounds), and
    every continuation gets ``template._fork()``: one replay per state instead of one per continuation. A fork is
    checked as a replay is (:func:`~mcadvantage.agents.env_checks.check_fork`): it shares no mutable state with
    the template, it is in the template's state (``state_key``, ``get_reward()``), and the template is still in the
    episode's state (``record``'s key), else :class:`EnvironmentContractError` names ``_fork`` and the fix
    (``copy.deepcopy``). Without ``templates`` every call replays. Either way the continuation's environment is then reseeded
    (:func:`reseed_environment`) when ``reseed`` is given and it defines ``_reseed``.
    """
    expected = (record.state_keys if record is not None else {}).get(len(turns), NOT_RECORDED)
    if templates is not None and key in templates:
        forked = templates[key]._fork()
        check_fork(forked, templates[key], expected_key=expected, where=where)
        reseed_environment(forked, reseed)
        return forked, 0
    environment = replay_environment(
        factory, reset_kwargs, turns, standalone_tools, where=where, record=record
    )
    calls = sum(len(turn.calls) for turn in turns)
    if templates is not None and callable(getattr(type(environment), "_fork", None)):
        templates[key] = environment  # kept at the state, never reseeded: each fork is
        environment = environment._fork()
        check_fork(environment, templates[key], expected_key=expected, where=where)
    reseed_environment(environment, reseed)
    return environment, calls


def dropped_tool_calls(messages: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The tool calls of an episode's last assistant message when GRPO dropped their results (they would have
    passed ``max_completion_length``): the calls ran, but their results are not in the episode's tokens or
    messages. Empty when the episode did not end so."""
    if not messages:
        return ()
    last = messages[-1]
    if last.get("role") == "assistant" and last.get("tool_calls"):
        return tuple(last["tool_calls"])
    return ()


_DROPPED_WARNED: list[bool] = [False]


def warn_dropped_tool_results(count: int) -> None:
    """Warn once per process that tool results were dropped for the token budget (the calls ran: an environment's
    state, and so ``get_reward``, includes them, while the messages do not)."""
    if count <= 0 or _DROPPED_WARNED[0]:
        return
    _DROPPED_WARNED[0] = True
    warnings.warn(
        f"{count} tool-calling round(s) had their results dropped because they would pass max_completion_length "
        "(GRPO's rule, which Monte Carlo continuations follow): the calls ran, so the environment's state and "
        "get_reward include them, but the completion's tokens and messages do not, and a reward function reading "
        "the tool messages grades such an episode differently from get_reward. Counted as mc/dropped_tool_results; "
        "raise max_completion_length or keep tool results short. (Warned once per process.)",
        RuntimeWarning,
        stacklevel=2,
    )


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)  # repr: one line, quotes visible
    return text if len(text) <= limit else text[: limit - 4] + "...}"
