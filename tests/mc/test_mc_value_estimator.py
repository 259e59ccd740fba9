"""MCValueEstimator on the toy policy (FakeSampler), whose true state values are known exactly.

Toy policy: from a prefix, a continuation emits "Y" (success) with probability p = d / 10, where d
is the last digit character of the prefix (p = 0.5 when there is none), else "N", then EOS.
OutcomeReward("Y") gives 1 when the response text ends with "Y", so V(S) = p(S) exactly.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from mcadvantage.mc.estimator import MCValueEstimator, Trajectory
from mcadvantage.mc.planning import plan_states
from mcadvantage.samplers.base import Continuation, RolloutRequest
from mcadvantage.testing import FakeSampler, OutcomeReward


@pytest.fixture(scope="module")
def tok():
    from mcadvantage.testing import build_char_tokenizer

    return build_char_tokenizer()


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def digit_prob(tok):
    digit_of = {ids(tok, str(d))[0]: d for d in range(10)}

    def p(prefix: tuple[int, ...]) -> float:
        for t in reversed(prefix):
            if t in digit_of:
                return digit_of[t] / 10
        return 0.5

    return p


def make_sampler(tok, seed=0, **kw) -> FakeSampler:
    kw.setdefault("success_prob", digit_prob(tok))
    return FakeSampler(
        success_token_id=ids(tok, "Y")[0],
        failure_token_id=ids(tok, "N")[0],
        eos_token_id=tok.eos_token_id,
        seed=seed,
        **kw,
    )


def traj(
    tok, prompt: str, steps: list[str], reward: float, eos=True, fields=None, prompt_obj=None
) -> Trajectory:
    """A trajectory whose completion is the concatenation of ``steps`` (+ EOS in the last step)."""
    completion: list[int] = []
    bounds = [0]
    for s in steps:
        completion += ids(tok, s)
        bounds.append(len(completion))
    if eos and steps:
        completion.append(tok.eos_token_id)
        bounds[-1] = len(completion)
    return Trajectory(
        prompt_ids=ids(tok, prompt),
        completion_ids=completion,
        step_boundaries=bounds,
        reward=reward,
        prompt=prompt if prompt_obj is None else prompt_obj,
        fields=dict(fields or {}),
    )


# ----------------------------------------------------------------------------- statistics


def _excess_kurtosis_binomial_mean(p: float, k: int) -> float:
    # The estimate is Binomial(k, p) / k; excess kurtosis of a binomial is (1 - 6p(1-p)) / (k p (1-p)).
    return (1 - 6 * p * (1 - p)) / (k * p * (1 - p))


@pytest.mark.parametrize("k", [1, 3, 9])
def test_estimates_are_unbiased_with_variance_p_q_over_k(tok, k):
    # R independent copies of one response (distinct 3-letter prompt prefixes keep the states apart
    # from dedup, the digit "3" sets p(S_0) = 0.3) estimated in ONE call; steps "7\n", "1\n", "Y".
    # True values: V(S_0)=0.3, V(S_1)=0.7, V(S_2)=0.1.
    reps = 3000
    letters = "abcdefghijklmnopqrstuvwxyz"
    codes = [a + b + c for a in letters for b in letters for c in letters][:reps]
    batch = [traj(tok, f"{code} Q3:", ["7\n", "1\n", "Y"], 1.0) for code in codes]
    est = MCValueEstimator(
        make_sampler(tok, seed=k), OutcomeReward("Y"), tok, num_rollouts=k, max_completion_length=16
    )
    out = est.estimate(batch)
    assert out.stats["unique_states"] == 3 * reps
    for i, p in enumerate([0.3, 0.7, 0.1]):
        xs = [v[i] for v in out.values]
        var_true = p * (1 - p) / k
        # Mean of R estimates: standard error sqrt(var_true / R); 5 SE leaves a 6e-7 chance of a
        # false failure per check.
        se = math.sqrt(var_true / reps)
        assert abs(statistics.fmean(xs) - p) < 5 * se, (i, statistics.fmean(xs), p)
        # Sample variance of R draws: Var(s^2) ~= sigma^4 (2 / (R - 1) + kappa / R) with kappa the
        # excess kurtosis; allow 5 of its standard deviations.
        rel_sd = math.sqrt(2 / (reps - 1) + _excess_kurtosis_binomial_mean(p, k) / reps)
        assert abs(statistics.variance(xs) / var_true - 1) < 5 * rel_sd, (
            i,
            statistics.variance(xs),
            var_true,
        )


def test_variance_falls_like_one_over_k(tok):
    # var(K=1) / var(K=9) must be 9 for Bernoulli rollouts (p(1-p) vs p(1-p)/9). With R = 4000
    # repetitions at p = 0.3 the relative SD of each sample variance is
    # sqrt(2/R + kappa/R): 1.4% (K=1) and 2.2% (K=9), so the ratio's is ~2.6%; the band 9 +- 15%
    # ([7.65, 10.35]) is ~5.8 of its SDs.
    reps = 4000
    letters = "abcdefghijklmnopqrstuvwxyz"
    codes = [a + b + c for a in letters for b in letters for c in letters][:reps]
    batch = [traj(tok, f"{code} Q3:", ["Y"], 1.0) for code in codes]
    variances = {}
    for k in (1, 9):
        est = MCValueEstimator(
            make_sampler(tok, seed=100 + k), OutcomeReward("Y"), tok, num_rollouts=k, max_completion_length=8
        )
        variances[k] = statistics.variance([v[0] for v in est.estimate(batch).values])
    ratio = variances[1] / variances[9]
    assert 7.65 < ratio < 10.35, ratio


def test_same_seed_reproduces_the_estimate_and_rollouts_are_independent(tok):
    batch = [traj(tok, "Q5:", ["4\n", "Y"], 1.0), traj(tok, "Q6:", ["2\n", "N"], 0.0)]
    a = MCValueEstimator(
        make_sampler(tok, seed=7), OutcomeReward("Y"), tok, num_rollouts=9, max_completion_length=8
    )
    b = MCValueEstimator(
        make_sampler(tok, seed=7), OutcomeReward("Y"), tok, num_rollouts=9, max_completion_length=8
    )
    assert a.estimate(batch).values == b.estimate(batch).values
    # independent rollouts: the 9 continuations of one request are not all copies of one draw
    s = make_sampler(tok, seed=3, success_prob=0.5)
    conts = s.sample([RolloutRequest((5, 6), n=64, max_tokens=4)])[0]
    assert 10 < sum(c.token_ids[0] == ids(tok, "Y")[0] for c in conts) < 54


# ----------------------------------------------------------------------------- dedup


def test_eight_responses_to_one_prompt_issue_one_request_for_the_prompt_state(tok):
    steps = [
        ["1\n", "2\n", "Y"],
        ["1\n", "2\n", "N"],
        ["1\n", "3\n", "Y"],
        ["1\n", "Y"],
        ["4\n", "Y"],
        ["4\n", "2\n", "N"],
        ["1\n", "2\n", "Y"],  # identical to the first response
        ["9\n", "Y"],
    ]
    batch = [traj(tok, "Q8:", s, 1.0 if s[-1] == "Y" else 0.0) for s in steps]
    sampler = make_sampler(tok)
    est = MCValueEstimator(sampler, OutcomeReward("Y"), tok, num_rollouts=3, max_completion_length=16)
    out = est.estimate(batch)

    assert len(sampler.calls) == 1  # every rollout of the batch in one sampler call
    requests = sampler.calls[0]
    prefixes = [r.prefix_ids for r in requests]
    p = tuple(ids(tok, "Q8:"))
    expected = {p, p + tuple(ids(tok, "1\n")), p + tuple(ids(tok, "1\n2\n")), p + tuple(ids(tok, "1\n3\n"))}
    expected |= {p + tuple(ids(tok, "4\n")), p + tuple(ids(tok, "4\n2\n")), p + tuple(ids(tok, "9\n"))}
    assert prefixes.count(p) == 1
    assert len(prefixes) == len(set(prefixes)) == len(expected)
    assert set(prefixes) == expected
    assert all(r.n == 3 for r in requests)
    states = sum(len(s) for s in steps)  # 3+3+3+2+2+3+3+2 = 21 non-terminal states
    assert out.stats["states"] == states == 21
    assert out.stats["unique_states"] == 7 and out.stats["requests"] == 7
    assert out.stats["rollouts"] == 21
    assert out.stats["dedup_ratio"] == pytest.approx(1 - 7 / 21)
    # shared states share one value
    assert out.values[0][0] == out.values[4][0] == out.values[7][0]
    assert out.values[0][1] == out.values[2][1] == out.values[3][1]
    assert out.values[0][:3] == out.values[6][:3]


def test_same_tokens_with_other_prompts_or_fields_are_not_merged(tok):
    batch = [
        traj(tok, "Q3:", ["1\n", "Y"], 1.0, fields={"answer": "1"}),
        traj(tok, "Q4:", ["1\n", "Y"], 1.0, fields={"answer": "1"}),
        traj(tok, "Q3:", ["1\n", "Y"], 1.0, fields={"answer": "2"}),  # same tokens, other gold answer
        traj(tok, "Q3:", ["1\n", "N"], 0.0, fields={"answer": "1"}),  # shares S_0 and S_1 with row 0
    ]
    plan = plan_states(batch)
    assert len(plan.unique) == 6
    assert plan.state_index[0] == plan.state_index[3]
    assert plan.state_index[0] != plan.state_index[2]


def test_empty_completions_are_never_sampled(tok):
    batch = [traj(tok, "Q3:", [], 0.25), traj(tok, "Q4:", [], 1.0)]
    sampler = make_sampler(tok)
    out = MCValueEstimator(sampler, OutcomeReward("Y"), tok, max_completion_length=8).estimate(batch)
    assert sampler.calls == []
    assert out.values == [[0.25], [1.0]]
    assert out.step_advantages == [[], []]
    assert [t.shape for t in out.token_advantages] == [(0,), (0,)]
    assert out.stats["rollouts"] == 0 and out.stats["dedup_ratio"] == 0.0


# ----------------------------------------------------------------------------- exact values


def test_values_and_advantages_exact_with_deterministic_policy(tok):
    # A deterministic policy (p in {0, 1}) makes every value exact: success iff the prefix ends
    # with "+" or ":".
    def p(prefix):
        text = tok.decode(prefix)
        return 1.0 if text.endswith(("+", ":")) else 0.0

    sampler = make_sampler(tok, success_prob=p)
    # steps "a+" (S_1 ends with "+": V=1), "b-" (S_2: V=0), "Y"; prompt ends with ":" -> V(S_0)=1
    t = traj(tok, "Q:", ["a+", "b-", "Y"], 1.0)
    out = MCValueEstimator(
        sampler, OutcomeReward("Y"), tok, num_rollouts=4, max_completion_length=10
    ).estimate([t])
    assert out.values == [[1.0, 1.0, 0.0, 1.0]]
    assert out.step_advantages == [[0.0, -1.0, 1.0]]
    assert out.token_advantages[0].tolist() == [0.0, 0.0, -1.0, -1.0, 1.0, 1.0]  # "Y" + EOS
    assert math.fsum(out.step_advantages[0]) == out.values[0][-1] - out.values[0][0]


def test_first_state_estimates_only_the_later_states_and_zeroes_the_steps_before(tok):
    """``Trajectory.first_state`` (what the hybrid's budget buys): no continuation from the states before it, their
    values NaN, their steps' tokens 0; the later states exactly as without it."""
    import dataclasses

    def p(prefix):
        return 1.0 if tok.decode(prefix).endswith(("+", ":")) else 0.0

    t = traj(tok, "Q:", ["a+", "b-", "Y"], 1.0)
    sampler = make_sampler(tok, success_prob=p)
    est = MCValueEstimator(sampler, OutcomeReward("Y"), tok, num_rollouts=4, max_completion_length=10)
    out = est.estimate([dataclasses.replace(t, first_state=2)])
    assert [r.prefix_ids for r in sampler.calls[0]] == [tuple(ids(tok, "Q:a+b-"))]
    assert math.isnan(out.values[0][0]) and math.isnan(out.values[0][1]) and out.values[0][2:] == [0.0, 1.0]
    assert out.step_advantages == [[0.0, 0.0, 1.0]]
    assert out.token_advantages[0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    with pytest.raises(
        ValueError, match=r"trajectories\[0\].first_state=3 is not a state of the response: it has 3"
    ):
        est.estimate([dataclasses.replace(t, first_state=3)])


def test_max_estimated_steps_merges_the_tail_into_one_step(tok):
    sampler = make_sampler(tok)
    t = traj(tok, "Q2:", ["4\n", "6\n", "8\n", "Y"], 1.0)  # 4 steps, boundaries [0,2,4,6,8]
    est = MCValueEstimator(
        sampler, OutcomeReward("Y"), tok, num_rollouts=2, max_completion_length=12, max_estimated_steps=2
    )
    out = est.estimate([t])
    prefixes = [r.prefix_ids for r in sampler.calls[0]]
    assert prefixes == [tuple(ids(tok, "Q2:")), tuple(ids(tok, "Q2:4\n"))]
    v0, v1, r = out.values[0]
    assert r == 1.0
    assert out.step_advantages[0] == [v1 - v0, r - v1]
    assert out.token_advantages[0].tolist() == pytest.approx([v1 - v0] * 2 + [r - v1] * 6)
    assert sum(out.step_advantages[0]) == pytest.approx(r - v0)


# ----------------------------------------------------------------------------- budgets


def test_remaining_budget_is_max_completion_length_minus_prefix(tok):
    sampler = make_sampler(tok)
    t = traj(tok, "Q1:", ["12\n", "345\n", "Y"], 1.0)  # boundaries [0, 3, 7, 9]
    MCValueEstimator(sampler, OutcomeReward("Y"), tok, num_rollouts=2, max_completion_length=20).estimate([t])
    assert [r.max_tokens for r in sampler.calls[0]] == [20, 17, 13]


def test_fixed_budget_is_the_same_fresh_budget_everywhere(tok):
    sampler = make_sampler(tok)
    t = traj(tok, "Q1:", ["12\n", "345\n", "Y"], 1.0)
    est = MCValueEstimator(
        sampler,
        OutcomeReward("Y"),
        tok,
        num_rollouts=2,
        rollout_budget="fixed",
        fixed_rollout_budget=5,
        max_completion_length=8,
    )
    est.estimate([t])
    assert [r.max_tokens for r in sampler.calls[0]] == [5, 5, 5]


def test_truncated_rollouts_are_graded_or_get_the_fixed_reward(tok):
    # p = 1 everywhere; a full continuation is 4 fillers + "Y" + EOS = 6 tokens.
    t = traj(tok, "Q:", ["ab", "cd", "Y"], 1.0)  # boundaries [0, 2, 4, 6]; budgets 8, 6, 4 below
    filler = {"filler_token_id": ids(tok, "_")[0], "num_filler_tokens": 4, "success_prob": 1.0}

    graded = MCValueEstimator(
        make_sampler(tok, **filler), OutcomeReward("Y"), tok, num_rollouts=3, max_completion_length=8
    )
    out = graded.estimate([t])
    # S_0 and S_1 fit the whole continuation (V=1); S_2's 4-token budget cuts it before "Y" -> graded 0.
    assert out.values[0] == [1.0, 1.0, 0.0, 1.0]
    assert out.stats["truncated_rollouts"] == 3

    fixed = MCValueEstimator(
        make_sampler(tok, **filler),
        OutcomeReward("Y"),
        tok,
        num_rollouts=3,
        max_completion_length=8,
        truncated_reward=0.25,
    )
    out = fixed.estimate([t])
    assert out.values[0] == [1.0, 1.0, 0.25, 1.0]
    assert out.stats["truncated_rollouts"] == 3 and out.stats["rollouts"] == 9


def test_state_without_budget_is_graded_as_the_truncated_prefix(tok):
    # max_completion_length=3 is shorter than this 6-token completion: S_2 (4 tokens in) has no
    # budget left, so it is not sampled; its value is the grade of "aYbY" itself (ends with Y: 1).
    t = traj(tok, "Q0:", ["aY", "bY", "c"], 0.0)  # boundaries [0, 2, 4, 6]
    sampler = make_sampler(tok)
    out = MCValueEstimator(
        sampler, OutcomeReward("Y"), tok, num_rollouts=2, max_completion_length=3
    ).estimate([t])
    assert [r.max_tokens for r in sampler.calls[0]] == [3, 1]
    assert out.values[0][2] == 1.0
    assert out.stats["unsampled_states"] == 1 and out.stats["requests"] == 2
    sampler = make_sampler(tok)
    out = MCValueEstimator(
        sampler, OutcomeReward("Y"), tok, num_rollouts=2, max_completion_length=3, truncated_reward=0.0
    ).estimate([t])
    assert out.values[0][2] == 0.0


# ----------------------------------------------------------------------------- reward calls


def test_reward_functions_get_trl_style_arguments_standard(tok):
    reward = OutcomeReward("Y")
    sampler = make_sampler(tok, success_prob=1.0)
    batch = [
        traj(tok, "Q1:", ["x\n", "Y"], 1.0, fields={"answer": "7", "level": 3}),
        traj(tok, "Q2:", ["z\n", "Y"], 1.0, fields={"answer": "8"}),  # no "level" column
    ]
    MCValueEstimator(sampler, reward, tok, num_rollouts=2, max_completion_length=8).estimate(
        batch, reward_kwargs={"trainer_state": "state"}
    )
    assert len(reward.calls) == 1  # all rollouts graded in one call
    call = reward.calls[0]
    # states in order: Q1/S_0, Q1/S_1, Q2/S_0, Q2/S_1; 2 rollouts each ("Y" + EOS)
    assert call["prompts"] == ["Q1:"] * 4 + ["Q2:"] * 4
    assert call["completions"] == ["Y", "Y", "x\nY", "x\nY", "Y", "Y", "z\nY", "z\nY"]
    y, eos = ids(tok, "Y")[0], tok.eos_token_id
    assert call["completion_ids"][2] == ids(tok, "x\n") + [y, eos]
    assert call["answer"] == ["7"] * 4 + ["8"] * 4
    assert call["level"] == [3] * 4 + [None] * 4
    assert call["trainer_state"] == "state"


def test_reward_functions_get_conversational_completions(tok):
    reward = OutcomeReward("Y")
    sampler = make_sampler(tok, success_prob=0.0)
    messages = [{"role": "user", "content": "Q?"}]
    t = traj(tok, "user: Q?\nassistant: ", ["k\n", "N"], 0.0, prompt_obj=messages, fields={"answer": "1"})
    out = MCValueEstimator(sampler, reward, tok, num_rollouts=1, max_completion_length=8).estimate([t])
    call = reward.calls[0]
    assert call["prompts"] == [messages, messages]
    assert call["completions"] == [
        [{"role": "assistant", "content": "N"}],
        [{"role": "assistant", "content": "k\nN"}],
    ]
    assert out.values[0] == [0.0, 0.0, 0.0]


def test_multiple_reward_functions_weighted_nan_safe_sum(tok):
    def only_success(completions, **kw):  # None when it cannot score
        return [1.0 if c.endswith("Y") else None for c in completions]

    def constant(completions, **kw):
        return [1.0] * len(completions)

    def p(prefix):
        return 1.0 if tok.decode(prefix).endswith(":") else 0.0

    t = traj(tok, "Q:", ["a\n", "Y"], 2.5)
    est = MCValueEstimator(
        make_sampler(tok, success_prob=p),
        [only_success, constant],
        tok,
        num_rollouts=2,
        reward_weights=[2.0, 0.5],
        max_completion_length=8,
    )
    out = est.estimate([t])
    # S_0: success -> 2*1 + 0.5*1 = 2.5; S_1: failure -> None skipped -> 0.5*1 = 0.5
    assert out.values[0] == [2.5, 0.5, 2.5]

    def never(completions, **kw):
        return [None] * len(completions)

    out = MCValueEstimator(make_sampler(tok), never, tok, num_rollouts=2, max_completion_length=8).estimate(
        [t]
    )
    assert out.values[0][:2] == [0.0, 0.0]  # nansum of nothing is 0, as in TRL
    assert out.stats["unscorable_rollouts"] == 4


def test_decodes_concatenated_ids_so_split_characters_survive():
    # A byte-level tokenizer splits "é" into two tokens; the prefix ends with the first byte and
    # the continuation starts with the second. Decoding the pieces separately would give two
    # replacement characters instead of "é".
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(byte_chars)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    btok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    e_acute = btok("é", add_special_tokens=False)["input_ids"]
    assert len(e_acute) == 2
    x = btok("x", add_special_tokens=False)["input_ids"]

    class SplitSampler:
        def sample(self, requests):
            return [[Continuation((e_acute[1], 0), False)] * r.n for r in requests]

    reward = OutcomeReward("é")
    t = Trajectory(
        prompt_ids=x,
        completion_ids=[e_acute[0], e_acute[1], 0],
        step_boundaries=[0, 1, 3],
        reward=1.0,
        prompt="x",
    )
    out = MCValueEstimator(SplitSampler(), reward, btok, num_rollouts=1, max_completion_length=4).estimate(
        [t]
    )
    assert reward.calls[0]["completions"][1] == "é"
    assert out.values[0][1] == 1.0


def test_fast_decoding_equals_batch_decode_and_falls_back_when_transformers_post_processes(tok):
    """Rollouts are decoded through the Rust backend directly (skipping transformers' per-token
    input check) only where that gives exactly ``batch_decode(..., skip_special_tokens=True)``."""
    from transformers import PreTrainedTokenizerFast

    from mcadvantage.core.text import decode_batch as _decode_batch
    from mcadvantage.core.text import plain_fast_backend as _plain_fast_backend

    seqs = [ids(tok, "a b, c.") + [tok.eos_token_id], [tok.bos_token_id, *ids(tok, " x ?\n")], []]
    assert _plain_fast_backend(tok) is tok.backend_tokenizer  # fast path taken
    assert _decode_batch(tok, seqs) == tok.batch_decode(seqs, skip_special_tokens=True)
    assert _decode_batch(tok, seqs)[:2] == ["a b, c.", " x ?\n"]

    class CustomDecode(PreTrainedTokenizerFast):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return "custom"

    custom = CustomDecode(tokenizer_object=tok.backend_tokenizer, eos_token="</s>")
    assert _plain_fast_backend(custom) is None
    assert _decode_batch(custom, seqs[:2]) == ["custom", "custom"]

    cleaned = PreTrainedTokenizerFast(
        tokenizer_object=tok.backend_tokenizer, eos_token="</s>", clean_up_tokenization_spaces=True
    )
    assert _plain_fast_backend(cleaned) is None  # transformers decides how to clean up: not bypassed
    assert _decode_batch(cleaned, seqs) == cleaned.batch_decode(seqs, skip_special_tokens=True)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rollouts": 0}, "num_rollouts=0"),
        ({"max_completion_length": None}, "max_completion_length"),
        ({"fixed_rollout_budget": 5}, "fixed_rollout_budget=5"),
        ({"rollout_budget": "fixed"}, "fixed_rollout_budget"),
        ({"rollout_budget": "all"}, "rollout_budget='all'"),
        ({"max_estimated_steps": 0}, "max_estimated_steps=0"),
        ({"reward_weights": [1.0, 2.0]}, "reward_weights"),
    ],
)
def test_invalid_settings_name_the_parameter(tok, kwargs, match):
    base = {"num_rollouts": 9, "max_completion_length": 8}
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        MCValueEstimator(make_sampler(tok), OutcomeReward("Y"), tok, **base)


def test_invalid_trajectories_are_rejected(tok):
    est = MCValueEstimator(make_sampler(tok), OutcomeReward("Y"), tok, max_completion_length=8)
    bad = traj(tok, "Q:", ["ab", "Y"], 1.0)
    bad.step_boundaries = [0, 2, 2, 4]
    with pytest.raises(ValueError, match=r"trajectories\[0\].step_boundaries"):
        est.estimate([bad])
    short = traj(tok, "Q:", ["ab", "Y"], 1.0)
    short.step_boundaries = [0, 2]
    with pytest.raises(ValueError, match="completion length 4"):
        est.estimate([short])
    nan = traj(tok, "Q:", ["ab"], float("nan"))
    with pytest.raises(ValueError, match="reward"):
        est.estimate([nan])


def test_a_sampler_that_breaks_the_budget_is_caught(tok):
    class Greedy:
        def sample(self, requests):
            return [[Continuation(tuple([5] * (r.max_tokens + 1)), False)] * r.n for r in requests]

    est = MCValueEstimator(Greedy(), OutcomeReward("Y"), tok, num_rollouts=2, max_completion_length=4)
    with pytest.raises(RuntimeError, match="max_tokens=4"):
        est.estimate([traj(tok, "Q:", ["Y"], 1.0)])


def test_progress_bar(tok, capsys):
    est = MCValueEstimator(
        make_sampler(tok),
        OutcomeReward("Y"),
        tok,
        num_rollouts=2,
        max_completion_length=8,
        show_progress=True,
    )
    est.estimate([traj(tok, "Q:", ["a\n", "Y"], 1.0)])
    assert "MC values (2 states x 2)" in capsys.readouterr().err


def test_token_advantages_have_the_completion_length(tok):
    out = MCValueEstimator(
        make_sampler(tok), OutcomeReward("Y"), tok, num_rollouts=1, max_completion_length=16
    ).estimate([traj(tok, "Q7:", ["ab\n", "cd\n", "Y"], 1.0), traj(tok, "Q7:", ["N"], 0.0)])
    assert [t.shape[0] for t in out.token_advantages] == [8, 2]  # 3 + 3 + 1 + EOS; 1 + EOS
    assert all(t.dtype == torch.float32 for t in out.token_advantages)


def test_fake_sampler_cuts_at_the_budget_and_records_requests(tok):
    s = make_sampler(tok, success_prob=1.0, filler_token_id=ids(tok, "_")[0], num_filler_tokens=2)
    assert s.continuation_length == 4  # "_", "_", "Y", EOS
    full, cut = s.sample([RolloutRequest((5,), n=1, max_tokens=4), RolloutRequest((5,), n=2, max_tokens=3)])
    y, f = ids(tok, "Y")[0], ids(tok, "_")[0]
    assert full == [Continuation((f, f, y, tok.eos_token_id), False)]
    assert cut == [Continuation((f, f, y), True)] * 2
    assert [len(c) for c in s.calls] == [2]
    with pytest.raises(ValueError, match="success_prob returned 1.5"):
        make_sampler(tok, success_prob=1.5).sample([RolloutRequest((5,), n=1, max_tokens=2)])


def test_prompt_state_is_estimated_once_per_prompt(tok):
    batch = [traj(tok, f"Q{q}:", [f"{r}\n", "Y"], 1.0) for q in range(3) for r in range(4)]
    sampler = make_sampler(tok)
    MCValueEstimator(sampler, OutcomeReward("Y"), tok, num_rollouts=2, max_completion_length=8).estimate(
        batch
    )
    prefixes = [r.prefix_ids for r in sampler.calls[0]]
    for q in range(3):
        assert prefixes.count(tuple(ids(tok, f"Q{q}:"))) == 1
    assert len(prefixes) == 3 + 12  # 3 prompt states + 12 distinct first steps
