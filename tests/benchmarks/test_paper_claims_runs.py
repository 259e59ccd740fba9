"""The paper-claims study's additions to the learning-efficiency benchmark: temperature arms and the KL-to-start
measurement (docs/paper-claims-protocol.md)."""

from __future__ import annotations

import copy

import pytest
import torch
from _helpers import load_benchmark


def _benchmark():
    return load_benchmark("learning_efficiency")


def test_temperature_suffix_names_the_arm_and_its_temperature():
    bench = _benchmark()
    assert bench.split_temperature("ppo_t1.0") == ("ppo", 1.0)
    assert bench.split_temperature("vineppo_k4_t0.8") == ("vineppo_k4", 0.8)
    assert bench.split_temperature("vineppo_k4") == ("vineppo_k4", None)
    assert bench.split_temperature("tree_d12") == ("tree_d12", None)
    with pytest.raises(SystemExit, match="must be > 0"):
        bench.split_temperature("ppo_t0")


@pytest.fixture(scope="module")
def tiny():
    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    return build_tiny_llama(tokenizer, seed=0), tokenizer


def test_kl_to_itself_is_zero_and_the_training_stream_is_untouched(tiny):
    bench = _benchmark()
    model, tokenizer = tiny
    torch.manual_seed(123)
    before = torch.get_rng_state()
    kl = bench.kl_to_start(
        model, model, tokenizer, ["Q: 1+2\nA:", "Q: 3*4+5\nA:"], temperature=0.6, max_new_tokens=12, seed=7
    )
    assert kl == 0.0
    assert torch.equal(torch.get_rng_state(), before)  # training's random stream is where it was


def test_kl_to_a_moved_policy_is_positive_and_reproducible(tiny):
    bench = _benchmark()
    model, tokenizer = tiny
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved.train()  # measuring must hand the model back in the mode it found it
    prompts = ["Q: 1+2\nA:", "Q: 3*4+5\nA:", "Q: 9-3\nA:", "Q: 2*2\nA:"] * 8
    first = bench.kl_to_start(moved, model, tokenizer, prompts, temperature=1.0, max_new_tokens=16, seed=7)
    again = bench.kl_to_start(moved, model, tokenizer, prompts, temperature=1.0, max_new_tokens=16, seed=7)
    assert first == again
    assert first > 0.0
    assert moved.training
