"""Cross-engine consistency: transformers ``generate`` and vLLM sample the same policy.

On one tiny untrained Llama (its tied embeddings scaled by 2 so next-token distributions are peaked
-- top probability ~0.35 -- and temperature / top-p change them visibly):

1. first-token distributions from both samplers match the exact distribution computed from the
   model's float64 logits with the same temperature and nucleus (chi-square goodness of fit);
2. the same batch of trajectories through ``MCValueEstimator`` with each sampler gives
   statistically consistent Monte Carlo values (two-proportion z-tests per state and pooled), with a
   reward whose success probability is neither 0 nor 1.

Thresholds are stated per assertion; the family-wise chance of a false failure is below 1e-3.
"""

from __future__ import annotations

import gc
import math
import os

import pytest
import torch

from mcadvantage.samplers import RolloutRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

EMBED_SCALE = 2.0
PREFIXES = [(1, 56, 81, 98, 5, 6, 76, 7, 84), (1, 40, 41, 42), (1, 70, 12, 13, 14, 15, 16)]


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory):
    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    path = tmp_path_factory.mktemp("peaked-llama")
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=0)
    with torch.no_grad():  # tied: scales the output logits (the input side is undone by RMSNorm)
        model.model.embed_tokens.weight.mul_(EMBED_SCALE)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llm(peaked_model_dir):
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # shared machine: keep the KV cache small
    from vllm import LLM

    engine = LLM(model=str(peaked_model_dir), dtype="float32", enforce_eager=True, max_model_len=128, seed=0)
    yield engine
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def hf_model(peaked_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(peaked_model_dir, dtype="float32").eval()


@pytest.fixture(scope="module")
def tokenizer(peaked_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(peaked_model_dir)


def _samplers(llm, hf_model, tokenizer, temperature, top_p):
    from mcadvantage.samplers import TransformersSampler, VLLMSampler

    return {
        "transformers": TransformersSampler(hf_model, tokenizer, temperature=temperature, top_p=top_p),
        "vllm": VLLMSampler(llm, temperature=temperature, top_p=top_p),
    }


def _exact_next_token_probs(hf_model, prefix, temperature, top_p):
    """The sampling distribution both engines implement: softmax(logits / T), then the nucleus
    (drop the least likely tokens whose cumulative probability is <= 1 - top_p), renormalised."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prefix])).logits[0, -1].double()
    probs = torch.softmax(logits / temperature, -1)
    order = torch.argsort(probs)  # ascending
    drop = torch.cumsum(probs[order], 0) <= 1 - top_p
    drop[-1] = False  # the most likely token is always kept
    kept = probs.clone()
    kept[order[drop]] = 0
    return kept / kept.sum()


def _equal_mass_bins(probs, num_bins):
    """Group tokens (most likely first) into bins of about 1/num_bins mass each; zero-probability
    tokens are left out. Returns a list of token-index lists."""
    bins, current, mass = [], [], 0.0
    for tok in torch.argsort(probs, descending=True).tolist():
        if probs[tok] == 0:
            break
        current.append(tok)
        mass += float(probs[tok])
        if mass >= 1.0 / num_bins:
            bins.append(current)
            current, mass = [], 0.0
    if current:
        if mass < 0.5 / num_bins and bins:  # fold a small remainder into the last bin
            bins[-1].extend(current)
        else:
            bins.append(current)
    return bins


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_first_token_distribution_matches_exact(llm, hf_model, tokenizer, temperature, top_p):
    """Chi-square goodness of fit of K = 2000 first tokens per prefix and engine against the exact
    distribution, over 8 equal-mass bins (7 dof). Each test must have p > 1e-4 (12 tests: false
    failure rate ~1e-3). Tokens outside the nucleus must never be sampled (the single most likely
    excluded token is allowed, as float rounding at the nucleus edge can differ by engine)."""
    torch.manual_seed(0)
    k = 2000
    requests = [RolloutRequest(p, n=k, max_tokens=1) for p in PREFIXES]
    for name, sampler in _samplers(llm, hf_model, tokenizer, temperature, top_p).items():
        out = sampler.sample(requests)
        for prefix, conts in zip(PREFIXES, out, strict=True):
            exact = _exact_next_token_probs(hf_model, prefix, temperature, top_p)
            counts = torch.bincount(
                torch.tensor([c.token_ids[0] for c in conts]), minlength=len(exact)
            ).double()
            assert int(counts.sum()) == k
            excluded = (exact == 0).nonzero().flatten().tolist()
            if excluded:
                full = _exact_next_token_probs(hf_model, prefix, temperature, 1.0)
                edge = max(excluded, key=lambda t: float(full[t]))
                outside = sum(int(counts[t]) for t in excluded if t != edge)
                assert outside == 0, f"{name}: {outside} samples outside the top_p={top_p} nucleus"
            bins = _equal_mass_bins(exact, 8)
            observed = torch.stack([counts[b].sum() for b in bins])
            expected = torch.stack([exact[b].sum() * k for b in bins])
            observed[-1] += k - observed.sum()  # the allowed edge token, if sampled, joins the tail bin
            chi2 = float(((observed - expected) ** 2 / expected).sum())
            dof = len(bins) - 1
            p_value = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(chi2 / 2.0)))
            assert p_value > 1e-4, f"{name}, prefix {prefix}: chi2={chi2:.1f} ({dof} dof), p={p_value:.2e}"


VOWELS = "aeiou"


def has_vowel(prompts=None, completions=None, completion_ids=None, **kwargs):
    """Reward 1 if the response contains a lowercase vowel. The reference responses below have
    none, so every state's value depends only on its continuations (success rate ~0.3-0.5 here)."""
    return [float(any(ch in text for ch in VOWELS)) for text in completions]


def _trajectories(tokenizer):
    from mcadvantage.mc.estimator import Trajectory
    from mcadvantage.tasks.segmentation import get_segmenter, segment_completion

    segmenter = get_segmenter("newline")
    data = {
        "Q: 12+3=": ["12+3\n=15\n#### 15", "3+12=15\n#### 15"],
        "Q: 7*2=": ["7*2\n=14\n#### 14", "14\n#### 14"],
    }
    trajectories = []
    for prompt, responses in data.items():
        prompt_ids = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False).input_ids]
        for response in responses:
            assert not any(ch in response for ch in VOWELS)
            ids = [*tokenizer(response, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
            trajectories.append(
                Trajectory(
                    prompt_ids=prompt_ids,
                    completion_ids=ids,
                    step_boundaries=segment_completion(segmenter, tokenizer, ids),
                    reward=0.0,
                    prompt=prompt,
                )
            )
    return trajectories


def test_mc_values_agree_across_engines(llm, hf_model, tokenizer):
    """The same trajectories through MCValueEstimator with each sampler (K = 256, temperature 0.8,
    top_p 0.95, remaining budgets of 32 - prefix tokens). Per unique state, the two values must pass
    a two-proportion z-test at |z| < 4 (~10 states: false failure ~6e-4); the mean difference
    over states must pass |z| < 4 too (detects an engine bias of ~0.06 or more)."""
    from mcadvantage.mc.estimator import MCValueEstimator

    torch.manual_seed(0)
    k = 256
    trajectories = _trajectories(tokenizer)
    values = {}
    for name, sampler in _samplers(llm, hf_model, tokenizer, 0.8, 0.95).items():
        estimator = MCValueEstimator(sampler, has_vowel, tokenizer, num_rollouts=k, max_completion_length=32)
        estimate = estimator.estimate(trajectories)
        # Unique states: (prompt, prefix length) -> value (S_0 is shared by a prompt's responses).
        per_state = {}
        for traj, vals in zip(trajectories, estimate.values, strict=True):
            for i, b in enumerate(traj.step_boundaries[:-1]):
                key = (tuple(traj.prompt_ids), tuple(traj.completion_ids[:b]))
                per_state.setdefault(key, vals[i])
                assert per_state[key] == vals[i]  # a shared state has one estimate
            assert vals[-1] == 0.0  # V(S_n) = R, never estimated
        values[name] = per_state
    assert values["transformers"].keys() == values["vllm"].keys()
    states = sorted(values["vllm"])
    assert len(states) >= 8

    hf = torch.tensor([values["transformers"][s] for s in states], dtype=torch.float64)
    vl = torch.tensor([values["vllm"][s] for s in states], dtype=torch.float64)
    # The test is only meaningful if values are far from 0 and 1.
    assert 0.15 < float(hf.mean()) < 0.85 and 0.15 < float(vl.mean()) < 0.85, (hf, vl)
    pooled = (hf + vl) / 2
    var = pooled * (1 - pooled) * 2 / k  # variance of the difference of two K-sample means
    for s, d, v in zip(states, (hf - vl).tolist(), var.tolist(), strict=True):
        if v == 0:
            assert d == 0, s
        else:
            assert abs(d) / math.sqrt(v) < 4, f"state {s}: transformers {hf} vs vllm {vl}"
    z_mean = float((hf - vl).mean() / (var.sum().sqrt() / len(states)))
    assert abs(z_mean) < 4, f"mean difference z = {z_mean:.2f}: transformers {hf} vs vllm {vl}"
