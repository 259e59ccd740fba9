"""Credit-assignment diagnostics, on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from mcadvantage.evaluation.diagnostics import ranking_accuracy, sign_accuracy, value_errors


def test_value_errors_by_hand():
    out = value_errors([0.5, 0.5, 1.0], [0.0, 1.0, 1.0])
    # errors 0.5, -0.5, 0: MAE 1/3, RMSE sqrt(0.5/3); Var(truth) = 2/9, Var(errors) = 1/6 -> EV = 1 - 0.75
    assert out["mae"] == pytest.approx(1 / 3)
    assert out["rmse"] == pytest.approx(math.sqrt(0.5 / 3))
    assert out["explained_variance"] == pytest.approx(0.25)
    assert math.isnan(value_errors([0.3, 0.3], [0.5, 0.5])["explained_variance"])  # the truth does not vary
    assert value_errors([1.0, 2.0], [1.0, 2.0]) == {"mae": 0.0, "rmse": 0.0, "explained_variance": 1.0}


def test_sign_accuracy_by_hand():
    est = [0.2, -0.1, 0.0, 0.3, -0.4]
    tru = [0.5, 0.2, -0.1, 0.0, -0.3]
    # decided (|t| > 0): (0.2, 0.5) right, (-0.1, 0.2) wrong, (0.0, -0.1) wrong (zero ranks nothing), (-0.4, -0.3) right
    assert sign_accuracy(est, tru) == 0.5
    # with tolerance 0.25 only (0.2, 0.5) and (-0.4, -0.3) are decided
    assert sign_accuracy(est, tru, tolerance=0.25) == 1.0
    assert math.isnan(sign_accuracy([1.0], [0.0]))


def test_ranking_accuracy_by_hand():
    est = [[0.9, 0.1, 0.5], [0.2, 0.2], [0.4, 0.6]]
    tru = [[1.0, 0.0, 0.0], [1.0, 0.0], [0.5, 0.5]]
    out = ranking_accuracy(est, tru)
    # group 0: pairs (0,1) agree, (0,2) agree, (1,2) tied in truth -> skipped; group 1: one pair, estimate tied: 0.5;
    # group 2: truth tied -> no pair, no unique best.
    assert out["pairs"] == 3 and out["pairwise"] == pytest.approx(2.5 / 3)
    # top-1: group 0 picks alternative 0 (right); group 1 splits between the two (0.5); group 2 has no unique best
    assert out["groups"] == 2 and out["top1"] == pytest.approx(0.75)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="estimated has 2 values but truth has 1"):
        value_errors([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        sign_accuracy([float("nan")], [1.0])
    with pytest.raises(ValueError, match="2 estimated groups but 1 true groups"):
        ranking_accuracy([[1.0], [2.0]], [[1.0]])


# ----------------------------------------------------------------------------------------------------------------
# diagnose_credit on toy policies with known values, and the command line
# ----------------------------------------------------------------------------------------------------------------


def _toy(p):
    from mcadvantage.testing import FakeSampler, OutcomeReward, build_char_tokenizer

    tok = build_char_tokenizer()
    y, n, nl = (tok.convert_tokens_to_ids(c) for c in ("Y", "N", "\n"))
    sampler = FakeSampler(
        p,
        success_token_id=y,
        failure_token_id=n,
        eos_token_id=tok.eos_token_id,
        filler_token_id=nl,
        num_filler_tokens=1,
    )
    return tok, sampler, OutcomeReward("Y")


def test_diagnose_credit_is_exact_on_a_deterministic_policy():
    """Prompts ending in "1" always succeed, in "0" never: every value is exact (1 or 0), so every Monte Carlo
    estimate and GRPO's implied V(S_0) (the group mean) have zero error, and no advantage is decided."""
    from mcadvantage.evaluation.diagnostics import diagnose_credit

    tok, _, reward = _toy(0.0)
    one = tok.convert_tokens_to_ids("1")
    tok, sampler, reward = _toy(lambda prefix: float(one in prefix))
    rows = [{"prompt": "q1"}, {"prompt": "q0"}]
    result = diagnose_credit(
        sampler,
        tok,
        reward,
        rows,
        responses_per_prompt=3,
        ground_truth_k=8,
        ks=(1, 2),
        alternatives=2,
        ranking_states=4,
        max_new_tokens=6,
        progress=False,
    )
    assert set(result.estimators) == {"vineppo_k1", "vineppo_k2", "grpo (implied)", "rloo (implied)"}
    for name, m in result.estimators.items():
        assert m["value_mae"] == 0.0, name
        assert math.isnan(m["sign_accuracy"])  # every true advantage is 0: nothing decided
    assert [r["reward"] for r in result.responses] == [1.0] * 3 + [0.0] * 3
    assert result.settings["responses"] == 6


def test_diagnose_credit_value_errors_match_the_binomial_on_a_coin_flip_policy():
    """Every state of a p = 0.5 policy has value 0.5. The mean absolute error of a K-rollout estimate is then
    E|Binomial(K, 0.5)/K - 0.5|: 0.5 for K = 1, 0.1875 for K = 4 (hand-computed: P(1 or 3 of 4) x 0.25 + P(0 or 4)
    x 0.5). Over 96 states the observed MAE has a standard error below 0.03 (K = 1: |x - 0.5| is exactly 0.5
    whatever the draw, up to the ground truth's own error); the tolerance is 0.08, about 3 standard errors
    including the ground truth's (K = 256: SE 0.031 per state, averaged)."""
    from mcadvantage.evaluation.diagnostics import diagnose_credit

    tok, sampler, reward = _toy(0.5)
    rows = [{"prompt": f"q{i}"} for i in range(24)]
    result = diagnose_credit(
        sampler,
        tok,
        reward,
        rows,
        responses_per_prompt=4,
        ground_truth_k=256,
        ks=(1, 4),
        alternatives=2,
        ranking_states=8,
        max_new_tokens=6,
        progress=False,
    )
    assert result.estimators["vineppo_k1"]["states"] == 96
    assert result.estimators["vineppo_k1"]["value_mae"] == pytest.approx(0.5, abs=0.08)
    assert result.estimators["vineppo_k4"]["value_mae"] == pytest.approx(0.1875, abs=0.08)
    # GRPO's and RLOO's implied ranking cannot tell alternatives apart: chance by construction (ties count half;
    # a top-1 pick among 2 tied alternatives is right half the time).
    for name in ("grpo (implied)", "rloo (implied)"):
        m = result.estimators[name]
        assert m["ranking_groups"] > 0 and m["ranking_pairwise"] == 0.5 and m["ranking_top1"] == 0.5


def test_diagnose_credit_rejects_bad_settings():
    from mcadvantage.evaluation.diagnostics import diagnose_credit

    tok, sampler, reward = _toy(0.5)
    with pytest.raises(ValueError, match="responses_per_prompt must be >= 2"):
        diagnose_credit(sampler, tok, reward, [{"prompt": "q"}], responses_per_prompt=1, progress=False)
    with pytest.raises(ValueError, match="ks must be a non-empty list"):
        diagnose_credit(sampler, tok, reward, [{"prompt": "q"}], ks=(), progress=False)
    with pytest.raises(ValueError, match="rows is empty"):
        diagnose_credit(sampler, tok, reward, [], progress=False)


@pytest.mark.slow
def test_command_line_on_a_saved_model(tmp_path):
    import json
    import subprocess
    import sys

    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(
        tok, hidden_size=32, num_layers=1, num_heads=1, head_dim=32, intermediate_size=64, seed=0
    )
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"Start with {i}. Add 1.\n", "answer": str(i + 1)}) + "\n" for i in range(3)
        )
    )
    out = tmp_path / "diag"
    cmd = [
        sys.executable,
        "-m",
        "mcadvantage.evaluation.diagnostics",
        "--model",
        str(tmp_path / "model"),
        "--data",
        str(data),
    ]
    cmd += [
        "--output_dir",
        str(out),
        "--ground_truth_k",
        "4",
        "--ks",
        "1",
        "2",
        "--responses_per_prompt",
        "2",
    ]
    cmd += ["--alternatives", "2", "--ranking_states", "3", "--max_new_tokens", "12"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vineppo_k2" in proc.stdout and "grpo (implied)" in proc.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["estimators"]) == {"vineppo_k1", "vineppo_k2", "grpo (implied)", "rloo (implied)"}
    assert metrics["settings"]["responses"] == 6
    for name in ("value_scatter.png", "error_by_position.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert 'class="step"' in (out / "report.html").read_text()
    responses = json.loads((out / "responses.json").read_text())["responses"]  # the report's data
    assert len(responses) == 6
    assert all(len(r["values"]) == len(r["steps"]) + 1 == len(r["advantages"]) + 1 for r in responses)
    bad = subprocess.run(
        [*cmd[:5], "--data", str(tmp_path / "missing.jsonl"), "--output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "--data" in bad.stderr and "does not exist" in bad.stderr


def _chars(text: str) -> list[str]:
    return list(text)


def test_learned_value_functions_are_scored_like_the_estimators():
    """A value function that knows the exact values (StepTreeSampler.value) is scored against the K = 256 ground
    truth: its value MAE is the ground truth's own noise (SD <= 0.5 / 16 = 0.031 per state, so the MAE is below
    0.05), and it ranks every pair of alternative next steps right. A constant function ranks them at chance (0.5
    pairwise, by the tie rule), except where the alternatives end the response (their values are the rewards)."""
    from mcadvantage.evaluation.diagnostics import diagnose_credit
    from mcadvantage.testing import OutcomeReward, StepTreeSampler, build_char_tokenizer

    tok = build_char_tokenizer()
    tid = tok.convert_tokens_to_ids
    sampler = StepTreeSampler(
        step_token_ids=[tid("a"), tid("b")],
        step_probs=[0.5, 0.5],
        depth=2,
        # Every next step changes the value: "aa" 0.95, "ab" 0.8, "ba" 0.35, "bb" 0.2 (so V("a") = 0.875,
        # V("b") = 0.275); the closest alternatives differ by 0.15, about 7 SDs of the ground truth's noise.
        success_prob=lambda steps: 0.2 + 0.6 * (steps[0] == 0) + 0.15 * (steps[1] == 0),
        success_token_id=tid("Y"),
        failure_token_id=tid("N"),
        eos_token_id=tok.eos_token_id,
        seed=0,
    )

    def exact(prompt_ids, prefixes):
        return [sampler.value(list(p) + list(c)) for p, c in zip(prompt_ids, prefixes, strict=True)]

    def constant(prompt_ids, prefixes):
        return [0.5] * len(prompt_ids)

    result = diagnose_credit(
        sampler,
        tok,
        OutcomeReward("Y"),
        [{"prompt": f"{c}:"} for c in "QRST"],
        segmenter=_chars,
        responses_per_prompt=4,
        ground_truth_k=256,
        ks=(1,),
        alternatives=4,
        ranking_states=8,
        max_new_tokens=8,
        progress=False,
        value_functions={"exact critic": exact, "constant critic": constant},
    )
    est = result.estimators
    assert est["exact critic"]["value_mae"] < 0.05
    assert est["exact critic"]["ranking_pairwise"] == 1.0
    assert est["constant critic"]["ranking_pairwise"] < 0.75
    assert est["constant critic"]["value_mae"] > est["exact critic"]["value_mae"]
