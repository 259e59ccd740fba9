"""The Monte Carlo estimator's sampler for agent episodes: :class:`EpisodeSampler`, the engine with the episodes'
environments behind the :class:`~mcadvantage.samplers.base.Sampler` interface.

The estimator asks it what it asks every sampler: ``n`` continuations of a state (a
:class:`~mcadvantage.samplers.base.RolloutRequest` whose ``origin`` names the trajectory, whose ``episode`` is the
agent :class:`~mcadvantage.agents.tool_loop.Episode`, and the prefix length). Each continuation gets its own
environment at the state by the one rule (:func:`~mcadvantage.agents.rebuild.rebuild_environment`: a fork the
environment offers, else reset and replay, checked), then GRPO's tool loop runs it
(:func:`~mcadvantage.agents.tool_loop.continue_episodes`) until the episode ends or its budget runs out.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mcadvantage.agents.env_checks import check_reseeded, random_streams
from mcadvantage.agents.rebuild import (
    NOT_RECORDED,
    EpisodeRecord,
    dropped_tool_calls,
    rebuild_environment,
    recorded_tool_turns,
    replay_environment,
    warn_dropped_tool_results,
)
from mcadvantage.agents.tool_loop import (
    AgentEpisodes,
    Episode,
    EpisodeContinuation,
    ToolLoop,
    continue_episodes,
    messages_before_round,
    sampler_generate,
)
from mcadvantage.agents.turns import tool_spans
from mcadvantage.samplers.base import Continuation, RolloutRequest, Sampler

__all__ = ["EpisodeSampler", "dropped_rounds", "episode_record"]


# ---------------------------------------------------------------------------------------------------------------
# The sampler: continuations of agent states, as the Monte Carlo estimator asks for every state
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """One continuation to draw: the episode, the length of its completion prefix, and its token budget."""

    episode: Episode
    prefix_len: int
    max_tokens: int


class EpisodeSampler:
    """A :class:`~mcadvantage.samplers.base.Sampler` that continues agent episodes: the engine (any sampler) with
    the episodes' environments and GRPO's tool loop. Built per batch by the estimator around the policy's sampler.

    A request's ``origin`` is ``(trajectory, prefix_len)``, the trajectory's ``episode`` its
    :class:`~mcadvantage.agents.tool_loop.Episode`. Each of the ``n`` continuations gets its own environment at the
    state (:func:`~mcadvantage.agents.rebuild.rebuild_environment`, checked), then
    :func:`~mcadvantage.agents.tool_loop.continue_episodes` runs it with ``prefix_len + max_tokens`` as its token
    limit. A :class:`~mcadvantage.samplers.base.Continuation` carries the tokens after the prefix (tool
    results included), their ``tool_mask``, the conversation from the episode's start as ``completion`` (the
    messages up to the state's last tool round, then the continuation's), its environment as the reward functions'
    ``environments=`` field, and what it cost in tool calls. It is ``truncated`` when it reached its limit or its
    last round's results were dropped for it.

    Args:
        engine: the policy's sampler (one turn per request).
        agent: the batch's :class:`AgentEpisodes` (factories, parser, tool-result tokens, limits, ``tools=``).
    """

    #: The estimator may give it states whose prefix holds tool results: it continues episodes, not just text.
    continues_episodes = True

    def __init__(self, engine: Sampler, agent: AgentEpisodes) -> None:
        self.engine = engine
        self.agent = agent
        self._engine_generate = sampler_generate(engine)
        self._row = {id(episode): i for i, episode in enumerate(agent.episodes)}
        # Continuations of one state often write the same turn in the same context and get the same tool results;
        # parsing a turn and rendering the results cost far more than the rest of a continuation, and both are pure:
        # computed once per batch (a parsed message is copied on reuse: continuations own their messages).
        self._suffixes: dict[str, list[int]] = {}
        self._parsed: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._checked: set[int] = set()  # episodes whose tools= were replayed once (tools= alone)
        self._templates: dict[
            Any, Any
        ] = {}  # per state, a rebuilt environment to fork (environments with _fork)

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """``request.n`` continuations of every request's state; continuations of one environment's episodes go
        through the tool loop together (a turn is parsed with the tools its episode's prompt offered)."""
        jobs = [self._job(request) for request in requests for _ in range(request.n)]
        by_environment: dict[str | None, list[int]] = {}
        for j, job in enumerate(jobs):
            by_environment.setdefault(job.episode.environment, []).append(j)
        drawn: list[Continuation | None] = [None] * len(jobs)
        for name, group in by_environment.items():
            for j, cont in zip(group, self._continue(name, [jobs[j] for j in group]), strict=True):
                drawn[j] = cont
        warn_dropped_tool_results(sum(c.dropped_tool_results for c in drawn if c is not None))
        out, start = [], 0
        for request in requests:
            out.append([c for c in drawn[start : start + request.n] if c is not None])
            start += request.n
        return out

    @staticmethod
    def _job(request: RolloutRequest) -> _Job:
        origin = request.origin
        episode = getattr(origin[0], "episode", None) if origin is not None else None
        if not isinstance(episode, Episode):
            raise ValueError(
                "EpisodeSampler: a RolloutRequest whose origin names no agent episode; it continues the states of "
                "Trajectory(episode=Episode(...)) (VinePPOEstimator sets it for tools= / environment_factory= "
                "batches). Sample other requests with an engine sampler (mcadvantage.samplers)."
            )
        return _Job(episode, int(origin[1]), request.max_tokens)

    def _continue(self, name: str | None, jobs: list[_Job]) -> list[Continuation]:
        """Rebuild each job's environment at its state and run the tool loop for all of them."""
        agent = self.agent
        loop = ToolLoop(
            generate=self._engine_generate,
            parse=self._parser(name),
            tool_suffix_ids=self._suffix,
            max_completion_length=0,  # every continuation has its own limit
            max_tool_calling_iterations=agent.max_tool_calling_iterations,
            standalone_tools=agent.standalone_tools,
        )
        starts = [self._rebuild(job) for job in jobs]
        # The seeded random generators each rebuilt environment holds: drawn from during the continuation without
        # _reseed, they replay the episode's luck (refused after the tool loop, naming _reseed).
        streams = [
            {} if callable(getattr(type(environment), "_reseed", None)) else random_streams(environment)
            for environment, _, _ in starts
        ]
        outs = continue_episodes(
            [job.episode.prompt_ids for job in jobs],
            [job.episode.completion_ids[: job.prefix_len] for job in jobs],
            [job.episode.tool_mask[: job.prefix_len] for job in jobs],
            [environment for environment, _, _ in starts],
            loop=loop,
            limits=[job.prefix_len + job.max_tokens for job in jobs],
        )
        for out, job, before in zip(outs, jobs, streams, strict=True):
            check_reseeded(out.environment, before, where=f"batch row {self._row.get(id(job.episode), '?')}")
        return [
            _as_continuation(out, job, inherited, calls)
            for out, job, (_, inherited, calls) in zip(outs, jobs, starts, strict=True)
        ]

    def _rebuild(self, job: _Job) -> tuple[Any, list[dict[str, Any]], int]:
        """The job's environment at its state, the messages it inherits, and the tool calls its rebuild ran."""
        episode, agent = job.episode, self.agent
        rounds = sum(1 for _, end in tool_spans(episode.tool_mask) if end <= job.prefix_len)
        turns = recorded_tool_turns(episode.messages)
        where = f"batch row {self._row.get(id(episode), '?')}"
        inherited = messages_before_round(episode.messages, rounds)
        if agent.factories is None:  # tools= alone: no state to rebuild, but the tools are checked once
            calls = 0
            if id(episode) not in self._checked:
                self._checked.add(id(episode))
                replay_environment(None, episode.row, turns, agent.standalone_tools, where=where)
                calls = sum(len(turn.calls) for turn in turns)
            return None, inherited, calls
        if episode.environment not in agent.factories:
            raise ValueError(
                f"EpisodeSampler: the episode of {where} names environment {episode.environment!r}, which is not "
                f"among {sorted(map(repr, agent.factories))}."
            )
        routed = None not in agent.factories
        environment, calls = rebuild_environment(
            agent.factories[episode.environment],
            {k: v for k, v in episode.row.items() if not (routed and k == "environment")},
            turns[:rounds],
            agent.standalone_tools,
            where=where,
            record=episode_record(episode),
            templates=self._templates,
            key=(id(episode), rounds),
            reseed=_fresh_seed,
        )
        return environment, inherited, calls

    def _parser(self, name: str | None) -> Callable[[list[int], list[int]], dict[str, Any]]:
        def parse(turn: list[int], context: list[int]) -> dict[str, Any]:
            key = (name, tuple(turn), tuple(context))
            if key not in self._parsed:
                self._parsed[key] = self.agent.parse(list(turn), list(context), name)
            return copy.deepcopy(self._parsed[key])

        return parse

    def _suffix(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        key = repr(tool_messages)
        if key not in self._suffixes:
            self._suffixes[key] = list(self.agent.tool_suffix_ids(tool_messages))
        return list(self._suffixes[key])


def _fresh_seed() -> int:
    """A seed for one continuation's environment randomness (``_reseed``): drawn from Python's global RNG, which the
    trainer seeds (``set_seed(args.seed)``), so runs repeat; drawn only for environments that define ``_reseed``."""
    return random.getrandbits(63)


#: GRPO's prompt for a row without one (an environment that owns the data supplies it through reset).
_EMPTY_PROMPT = [{"role": "user", "content": ""}]


def episode_record(episode: Episode) -> EpisodeRecord:
    """What a rebuild of ``episode``'s environment is checked against: its prompt after ``reset`` (against the
    row's prompt with the rebuilt observation appended) and its recorded ``state_key`` values."""
    return EpisodeRecord(
        prompt=episode.prompt if episode.prompt is not None else NOT_RECORDED,
        row_prompt=episode.row.get("prompt", _EMPTY_PROMPT),
        state_keys=dict(episode.state_keys),
    )


def dropped_rounds(episodes: Sequence[Episode]) -> int:
    """How many of ``episodes`` ended with a tool round whose results GRPO dropped for the budget."""
    return sum(bool(dropped_tool_calls(episode.messages)) for episode in episodes)


def _as_continuation(
    out: EpisodeContinuation, job: _Job, inherited: list[dict[str, Any]], calls: int
) -> Continuation:
    limit = job.prefix_len + job.max_tokens
    return Continuation(
        token_ids=tuple(out.completion_ids[job.prefix_len :]),
        truncated=bool(out.dropped_results) or len(out.completion_ids) >= limit,
        fields={"environments": out.environment},
        completion=[dict(m) for m in inherited] + out.messages,
        tool_mask=tuple(out.tool_mask[job.prefix_len :]),
        tool_calls=calls + out.tool_calls,
        dropped_tool_results=out.dropped_results,
    )
