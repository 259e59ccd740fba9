"""Monte Carlo turn credit for multi-turn episodes: the value of every state of an episode from K continuations
that resume it through the tool loop, each on its own replayed environment, graded by the episode's own reward
sources; per-token advantages with tool results at 0.

The pieces are :mod:`mcadvantage.mc.episodes`' (states, replay, continuations); this module runs them for a batch
of episodes: every state's K continuations go through :func:`~mcadvantage.mc.episodes.continue_episodes` together
(one engine call per turn for the whole batch), and are graded in one call per reward function with
``environments=`` (so an environment's ``get_reward``, which TRL adds to the reward functions, scores each
continuation from its own environment). An unscorable continuation (every reward function returned None) counts
0, as an unscorable rollout does in :mod:`mcadvantage.mc.rollouts`. No state sharing or deduplication across
episodes: agent states differ by their environment, not only by their tokens.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcadvantage.mc.episodes import (
    ToolLoop,
    continue_episodes,
    episode_step_boundaries,
    episode_token_advantages,
    recorded_tool_turns,
    replay_environment,
    tool_spans,
)
from mcadvantage.samplers.base import RolloutRequest, Sampler

__all__ = [
    "AgentEpisodes",
    "Episode",
    "EpisodeCredit",
    "Graders",
    "ToolLoop",
    "estimate_agent_credit",
    "estimate_turn_credit",
    "messages_before_round",
    "sampler_generate",
]


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
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    tool_mask: list[int]
    messages: list[dict[str, Any]]
    reward: float
    prompt: Any = None
    row: dict[str, Any] = field(default_factory=dict)
    environment: str | None = None


@dataclass
class EpisodeCredit:
    """The estimate for one episode: ``boundaries`` (its states), ``values`` ``[V(S_0), ..., V(S_{n-1}), R]``,
    per-token ``advantages`` (tool results 0), and what it cost: ``rollouts``, ``generated_tokens`` (the tokens the
    engine sampled for the continuations: model tokens only) and ``tool_result_tokens`` (the tool results'
    tokens the continuations appended, which the engine prefills but does not sample)."""

    boundaries: list[int]
    values: list[float]
    advantages: list[float]
    rollouts: int = 0
    generated_tokens: int = 0
    tool_result_tokens: int = 0


@dataclass
class AgentEpisodes:
    """What continuing a batch's episodes needs, besides the engine and the graders: the trainer builds it from
    GRPO's tool loop (``tools=`` / ``environment_factory=``) and hands it to the estimator
    (``EstimatorContext.episodes``).

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


def sampler_generate(sampler: Sampler) -> Callable[[list[list[int]], list[int]], list[list[int]]]:
    """The ``generate`` of :func:`~mcadvantage.mc.episodes.continue_episodes` on a
    :class:`~mcadvantage.samplers.base.Sampler`: one request per context (``n=1``, its budget as ``max_tokens``),
    one ``sample`` call per turn for all of them; a context without budget gets no tokens."""

    def generate(contexts: list[list[int]], budgets: list[int]) -> list[list[int]]:
        asked = [i for i, b in enumerate(budgets) if b >= 1]
        requests = [RolloutRequest(prefix_ids=tuple(contexts[i]), n=1, max_tokens=budgets[i]) for i in asked]
        out: list[list[int]] = [[] for _ in contexts]
        for i, conts in zip(asked, sampler.sample(requests) if requests else [], strict=True):
            out[i] = list(conts[0].token_ids)
        return out

    return generate


def _reset_kwargs(episode: Episode, routed: bool) -> dict[str, Any]:
    # TRL resets an environment with the whole row ("prompt" included) except the routing column of a dict factory.
    return {k: v for k, v in episode.row.items() if not (routed and k == "environment")}


#: Row columns TRL does not pass to reward functions (they come as prompts= / completions= / completion_ids=).
_NOT_REWARD_COLUMNS = ("prompt", "completion", "completion_ids")


def _nansum(values: Sequence[Any], weights: Sequence[float]) -> float:
    """Weighted sum skipping None / NaN (TRL's nansum); 0 when every reward function returned None."""
    total, scored = 0.0, False
    for value, weight in zip(values, weights, strict=True):
        if value is not None and not math.isnan(float(value)):
            total += float(value) * weight
            scored = True
    return total if scored else 0.0


@dataclass(frozen=True)
class Graders:
    """What grades a continuation: TRL-style reward functions (an environment's ``get_reward`` wrapper included),
    their weights, and extra keyword arguments for every call (e.g. TRL's ``trainer_state``). Each function gets
    ``prompts``, ``completions`` (the inherited messages then the continuation's), ``completion_ids``,
    ``environments``, the rows' columns and ``reward_kwargs``."""

    reward_funcs: Sequence[Callable[..., Sequence[Any]]]
    reward_weights: Sequence[float]
    reward_kwargs: Mapping[str, Any] | None = None


def _fresh_seed() -> int:
    """A seed for one continuation's environment randomness (:func:`replay_environment`'s ``reseed``): drawn from
    Python's global RNG, which the trainer seeds (``set_seed(args.seed)``), so runs repeat; drawn only for
    environments that define ``_reseed``."""
    return random.getrandbits(63)


def estimate_turn_credit(
    episodes: Sequence[Episode],
    *,
    num_rollouts: int,
    environment_factories: Mapping[str | None, Callable[[], Any]] | None,
    loop: ToolLoop,
    graders: Graders,
    turn_step_boundaries: Callable[[Episode, int, int], Sequence[int]] | None = None,
    rows: Sequence[int] | None = None,
) -> list[EpisodeCredit]:
    """Monte Carlo values and advantages of every state of every episode.

    Args:
        episodes: the batch's episodes.
        num_rollouts: K continuations per state.
        environment_factories: ``{name: factory}`` (one factory: ``{None: factory}``); None for ``tools=`` alone.
        loop: how an episode goes on (:class:`~mcadvantage.mc.episodes.ToolLoop`: the engine, batched, of which
            :func:`sampler_generate` wraps a :class:`~mcadvantage.samplers.base.Sampler`; TRL's response parser; the
            tool results' tokens; the episode's token budget and tool-round limit; the trainer's ``tools=``).
        graders: the reward functions, their weights and extra keyword arguments (:class:`Graders`).
        turn_step_boundaries: ``(episode, start, end) -> boundaries`` of the step segmenter inside a model turn
            (None: one state per turn).
        rows: the episodes' batch rows, to name an episode in errors (None: their positions in ``episodes``).

    Raises:
        :class:`~mcadvantage.mc.episodes.EnvironmentReplayError`: an environment that cannot be brought back to a
            state of its episode (naming its batch row).
    """
    if num_rollouts < 1:
        raise ValueError(f"estimate_turn_credit: num_rollouts={num_rollouts} must be >= 1.")
    standalone_tools = loop.standalone_tools
    reward_funcs, reward_weights, reward_kwargs = (
        graders.reward_funcs,
        graders.reward_weights,
        graders.reward_kwargs,
    )
    routed = environment_factories is not None and None not in environment_factories
    plans = []  # per episode: its boundaries
    jobs = []  # per continuation: (episode index, state index)
    inherits = []  # per continuation: the episode's messages up to its state's last tool round (shared per state)
    prompts, prefixes, masks, envs = [], [], [], []
    for e, episode in enumerate(episodes):
        segment = (lambda s, t, ep=episode: turn_step_boundaries(ep, s, t)) if turn_step_boundaries else None
        bounds = episode_step_boundaries(episode.tool_mask, segment)
        plans.append(bounds)
        turns = recorded_tool_turns(episode.messages)
        factory = None
        if environment_factories is not None:
            if episode.environment not in environment_factories:
                raise ValueError(
                    f"estimate_turn_credit: episode {e} names environment {episode.environment!r}, which is not among "
                    f"{sorted(map(repr, environment_factories))}."
                )
            factory = environment_factories[episode.environment]
        # Where the tool results end, once per episode: a state's rounds are those ending before it
        # (tool_turns_before), and its K continuations share them and the messages they inherit.
        result_ends = [end for _, end in tool_spans(episode.tool_mask)]
        for i, b in enumerate(bounds[:-1]):
            rounds = sum(1 for end in result_ends if end <= b)
            inherited = messages_before_round(episode.messages, rounds)
            for _ in range(num_rollouts):
                env = (
                    replay_environment(
                        factory,
                        _reset_kwargs(episode, routed),
                        turns[:rounds],
                        standalone_tools,
                        where=f"batch row {e if rows is None else rows[e]}",
                        reseed=_fresh_seed,
                    )
                    if factory is not None
                    else None
                )
                jobs.append((e, i))
                inherits.append(inherited)
                prompts.append(episode.prompt_ids)
                prefixes.append(episode.completion_ids[:b])
                masks.append(episode.tool_mask[:b])
                envs.append(env)
    outs = continue_episodes(prompts, prefixes, masks, envs, loop=loop)
    # Grade every continuation in one call per reward function.
    completions, columns = [], {}
    keys = list(dict.fromkeys(k for ep in episodes for k in ep.row if k not in _NOT_REWARD_COLUMNS))
    for inherited, out in zip(inherits, outs, strict=True):
        completions.append([dict(m) for m in inherited] + out.messages)
    columns = {k: [episodes[e].row.get(k) for e, _ in jobs] for k in keys}
    per_func = []
    for func in reward_funcs:
        scores = func(
            prompts=[episodes[e].prompt for e, _ in jobs],
            completions=completions,
            completion_ids=[out.completion_ids for out in outs],
            environments=[out.environment for out in outs],
            **columns,
            **dict(reward_kwargs or {}),
        )
        if len(scores) != len(jobs):
            raise RuntimeError(
                f"reward function {getattr(func, '__name__', func)!r} returned {len(scores)} rewards for {len(jobs)} "
                "continuations; it must return one per completion."
            )
        per_func.append(list(scores))
    sums: list[list[float]] = [[0.0] * (len(b) - 1) for b in plans]
    credits = [EpisodeCredit(boundaries=list(b), values=[], advantages=[]) for b in plans]
    for j, ((e, i), out) in enumerate(zip(jobs, outs, strict=True)):
        sums[e][i] += _nansum([pf[j] for pf in per_func], reward_weights)
        credits[e].rollouts += 1
        sampled = sum(out.tool_mask[plans[e][i] :])  # the tool mask is 1 on the model's tokens
        credits[e].generated_tokens += sampled
        credits[e].tool_result_tokens += len(out.completion_ids) - plans[e][i] - sampled
    for e, episode in enumerate(episodes):
        credits[e].values = [s / num_rollouts for s in sums[e]] + [float(episode.reward)]
        credits[e].advantages = episode_token_advantages(credits[e].values, plans[e], episode.tool_mask)
    return credits


def estimate_agent_credit(
    agent: AgentEpisodes,
    rows: Sequence[int],
    *,
    num_rollouts: int,
    generate: Callable[[list[list[int]], list[int]], list[list[int]]],
    max_completion_length: int,
    graders: Graders,
    turn_step_boundaries: Callable[[Episode, int, int], Sequence[int]] | None = None,
) -> dict[int, EpisodeCredit]:
    """:func:`estimate_turn_credit` of the episodes ``agent.episodes[i]`` for ``i`` in ``rows``, by row.

    Episodes are estimated in one call per environment name: a dict ``environment_factory`` offers each environment
    its own tools, and a turn's tool-call arguments are typed with the schema of the tools its prompt offered, so
    the parser is bound to one environment per call."""
    # Continuations of one state often write the same turn in the same context and get the same tool results, and
    # rendering the chat template or parsing a turn costs far more than the rest of a continuation: both are pure
    # functions of their arguments, so they are computed once per batch (a parsed message is copied on reuse, as
    # continuations own their messages).
    suffixes: dict[str, list[int]] = {}
    parsed: dict[tuple[Any, ...], dict[str, Any]] = {}

    def tool_suffix_ids(tool_messages: list[dict[str, Any]]) -> list[int]:
        key = repr(tool_messages)
        if key not in suffixes:
            suffixes[key] = list(agent.tool_suffix_ids(tool_messages))
        return list(suffixes[key])

    def parse_for(name: str | None) -> Callable[[list[int], list[int]], dict[str, Any]]:
        def parse(turn: list[int], context: list[int]) -> dict[str, Any]:
            key = (name, tuple(turn), tuple(context))
            if key not in parsed:
                parsed[key] = agent.parse(list(turn), list(context), name)
            return copy.deepcopy(parsed[key])

        return parse

    by_environment: dict[str | None, list[int]] = {}
    for i in rows:
        by_environment.setdefault(agent.episodes[i].environment, []).append(i)
    out: dict[int, EpisodeCredit] = {}
    for name, group in by_environment.items():
        credits = estimate_turn_credit(
            [agent.episodes[i] for i in group],
            num_rollouts=num_rollouts,
            environment_factories=agent.factories,
            loop=ToolLoop(
                generate=generate,
                parse=parse_for(name),
                tool_suffix_ids=tool_suffix_ids,
                max_completion_length=max_completion_length,
                max_tool_calling_iterations=agent.max_tool_calling_iterations,
                standalone_tools=agent.standalone_tools,
            ),
            graders=graders,
            turn_step_boundaries=turn_step_boundaries,
            rows=group,
        )
        out.update(zip(group, credits, strict=True))
    return out
