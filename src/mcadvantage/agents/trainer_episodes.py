"""The trainer's agent side: what ``VinePPOTrainer`` does with the episodes of GRPO's tool loop (``tools=`` /
``environment_factory=``, a ``rollout_func``'s ``env_mask``), held by the trainer as ``trainer.agents``
(:class:`TrainerEpisodes`).

- During a batch's generation it records every episode's environment ``state_key`` at each of GRPO's generation calls
  (the first turn, then each round of the tool loop), so each turn's state is the one the model saw
  (:mod:`mcadvantage.agents.state_keys`).
- After grading it builds the batch's :class:`~mcadvantage.agents.tool_loop.Episode` list and what continuing them
  needs (:class:`~mcadvantage.agents.tool_loop.AgentEpisodes`, ``EstimatorContext.episodes``), with turns parsed as
  GRPO parses them.
- Under every estimator (properties of the episodes and their environments, not of Monte Carlo): an environment's
  ``state_key`` declared as a method is refused at construction (TRL would offer it to the model as a tool), OpenEnv
  environments get the run's session limit (``env_max_sessions``), and tool rounds whose results were dropped for the
  token budget are counted (``tools/dropped_results``) and warned about.

No TRL internals here: everything of TRL's is read through the public names of the trainer's compatibility module
(:class:`~mcadvantage.trainer.trl_compat.GRPOTrainerHooks`; :class:`TrainerSeam` lists them)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from mcadvantage.agents.env_checks import check_state_key_declared, check_state_key_property, read_state_key
from mcadvantage.agents.rebuild import (
    NOT_RECORDED,
    dropped_tool_calls,
    recorded_tool_turns,
    warn_dropped_tool_results,
)
from mcadvantage.agents.state_keys import (
    KeySource,
    batch_turn_keys,
    episode_round_keys,
    state_key_snapshot,
)
from mcadvantage.agents.tool_loop import AgentEpisodes, Episode

__all__ = [
    "DROPPED_RESULTS_METRIC",
    "TrainerEpisodes",
    "TrainerSeam",
    "check_environment_classes",
    "dropped_result_episodes",
    "log_dropped_tool_results",
]

#: The metric counting a batch's episodes whose last tool round's results were dropped (summed over processes).
DROPPED_RESULTS_METRIC = "tools/dropped_results"


def check_environment_classes(classes: Mapping[str | None, type], max_sessions: int) -> None:
    """Before training, under every estimator: refuse a ``state_key`` method (``@property``, naming the class), and
    give environment classes that share a bounded pool of server sessions (``mcadvantage.envs``' OpenEnv classes:
    ``_limit_sessions``) the run's ``env_max_sessions``.

    Raises:
        TypeError: a ``state_key`` that is a method (:func:`~mcadvantage.agents.env_checks.check_state_key_declared`).
    """
    for name, cls in classes.items():
        check_state_key_declared(cls, name)
        limit = getattr(cls, "_limit_sessions", None)
        if callable(limit):
            limit(max_sessions)


def dropped_result_episodes(completions: Sequence[Any]) -> int:
    """How many of a batch's episodes (TRL's parsed conversations) ended with a tool round whose results were
    dropped for ``max_completion_length`` (the calls ran: the environment and ``get_reward`` include them, the
    messages do not), warned about once per process; 0 for completions that are not conversations."""
    count = sum(
        bool(dropped_tool_calls(messages))
        for messages in completions
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    )
    warn_dropped_tool_results(count)
    return count


def log_dropped_tool_results(trainer: Any, batch: Any) -> None:
    """For a batch of agent episodes (``batch.tool_mask`` set), under every estimator: log
    :data:`DROPPED_RESULTS_METRIC` (summed over processes; collective) and warn once per process when it is not 0."""
    if batch.tool_mask is None:
        return
    from accelerate.utils import gather_object

    dropped = sum(gather_object([dropped_result_episodes(trainer.batch_conversations)]))
    trainer.log_metric_values(batch.mode, {DROPPED_RESULTS_METRIC: float(dropped)})


# ---------------------------------------------------------------------------------------------------------------
# The trainer's agent side
# ---------------------------------------------------------------------------------------------------------------


class TrainerSeam(Protocol):
    """What :class:`TrainerEpisodes` reads from the trainer: public names of
    :class:`~mcadvantage.trainer.trl_compat.GRPOTrainerHooks` for GRPO's data, and the trainer's estimator."""

    advantage_estimator: Any
    rollout_func: Any
    #: whether the estimator's credit reads the environment's ``state_key`` (``state_source == "state_key"``)
    reads_state_keys: bool

    @property
    def environment_classes(self) -> dict[str | None, type]: ...
    @property
    def environment_factory_map(self) -> Mapping[str | None, Callable[[], Any]] | None: ...
    @property
    def episode_environments(self) -> list[Any]: ...
    @property
    def environment_route_column(self) -> str | None: ...
    @property
    def standalone_tools(self) -> list[Any]: ...
    @property
    def batch_conversations(self) -> list[Any]: ...
    @property
    def tool_calling_limit(self) -> int | None: ...
    @property
    def text_tokenizer(self) -> Any: ...
    def episode_tools(self, environment: str | None = None) -> list[Any] | None: ...
    def tool_result_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]: ...


class EpisodeBatch(Protocol):
    """The fields of an :class:`~mcadvantage.estimators.batch.AdvantageBatch` its episodes are built from."""

    prompt_ids: Sequence[Sequence[int]]
    completion_ids: Sequence[Sequence[int]]
    prompts: Sequence[Any]
    rows: Sequence[Mapping[str, Any]]
    tool_mask: Any

    @property
    def rewards(self) -> Any: ...


class TrainerEpisodes:
    """The agent episodes of the trainer's batches (``trainer.agents``): their state keys recorded during generation
    (for credit by state, and to check every rebuild of an episode's environment), the batch's
    :class:`~mcadvantage.agents.tool_loop.Episode` list, and what continuing them needs.

    The trainer's generation calls :meth:`start_generation` before a batch is generated, :meth:`record_turn_states`
    at each of GRPO's generation calls, and :meth:`end_generation` once the batch is graded.

    Args:
        trainer: the trainer, read through :class:`TrainerSeam`'s names only.
    """

    def __init__(self, trainer: TrainerSeam) -> None:
        self._trainer = trainer
        #: While a batch is generated with state keys recorded: per generation call of GRPO (its first turn, then
        #: each call of its tool loop), every local episode's ``state_key`` at that moment. None: not recording.
        self._state_log: list[list[Any]] | None = None
        #: The latest batch's recorded keys once its generation ended (for :meth:`episodes`). None: not recorded.
        self._batch_state_log: list[list[Any]] | None = None
        self._tool_schemas: dict[Any, Any] = {}

    # -- state keys -----------------------------------------------------------------------------------------

    def records_state_keys(self) -> bool:
        """Whether batches record their episodes' state keys for credit: for an estimator that reads them from the
        environment (:class:`~mcadvantage.estimators.base.ReadsStateKeys`, a runtime protocol of the one attribute
        ``state_source``, with ``state_source="state_key"``)."""
        return bool(self._trainer.reads_state_keys)

    def records_episode_keys(self) -> bool:
        """Whether batches record their episodes' state keys: with an environment class that has a ``state_key``,
        under every estimator (an estimator that continues episodes checks its rebuilds against them; every one
        reads them, so a key that raises is reported, not switched off). Reading a property has no side effects, so
        the episodes are the same either way."""
        return any(hasattr(cls, "state_key") for cls in self._trainer.environment_classes.values())

    def check_state_keys_available(self) -> None:
        """Refuse, before training (and before any batch is generated), environments without the ``state_key``
        property the estimator reads (:func:`~mcadvantage.agents.env_checks.check_state_key_property`, naming the
        fix)."""
        if self.records_state_keys():
            for name, cls in self._trainer.environment_classes.items():
                check_state_key_property(cls, name)

    def start_generation(self) -> None:
        """A batch's generation starts: record its keys when anything reads them."""
        recording = self.records_state_keys() or self.records_episode_keys()
        self._state_log = [] if recording else None
        self._batch_state_log = None

    def record_turn_states(self) -> None:
        """At one of GRPO's generation calls: every local episode's ``state_key`` as the model's turn starts.

        GRPO generates once for every episode's first turn (after reset) and once per round of its tool loop (after
        the round's tool results); an episode that leaves the loop never comes back, so episode i's turn t was
        generated at call t. Credit by state needs every key (a missing one is an error); the rebuild checks use the
        keys there are."""
        environments = self._trainer.episode_environments
        if self._state_log is None or not environments:
            return
        self._state_log.append(state_key_snapshot(environments, for_credit=self.records_state_keys()))

    def end_generation(self, batch: EpisodeBatch) -> list[list[Any]] | None:
        """The batch is graded: recording stops, its keys are kept for its episodes' rebuild checks, and the keys
        before each model turn (:meth:`batch_turn_keys`) are returned."""
        turn_keys = self.batch_turn_keys(batch)
        self._batch_state_log, self._state_log = self._state_log, None
        return turn_keys

    def batch_turn_keys(self, batch: EpisodeBatch) -> list[list[Any]] | None:
        """The local episodes' state keys before each model turn (``AdvantageBatch.turn_keys``) when this batch
        recorded them or its ``rollout_func`` returned them; None for single-turn batches and when nothing asks
        for keys (:meth:`records_state_keys`).

        - ``environment_factory=``: the keys recorded during GRPO's tool loop (:meth:`record_turn_states`).
        - ``rollout_func=``: its extra field ``turn_keys`` (one list per completion; a missing field raises).
        - ``tools=`` alone (no environment object): the tool results before each turn (the observation).
        """
        if not self.records_state_keys() or batch.tool_mask is None:
            return None
        source: KeySource
        if self._trainer.rollout_func is not None:
            source = "rollout_func"
        elif self._trainer.environment_factory_map is None:  # tools= alone: the key is the observation
            source = "observation"
        else:
            source = "recorded"
        return batch_turn_keys(batch, source, self._state_log)

    # -- the batch's episodes, and what continuing them needs --------------------------------------------------

    def parse_turn(
        self, turn_ids: list[int], context_ids: list[int], environment: str | None = None
    ) -> dict[str, Any]:
        """A generated turn parsed as GRPO parses it: TRL's ``parse_response`` with the tools the episode's prompt
        offers (its environment's, named as in a dict ``environment_factory``; None for one factory or tools
        alone)."""
        from trl.chat_template_utils import parse_response

        from mcadvantage.core.text import plain_fast_backend

        tools = self._trainer.episode_tools(environment)
        # The same parse, cheaper: Monte Carlo continuations parse thousands of turns a step, and per call
        # transformers rebuilds every tool's JSON schema from its signature and docstring (the schema is what it
        # casts arguments with, so it is computed once per tool here) and decodes the context through the
        # tokenizer's per-token type checks (a plain fast tokenizer's Rust decoder gives the same text).
        key = (environment, tuple(t if callable(t) else id(t) for t in tools or ()))
        if key not in self._tool_schemas:
            from transformers.utils import get_json_schema

            self._tool_schemas[key] = (
                [get_json_schema(t) if inspect.isfunction(t) or inspect.ismethod(t) else t for t in tools]
                if tools
                else tools
            )
        tokenizer = self._trainer.text_tokenizer
        backend = plain_fast_backend(tokenizer)
        prefix = (
            context_ids if backend is None else backend.decode(list(context_ids), skip_special_tokens=False)
        )
        return parse_response(tokenizer, turn_ids, prefix=prefix, tools=self._tool_schemas[key])

    def episodes(self, batch: EpisodeBatch) -> list[Episode]:
        """The local batch's episodes as :class:`~mcadvantage.agents.episode_sampler.EpisodeSampler` continues them:
        token ids, tool mask, GRPO's parsed conversation (``completions``), the combined reward, the row (as GRPO
        reset the environment with it), and its environment's ``state_key`` after every tool round where it has one
        (:func:`~mcadvantage.agents.state_keys.episode_round_keys`: recorded during GRPO's tool loop, so a rebuild to
        any state is checked after every replayed round). Only for a batch of GRPO's tool loop (``batch.tool_mask``
        set)."""
        if batch.tool_mask is None:
            raise ValueError(
                "TrainerEpisodes.episodes: the batch has no tool_mask (no tools= / environment_factory= episode)."
            )
        messages = self._trainer.batch_conversations
        masks = batch.tool_mask.cpu()
        rewards = batch.rewards.tolist()
        route = self._trainer.environment_route_column
        return [
            Episode(
                prompt_ids=list(batch.prompt_ids[i]),
                completion_ids=list(ids),
                tool_mask=[int(m) for m in masks[i, : len(ids)]],
                messages=list(messages[i]),
                reward=rewards[i],
                prompt=batch.prompts[i],
                row=dict(batch.rows[i]),
                environment=batch.rows[i].get(route) if route else None,
                state_keys=episode_round_keys(
                    self._batch_state_log or [],
                    i,
                    len(recorded_tool_turns(messages[i])),
                    final=self._final_state_key(i, messages[i]),
                ),
            )
            for i, ids in enumerate(batch.completion_ids)
        ]

    def _final_state_key(self, row: int, messages: list[dict[str, Any]]) -> Any:
        """The ``state_key`` of row ``row``'s pooled environment after its episode (GRPO's instance holds the final
        state); ``NOT_RECORDED`` without a ``state_key``, or when the episode's last round was dropped for the
        budget (its calls ran but no replay runs them)."""
        environments = self._trainer.episode_environments
        if row >= len(environments) or dropped_tool_calls(messages):
            return NOT_RECORDED
        return read_state_key(environments[row], f"local episode {row}")

    def context(self, batch: EpisodeBatch) -> AgentEpisodes | None:
        """What continuing the local batch's episodes through GRPO's tool loop needs (``EstimatorContext.episodes``):
        for a batch of ``tools=`` / ``environment_factory=``; None otherwise (a ``rollout_func``'s episodes, whose
        ``env_mask`` becomes the tool mask, cannot be resumed from a prefix)."""
        factories = self._trainer.environment_factory_map
        standalone = self._trainer.standalone_tools
        if batch.tool_mask is None or (factories is None and not standalone):
            return None
        return AgentEpisodes(
            episodes=self.episodes(batch),
            factories=factories,
            parse=self.parse_turn,
            tool_suffix_ids=self._trainer.tool_result_ids,
            max_tool_calling_iterations=self._trainer.tool_calling_limit,
            standalone_tools=standalone,
        )
