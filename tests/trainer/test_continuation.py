"""``continuation_func``: Monte Carlo credit for a ``rollout_func``'s episodes (issue 39 item 4).

A scripted ``rollout_func`` plays episodes with an environment observation inside (``env_mask`` 0) and an extra
field for the reward functions; a scripted ``continuation_func`` continues them. The tests check what it receives
(exact prefixes, budgets, rows, masks, repeated ``num_mc_rollouts`` times), the exact values it gives, that the
environment tokens never start a step and get advantage 0, that the sampler wrapper gives the same estimate as the
engine it wraps under several Monte Carlo settings, and that every misuse is refused with the parameter and the fix.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _helpers import tiny_config  # noqa: E402
from datasets import Dataset  # noqa: E402

from mcadvantage.testing import build_char_tokenizer, build_tiny_llama  # noqa: E402

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id
#: One episode: the model's turn "a\nb", the environment's observation "[o]" (env_mask 0), the model's turn "c\nd".
TURN_1, OBSERVATION, TURN_2 = "a\nb", "[o]", "c\nd"
COMPLETION = TOK(TURN_1 + OBSERVATION + TURN_2, add_special_tokens=False)["input_ids"] + [EOS]
ENV_MASK = [1] * len(TURN_1) + [0] * len(OBSERVATION) + [1] * (len(TURN_2) + 1)
MAX_COMPLETION_LENGTH = 24
K = 2


def scripted_rollout(prompts, trainer):
    """A ``rollout_func`` (TRL's contract): the same episode for every prompt, and an extra field for the rewards."""
    return {
        "prompt_ids": TOK(text=list(prompts))["input_ids"],
        "completion_ids": [list(COMPLETION) for _ in prompts],
        "logprobs": None,
        "env_mask": [list(ENV_MASK) for _ in prompts],
        "source": ["rollout"] * len(prompts),
    }


class ScriptedContinuation:
    """A ``continuation_func`` that records its requests and writes ``p % 3`` letters "z" then EOS after a prefix of
    ``p`` tokens, so the value of every state is known exactly."""

    def __init__(self):
        self.calls = []

    def __call__(self, requests, trainer):
        self.calls.append(list(requests))
        ids = [
            TOK("z" * (len(r.completion_ids) % 3), add_special_tokens=False)["input_ids"] + [EOS]
            for r in requests
        ]
        return {"completion_ids": ids, "source": ["continuation"] * len(requests)}


def z_count(completions, source, **kwargs):
    """Reward: the number of "z" in the text, plus 0.5 when the extra field says a continuation wrote it."""
    return [
        text.count("z") + 0.5 * (s == "continuation") for text, s in zip(completions, source, strict=True)
    ]


def _value(prefix_len: int) -> float:
    return prefix_len % 3 + 0.5


def _trainer(tmp_path, estimator="vineppo", config=None, **kwargs):
    from mcadvantage import VinePPOTrainer

    monte_carlo = estimator in ("vineppo", "hybrid")
    args = tiny_config(
        tmp_path,
        advantage_estimator=estimator,
        max_completion_length=MAX_COMPLETION_LENGTH,
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=2,
        logging_steps=1,
        disable_tqdm=True,
        **({"num_mc_rollouts": K, "step_segmenter": "newline"} if monte_carlo else {}),
        **(config or {}),
    )
    data = Dataset.from_dict({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]})
    return VinePPOTrainer(
        model=build_tiny_llama(TOK), reward_funcs=[z_count], args=args, train_dataset=data, processing_class=TOK,
        **kwargs,
    )  # fmt: skip


def test_vineppo_trains_rollout_func_episodes_through_the_continuation_func(tmp_path):
    continuation = ScriptedContinuation()
    trainer = _trainer(tmp_path, rollout_func=scripted_rollout, continuation_func=continuation)
    seen = []
    hook = trainer.compute_advantages
    trainer.compute_advantages = lambda batch: seen.append((batch, hook(batch))) or seen[-1][1]
    trainer.train()
    assert trainer.state.global_step == 2 and len(continuation.calls) == 2  # one call per batch (one wave)

    # States: the prompt, the newline inside turn 1, the first token after the observation, the newline inside turn 2.
    # Never a token of the observation (positions 3-5).
    bounds = [0, 2, 6, 8]
    requests = continuation.calls[0]
    prompts = seen[0][0].prompts
    # One state per prompt and prefix (the batch's two responses to a prompt share their states), each asked K times
    # in a row, as rollout_func's prompts are repeated per generation.
    assert len(requests) == len(set(prompts)) * len(bounds) * K
    for j in range(0, len(requests), K):
        assert requests[j : j + K] == [requests[j]] * K
    for j, request in enumerate(requests[::K]):
        prompt, p = sorted(set(prompts))[j // len(bounds)], bounds[j % len(bounds)]
        assert request.prompt == prompt
        assert request.prompt_ids == TOK(prompt)["input_ids"]
        assert request.completion_ids == COMPLETION[:p]
        assert request.env_mask == ENV_MASK[:p]
        assert request.max_tokens == MAX_COMPLETION_LENGTH - p
        assert request.row == {"prompt": prompt, "answer": {"1+1=": "2", "2+2=": "4"}[prompt]}  # no "source"

    # Exact values: every continuation of a state writes the same text, graded with the continuation's own field.
    result = trainer.last_advantage_result
    assert result.values == [[_value(b) for b in bounds] + [0.0]] * len(prompts)
    # Each model token gets its step's value change; the observation gets 0 and stays out of the whitening.
    want = [_value(2) - _value(0)] * 2 + [_value(6) - _value(2)] + [0.0] * 3 + [_value(8) - _value(6)] * 2
    want += [0.0 - _value(8)] * 2
    assert result.advantages[:, : len(COMPLETION)].tolist() == [want] * len(prompts)
    assert result.token_mask[:, : len(COMPLETION)].tolist() == [[bool(m) for m in ENV_MASK]] * len(prompts)
    batch, advantages = seen[0]
    assert not advantages[(batch.completion_mask.bool() & ~batch.tool_mask.bool())].any()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.parametrize(
    "budget,first_state",
    [
        (4.8, 0),
        (0.6, 2),
    ],  # the whole episode of both rows (2 x 48 predicted tokens of 20), or the last 2 states
)
def test_hybrid_credits_rollout_func_episodes_state_by_state_within_its_budget(tmp_path, budget, first_state):
    """Issue 52 item 3: ``"hybrid"`` takes ``rollout_func=`` + ``continuation_func=``, and its budget buys states,
    not whole responses. Every group is degenerate (the same episode, reward 0), so every row is offered the budget.
    One row costs ``K x (10 + 8 + 4 + 2) = 48`` predicted tokens; the batch samples 20. At budget 0.6 (12 tokens)
    a row's last two states fit (``K x (4 + 2)``): only its tokens from position 6 on get credit, the others 0."""
    continuation = ScriptedContinuation()
    trainer = _trainer(
        tmp_path,
        "hybrid",
        config={"hybrid_budget": budget},
        rollout_func=scripted_rollout,
        continuation_func=continuation,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    bounds = [0, 2, 6, 8]
    full = [_value(2) - _value(0)] * 2 + [_value(6) - _value(2)] + [0.0] * 3 + [_value(8) - _value(6)] * 2
    full += [0.0 - _value(8)] * 2
    start = bounds[first_state]
    want = [0.0] * start + full[start:]
    hybrid = trainer.advantage_estimator
    advantages = trainer.last_advantage_result.advantages[:, : len(COMPLETION)].tolist()
    estimated = 2 if first_state == 0 else 1  # at 0.6 the second row finds nothing left
    assert len(hybrid.last_rows) == estimated
    for r in range(2):
        assert advantages[r] == (want if r in hybrid.last_rows else [0.0] * len(COMPLETION))
    prefixes = {len(req.completion_ids) for req in continuation.calls[-1]}
    assert prefixes == set(bounds[first_state:])  # no continuation from a state it did not buy
    metrics = trainer.last_advantage_result.metrics
    assert metrics["states_skipped"] == first_state * estimated
    assert metrics["predicted_tokens"] == estimated * K * sum(10 - b for b in bounds[first_state:])


def _batch():
    """A batch of two single-turn responses to one prompt, for the estimator alone."""
    from mcadvantage.estimators import AdvantageBatch

    prompt_ids = TOK("q:")["input_ids"]
    completions = [TOK(t, add_special_tokens=False)["input_ids"] + [EOS] for t in ("a\nb\nc", "a\nd")]
    width = max(map(len, completions))
    mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    return AdvantageBatch(
        prompt_ids=[prompt_ids] * 2, completion_ids=completions, completion_mask=mask,
        rewards_per_func=torch.tensor([[1.0], [0.0]]), reward_weights=torch.tensor([1.0]), local_slice=slice(0, 2),
        group_size=2, prompts=["q:"] * 2, rows=[{"prompt": "q:"}] * 2,
    )  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"reuse_samples": True},
        {"rollout_budget": "fixed", "fixed_rollout_budget": 2, "truncated_reward": -1.0},
    ],
)
def test_continuation_sampler_estimates_exactly_as_the_engine_it_wraps(settings):
    """A continuation_func that calls a seeded engine on ``prompt_ids + completion_ids`` gives the estimate that
    engine gives directly, whatever the Monte Carlo settings."""
    from mcadvantage.estimators import EstimatorContext, VinePPOEstimator
    from mcadvantage.samplers import RolloutRequest
    from mcadvantage.testing import FakeSampler
    from mcadvantage.trainer.continuation import ContinuationSampler

    def engine():
        ids = TOK("xy", add_special_tokens=False)["input_ids"]
        return FakeSampler(lambda prefix: (len(prefix) % 4) / 4, success_token_id=ids[0], failure_token_id=ids[1],
                           eos_token_id=EOS, filler_token_id=ids[0], num_filler_tokens=1, seed=3)  # fmt: skip

    def reward(completions, **kwargs):
        return [float(text.endswith("x")) for text in completions]

    wrapped = engine()

    def continuation_func(requests, trainer):
        # The wrapped engine samples each request once: the same draws, in the same order, as n samples of one.
        asks = [RolloutRequest(tuple(r.prompt_ids + r.completion_ids), 1, r.max_tokens) for r in requests]
        return [list(c[0].token_ids) for c in wrapped.sample(asks)]

    results = []
    for sampler in (engine(), ContinuationSampler(continuation_func, None, [EOS])):
        estimator = VinePPOEstimator(num_rollouts=3, step_segmenter="newline", **settings)
        context = EstimatorContext.single_process(sampler, [reward], TOK, max_completion_length=16)
        results.append((estimator.estimate(_batch(), context), estimator.last_estimate.stats.rollouts))
    (direct, direct_rollouts), (continued, continued_rollouts) = results
    assert continued.values == direct.values and direct.values is not None
    assert torch.equal(continued.advantages, direct.advantages)
    assert continued_rollouts == direct_rollouts > 0


def _request(prefix_len=1, max_tokens=3):
    from mcadvantage.mc.trajectory import Trajectory
    from mcadvantage.samplers import RolloutRequest

    traj = Trajectory(
        prompt_ids=[5], completion_ids=[6, 7], step_boundaries=[0, 1, 2], reward=0.0, prompt="p"
    )
    return RolloutRequest((5, 6)[: 1 + prefix_len], n=2, max_tokens=max_tokens, origin=(traj, prefix_len))


@pytest.mark.parametrize(
    "output,required,error,message",
    [
        ({"ids": [[EOS]] * 2}, (), ValueError, r"returned a dict without 'completion_ids'"),
        ([[EOS]], (), ValueError, r"returned 1 completion_ids for 2 requests"),
        ([[9, 9, 9, EOS]] * 2, (), ValueError, r"returned 4 tokens for request 0, whose max_tokens is 3"),
        (
            {"completion_ids": [[EOS]] * 2},
            ("source",),
            ValueError,
            r"rollout_func returns \['source'\].*missing",
        ),
        (
            {"completion_ids": [[EOS]] * 2, "extra": 1},
            (),
            ValueError,
            r"not returned by rollout_func \['extra'\]",
        ),
        (
            {"completion_ids": [[EOS]] * 2, "source": ["a"]},
            ("source",),
            ValueError,
            r"1 values of 'source' for 2",
        ),
        ("oops", (), TypeError, r"returned str; return a dict"),
    ],
)
def test_continuation_outputs_that_break_the_contract_are_refused(output, required, error, message):
    from mcadvantage.trainer.continuation import ContinuationSampler

    sampler = ContinuationSampler(lambda requests, trainer: output, None, [EOS], required_fields=required)
    with pytest.raises(error, match=message):
        sampler.sample([_request()])


def test_continuations_are_truncated_without_eos_and_carry_their_fields():
    from mcadvantage.trainer.continuation import ContinuationSampler

    output = {"completion_ids": [[9, EOS], [9, 9]], "source": "continuation"}
    sampler = ContinuationSampler(lambda requests, trainer: output, None, [EOS], required_fields=("source",))
    [[ended, cut]] = sampler.sample([_request()])
    assert (ended.token_ids, ended.truncated, cut.truncated) == ((9, EOS), False, True)
    assert (
        ended.fields == cut.fields == {"source": "continuation"}
    )  # a non-list value is every request's (TRL's rule)


@pytest.mark.parametrize(
    "estimator,kwargs,error,message",
    [
        ("vineppo", {"rollout_func": scripted_rollout}, NotImplementedError, r"'vineppo' needs continuation_func="),
        ("hybrid", {"rollout_func": scripted_rollout}, NotImplementedError, r"'hybrid' needs continuation_func="),
        ("vineppo", {"continuation_func": ScriptedContinuation()}, ValueError, r"continuation_func= is given without "
         r"rollout_func=.*Drop continuation_func"),
        ("grpo", {"rollout_func": scripted_rollout, "continuation_func": ScriptedContinuation()}, ValueError,
         r"advantage_estimator='grpo', which samples no continuations.*drop continuation_func"),
        ("tree", {"rollout_func": scripted_rollout, "continuation_func": ScriptedContinuation(),
                  "config": {"tree_branching": [2]}}, ValueError,
         r"advantage_estimator='tree', which samples no continuations.*'vineppo' or 'hybrid'"),
        ("vineppo", {"rollout_func": scripted_rollout, "continuation_func": ScriptedContinuation(), "tools": [len]},
         ValueError, r"continuation_func= is given with tools=.*Drop continuation_func"),
        ("vineppo", {"rollout_func": scripted_rollout, "continuation_func": "g"}, TypeError,
         r"continuation_func='g' is not callable"),
        ("vineppo", {"rollout_func": scripted_rollout, "continuation_func": ScriptedContinuation(),
                     "mc_sampler": object()}, ValueError, r"continuation_func= and mc_sampler=.* Pass one"),
    ],
)  # fmt: skip
def test_misuses_are_refused_at_init_naming_the_parameter_and_the_fix(
    tmp_path, estimator, kwargs, error, message
):
    with pytest.raises(error, match=message):
        _trainer(tmp_path, estimator, **kwargs)


def test_environment_tokens_before_the_first_model_token_start_no_step():
    """A completion that opens with an observation: the prompt state, then the first model token, then the
    segmenter's boundary inside the model's run; the observation's tokens get advantage 0."""
    from mcadvantage.estimators import AdvantageBatch, EstimatorContext, VinePPOEstimator
    from mcadvantage.trainer.continuation import ContinuationSampler

    ids = TOK("[o]ab\ncd", add_special_tokens=False)["input_ids"] + [EOS]
    mask = [0, 0, 0] + [1] * 6
    batch = AdvantageBatch(
        prompt_ids=[TOK("q:")["input_ids"]], completion_ids=[ids], completion_mask=torch.ones(1, len(ids)),
        rewards_per_func=torch.tensor([[1.0]]), reward_weights=torch.tensor([1.0]), local_slice=slice(0, 1),
        group_size=1, prompts=["q:"], rows=[{"prompt": "q:"}], tool_mask=torch.tensor([mask]),
    )  # fmt: skip
    continuation = ScriptedContinuation()
    context = EstimatorContext.single_process(
        ContinuationSampler(continuation, None, [EOS], required_fields=("source",)), [z_count], TOK,
        max_completion_length=MAX_COMPLETION_LENGTH,
    )  # fmt: skip
    result = VinePPOEstimator(num_rollouts=1, step_segmenter="newline").estimate(batch, context)
    assert [len(r.completion_ids) for r in continuation.calls[0]] == [0, 3, 6]
    assert result.values == [[_value(0), _value(3), _value(6), 1.0]]
    assert result.advantages[0, :3].tolist() == [0.0] * 3 and not result.token_mask[0, :3].any()
    assert result.advantages[0, 3:].tolist() == [_value(6) - _value(3)] * 3 + [1.0 - _value(6)] * 3
