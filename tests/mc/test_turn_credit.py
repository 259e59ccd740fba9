"""mc/turn_credit.py: Monte Carlo values of an episode's states through the tool loop, against exact values, with a
scripted engine (a turn is WORD then CALL EOS with probability p, else EOS), parser and chat template."""

from __future__ import annotations

import random

import pytest

from mcadvantage.mc.episodes import EnvironmentReplayError
from mcadvantage.mc.turn_credit import Episode, Graders, ToolLoop, estimate_turn_credit, messages_before_round

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


def parse(turn_ids, context):
    message = {"role": "assistant", "content": " ".join(map(str, turn_ids))}
    if CALL in turn_ids:
        message["tool_calls"] = [call()]
    return message


def tool_suffix(tool_messages):
    return [OPEN, *(40 + int(ch) for m in tool_messages for ch in str(m["content"])), CLOSE]


def engine(seed):
    rng = random.Random(seed)

    def generate(contexts, budgets):
        out = []
        for context, budget in zip(contexts, budgets, strict=True):
            tail = [CALL, EOS] if rng.random() < P_CALL else [EOS]
            out.append((([] if context[-1] == WORD else [WORD]) + tail)[:budget])
        return out

    return generate


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


def _estimate(
    episodes,
    k,
    *,
    reward_funcs=(get_reward, tool_messages),
    reward_weights=(0.5, 0.5),
    standalone_tools=(),
    **kw,
):
    kw.setdefault("environment_factories", {None: Counter})
    return estimate_turn_credit(
        episodes,
        num_rollouts=k,
        loop=ToolLoop(
            generate=engine(11),
            parse=parse,
            tool_suffix_ids=tool_suffix,
            max_completion_length=200,
            max_tool_calling_iterations=LIMIT,
            standalone_tools=standalone_tools,
        ),
        graders=Graders(list(reward_funcs), list(reward_weights)),
        **kw,
    )


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
    for t, m in enumerate(episode.tool_mask):
        if m == 0:
            assert credit.advantages[t] == 0.0
    # The last turn's second step decides nothing more: the final answer's EOS gets R - V(S_5) = 2 - (2 + p) < 0.
    assert credit.advantages[-1] == pytest.approx(2.0 - values[-1])


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
        environment_factories=None,
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
    returned, suffixes = [0], []
    inner = engine(5)

    def counting(contexts, budgets):
        out = inner(contexts, budgets)
        returned[0] += sum(len(t) for t in out)
        return out

    def counted_suffix(tool_messages):
        ids = tool_suffix(tool_messages)
        suffixes.append(len(ids))
        return ids

    [credit] = estimate_turn_credit(
        [episode],
        num_rollouts=3,
        environment_factories={None: Counter},
        loop=ToolLoop(
            generate=counting,
            parse=parse,
            tool_suffix_ids=counted_suffix,
            max_completion_length=200,
            max_tool_calling_iterations=LIMIT,
        ),
        graders=Graders([get_reward], [1.0]),
    )
    assert credit.generated_tokens == returned[0] > 0
    assert credit.tool_result_tokens == sum(suffixes) > 0  # every suffix fitted the budget of 200


def test_tool_executions_and_dropped_results_are_counted_and_a_drop_is_warned_once(monkeypatch):
    """``tool_calls`` counts every tool execution turn credit ran: the replays that rebuilt the environments (a
    state after r rounds replays r calls, for each of its K continuations) and the continuations' own calls, the
    calls of dropped rounds included. A round whose results would pass the budget is dropped as in TRL (its call
    ran: the environment counts it, get_reward sees it), counted in ``dropped_tool_results`` and warned about once
    per process."""
    import warnings

    from mcadvantage.mc import rebuild

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
        return estimate_turn_credit(
            [episode],
            num_rollouts=k,
            environment_factories={None: Counted},
            loop=ToolLoop(
                generate=engine(7),
                parse=parse,
                tool_suffix_ids=tool_suffix,
                max_completion_length=length + 1,  # no room for a tool result after the episode's own tokens
                max_tool_calling_iterations=LIMIT,
            ),
            graders=Graders([get_reward], [1.0]),
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        [credit] = run()
        [again] = run()
    assert credit.tool_calls == len(calls_seen) // 2 > 0
    replays = k * (0 + 1 + 2)  # the three turn-start states replay 0, 1 and 2 rounds of one call each
    assert credit.tool_calls > replays  # and some continuations called the tool themselves
    assert credit.dropped_tool_results > 0  # the last turn's calls can never fit
    dropped = [w for w in caught if "had their results dropped" in str(w.message)]
    assert len(dropped) == 1 and again.dropped_tool_results > 0
