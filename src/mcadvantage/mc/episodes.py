"""Multi-turn episodes for Monte Carlo credit: where the states are, which tokens get credit, how an environment is
brought back to a state, and how a continuation resumes an episode (pure functions; the engine, the parser and
the chat template come in as callables, so nothing here imports TRL).

An episode of TRL's tool loop (``tools=`` / ``environment_factory=``) is one completion whose tokens alternate
between the model's own turns (``tool_mask`` 1) and tool results (``tool_mask`` 0), which TRL joins without
re-tokenising. Monte Carlo credit treats it as follows:

- **States** sit at turn boundaries (the first token of each model turn, i.e. right after a tool result) and, through
  the step segmenter, at step boundaries inside the model's own turns (:func:`episode_step_boundaries`). A tool
  result never starts a state and never forms a step: the last step of a turn runs from its last boundary through
  the tool result to the next turn, so its value change includes what the environment answered.
- **Credit**: every model token of step ``i`` carries ``A_i = V(S_i) - V(S_{i-1})``; tool-result tokens get 0
  (:func:`episode_token_advantages`).
- **Environment state**: a continuation from state ``S`` must see its environment exactly as the episode left it
  at ``S``. TRL keeps one pooled instance per episode and it ends holding the final state, so the state is rebuilt:
  a fresh instance, ``reset(**row)``, then the prefix's recorded tool calls replayed in order, each replayed result
  checked against the recorded one (:func:`replay_environment`). An environment whose replay differs (randomness,
  outside state) is refused with :class:`EnvironmentReplayError` (its class, the call, both results, the fix).
- **Continuation** (:func:`continue_episodes`): from its prefix, each continuation generates the rest of the
  current turn, parses it, executes its tool calls on its own environment (TRL's semantics: an unknown tool or a
  raising tool yields ``{"error": ...}``), appends the results' tokens and goes on until a turn without a tool call,
  ``max_tool_calling_iterations`` or the completion budget. Active continuations go through the engine together,
  one call per turn.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EnvironmentReplayError",
    "EpisodeContinuation",
    "ToolLoop",
    "ToolTurn",
    "continue_episodes",
    "environment_tools",
    "episode_step_boundaries",
    "episode_token_advantages",
    "execute_tool_calls",
    "model_spans",
    "recorded_tool_turns",
    "replay_environment",
    "tool_spans",
    "tool_turns_before",
]


# ---------------------------------------------------------------------------------------------------------------
# Where the states are
# ---------------------------------------------------------------------------------------------------------------


def _runs(tool_mask: Sequence[int], value: int) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate(tool_mask):
        if int(m) == value and start is None:
            start = i
        elif int(m) != value and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(tool_mask)))
    return spans


def model_spans(tool_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of the model's own turns: the maximal runs of ``tool_mask`` 1."""
    return _runs(tool_mask, 1)


def tool_spans(tool_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of the tool results: the maximal runs of ``tool_mask`` 0 (one per tool-calling round)."""
    return _runs(tool_mask, 0)


def tool_turns_before(tool_mask: Sequence[int], position: int) -> int:
    """How many tool results the episode holds before token ``position`` (the tool rounds a state there has seen)."""
    return sum(1 for _, end in tool_spans(tool_mask) if end <= position)


def episode_step_boundaries(
    tool_mask: Sequence[int], turn_step_boundaries: Callable[[int, int], Sequence[int]] | None = None
) -> list[int]:
    """Step boundaries ``0 = b_0 < ... < b_n = len(tool_mask)`` of an episode, as
    :class:`~mcadvantage.mc.trajectory.Trajectory` takes them.

    Args:
        tool_mask: TRL's tool mask of the completion (1: the model's token, 0: a tool result's).
        turn_step_boundaries: ``(start, end) -> boundaries`` of the step segmenter inside one model turn, absolute
            positions strictly inside ``(start, end)`` (None: one step per turn).

    Returns:
        The first token of every model turn (the states after each tool result; the first turn starts at 0), the
        segmenter's boundaries inside the turns, and the episode's end. Never a position inside or at the start of a
        tool result.

    Raises:
        ValueError: an episode that starts with a tool result (a completion must start with the model's turn), or a
            segmenter boundary outside its turn.
    """
    length = len(tool_mask)
    if length == 0:
        return [0]
    if int(tool_mask[0]) != 1:
        raise ValueError(
            "episode_step_boundaries: the completion starts with a tool result (tool_mask[0] = 0); an episode starts "
            "with the model's turn. Pass TRL's tool_mask of the whole completion."
        )
    bounds = set()
    for start, end in model_spans(tool_mask):
        bounds.add(start)
        for b in turn_step_boundaries(start, end) if turn_step_boundaries is not None else ():
            if not start < b < end:
                raise ValueError(
                    f"episode_step_boundaries: segmenter boundary {b} lies outside its turn [{start}, {end}); "
                    "boundaries inside a turn must be absolute positions strictly inside it."
                )
            bounds.add(int(b))
    bounds.discard(length)
    return sorted(bounds) + [length]


def episode_token_advantages(
    values: Sequence[float], boundaries: Sequence[int], tool_mask: Sequence[int]
) -> list[float]:
    """Per-token advantages of an episode: every model token of step ``i`` gets ``values[i] - values[i - 1]``
    (``values`` = ``[V(S_0), ..., V(S_{n-1}), R]``), every tool-result token 0."""
    if len(values) != len(boundaries):
        raise ValueError(
            f"episode_token_advantages: {len(values)} values for {len(boundaries) - 1} steps; pass "
            "[V(S_0), ..., V(S_(n-1)), R] (one more value than steps)."
        )
    out = [0.0] * len(tool_mask)
    for i in range(1, len(boundaries)):
        step = float(values[i]) - float(values[i - 1])
        for t in range(boundaries[i - 1], boundaries[i]):
            if int(tool_mask[t]) == 1:
                out[t] = step
    return out


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


class EnvironmentReplayError(RuntimeError):
    """An environment could not be brought back to an episode's state: its reset raised, or replaying the
    episode's tool calls gave other results than the episode recorded.

    Attributes:
        environment: the environment's class name.
        round: the tool round whose replayed result differed (0-based), None when ``reset`` raised.
        where: which episode it was (e.g. its batch row), as the caller described it; empty when not given.
    """

    def __init__(
        self, message: str, *, environment: str | None = None, round: int | None = None, where: str = ""
    ) -> None:
        super().__init__(message)
        self.environment = environment
        self.round = round
        self.where = where


def replay_environment(
    factory: Callable[[], Any],
    reset_kwargs: Mapping[str, Any],
    turns: Sequence[ToolTurn],
    standalone_tools: Sequence[Callable[..., Any]] = (),
    *,
    where: str = "",
    reseed: Callable[[], int] | None = None,
) -> Any:
    """A fresh environment in the state an episode reached after ``turns``: ``factory()``, ``reset(**reset_kwargs)``,
    then every recorded tool round replayed in order (:func:`execute_tool_calls`), each replayed result checked
    against the recorded one. The original episode's instance is never touched, and every call gets its own
    instance, so continuations share no state with each other or with the episode's reward.

    The contract this relies on: ``reset(**row)`` and the tools are deterministic functions of the row and the calls
    so far (no randomness without a seed taken from the row, no outside state). Tools with side effects outside the
    instance (files, services) are run again by every replay: make them idempotent, or keep such effects out of the
    tools.

    An environment whose transitions are random replays the episode's random stream (seeded by ``reset`` from the
    row), so every rebuild would then repeat the episode's luck. Such an environment defines the optional hook
    ``_reseed(seed: int)``: after the replay it is called with a fresh ``reseed()``, so each continuation draws its
    own randomness from its state on (``mcadvantage.envs``' adapters define it).

    Args:
        where: which episode this is, for the error message (e.g. ``"batch row 3"``); the dataset row's
            columns are named in the message as well.
        reseed: the source of a fresh seed per rebuild, called once after the replay when the environment has
            ``_reseed`` (None: no reseeding, the rebuilt environment goes on with the episode's random stream).

    Raises:
        EnvironmentReplayError: naming the environment class, the episode (``where`` and its row's columns), what
            failed (``reset`` raised, or the round, the call and both results when a replayed result differs) and
            the fix.
    """
    environment = factory()
    kind = type(environment).__name__
    # Name the episode: a replay fails for one dataset row, and the user needs that row to reproduce it.
    columns = {k: v for k, v in reset_kwargs.items() if k != "prompt"}
    episode = f" ({where}, dataset row {_short(columns)})" if where else f" (dataset row {_short(columns)})"
    try:
        environment.reset(**reset_kwargs)
    except Exception as err:
        raise EnvironmentReplayError(
            f"environment {kind}{episode}: reset(**row) raised {type(err).__name__}: {err} while rebuilding the "
            "episode's state for Monte Carlo continuations (a fresh instance from the factory, reset with the "
            "episode's row). reset must succeed again for every row it succeeded for in training: make it "
            "retry or fail over, or use advantage_estimator='grpo' / 'rloo' / 'gae' (no replay).",
            environment=kind,
            where=where,
        ) from err
    tools = environment_tools(environment, standalone_tools)
    for round_index, turn in enumerate(turns):
        replayed = execute_tool_calls(turn.calls, tools)
        if list(replayed) != [tuple(r) for r in turn.results]:
            raise EnvironmentReplayError(
                f"environment {kind}{episode}: replaying tool round {round_index} ({[c.get('function') for c in turn.calls]}) "
                f"after reset(**row) gave {replayed}, but the episode recorded {list(turn.results)}, so a Monte Carlo "
                "continuation would not see the episode's state. Make reset and the tools deterministic given the "
                "row and the calls so far (seed any randomness from a row column, keep no outside state), or use "
                "advantage_estimator='grpo' / 'rloo' / 'gae'.",
                environment=kind,
                round=round_index,
                where=where,
            )
    hook = getattr(environment, "_reseed", None)
    if reseed is not None and callable(hook):
        hook(int(reseed()))  # fresh randomness from here on (the replay reproduced the episode's)
    return environment


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)  # repr: one line, quotes visible
    return text if len(text) <= limit else text[: limit - 4] + "...}"


# ---------------------------------------------------------------------------------------------------------------
# Resuming an episode
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EpisodeContinuation:
    """One continuation of an episode from a state.

    Attributes:
        completion_ids: the episode's completion from its start: the prefix's tokens then the continuation's (the
            model's and the tool results').
        tool_mask: its tool mask (0 on tool-result tokens).
        messages: the messages the continuation produced: the current turn (the prefix's partial turn included, as
            one parsed assistant message) and every later one, tool messages included.
        environment: the continuation's own environment, in its final state (for ``get_reward`` and
            ``environments=``).
        tool_rounds: tool-calling rounds the continuation ran.
    """

    completion_ids: list[int]
    tool_mask: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    environment: Any = None
    tool_rounds: int = 0


@dataclass(frozen=True)
class ToolLoop:
    """How an episode goes on, as GRPO's tool loop runs it: what continuing episodes needs besides their states.

    Attributes:
        generate: the engine, batched: ``generate(contexts, budgets)`` returns each context's new tokens.
        parse: the response parser: ``parse(turn_ids, context_before_turn)`` (TRL's ``parse_response``).
        tool_suffix_ids: the tool results' tokens: ``tool_suffix_ids(tool_messages)``.
        max_completion_length: the episode's token budget (prefix included).
        max_tool_calling_iterations: TRL's limit on tool rounds per episode (None: unlimited).
        standalone_tools: the trainer's ``tools=``.
    """

    generate: Callable[[list[list[int]], list[int]], list[list[int]]]
    parse: Callable[[list[int], list[int]], dict[str, Any]]
    tool_suffix_ids: Callable[[list[dict[str, Any]]], list[int]]
    max_completion_length: int
    max_tool_calling_iterations: int | None = None
    standalone_tools: Sequence[Callable[..., Any]] = ()


def continue_episodes(
    prompt_ids: Sequence[Sequence[int]],
    prefixes: Sequence[Sequence[int]],
    prefix_tool_masks: Sequence[Sequence[int]],
    environments: Sequence[Any],
    *,
    loop: ToolLoop,
) -> list[EpisodeContinuation]:
    """Resume episodes from their states until each ends.

    Each turn, the active continuations go to the engine together: ``generate(contexts, budgets)`` gets the full
    token contexts (prompt + completion so far) and each one's remaining completion budget and returns the new
    tokens (ending with EOS, or cut at the budget). The current turn's tokens (from its start, the prefix's partial
    turn included) are parsed with ``parse(turn_ids, context_before_turn)`` (TRL's ``parse_response``); its tool
    calls run on the continuation's environment (:func:`execute_tool_calls`), and ``tool_suffix_ids(tool_messages)``
    (the chat template's tokens for the results and the next assistant header, as TRL renders them) is appended with
    tool mask 0. A continuation ends with a turn without tool calls, when the tool results would not fit in
    ``max_completion_length`` (TRL drops them and ends the episode), or after ``max_tool_calling_iterations`` rounds
    counted over the whole episode (the prefix's rounds included).

    Args:
        prompt_ids: per continuation, the episode's prompt ids.
        prefixes: per continuation, the completion tokens up to its state (a state of
            :func:`episode_step_boundaries`: inside a model turn, or right after a tool result, whose tokens end
            with the next assistant header).
        prefix_tool_masks: their tool masks.
        environments: per continuation, its own environment at the state (:func:`replay_environment`), or None
            for standalone tools only.
        loop: the engine, the parser, the tool results' tokens and the limits (:class:`ToolLoop`).
    """
    generate, parse, tool_suffix_ids = loop.generate, loop.parse, loop.tool_suffix_ids
    max_completion_length, standalone_tools = loop.max_completion_length, loop.standalone_tools
    limit = loop.max_tool_calling_iterations if loop.max_tool_calling_iterations is not None else float("inf")
    states = []
    # Where a prefix's open turn starts and how many rounds it holds, once per distinct prefix mask (the K
    # continuations of a state share it).
    seen: dict[tuple[int, ...], tuple[int, int]] = {}
    for prompt, prefix, mask, env in zip(prompt_ids, prefixes, prefix_tool_masks, environments, strict=True):
        if len(prefix) != len(mask):
            raise ValueError(
                f"continue_episodes: a prefix of {len(prefix)} tokens has {len(mask)} tool-mask entries; pass the "
                "tool mask of the prefix itself (one entry per token)."
            )
        key = tuple(mask)
        if key not in seen:
            spans = model_spans(key)
            seen[key] = (
                spans[-1][0] if spans and spans[-1][1] == len(key) else len(key),
                len(tool_spans(key)),
            )
        turn_start, rounds = seen[key]
        states.append(
            dict(
                prompt=list(prompt),
                out=EpisodeContinuation(list(prefix), [int(m) for m in mask], environment=env),
                turn_start=turn_start,
                rounds=rounds,
                tools=environment_tools(env, standalone_tools),
            )
        )
    active = list(range(len(states)))
    while active:
        contexts = [states[i]["prompt"] + states[i]["out"].completion_ids for i in active]
        budgets = [max_completion_length - len(states[i]["out"].completion_ids) for i in active]
        new_tokens = generate(contexts, budgets) if any(b > 0 for b in budgets) else [[] for _ in active]
        still = []
        for i, tokens, budget in zip(active, new_tokens, budgets, strict=True):
            state, out = states[i], states[i]["out"]
            tokens = list(tokens)[: max(budget, 0)]
            out.completion_ids += tokens
            out.tool_mask += [1] * len(tokens)
            turn = out.completion_ids[state["turn_start"] :]
            message = parse(turn, state["prompt"] + out.completion_ids[: state["turn_start"]]) if turn else {}
            if message:
                out.messages.append(message)
            calls = message.get("tool_calls") if message else None
            if not calls or state["rounds"] >= limit:
                continue
            results = execute_tool_calls(calls, state["tools"])
            tool_messages = [{"role": "tool", "name": name, "content": content} for name, content in results]
            suffix = list(tool_suffix_ids(tool_messages))
            if len(out.completion_ids) + len(suffix) > max_completion_length:
                continue  # TRL drops results that do not fit and ends the episode (the tools did run)
            out.messages += tool_messages
            out.completion_ids += suffix
            out.tool_mask += [0] * len(suffix)
            out.tool_rounds += 1
            state["rounds"] += 1
            state["turn_start"] = len(out.completion_ids)
            still.append(i)
        active = still
    return [state["out"] for state in states]
