"""samplers/episodes.py's EpisodeSampler under the Monte Carlo estimator (mc/estimator.py): the values of an
episode's states, each continuation resumed through the tool loop on its own rebuilt environment, against exact
values, with a scripted engine (a turn is WORD then CALL EOS with probability p, else EOS), parser and chat template;
and every Monte Carlo setting on agent episodes, against the exact values."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from mcadvantage.agents.episode_sampler import EpisodeSampler
from mcadvantage.agents.rebuild import EnvironmentReplayError
from mcadvantage.agents.tool_loop import AgentEpisodes, Episode, messages_before_round
from mcadvantage.agents.turns import episode_step_boundaries, tool_turns_before
from mcadvantage.core.settings import MCSettings
from mcadvantage.mc.estimator import MCValueEstimator, Trajectory
from mcadvantage.mc.planning import estimated_boundaries
from mcadvantage.samplers.base import Continuation

EOS, WORD, CALL, OPEN, CLOSE = 2, 5, 7, 90, 91
P_CALL, LIMIT = 0.5, 3


def call(a=1, b=2):
    return {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}


class Counter:
    """reset(**row) takes the row's offset; add(a, b) returns a + b + offset + calls so far; reward: calls made."""

    def reset(self, **row):
        self.offset, self.calls = row["offset"], 0

    def add(self, a: int, b: int) -> int:
        self.calls += 1
        return a + b + self.offset + self.calls

    def get_reward(self) -> float:
        return float(self.calls)


def get_reward(environments, **kwargs):
    """What TRL appends to reward_funcs for an environment with get_reward."""
    return [env.get_reward() for env in environments]


def tool_messages(completions, **kwargs):
    """Counts the tool results in the graded conversation: the inherited rounds and the continuation's."""
    return [float(sum(m["role"] == "tool" for m in messages)) for messages in completions]


def parse(turn_ids, context, environment=None):
    message = {"role": "assistant", "content": " ".join(map(str, turn_ids))}
    if CALL in turn_ids:
        message["tool_calls"] = [call()]
    return message


def tool_suffix(tool_messages):
    return [OPEN, *(40 + int(ch) for m in tool_messages for ch in str(m["content"])), CLOSE]


class Engine:
    """The policy's sampler: one turn per request (WORD then CALL EOS with probability P_CALL, else EOS; a prefix
    ending in WORD gets the rest), seeded; counts the tokens it returns."""

    def __init__(self, seed):
        self.rng, self.returned = random.Random(seed), 0

    def sample(self, requests):
        out = []
        for request in requests:
            tail = [CALL, EOS] if self.rng.random() < P_CALL else [EOS]
            ids = tuple((([] if request.prefix_ids[-1] == WORD else [WORD]) + tail)[: request.max_tokens])
            self.returned += len(ids)
            out.append([Continuation(ids, truncated=False)])
        return out


def recorded_episode(offset=3, tool=None):
    """Two tool rounds, then an answer: tokens, tool mask and messages as TRL's loop leaves them (``tool``: a
    standalone ``add`` instead of the environment's)."""
    env = Counter()
    env.reset(offset=offset)
    add = tool or env.add
    ids, mask, messages = [], [], []
    for _ in range(2):
        ids += [WORD, CALL, EOS]
        mask += [1, 1, 1]
        messages.append(parse([WORD, CALL, EOS], []))
        result = {"role": "tool", "name": "add", "content": str(add(1, 2))}
        messages.append(result)
        suffix = tool_suffix([result])
        ids += suffix
        mask += [0] * len(suffix)
    ids += [WORD, EOS]
    mask += [1, 1]
    messages.append(parse([WORD, EOS], []))
    return Episode(
        prompt_ids=[1],
        completion_ids=ids,
        tool_mask=mask,
        messages=messages,
        reward=env.get_reward(),
        prompt="play",
        row={"prompt": "play", "offset": offset},
    )


def exact_value(rounds_done: int) -> float:
    """Expected calls of an episode with ``rounds_done`` rounds made and a fresh turn to play: each turn calls with
    probability P_CALL, at most LIMIT rounds."""
    return rounds_done + sum(P_CALL**j for j in range(1, LIMIT - rounds_done + 1))


@dataclass
class Credit:
    """One episode's part of an estimate."""

    boundaries: list
    values: list
    rollouts: int


def trajectory(episode, segment=None):
    inside = (lambda s, t: segment(episode, s, t)) if segment else None
    return Trajectory(
        prompt_ids=episode.prompt_ids,
        completion_ids=episode.completion_ids,
        step_boundaries=episode_step_boundaries(episode.tool_mask, inside),
        reward=episode.reward,
        prompt=episode.prompt,
        fields={k: v for k, v in episode.row.items() if k != "prompt"},
        tool_mask=episode.tool_mask,
        episode=episode,
    )


def _estimate(
    episodes,
    k,
    *,
    reward_funcs=(get_reward, tool_messages),
    reward_weights=(0.5, 0.5),
    standalone_tools=(),
    environment_factories=None,
    turn_step_boundaries=None,
    engine=None,
    max_completion_length=200,
    with_stats=False,
    **settings,
):
    """Estimate ``episodes`` with an EpisodeSampler around the scripted engine; per episode its :class:`Credit`."""
    agent = AgentEpisodes(
        list(episodes),
        environment_factories if environment_factories is not None else {None: Counter},
        parse,
        tool_suffix,
        max_tool_calling_iterations=LIMIT,
        standalone_tools=standalone_tools,
    )
    if environment_factories is False:
        agent.factories = None
    sampler = EpisodeSampler(engine if engine is not None else Engine(11), agent)
    trajectories = [trajectory(e, turn_step_boundaries) for e in episodes]
    estimator = MCValueEstimator(
        sampler,
        list(reward_funcs),
        None,
        settings=MCSettings(num_rollouts=k, **settings),
        reward_weights=list(reward_weights),
        max_completion_length=max_completion_length,
    )
    estimate = estimator.estimate(trajectories)
    credits = [
        Credit(estimated_boundaries(t.step_boundaries, estimator.settings), v, sum(c))
        for t, v, c in zip(trajectories, estimate.values, estimate.sample_counts, strict=True)
    ]
    return (credits, estimate.stats) if with_stats else credits


def test_turn_values_are_unbiased_and_tool_results_get_no_credit():
    episode = recorded_episode()
    k = 2000

    def first_word(ep, start, end):  # the segmenter: a step boundary after the first token of every turn
        return [start + 1] if end - start > 1 else []

    [credit] = _estimate([episode], k, turn_step_boundaries=first_word)
    s2 = episode.tool_mask.index(1, 3)  # the second turn's first token (after the first tool result)
    s3 = episode.tool_mask.index(1, s2 + 3)
    assert credit.boundaries == [0, 1, s2, s2 + 1, s3, s3 + 1, len(episode.completion_ids)]
    # States inside a turn after WORD have the turn's value (WORD decides nothing); values count calls.
    exact = [exact_value(0)] * 2 + [exact_value(1)] * 2 + [exact_value(2)] * 2
    values = credit.values[:-1]
    for v, x in zip(values, exact, strict=True):
        # Each value is a mean of K draws of at most LIMIT calls: 5 standard errors of a variance <= 1.
        assert abs(v - x) < 5 / k**0.5, (values, exact)
    assert credit.values[-1] == episode.reward == 2.0
    assert credit.rollouts == 6 * k


def test_each_continuation_grades_its_own_environment_and_the_inherited_conversation():
    # Weights (1, -1): get_reward (calls on the continuation's environment) minus the tool results in the graded
    # conversation. They agree on every continuation exactly when each continuation has its own environment, rebuilt
    # at its state, and inherits the episode's earlier rounds: every value is then 0.
    episode = recorded_episode()
    [credit] = _estimate([episode], 200, reward_weights=[1.0, -1.0])
    assert credit.values[:-1] == [0.0] * (len(credit.boundaries) - 1)


def test_routing_to_a_dict_of_environments_and_tools_without_environment():
    class Other(Counter):
        pass

    episode = recorded_episode()
    episode.environment, episode.row = "b", {**episode.row, "environment": "b"}
    [credit] = _estimate([episode], 50, environment_factories={"a": Other, "b": Counter})
    assert len(credit.values) == 4
    episode.environment = "c"
    with pytest.raises(ValueError, match="names environment 'c', which is not among"):
        _estimate([episode], 1, environment_factories={"a": Other})

    def add(a: int, b: int) -> int:
        return a + b

    plain = recorded_episode(tool=add)
    [credit] = _estimate(
        [plain],
        20,
        environment_factories=False,
        standalone_tools=[add],
        reward_funcs=[tool_messages],
        reward_weights=[1.0],
    )
    assert credit.values[1] >= 1.0  # the state after one round inherits its tool message


def test_an_environment_that_replays_differently_is_refused():
    episode = recorded_episode(offset=3)
    episode.row = {**episode.row, "offset": 4}  # the row no longer reproduces the recorded results
    with pytest.raises(
        EnvironmentReplayError,
        match=r"environment Counter \(batch row 0, dataset row .*\): replaying tool round 0",
    ):
        _estimate([episode], 1)


def test_messages_before_round():
    messages = recorded_episode().messages
    assert messages_before_round(messages, 0) == []
    assert [m["role"] for m in messages_before_round(messages, 2)] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    with pytest.raises(ValueError, match="hold 2 tool rounds, not 3"):
        messages_before_round(messages, 3)


def test_the_cost_counts_sampled_model_tokens_and_tool_result_tokens_apart():
    """``generated_tokens`` is what the engine sampled for the continuations (tool results left out), exactly the
    tokens the engine returned; ``tool_result_tokens`` the tool results they appended."""
    episode = recorded_episode()
    suffixes = []
    engine = Engine(5)

    def counted_suffix(tool_messages):
        ids = tool_suffix(tool_messages)
        suffixes.append(len(ids))
        return ids

    agent = AgentEpisodes(
        [episode], {None: Counter}, parse, counted_suffix, max_tool_calling_iterations=LIMIT
    )
    estimator = MCValueEstimator(
        EpisodeSampler(engine, agent), [get_reward], None, num_rollouts=3, max_completion_length=200
    )
    stats = estimator.estimate([trajectory(episode)]).stats
    assert stats.generated_tokens == engine.returned > 0
    # Every suffix fitted the budget of 200; the sampler renders a round's results once per batch (cached).
    assert stats.tool_result_tokens >= sum(suffixes) > 0


def test_tool_executions_and_dropped_results_are_counted_and_a_drop_is_warned_once(monkeypatch):
    """``tool_calls`` counts every tool execution turn credit ran: the replays that rebuilt the environments (a
    state after r rounds replays r calls, for each of its K continuations) and the continuations' own calls, the
    calls of dropped rounds included. A round whose results would pass the budget is dropped as in TRL (its call
    ran: the environment counts it, get_reward sees it), counted in ``dropped_tool_results`` and warned about once
    per process."""
    import warnings

    from mcadvantage.agents import rebuild

    monkeypatch.setattr(rebuild, "_DROPPED_WARNED", [False])
    episode = recorded_episode()
    k = 5
    calls_seen = []

    class Counted(Counter):
        def add(self, a: int, b: int) -> int:
            calls_seen.append(1)
            return super().add(a, b)

    length = len(episode.completion_ids)

    def run():
        # No room for a tool result after the episode's own tokens.
        return _estimate(
            [episode],
            k,
            environment_factories={None: Counted},
            engine=Engine(7),
            max_completion_length=length + 1,
            reward_funcs=[get_reward],
            reward_weights=[1.0],
            with_stats=True,
        )[1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stats = run()
        again = run()
    assert stats.tool_calls == len(calls_seen) // 2 > 0
    replays = k * (0 + 1 + 2)  # the three turn-start states replay 0, 1 and 2 rounds of one call each
    assert stats.tool_calls > replays  # and some continuations called the tool themselves
    assert stats.dropped_tool_results > 0  # the last turn's calls can never fit
    dropped = [w for w in caught if "had their results dropped" in str(w.message)]
    assert len(dropped) == 1 and again.dropped_tool_results > 0


# ---------------------------------------------------------------------------------------------------------------
# Every Monte Carlo setting on agent episodes, against the exact values
# ---------------------------------------------------------------------------------------------------------------

#: Turn-start states of recorded_episode(): after 0, 1 and 2 tool rounds.
EXACT = [exact_value(0), exact_value(1), exact_value(2)]


def _turn_values(k, episodes=None, **settings):
    episodes = episodes or [recorded_episode()]
    credits, stats = _estimate(
        episodes, k, reward_funcs=[get_reward], reward_weights=[1.0], with_stats=True, **settings
    )
    return credits, stats


def _close_to_exact(values, exact, k):
    # A mean of >= k counts in [0, LIMIT]: 5 standard errors of a variance <= LIMIT^2 / 4.
    assert all(abs(v - x) <= 5 * (LIMIT / 2) / k**0.5 for v, x in zip(values, exact, strict=True)), (
        values,
        exact,
    )


def test_identical_states_in_a_batch_are_estimated_once():
    """Three copies of one episode (a group whose episodes agree): their states are estimated once, K rollouts
    each, and every copy gets the same values."""
    k = 50
    credits, stats = _turn_values(k, [recorded_episode() for _ in range(3)])
    assert (stats.states, stats.unique_states, stats.rollouts) == (9, 3, 3 * k)
    assert credits[0].values == credits[1].values == credits[2].values
    _close_to_exact(credits[0].values[:-1], EXACT, k)


@pytest.mark.parametrize(
    "settings",
    [
        {"reuse_samples": True},
        {"allocation": "variance", "min_rollouts": 2},
        {"rollout_budget": "fixed", "fixed_rollout_budget": 150},
        {"min_step_tokens": 3},
    ],
    ids=["reuse_samples", "variance", "fixed_budget", "min_step_tokens"],
)
def test_every_monte_carlo_setting_gives_exact_in_expectation_values_on_agents(settings):
    """Free samples (the episode's own outcome and the continuations that pass through later states), variance
    allocation, the fixed rollout budget (room for a whole episode) and short-step merging (the segmenter's
    one-token steps merge into their turn, so the states are the turn starts): every estimated state's value equals
    its exact value within the Monte Carlo error."""
    k = 600

    def first_word(ep, start, end):  # a step boundary after the first token of every turn
        return [start + 1] if end - start > 1 else []

    credits, stats = _turn_values(k, turn_step_boundaries=first_word, **settings)
    [credit] = credits
    mask = recorded_episode().tool_mask
    # Every estimated state sits at a turn start or one token in (WORD decides nothing): its value is the expected
    # number of calls given the tool rounds before it.
    exact = [exact_value(tool_turns_before(mask, b)) for b in credit.boundaries[:-1]]
    _close_to_exact(credit.values[:-1], exact, k)
    if settings.get("min_step_tokens"):
        # The one-token steps merge into the steps after them, the short last ones into the step before.
        assert credit.boundaries == [0, 6, 14]
    if settings.get("reuse_samples"):
        assert stats.free_samples > 0
    if settings.get("allocation"):
        assert stats.budget_tokens is not None


def test_the_step_cap_estimates_the_first_states_and_merges_the_rest():
    k = 400
    [credit], stats = _turn_values(k, max_estimated_steps=1)
    assert credit.boundaries == [0, len(recorded_episode().completion_ids)] and stats.unique_states == 1
    _close_to_exact(credit.values[:1], EXACT[:1], k)


def test_the_truncated_reward_rule_grades_a_continuation_cut_by_its_budget():
    """A fixed budget of one token: from a turn start the continuation writes WORD and is cut, so every
    continuation is truncated and graded ``truncated_reward`` exactly."""
    [credit], stats = _turn_values(20, rollout_budget="fixed", fixed_rollout_budget=1, truncated_reward=-1.0)
    assert credit.values[:-1] == [-1.0, -1.0, -1.0]
    assert stats.truncated_rollouts == stats.rollouts == 60


class Forking(Counter):
    """Opts into the cheaper rebuild: ``_fork()`` (an underscore method: not a tool in TRL) copies the instance."""

    replays = 0

    def reset(self, **row):
        Forking.replays += 1
        return super().reset(**row)

    def _fork(self):
        import copy

        return copy.deepcopy(self)


def test_an_environment_with_a_fork_is_replayed_once_per_state():
    """K continuations of a state: one reset and replay, then K forks (each its own instance, so continuations
    still share no state), with the values of reset-and-replay."""
    Forking.replays = 0
    k = 300
    [credit], stats = _turn_values(k, environment_factories={None: Forking})
    assert Forking.replays == 3  # one per state, not 3 * k
    assert stats.tool_calls < k * 3  # the replays' calls counted once per state
    _close_to_exact(credit.values[:-1], EXACT, k)
