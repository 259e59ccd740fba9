"""The gradient-quality instrument, validated on an exact toy (:class:`~mcadvantage.testing.TabularStepPolicy`):

- its reference gradient matches the closed-form ``grad E[R]`` within its own standard error;
- a deliberately biased estimator is detected (``bias_ratio``), an unbiased one is not;
- its numbers do not depend on the repeat count beyond their intervals;
- every registered estimator runs through it, and the trainer's gradient is GRPO's dapo loss at ratio 1.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mcadvantage.estimators import GRPOEstimator, RLOOEstimator, VinePPOEstimator  # noqa: E402
from mcadvantage.estimators.base import AdvantageResult, sequence_to_token_advantages  # noqa: E402
from mcadvantage.estimators.baselines import rloo_advantages  # noqa: E402
from mcadvantage.evaluation.cost_model import cost_model_tokens  # noqa: E402
from mcadvantage.evaluation.gradient_instrument import (  # noqa: E402
    GradientTask,
    estimator_gradient,
    gradient_metrics,
    reference_gradient,
    weighted_logprob_gradient,
)
from mcadvantage.testing import build_char_tokenizer  # noqa: E402
from testbed.toys import TOY_LOGITS, characters, toy_gradient_task  # noqa: E402

P = [0.05, 0.3, 0.6, 0.9]
LOGITS = TOY_LOGITS


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def toy_task(tok, seed: int = 0, prompts: int = 16) -> GradientTask:
    """The exact toy: only the first two of 3 steps matter (pass rates ``P``)."""
    return toy_gradient_task(P, seed=seed, prompts=prompts)[0]


class PrefersA:
    """A deliberately biased estimator: RLOO's advantage plus a bonus on every ``a`` token."""

    whiten_by_default = False

    def __init__(self, a_token: int, bonus: float = 0.3) -> None:
        self.a_token, self.bonus = a_token, bonus

    def estimate(self, batch, context):
        adv = sequence_to_token_advantages(
            rloo_advantages(batch.all_rewards, batch.group_size), batch.completion_mask
        )
        for i, ids in enumerate(batch.completion_ids):
            for t, token in enumerate(ids):
                if token == self.a_token:
                    adv[i, t] += self.bonus
        return AdvantageResult(advantages=adv)


def _estimates(task, estimator, repeats: int, prompts: int = 4, group: int = 4):
    n = len(task.prompt_ids)
    return [
        estimator_gradient(task, estimator, [(r * prompts + j) % n for j in range(prompts)], group).gradient
        for r in range(repeats)
    ]


def test_weighted_logprob_gradient_hand_case(tok):
    task = toy_task(tok)
    policy = task.oracle
    ids = [[policy.step_token_ids[0], policy.step_token_ids[2], policy.step_token_ids[1], 0, 0]]
    weights = torch.tensor([[2.0, 0.0, 0.0, 5.0, 5.0]])  # only the first step token's weight can matter
    got = weighted_logprob_gradient(policy, [[1]], ids, weights).view(3, 3)
    p0 = torch.softmax(torch.tensor(LOGITS[0], dtype=torch.float64), -1)
    want = 2.0 * (
        torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64) - p0
    )  # d log softmax_0 / d logits = e_0 - p
    assert torch.allclose(got[0].double(), want, atol=1e-6)
    assert torch.equal(got[1:], torch.zeros(2, 3))


def test_reference_matches_the_closed_form_gradient_within_its_standard_error(tok):
    task = toy_task(tok, seed=1, prompts=32)
    exact = task.oracle.exact_gradient()
    ref = reference_gradient(task, responses_per_round=16, rounds=16)
    z = (ref.gradient - exact) / ref.standard_error
    # 9 coordinates: |z| < 4 for all has a false-alarm rate below 0.1%.
    assert float(z.abs().max()) < 4.0, z
    cosine = float(ref.gradient @ exact / (ref.gradient.norm() * exact.norm()))
    assert cosine > 0.98 and ref.split_half_cosine > 0.9
    assert ref.responses == 16 * 16 * 32 and 0 < ref.relative_standard_error < 0.2


def test_reference_reports_its_pass_rate_and_share_of_all_equal_groups(tok):
    """Every prompt of the toy has the same success probability p, so groups of 2 are all-equal with probability
    p^2 + (1 - p)^2 (about 0.5 here): both are checked within 4 standard errors over 32 x 16 groups."""
    task = toy_task(tok, seed=3, prompts=32)
    p = float(task.oracle.exact_objective())
    ref = reference_gradient(task, responses_per_round=2, rounds=16)
    n = 32 * 16 * 2
    assert abs(ref.mean_reward - p) < 4 * math.sqrt(p * (1 - p) / n)
    q = p**2 + (1 - p) ** 2
    assert abs(ref.degenerate_share - q) < 4 * math.sqrt(q * (1 - q) / (32 * 16))


@pytest.mark.slow
def test_a_biased_estimator_is_detected_and_unbiased_ones_are_not(tok):
    task = toy_task(tok, seed=2, prompts=64)
    exact = task.oracle.exact_gradient()
    a_token = task.oracle.step_token_ids[0]
    unbiased = gradient_metrics(_estimates(task, RLOOEstimator(), 200), exact)
    biased = gradient_metrics(_estimates(task, PrefersA(a_token), 200), exact)
    # Measured (seed 2, 200 repeats): RLOO bias_ratio 0.21, mean cosine 0.996; PrefersA bias_ratio 86, mean cosine
    # 0.00. For an unbiased estimator bias_ratio is about chi-square(~5 free coordinates) / 5 (RLOO over 6 other
    # seeds: 0.55-1.93, mean 1.13), so 4 is exceeded with probability ~0.1%.
    assert unbiased["bias_ratio"] < 4.0, unbiased
    assert biased["bias_ratio"] > 10.0, biased
    assert biased["mean_cosine"] < unbiased["mean_cosine"]
    assert unbiased["mean_cosine"] > 0.95


@pytest.mark.slow
def test_results_do_not_depend_on_the_repeat_count_beyond_their_intervals(tok):
    exact = toy_task(tok).oracle.exact_gradient()
    few = gradient_metrics(_estimates(toy_task(tok, seed=3, prompts=64), RLOOEstimator(), 40), exact)
    many = gradient_metrics(_estimates(toy_task(tok, seed=4, prompts=64), RLOOEstimator(), 160), exact)
    for key in ("cosine", "sign_agreement"):
        half_few = (few[f"{key}_ci"][1] - few[f"{key}_ci"][0]) / 2
        half_many = (many[f"{key}_ci"][1] - many[f"{key}_ci"][0]) / 2
        assert abs(few[key] - many[key]) < half_few + half_many, (key, few, many)
    # More repeats narrow the interval (about by sqrt(4) = 2).
    assert (many["cosine_ci"][1] - many["cosine_ci"][0]) < (few["cosine_ci"][1] - few["cosine_ci"][0])


def test_every_estimator_runs_through_the_instrument_and_reports_its_cost(tok):
    task = toy_task(tok, seed=5)
    exact = task.oracle.exact_gradient()
    rows = {}
    for name, estimator in {
        "grpo": GRPOEstimator(),
        "rloo": RLOOEstimator(),
        "vineppo_k2": VinePPOEstimator(num_rollouts=2, step_segmenter=characters),
        "vineppo_k1_reuse": VinePPOEstimator(num_rollouts=1, reuse_samples=True, step_segmenter=characters),
    }.items():
        runs = [estimator_gradient(task, estimator, [r % 16, (r + 1) % 16], 4) for r in range(6)]
        metrics = gradient_metrics([r.gradient for r in runs], exact)
        assert math.isfinite(metrics["cosine"]) and -1 <= metrics["cosine"] <= 1
        assert metrics["cosine_ci"][0] <= metrics["cosine"] <= metrics["cosine_ci"][1]
        rows[name] = sum(r.sampled_tokens for r in runs) / len(runs)
        assert all(r.trained_tokens == 8 * 5 for r in runs)  # 8 responses x (3 steps + outcome + EOS)
    # Responses only for the reward baselines; Monte Carlo pays for its rollouts.
    assert rows["grpo"] == rows["rloo"] == 40
    assert rows["vineppo_k2"] > rows["vineppo_k1_reuse"] > rows["grpo"]


def test_cost_model():
    assert cost_model_tokens(100, 40, 0.5) == 120.0
    assert cost_model_tokens(100, 40, 0.5, epochs=2) == 140.0
    with pytest.raises(ValueError, match="cost_ratio=-1"):
        cost_model_tokens(1, 1, -1)


@pytest.mark.slow
def test_the_cli_runs_on_a_users_policy_and_data(tmp_path):
    """What a user runs on their own checkpoint and data: here the shipped demo policy and 4 demo prompts."""
    import json

    from mcadvantage.demo.config import DemoConfig, build_data, shipped_warmup_dir
    from mcadvantage.evaluation.gradient_quality import main

    problems = build_data(DemoConfig(warmup_problems=50, rl_problems=10, eval_problems=4)).eval_set
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems))
    out = tmp_path / "out"
    code = main(
        [
            "--model",
            str(shipped_warmup_dir()),
            "--dataset",
            str(data),
            "--verifier",
            "gsm8k",
            "--prompts",
            "4",
            "--max_completion_length",
            "48",
            "--estimators",
            "grpo:prompts=2",
            "grpo:prompts=4",
            "vineppo:k=1,prompts=2",
            "--group",
            "2",
            "--repeats",
            "2",
            "--reference_rounds",
            "2",
            "--reference_group",
            "2",
            "--cost_ratio",
            "0.5",
            "--output_dir",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "gradient_quality.json").read_text())
    assert result["cost_ratio"] == 0.5 and result["reference"]["responses"] == 2 * 2 * 4
    names = [r["estimator"] for r in result["records"]]
    assert names == ["grpo_p2", "grpo_p4", "vineppo_k1_p2"]
    for r in result["records"]:
        for key in ("cosine", "cosine_ci", "rel_sq_error", "sampled_tokens", "cost_model", "repeats"):
            assert key in r
        assert r["repeats"] == 2 and r["cost_model"] == r["sampled_tokens"] + 0.5 * r["trained_tokens"]
    vine = result["records"][2]
    assert vine["sampled_tokens"] > result["records"][0]["sampled_tokens"]  # rollouts are paid for
    assert (out / "gradient_quality.png").stat().st_size > 0 and "| estimator |" in (
        out / "gradient_quality.md"
    ).read_text()


def vowel_share(completions, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]


def test_causal_lm_oracle_pads_without_changing_log_probabilities(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from mcadvantage.evaluation.gradient_instrument import CausalLMOracle

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    oracle = CausalLMOracle(model)
    prompts, completions = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]]
    batched = oracle.token_logprobs(prompts, completions)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids = torch.tensor([p + c])
        logits = model(input_ids=ids).logits.float()
        want = (
            torch.log_softmax(logits[0, len(p) - 1 : -1], -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        )
        assert torch.allclose(batched[i, : len(c)], want, atol=1e-5)
        assert torch.equal(batched[i, len(c) :], torch.zeros(batched.shape[1] - len(c)))


@pytest.mark.slow
def test_the_learned_critic_is_measured_after_its_warm_up(tiny_model_dir, char_tokenizer):
    from transformers import AutoModelForCausalLM

    from mcadvantage import TransformersSampler
    from mcadvantage.evaluation.gradient_instrument import CausalLMOracle
    from mcadvantage.evaluation.gradient_quality import measure_estimators, parse_estimator_spec

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompts = ["ab", "cd", "ef", "gh"]
    task = GradientTask(
        oracle=CausalLMOracle(model),
        sampler=TransformersSampler(model, char_tokenizer, temperature=1.0),
        prompt_ids=[char_tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts],
        prompts=prompts,
        rows=[{} for _ in prompts],
        reward_funcs=[vowel_share],
        tokenizer=char_tokenizer,
        segmenter="newline",
        max_completion_length=8,
        policy_model=model,
    )
    reference = reference_gradient(task, responses_per_round=2, rounds=2)
    spec = parse_estimator_spec("gae:warmup=2,lr=1e-3,prompts=2", segmenter="newline", group=2)
    assert spec.name == "gae_w2_p2" and spec.warmup_batches == 2
    (record,) = measure_estimators(task, [spec], reference, repeats=2, cost_ratio=1.0, progress=False)
    assert spec.estimator.updates >= 2  # the critic trained on the warm-up batches (and then on the repeats)
    assert math.isfinite(record["cosine"]) and record["sampled_tokens"] == record["trained_tokens"]


def test_benchmark_group_stats_count_groups_without_signal(tok):
    """``benchmarks/gradient_quality.py --group_stats``: on the toy every prompt succeeds with the same p, so groups of
    4 are all-fail with probability (1 - p)^4 and all-pass with p^4; both within 4 SE over 32 x 20 groups."""
    from _helpers import load_benchmark

    bench = load_benchmark("gradient_quality")
    task = toy_task(tok, seed=4, prompts=32)
    p = float(task.oracle.exact_objective())
    stats = bench.group_stats(task, rounds=20, group=4)
    n = 32 * 20
    assert stats["groups"] == n and stats["group_size"] == 4
    for share, q in ((stats["all_fail_share"], (1 - p) ** 4), (stats["all_pass_share"], p**4)):
        assert abs(share - q) < 4 * math.sqrt(q * (1 - q) / n)
    assert stats["all_equal_share"] == pytest.approx(stats["all_fail_share"] + stats["all_pass_share"])  # 0/1
    assert abs(stats["mean_reward"] - p) < 4 * math.sqrt(p * (1 - p) / (4 * n))
