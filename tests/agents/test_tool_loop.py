"""agents/turns.py and agents/tool_loop.py: states and credit of multi-turn episodes, environment replay, and continuations that resume an
episode (with a scripted engine, parser and chat template: tokens stand for whole words here)."""

from __future__ import annotations

import random

import pytest

from mcadvantage.agents.rebuild import (
    EnvironmentReplayError,
    EpisodeRecord,
    ToolTurn,
    environment_tools,
    execute_tool_calls,
    recorded_tool_turns,
    replay_environment,
    with_observation,
)
from mcadvantage.agents.tool_loop import ToolLoop, continue_episodes
from mcadvantage.agents.turns import episode_step_boundaries, model_spans, tool_spans, tool_turns_before

EOS, WORD, CALL = 2, 5, 7  # token ids of the scripted episodes
OPEN, CLOSE = 90, 91  # a tool result's frame; the result's digits are tokens 40..49 between them

#: An episode: turn 1 = 3 model tokens (a call), tool result of 2 tokens, turn 2 = 3 model tokens (a call), tool
#: result of 3 tokens, turn 3 = 2 model tokens.
MASK = [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1]


def test_spans_of_model_turns_and_tool_results():
    assert model_spans(MASK) == [(0, 3), (5, 8), (11, 13)]
    assert tool_spans(MASK) == [(3, 5), (8, 11)]
    assert [tool_turns_before(MASK, p) for p in (0, 3, 5, 8, 11, 13)] == [0, 0, 1, 1, 2, 2]


def test_states_sit_at_turn_starts_and_segmenter_boundaries_never_in_tool_results():
    assert episode_step_boundaries(MASK) == [0, 5, 11, 13]
    # The segmenter splits the second turn after its first token.
    inside = {(5, 8): [6]}
    assert episode_step_boundaries(MASK, lambda s, e: inside.get((s, e), [])) == [0, 5, 6, 11, 13]
    assert episode_step_boundaries([1, 1, 1]) == [0, 3] and episode_step_boundaries([]) == [0]
    with pytest.raises(ValueError, match=r"tool_mask\[0\] = 0"):
        episode_step_boundaries([0, 1])
    with pytest.raises(ValueError, match="boundary 3 lies outside its turn"):
        episode_step_boundaries(MASK, lambda s, e: [3] if s == 0 else [])


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_recorded_tool_turns_skip_a_rolled_back_call():
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call("add", a=1, b=2)]},
        {"role": "tool", "name": "add", "content": "3"},
        {"role": "assistant", "content": "", "tool_calls": [call("add", a=2, b=2), call("neg", a=1)]},
        {"role": "tool", "name": "add", "content": "4"},
        {"role": "tool", "name": "neg", "content": "-1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("add", a=9, b=9)],
        },  # results rolled back by TRL
    ]
    turns = recorded_tool_turns(messages)
    assert turns == [
        ToolTurn((call("add", a=1, b=2),), (("add", "3"),)),
        ToolTurn((call("add", a=2, b=2), call("neg", a=1)), (("add", "4"), ("neg", "-1"))),
    ]


class Counter:
    """A deterministic environment: ``add`` returns a + b + (calls so far), and its reward is the number of calls."""

    def reset(self, **row):
        self.offset = row.get("offset", 0)
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        self.calls += 1
        return a + b + self.offset + self.calls

    def get_reward(self) -> float:
        return float(self.calls)

    def _helper(self):  # private: not a tool
        return 0


class Noisy(Counter):
    """Not replayable: its results depend on an unseeded random draw."""

    def add(self, a: int, b: int) -> int:
        return a + b + random.randint(0, 10**9)


def test_tools_of_an_environment_as_trl_builds_them():
    def add(a: int, b: int) -> int:
        return -1

    def echo(x: str) -> str:
        return x

    env = Counter()
    tools = environment_tools(env, [add, echo])
    assert (
        sorted(tools) == ["add", "echo"] and tools["add"] == env.add
    )  # the method shadows the standalone tool
    assert environment_tools(None, [echo]) == {"echo": echo}


def test_tool_calls_run_with_trls_semantics():
    async def slow_double(a: int) -> int:
        return 2 * a

    def boom() -> None:
        raise RuntimeError("no network")

    tools = {"double": slow_double, "boom": boom, "blocks": lambda: [{"type": "text", "text": "hi"}]}
    calls = [
        call("double", a=4),
        call("boom"),
        call("missing"),
        {"type": "code", "name": "x"},
        call("blocks"),
    ]
    assert execute_tool_calls(calls, tools) == [
        ("double", "8"),
        ("boom", "{'error': 'no network'}"),
        ("missing", "{'error': 'Tool missing not found.'}"),
        ("x", "{'error': 'Unsupported tool call type: code'}"),
        ("blocks", [{"type": "text", "text": "hi"}]),
    ]


def test_replay_rebuilds_the_state_in_a_fresh_instance_and_checks_every_result():
    row = {"offset": 10}
    original = Counter()
    original.reset(**row)
    first = (call("add", a=1, b=2),)
    turns = [ToolTurn(first, (("add", str(original.add(1, 2))),))]
    second = (call("add", a=0, b=0),)
    turns.append(ToolTurn(second, (("add", str(original.add(0, 0))),)))
    a = replay_environment(Counter, row, turns[:1])
    b = replay_environment(Counter, row, turns)
    assert (a.calls, b.calls, original.calls) == (1, 2, 2)
    a.add(5, 5)  # a continuation acting on its environment changes no other instance
    assert (a.calls, b.calls, original.calls) == (2, 2, 2)
    assert replay_environment(Counter, row, []).calls == 0

    with pytest.raises(
        EnvironmentReplayError,
        match=r"environment Counter \(dataset row \{.*\}\): replaying tool round 1 .* recorded",
    ):
        replay_environment(Counter, row, [turns[0], ToolTurn(second, (("add", "999"),))])
    with pytest.raises(
        EnvironmentReplayError, match=r"environment Noisy \(.*\): .*seed any randomness from a row column"
    ):
        replay_environment(Noisy, row, [ToolTurn(first, (("add", "13"),))])


def test_replay_names_an_environment_whose_reset_raises():
    class Broken(Counter):
        def reset(self, **row):
            raise KeyError("offset")

    with pytest.raises(
        EnvironmentReplayError,
        match=r"environment Broken \(dataset row \{\}\): reset\(\*\*row\) raised KeyError",
    ):
        replay_environment(Broken, {}, [])


class RandomTarget(Counter):
    """reset draws the target it shows from an unseeded random (the probe's "Target 0", replays drew 2, 1, 3)."""

    def reset(self, **row):
        super().reset(**row)
        self.target = random.SystemRandom().randrange(10**9)
        return f" Target {self.target}"


class HiddenSeed(Counter):
    """Keeps a hidden random draw that no observation or tool result shows, but exposes it as its state_key."""

    def reset(self, **row):
        super().reset(**row)
        self.hidden = random.SystemRandom().randrange(10**9)

    @property
    def state_key(self):
        return (self.calls, self.hidden)


class Point:
    """A value with Python's default repr (its memory address)."""

    def __init__(self, x):
        self.x = x


class Plotter(Counter):
    """A deterministic tool that returns an object with the default repr."""

    def plot(self, x: int):
        return Point(x)


PROMPT = [{"role": "user", "content": "play"}]


def test_with_observation_appends_as_grpo_does():
    assert with_observation(PROMPT, " T") == [{"role": "user", "content": "play T"}]
    assert with_observation(PROMPT, None) == PROMPT
    blocks = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    assert with_observation(blocks, "b")[-1]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    assert with_observation(PROMPT, [{"type": "text", "text": "b"}])[-1]["content"] == [
        {"type": "text", "text": "play"},
        {"type": "text", "text": "b"},
    ]


def test_a_reset_that_draws_another_observation_is_refused_naming_both():
    row = {"offset": 0, "prompt": PROMPT}
    env = RandomTarget()
    episode_prompt = with_observation(PROMPT, env.reset(**row))
    record = EpisodeRecord(prompt=episode_prompt, row_prompt=PROMPT)
    with pytest.raises(EnvironmentReplayError) as err:
        replay_environment(RandomTarget, row, [], where="batch row 2", record=record)
    message = str(err.value)
    assert (err.value.environment, err.value.round, err.value.where) == ("RandomTarget", None, "batch row 2")
    assert message.startswith(
        "environment RandomTarget (batch row 2, dataset row {'offset': 0}): reset(**row)"
    )
    assert f"Target {env.target}" in message  # the episode's observation
    assert "returned ' Target " in message  # and the rebuilt one
    # A deterministic reset passes the same check.
    fixed = with_observation(PROMPT, Counter().reset(**row))
    replay_environment(Counter, row, [], record=EpisodeRecord(prompt=fixed, row_prompt=PROMPT))


def test_hidden_state_that_differs_after_replay_is_refused_through_its_state_key():
    row = {"offset": 0}
    original = HiddenSeed()
    original.reset(**row)
    turns = [ToolTurn((call("add", a=1, b=2),), (("add", str(original.add(1, 2))),))]
    # The tool results replay (the hidden draw shows nowhere), but the key after the round differs.
    record = EpisodeRecord(state_keys={1: original.state_key})
    with pytest.raises(EnvironmentReplayError) as err:
        replay_environment(HiddenSeed, row, turns, where="batch row 0", record=record)
    assert (err.value.round, err.value.where) == (0, "batch row 0")
    assert "state_key after replaying tool round 0 is (1, " in str(err.value)
    assert f"but the episode's was {original.state_key!r}" in str(err.value)
    with pytest.raises(EnvironmentReplayError, match=r"state_key after reset\(\*\*row\) is \(0, "):
        replay_environment(HiddenSeed, row, turns, record=EpisodeRecord(state_keys={0: (0, -1)}))
    # Without a recorded key nothing can be compared (the contract says so): the replay goes through.
    assert replay_environment(HiddenSeed, row, turns).calls == 1


def test_an_unstable_default_repr_is_named_as_the_cause():
    env = Plotter()
    env.reset(offset=0)
    turns = [ToolTurn((call("plot", x=1),), (("plot", str(env.plot(1))),))]
    with pytest.raises(EnvironmentReplayError) as err:
        replay_environment(Plotter, {"offset": 0}, turns)
    message = str(err.value)
    assert "differ only in memory addresses" in message and "__repr__" in message
    assert "seed any randomness" not in message  # the tools are deterministic: not the advice here


def test_a_stateful_tools_function_is_detected_on_replay():
    seen = []

    def remember(x: int) -> int:
        """Keeps global state: the number of calls so far."""
        seen.append(x)
        return len(seen)

    turns = [ToolTurn((call("remember", x=1),), (("remember", str(remember(1))),))]

    def stateless(x: int) -> int:
        return 1

    stateless.__name__ = "remember"
    replay_environment(None, {}, turns, [stateless])  # a stateless tool of that name replays
    with pytest.raises(EnvironmentReplayError, match=r"environment tools= .*keeps state between calls"):
        replay_environment(None, {}, turns, [remember])


# ---------------------------------------------------------------------------------------------------------------
# Continuations, with a scripted engine: a turn is [WORD, CALL, EOS] (calls add(1, 2)) or [WORD, EOS] (answers)
# ---------------------------------------------------------------------------------------------------------------


def parse(turn_ids, context):
    message = {"role": "assistant", "content": " ".join(map(str, turn_ids))}
    if CALL in turn_ids:
        message["tool_calls"] = [call("add", a=1, b=2)]
    return message


def tool_suffix(tool_messages):
    digits = [40 + int(ch) for m in tool_messages for ch in str(m["content"]) if ch.isdigit()]
    return [OPEN, *digits, CLOSE]


class ScriptedEngine:
    """Calls a tool with probability ``p_call`` per turn (seeded); records each batch it is given."""

    def __init__(self, p_call, seed=0):
        self.p_call, self.rng, self.batches = p_call, random.Random(seed), []

    def __call__(self, contexts, budgets):
        self.batches.append(len(contexts))
        out = []
        for context, budget in zip(contexts, budgets, strict=True):
            rest = (
                [EOS]
                if context[-1] == WORD
                else ([WORD, CALL, EOS] if self.rng.random() < self.p_call else [WORD, EOS])
            )
            out.append(rest[:budget])
        return out


def _continue(prefixes, masks, envs, engine, **kw):
    kw.setdefault("max_completion_length", 100)
    loop = ToolLoop(generate=engine, parse=parse, tool_suffix_ids=tool_suffix, **kw)
    return continue_episodes([[1]] * len(prefixes), prefixes, masks, envs, loop=loop)


def _env(calls_done=0):
    env = Counter()
    env.reset()
    for _ in range(calls_done):
        env.add(1, 2)
    return env


def test_a_continuation_resumes_the_turn_it_starts_in_and_runs_the_tool_loop():
    engine = ScriptedEngine(p_call=1.0)
    # From inside the first turn (after WORD): the engine ends the turn with EOS; the prefix's WORD and the new EOS
    # are parsed as one turn; then two more rounds until the iteration limit of 2 rounds.
    [out] = _continue([[WORD]], [[1]], [_env()], engine, max_tool_calling_iterations=2)
    assert out.completion_ids[:2] == [WORD, EOS]
    assert out.tool_rounds == 0 and out.messages[0]["content"] == f"{WORD} {EOS}"
    [out] = _continue([[]], [[]], [_env()], engine, max_tool_calling_iterations=2)
    assert out.tool_rounds == 2 and out.environment.calls == 2
    assert [m["role"] for m in out.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert "tool_calls" in out.messages[-1]  # its calls were not run: the limit was reached
    suffix_1 = tool_suffix([{"content": "4"}])
    assert out.completion_ids[: 3 + len(suffix_1)] == [WORD, CALL, EOS, *suffix_1]
    assert out.tool_mask == [1] * 3 + [0] * len(suffix_1) + [1] * 3 + [0] * len(suffix_1) + [1] * 3


def test_the_prefixs_rounds_count_towards_the_iteration_limit():
    # The state right after the first tool result (a turn boundary): one round already used.
    prefix = [WORD, CALL, EOS, *tool_suffix([{"content": "4"}])]
    mask = [1, 1, 1] + [0] * (len(prefix) - 3)
    [out] = _continue([prefix], [mask], [_env(1)], ScriptedEngine(1.0), max_tool_calling_iterations=1)
    assert (
        out.tool_rounds == 0
        and out.environment.calls == 1
        and out.completion_ids[len(prefix) :] == [WORD, CALL, EOS]
    )
    [more] = _continue([prefix], [mask], [_env(1)], ScriptedEngine(1.0), max_tool_calling_iterations=2)
    assert more.tool_rounds == 1 and more.environment.calls == 2
    with pytest.raises(ValueError, match="a prefix of 3 tokens has 2 tool-mask entries"):
        _continue([[WORD, CALL, EOS]], [[1, 1]], [_env()], ScriptedEngine(1.0))


def test_tool_results_that_do_not_fit_end_the_episode_as_in_trl():
    [out] = _continue([[]], [[]], [_env()], ScriptedEngine(1.0), max_completion_length=5)
    # The call ran (the environment counts it) but its 3-token result would pass the 5-token budget: dropped.
    assert out.completion_ids == [WORD, CALL, EOS] and out.tool_mask == [1, 1, 1]
    assert out.environment.calls == 1 and out.tool_rounds == 0
    assert (out.tool_calls, out.dropped_results) == (1, 1)
    [cut] = _continue([[]], [[]], [_env()], ScriptedEngine(1.0), max_completion_length=2)
    assert cut.completion_ids == [WORD, CALL]  # cut by the budget mid-turn


def test_continuations_go_to_the_engine_together_one_call_per_turn():
    engine = ScriptedEngine(p_call=0.5, seed=3)
    outs = _continue([[]] * 6, [[]] * 6, [_env() for _ in range(6)], engine, max_tool_calling_iterations=5)
    rounds = [o.tool_rounds for o in outs]
    assert len(engine.batches) == max(rounds) + 1
    # Turn k's batch holds the continuations still going after k rounds.
    assert engine.batches == [sum(r >= k for r in rounds) for k in range(max(rounds) + 1)]
    assert len(set(map(id, (o.environment for o in outs)))) == 6


def test_monte_carlo_values_from_replayed_states_are_unbiased_and_share_no_state():
    """The value of the state after one round, from K continuations each on its own replayed environment, matches the
    exact value; were the environment shared (state leaking between continuations) it would not."""
    p_call, limit, k = 0.5, 3, 4000
    # Reward = number of tool calls in the episode (Counter.get_reward). From the state after one round (1 call
    # made, 2 rounds left), the expected number of further calls is p + p^2 (a round happens while calls continue).
    exact = 1 + p_call + p_call**2
    row = {"offset": 0}
    episode = _env(1)
    turns = [ToolTurn((call("add", a=1, b=2),), (("add", "4"),))]
    prefix = [WORD, CALL, EOS, *tool_suffix([{"content": "4"}])]
    mask = [1, 1, 1] + [0] * (len(prefix) - 3)
    envs = [replay_environment(Counter, row, turns) for _ in range(k)]
    outs = _continue(
        [prefix] * k, [mask] * k, envs, ScriptedEngine(p_call, seed=7), max_tool_calling_iterations=limit
    )
    values = [o.environment.get_reward() for o in outs]
    mean = sum(values) / k
    se = (sum((v - mean) ** 2 for v in values) / (k - 1) / k) ** 0.5
    assert abs(mean - exact) < 4 * se
    assert episode.calls == 1  # the episode's own environment was never touched
    shared = _env(1)
    leaked = _continue(
        [prefix] * 50,
        [mask] * 50,
        [shared] * 50,
        ScriptedEngine(p_call, seed=7),
        max_tool_calling_iterations=limit,
    )
    assert leaked[0].environment.get_reward() > exact + 10  # one instance counted every continuation's calls


def test_replay_reseeds_an_environment_with_the_hook_after_the_replay():
    """``replay_environment(..., reseed=source)`` calls the optional ``_reseed(seed)`` once, after the replay, with
    a fresh seed from the source; environments without the hook, or no source, are left as replayed."""

    class Reseedable(Counter):
        def _reseed(self, seed):
            self.reseeded = (seed, self.calls)  # the replay already happened

    row = {"offset": 10}
    first = (call("add", a=1, b=2),)
    turns = [ToolTurn(first, (("add", "14"),))]
    seeds = iter([7, 8])
    a = replay_environment(Reseedable, row, turns, reseed=lambda: next(seeds))
    b = replay_environment(Reseedable, row, turns, reseed=lambda: next(seeds))
    assert (a.reseeded, b.reseeded) == ((7, 1), (8, 1))
    assert not hasattr(replay_environment(Reseedable, row, turns), "reseeded")
    assert replay_environment(Counter, row, turns, reseed=lambda: 1 / 0).calls == 1  # no hook: never called
