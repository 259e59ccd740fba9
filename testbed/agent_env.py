"""A synthetic multi-turn agent environment with exactly known state values: the testbed of turn credit.

An episode is ``horizon`` turns. Each turn the agent calls the environment's one tool, ``act(choice)``, with a
choice in ``0 .. choices - 1``; after the last turn it answers without a tool call and the episode ends. The reward is
sparse and final: 1 when every turn was played and the state is *good* at the end, else 0. One turn is *decisive*
(choosing the row's ``key`` there is right); every other turn changes nothing, except, in the ``recovery``
structure, one later *repair* turn:

- ``delayed``: the state starts *bad*; at ``decisive_turn`` it becomes *good* if the choice is the key, *bad*
  otherwise. Every other turn changes nothing, so with an early decisive turn the outcome is sealed long before the
  end and the credit of the later turns is exactly 0.
- ``recovery``: the state starts *good*; at ``decisive_turn`` a choice other than the key breaks it (*bad*); at
  ``repair_turn`` (later), choosing the key mends a broken state. The mistake costs only what the repair fails to
  win back, so the mistake turn's exact advantage is smaller than in ``delayed``, and the repair turn matters only
  after a mistake.
- ``chain``: several decisive turns. The state starts *good*; from ``decisive_turn`` to the last turn, every turn is
  decisive: a choice other than the key there breaks the state for good (nothing mends it). With a policy that picks
  the key with probability ``p`` it succeeds with ``p ** (horizon - decisive_turn)``, and turns before
  ``decisive_turn`` change nothing.

The state is shown to the agent: :meth:`AgentEnv.reset` returns ``key=K choices=A turns=H state=S`` (TRL appends it
to the prompt's last message) and every ``act`` returns ``turn t/H state=S``, so a policy may depend on the turn and
the state (:func:`read_progress` reads them back from an episode's text).

Everything is deterministic given the row: the task parameters are dataset columns (:func:`make_agent_dataset`),
``reset(**row)`` reads them, and the environment draws no random numbers, so resetting with the same row and
replaying a prefix's tool calls reproduces that prefix's tool results and state exactly (or ``copy.deepcopy`` forks
an instance: its state is plain attributes). The tools have no side effects outside the instance.

Exact values: for any policy given as action probabilities per (turn, state) (:class:`TurnPolicy`, e.g.
:class:`KeyPolicy`), :func:`exact_values` gives the success probability from every state by backward induction,
:func:`path_values` the values along an episode's turn boundaries and :func:`exact_advantages` its exact per-turn
advantages. :func:`simulate_episode` plays the environment itself with such a policy (pure Python, no model), for
Monte Carlo checks and the studies.

How TRL uses it (``GRPOTrainer(environment_factory=AgentEnv, ...)``, TRL 1.16): one instance per rollout, pooled and
reset with the dataset row (every column, ``prompt`` included: unknown columns are ignored); its public methods other
than ``reset`` and ``get_reward`` become tools (here only ``act``), so every helper of this module is a module-level
function, not a method; ``get_reward()`` is called once per finished rollout and gives the reward (no reward function
is needed).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "BAD",
    "GOOD",
    "PROMPT_TEXT",
    "STRUCTURES",
    "AgentEnv",
    "AgentTask",
    "CreditReport",
    "Episode",
    "KeyPolicy",
    "Progress",
    "TurnPolicy",
    "agent_rows",
    "credit_report",
    "exact_advantages",
    "exact_q_values",
    "exact_values",
    "make_agent_dataset",
    "path_values",
    "read_progress",
    "replay_states",
    "simulate_episode",
    "success_probability",
    "turn_spans",
    "view_of",
]

STRUCTURES = ("delayed", "recovery", "chain")
BAD, GOOD = 0, 1
STATE_NAMES = {BAD: "bad", GOOD: "good"}
_STATE_OF_NAME = {name: state for state, name in STATE_NAMES.items()}

#: The user message of every prompt (short: the toy tokenizer spends one token per character). The task itself
#: (key, number of choices, turns, state) arrives through ``reset``'s observation, which TRL appends to it.
PROMPT_TEXT = "Call act once per turn; after the last turn reply done."

# The texts the environment writes, and the patterns that read them back (one place, so they cannot drift apart).
_OBSERVATION = "\nkey={key} choices={choices} turns={horizon} state={state}"
_TURN_RESULT = "turn {turn}/{horizon} state={state}"
_OBSERVATION_RE = re.compile(r"key=(\d+) choices=(\d+) turns=(\d+) state=(good|bad)")
_TURN_RESULT_RE = re.compile(r"turn (\d+)/(\d+) state=(good|bad)")


@dataclass(frozen=True)
class AgentTask:
    """One episode's parameters: what a dataset row carries and ``reset(**row)`` reads.

    Args:
        structure: ``"delayed"``, ``"recovery"`` or ``"chain"`` (see the module docstring).
        horizon: turns per episode, ``H >= 1`` (``>= 2`` for ``recovery``, which needs a later repair turn).
        key: the right choice at the decisive (and repair) turn, in ``0 .. choices - 1``.
        choices: how many choices ``act`` accepts, ``>= 2``.
        decisive_turn: the 0-based turn whose choice decides (delayed) or can break (recovery) the outcome; in
            ``chain`` the first of the decisive turns (every turn from it on is decisive).
        repair_turn: ``recovery`` only: the 0-based later turn where the key mends a broken state; None means the
            last turn. Must be None for ``delayed``.
    """

    structure: str
    horizon: int
    key: int
    choices: int = 4
    decisive_turn: int = 0
    repair_turn: int | None = None

    def __post_init__(self) -> None:
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure={self.structure!r} is not one of {STRUCTURES}; pick one of them.")
        for name in ("horizon", "key", "choices", "decisive_turn"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name}={value!r} must be an int.")
        if self.horizon < 1:
            raise ValueError(f"horizon={self.horizon} must be >= 1 (turns per episode).")
        if self.choices < 2:
            raise ValueError(f"choices={self.choices} must be >= 2, or no choice is ever wrong.")
        if not 0 <= self.key < self.choices:
            raise ValueError(f"key={self.key} must lie in 0 .. choices - 1 = {self.choices - 1}.")
        if not 0 <= self.decisive_turn < self.horizon:
            raise ValueError(
                f"decisive_turn={self.decisive_turn} must lie in 0 .. horizon - 1 = {self.horizon - 1} (0-based)."
            )
        if self.structure in ("delayed", "chain"):
            if self.repair_turn is not None:
                raise ValueError(
                    f"repair_turn={self.repair_turn!r} is for structure='recovery'; pass None for "
                    f"{self.structure!r}."
                )
            return
        repair = self.horizon - 1 if self.repair_turn is None else self.repair_turn
        if (
            isinstance(repair, bool)
            or not isinstance(repair, int)
            or not self.decisive_turn < repair < self.horizon
        ):
            raise ValueError(
                f"repair_turn={self.repair_turn!r} must be a turn after decisive_turn={self.decisive_turn} and "
                f"before horizon={self.horizon} (recovery needs horizon >= 2 and a later repair turn; None means "
                "the last turn)."
            )
        object.__setattr__(self, "repair_turn", repair)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AgentTask:
        """The task of a dataset row (its other columns, ``prompt`` included, are ignored)."""
        missing = [name for name in ("structure", "horizon", "key") if name not in row]
        if missing:
            raise ValueError(
                f"the row lacks the column(s) {missing}; build rows with testbed.agent_env.make_agent_dataset "
                f"(got columns {sorted(row)})."
            )
        optional = {
            name: row[name]
            for name in ("choices", "decisive_turn", "repair_turn")
            if row.get(name) is not None
        }
        return cls(structure=row["structure"], horizon=row["horizon"], key=row["key"], **optional)

    def row(self) -> dict[str, Any]:
        """The dataset columns of this task (``repair_turn`` is None for ``delayed``)."""
        return {
            "structure": self.structure,
            "horizon": self.horizon,
            "key": self.key,
            "choices": self.choices,
            "decisive_turn": self.decisive_turn,
            "repair_turn": self.repair_turn,
        }

    def initial_state(self) -> int:
        """The state before the first turn: *bad* for ``delayed`` (nothing won yet), *good* for ``recovery`` and
        ``chain`` (nothing lost yet)."""
        return BAD if self.structure == "delayed" else GOOD

    def transition(self, turn: int, state: int, choice: int) -> int:
        """The state after ``choice`` at ``turn`` from ``state`` (the environment's whole dynamics)."""
        if self.structure == "chain":
            return BAD if turn >= self.decisive_turn and choice != self.key else state
        if turn == self.decisive_turn:
            return GOOD if choice == self.key else BAD
        if turn == self.repair_turn and state == BAD and choice == self.key:
            return GOOD
        return state

    def relevant_turns(self) -> tuple[int, ...]:
        """The turns whose choice can change the outcome (the decisive turn, the repair turn in recovery, every turn
        from the decisive one on in chain)."""
        if self.structure == "chain":
            return tuple(range(self.decisive_turn, self.horizon))
        return (self.decisive_turn,) if self.repair_turn is None else (self.decisive_turn, self.repair_turn)


class AgentEnv:
    """The environment TRL instantiates per rollout (``environment_factory=AgentEnv``): ``reset(**row)``, one tool
    ``act(choice)`` and ``get_reward()``. Read-only properties (:attr:`task`, :attr:`turn`, :attr:`state`,
    :attr:`finished`, :attr:`state_key`) expose the state to tests; properties are not tools in TRL."""

    def __init__(self) -> None:
        self._task: AgentTask | None = None
        self._turn = 0
        self._state = BAD

    def reset(self, **row: Any) -> str:
        """Start an episode for the row's task; returns the observation TRL appends to the prompt."""
        self._task = AgentTask.from_row(row)
        self._turn = 0
        self._state = self._task.initial_state()
        return _OBSERVATION.format(
            key=self._task.key,
            choices=self._task.choices,
            horizon=self._task.horizon,
            state=STATE_NAMES[self._state],
        )

    def act(self, choice: int) -> str:
        """Play this turn's choice.

        Args:
            choice: the option to pick this turn, from 0 to choices - 1.
        """
        task = self._require_task()
        if self._turn >= task.horizon:
            raise ValueError(
                f"the episode is over after {task.horizon} turns; reply done instead of calling act."
            )
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < task.choices:
            raise ValueError(f"choice={choice!r} must be an integer from 0 to {task.choices - 1}.")
        self._state = task.transition(self._turn, self._state, choice)
        self._turn += 1
        return _TURN_RESULT.format(turn=self._turn, horizon=task.horizon, state=STATE_NAMES[self._state])

    def get_reward(self) -> float:
        """1.0 when every turn was played and the final state is good, else 0.0 (sparse, final)."""
        self._require_task()
        return 1.0 if self.finished and self._state == GOOD else 0.0

    @property
    def task(self) -> AgentTask | None:
        return self._task

    @property
    def turn(self) -> int:
        """Turns played so far."""
        return self._turn

    @property
    def state(self) -> int:
        """:data:`GOOD` or :data:`BAD`."""
        return self._state

    @property
    def finished(self) -> bool:
        return self._task is not None and self._turn >= self._task.horizon

    @property
    def state_key(self) -> tuple[int, int]:
        """The environment's state as ``advantage_estimator="anchor"`` reads it: ``(turns played, state)``, the
        whole state of the dynamics within one task (the task itself is the row's, shared by a prompt group)."""
        return (self._turn, self._state)

    def _require_task(self) -> AgentTask:
        if self._task is None:
            raise RuntimeError(
                "AgentEnv has no episode: call reset(**row) with a row of make_agent_dataset first."
            )
        return self._task


# --------------------------------------------------------------------------------------------------------------
# Reading an episode's text back
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Progress:
    """Where an episode stands, read from its text: the task's visible parameters, turns played, current state."""

    key: int
    choices: int
    horizon: int
    turn: int
    state: int


def read_progress(text: str) -> Progress:
    """Read an episode's progress from its text (the rendered prompt and turns so far): the last observation of
    :meth:`AgentEnv.reset` and the last successful turn result. Tool errors (which do not use a turn) are skipped.

    Raises:
        ValueError: when the text holds no observation (it is not an episode of this environment).
    """
    observations = _OBSERVATION_RE.findall(text)
    if not observations:
        raise ValueError(
            f"no AgentEnv observation ('key=K choices=A turns=H state=S') in the text {text[-200:]!r}: the prefix "
            "is not an episode of testbed.agent_env.AgentEnv."
        )
    key, choices, horizon, state = observations[-1]
    start = text.rfind(f"key={key} choices={choices} turns={horizon}")
    results = _TURN_RESULT_RE.findall(text[start:])
    turn, state_name = (int(results[-1][0]), results[-1][2]) if results else (0, state)
    return Progress(int(key), int(choices), int(horizon), turn, _STATE_OF_NAME[state_name])


# --------------------------------------------------------------------------------------------------------------
# Policies over (turn, state), and exact values
# --------------------------------------------------------------------------------------------------------------
class TurnPolicy(Protocol):
    """A policy over this environment's decisions: given what the agent sees (:class:`Progress`: the key, the number
    of choices and of turns, the turns played and the state), the probability of each choice.

    The probabilities may sum to less than 1: the rest is the probability of *stopping* (answering without a tool
    call before the last turn), which ends the episode unfinished, a failure. A policy sees only the observation,
    never the hidden task parameters (which turn is decisive), as a model reading the episode's text would.
    """

    def action_probs(self, view: Progress) -> Sequence[float]: ...


ProbSpec = float | Sequence[Sequence[float]] | Callable[[int, int], float]


class KeyPolicy:
    """Choose the key with probability ``key_prob``, stop with ``stop_prob``, and spread the rest evenly over the
    other choices.

    Args:
        key_prob: a constant, a table ``[turn][state]`` (``state`` :data:`BAD` = 0, :data:`GOOD` = 1), or a function
            ``(turn, state) -> p``.
        stop_prob: the same forms, for stopping early; default 0 (every episode plays all turns).
    """

    def __init__(self, key_prob: ProbSpec, stop_prob: ProbSpec = 0.0) -> None:
        self._key = key_prob
        self._stop = stop_prob

    @staticmethod
    def _lookup(spec: ProbSpec, turn: int, state: int) -> float:
        if callable(spec):
            return float(spec(turn, state))
        if isinstance(spec, int | float):
            return float(spec)
        return float(spec[turn][state])

    def action_probs(self, view: Progress) -> list[float]:
        p_key = self._lookup(self._key, view.turn, view.state)
        p_stop = self._lookup(self._stop, view.turn, view.state)
        if p_key < 0 or p_stop < 0 or p_key + p_stop > 1 + 1e-12:
            raise ValueError(
                f"KeyPolicy at turn {view.turn}, state {view.state}: key_prob={p_key} and stop_prob={p_stop} must "
                "be >= 0 and sum to <= 1."
            )
        other = max(0.0, 1.0 - p_key - p_stop) / (view.choices - 1)
        return [p_key if c == view.key else other for c in range(view.choices)]


def view_of(task: AgentTask, turn: int, state: int) -> Progress:
    """What the agent sees of ``task`` at ``turn`` in ``state`` (the policy's input)."""
    return Progress(key=task.key, choices=task.choices, horizon=task.horizon, turn=turn, state=state)


def _checked_probs(policy: TurnPolicy, task: AgentTask, turn: int, state: int) -> list[float]:
    probs = [float(p) for p in policy.action_probs(view_of(task, turn, state))]
    if len(probs) != task.choices or any(p < 0 for p in probs) or sum(probs) > 1 + 1e-9:
        raise ValueError(
            f"policy.action_probs at turn={turn}, state={state} returned {probs}: it must give {task.choices} "
            "non-negative probabilities summing to <= 1 (the rest is stopping)."
        )
    return probs


def exact_values(task: AgentTask, policy: TurnPolicy) -> list[dict[int, float]]:
    """Success probability from every state: ``values[t][s]`` is ``P(reward 1 | state s before turn t)`` under
    ``policy``, for ``t = 0 .. horizon`` (``values[horizon][s]`` is the reward of finishing in ``s``).

    Backward induction over the two states: ``V_t(s) = sum_a pi_t(a | s) V_{t+1}(T_t(s, a))`` (stopping is worth 0).
    Because the environment is deterministic, the value just after a turn's tool call (before its result) equals the
    value after its result, ``V_{t+1}(T_t(s, a))``.
    """
    values: list[dict[int, float]] = [{} for _ in range(task.horizon + 1)]
    values[task.horizon] = {BAD: 0.0, GOOD: 1.0}
    for turn in reversed(range(task.horizon)):
        for state in (BAD, GOOD):
            probs = _checked_probs(policy, task, turn, state)
            values[turn][state] = _expected_next_value(probs, turn, state, task, values[turn + 1])
    return values


def _expected_next_value(
    probs: Sequence[float], turn: int, state: int, task: AgentTask, next_values: Mapping[int, float]
) -> float:
    """``sum_a pi(a) V_{t+1}(T(s, a))``, grouped by next state and with a stopping mass below 1e-12 read as 0, so a
    turn that changes nothing passes its value on bit for bit (its exact advantage is 0.0, not a rounding error)."""
    total = sum(probs)
    go = 1.0 if 1.0 - total <= 1e-12 else total  # the probability of not stopping
    mass: dict[int, float] = {}
    for choice, p in enumerate(probs):
        if p > 0:
            after = task.transition(turn, state, choice)
            mass[after] = mass.get(after, 0.0) + p
    if len(mass) == 1:
        ((after, _),) = mass.items()
        return go * next_values[after]
    return sum(m / total * go * next_values[after] for after, m in mass.items())


def success_probability(task: AgentTask, policy: TurnPolicy) -> float:
    """The policy's success rate on the task: the value of the initial state."""
    return exact_values(task, policy)[0][task.initial_state()]


def exact_q_values(task: AgentTask, policy: TurnPolicy, turn: int, state: int) -> list[float]:
    """``Q_t(s, a)`` for every choice ``a`` (stopping is worth 0): the success probability after choosing ``a``."""
    values = exact_values(task, policy)
    return [values[turn + 1][task.transition(turn, state, choice)] for choice in range(task.choices)]


def replay_states(task: AgentTask, choices: Sequence[int]) -> list[int]:
    """The states at the turn boundaries of a sequence of choices: before turn 0, after turn 0, ... (``len + 1``)."""
    if len(choices) > task.horizon:
        raise ValueError(
            f"{len(choices)} choices for a task of horizon {task.horizon}: at most horizon turns."
        )
    states = [task.initial_state()]
    for turn, choice in enumerate(choices):
        states.append(task.transition(turn, states[-1], choice))
    return states


def path_values(task: AgentTask, policy: TurnPolicy, choices: Sequence[int]) -> list[float]:
    """The exact values along an episode's turn boundaries.

    For an episode that played ``k`` turns (``choices``): ``[V_0(s_0), V_1(s_1), ..., V_k(s_k)]``; if ``k <
    horizon`` the episode stopped after turn ``k - 1`` and one more entry, its reward 0, closes the list. The
    per-turn advantages are the differences of consecutive entries (:func:`exact_advantages`).
    """
    values = exact_values(task, policy)
    states = replay_states(task, choices)
    path = [values[turn][state] for turn, state in enumerate(states)]
    if len(choices) < task.horizon:
        path.append(0.0)
    return path


def exact_advantages(task: AgentTask, policy: TurnPolicy, choices: Sequence[int]) -> list[float]:
    """Exact per-turn advantages of an episode: ``A_t = Q_t(s_t, a_t) - V_t(s_t)`` for each turn played, and, when
    the episode stopped before the last turn, one more entry for the stop (``0 - V_k(s_k)``).

    These are what Monte Carlo turn values estimate (turn boundary ``t + 1`` minus boundary ``t``); their sum is the
    reward minus ``V_0``. On turns that do not matter they are exactly 0.
    """
    path = path_values(task, policy, choices)
    return [after - before for before, after in zip(path, path[1:], strict=False)]


# --------------------------------------------------------------------------------------------------------------
# Reading an estimator's credit per turn
# --------------------------------------------------------------------------------------------------------------
def turn_spans(tool_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of the model's own turns in a completion: the runs of ``tool_mask == 1`` (TRL's
    mask is 0 on tool-result tokens, 1 on the model's). Turn ``t``'s credit is read from span ``t``; a last span
    after the final tool result is the final answer."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(list(tool_mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


@dataclass(frozen=True)
class CreditReport:
    """How an estimator's per-turn credit of one episode compares with the exact advantages.

    ``irrelevant_share``: the share of the absolute credit on decisions that did not matter, those whose exact
    advantage is 0 (with a policy that never stops: every turn but the decisive and, after a mistake, the repair
    turn), and on the final answer after the last turn; 0 for exact credit, 1 when all of it is misplaced.
    ``decisive_sign_agrees``: whether the credit of the decisive turn has the sign of its exact advantage (None when
    that advantage is 0, e.g. a recovery episode whose decisive choice could no longer matter).
    """

    exact: tuple[float, ...]
    irrelevant_share: float
    decisive_sign_agrees: bool | None


def credit_report(
    task: AgentTask, policy: TurnPolicy, choices: Sequence[int], turn_credits: Sequence[float]
) -> CreditReport:
    """Compare ``turn_credits`` (an estimator's credit per decision of the episode, e.g. the mean token advantage
    of each :func:`turn_spans` span) with the exact advantages of the episode's ``choices`` under ``policy``.

    ``turn_credits`` has one entry per decision (:func:`exact_advantages`' length) and may have one more, the final
    answer after the last turn, which is a turn that does not matter.
    """
    exact = exact_advantages(task, policy, choices)
    if len(turn_credits) not in (len(exact), len(exact) + 1):
        raise ValueError(
            f"turn_credits has {len(turn_credits)} entries; the episode has {len(exact)} decisions (give one credit "
            "per decision, optionally one more for the final answer)."
        )
    relevant = {t for t, a in enumerate(exact) if abs(a) > 1e-12}
    total = sum(abs(c) for c in turn_credits)
    irrelevant = sum(abs(c) for t, c in enumerate(turn_credits) if t not in relevant)
    d = task.decisive_turn
    agrees = None
    if d < len(exact) and exact[d] != 0.0 and d < len(turn_credits):
        agrees = (turn_credits[d] > 0) == (exact[d] > 0) and turn_credits[d] != 0
    return CreditReport(tuple(exact), irrelevant / total if total > 0 else 0.0, agrees)


# --------------------------------------------------------------------------------------------------------------
# Simulation without a model
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Episode:
    """One simulated episode: the choices made, the states at the turn boundaries, whether it stopped early, the
    tool results the environment returned, and its reward."""

    choices: tuple[int, ...]
    states: tuple[int, ...]
    stopped: bool
    tool_results: tuple[str, ...]
    reward: float


def simulate_episode(
    task: AgentTask, policy: TurnPolicy, rng: random.Random, *, prefix: Sequence[int] = ()
) -> Episode:
    """Play one episode on a fresh :class:`AgentEnv`: replay ``prefix`` (a state's choices so far), then draw each
    remaining decision from ``policy`` with ``rng``; the reward is the environment's own :meth:`AgentEnv.get_reward`.

    With ``prefix`` this is one Monte Carlo rollout from that state, so averaging rewards estimates its exact value.
    """
    env = AgentEnv()
    env.reset(**task.row())
    results = [env.act(int(choice)) for choice in prefix]
    choices = list(prefix)
    stopped = False
    while not env.finished:
        probs = _checked_probs(policy, task, env.turn, env.state)
        draw, acc, picked = rng.random(), 0.0, None
        for choice, p in enumerate(probs):
            acc += p
            if draw < acc:
                picked = choice
                break
        if picked is None:  # the remaining mass: stop before the last turn
            stopped = True
            break
        results.append(env.act(picked))
        choices.append(picked)
    return Episode(
        choices=tuple(choices),
        states=tuple(replay_states(task, choices)),
        stopped=stopped,
        tool_results=tuple(results),
        reward=env.get_reward(),
    )


# --------------------------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------------------------
def agent_rows(
    structure: str,
    horizon: int,
    n: int,
    seed: int,
    *,
    choices: int = 4,
    decisive_turn: int = 0,
    repair_turn: int | None = None,
) -> list[dict[str, Any]]:
    """``n`` rows of one task family: a conversational ``prompt`` (one user message, :data:`PROMPT_TEXT`) and the
    task columns ``reset(**row)`` reads; the keys are drawn uniformly with ``random.Random(seed)``."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1 (rows to build).")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        task = AgentTask(
            structure=structure,
            horizon=horizon,
            key=rng.randrange(choices) if choices > 0 else 0,  # AgentTask rejects choices < 2
            choices=choices,
            decisive_turn=decisive_turn,
            repair_turn=repair_turn,
        )
        rows.append({"prompt": [{"role": "user", "content": PROMPT_TEXT}], **task.row()})
    return rows


def make_agent_dataset(
    structure: str,
    horizon: int,
    n: int,
    seed: int,
    *,
    choices: int = 4,
    decisive_turn: int = 0,
    repair_turn: int | None = None,
) -> Any:
    """A ``datasets.Dataset`` of :func:`agent_rows` for ``GRPOTrainer`` / ``VinePPOTrainer`` with
    ``environment_factory=AgentEnv``: columns ``prompt``, ``structure``, ``horizon``, ``key``, ``choices``,
    ``decisive_turn``, ``repair_turn`` (``recovery`` defaults its repair turn to the last turn)."""
    from datasets import Dataset

    return Dataset.from_list(
        agent_rows(
            structure,
            horizon,
            n,
            seed,
            choices=choices,
            decisive_turn=decisive_turn,
            repair_turn=repair_turn,
        )
    )
