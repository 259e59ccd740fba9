"""One wave of Monte Carlo rollouts (:mod:`mcadvantage.mc.rollouts`): token budgets, requests, one sampler call, one
grading call per reward function, and what the wave cost.

The sampler is :class:`~mcadvantage.testing.FakeSampler` with a deterministic policy (every continuation from a
``Q1`` prompt succeeds, every one from ``Q2`` fails), so every sample's ids and reward are known.
"""

from __future__ import annotations

import math

import pytest

from mcadvantage.core.settings import MCSettings
from mcadvantage.mc import rollouts
from mcadvantage.mc.planning import plan_states
from mcadvantage.mc.stats import MCStats
from mcadvantage.mc.trajectory import Trajectory
from mcadvantage.samplers.base import Continuation, RolloutRequest
from mcadvantage.testing import FakeSampler, OutcomeReward


@pytest.fixture
def tok(char_tokenizer):
    return char_tokenizer  # the session's character tokenizer (tests/conftest.py)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def batch(tok) -> list[Trajectory]:
    """t0 (prompt ``Q1:``): ``a`` then ``Y`` + EOS, states u0 = [] and u1 = [a]; t1 (prompt ``Q2:``): ``cN`` + EOS in
    one step, state u2 = []."""
    return [
        Trajectory(ids(tok, "Q1:"), ids(tok, "aY") + [tok.eos_token_id], [0, 1, 3], 1.0, prompt="Q1:"),
        Trajectory(ids(tok, "Q2:"), ids(tok, "cN") + [tok.eos_token_id], [0, 3], 0.0, prompt="Q2:"),
    ]


def sampler(tok) -> FakeSampler:
    one = ids(tok, "1")[0]
    return FakeSampler(
        lambda prefix: 1.0 if one in prefix else 0.0,
        success_token_id=ids(tok, "Y")[0],
        failure_token_id=ids(tok, "N")[0],
        eos_token_id=tok.eos_token_id,
    )


class Progress:
    """Counts ``update`` calls, as a tqdm bar would show them."""

    def __init__(self) -> None:
        self.n = 0

    def update(self, k: int) -> None:
        self.n += k


def io_for(tok, fake, reward=None, **kw) -> rollouts.RolloutIO:
    return rollouts.RolloutIO(fake, tok, [reward or OutcomeReward("Y")], [1.0], **kw)


# ----------------------------------------------------------------------------- budgets and requests


def test_rollout_token_budget_remaining_fixed_and_context_cap():
    remaining = MCSettings()
    assert rollouts.rollout_token_budget(remaining, 3, 5, max_completion_length=10, context_length=None) == 7
    assert rollouts.rollout_token_budget(remaining, 3, 5, max_completion_length=10, context_length=12) == 4
    assert rollouts.rollout_token_budget(remaining, 3, None, max_completion_length=10, context_length=12) == 7
    fixed = MCSettings(rollout_budget="fixed", fixed_rollout_budget=6)
    assert rollouts.rollout_token_budget(fixed, 3, 5, max_completion_length=None, context_length=None) == 6
    assert rollouts.rollout_token_budget(fixed, 9, 5, max_completion_length=None, context_length=12) == -2


def test_build_requests_one_per_state_with_budget_and_samples(tok):
    trajs = batch(tok)
    plan = plan_states(trajs, MCSettings())
    assert plan.unique == [(0, 0), (0, 1), (1, 0)]
    requests, of_state = rollouts.build_requests(trajs, plan, [2, 3, 0], [5, 0, 5])
    # u1 has no budget and u2 asks for no sample: only u0 is requested, from its prompt + completion prefix.
    assert of_state == [0, None, None]
    assert requests == [RolloutRequest(prefix_ids=tuple(ids(tok, "Q1:")), n=2, max_tokens=5)]
    # 0.1's form: one K for all and a budget function (completion-prefix length, prompt length) -> tokens.
    requests, of_state = rollouts.build_requests(trajs, plan, 4, lambda prefix, prompt: 9 - prefix - prompt)
    assert of_state == [0, 1, 2]
    assert [(r.prefix_ids, r.n, r.max_tokens) for r in requests] == [
        (tuple(ids(tok, "Q1:")), 4, 6),
        (tuple(ids(tok, "Q1:a")), 4, 5),
        (tuple(ids(tok, "Q2:")), 4, 6),
    ]


def test_average_values_is_the_mean_reward_and_names_an_empty_state():
    assert rollouts.average_values([[1.0, 0.0, 1.0], [0.5]]) == [2 / 3, 0.5]
    assert rollouts.average_values([[0.1] * 10]) == [math.fsum([0.1] * 10) / 10]
    with pytest.raises(ValueError, match="state 1 has no rollout reward"):
        rollouts.average_values([[1.0], []])


def test_validate_samples_names_the_broken_request():
    req = [RolloutRequest(prefix_ids=(1,), n=2, max_tokens=2)]
    ok = [[Continuation(token_ids=(5,), truncated=False), Continuation(token_ids=(5, 6), truncated=True)]]
    assert rollouts.validate_samples(req, ok) == ok
    with pytest.raises(RuntimeError, match="2 results for 1 requests"):
        rollouts.validate_samples(req, ok * 2)
    with pytest.raises(RuntimeError, match=r"1 continuations for request 0 \(n=2\)"):
        rollouts.validate_samples(req, [ok[0][:1]])
    too_long = [[ok[0][0], Continuation(token_ids=(5, 6, 7), truncated=False)]]
    with pytest.raises(RuntimeError, match="3 tokens for request 0 with max_tokens=2"):
        rollouts.validate_samples(req, too_long)


# ----------------------------------------------------------------------------- grading


def test_grade_rollouts_weighted_nan_safe_sum_one_call_per_function(tok):
    trajs = batch(tok)
    trajs[0].fields = {"answer": "7"}

    def half(prompts, completions, completion_ids, **kw):
        return [None if c.endswith("N") else 0.5 for c in completions]

    def never(prompts, completions, completion_ids, **kw):
        return [None] * len(completions)

    outcome = OutcomeReward("Y")
    progress = Progress()
    io = rollouts.RolloutIO(
        None, tok, [outcome, half], [1.0, 2.0], reward_kwargs={"trainer_state": "s"}, progress=progress
    )
    items = [(trajs[0], ids(tok, "aY")), (trajs[1], ids(tok, "cN"))]
    rewards, unscorable = rollouts.grade_rollouts(items, io)
    assert rewards == [1.0 + 2.0 * 0.5, 0.0] and unscorable == 0  # "cN": 0 from outcome, None skipped
    assert len(outcome.calls) == 1 and progress.n == 2
    call = outcome.calls[0]
    assert call["completions"] == ["aY", "cN"] and call["prompts"] == ["Q1:", "Q2:"]
    assert call["answer"] == ["7", None] and call["trainer_state"] == "s"
    assert call["completion_ids"] == [ids(tok, "aY"), ids(tok, "cN")]
    nothing = rollouts.RolloutIO(None, tok, [never], [1.0])
    assert rollouts.grade_rollouts(items, nothing) == ([0.0, 0.0], 2)
    assert rollouts.grade_rollouts([], nothing) == ([], 0)


def test_grade_rollouts_gives_conversational_prompts_message_completions(tok):
    chat = [{"role": "user", "content": "Q1:"}]
    traj = Trajectory(ids(tok, "Q1:"), ids(tok, "aY"), [0, 2], 1.0, prompt=chat)
    outcome = OutcomeReward("Y")
    assert rollouts.grade_rollouts([(traj, ids(tok, "aY"))], io_for(tok, None, outcome)) == ([1.0], 0)
    assert outcome.calls[0]["completions"] == [[{"role": "assistant", "content": "aY"}]]


# ----------------------------------------------------------------------------- one wave


def test_a_wave_is_one_sampler_call_and_one_grading_call(tok):
    trajs = batch(tok)
    plan = plan_states(trajs, MCSettings())
    fake, outcome, progress = sampler(tok), OutcomeReward("Y"), Progress()
    io = io_for(tok, fake, outcome, reward_kwargs={"trainer_state": 1}, progress=progress)
    wave = rollouts.run_wave(trajs, plan, [2, 1, 3], [5, 5, 5], io, grade_unsampled=True)
    assert len(fake.calls) == 1 and [r.n for r in fake.calls[0]] == [2, 1, 3]
    assert len(outcome.calls) == 1 and len(outcome.calls[0]["completions"]) == 6
    assert progress.n == 2  # the sampler call, then the one reward function
    y, n, eos = ids(tok, "Y")[0], ids(tok, "N")[0], tok.eos_token_id
    # Each sample is the state's completion prefix plus its continuation, graded on the whole text.
    assert wave.samples == [
        [([y, eos], 1.0)] * 2,
        [(ids(tok, "a") + [y, eos], 1.0)],
        [([n, eos], 0.0)] * 3,
    ]
    counts = wave.counts
    assert isinstance(counts, MCStats)
    assert (counts.requests, counts.rollouts, counts.generated_tokens) == (3, 6, 12)
    assert (counts.truncated_rollouts, counts.unscorable_rollouts, counts.unsampled_states) == (0, 0, 0)
    assert counts.rollout_rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert counts.sampling_seconds >= 0 and counts.grading_seconds >= 0


def test_truncated_continuations_get_the_truncated_reward_first_in_the_tally(tok):
    trajs = batch(tok)
    plan = plan_states(trajs, MCSettings())
    y = ids(tok, "Y")[0]
    # u0's budget is 1 token: its continuations stop at "Y" before EOS, truncated.
    graded = rollouts.run_wave(
        trajs, plan, [2, 1, 1], [1, 5, 5], io_for(tok, sampler(tok)), grade_unsampled=True
    )
    assert graded.samples[0] == [([y], 1.0)] * 2  # graded like any other: "Y" ends with Y
    fixed = rollouts.run_wave(
        trajs,
        plan,
        [2, 1, 1],
        [1, 5, 5],
        io_for(tok, sampler(tok), truncated_reward=0.25),
        grade_unsampled=True,
    )
    assert fixed.samples[0] == [([y], 0.25)] * 2
    assert fixed.counts.truncated_rollouts == 2 and fixed.counts.generated_tokens == 2 + 2 + 2
    assert fixed.counts.rollout_rewards == [0.25, 0.25, 1.0, 0.0]  # the truncated ones, then the graded ones


def test_a_state_without_budget_is_graded_as_its_prefix_only_when_asked(tok):
    trajs = batch(tok)
    plan = plan_states(trajs, MCSettings())
    outcome = OutcomeReward("Y")
    wave = rollouts.run_wave(
        trajs, plan, [1, 1, 1], [5, 0, 5], io_for(tok, sampler(tok), outcome), grade_unsampled=True
    )
    assert wave.samples[1] == [(ids(tok, "a"), 0.0)]  # "a" alone, graded: no "Y"
    assert outcome.calls[0]["completions"] == ["Y", "a", "N"]  # in state order
    assert (wave.counts.requests, wave.counts.unsampled_states, wave.counts.rollouts) == (2, 1, 2)
    assert wave.counts.rollout_rewards == [1.0, 0.0]  # the prefix's grade is no rollout's
    fixed = rollouts.run_wave(
        trajs,
        plan,
        [1, 1, 1],
        [5, 0, 5],
        io_for(tok, sampler(tok), truncated_reward=0.5),
        grade_unsampled=True,
    )
    assert fixed.samples[1] == [(ids(tok, "a"), 0.5)]
    second = rollouts.run_wave(
        trajs, plan, [1, 1, 0], [5, 0, 5], io_for(tok, sampler(tok)), grade_unsampled=False
    )
    assert second.samples[1] == [] and second.samples[2] == [] and second.counts.unsampled_states == 0
    assert second.counts.requests == 1


def test_same_seed_same_wave(tok):
    trajs = batch(tok)
    plan = plan_states(trajs, MCSettings())

    def wave(seed: int) -> rollouts.Wave:
        fake = FakeSampler(
            0.5,
            success_token_id=ids(tok, "Y")[0],
            failure_token_id=ids(tok, "N")[0],
            eos_token_id=tok.eos_token_id,
            seed=seed,
        )
        return rollouts.run_wave(trajs, plan, [8, 8, 8], [5, 5, 5], io_for(tok, fake), grade_unsampled=True)

    assert wave(3).samples == wave(3).samples
    assert wave(3).samples != wave(4).samples
