"""TransformersSampler on a tiny offline Llama, and the estimator end to end with it."""

from __future__ import annotations

import pytest
import torch

from mcadvantage.mc.estimator import MCValueEstimator, Trajectory
from mcadvantage.samplers.base import RolloutRequest
from mcadvantage.samplers.hf import TransformersSampler


@pytest.fixture(scope="module")
def tok():
    from mcadvantage.testing import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    from mcadvantage.testing import build_tiny_llama

    return build_tiny_llama(tok, seed=0)


def ids(tok, text):
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


def greedy(model, prefix, max_new_tokens):
    """Reference: transformers' own greedy decoding of one unpadded prefix."""
    out = model.generate(
        torch.tensor([prefix]),
        attention_mask=torch.ones(1, len(prefix), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
        eos_token_id=2,
    )
    return out[0, len(prefix) :].tolist()


class _Ids:
    """A tokenizer stand-in that only carries special token ids (what the sampler reads)."""

    def __init__(self, eos_token_id, pad_token_id=0):
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id


def test_counts_budgets_and_truncation_flags(tok, model):
    torch.manual_seed(0)
    reqs = [
        RolloutRequest(ids(tok, "Question: 1+2="), n=3, max_tokens=5),
        RolloutRequest(ids(tok, "Q"), n=1, max_tokens=9),
        RolloutRequest(ids(tok, "Q: 7*3 is"), n=4, max_tokens=2),
    ]
    out = TransformersSampler(model, tok, max_batch_sequences=3).sample(reqs)
    assert [len(c) for c in out] == [3, 1, 4]
    for req, conts in zip(reqs, out, strict=True):
        for c in conts:
            assert 1 <= len(c.token_ids) <= req.max_tokens
            eos_at = [i for i, t in enumerate(c.token_ids) if t == tok.eos_token_id]
            if c.truncated:
                assert eos_at == [] and len(c.token_ids) == req.max_tokens
            else:
                assert eos_at == [len(c.token_ids) - 1]


def test_batches_are_memory_bounded_and_sorted_by_length(tok, model, monkeypatch):
    calls = []
    original = model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    reqs = [
        RolloutRequest(ids(tok, "a long prefix here"), n=2, max_tokens=3),
        RolloutRequest(ids(tok, "ab"), n=5, max_tokens=3),
        RolloutRequest(ids(tok, "abc"), n=1, max_tokens=3),
    ]
    out = TransformersSampler(model, tok, max_batch_sequences=3).sample(reqs)
    assert [len(c) for c in out] == [2, 5, 1]
    # 8 rows in batches of <= 3; shortest prefixes first: "ab" x3 | "ab" x2 + "abc" | long x2
    assert [s[0] for s in calls] == [3, 3, 2]
    assert [s[1] for s in calls] == [2, 3, len("a long prefix here")]


def test_top_k_1_equals_greedy_generate_with_left_padding(tok, model):
    prefixes = [ids(tok, "Q: 12+30="), ids(tok, "x"), ids(tok, "The answer is")]
    reqs = [RolloutRequest(p, n=2, max_tokens=7) for p in prefixes]
    out = TransformersSampler(model, tok, top_k=1).sample(reqs)  # one batch, left-padded
    for p, conts in zip(prefixes, out, strict=True):
        ref = greedy(model, p, 7)
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        assert [list(c.token_ids) for c in conts] == [ref, ref]


def test_each_continuation_is_cut_at_its_own_budget_and_at_eos(tok, model):
    a, b = ids(tok, "Q: 5-2="), ids(tok, "abc")
    ref_a, ref_b = greedy(model, a, 8), greedy(model, b, 8)
    assert ref_a[0] not in ref_b  # (true for this seed) so the declared EOS only stops row a
    # Declare row a's first greedy token the EOS token. In the shared batch, row a finishes at step 1
    # and is padded while row b goes on: a must come back as exactly [EOS] (padding dropped), b cut
    # at its own budget of 6 and flagged truncated.
    sampler = TransformersSampler(model, _Ids(eos_token_id=ref_a[0], pad_token_id=tok.pad_token_id), top_k=1)
    out_a, out_b = sampler.sample([RolloutRequest(a, 2, 8), RolloutRequest(b, 1, 6)])
    assert [list(c.token_ids) for c in out_a] == [ref_a[:1], ref_a[:1]]
    assert not any(c.truncated for c in out_a)
    assert list(out_b[0].token_ids) == ref_b[:6] and out_b[0].truncated


def test_eval_mode_no_grad_and_training_mode_restored(tok, model):
    seen = []
    handle = model.register_forward_hook(lambda m, i, o: seen.append((m.training, torch.is_grad_enabled())))
    try:
        model.train()
        TransformersSampler(model, tok).sample([RolloutRequest(ids(tok, "hi"), 2, 3)])
        assert model.training
        model.eval()
        TransformersSampler(model, tok).sample([RolloutRequest(ids(tok, "hi"), 1, 2)])
        assert not model.training
    finally:
        handle.remove()
    assert seen and all(state == (False, False) for state in seen)


def test_sampling_settings_reach_generate_and_model_defaults_do_not(tok):
    from mcadvantage.testing import build_tiny_llama

    m = build_tiny_llama(tok, seed=1)
    # A checkpoint whose defaults would make every rollout identical or short.
    gc = m.generation_config
    gc.do_sample, gc.top_k, gc.temperature, gc.max_length, gc.min_p = False, 1, 0.01, 3, 0.99
    sampler = TransformersSampler(
        m, tok, temperature=0.7, top_p=0.9, top_k=40, min_p=0.01, repetition_penalty=1.1
    )
    captured = []
    original = m.generate
    m.generate = lambda *a, **kw: captured.append(kw["generation_config"]) or original(*a, **kw)
    torch.manual_seed(0)
    conts = sampler.sample([RolloutRequest(ids(tok, "Q:"), n=16, max_tokens=8)])[0]
    cfg = captured[0]
    assert (cfg.do_sample, cfg.temperature, cfg.top_p, cfg.top_k, cfg.min_p, cfg.repetition_penalty) == (
        True,
        0.7,
        0.9,
        40,
        0.01,
        1.1,
    )
    # Random weights put ~1% on each of 101 tokens: 16 samples of 8 tokens are distinct unless the
    # model's greedy/min_p defaults leaked in, and the model's max_length=3 does not shorten them.
    assert len({c.token_ids for c in conts}) > 8
    assert sum(len(c.token_ids) == 8 for c in conts) >= 8
    # top_k=None must disable top-k rather than fall back to the model's top_k=1
    assert TransformersSampler(m, tok).generation_config(4).top_k == 0


def test_seeded_sampling_is_reproducible(tok, model):
    req = [RolloutRequest(ids(tok, "seed"), n=4, max_tokens=6)]
    torch.manual_seed(123)
    a = TransformersSampler(model, tok).sample(req)
    torch.manual_seed(123)
    b = TransformersSampler(model, tok).sample(req)
    assert a == b
    assert len({c.token_ids for c in a[0]}) > 1  # the 4 samples of one request are not one draw


def test_temperature_zero_is_greedy(tok, model):
    # One rule for every sampler (mcadvantage.core.settings): temperature 0 means greedy decoding.
    prefix = ids(tok, "Q: 12+30=")
    [conts] = TransformersSampler(model, tok, temperature=0).sample(
        [RolloutRequest(prefix, n=2, max_tokens=7)]
    )
    ref = greedy(model, prefix, 7)
    if tok.eos_token_id in ref:
        ref = ref[: ref.index(tok.eos_token_id) + 1]
    assert [list(c.token_ids) for c in conts] == [ref, ref]


def test_invalid_settings(tok, model):
    with pytest.raises(ValueError, match="temperature=-0.1"):
        TransformersSampler(model, tok, temperature=-0.1)
    with pytest.raises(ValueError, match="max_batch_sequences=0"):
        TransformersSampler(model, tok, max_batch_sequences=0)
    with pytest.raises(ValueError, match="top_p=1.5"):
        TransformersSampler(model, tok, top_p=1.5)


def test_estimator_end_to_end_with_tiny_model(tok, model):
    # Greedy rollouts (top_k=1) make every value a 0/1 fact we can check independently: V(S_i) must
    # equal the reward of transformers' own greedy completion of S_i within the remaining budget.
    def has_vowel(completions, **kw):
        return [float(any(ch in "aeiou" for ch in c)) for c in completions]

    prompt = "Q: 2+2="
    completion = list(ids(tok, "4\nok")) + [tok.eos_token_id]
    t = Trajectory(
        prompt_ids=list(ids(tok, prompt)),
        completion_ids=completion,
        step_boundaries=[0, 2, 5],
        reward=1.0,
        prompt=prompt,
        fields={"answer": "4"},
    )
    max_len = 10
    sampler = TransformersSampler(model, tok, top_k=1)
    out = MCValueEstimator(sampler, has_vowel, tok, num_rollouts=3, max_completion_length=max_len).estimate(
        [t, t]
    )
    assert out.stats["unique_states"] == 2 and out.stats["rollouts"] == 6
    for i, b in enumerate([0, 2]):
        prefix = t.prompt_ids + completion[:b]
        cont = greedy(model, prefix, max_len - b)
        text = tok.decode(completion[:b] + cont, skip_special_tokens=True)
        assert out.values[0][i] == has_vowel([text])[0]
    v = out.values[0]
    assert out.step_advantages[0] == [v[1] - v[0], 1.0 - v[1]]
    assert out.token_advantages[0].tolist() == pytest.approx([v[1] - v[0]] * 2 + [1.0 - v[1]] * 3)
    assert 0 < out.stats["generated_tokens"] <= 3 * (max_len + max_len - 2)


def test_estimator_end_to_end_sampling_values_are_means_of_rewards(tok, model):
    # With sampling, each value is a mean of K=4 rewards in {0, 1}: a multiple of 1/4 in [0, 1].
    def starts_with_letter(completions, **kw):
        return [float(bool(c) and c[0].isalpha()) for c in completions]

    torch.manual_seed(0)
    t = Trajectory(list(ids(tok, "Go:")), list(ids(tok, "ab")) + [2], [0, 1, 3], 0.0, prompt="Go:")
    out = MCValueEstimator(
        TransformersSampler(model, tok), starts_with_letter, tok, num_rollouts=4, max_completion_length=6
    ).estimate([t])
    v0, v1, r = out.values[0]
    assert v1 == 1.0  # S_1 already starts with "a": every rollout from it scores 1
    assert v0 * 4 == int(v0 * 4) and 0.0 <= v0 <= 1.0
    assert r == 0.0 and out.stats["rollouts"] == 8
