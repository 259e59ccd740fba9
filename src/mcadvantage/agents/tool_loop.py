"""Continuing agent episodes from a state: the sampling half of Monte Carlo credit for TRL's tool loop
(``tools=`` / ``environment_factory=``): the episodes as the trainer hands them over, and GRPO's tool loop resumed
from a prefix.

The Monte Carlo estimator asks every sampler the same thing: ``n`` continuations of a state (a
:class:`~mcadvantage.samplers.base.RolloutRequest` whose ``origin`` names the trajectory and its prefix length). For
an agent episode, :class:`~mcadvantage.agents.episode_sampler.EpisodeSampler` answers it as GRPO's tool loop would have gone on from there: each
continuation gets its own environment, rebuilt at the state by the one rule of :mod:`mcadvantage.agents.rebuild`
(a fork the environment offers, else reset and replay, checked), then :func:`continue_episodes` runs the engine and
the tools turn by turn until the episode ends or its budget runs out. The continuation carries what grading needs:
its tokens with a tool mask (0 on tool results, which the engine did not sample), the conversation from the
episode's start (``completion``, as reward functions take it) and its environment (``environments=``, for
``get_reward``). So every Monte Carlo setting (free samples, variance allocation, the fixed rollout budget, the step
budget, the truncated-reward rule) and the dedup of identical states apply to agents exactly as to single-turn
responses.

- :func:`continue_episodes`: from its prefix, each continuation generates the rest of the current turn, parses it,
  executes its tool calls on its own environment (TRL's semantics: an unknown or raising tool yields
  ``{"error": ...}``), appends the results' tokens and goes on until a turn without a tool call,
  ``max_tool_calling_iterations`` (counted over the whole episode) or its token limit (a round whose results would
  pass it is dropped and ends the episode, as in TRL: its calls ran). Active continuations go through the engine
  together, one call per turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcadvantage.agents.rebuild import environment_tools, execute_tool_calls
from mcadvantage.agents.turns import model_spans, tool_spans
from mcadvantage.samplers.base import RolloutRequest, Sampler

__all__ = [
    "AgentEpisodes",
    "Episode",
    "EpisodeContinuation",
    "ToolLoop",
    "continue_episodes",
    "messages_before_round",
    "sampler_generate",
]


# ---------------------------------------------------------------------------------------------------------------
# The episodes of a batch, as the trainer hands them over
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Episode:
    """One episode of TRL's tool loop, as the trainer has it after grading.

    Attributes:
        prompt_ids: the prompt's token ids (as generated from: the environment's observation included).
        completion_ids: the completion (model turns and tool results, no padding).
        tool_mask: TRL's tool mask of the completion (0 on tool-result tokens).
        messages: TRL's parsed completion (``completions[i]``: assistant and tool messages).
        reward: the episode's own combined reward ``R`` (``V(S_n) = R``; never estimated).
        prompt: the prompt as reward functions take it (after ``reset``'s observation was appended).
        row: the dataset row as TRL read it (every column, the original ``prompt`` included): ``reset(**row)``
            rebuilds the environment (without the ``environment`` column when it routes a dict of factories), and
            its columns other than ``prompt`` go to reward functions, as in TRL.
        environment: the name of its environment in a dict ``environment_factory``; None for one factory.
        state_keys: the environment's ``state_key`` after ``r`` tool rounds, by ``r`` (0: right after ``reset``),
            for an environment with a ``state_key`` property: the trainer reads it during GRPO's tool loop, after
            ``reset`` and after every tool round of the episode; every rebuild is checked against them after each
            replayed round.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    tool_mask: list[int]
    messages: list[dict[str, Any]]
    reward: float
    prompt: Any = None
    row: dict[str, Any] = field(default_factory=dict)
    environment: str | None = None
    state_keys: dict[int, Any] = field(default_factory=dict)


@dataclass
class AgentEpisodes:
    """What continuing a batch's episodes needs, besides the engine: the trainer builds it from GRPO's tool loop
    (``tools=`` / ``environment_factory=``) and hands it to the estimator (``EstimatorContext.episodes``).

    Attributes:
        episodes: one :class:`Episode` per local batch row, in batch order.
        factories: the environment factories by name, as TRL keeps them (one factory: ``{None: factory}``); None for
            ``tools=`` alone.
        parse: ``(turn_ids, context_ids, environment) -> message``: a generated turn parsed as GRPO parses it, with
            the tools of the episode's environment (its name in a dict ``environment_factory``, else None).
        tool_suffix_ids: the chat template's tokens for one round of tool results (as GRPO appends them).
        max_tool_calling_iterations: TRL's limit on tool rounds per episode (None: unlimited).
        standalone_tools: the trainer's ``tools=``.
    """

    episodes: list[Episode]
    factories: Mapping[str | None, Callable[[], Any]] | None
    parse: Callable[[list[int], list[int], str | None], dict[str, Any]]
    tool_suffix_ids: Callable[[list[dict[str, Any]]], list[int]]
    max_tool_calling_iterations: int | None = None
    standalone_tools: Sequence[Callable[..., Any]] = ()


def messages_before_round(messages: Sequence[Mapping[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """The episode's messages up to the end of its ``rounds``-th tool round (the assistant turns that called the tools
    and their tool messages): what a continuation from a state after those rounds inherits. ``rounds=0``: none."""
    if rounds <= 0:
        return []
    seen, i = 0, 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.get("role") == "assistant" and message.get("tool_calls"):
            j = i
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
            if j > i:
                seen += 1
                i = j
                if seen == rounds:
                    return [dict(m) for m in messages[:i]]
    raise ValueError(
        f"messages_before_round: the episode's messages hold {seen} tool rounds, not {rounds}; its tool_mask and "
        "messages must describe the same episode (TRL's completion_ids / tool_mask and completions of one row)."
    )


# ---------------------------------------------------------------------------------------------------------------
# Resuming episodes: GRPO's tool loop from a prefix
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
        tool_rounds: tool-calling rounds the continuation ran (their results in its tokens).
        tool_calls: tool calls it executed (those of a dropped round included).
        dropped_results: 1 when its last round's results were dropped for the budget (the calls ran), else 0.
    """

    completion_ids: list[int]
    tool_mask: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    environment: Any = None
    tool_rounds: int = 0
    tool_calls: int = 0
    dropped_results: int = 0


@dataclass(frozen=True)
class ToolLoop:
    """How an episode goes on, as GRPO's tool loop runs it: what continuing episodes needs besides their states.

    Attributes:
        generate: the engine, batched: ``generate(contexts, budgets)`` returns each context's new tokens.
        parse: the response parser: ``parse(turn_ids, context_before_turn)`` (TRL's ``parse_response``).
        tool_suffix_ids: the tool results' tokens: ``tool_suffix_ids(tool_messages)``.
        max_completion_length: the episode's token budget (prefix included), unless ``continue_episodes`` is given a
            limit per continuation.
        max_tool_calling_iterations: TRL's limit on tool rounds per episode (None: unlimited).
        standalone_tools: the trainer's ``tools=``.
    """

    generate: Callable[[list[list[int]], list[int]], list[list[int]]]
    parse: Callable[[list[int], list[int]], dict[str, Any]]
    tool_suffix_ids: Callable[[list[dict[str, Any]]], list[int]]
    max_completion_length: int
    max_tool_calling_iterations: int | None = None
    standalone_tools: Sequence[Callable[..., Any]] = ()


@dataclass
class _Resuming:
    """A continuation under way: its context, output, open turn, rounds so far, tools and token limit."""

    prompt: list[int]
    out: EpisodeContinuation
    turn_start: int
    rounds: int
    tools: dict[str, Callable[..., Any]]
    limit: int


def _open_turn(mask: tuple[int, ...]) -> tuple[int, int]:
    """Where a prefix's open turn starts (its length when it ends with a tool result) and its tool rounds."""
    spans = model_spans(mask)
    start = spans[-1][0] if spans and spans[-1][1] == len(mask) else len(mask)
    return start, len(tool_spans(mask))


def _start(prompt_ids, prefixes, prefix_tool_masks, environments, limits, loop) -> list[_Resuming]:
    seen: dict[
        tuple[int, ...], tuple[int, int]
    ] = {}  # the K continuations of a state share their prefix mask
    states = []
    for prompt, prefix, mask, env, limit in zip(
        prompt_ids, prefixes, prefix_tool_masks, environments, limits, strict=True
    ):
        if len(prefix) != len(mask):
            raise ValueError(
                f"continue_episodes: a prefix of {len(prefix)} tokens has {len(mask)} tool-mask entries; pass the "
                "tool mask of the prefix itself (one entry per token)."
            )
        key = tuple(int(m) for m in mask)
        if key not in seen:
            seen[key] = _open_turn(key)
        turn_start, rounds = seen[key]
        out = EpisodeContinuation(list(prefix), list(key), environment=env)
        states.append(
            _Resuming(
                list(prompt), out, turn_start, rounds, environment_tools(env, loop.standalone_tools), limit
            )
        )
    return states


def _advance_turn(state: _Resuming, tokens: Sequence[int], budget: int, loop: ToolLoop) -> bool:
    """Append one turn's tokens, parse it and run its tool calls; whether the continuation goes on."""
    out = state.out
    tokens = list(tokens)[: max(budget, 0)]
    out.completion_ids += tokens
    out.tool_mask += [1] * len(tokens)
    turn = out.completion_ids[state.turn_start :]
    message = loop.parse(turn, state.prompt + out.completion_ids[: state.turn_start]) if turn else {}
    if message:
        out.messages.append(message)
    calls = message.get("tool_calls") if message else None
    limit = loop.max_tool_calling_iterations
    if not calls or (limit is not None and state.rounds >= limit):
        return False
    results = execute_tool_calls(calls, state.tools)
    out.tool_calls += len(calls)
    tool_messages = [{"role": "tool", "name": name, "content": content} for name, content in results]
    suffix = list(loop.tool_suffix_ids(tool_messages))
    if len(out.completion_ids) + len(suffix) > state.limit:
        out.dropped_results = 1  # TRL drops results that do not fit and ends the episode (the tools ran)
        return False
    out.messages += tool_messages
    out.completion_ids += suffix
    out.tool_mask += [0] * len(suffix)
    out.tool_rounds += 1
    state.rounds += 1
    state.turn_start = len(out.completion_ids)
    return True


def continue_episodes(
    prompt_ids: Sequence[Sequence[int]],
    prefixes: Sequence[Sequence[int]],
    prefix_tool_masks: Sequence[Sequence[int]],
    environments: Sequence[Any],
    *,
    loop: ToolLoop,
    limits: Sequence[int] | None = None,
) -> list[EpisodeContinuation]:
    """Resume episodes from their states until each ends.

    Each turn, the active continuations go to the engine together: ``generate(contexts, budgets)`` gets the full
    token contexts (prompt + completion so far) and each one's remaining budget and returns the new tokens (ending
    with EOS, or cut at the budget). The current turn's tokens (from its start, the prefix's partial turn included)
    are parsed with ``parse(turn_ids, context_before_turn)`` (TRL's ``parse_response``); its tool calls run on the
    continuation's environment, and ``tool_suffix_ids(tool_messages)`` (the chat template's tokens for the results
    and the next assistant header, as TRL renders them) is appended with tool mask 0. A continuation ends with a turn
    without tool calls, when the tool results would not fit in its limit (TRL drops them and ends the episode), or
    after ``max_tool_calling_iterations`` rounds counted over the whole episode (the prefix's rounds included).

    Args:
        prompt_ids: per continuation, the episode's prompt ids.
        prefixes: per continuation, the completion tokens up to its state (inside a model turn, or right after a
            tool result, whose tokens end with the next assistant header).
        prefix_tool_masks: their tool masks.
        environments: per continuation, its own environment at the state, or None for standalone tools only.
        loop: the engine, the parser, the tool results' tokens and the limits (:class:`ToolLoop`).
        limits: per continuation, the most completion tokens (prefix included) it may reach; default
            ``loop.max_completion_length`` for all.
    """
    limits = [loop.max_completion_length] * len(prefixes) if limits is None else list(limits)
    states = _start(prompt_ids, prefixes, prefix_tool_masks, environments, limits, loop)
    active = list(range(len(states)))
    while active:
        contexts = [states[i].prompt + states[i].out.completion_ids for i in active]
        budgets = [states[i].limit - len(states[i].out.completion_ids) for i in active]
        new_tokens = loop.generate(contexts, budgets) if any(b > 0 for b in budgets) else [[] for _ in active]
        active = [
            i
            for i, tokens, budget in zip(active, new_tokens, budgets, strict=True)
            if _advance_turn(states[i], tokens, budget, loop)
        ]
    return [state.out for state in states]


def sampler_generate(sampler: Sampler) -> Callable[[list[list[int]], list[int]], list[list[int]]]:
    """The ``generate`` of :func:`continue_episodes` on a :class:`~mcadvantage.samplers.base.Sampler`: one request
    per context (``n=1``, its budget as ``max_tokens``), one ``sample`` call per turn for all of them; a context
    without budget gets no tokens."""

    def generate(contexts: list[list[int]], budgets: list[int]) -> list[list[int]]:
        asked = [i for i, b in enumerate(budgets) if b >= 1]
        requests = [RolloutRequest(prefix_ids=tuple(contexts[i]), n=1, max_tokens=budgets[i]) for i in asked]
        out: list[list[int]] = [[] for _ in contexts]
        for i, conts in zip(asked, sampler.sample(requests) if requests else [], strict=True):
            out[i] = list(conts[0].token_ids)
        return out

    return generate
