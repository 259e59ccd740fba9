"""estimators/vineppo.py on multi-turn episodes (``batch.tool_mask`` set): Monte Carlo credit per turn through
``EstimatorContext.episodes``, with a scripted engine and tool (no model): masked-out rows are skipped, tool-result
tokens get exactly 0 and leave the whitening mask, the values are unbiased, and what turn credit cannot do is refused
with the setting and the fix. Also ``"hybrid"`` on the same episodes (it reuses this turn credit for the episodes of
degenerate groups it chooses)."""

from __future__ import annotations

import contextlib
import math
import random

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.agents.tool_loop import AgentEpisodes, Episode  # noqa: E402
from mcadvantage.estimators import (  # noqa: E402
    AdvantageBatch,
    EstimatorContext,
    GRPOEstimator,
    HybridEstimator,
    VinePPOEstimator,
)
from mcadvantage.mc.estimator import MCEstimate  # noqa: E402
from mcadvantage.samplers.base import Continuation  # noqa: E402
from mcadvantage.testing import build_char_tokenizer  # noqa: E402
from mcadvantage.trainer.checks import check_agent_kwargs  # noqa: E402

EOS, WORD, CALL, OPEN, CLOSE = 2, 5, 7, 90, 91
P_CALL, LIMIT = 0.5, 3  # a turn calls the tool with probability 1/2; at most 3 tool rounds


class Counter:
    """reset(**row); add(a, b) counts the calls; the reward is the number of calls."""

    def reset(self, **row):
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        return float(self.calls)


def get_reward(environments, **kwargs):
    return [env.get_reward() for env in environments]


def parse(turn_ids, context, environment):
    message = {"role": "assistant", "content": ""}
    if CALL in turn_ids:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
        ]
    return message


def tool_suffix(tool_messages):
    return [OPEN, CLOSE]


class TurnSampler:
    """A turn is WORD, then CALL EOS with probability P_CALL, else EOS (a prefix ending in WORD gets the rest)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def sample(self, requests):
        out = []
        for request in requests:
            conts = []
            for _ in range(request.n):
                tail = [CALL, EOS] if self.rng.random() < P_CALL else [EOS]
                ids = (([] if request.prefix_ids[-1] == WORD else [WORD]) + tail)[: request.max_tokens]
                conts.append(Continuation(token_ids=tuple(ids), truncated=False))
            out.append(conts)
        return out


def recorded(rounds: int) -> Episode:
    """``rounds`` tool rounds then an answer, as TRL's loop leaves them."""
    ids, mask, messages = [], [], []
    for _ in range(rounds):
        ids += [WORD, CALL, EOS, OPEN, CLOSE]
        mask += [1, 1, 1, 0, 0]
        messages += [parse([CALL], [], None), {"role": "tool", "name": "add", "content": "3"}]
    ids += [WORD, EOS]
    mask += [1, 1]
    messages.append(parse([], [], None))
    return Episode([1], ids, mask, messages, float(rounds), prompt="play", row={"prompt": "play"})


def expected_calls(rounds_done: int) -> float:
    return rounds_done + sum(P_CALL**j for j in range(1, LIMIT - rounds_done + 1))


def _batch_and_context(recorded_episodes, masked=(), group_size=None, seed=3, **context_kwargs):
    episodes = recorded_episodes
    width = max(len(e.completion_ids) for e in episodes)
    completion_mask = torch.zeros(len(episodes), width)
    tool_mask = torch.ones(len(episodes), width, dtype=torch.long)
    for i, e in enumerate(episodes):
        completion_mask[i, : len(e.completion_ids)] = 0.0 if i in masked else 1.0
        tool_mask[i, : len(e.tool_mask)] = torch.tensor(e.tool_mask)
    batch = AdvantageBatch(
        prompt_ids=[e.prompt_ids for e in episodes],
        completion_ids=[e.completion_ids for e in episodes],
        completion_mask=completion_mask,
        rewards_per_func=torch.tensor([[e.reward] for e in episodes]),
        reward_weights=torch.tensor([1.0]),
        local_slice=slice(0, len(episodes)),
        group_size=group_size or len(episodes),
        prompts=[e.prompt for e in episodes],
        rows=[e.row for e in episodes],
        tool_mask=tool_mask,
    )
    agent = AgentEpisodes(
        list(episodes), {None: Counter}, parse, tool_suffix, max_tool_calling_iterations=LIMIT
    )
    context_kwargs.setdefault("episodes", agent)
    context = EstimatorContext.single_process(
        TurnSampler(seed), [get_reward], build_char_tokenizer(), max_completion_length=64, **context_kwargs
    )
    return batch, context


def test_turn_credit_is_unbiased_skips_masked_rows_and_gives_tool_tokens_nothing():
    k = 400
    episodes = [recorded(1), recorded(2), recorded(1)]
    batch, context = _batch_and_context(episodes, masked=(2,))  # row 2: mask_truncated_completions masked it
    estimator = VinePPOEstimator(num_rollouts=k, step_segmenter=lambda text: [text])
    result = estimator.estimate(batch, context)

    assert estimator.last_rows == [0, 1] and len(estimator.last_turn_credit) == 2
    assert not result.advantages[2].any() and not result.token_mask[2].any()
    model_tokens = batch.completion_mask.bool() & batch.tool_mask.bool()
    assert torch.equal(result.token_mask, model_tokens)
    assert not result.advantages[batch.tool_mask == 0].any()  # tool results: exactly 0
    for episode, values in zip(episodes[:2], result.values, strict=True):
        rounds = len([m for m in episode.messages if m["role"] == "tool"])
        exact = [expected_calls(r) for r in range(rounds + 1)]  # one state per turn
        # A mean of K counts in [0, LIMIT]: 5 standard errors of a variance <= LIMIT^2 / 4.
        assert all(abs(v - x) <= 5 * (LIMIT / 2) / k**0.5 for v, x in zip(values[:-1], exact, strict=True))
        assert values[-1] == episode.reward
    # The episodes' first states are identical (same prompt, row and tokens), and so is the state after the first
    # tool round: estimated once each, 3 unique states of 5.
    assert result.metrics["rollouts"] == k * 3 and result.metrics["states"] == 5
    assert result.metrics["dedup_ratio"] == pytest.approx(2 / 5)


def test_turn_credit_needs_the_episodes_and_refuses_what_it_does_not_support():
    batch, context = _batch_and_context([recorded(1)], episodes=None)
    # Without episodes, only a sampler that continues episodes (a rollout_func's continuation_func) may take the batch.
    with pytest.raises(ValueError, match=r"context.episodes is None, and the sampler continues plain text"):
        VinePPOEstimator(num_rollouts=2, step_segmenter="newline").estimate(batch, context)
    batch, _ = _batch_and_context([recorded(1)])
    _, context = _batch_and_context([recorded(1), recorded(2)])
    with pytest.raises(ValueError, match=r"context.episodes holds 2 episodes for a batch of 1 responses"):
        VinePPOEstimator(num_rollouts=2, step_segmenter=ONE_STEP).estimate(batch, context)


class NoEngine:
    def sample(self, requests):
        raise AssertionError("only the main process may sample in vLLM server mode")


def _no_engine():
    return contextlib.nullcontext(NoEngine())


def ONE_STEP(text):  # noqa: N802 - a segmenter: each model turn is one step
    return [text]


def test_server_mode_main_process_continues_every_process_episodes_and_sends_each_its_credit():
    """vLLM server mode (only the main process samples), two processes simulated in one: the main process gathers
    both processes' episodes, continues them all in one run, and each process gets exactly the credit a single
    process estimating all four episodes gives its own (the same draws, in the same order); the other process
    never samples."""
    import dataclasses

    ours, theirs = [recorded(1), recorded(2)], [recorded(0), recorded(3)]
    k = 4
    reference = VinePPOEstimator(num_rollouts=k, step_segmenter=ONE_STEP).estimate(
        *_batch_and_context(ours + theirs)
    )
    sent = []

    def payload(episodes):  # what a process sends the main process: its trajectories and its pooled extras
        batch, context = _batch_and_context(episodes)
        estimator = VinePPOEstimator(num_rollouts=k, step_segmenter=ONE_STEP)
        return estimator._trajectories(batch, context, context.episodes)[:2]

    parts = [payload(ours), payload(theirs)]

    def on(index, episodes, sampler_seed):
        batch, context = _batch_and_context(episodes, seed=sampler_seed, sample_on_main_only=True)
        return batch, dataclasses.replace(
            context,
            policy_sampler=context.policy_sampler if index == 0 else _no_engine,
            process_index=index,
            num_processes=2,
            gather_object=lambda obj: list(parts),
            broadcast_object=lambda obj: sent.append(obj) or obj if index == 0 else sent[-1],
        )

    main = VinePPOEstimator(num_rollouts=k, step_segmenter=ONE_STEP).estimate(*on(0, ours, sampler_seed=3))
    other = VinePPOEstimator(num_rollouts=k, step_segmenter=ONE_STEP).estimate(
        *on(1, theirs, sampler_seed=99)
    )
    assert main.values == reference.values[:2] and other.values == reference.values[2:]
    assert torch.equal(main.advantages, reference.advantages[:2, : main.advantages.shape[1]])
    assert torch.equal(other.advantages, reference.advantages[2:, : other.advantages.shape[1]])
    # The main process did all the work and carries the statistics (as for single-turn responses): summed over
    # processes, every rollout once.
    assert main.metrics["rollouts"] == reference.metrics["rollouts"] and "rollouts" not in other.metrics


def test_server_mode_main_process_failure_reaches_every_process():
    import dataclasses

    batch, context = _batch_and_context([recorded(1)], sample_on_main_only=True)
    context = dataclasses.replace(
        context,
        policy_sampler=_no_engine,
        num_processes=2,
        gather_object=lambda obj: [obj[0], obj[0]],
        broadcast_object=lambda obj: obj,
    )
    with pytest.raises(AssertionError, match="only the main process may sample"):
        VinePPOEstimator(num_rollouts=2, step_segmenter=ONE_STEP).estimate(batch, context)
    other = dataclasses.replace(context, process_index=1, broadcast_object=lambda obj: ("error", "boom"))
    with pytest.raises(RuntimeError, match="Monte Carlo estimation failed on the main process: boom"):
        VinePPOEstimator(num_rollouts=2, step_segmenter=ONE_STEP).estimate(batch, other)


def test_hybrid_process_without_chosen_rows_still_takes_part_in_server_sampling():
    """With a vLLM server and two processes, a process whose groups are not degenerate (nothing to estimate) still
    joins the main process' collective call, with no episodes; alone (one process) it calls nothing."""
    import dataclasses

    calls = []
    episodes = [recorded(1), recorded(2)]  # rewards 1 and 2: one group that is not degenerate
    batch, context = _batch_and_context(episodes, sample_on_main_only=True)
    estimator = HybridEstimator(budget=10.0, num_rollouts=2, step_segmenter=ONE_STEP)
    result = estimator.estimate(
        batch, dataclasses.replace(context, gather_object=lambda obj: calls.append(obj) or obj)
    )
    assert calls == [] and estimator.last_rows == []
    two = dataclasses.replace(
        context,
        policy_sampler=_no_engine,
        process_index=1,
        num_processes=2,
        gather_object=lambda obj: calls.append(obj) or [([], []), obj[0]],
        broadcast_object=lambda obj: ("ok", [None, MCEstimate([], [], [], None, [])]),
    )
    joined = estimator.estimate(batch, two)
    assert calls == [[([], [])]]  # it sent its (empty) share of trajectories
    assert torch.equal(joined.advantages, result.advantages)  # GRPO's, untouched


@pytest.mark.parametrize(
    "setting,value",
    [
        ("reuse_samples", True),
        ("allocation", "variance"),
        ("max_estimated_steps", 2),
        ("truncated_reward", 0.0),
        ("min_step_tokens", 4),
        ("rollout_budget", "fixed"),
    ],
)
def test_the_trainer_takes_every_monte_carlo_setting_with_agents_and_refuses_a_bare_rollout_func(
    setting, value
):
    extra = {"fixed_rollout_budget": 16} if setting == "rollout_budget" else {}
    estimator = VinePPOEstimator(num_rollouts=2, **{setting: value}, **extra)
    check_agent_kwargs({"environment_factory": Counter}, estimator, 64)
    check_agent_kwargs({"tools": [print]}, estimator, 64)
    with pytest.raises(
        NotImplementedError, match=r"'vineppo' needs continuation_func= next to rollout_func="
    ):
        check_agent_kwargs({"rollout_func": print}, estimator, 64)


def _one_step(text):
    return [text]


def test_hybrid_gives_the_chosen_episodes_of_degenerate_groups_vineppos_turn_credit():
    """Groups of 2: group 0 is degenerate (1 tool round each, reward 1), group 1 is not (2 and 1 rounds). A chosen
    episode's credit is exactly what "vineppo" gives the same episodes with the same engine draws; the others keep
    GRPO's advantage; tool-result tokens get 0 and no weight."""
    episodes = [recorded(1), recorded(1), recorded(2), recorded(1)]
    batch, context = _batch_and_context(episodes, group_size=2, seed=5)
    hybrid = HybridEstimator(budget=10.0, scale_rewards="none", num_rollouts=3, step_segmenter=_one_step)
    result = hybrid.estimate(batch, context)

    assert hybrid.last_rows == [0, 1] and hybrid.monte_carlo.last_rows == [0, 1]
    sub_batch, sub_context = _batch_and_context(episodes[:2], seed=5)  # the chosen episodes, the same draws
    vineppo = VinePPOEstimator(num_rollouts=3, step_segmenter=_one_step)
    expected = vineppo.estimate(sub_batch, sub_context)
    width = expected.advantages.shape[1]
    assert torch.equal(result.advantages[:2, :width], expected.advantages)
    assert not result.advantages[:2, width:].any()
    assert [c.values for c in hybrid.monte_carlo.last_turn_credit] == expected.values
    assert result.advantages[:2].any()  # the turn credit is not all zero (the Counter's calls vary)
    grpo = GRPOEstimator(scale_rewards="none").estimate(batch, context)
    assert torch.equal(result.advantages[2:], grpo.advantages[2:])
    assert set(result.advantages[2][batch.tool_mask[2] == 1].tolist()) == {0.5}
    model_tokens = batch.completion_mask.bool() & batch.tool_mask.bool()
    assert not result.advantages[~model_tokens].any()
    assert torch.equal(result.token_mask, model_tokens)
    assert result.metrics["responses_estimated"] == 2 and result.metrics["generated_tokens"] > 0


def test_hybrid_predicts_an_episodes_cost_from_its_turn_states_and_buys_what_it_can():
    """An episode of one tool round (7 tokens, the model's second turn starting at 5) has two states: K x (7 + 2)
    predicted tokens, not the K x 7 of one state a single-turn reading would give. A budget of 30 tokens (K = 2)
    takes the first episode offered whole (18), and of the second only its last state (K x 2 = 4: 18 + 18 > 30);
    the steps before that state get no credit and its first state is not estimated (NaN)."""
    episodes = [recorded(1), recorded(1), recorded(2), recorded(1)]
    batch, context = _batch_and_context(episodes, group_size=2)
    tokens = sum(len(e.completion_ids) for e in episodes)
    hybrid = HybridEstimator(
        budget=30 / tokens, scale_rewards="none", num_rollouts=2, step_segmenter=_one_step
    )
    result = hybrid.estimate(batch, context)
    assert len(hybrid.last_rows) == 2
    assert result.metrics["predicted_tokens"] == 2 * (7 + 2) + 2 * 2 and result.metrics["states_skipped"] == 1
    credits = hybrid.monte_carlo.last_turn_credit
    assert all(c.boundaries == [0, 5, 7] for c in credits)
    whole, end = sorted(credits, key=lambda c: math.isnan(c.values[0]))
    assert whole.rollouts == 2 * 2 and not math.isnan(whole.values[0])
    assert end.rollouts == 2 and math.isnan(end.values[0]) and end.advantages[:5] == [0.0] * 5
    assert any(end.advantages[5:])  # its last turn is credited: R - V(S_1)


def test_hybrid_needs_the_episodes_and_refuses_what_turn_credit_does_not_support():
    batch, context = _batch_and_context([recorded(1), recorded(1)], episodes=None)
    with pytest.raises(
        ValueError,
        match=r"VinePPOEstimator: the batch has a tool_mask .* context.episodes is None, and the sampler",
    ):
        HybridEstimator(budget=10.0, step_segmenter=_one_step).estimate(batch, context)
    check_agent_kwargs(
        {"tools": [print], "environment_factory": Counter}, HybridEstimator(), 64
    )  # defaults pass
    with pytest.raises(
        NotImplementedError,
        match=r"advantage_estimator='hybrid' needs continuation_func= next to rollout_func=",
    ):
        check_agent_kwargs({"rollout_func": print}, HybridEstimator(), 64)
    check_agent_kwargs({"environment_factory": Counter}, HybridEstimator(max_estimated_steps=2), 64)


def test_a_step_budget_with_spread_states_is_taken_for_agents():
    """Issue 53 met ``mc_steps_after_cap="spread"`` refused for agents; every step-budget setting works on agent
    episodes now, and the config names the cap it needs."""
    from mcadvantage import VinePPOConfig

    with pytest.raises(ValueError, match=r"mc_steps_after_cap='spread'"):
        VinePPOConfig(output_dir="unused", mc_steps_after_cap="spread")
    check_agent_kwargs(
        {"environment_factory": Counter},
        VinePPOEstimator(max_estimated_steps=8, steps_after_cap="spread", step_segmenter="newline"),
        64,
    )
